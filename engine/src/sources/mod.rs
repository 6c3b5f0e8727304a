//! Sources: what reads changes. Each kind registers a
//! [`SourceProvider`](urutau_planner::registry::SourceProvider) for planning
//! and opens a [`ChangeSource`] for running.

pub mod file;
pub mod postgres;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use arrow::record_batch::RecordBatch;
use std::collections::HashMap;

use async_trait::async_trait;
use urutau_planner::plan::SourcePlan;
use urutau_planner::progress::SnapshotProgress;
use urutau_planner::registry::Registry;

use crate::batching::BatchPolicy;
use crate::position::{Position, PositionKind};

/// A failure of a source: terminal for the run.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    pub message: String,
}

impl SourceError {
    /// A source error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        SourceError {
            message: message.into(),
        }
    }
}

/// One table's rows of a source batch (data columns then context columns).
#[derive(Debug, Clone)]
pub struct TableChanges {
    pub table: Vec<String>,
    pub batch: RecordBatch,
}

/// Whole transactions read from a source, and the position after them.
#[derive(Debug, Clone)]
pub struct SourceBatch {
    pub tables: Vec<TableChanges>,
    pub end: Position,
    /// For a source that copies its tables first: each table's snapshot
    /// progress as of `end` (committed with the table's rows). Empty for
    /// sources without a snapshot.
    pub snapshot: Vec<(Vec<String>, SnapshotProgress)>,
}

/// What a source needs to start.
pub struct OpenArgs<'a> {
    pub plan: &'a SourcePlan,
    /// Resume after this position (`None`: from the beginning).
    pub start: Option<Position>,
    /// Each table's snapshot progress as every route of it committed it
    /// (a table absent here, or whose routes disagree, starts its snapshot
    /// over).
    pub snapshots: HashMap<Vec<String>, SnapshotProgress>,
    pub exit_when_caught_up: bool,
    pub policy: BatchPolicy,
    /// Set when the run is stopping: the source stops reading.
    pub stop: Arc<AtomicBool>,
}

/// A running source.
#[async_trait]
pub trait ChangeSource: Send {
    /// The next batch; `None` once the source is caught up (with
    /// `exit_when_caught_up`) or stopped.
    async fn next_batch(&mut self) -> Result<Option<SourceBatch>, SourceError>;

    /// Every route has committed up to `position`: the source may release
    /// what lies before it (e.g. a replication slot's WAL).
    async fn acknowledge(&mut self, position: &Position) -> Result<(), SourceError>;

    /// The run is over: the source makes sure the last acknowledgement has
    /// reached its server, then releases its connections.
    async fn close(&mut self) -> Result<(), SourceError> {
        Ok(())
    }
}

/// Opens a source of a planned kind.
pub fn open(args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError> {
    match args.plan.spec.kind.name.as_str() {
        "file" => file::open(args),
        "postgres" => postgres::open(args),
        other => Err(SourceError::new(format!(
            "source kind {other} cannot run in this build"
        ))),
    }
}

/// The position kind of a source kind.
pub fn position_kind(kind: &str) -> Option<PositionKind> {
    match kind {
        "file" => Some(PositionKind::File),
        "postgres" => Some(PositionKind::Lsn),
        "kafka" => Some(PositionKind::Offsets),
        _ => None,
    }
}

/// Registers every source kind this engine runs.
pub fn register(registry: &mut Registry) {
    registry.register_source(Arc::new(file::FileSourceProvider::new()));
    registry.register_source(postgres::provider());
}
