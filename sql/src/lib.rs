//! urutau's front ends: pipeline SQL and the Go engine's YAML, both into a
//! [`PipelineSpec`] whose every part knows its `line:col` in the file.

pub mod pipeline_sql;
pub mod pipeline_yaml;
mod tokens;
mod yaml_tree;

use std::path::Path;

use urutau_planner::diagnostic::{Diagnostic, Diagnostics, InvalidPipeline, Span};
use urutau_planner::spec::PipelineSpec;

pub use pipeline_sql::parse_pipeline_sql;
pub use pipeline_yaml::parse_pipeline_yaml;
pub use tokens::EnvLookup;

/// A pipeline file, read and parsed.
#[derive(Debug, Clone)]
pub struct LoadedPipeline {
    pub path: String,
    pub text: String,
    pub spec: PipelineSpec,
}

/// The process environment, for `env('NAME')`.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Reads and parses a pipeline file: `.sql` with the SQL front end, `.yaml`
/// / `.yml` with the YAML one.
pub fn load_pipeline(path: &Path, env: EnvLookup<'_>) -> Result<LoadedPipeline, InvalidPipeline> {
    let shown = path.display().to_string();
    let invalid = |d: Diagnostics, text: Option<String>| InvalidPipeline {
        file: shown.clone(),
        text,
        diagnostics: d,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        let mut d = Diagnostics::default();
        d.push(Diagnostic::error(
            Span::new(1, 1),
            format!("cannot read the file: {e}"),
        ));
        invalid(d, None)
    })?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "pipeline".into());
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let parsed = match ext.as_str() {
        "sql" => parse_pipeline_sql(&text, &stem, env),
        "yaml" | "yml" => parse_pipeline_yaml(&text, &stem, env),
        _ => {
            let mut d = Diagnostics::default();
            d.push(Diagnostic::error(
                Span::new(1, 1),
                "a pipeline file ends in .sql (pipeline SQL) or .yaml/.yml (the Go engine's YAML)",
            ));
            Err(d)
        }
    };
    match parsed {
        Ok(spec) => Ok(LoadedPipeline {
            path: shown,
            text,
            spec,
        }),
        Err(d) => Err(invalid(d, Some(text))),
    }
}
