//! The sink contract: what every sink implements so one generic node
//! ([`crate::physical::SinkExec`]) can drive it.
//!
//! A sink holds the committed position itself, written atomically with the
//! data (or replayed idempotently), so a dead process resumes from what the
//! sink holds and nothing durable lives in the engine.

use std::fmt;

use arrow::array::BooleanArray;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use crate::target::TargetTable;

/// One batch a sink commits: rows in the target's schema, and which of them
/// are deletes.
///
/// Upsert routes hand over at most one row per key (collapsed): a delete row
/// removes its key; any other row replaces the key's image. Append routes
/// hand over every change: a delete row is appended too (its before image
/// with its op metadata).
#[derive(Debug, Clone)]
pub struct SinkBatch {
    pub rows: RecordBatch,
    pub deletes: BooleanArray,
}

impl SinkBatch {
    /// Number of rows that are deletes.
    pub fn delete_count(&self) -> usize {
        self.deletes.true_count()
    }
}

/// Why a sink could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The batch cannot be written (a value the target cannot hold, a
    /// constraint); retrying cannot help.
    #[error("batch rejected: {0}")]
    Rejected(String),
    /// The target table exists and does not match the route.
    #[error("table mismatch: {0}")]
    TableMismatch(String),
    /// The sink (its server, catalog or storage) failed.
    #[error("{0}")]
    Io(String),
    /// This sink kind cannot run in this build.
    #[error("{0}")]
    Unavailable(String),
}

/// A sink, as one `CREATE SINK` statement configures it. One instance serves
/// every route that writes into it; each call names the target table.
#[async_trait]
pub trait Sink: Send + Sync + fmt::Debug {
    /// Creates the target when absent, or checks that the existing one
    /// matches (an error names the columns; never a silent rewrite).
    async fn ensure_table(&self, table: &TargetTable) -> Result<(), SinkError>;

    /// The position committed with the newest data of `table` (text form of
    /// the source's position), read from the sink itself; `None` when
    /// nothing was committed yet.
    async fn committed_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError>;

    /// Writes `batch` into `table` and records `position` with it, so that
    /// after a crash either both are durable or replaying the batch is
    /// idempotent. An empty batch only advances the position.
    async fn commit(
        &self,
        table: &TargetTable,
        batch: &SinkBatch,
        position: &str,
    ) -> Result<(), SinkError>;

    /// What the sink does besides committing batches (e.g. Iceberg table
    /// maintenance), for `plan --explain`: a setting that takes effect
    /// shows in the plan. `None` when nothing.
    fn extra_work(&self) -> Option<String> {
        None
    }
}
