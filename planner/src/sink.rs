//! The sink contract: what every sink implements so one generic node
//! ([`crate::physical::SinkExec`]) can drive it.
//!
//! A sink holds the committed position itself, written atomically with the
//! data (or replayed idempotently), so a dead process resumes from what the
//! sink holds and nothing durable lives in the engine.

use std::any::Any;
use std::fmt;

use std::sync::Arc;

use arrow::array::BooleanArray;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::TableProvider;

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

/// A batch with what its sink did ahead of committing it
/// ([`Sink::prepare`]), handed back to [`Sink::commit_prepared`] or
/// [`Sink::stage_prepared`].
pub struct PreparedBatch {
    pub batch: SinkBatch,
    /// The sink's own part (e.g. the data files it wrote for the batch);
    /// `None` when it did nothing ahead.
    pub work: Option<Box<dyn Any + Send + Sync>>,
}

impl PreparedBatch {
    /// A batch nothing was done ahead for.
    pub fn plain(batch: SinkBatch) -> Self {
        PreparedBatch { batch, work: None }
    }
}

impl fmt::Debug for PreparedBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedBatch")
            .field("rows", &self.batch.rows.num_rows())
            .field("work", &self.work.is_some())
            .finish()
    }
}

/// What [`Sink::commit_prepared`] did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// The batch and its position are committed (with any deferred before
    /// it).
    Now,
    /// Held back with its position, for a later commit of the table.
    Deferred,
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

impl SinkError {
    /// Whether retrying later may succeed: an [`SinkError::Io`] failure
    /// that says the server, catalog or object store was unreachable or
    /// briefly failing (refused or reset connections, timeouts, HTTP 5xx,
    /// a full disk). A rejected batch, a mismatched table, an
    /// authentication or permission failure, and any other I/O failure
    /// are not: retrying them would only delay the error.
    pub fn is_transient(&self) -> bool {
        match self {
            SinkError::Io(message) => message_is_transient(message),
            _ => false,
        }
    }
}

/// The words of a failure that may pass (see [`SinkError::is_transient`]).
pub fn message_is_transient(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    const PERMANENT: &[&str] = &[
        "authentication failed",
        "invalid credentials",
        "unauthorized",
        "forbidden",
        "access denied",
        "permission denied",
        // A host name that does not exist (a temporary resolver failure
        // is "temporary failure in name resolution": transient).
        "name or service not known",
        "no address associated with hostname",
        // A certificate either side refuses stays refused.
        "invalid peer certificate",
        "certificate verify failed",
        "unknownissuer",
        "notvalidforname",
        "certificaterequired",
        "badcertificate",
    ];
    const TRANSIENT: &[&str] = &[
        "connection refused",
        "network error",
        "client error (connect)",
        "(temporary)",
        "connection reset",
        "connection closed",
        "connection aborted",
        "broken pipe",
        "timed out",
        "timeout",
        "error sending request",
        "error trying to connect",
        "tcp connect error",
        "dns error",
        "unexpected eof",
        "end of file",
        "os error 111",
        "os error 104",
        "os error 32",
        "no space left on device",
        "os error 28",
        "service unavailable",
        "bad gateway",
        "internal server error",
        "too many requests",
        "http status: 5",
        "status code 5",
        " 500 ",
        " 502 ",
        " 503 ",
        " 504 ",
        "slowdown",
        "try again",
    ];
    !PERMANENT.iter().any(|w| m.contains(w)) && TRANSIENT.iter().any(|w| m.contains(w))
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

    /// Does the part of committing `batch` that needs no earlier commit to
    /// have finished (e.g. writing its data files), so the sink node can
    /// do it for the next batch while the sink commits the current one
    /// (the sink's I/O waits then overlap the next batch's encoding).
    /// Called one batch at a time, in order; every result goes, in the
    /// same order, to [`Sink::commit_prepared`] or [`Sink::stage_prepared`].
    /// A prepared batch never committed (a crash, an earlier commit that
    /// failed) must leave nothing any reader or
    /// [`Sink::committed_position`] sees.
    ///
    /// `may_defer`: the sink may hold the batch back
    /// ([`Committed::Deferred`]) and commit it later with a batch after
    /// it (an initial snapshot's rows, gathered into files of the target
    /// size). Default: nothing ahead, nothing deferred.
    async fn prepare(
        &self,
        _table: &TargetTable,
        batch: SinkBatch,
        _may_defer: bool,
    ) -> Result<PreparedBatch, SinkError> {
        Ok(PreparedBatch::plain(batch))
    }
    /// [`Sink::commit`] of a batch [`Sink::prepare`] made. A batch
    /// prepared with `may_defer` may be held back: then neither its rows
    /// nor `position` are visible yet, and a later commit of the table
    /// makes them visible with its own (a crash before it loses both
    /// together, so the source sends them again).
    async fn commit_prepared(
        &self,
        table: &TargetTable,
        prepared: PreparedBatch,
        position: &str,
    ) -> Result<Committed, SinkError> {
        self.commit(table, &prepared.batch, position).await?;
        Ok(Committed::Now)
    }
    /// [`Sink::stage`] of a batch [`Sink::prepare`] made.
    async fn stage_prepared(
        &self,
        table: &TargetTable,
        prepared: PreparedBatch,
    ) -> Result<(), SinkError> {
        self.stage(table, &prepared.batch).await
    }

    /// Whether the sink stages parts of a transaction into `table`
    /// ([`Sink::stage`]). A transaction larger than `max_batch_rows` then
    /// reaches it in parts as they arrive, so memory stays bounded by the
    /// batch size; other tables receive such a transaction whole, in one
    /// batch.
    fn stages_transactions(&self, _table: &TargetTable) -> bool {
        false
    }

    /// Writes `batch`, a part of a transaction that continues in later
    /// batches, where neither readers nor [`Sink::committed_position`] see
    /// it. The next [`Sink::commit`] of the table makes every staged part
    /// visible with its own batch, atomically, in order (a later part's
    /// change of a key supersedes an earlier one's). Staged parts that no
    /// commit followed (a crash, a failed commit) are discarded by the next
    /// [`Sink::ensure_table`]. Only called when
    /// [`Sink::stages_transactions`] is true.
    async fn stage(&self, table: &TargetTable, _batch: &SinkBatch) -> Result<(), SinkError> {
        Err(SinkError::Unavailable(format!(
            "table {}: this sink kind cannot stage part of a transaction",
            table.display_name()
        )))
    }

    /// The version of `table`'s schema as the sink names it (Iceberg's
    /// current schema id), for `/statusz`: it moves when a schema change
    /// at the source evolves the table. `None`: the sink has none.
    async fn schema_version(&self, _table: &TargetTable) -> Option<String> {
        None
    }

    /// What the sink does besides committing batches (e.g. Iceberg table
    /// maintenance), for `plan --explain`: a setting that takes effect
    /// shows in the plan. `None` when nothing.
    fn extra_work(&self) -> Option<String> {
        None
    }

    /// The position [`Sink::committed_position`] would return, read
    /// without creating or changing anything (no catalog file, namespace,
    /// database or table): what a preview starts after. `None` when the
    /// table does not exist or holds no position.
    async fn peek_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError> {
        Err(SinkError::Unavailable(format!(
            "table {}: this sink kind cannot tell its position without preparing the table, so it cannot be previewed",
            table.display_name()
        )))
    }

    /// The table as it stands in the sink, for queries (`urutau query`,
    /// the Python `sql()`): the live rows of an upsert table (deletes
    /// applied), every row of an append table, in the route's columns.
    /// `None` when the table does not exist yet. Reading creates nothing
    /// (no catalog file, namespace or table) and commits nothing.
    async fn read_table(
        &self,
        table: &TargetTable,
    ) -> Result<Option<Arc<dyn TableProvider>>, SinkError> {
        Err(SinkError::Unavailable(format!(
            "table {}: this sink kind cannot be queried",
            table.display_name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_servers_are_transient_rejections_and_auth_are_not() {
        for m in [
            "clickhouse: inserting into db.t: network error: client error (Connect)",
            "iceberg: committing: Unexpected (temporary) at write, context: { status: 503 }",
            "error sending request for url (http://127.0.0.1:8181/v1/config)",
            "writing data file: No space left on device (os error 28)",
        ] {
            assert!(SinkError::Io(m.into()).is_transient(), "{m}");
        }
        for m in [
            "clickhouse: Code: 516. DB::Exception: Authentication failed (AUTHENTICATION_FAILED)",
            "the catalog answered 403 Forbidden",
            "internal: column count mismatch",
            "error sending request: dns error: failed to lookup address information: Name or service not known",
        ] {
            assert!(!SinkError::Io(m.into()).is_transient(), "{m}");
        }
        assert!(!SinkError::Rejected("connection refused".into()).is_transient());
    }
}
