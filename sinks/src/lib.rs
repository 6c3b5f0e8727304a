//! urutau's sinks: each implements the planner's
//! [`Sink`](urutau_planner::sink::Sink) contract and registers its kind
//! (options, capabilities) so pipelines can be validated and planned.
//!
//! - `debug`: prints each committed batch as a table (experiments).
//! - `memory`: holds tables in process memory (engine tests).
//! - `iceberg`: Apache Iceberg through a SQL catalog (SQLite or Postgres).
//! - `clickhouse`: ReplacingMergeTree upserts, the position in the data.
//! - `couchbase`: its option schema and rules are registered so pipelines
//!   validate and plan; its writer is not in this build yet, and running
//!   one fails with that message.

pub mod clickhouse;
pub mod debug;
pub mod iceberg;
pub mod kinds;
pub mod memory;

use std::sync::Arc;

use urutau_planner::registry::Registry;

/// Registers every sink kind.
pub fn register(registry: &mut Registry) {
    registry.register_sink(Arc::new(debug::DebugSinkProvider::new()));
    registry.register_sink(Arc::new(memory::MemorySinkProvider::new()));
    registry.register_sink(Arc::new(iceberg::IcebergSinkProvider::new()));
    registry.register_sink(Arc::new(clickhouse::ClickHouseSinkProvider::new()));
    for p in kinds::planned_kinds() {
        registry.register_sink(p);
    }
}
