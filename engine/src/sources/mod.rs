//! Sources: what reads changes. Each kind registers a
//! [`SourceProvider`](urutau_planner::registry::SourceProvider) for planning
//! and opens a [`ChangeSource`] for running.

mod datetime_text;
pub mod debezium;
pub mod decode;
pub mod file;
mod json_blocks;
pub mod json_text;
pub mod kafka;
pub mod postgres;
mod tls_probe;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use arrow::record_batch::RecordBatch;
use std::collections::HashMap;

use async_trait::async_trait;
use urutau_planner::evolution::SchemaChange;
use urutau_planner::plan::SourcePlan;
use urutau_planner::progress::SnapshotProgress;
use urutau_planner::registry::{Registry, SourceProvider};

use crate::batching::BatchPolicy;
use crate::position::{Position, PositionKind};

/// A failure of a source. It ends the run; a `transient` one (the
/// connection was lost, the server is restarting) is retried by
/// [`crate::supervisor`] from the committed positions, within the source's
/// `retry_timeout`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    pub message: String,
    /// Retrying later may succeed (no configuration or data problem).
    pub transient: bool,
    /// Not a failure: a table changed shape at the source, and the run
    /// must be planned again with the shape it grew to before the source
    /// reads on (from the committed positions, so the changes of the new
    /// shape are read with the new plan).
    pub schema_change: Option<Arc<SchemaChange>>,
}

impl SourceError {
    /// A source error that retrying cannot cure.
    pub fn new(message: impl Into<String>) -> Self {
        SourceError {
            message: message.into(),
            transient: false,
            schema_change: None,
        }
    }

    /// A source error that may pass: the server or the network is away.
    pub fn transient(message: impl Into<String>) -> Self {
        SourceError {
            message: message.into(),
            transient: true,
            schema_change: None,
        }
    }

    /// The source must be planned again: `change` grew a table's shape.
    pub fn schema_changed(change: SchemaChange) -> Self {
        SourceError {
            message: format!(
                "table {} changed at the source: {}",
                change.table.join("."),
                change.description
            ),
            transient: false,
            schema_change: Some(Arc::new(change)),
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
    /// The batch ends inside a transaction larger than the batch size: it
    /// holds the transaction's rows so far (after any whole transactions
    /// before it), and more follow. `end` is then a position inside that
    /// transaction (every route not holding the transaction is before it),
    /// never one to commit; the batch that closes the transaction ends at
    /// its end. Only a source that can tell a transaction's rows before its
    /// end sends these (Postgres).
    pub open_transaction: bool,
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
    /// A preview of at most this many changes per table
    /// ([`RunOptions::peek`](crate::RunOptions::peek)): read without
    /// creating, consuming or acknowledging anything. A source that has
    /// something to create or move (a Postgres slot) reads another way;
    /// the others read as always (a file; a Kafka topic, read without a
    /// group and committing nothing to the broker).
    pub peek: Option<u64>,
    pub policy: BatchPolicy,
    /// Set when the run is stopping: the source stops reading.
    pub stop: Arc<AtomicBool>,
    /// Where the source reports lag, skipped messages, snapshot progress.
    pub metrics: crate::metrics::Metrics,
}

/// Acknowledges a position every route has committed
/// ([`ChangeSource::acknowledger`]); must be cheap and never block.
pub type Acknowledger = Arc<dyn Fn(&Position) + Send + Sync>;

/// A running source.
#[async_trait]
pub trait ChangeSource: Send {
    /// The next batch; `None` once the source is caught up (with
    /// `exit_when_caught_up`) or stopped.
    async fn next_batch(&mut self) -> Result<Option<SourceBatch>, SourceError>;

    /// Every route has committed up to `position`: the source may release
    /// what lies before it (e.g. a replication slot's WAL).
    async fn acknowledge(&mut self, position: &Position) -> Result<(), SourceError>;

    /// A handle that acknowledges from another task, without waiting for
    /// the next batch: the runner calls it each time every route has
    /// committed further, so a source that has gone idle still learns of
    /// its last batch's commit (and can release what it holds, or follow
    /// its server). `None`: acknowledgements come through
    /// [`Self::acknowledge`] only.
    fn acknowledger(&self) -> Option<Acknowledger> {
        None
    }

    /// The run is over: the source makes sure the last acknowledgement has
    /// reached its server, then releases its connections.
    async fn close(&mut self) -> Result<(), SourceError> {
        Ok(())
    }
}

/// A source kind, whole: what the planner checks its sources against (its
/// [`SourceProvider`]), the kind of position it resumes from, and how it
/// opens. A new kind is a new folder implementing this, listed in
/// [`kinds`]; nothing else in the engine names it.
pub trait SourceKind: Send + Sync {
    /// The kind's planning side.
    fn provider(&self) -> Arc<dyn SourceProvider>;
    /// The positions its changes carry (and its sinks store).
    fn position_kind(&self) -> &'static dyn PositionKind;
    /// Starts reading a planned source of this kind.
    fn open(&self, args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError>;
}

/// Every source kind this engine runs.
pub fn kinds() -> &'static [Arc<dyn SourceKind>] {
    static KINDS: OnceLock<Vec<Arc<dyn SourceKind>>> = OnceLock::new();
    KINDS.get_or_init(|| {
        vec![
            Arc::new(file::FileKind::new()),
            Arc::new(postgres::PostgresKind::new()),
            Arc::new(kafka::KafkaKind::new()),
        ]
    })
}

/// The source kind named `name`.
pub fn kind(name: &str) -> Option<&'static Arc<dyn SourceKind>> {
    kinds().iter().find(|k| k.provider().def().name == name)
}

/// Opens a source of a planned kind.
pub fn open(args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError> {
    let name = args.plan.spec.kind.name.as_str();
    match kind(name) {
        Some(k) => k.open(args),
        None => Err(SourceError::new(format!(
            "source kind {name} cannot run in this build"
        ))),
    }
}

/// The position kind of a source kind.
pub fn position_kind(kind_name: &str) -> Option<&'static dyn PositionKind> {
    kind(kind_name).map(|k| k.position_kind())
}

/// Registers every source kind this engine runs.
pub fn register(registry: &mut Registry) {
    for k in kinds() {
        registry.register_source(k.provider());
    }
}

/// The text a panic carried (a source thread that panicked reports it as
/// its error, never as the end of its input).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}
