//! Keeping a pipeline's secrets out of everything it prints: diagnostics
//! quote source lines (a password in a URI), errors quote options.

use urutau_planner::options::{is_secret_name, redact_text};
use urutau_planner::spec::PipelineSpec;

/// The secret option values of a pipeline, to scrub from any text shown.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    values: Vec<String>,
}

impl Secrets {
    /// The values of the secret options (passwords, tokens) of every source
    /// and sink of `spec`.
    pub fn of(spec: &PipelineSpec) -> Self {
        let values = spec
            .sources
            .iter()
            .map(|s| &s.options)
            .chain(spec.sinks.iter().map(|s| &s.options))
            .flat_map(|o| o.entries.iter())
            .filter(|e| is_secret_name(&e.name) && e.value.text.len() >= 3)
            .map(|e| e.value.text.clone())
            .collect();
        Secrets { values }
    }

    /// `text` with credentials in URIs and every secret value replaced by
    /// `***`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = redact_text(text);
        for s in &self.values {
            out = out.replace(s.as_str(), "***");
        }
        out
    }
}
