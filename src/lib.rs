//! urutau as a library: the one facade the CLI, the tests, the benches and
//! the Python package go through, so none of them wires registries,
//! secrets or the runner by itself.
//!
//! ```no_run
//! # async fn demo() -> Result<(), urutau::Error> {
//! let p = urutau::Pipeline::load("examples/quickstart.sql".as_ref()).await?;
//! print!("{}", p.explain(urutau::ExplainFormat::Indent));
//! let report = p.run(urutau::RunOptions { exit_when_caught_up: true, ..Default::default() }).await?;
//! let rows = p.sql("SELECT count(*) FROM lake.orders").await?;
//! # let _ = (report, rows);
//! # Ok(())
//! # }
//! ```

pub mod output;
mod paths;
mod pipeline;
pub mod preview;
mod query;
mod secrets;

pub use pipeline::{Error, Language, Pipeline, RunHandle};
pub use query::QueryResult;
pub use urutau_engine::{RouteReport, RunOptions, RunReport};
pub use urutau_planner::diagnostic::{Diagnostic, Severity};
pub use urutau_planner::plan::ExplainFormat;

use urutau_planner::registry::Registry;

/// Every source and sink kind of this build.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    urutau_engine::sources::register(&mut r);
    urutau_sinks::register(&mut r);
    r
}
