//! `WITH (...)` options: their values as written, the schema each source and
//! sink kind declares for them, and redaction of secrets.
//!
//! Options are checked against their kind's schema at load time: an unknown
//! name is an error (with "did you mean"), a value of the wrong shape is an
//! error naming the option, and a secret (a password, a token, a URI's
//! userinfo or credential query parameter) never appears in anything printed.

use std::fmt;
use std::time::Duration;

use crate::diagnostic::{Diagnostic, Diagnostics, Span, did_you_mean};

/// The literal form an option value was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiteralKind {
    String,
    Number,
    Bool,
}

/// One option value, resolved (an `env('NAME')` value holds the variable's
/// content and remembers its name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionValue {
    pub text: String,
    pub literal: LiteralKind,
    /// The environment variable the value was read from, if any.
    pub env: Option<String>,
}

impl OptionValue {
    /// A string literal.
    pub fn string(text: impl Into<String>) -> Self {
        OptionValue {
            text: text.into(),
            literal: LiteralKind::String,
            env: None,
        }
    }
}

/// One `name = value` entry, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionEntry {
    pub name: String,
    pub value: OptionValue,
    pub name_span: Span,
    pub value_span: Span,
}

/// The options of one statement, in written order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OptionMap {
    pub entries: Vec<OptionEntry>,
}

impl OptionMap {
    /// The entry named `name`.
    pub fn entry(&self, name: &str) -> Option<&OptionEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The text of option `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entry(name).map(|e| e.value.text.as_str())
    }

    /// Adds an entry (front ends).
    pub fn push(
        &mut self,
        name: impl Into<String>,
        value: OptionValue,
        name_span: Span,
        value_span: Span,
    ) {
        self.entries.push(OptionEntry {
            name: name.into(),
            value,
            name_span,
            value_span,
        });
    }

    /// Entries sorted by name: the order-independent form used to compare
    /// specs from different front ends.
    pub fn sorted(&self) -> Vec<&OptionEntry> {
        let mut v: Vec<&OptionEntry> = self.entries.iter().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

/// The shape an option's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionType {
    String,
    Bool,
    /// An integer within bounds.
    Int {
        min: i64,
        max: i64,
    },
    /// `500ms`, `5s`, `10m`, `1h`, `7d`.
    Duration,
    /// `512Mi`, `64MB`, `1048576`.
    Size,
    /// One of the listed words.
    Enum(&'static [&'static str]),
}

/// The declaration of one option a kind accepts.
#[derive(Debug, Clone, Copy)]
pub struct OptionDef {
    pub name: &'static str,
    pub ty: OptionType,
    pub required: bool,
    /// Default value, as text, when it has one.
    pub default: Option<&'static str>,
    /// Never printed: replaced by `***`.
    pub secret: bool,
    /// Other spellings accepted (the Go engine's YAML names).
    pub aliases: &'static [&'static str],
    pub doc: &'static str,
}

impl OptionDef {
    /// An optional string option.
    pub const fn new(name: &'static str, ty: OptionType, doc: &'static str) -> Self {
        OptionDef {
            name,
            ty,
            required: false,
            default: None,
            secret: false,
            aliases: &[],
            doc,
        }
    }
    /// Marks the option required.
    pub const fn required(mut self) -> Self {
        self.required = true;
        self
    }
    /// Gives the option a default value.
    pub const fn default(mut self, v: &'static str) -> Self {
        self.default = Some(v);
        self
    }
    /// Marks the option secret (never printed).
    pub const fn secret(mut self) -> Self {
        self.secret = true;
        self
    }
    /// Other accepted spellings.
    pub const fn aliases(mut self, a: &'static [&'static str]) -> Self {
        self.aliases = a;
        self
    }

    /// `retry_timeout`, which every source and sink that talks to a server
    /// accepts: how long one outage of it (lost connection, server
    /// restarting, HTTP 5xx) is retried before the run stops with the
    /// cause. The engine's supervisor reads it.
    pub const fn retry_timeout() -> Self {
        OptionDef::new(
            "retry_timeout",
            OptionType::Duration,
            "how long an outage of this server is retried (backoff with jitter, from the committed positions) before the run stops",
        )
        .default("5m")
    }
}

/// Parses `500ms`, `5s`, `10m`, `1h`, `7d` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 500ms, 5s, 10m, 1h, 7d)"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        other => {
            return Err(format!(
                "unknown duration unit `{other}` in `{text}` (ms, s, m, h, d)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{text}` is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `512Mi`, `64MB`, `1Gi`, `1048576` into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 512Mi, 64MB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "Ki" | "KiB" => 1 << 10,
        "M" | "MB" => 1_000_000,
        "Mi" | "MiB" => 1 << 20,
        "G" | "GB" => 1_000_000_000,
        "Gi" | "GiB" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` in `{text}`")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// Checks `options` against `defs`: unknown names (with "did you mean"),
/// missing required ones, malformed values, duplicates. Entries written
/// under an alias are renamed to the canonical name.
pub fn check_options(
    options: &mut OptionMap,
    defs: &[OptionDef],
    owner: &str,
    owner_span: Span,
    diags: &mut Diagnostics,
) {
    let mut seen: Vec<&'static str> = Vec::new();
    for entry in &mut options.entries {
        let Some(def) = defs
            .iter()
            .find(|d| d.name == entry.name || d.aliases.contains(&entry.name.as_str()))
        else {
            let names: Vec<&str> = defs.iter().map(|d| d.name).collect();
            let mut d = Diagnostic::error(
                entry.name_span,
                format!("unknown option `{}` for {owner}", entry.name),
            )
            .with_rule("options are checked against the kind's schema; an unknown option is an error, never ignored");
            d = match did_you_mean(&entry.name, names.iter().copied()) {
                Some(s) => d.with_help(format!("did you mean `{s}`?")),
                None => d.with_help(format!("known options: {}", names.join(", "))),
            };
            diags.push(d);
            continue;
        };
        if seen.contains(&def.name) {
            diags.push(Diagnostic::error(
                entry.name_span,
                format!("option `{}` is given twice for {owner}", def.name),
            ));
        }
        seen.push(def.name);
        entry.name = def.name.to_string();
        if let Err(msg) = check_value(&entry.value, def.ty) {
            diags.push(
                Diagnostic::error(
                    entry.value_span,
                    format!("option `{}` of {owner}: {msg}", def.name),
                )
                .with_help(def.doc),
            );
        }
    }
    // Defaults become explicit, so what a pipeline means prints the same
    // whatever the file spelled out.
    for def in defs {
        if let Some(default) = def.default
            && options.entry(def.name).is_none()
        {
            options.push(
                def.name,
                OptionValue::string(default),
                owner_span,
                owner_span,
            );
        }
    }
    for def in defs.iter().filter(|d| d.required) {
        if options.entry(def.name).is_none() {
            diags.push(
                Diagnostic::error(owner_span, format!("{owner} needs option `{}`", def.name))
                    .with_help(def.doc),
            );
        }
    }
}

fn check_value(value: &OptionValue, ty: OptionType) -> Result<(), String> {
    let t = value.text.as_str();
    match ty {
        OptionType::String => Ok(()),
        OptionType::Bool => match t.to_ascii_lowercase().as_str() {
            "true" | "false" => Ok(()),
            _ => Err(format!("expected true or false, found `{t}`")),
        },
        OptionType::Int { min, max } => match t.parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(()),
            Ok(n) => Err(format!("{n} is out of range {min}..={max}")),
            Err(_) => Err(format!("expected an integer, found `{t}`")),
        },
        OptionType::Duration => parse_duration(t).map(|_| ()),
        OptionType::Size => parse_size(t).map(|_| ()),
        OptionType::Enum(words) => {
            if words.contains(&t) {
                Ok(())
            } else {
                Err(format!(
                    "expected one of {}, found `{t}`",
                    words.join(" | ")
                ))
            }
        }
    }
}

/// Words that mark an option as secret even when its kind did not say so.
const SECRET_WORDS: [&str; 6] = [
    "password",
    "secret",
    "token",
    "credential",
    "private_key",
    "access_key",
];

/// True when an option of this name must never be printed.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| lower.contains(w)) || lower == "key" || lower.ends_with("_key")
}

/// A URI with its userinfo password and credential query parameters masked:
/// `postgres://u:***@h/db?password=***`.
pub fn redact_uri(uri: &str) -> String {
    let mut out = uri.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?', '#'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                let start = rest_start + colon + 1;
                out.replace_range(start..rest_start + at, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if is_secret_name(k) => format!("{k}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out = format!("{head}{}", masked.join("&"));
    }
    out
}

/// Free text (an error message, a log line) with the password of every URI
/// in it masked.
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        // The scheme: the letters right before `://`.
        let scheme_start = rest[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'))
            .map_or(0, |j| j + 1);
        out.push_str(&rest[..scheme_start]);
        let uri_end = rest[i..]
            .find(|c: char| {
                c.is_whitespace() || c == '\'' || c == '"' || c == '`' || c == ')' || c == ','
            })
            .map_or(rest.len(), |j| i + j);
        out.push_str(&redact_uri(&rest[scheme_start..uri_end]));
        rest = &rest[uri_end..];
    }
    out.push_str(rest);
    out
}

/// An option value as it may be printed: secrets masked, URIs redacted, and
/// values read from the environment shown by their variable's name.
pub fn display_value(name: &str, value: &OptionValue, secret: bool) -> String {
    if secret || is_secret_name(name) {
        return match &value.env {
            Some(var) => format!("env('{var}')"),
            None => "***".to_string(),
        };
    }
    if value.text.contains("://") {
        return redact_uri(&value.text);
    }
    value.text.clone()
}

/// Formats `name = value` pairs for display, redacted.
pub struct RedactedOptions<'a> {
    pub options: &'a OptionMap,
    pub defs: &'a [OptionDef],
}

impl fmt::Display for RedactedOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.options.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let secret = self.defs.iter().any(|d| d.name == e.name && d.secret);
            write!(f, "{}={}", e.name, display_value(&e.name, &e.value, secret))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_uri_passwords_and_query_secrets() {
        assert_eq!(
            redact_uri("postgres://repl:replpass@127.0.0.1:5433/shop?sslmode=disable"),
            "postgres://repl:***@127.0.0.1:5433/shop?sslmode=disable"
        );
        assert_eq!(
            redact_uri("clickhouse://localhost:9002?password=clickpass&x=1"),
            "clickhouse://localhost:9002?password=***&x=1"
        );
        assert_eq!(redact_uri("http://h:8181/a"), "http://h:8181/a");
        assert_eq!(
            redact_text("cannot reach postgres://u:pw@h/db (timeout), retry"),
            "cannot reach postgres://u:***@h/db (timeout), retry"
        );
        assert_eq!(
            display_value("client_secret", &OptionValue::string("s3cr3t"), false),
            "***"
        );
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_size("512Mi").unwrap(), 512 << 20);
        assert!(parse_size("12XB").is_err());
    }

    #[test]
    fn unknown_options_get_did_you_mean() {
        let defs = [OptionDef::new("namespace", OptionType::String, "ns")];
        let mut opts = OptionMap::default();
        opts.push(
            "namespce",
            OptionValue::string("x"),
            Span::new(3, 4),
            Span::new(3, 15),
        );
        let mut d = Diagnostics::default();
        check_options(
            &mut opts,
            &defs,
            "sink `lake` (iceberg)",
            Span::new(1, 1),
            &mut d,
        );
        assert_eq!(d.items.len(), 1);
        assert_eq!(
            d.items[0].help.as_deref(),
            Some("did you mean `namespace`?")
        );
        assert_eq!(d.items[0].span.line, 3);
    }
}
