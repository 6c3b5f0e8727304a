//! Locations and diagnostics: every error about a pipeline file names
//! `file:line:col`, the rule broken, and shows the offending line.

use std::fmt;

/// A 1-based line and column in a pipeline file.
///
/// Spans never take part in equality or hashing: two front ends (SQL and
/// YAML) that mean the same pipeline produce equal specs although their
/// spans differ.
#[derive(Debug, Clone, Copy, Default)]
pub struct Span {
    pub line: u32,
    pub col: u32,
}

impl Span {
    /// A span at `line:col` (both 1-based).
    pub fn new(line: u32, col: u32) -> Self {
        Span { line, col }
    }

    /// True when the span points nowhere (built in code, not read from a file).
    pub fn is_unknown(&self) -> bool {
        self.line == 0
    }

    /// The span `cols` columns to the right on the same line.
    pub fn shifted(self, cols: usize) -> Span {
        Span {
            line: self.line,
            col: self.col + cols as u32,
        }
    }
}

impl PartialEq for Span {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Span {}
impl std::hash::Hash for Span {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// Error or warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One finding about a pipeline file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub span: Span,
    pub message: String,
    /// The rule that was broken, as the user should read it.
    pub rule: Option<String>,
    /// What to do about it.
    pub help: Option<String>,
    /// The pipeline may be fine: a server it needs could not be asked
    /// (a runtime failure, exit 1, not an invalid pipeline).
    pub unavailable: bool,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn error(span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            span,
            message: message.into(),
            rule: None,
            help: None,
            unavailable: false,
        }
    }

    /// A warning at `span`.
    pub fn warning(span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(span, message)
        }
    }

    /// Marks an error as a server that could not be asked, not a fault
    /// of the pipeline.
    pub fn unavailable(mut self) -> Self {
        self.unavailable = true;
        self
    }

    /// Names the rule the finding is about.
    pub fn with_rule(mut self, rule: impl Into<String>) -> Self {
        self.rule = Some(rule.into());
        self
    }

    /// Adds advice.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds advice when there is some.
    pub fn with_help_opt(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    /// True for errors (not warnings).
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// Renders `file:line:col: error: message`, the source line with a caret,
    /// then the rule and help lines.
    pub fn render(&self, file: &str, source: Option<&str>) -> String {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut out = format!(
            "{file}:{}:{}: {level}: {}\n",
            self.span.line, self.span.col, self.message
        );
        if let Some(line) =
            source.and_then(|s| s.lines().nth(self.span.line.saturating_sub(1) as usize))
        {
            let gutter = self.span.line.to_string();
            let pad = " ".repeat(gutter.len());
            out.push_str(&format!("{gutter} | {line}\n"));
            let caret_at: usize = line
                .chars()
                .take(self.span.col.saturating_sub(1) as usize)
                .map(|c| if c == '\t' { 1 } else { c.len_utf16() })
                .sum();
            let lead: String = line
                .chars()
                .take(caret_at)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            out.push_str(&format!("{pad} | {lead}^\n"));
        }
        if let Some(rule) = &self.rule {
            out.push_str(&format!("  rule: {rule}\n"));
        }
        if let Some(help) = &self.help {
            out.push_str(&format!("  help: {help}\n"));
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.span.line, self.span.col, self.message)?;
        if let Some(rule) = &self.rule {
            write!(f, " (rule: {rule})")?;
        }
        Ok(())
    }
}

/// The findings about one pipeline file; an error-free set may still hold
/// warnings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics {
    pub items: Vec<Diagnostic>,
}

impl Diagnostics {
    /// Adds a finding.
    pub fn push(&mut self, d: Diagnostic) {
        self.items.push(d);
    }

    /// Adds every finding of `other`.
    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    /// True when any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    /// The errors.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| d.is_error())
    }

    /// The warnings.
    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| !d.is_error())
    }

    /// Renders every finding, sorted by position.
    pub fn render(&self, file: &str, source: Option<&str>) -> String {
        let mut items: Vec<&Diagnostic> = self.items.iter().collect();
        items.sort_by_key(|d| (d.span.line, d.span.col));
        items.iter().map(|d| d.render(file, source)).collect()
    }
}

/// A pipeline file that could not be accepted: its findings (at least one
/// error), with the file they are about.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .diagnostics.render(&self.file, self.text.as_deref()))]
pub struct InvalidPipeline {
    pub file: String,
    pub text: Option<String>,
    pub diagnostics: Diagnostics,
}

/// Levenshtein distance, for "did you mean".
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate closest to `name` when it is close enough to be a typo.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let lower = name.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (edit_distance(&lower, &c.to_ascii_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len() / 3).clamp(1, 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_location_caret_rule() {
        let d = Diagnostic::error(Span::new(2, 5), "bad cast")
            .with_rule("narrowing")
            .with_help("use BIGINT");
        let text = d.render("p.sql", Some("line one\n  x CAST(a AS INT)\n"));
        assert_eq!(
            text,
            "p.sql:2:5: error: bad cast\n2 |   x CAST(a AS INT)\n  |     ^\n  rule: narrowing\n  help: use BIGINT\n"
        );
    }

    #[test]
    fn suggests_close_names_only() {
        assert_eq!(
            did_you_mean("namespce", ["namespace", "warehouse"]),
            Some("namespace")
        );
        assert_eq!(did_you_mean("zzz", ["namespace", "warehouse"]), None);
    }
}
