//! urutau's runtime: sources, positions, batching and the runner that drives
//! each route's DataFusion plan.

pub mod batching;
pub mod change_batch;
pub mod metrics;
pub mod position;
pub mod runner;
pub mod shutdown;
pub mod sources;
pub mod status_server;
pub mod supervisor;

pub use runner::{RouteReport, RunError, RunOptions, RunReport, run};
pub use shutdown::Shutdown;
pub use supervisor::run_with_retries;
