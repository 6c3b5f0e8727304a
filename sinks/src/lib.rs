//! urutau's sinks: each implements the planner's
//! [`Sink`](urutau_planner::sink::Sink) contract and registers its kind
//! (options, capabilities) so pipelines can be validated and planned.
//!
//! - `debug`: prints each committed batch as a table (experiments).
//! - `memory`: holds tables in process memory (engine tests).
//! - `iceberg`: Apache Iceberg through a SQL catalog (SQLite or Postgres).
//! - `clickhouse`: ReplacingMergeTree upserts, the position in the data.
//! - `couchbase`: one document per key, a control document per collection
//!   holding the position; fast or atomic commits.

#![recursion_limit = "256"]

pub mod clickhouse;
pub mod couchbase;
pub mod debug;
pub mod iceberg;
pub mod memory;
pub mod tls;

use std::sync::Arc;

use urutau_planner::registry::Registry;

/// Registers every sink kind.
pub fn register(registry: &mut Registry) {
    registry.register_sink(Arc::new(debug::DebugSinkProvider::new()));
    registry.register_sink(Arc::new(memory::MemorySinkProvider::new()));
    registry.register_sink(Arc::new(iceberg::IcebergSinkProvider::new()));
    registry.register_sink(Arc::new(clickhouse::ClickHouseSinkProvider::new()));
    registry.register_sink(Arc::new(couchbase::CouchbaseSinkProvider::new()));
}
