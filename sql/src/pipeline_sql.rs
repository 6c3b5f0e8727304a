//! The pipeline SQL front end: `CREATE PIPELINE / SOURCE / SINK / TABLE`
//! statements into a [`PipelineSpec`].
//!
//! The file is tokenized once by sqlparser (so every token keeps its
//! `line:col` in the file); our own small parser reads the statement forms,
//! and sqlparser parses the route queries and expressions.

use sqlparser::ast::{self, GroupByExpr, SelectItem, SetExpr, TableFactor};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};
use urutau_planner::diagnostic::{Diagnostic, Diagnostics, Span};
use urutau_planner::spec::{
    ColumnSpec, Ident, PipelineSpec, ProjectionItem, QualifiedName, RouteSpec, SinkSpec,
    SourceSpec, SourceTableSpec, SpannedExpr,
};
use urutau_planner::types::CanonicalType;

use crate::tokens::{Cursor, EnvLookup, span_of};

/// Parses a pipeline SQL file. `default_name` names the pipeline when the
/// file has no `CREATE PIPELINE` (the file stem).
pub fn parse_pipeline_sql(
    text: &str,
    default_name: &str,
    env: EnvLookup<'_>,
) -> Result<PipelineSpec, Diagnostics> {
    let mut diags = Diagnostics::default();
    let dialect = GenericDialect {};
    let tokens = match Tokenizer::new(&dialect, text).tokenize_with_location() {
        Ok(t) => t,
        Err(e) => {
            diags.push(Diagnostic::error(
                Span::new(e.location.line as u32, e.location.column as u32),
                e.message,
            ));
            return Err(diags);
        }
    };
    let mut spec = PipelineSpec {
        name: Ident::new(default_name, Span::new(1, 1)),
        options: Default::default(),
        sources: vec![],
        sinks: vec![],
        source_tables: vec![],
        routes: vec![],
    };
    let mut named = false;
    for statement in split_statements(&tokens) {
        if let Err(d) = parse_statement(statement, &mut spec, &mut named, env) {
            diags.push(d);
        }
    }
    if diags.has_errors() {
        Err(diags)
    } else {
        Ok(spec)
    }
}

/// Splits the token stream at top-level `;`; drops empty statements.
fn split_statements(tokens: &[TokenWithSpan]) -> Vec<&[TokenWithSpan]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut depth = 0i32;
    for (i, t) in tokens.iter().enumerate() {
        match t.token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::SemiColon if depth <= 0 => {
                out.push(&tokens[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&tokens[start..]);
    out.into_iter()
        .filter(|s| {
            s.iter()
                .any(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
        })
        .collect()
}

fn statement_end(tokens: &[TokenWithSpan]) -> Span {
    tokens
        .iter()
        .rev()
        .find(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
        .map(|t| Span::new(t.span.end.line as u32, t.span.end.column as u32))
        .unwrap_or_default()
}

const FORMS: &str = "CREATE PIPELINE name; CREATE SOURCE name FROM kind WITH (...); CREATE SINK name INTO kind WITH (...); CREATE TABLE source.table (columns...); CREATE TABLE sink.table WITH (...) AS SELECT ...";

fn parse_statement(
    tokens: &[TokenWithSpan],
    spec: &mut PipelineSpec,
    named: &mut bool,
    env: EnvLookup<'_>,
) -> Result<(), Diagnostic> {
    let mut c = Cursor::new(tokens, statement_end(tokens));
    let start = c.span();
    if !c.eat_keyword(Keyword::CREATE) {
        return Err(Diagnostic::error(start, "expected a CREATE statement").with_help(FORMS));
    }
    if c.eat_word("pipeline") {
        let name = c.ident("the pipeline's name")?;
        let options = c.options(env)?;
        c.expect_end()?;
        if *named {
            return Err(Diagnostic::error(
                start,
                "the file names its pipeline twice",
            ));
        }
        *named = true;
        spec.name = name;
        spec.options = options;
        return Ok(());
    }
    if c.eat_keyword(Keyword::SOURCE) || c.eat_word("source") {
        let name = c.ident("the source's name")?;
        if !c.eat_keyword(Keyword::FROM) {
            return Err(Diagnostic::error(
                c.span(),
                "expected FROM <kind> (CREATE SOURCE name FROM postgres WITH (...))",
            ));
        }
        let kind = c.ident("a source kind")?;
        let options = c.options(env)?;
        c.expect_end()?;
        spec.sources.push(SourceSpec {
            name,
            kind,
            options,
        });
        return Ok(());
    }
    if c.eat_word("sink") {
        let name = c.ident("the sink's name")?;
        if !c.eat_keyword(Keyword::INTO) {
            return Err(Diagnostic::error(
                c.span(),
                "expected INTO <kind> (CREATE SINK name INTO iceberg WITH (...))",
            ));
        }
        let kind = c.ident("a sink kind")?;
        let options = c.options(env)?;
        c.expect_end()?;
        spec.sinks.push(SinkSpec {
            name,
            kind,
            options,
        });
        return Ok(());
    }
    if c.eat_keyword(Keyword::TABLE) {
        let name = c.qualified_name("a table name")?;
        if name.parts.len() < 2 {
            return Err(Diagnostic::error(
                name.span,
                format!(
                    "`{name}` needs its source or sink: CREATE TABLE <source>.{name} (...) or CREATE TABLE <sink>.{name} WITH (...) AS SELECT ..."
                ),
            ));
        }
        if c.eat(&Token::LParen) {
            let table = parse_table_declaration(&mut c, name, env)?;
            spec.source_tables.push(table);
            return Ok(());
        }
        if c.is_keyword(Keyword::WITH) || c.is_keyword(Keyword::AS) {
            let route = parse_route(&mut c, name, start, env)?;
            spec.routes.push(route);
            return Ok(());
        }
        return Err(Diagnostic::error(c.span(), "expected `(` or WITH/AS after the table name")
            .with_rule("CREATE TABLE x.y (...) with a column list declares a SOURCE table (x is a source); CREATE TABLE x.y WITH (...) AS SELECT declares a ROUTE (x is a sink)"));
    }
    Err(Diagnostic::error(
        c.span(),
        "expected PIPELINE, SOURCE, SINK or TABLE after CREATE",
    )
    .with_help(FORMS))
}

/// `CREATE TABLE source.table ( col type [NOT NULL] [PRIMARY KEY], ..., PRIMARY KEY (a, b) ) [WITH (...)]`
fn parse_table_declaration(
    c: &mut Cursor<'_>,
    name: QualifiedName,
    env: EnvLookup<'_>,
) -> Result<SourceTableSpec, Diagnostic> {
    let mut parts = name.parts.clone();
    let source = Ident::new(parts.remove(0), name.span);
    let table = QualifiedName::new(parts, name.span);
    let mut columns = Vec::new();
    let mut primary_key: Vec<Ident> = Vec::new();
    loop {
        if c.eat_keyword(Keyword::PRIMARY) {
            let at = c.span();
            c.expect_word("key")?;
            c.expect(&Token::LParen)?;
            loop {
                primary_key.push(c.ident("a key column")?);
                if c.eat(&Token::RParen) {
                    break;
                }
                c.expect(&Token::Comma)?;
            }
            if primary_key.is_empty() {
                return Err(Diagnostic::error(at, "PRIMARY KEY needs columns"));
            }
        } else {
            let col = c.ident("a column name")?;
            let type_span = c.span();
            let type_text = type_text(c);
            if type_text.is_empty() {
                return Err(Diagnostic::error(
                    type_span,
                    format!("column `{col}` needs a type"),
                ));
            }
            let ty = CanonicalType::parse(&type_text, true).map_err(|e| {
                Diagnostic::error(type_span, format!("column `{col}`: {}", e.message))
            })?;
            let mut nullable = true;
            loop {
                if c.eat_keyword(Keyword::NOT) {
                    c.expect_word("null")?;
                    nullable = false;
                } else if c.eat_keyword(Keyword::NULL) {
                    nullable = true;
                } else if c.eat_keyword(Keyword::PRIMARY) {
                    c.expect_word("key")?;
                    nullable = false;
                    primary_key.push(col.clone());
                } else {
                    break;
                }
            }
            columns.push(ColumnSpec {
                name: col,
                ty,
                nullable,
            });
        }
        if c.eat(&Token::RParen) {
            break;
        }
        c.expect(&Token::Comma)?;
    }
    let options = c.options(env)?;
    c.expect_end()?;
    Ok(SourceTableSpec {
        source,
        table,
        columns,
        primary_key,
        options,
    })
}

/// The text of a column type: tokens up to the next `,`/`)` at depth 0 or
/// a column constraint.
fn type_text(c: &mut Cursor<'_>) -> String {
    let mut depth = 0i32;
    let mut text = String::new();
    while let Some(t) = c.peek() {
        match &t.token {
            Token::Comma | Token::RParen if depth == 0 => break,
            Token::Word(w)
                if depth == 0
                    && w.quote_style.is_none()
                    && matches!(w.keyword, Keyword::NOT | Keyword::NULL | Keyword::PRIMARY) =>
            {
                break;
            }
            Token::LParen | Token::Lt => depth += 1,
            Token::RParen | Token::Gt => depth -= 1,
            Token::ShiftRight => depth -= 2,
            _ => {}
        }
        // `TEXT[]`: the array suffix stays attached to its type.
        let suffix = matches!(t.token, Token::LBracket | Token::RBracket);
        if !text.is_empty() && !suffix {
            text.push(' ');
        }
        text.push_str(&t.token.to_string());
        c.next();
    }
    text
}

/// `CREATE TABLE sink.target [WITH (...)] AS SELECT ... FROM source.table [WHERE ...]`
fn parse_route(
    c: &mut Cursor<'_>,
    name: QualifiedName,
    start: Span,
    env: EnvLookup<'_>,
) -> Result<RouteSpec, Diagnostic> {
    let mut parts = name.parts.clone();
    let sink = Ident::new(parts.remove(0), name.span);
    let target = QualifiedName::new(parts, name.span);
    let options = c.options(env)?;
    if !c.eat_keyword(Keyword::AS) {
        return Err(Diagnostic::error(
            c.span(),
            "expected AS SELECT ... after the route's options",
        ));
    }
    let query_tokens: Vec<TokenWithSpan> = c.rest().iter().map(|t| (*t).clone()).collect();
    let query_start = c.span();
    let mut parser = Parser::new(&GenericDialect {}).with_tokens_with_locations(query_tokens);
    let query = parser
        .parse_query()
        .map_err(|e| parser_error(e, query_start))?;
    let trailing = parser.next_token();
    if trailing.token != Token::EOF {
        return Err(Diagnostic::error(
            span_of(&trailing),
            format!("unexpected `{}` after the route's query", trailing.token),
        ));
    }
    let (source, source_table, projection, filter) = route_query(*query, query_start)?;
    Ok(RouteSpec {
        sink,
        target,
        source,
        source_table,
        options,
        projection,
        filter,
        span: start,
    })
}

/// A sqlparser error, located: its message ends with "at Line: L, Column: C".
pub fn parser_error(e: ParserError, fallback: Span) -> Diagnostic {
    let msg = match &e {
        ParserError::ParserError(m) | ParserError::TokenizerError(m) => m.clone(),
        ParserError::RecursionLimitExceeded => "expression nests too deeply".to_string(),
    };
    let span = locate(&msg).unwrap_or(fallback);
    let clean = msg.split(" at Line:").next().unwrap_or(&msg).to_string();
    Diagnostic::error(span, clean)
}

fn locate(msg: &str) -> Option<Span> {
    let line_at = msg.rfind("Line: ")? + 6;
    let line: u32 = msg[line_at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let col_at = msg.rfind("Column: ")? + 8;
    let col: u32 = msg[col_at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some(Span::new(line, col))
}

fn node_span(node: &impl ast::Spanned, fallback: Span) -> Span {
    let s = node.span();
    if s.start.line > 0 {
        Span::new(s.start.line as u32, s.start.column as u32)
    } else {
        fallback
    }
}

type RouteParts = (
    Ident,
    QualifiedName,
    Vec<ProjectionItem>,
    Option<SpannedExpr>,
);

/// Checks the query is `SELECT ... FROM source.table [WHERE ...]` and takes
/// it apart.
fn route_query(query: ast::Query, at: Span) -> Result<RouteParts, Diagnostic> {
    let rule = "a route is a per-row map over a change stream: SELECT <items> FROM <source>.<table> [WHERE <condition>]";
    let reject = |what: &str, span: Span| {
        Diagnostic::error(span, format!("{what} is not allowed in a route")).with_rule(rule)
    };
    if query.with.is_some() {
        return Err(reject("WITH (a common table expression)", at));
    }
    if query.order_by.is_some() {
        return Err(reject("ORDER BY", at));
    }
    if query.limit_clause.is_some() || query.fetch.is_some() {
        return Err(reject("LIMIT", at));
    }
    let select = match *query.body {
        SetExpr::Select(s) => s,
        SetExpr::SetOperation { .. } => return Err(reject("UNION/INTERSECT/EXCEPT", at)),
        _ => return Err(Diagnostic::error(at, "expected SELECT").with_rule(rule)),
    };
    let select = *select;
    if select.distinct.is_some() {
        return Err(reject("DISTINCT", at));
    }
    match &select.group_by {
        GroupByExpr::Expressions(e, _) if e.is_empty() => {}
        _ => return Err(reject("GROUP BY", at)),
    }
    if select.having.is_some() {
        return Err(reject("HAVING", at));
    }
    if !select.named_window.is_empty() || select.qualify.is_some() {
        return Err(reject("WINDOW/QUALIFY", at));
    }
    if select.from.len() != 1 {
        return Err(
            Diagnostic::error(at, "a route reads exactly one source table").with_rule(rule),
        );
    }
    let from = &select.from[0];
    if !from.joins.is_empty() {
        return Err(reject("JOIN", node_span(&from.joins[0].relation, at)));
    }
    let (name, alias) = match &from.relation {
        TableFactor::Table {
            name,
            alias,
            args: None,
            ..
        } => (name, alias),
        other => return Err(reject("a subquery or table function", node_span(other, at))),
    };
    if alias.is_some() {
        return Err(Diagnostic::error(
            node_span(&from.relation, at),
            "a route's source table takes no alias",
        ));
    }
    let name_span = node_span(name, at);
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| match p.as_ident() {
            Some(i) if i.quote_style.is_some() => i.value.clone(),
            Some(i) => i.value.to_ascii_lowercase(),
            None => p.to_string(),
        })
        .collect();
    if parts.len() < 2 {
        return Err(Diagnostic::error(
            name_span,
            format!("`{name}` needs its source: FROM <source>.{name}"),
        ));
    }
    let source = Ident::new(parts[0].clone(), name_span);
    let table = QualifiedName::new(parts[1..].to_vec(), name_span);

    let mut projection = Vec::new();
    for item in select.projection {
        match item {
            SelectItem::UnnamedExpr(e) => {
                let span = node_span(&e, at);
                projection.push(ProjectionItem::Expr {
                    expr: Box::new(SpannedExpr { expr: e, span }),
                    alias: None,
                });
            }
            SelectItem::ExprWithAlias { expr, alias } => {
                let span = node_span(&expr, at);
                let name = if alias.quote_style.is_some() {
                    alias.value.clone()
                } else {
                    alias.value.to_ascii_lowercase()
                };
                let alias_span =
                    Span::new(alias.span.start.line as u32, alias.span.start.column as u32);
                projection.push(ProjectionItem::Expr {
                    expr: Box::new(SpannedExpr { expr, span }),
                    alias: Some(Ident::new(name, alias_span)),
                });
            }
            SelectItem::Wildcard(opts) | SelectItem::QualifiedWildcard(_, opts) => {
                let span = Span::new(
                    opts.wildcard_token.0.span.start.line as u32,
                    opts.wildcard_token.0.span.start.column as u32,
                );
                if opts.opt_exclude.is_some()
                    || opts.opt_except.is_some()
                    || opts.opt_rename.is_some()
                    || opts.opt_ilike.is_some()
                {
                    return Err(Diagnostic::error(
                        span,
                        "`*` takes only REPLACE (...) here; list the columns instead",
                    ));
                }
                let replace = opts
                    .opt_replace
                    .map(|r| {
                        r.items
                            .into_iter()
                            .map(|el| {
                                let el = *el;
                                let ident_span = Span::new(
                                    el.column_name.span.start.line as u32,
                                    el.column_name.span.start.column as u32,
                                );
                                let col = if el.column_name.quote_style.is_some() {
                                    el.column_name.value.clone()
                                } else {
                                    el.column_name.value.to_ascii_lowercase()
                                };
                                let espan = node_span(&el.expr, ident_span);
                                (
                                    Ident::new(col, ident_span),
                                    SpannedExpr {
                                        expr: el.expr,
                                        span: espan,
                                    },
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                projection.push(ProjectionItem::Wildcard { replace, span });
            }
        }
    }
    let filter = select.selection.map(|e| {
        let span = node_span(&e, at);
        SpannedExpr { expr: e, span }
    });
    Ok((source, table, projection, filter))
}
