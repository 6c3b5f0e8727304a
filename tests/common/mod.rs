//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use urutau_planner::diagnostic::Diagnostics;
use urutau_planner::plan::{PipelinePlan, plan_pipeline};
use urutau_planner::registry::Registry;

/// Every source and sink kind of the build (what the binary registers).
pub fn registry() -> Registry {
    let mut r = Registry::new();
    urutau_engine::sources::register(&mut r);
    urutau_sinks::register(&mut r);
    r
}

/// Plans pipeline SQL text.
pub async fn plan_sql(text: &str) -> Result<PipelinePlan, Diagnostics> {
    let spec = urutau_sql::parse_pipeline_sql(text, "test", &|_| None)?;
    plan_pipeline(spec, &registry()).await
}

/// A memory-store name no other test uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Diagnostics as text (for assertion messages).
pub fn show(d: &Diagnostics) -> String {
    d.items.iter().map(|i| format!("{i}\n")).collect()
}
