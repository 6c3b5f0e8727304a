//! Relative paths of a pipeline given as text, resolved against the
//! directory the caller names (a notebook's `base_dir`), so the same text
//! means the same files whatever the process's working directory. A file
//! is resolved against the working directory, as the CLI does.

use std::path::Path;

use urutau_planner::diagnostic::Span;
use urutau_planner::options::{OptionEntry, OptionMap, OptionValue};
use urutau_planner::registry::Registry;
use urutau_planner::spec::PipelineSpec;

/// How an option holds a local path.
#[derive(Clone, Copy)]
enum Form {
    /// The value is a path (unless it has a scheme: `s3://...`).
    Path,
    /// `sqlite://path` (a SQL catalog; other URIs are left alone).
    SqliteUri,
}

/// The options that name local files, by source or sink kind.
const SOURCE_PATHS: &[(&str, &str, Form)] = &[
    ("file", "path", Form::Path),
    ("kafka", "tls_ca", Form::Path),
    ("kafka", "tls_cert", Form::Path),
    ("kafka", "tls_key", Form::Path),
];
const SINK_PATHS: &[(&str, &str, Form)] = &[
    ("iceberg", "uri", Form::SqliteUri),
    ("iceberg", "warehouse", Form::Path),
];

/// `text` with a relative path in it made relative to `base`.
fn resolve(text: &str, form: Form, base: &Path) -> Option<String> {
    let (prefix, path) = match form {
        Form::Path if text.contains("://") => return None,
        Form::Path => ("", text),
        Form::SqliteUri => {
            let rest = text.strip_prefix("sqlite://")?;
            ("sqlite://", rest)
        }
    };
    if path.is_empty() || Path::new(path).is_absolute() {
        return None;
    }
    Some(format!("{prefix}{}", base.join(path).display()))
}

/// Rewrites one statement's path options (and the defaults of those not
/// written, which are relative too).
fn rewrite(
    options: &mut OptionMap,
    kind: &str,
    table: &[(&str, &str, Form)],
    default_of: impl Fn(&str) -> Option<&'static str>,
    base: &Path,
) {
    for (k, name, form) in table {
        if *k != kind {
            continue;
        }
        match options.entries.iter_mut().find(|e| e.name == *name) {
            Some(e) => {
                if let Some(text) = resolve(&e.value.text, *form, base) {
                    e.value.text = text;
                }
            }
            None => {
                if let Some(text) = default_of(name).and_then(|d| resolve(d, *form, base)) {
                    options.entries.push(OptionEntry {
                        name: name.to_string(),
                        value: OptionValue::string(text),
                        name_span: Span::new(1, 1),
                        value_span: Span::new(1, 1),
                    });
                }
            }
        }
    }
}

/// Resolves every relative local path of `spec` against `base`.
pub fn resolve_relative(spec: &mut PipelineSpec, base: &Path, registry: &Registry) {
    for s in &mut spec.sources {
        let kind = s.kind.name.clone();
        let defs = registry.source(&kind).map(|p| p.def().options.clone());
        rewrite(
            &mut s.options,
            &kind,
            SOURCE_PATHS,
            |n| defs.as_ref()?.iter().find(|d| d.name == n)?.default,
            base,
        );
    }
    for s in &mut spec.sinks {
        let kind = s.kind.name.clone();
        let defs = registry.sink(&kind).map(|p| p.def().options.clone());
        rewrite(
            &mut s.options,
            &kind,
            SINK_PATHS,
            |n| defs.as_ref()?.iter().find(|d| d.name == n)?.default,
            base,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_move_under_the_base_and_others_stay() {
        let base = Path::new("/data/nb");
        assert_eq!(
            resolve("shop.jsonl", Form::Path, base).as_deref(),
            Some("/data/nb/shop.jsonl")
        );
        assert_eq!(resolve("/abs/x", Form::Path, base), None);
        assert_eq!(resolve("s3://b/w", Form::Path, base), None);
        assert_eq!(
            resolve("sqlite://wh/catalog.db", Form::SqliteUri, base).as_deref(),
            Some("sqlite:///data/nb/wh/catalog.db")
        );
        assert_eq!(resolve("sqlite:///abs.db", Form::SqliteUri, base), None);
        assert_eq!(resolve("postgres://h/db", Form::SqliteUri, base), None);
    }
}
