//! A cursor over sqlparser tokens (whitespace and comments skipped), with
//! the helpers our own statement forms need. Every token keeps its
//! `line:col`, so every error can point at it.

use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, TokenWithSpan, Word};
use urutau_planner::diagnostic::{Diagnostic, Span};
use urutau_planner::options::{LiteralKind, OptionMap, OptionValue};
use urutau_planner::spec::{Ident, QualifiedName};

/// The span of a token.
pub fn span_of(t: &TokenWithSpan) -> Span {
    Span::new(t.span.start.line as u32, t.span.start.column as u32)
}

/// A word as an identifier: unquoted names fold to lower case (SQL rules),
/// double-quoted names keep their case.
pub fn word_name(w: &Word) -> String {
    if w.quote_style.is_some() {
        w.value.clone()
    } else {
        w.value.to_ascii_lowercase()
    }
}

/// Reads an environment variable for `env('NAME')`.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Cursor over the significant tokens of one statement.
pub struct Cursor<'a> {
    toks: Vec<&'a TokenWithSpan>,
    pos: usize,
    /// Where the statement ends (for "unexpected end" errors).
    end: Span,
}

impl<'a> Cursor<'a> {
    /// A cursor over one statement's tokens; `end` locates "unexpected end" errors.
    pub fn new(tokens: &'a [TokenWithSpan], end: Span) -> Self {
        Cursor {
            toks: tokens
                .iter()
                .filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
                .collect(),
            pos: 0,
            end,
        }
    }

    /// The next token, not consumed.
    pub fn peek(&self) -> Option<&'a TokenWithSpan> {
        self.toks.get(self.pos).copied()
    }

    /// Consumes the next token.
    pub fn next(&mut self) -> Option<&'a TokenWithSpan> {
        let t = self.toks.get(self.pos).copied();
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    /// The span of the next token (or the end of the statement).
    pub fn span(&self) -> Span {
        self.peek().map_or(self.end, span_of)
    }

    /// The tokens not consumed yet.
    pub fn rest(&self) -> &[&'a TokenWithSpan] {
        &self.toks[self.pos..]
    }

    fn describe_next(&self) -> String {
        match self.peek() {
            Some(t) => format!("`{}`", t.token),
            None => "the end of the statement".to_string(),
        }
    }

    /// True when the next token is the (unquoted) keyword.
    pub fn is_keyword(&self, kw: Keyword) -> bool {
        matches!(self.peek(), Some(TokenWithSpan { token: Token::Word(w), .. }) if w.keyword == kw && w.quote_style.is_none())
    }

    /// A keyword given by its text (for words sqlparser has no keyword for).
    pub fn is_word(&self, text: &str) -> bool {
        matches!(self.peek(), Some(TokenWithSpan { token: Token::Word(w), .. }) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(text))
    }

    /// Consumes the keyword when it comes next.
    pub fn eat_keyword(&mut self, kw: Keyword) -> bool {
        if self.is_keyword(kw) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Consumes the word when it comes next.
    pub fn eat_word(&mut self, text: &str) -> bool {
        if self.is_word(text) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Consumes the word, or fails naming what came instead.
    pub fn expect_word(&mut self, text: &str) -> Result<(), Diagnostic> {
        if self.eat_word(text) {
            Ok(())
        } else {
            Err(Diagnostic::error(
                self.span(),
                format!(
                    "expected {}, found {}",
                    text.to_ascii_uppercase(),
                    self.describe_next()
                ),
            ))
        }
    }

    /// Consumes the token when it comes next.
    pub fn eat(&mut self, token: &Token) -> bool {
        if self.peek().map(|t| &t.token) == Some(token) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Consumes the token, or fails naming what came instead.
    pub fn expect(&mut self, token: &Token) -> Result<(), Diagnostic> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(Diagnostic::error(
                self.span(),
                format!("expected `{token}`, found {}", self.describe_next()),
            ))
        }
    }

    /// An identifier (unquoted names fold to lower case).
    pub fn ident(&mut self, what: &str) -> Result<Ident, Diagnostic> {
        match self.peek() {
            Some(
                t @ TokenWithSpan {
                    token: Token::Word(w),
                    ..
                },
            ) => {
                self.pos += 1;
                Ok(Ident::new(word_name(w), span_of(t)))
            }
            _ => Err(Diagnostic::error(
                self.span(),
                format!("expected {what}, found {}", self.describe_next()),
            )),
        }
    }

    /// A dotted name.
    pub fn qualified_name(&mut self, what: &str) -> Result<QualifiedName, Diagnostic> {
        let first = self.ident(what)?;
        let mut parts = vec![first.name];
        while self.eat(&Token::Period) {
            parts.push(self.ident(what)?.name);
        }
        Ok(QualifiedName::new(parts, first.span))
    }

    /// Fails unless the statement is fully read.
    pub fn expect_end(&self) -> Result<(), Diagnostic> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(Diagnostic::error(
                span_of(t),
                format!("unexpected `{}`; a statement ends with `;`", t.token),
            )),
        }
    }

    /// `WITH ( name = value, ... )` when present.
    pub fn options(&mut self, env: EnvLookup<'_>) -> Result<OptionMap, Diagnostic> {
        let mut map = OptionMap::default();
        if !self.eat_keyword(Keyword::WITH) {
            return Ok(map);
        }
        self.expect(&Token::LParen)?;
        if self.eat(&Token::RParen) {
            return Ok(map);
        }
        loop {
            let name = self.ident("an option name")?;
            self.expect(&Token::Eq)?;
            let value_span = self.span();
            let value = self.option_value(env)?;
            map.push(name.name, value, name.span, value_span);
            if self.eat(&Token::RParen) {
                break;
            }
            self.expect(&Token::Comma)?;
        }
        Ok(map)
    }

    fn option_value(&mut self, env: EnvLookup<'_>) -> Result<OptionValue, Diagnostic> {
        let span = self.span();
        let Some(t) = self.next() else {
            return Err(Diagnostic::error(span, "expected an option value"));
        };
        match &t.token {
            Token::SingleQuotedString(s) => Ok(OptionValue::string(s.clone())),
            Token::Number(n, _) => Ok(OptionValue {
                text: n.clone(),
                literal: LiteralKind::Number,
                env: None,
            }),
            Token::Minus => match self.next().map(|t| &t.token) {
                Some(Token::Number(n, _)) => Ok(OptionValue {
                    text: format!("-{n}"),
                    literal: LiteralKind::Number,
                    env: None,
                }),
                _ => Err(Diagnostic::error(span, "expected a number after `-`")),
            },
            Token::Word(w)
                if w.quote_style.is_none()
                    && (w.keyword == Keyword::TRUE || w.keyword == Keyword::FALSE) =>
            {
                Ok(OptionValue {
                    text: w.value.to_ascii_lowercase(),
                    literal: LiteralKind::Bool,
                    env: None,
                })
            }
            Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("env") => {
                self.expect(&Token::LParen)?;
                let var_span = self.span();
                let var = match self.next().map(|t| &t.token) {
                    Some(Token::SingleQuotedString(s)) => s.clone(),
                    _ => {
                        return Err(Diagnostic::error(
                            var_span,
                            "env() takes the variable's name as a string: env('NAME')",
                        ));
                    }
                };
                self.expect(&Token::RParen)?;
                match env(&var) {
                    Some(text) => Ok(OptionValue {
                        text,
                        literal: LiteralKind::String,
                        env: Some(var),
                    }),
                    None => Err(Diagnostic::error(
                        var_span,
                        format!("environment variable {var} is not set"),
                    )
                    .with_help(format!("export {var}=... before loading the pipeline"))),
                }
            }
            Token::Word(w) => Err(Diagnostic::error(
                span,
                format!("option values are literals: write '{}'", w.value),
            )),
            other => Err(Diagnostic::error(
                span,
                format!(
                    "expected an option value (a 'string', a number, true/false or env('NAME')), found `{other}`"
                ),
            )),
        }
    }
}
