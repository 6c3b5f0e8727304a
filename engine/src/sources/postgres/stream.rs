//! The replication stream: a task that prepares the server, starts
//! `START_REPLICATION` at the resume LSN, decodes pgoutput into per-table
//! Arrow builders, and hands whole transactions over as change batches.
//! Acknowledgements travel back through an atomic the task applies to the
//! client, which sends them in its standby status updates.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use tokio::sync::mpsc;
use urutau_planner::evolution::{
    SchemaChange, SchemaChanges, SentColumn, ShapeError, TypeMove, covers, describe_difference,
    grow, type_move,
};
use urutau_planner::plan::BeforeImages;
use urutau_planner::registry::SourceTableSchema;
use urutau_planner::types::CanonicalType;

use super::catalog::{self, PgTable};
use super::errors;
use super::pgoutput::{self, Cell, Message, Relation, Tuple};
use super::pgtypes::ColumnBuilder;
use super::position::LsnPosition;
use super::snapshot::{
    self, Chunk, ChunkReaders, ReaderSettings, ResumeProgress, SnapshotTarget, Snapshotter, Window,
};
use crate::batching::BatchPolicy;
use crate::change_batch::{ContextBuilder, RowKind};
use crate::position::Position;
use crate::sources::{ChangeSource, OpenArgs, SourceBatch, SourceError, TableChanges};

mod peek;
mod silence;
pub use peek::open as open_peek;

/// The prefix of the logical message that marks "caught up".
const CAUGHT_UP_PREFIX: &str = "urutau.caught_up";
/// How often the replication client may tell the server what the sinks
/// committed. The client sends an acknowledgement at most this often, and
/// a run that exits when caught up waits for its last one. At 1 s every
/// such exit waited up to a second, a fifth of a 5M-row snapshot's run.
/// A status message is a few dozen bytes; the server saves the slot to
/// disk only when its restart point moves, not per message.
const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// Rows per snapshot chunk unless `snapshot_chunk_rows` says otherwise.
pub const DEFAULT_CHUNK_ROWS: usize = 5_000;
/// Rows per batch (commit) while snapshot rows are in it, unless
/// `snapshot_batch_rows` says otherwise: copied rows come in bulk, and a
/// commit per 10,000 of them (the stream's default) costs more than their
/// writing.
pub const DEFAULT_SNAPSHOT_BATCH_ROWS: usize = 100_000;
/// Tables copied at once unless `snapshot_parallelism` says otherwise: the
/// machine's cores.
pub fn default_snapshot_parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
/// The canonical type of a built-in base type, known without asking the
/// catalog (`None`: ask it).
fn builtin_type(oid: u32, typmod: i32) -> Option<CanonicalType> {
    super::pgtypes::builtin_base(oid, typmod)
}

/// Microseconds from 1970-01-01 to 2000-01-01 (Postgres' epoch).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A routed table, as the stream needs it.
#[derive(Clone)]
struct TableCfg {
    pg: PgTable,
    plan_table: Vec<String>,
    schema: SourceTableSchema,
    scan_schema: SchemaRef,
    before_images: BeforeImages,
    /// What a change of the table's shape does.
    schema_changes: SchemaChanges,
}

/// Everything the task needs, owned.
struct StreamCfg {
    source_name: String,
    metrics: crate::metrics::Metrics,
    uri: String,
    slot: String,
    publication: String,
    keep_replica_identity: bool,
    fail_on_truncate: bool,
    tables: Vec<TableCfg>,
    start: Option<u64>,
    /// Copy the tables first (`snapshot = 'initial'`).
    snapshot: bool,
    snapshot_chunk_rows: usize,
    /// Tables copied at once (one reader session each).
    snapshot_parallelism: usize,
    /// Rows a batch holding snapshot rows may grow to (never below the
    /// pipeline's `max_batch_rows`).
    snapshot_batch_rows: usize,
    resume_snapshots: ResumeProgress,
    exit_when_caught_up: bool,
    policy: BatchPolicy,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
}

/// The running source.
pub struct PgSource {
    rx: mpsc::Receiver<Result<SourceBatch, SourceError>>,
    acked: Arc<AtomicU64>,
    /// Asks the task to send the last acknowledgement and disconnect; the
    /// second half says it has.
    close: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::sync::oneshot::Receiver<()>,
    )>,
}

impl StreamCfg {
    /// The task's settings from the source's plan and options.
    fn from_args(args: &OpenArgs<'_>) -> Result<StreamCfg, SourceError> {
        let opts = &args.plan.spec.options;
        let slot = opts.get("slot").unwrap_or_default().to_string();
        let start = match &args.start {
            None => None,
            Some(p) => Some(
                p.downcast_ref::<LsnPosition>()
                    .ok_or_else(|| SourceError::new(format!("{p} is not an LSN position")))?
                    .0,
            ),
        };
        let tables = args
            .plan
            .tables
            .iter()
            .map(|t| {
                Ok(TableCfg {
                    pg: PgTable::from_parts(&t.table).map_err(SourceError::new)?,
                    plan_table: t.table.clone(),
                    schema: t.schema.clone(),
                    scan_schema: Arc::clone(&t.scan_schema),
                    before_images: t.before_images.clone(),
                    schema_changes: t.schema_changes,
                })
            })
            .collect::<Result<Vec<_>, SourceError>>()?;
        Ok(StreamCfg {
            source_name: args.plan.spec.name.name.clone(),
            metrics: args.metrics.clone(),
            uri: super::tls::effective_uri(opts.get("uri").unwrap_or_default(), opts)?,
            publication: opts
                .get("publication")
                .map(str::to_string)
                .unwrap_or_else(|| format!("{slot}_pub")),
            slot,
            keep_replica_identity: opts.get("replica_identity") == Some("keep"),
            fail_on_truncate: opts.get("on_truncate") == Some("fail"),
            tables,
            start,
            snapshot: opts.get("snapshot") != Some("none"),
            snapshot_chunk_rows: opts
                .get("snapshot_chunk_rows")
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_CHUNK_ROWS),
            snapshot_parallelism: opts
                .get("snapshot_parallelism")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(default_snapshot_parallelism),
            snapshot_batch_rows: opts
                .get("snapshot_batch_rows")
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_SNAPSHOT_BATCH_ROWS)
                .max(args.policy.max_rows),
            resume_snapshots: args.snapshots.clone(),
            exit_when_caught_up: args.exit_when_caught_up,
            policy: args.policy,
            stop: Arc::clone(&args.stop),
            acked: Arc::new(AtomicU64::new(0)),
        })
    }
}

impl StreamCfg {
    /// The routed tables for which `wanted` holds, as the snapshot reads
    /// them, each with its committed progress.
    fn snapshot_targets(&self, wanted: impl Fn(&TableCfg) -> bool) -> Vec<SnapshotTarget<'_>> {
        self.tables
            .iter()
            .enumerate()
            .filter(|(_, t)| wanted(t))
            .map(|(i, t)| SnapshotTarget {
                table: i,
                pg: &t.pg,
                plan_table: &t.plan_table,
                columns: t
                    .schema
                    .columns
                    .iter()
                    .map(|c| c.name.name.clone())
                    .collect(),
                dropped: t.schema.dropped.clone(),
                resume: self.resume_snapshots.get(&t.plan_table).cloned(),
            })
            .collect()
    }
}

/// Starts the stream task.
pub fn open(args: OpenArgs<'_>) -> Result<PgSource, SourceError> {
    let cfg = StreamCfg::from_args(&args)?;
    let acked = Arc::clone(&cfg.acked);
    let (tx, rx) = mpsc::channel(2);
    let (close_tx, close_rx) = tokio::sync::oneshot::channel();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    let acked_final = Arc::clone(&acked);
    tokio::spawn(async move {
        let slot = cfg.slot.clone();
        match stream(cfg, &tx).await {
            Err(e) => {
                let _ = tx.send(Err(e)).await;
            }
            Ok(client) => {
                // The end of the batches; the session stays for the final
                // acknowledgement.
                drop(tx);
                finish(client, acked_final, close_rx, slot).await;
            }
        }
        let _ = closed_tx.send(());
    });
    Ok(PgSource {
        rx,
        acked,
        close: Some((close_tx, closed_rx)),
    })
}

#[async_trait]
impl ChangeSource for PgSource {
    async fn next_batch(&mut self) -> Result<Option<SourceBatch>, SourceError> {
        match self.rx.recv().await {
            Some(Ok(b)) => Ok(Some(b)),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    async fn acknowledge(&mut self, position: &Position) -> Result<(), SourceError> {
        if let Some(l) = position.downcast_ref::<LsnPosition>() {
            self.acked.fetch_max(l.0, Ordering::SeqCst);
        }
        Ok(())
    }

    fn acknowledger(&self) -> Option<crate::sources::Acknowledger> {
        let acked = Arc::clone(&self.acked);
        Some(Arc::new(move |position: &Position| {
            if let Some(l) = position.downcast_ref::<LsnPosition>() {
                acked.fetch_max(l.0, Ordering::SeqCst);
            }
        }))
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        if let Some((close, closed)) = self.close.take() {
            let _ = close.send(());
            // Batches still queued are not wanted any more: unblock the task.
            self.rx.close();
            while self.rx.try_recv().is_ok() {}
            let _ = tokio::time::timeout(Duration::from_secs(15), closed).await;
        }
        Ok(())
    }
}

/// The replication connection's settings from the source's URI.
fn replication_config(
    uri: &str,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, SourceError> {
    let url = url::Url::parse(uri)
        .map_err(|e| SourceError::new(format!("the source uri is not a postgres:// URL: {e}")))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(SourceError::new(format!(
            "the source uri has scheme `{}`; expected postgres://",
            url.scheme()
        )));
    }
    let user = if url.username().is_empty() {
        "postgres".to_string()
    } else {
        decode(url.username())
    };
    let password = url.password().map(decode).unwrap_or_default();
    let database = url.path().trim_start_matches('/');
    let database = if database.is_empty() {
        user.clone()
    } else {
        decode(database)
    };
    let host = url.host_str().unwrap_or("localhost");
    let tls = super::tls::TlsSettings::of(&url)?;
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(url.port().unwrap_or(5432))
            .with_tls(tls.replication(host))
            // Text output the value parsers expect, whatever the server's defaults.
            .with_options(
                "-c TimeZone=UTC -c DateStyle=ISO -c bytea_output=hex -c extra_float_digits=1",
            )
            .with_application_name("urutau"),
    )
}

fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// One routed table's builders.
struct TableBuilder {
    columns: Vec<ColumnBuilder>,
    context: ContextBuilder,
    cfg: TableCfg,
    source_table: String,
}

impl TableBuilder {
    fn rows(&self) -> usize {
        self.context.len()
    }

    fn finish(&mut self) -> Result<RecordBatch, SourceError> {
        let mut arrays: Vec<ArrayRef> = self.columns.iter_mut().map(|c| c.finish()).collect();
        let ingest = chrono::Utc::now().timestamp_micros();
        arrays.extend(self.context.finish(ingest, &self.source_table));
        RecordBatch::try_new(Arc::clone(&self.cfg.scan_schema), arrays)
            .map_err(|e| SourceError::new(format!("internal: {} batch: {e}", self.source_table)))
    }
}

/// How a relation's columns line up with a routed table's.
struct Binding {
    table: usize,
    /// For each schema column, its position in the relation (`None`: the
    /// relation does not have it, and it reads as NULL; only nullable
    /// columns, see [`Assembler::follow_shape`]).
    positions: Vec<Option<usize>>,
    /// Positions of the columns whose change needs a before image.
    key_positions: Option<Vec<usize>>,
    always_before: bool,
}

/// Lines `rel` up with the planned columns of `cfg`, by name: a change is
/// read with the shape it was written with.
fn bind(rel: &Relation, table: usize, cfg: &TableCfg) -> Binding {
    let position = |name: &str| rel.columns.iter().position(|c| c.name == name);
    let positions = cfg
        .schema
        .columns
        .iter()
        .map(|c| position(&c.name.name))
        .collect();
    let (key_positions, always_before) = match &cfg.before_images {
        BeforeImages::Never => (None, false),
        BeforeImages::Always => (None, true),
        BeforeImages::OnKeyChange(cols) => (
            Some(cols.iter().filter_map(|c| position(c)).collect()),
            false,
        ),
    };
    Binding {
        table,
        positions,
        key_positions,
        always_before,
    }
}

/// The stream's state between events.
struct Assembler {
    builders: Vec<TableBuilder>,
    relations: HashMap<u32, Option<Binding>>,
    in_tx: bool,
    commit_ts: Option<i64>,
    /// The open transaction's commit LSN (its Begin's final LSN).
    tx_final: u64,
    /// The open transaction was handed over in parts (it outgrew the batch
    /// size): its rows are labelled [`Self::split_label`].
    tx_split: bool,
    /// A transaction handed over in parts has committed: the batch that
    /// closes it is due.
    split_closed: bool,
    tx_rows: usize,
    batch_rows: usize,
    /// Snapshot rows among `batch_rows`.
    batch_snapshot_rows: usize,
    batch_opened: Option<Instant>,
    /// The end LSN of the newest closed transaction.
    closed_end: Option<u64>,
    /// The end of the last batch handed over.
    emitted_end: Option<u64>,
    last_emit: Instant,
    truncates_ignored: u64,
    fail_on_truncate: bool,
    source_name: String,
    metrics: crate::metrics::Metrics,
    /// Closed transactions not yet acknowledged: (end LSN, commit time).
    unacked: std::collections::VecDeque<(u64, i64)>,
    /// The newest WAL position the server reported.
    received: u64,
    /// The snapshot windows open (low watermark seen, high not yet), with
    /// the keys the stream changed inside each.
    windows: Vec<Window>,
    /// Each routed table's shape as this session's last Relation message
    /// sent it (by builder index).
    shapes: HashMap<usize, Vec<SentColumn>>,
    /// Canonical types of (type OID, type modifier) pairs Relation
    /// messages named ([`Assembler::prepare_relation`]).
    types: HashMap<(u32, i32), CanonicalType>,
    /// Planned columns of a routed table (by builder index) that its last
    /// Relation message lacked and the catalog no longer has: dropped.
    gone: HashMap<usize, Vec<String>>,
    /// A preview reads the slot's backlog: a table that changed shape in
    /// it is shown up to the change (a preview plans nothing again).
    peeking: bool,
    /// Each snapshotted table's progress as of the rows built so far.
    snapshot_progress: Vec<(Vec<String>, urutau_planner::progress::SnapshotProgress)>,
    /// The progress moved since the last batch.
    snapshot_moved: bool,
}

impl Assembler {
    /// The state at the start of a stream that begins at `start`.
    fn new(cfg: &StreamCfg, tables: Vec<TableCfg>, start: u64) -> Result<Assembler, SourceError> {
        let builders = tables
            .into_iter()
            .map(|t| {
                let columns = t
                    .schema
                    .columns
                    .iter()
                    .map(|c| {
                        ColumnBuilder::new(&c.ty).map_err(|e| {
                            SourceError::new(format!("{}: column {}: {e}", t.pg, c.name.name))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(TableBuilder {
                    columns,
                    context: ContextBuilder::new(),
                    source_table: t.plan_table.join("."),
                    cfg: t,
                })
            })
            .collect::<Result<Vec<_>, SourceError>>()?;
        Ok(Assembler {
            builders,
            relations: HashMap::new(),
            in_tx: false,
            commit_ts: None,
            tx_final: 0,
            tx_split: false,
            split_closed: false,
            tx_rows: 0,
            batch_rows: 0,
            batch_snapshot_rows: 0,
            batch_opened: None,
            closed_end: None,
            emitted_end: cfg.start,
            last_emit: Instant::now(),
            truncates_ignored: 0,
            fail_on_truncate: cfg.fail_on_truncate,
            source_name: cfg.source_name.clone(),
            metrics: cfg.metrics.clone(),
            unacked: Default::default(),
            received: start,
            windows: Vec::new(),
            shapes: HashMap::new(),
            types: HashMap::new(),
            gone: HashMap::new(),
            peeking: false,
            snapshot_progress: Vec::new(),
            snapshot_moved: false,
        })
    }

    /// The routed table `rel` describes (its builder index).
    fn routed(&self, rel: &Relation) -> Option<usize> {
        self.builders
            .iter()
            .position(|b| b.cfg.pg.schema == rel.namespace && b.cfg.pg.name == rel.name)
    }

    /// What [`Self::relation`] needs to know of a routed table's Relation
    /// message `rel` besides the message: the canonical types of its
    /// columns not known yet (built-in types by OID, others from the
    /// catalog), and which planned columns it lacks because they were
    /// dropped (the catalog no longer has them) rather than added after
    /// the point the stream reads (it has them). One short session, only
    /// when there is something to ask.
    async fn prepare_relation(&mut self, uri: &str, rel: &Relation) -> Result<(), SourceError> {
        let Some(i) = self.routed(rel) else {
            return Ok(());
        };
        let cfg = &self.builders[i].cfg;
        let missing: Vec<String> = cfg
            .schema
            .columns
            .iter()
            .map(|c| c.name.name.clone())
            .filter(|c| !cfg.schema.dropped.contains(c))
            .filter(|c| !rel.columns.iter().any(|r| &r.name == c))
            .collect();
        let mut unknown = Vec::new();
        for c in &rel.columns {
            let t = (c.type_oid, c.type_modifier);
            if self.types.contains_key(&t) || unknown.contains(&t) {
                continue;
            }
            match builtin_type(c.type_oid, c.type_modifier) {
                Some(ty) => {
                    self.types.insert(t, ty);
                }
                None => unknown.push(t),
            }
        }
        if unknown.is_empty() && missing.is_empty() {
            self.gone.remove(&i);
            return Ok(());
        }
        let pg = cfg.pg.clone();
        let mut conn = catalog::connect(uri).await?;
        let found = async {
            let types = match unknown.is_empty() {
                true => HashMap::new(),
                false => catalog::relation_types(&mut conn, &unknown).await?,
            };
            let present = match missing.is_empty() {
                true => Vec::new(),
                false => catalog::existing_columns(&mut conn, &pg).await?,
            };
            Ok::<_, SourceError>((types, present))
        }
        .await;
        catalog::close(conn).await;
        let (types, present) = found?;
        self.types.extend(types);
        self.gone.insert(
            i,
            missing
                .into_iter()
                .filter(|c| !present.contains(c))
                .collect(),
        );
        Ok(())
    }

    fn relation(&mut self, rel: Relation) -> Result<(), SourceError> {
        let binding = match self.routed(&rel) {
            Some(i) if self.peeking && self.shapes.get(&i).is_some_and(|s| s.is_empty()) => None,
            Some(i) => {
                let sent = rel
                    .columns
                    .iter()
                    .map(|c| {
                        let ty = self
                            .types
                            .get(&(c.type_oid, c.type_modifier))
                            .cloned()
                            .or_else(|| builtin_type(c.type_oid, c.type_modifier))
                            .ok_or_else(|| {
                                SourceError::new(format!(
                                    "internal: the type of column {} of {} was not learned",
                                    c.name, self.builders[i].cfg.pg
                                ))
                            })?;
                        Ok(SentColumn {
                            name: c.name.clone(),
                            ty,
                        })
                    })
                    .collect::<Result<Vec<_>, SourceError>>()?;
                match self.follow_shape(i, sent) {
                    Err(e) if self.peeking && e.schema_change.is_some() => {
                        tracing::warn!(table = %self.builders[i].cfg.pg, "the preview of this table stops where it changed shape ({}): a run plans it again there", e.message);
                        // Marks the table as stopped: no later change of
                        // it is shown.
                        self.shapes.insert(i, Vec::new());
                        None
                    }
                    result => {
                        result?;
                        Some(bind(&rel, i, &self.builders[i].cfg))
                    }
                }
            }
            None => None,
        };
        self.relations.insert(rel.id, binding);
        Ok(())
    }

    /// Checks the shape `sent` that routed table `i` is now sent with:
    /// against the shape this session saw before (a type may only widen,
    /// see [`urutau_planner::evolution`]) and against the planned one. When
    /// the plan cannot read it (a column added or widened, a `NOT NULL`
    /// column dropped), the run must be planned again with the grown shape
    /// ([`SourceError::schema_changed`]); with `schema_changes = 'fail'`,
    /// any difference stops the run. Nothing of the transaction that sent
    /// it has been handed over (it is read again after the new plan).
    fn follow_shape(&mut self, i: usize, sent: Vec<SentColumn>) -> Result<(), SourceError> {
        let cfg = &self.builders[i].cfg;
        let refused = |e: ShapeError| SourceError::new(format!("{}: {e}", cfg.pg));
        if let Some(before) = self.shapes.get(&i) {
            for c in &sent {
                if let Some(b) = before.iter().find(|b| b.name == c.name)
                    && type_move(&b.ty, &c.ty) == TypeMove::Refused
                {
                    return Err(refused(ShapeError::RefusedType {
                        column: c.name.clone(),
                        from: b.ty.clone(),
                        to: c.ty.clone(),
                    }));
                }
            }
        }
        let planned = &cfg.schema;
        // Dropped (or renamed) at the source: columns the stream sent
        // before and not now, and planned columns it does not send that
        // the catalog no longer has. A planned column it does not send and
        // the catalog has was added later than the point the stream reads
        // (it reads as NULL meanwhile).
        let mut dropped: Vec<String> = self.gone.remove(&i).unwrap_or_default();
        if let Some(before) = self.shapes.get(&i) {
            for b in before {
                if !sent.iter().any(|c| c.name == b.name)
                    && !planned.dropped.contains(&b.name)
                    && !dropped.contains(&b.name)
                {
                    dropped.push(b.name.clone());
                }
            }
        }
        if cfg.schema_changes == SchemaChanges::Fail {
            let what = describe_difference(planned, &sent, &dropped);
            if !what.is_empty() {
                return Err(SourceError::new(format!(
                    "{} changed at the source: {what}; its routes set schema_changes = 'fail' (set it to 'evolve' to let the targets follow)",
                    cfg.pg
                )));
            }
        } else if !covers(planned, &sent) || !dropped.is_empty() {
            let description = describe_difference(planned, &sent, &dropped);
            let schema = grow(planned, &sent, &dropped).map_err(refused)?;
            let added = sent
                .iter()
                .filter(|c| !planned.columns.iter().any(|p| p.name.name == c.name))
                .map(|c| c.name.clone())
                .collect();
            return Err(SourceError::schema_changed(SchemaChange {
                source: self.source_name.clone(),
                table: cfg.plan_table.clone(),
                schema,
                description,
                added,
            }));
        }
        self.shapes.insert(i, sent);
        Ok(())
    }

    fn binding(&self, rel: u32) -> Result<Option<&Binding>, SourceError> {
        match self.relations.get(&rel) {
            Some(b) => Ok(b.as_ref()),
            None => Err(SourceError::new(format!(
                "a change of relation {rel} arrived before its Relation message"
            ))),
        }
    }

    fn append(
        &mut self,
        rel: u32,
        tuple: &Tuple,
        old: Option<&Tuple>,
        kind: RowKind,
    ) -> Result<(), SourceError> {
        // Disjoint fields: the binding is borrowed, not cloned, per row.
        let binding = match self.relations.get(&rel) {
            Some(Some(b)) => b,
            Some(None) => return Ok(()),
            None => {
                return Err(SourceError::new(format!(
                    "a change of relation {rel} arrived before its Relation message"
                )));
            }
        };
        let b = &mut self.builders[binding.table];
        for (i, pos) in binding.positions.iter().enumerate() {
            let Some(pos) = pos else {
                // A column this change's shape lacks (dropped at the source).
                b.columns[i].append(None).map_err(|e| {
                    SourceError::new(format!(
                        "{}: column {}: {e}",
                        b.cfg.pg, b.cfg.schema.columns[i].name.name
                    ))
                })?;
                continue;
            };
            let cell = tuple.0.get(*pos);
            let value: Option<&[u8]> = match cell {
                None | Some(Cell::Null) => None,
                Some(Cell::Text(t)) => Some(t),
                Some(Cell::Unchanged) => match old.and_then(|o| o.0.get(*pos)) {
                    Some(Cell::Text(t)) => Some(t),
                    Some(Cell::Null) => None,
                    _ => {
                        return Err(SourceError::new(format!(
                            "{}: column {} is an unchanged TOASTed value and the old row does not carry it: the table needs REPLICA IDENTITY FULL (replica_identity = 'full')",
                            b.cfg.pg, b.cfg.schema.columns[i].name.name
                        )));
                    }
                },
                Some(Cell::Binary(_)) => {
                    return Err(SourceError::new(format!(
                        "{}: column {} arrived in binary format, which this source does not request",
                        b.cfg.pg, b.cfg.schema.columns[i].name.name
                    )));
                }
            };
            b.columns[i].append(value).map_err(|e| {
                SourceError::new(format!(
                    "{}: column {}: {e}",
                    b.cfg.pg, b.cfg.schema.columns[i].name.name
                ))
            })?;
        }
        b.context.append(kind, self.commit_ts, false);
        self.tx_rows += 1;
        if self.batch_opened.is_none() {
            self.batch_opened = Some(Instant::now());
        }
        Ok(())
    }

    /// Whether an update's old row must be emitted as a before image.
    fn wants_before(
        &self,
        rel: u32,
        old: Option<&Tuple>,
        new: &Tuple,
    ) -> Result<bool, SourceError> {
        let (Some(binding), Some(old)) = (self.binding(rel)?, old) else {
            return Ok(false);
        };
        if binding.always_before {
            return Ok(true);
        }
        Ok(match &binding.key_positions {
            None => false,
            Some(keys) => keys.iter().any(|p| match (old.0.get(*p), new.0.get(*p)) {
                (_, Some(Cell::Unchanged)) => false,
                (a, b) => a != b,
            }),
        })
    }

    /// Notes the keys a live change touches in each open window of its
    /// table.
    fn watch(&mut self, rel: u32, tuples: [Option<&Tuple>; 2]) {
        if self.windows.is_empty() {
            return;
        }
        let Some(Some(binding)) = self.relations.get(&rel) else {
            return;
        };
        let [new, old] = tuples;
        for w in self.windows.iter_mut().filter(|w| w.table == binding.table) {
            for t in [new, old].into_iter().flatten() {
                let mut complete = true;
                let key = snapshot::encode_key(w.key.iter().map(|k| {
                    match binding.positions[*k].and_then(|p| t.0.get(p)) {
                        Some(Cell::Text(v)) => Some(&v[..]),
                        Some(Cell::Null) => None,
                        _ => {
                            complete = false;
                            None
                        }
                    }
                }));
                if complete {
                    w.touched.insert(key);
                }
            }
        }
    }

    /// The place of chunk `id`'s window: it must be open (its low
    /// watermark came first).
    fn window_of(&self, id: u64) -> Result<usize, SourceError> {
        self.windows.iter().position(|w| w.id == id).ok_or_else(|| {
            SourceError::new(format!(
                "internal: the high watermark of snapshot chunk {id} arrived without its low watermark"
            ))
        })
    }

    /// Emits `chunk` at `lsn` (its high watermark passed, and every chunk
    /// before it in its table's key order is emitted): the rows no live
    /// change touched since its low watermark; returns how many. Its
    /// window closes.
    fn close_window(&mut self, chunk: &Chunk, lsn: u64) -> Result<usize, SourceError> {
        let window = self.windows.remove(self.window_of(chunk.id)?);
        self.snapshot_rows(window.table, chunk, &window.touched, &window.key, lsn)
    }

    /// Appends the rows of `chunk` (of builder `table`) whose key (by the
    /// schema indexes `key`) is not in `touched` as snapshot rows of one
    /// transaction at `lsn` (or after the newest closed one); returns how
    /// many.
    fn snapshot_rows(
        &mut self,
        table: usize,
        chunk: &Chunk,
        touched: &std::collections::HashSet<Vec<u8>>,
        key: &[usize],
        lsn: u64,
    ) -> Result<usize, SourceError> {
        let b = &mut self.builders[table];
        let mut emitted = 0usize;
        for row in 0..chunk.rows.len() {
            if !touched.is_empty() && touched.contains(&chunk.key(row, key)) {
                continue;
            }
            for (i, value) in chunk.rows.row(row).enumerate() {
                b.columns[i].append(value).map_err(|e| {
                    SourceError::new(format!(
                        "{} (snapshot): column {}: {e}",
                        b.cfg.pg, b.cfg.schema.columns[i].name.name
                    ))
                })?;
            }
            b.context.append(RowKind::Insert, None, true);
            emitted += 1;
        }
        let end = self.closed_end.map_or(lsn, |c| c.max(lsn));
        b.context.close_transaction(&LsnPosition(end).to_string());
        self.closed_end = Some(end);
        self.received = self.received.max(end);
        self.batch_rows += emitted;
        self.batch_snapshot_rows += emitted;
        if emitted > 0 && self.batch_opened.is_none() {
            self.batch_opened = Some(Instant::now());
        }
        Ok(emitted)
    }

    fn change(&mut self, message: Message) -> Result<(), SourceError> {
        match &message {
            Message::Insert { relation, new } => self.watch(*relation, [Some(new), None]),
            Message::Update {
                relation, old, new, ..
            } => self.watch(*relation, [Some(new), old.as_ref()]),
            Message::Delete { relation, old, .. } => self.watch(*relation, [Some(old), None]),
            _ => {}
        }
        match message {
            Message::Relation(rel) => self.relation(rel)?,
            Message::Insert { relation, new } => {
                self.append(relation, &new, None, RowKind::Insert)?
            }
            Message::Update {
                relation, old, new, ..
            } => {
                if self.wants_before(relation, old.as_ref(), &new)? {
                    let old_row = old.as_ref().expect("checked");
                    self.append(relation, old_row, None, RowKind::UpdateBefore)?;
                }
                self.append(relation, &new, old.as_ref(), RowKind::Update)?;
            }
            Message::Delete { relation, old, .. } => {
                self.append(relation, &old, None, RowKind::Delete)?
            }
            Message::Truncate { relations, .. } => {
                let routed: Vec<String> = relations
                    .iter()
                    .filter_map(|r| self.relations.get(r).and_then(|b| b.as_ref()))
                    .map(|b| self.builders[b.table].cfg.pg.to_string())
                    .collect();
                if !routed.is_empty() {
                    if self.fail_on_truncate {
                        return Err(SourceError::new(format!(
                            "TRUNCATE of {} (on_truncate = 'fail')",
                            routed.join(", ")
                        )));
                    }
                    self.truncates_ignored += 1;
                    self.metrics.truncate_ignored(&self.source_name);
                    tracing::warn!(tables = %routed.join(", "), ignored = self.truncates_ignored, "TRUNCATE ignored (on_truncate = 'ignore'): the sink keeps the rows");
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A transaction whose commit LSN is `final_lsn` begins.
    fn begin(&mut self, final_lsn: u64, commit_ts: i64) {
        self.in_tx = true;
        self.tx_final = final_lsn;
        self.tx_split = false;
        self.commit_ts = Some(commit_ts);
    }

    /// The position inside the open transaction that its rows carry when
    /// it is handed over in parts, since its end is not known before its
    /// last row: its commit LSN + 1. That lies after the end of every
    /// transaction before it and at or before its own end, so a route
    /// holding this transaction holds that position and one that does not
    /// is before it (what resuming compares rows by).
    fn split_label(&self) -> Position {
        Position::new(LsnPosition(self.tx_final + 1))
    }

    /// Whether the open transaction should be handed over in part now: it
    /// (with what is waiting before it) has reached the batch size. Open
    /// snapshot windows do not hold it back: the transaction's keys are in
    /// their touched sets already (its rows are watched as they arrive),
    /// and a window's chunk rows are appended only at its high watermark,
    /// which the stream reaches after this transaction's commit.
    fn part_due(&self, max_rows: usize) -> bool {
        self.in_tx && self.tx_rows + self.batch_rows >= max_rows.max(1)
    }

    /// The rows the batch being built may grow to: `snapshot_rows` once
    /// it holds snapshot rows, else the pipeline's `max_rows`.
    fn batch_limit(&self, max_rows: usize, snapshot_rows: usize) -> usize {
        if self.batch_snapshot_rows > 0 {
            snapshot_rows
        } else {
            max_rows
        }
    }

    /// The rows built so far, the open transaction's included, as a batch
    /// whose transaction continues ([`SourceBatch::open_transaction`]).
    fn take_part(&mut self) -> Result<SourceBatch, SourceError> {
        let label = self.split_label();
        let text = label.to_string();
        for b in &mut self.builders {
            if b.context.open_rows() > 0 {
                b.context.close_transaction(&text);
            }
        }
        self.tx_split = true;
        let tables = self.finish_tables()?;
        self.batch_rows = 0;
        self.batch_snapshot_rows = 0;
        self.tx_rows = 0;
        self.batch_opened = None;
        self.last_emit = Instant::now();
        Ok(SourceBatch {
            tables,
            end: label,
            snapshot: self.snapshot_progress.clone(),
            open_transaction: true,
        })
    }

    /// Every table's rows built so far, as batches (tables without rows
    /// left out).
    fn finish_tables(&mut self) -> Result<Vec<TableChanges>, SourceError> {
        let mut tables = Vec::new();
        for b in &mut self.builders {
            if b.rows() > 0 {
                tables.push(TableChanges {
                    table: b.cfg.plan_table.clone(),
                    batch: b.finish()?,
                });
            }
        }
        Ok(tables)
    }

    fn commit(&mut self, end_lsn: u64) {
        let text = match self.tx_split {
            true => self.split_label().to_string(),
            false => LsnPosition(end_lsn).to_string(),
        };
        for b in &mut self.builders {
            if b.context.open_rows() > 0 {
                b.context.close_transaction(&text);
            }
        }
        self.batch_rows += self.tx_rows;
        // Its parts wait for this end: the next batch closes it now.
        self.split_closed |= self.tx_split;
        self.tx_rows = 0;
        self.in_tx = false;
        self.tx_split = false;
        self.closed_end = Some(end_lsn);
        self.received = self.received.max(end_lsn);
        if let Some(ts) = self.commit_ts {
            self.unacked.push_back((end_lsn, ts));
        }
    }

    /// True when everything received is committed by every route (`acked`
    /// is what they all hold): no transaction open, no row waiting for a
    /// batch, no snapshot chunk waiting for its high watermark. The stream
    /// sends a transaction whole at its commit and in commit order, so then
    /// no change of a routed table lies before the server's WAL end that is
    /// not committed, and the slot may be acknowledged up to it: the server
    /// can release other tables' WAL, and a fast shutdown, which waits for
    /// the client to confirm everything sent, completes.
    fn is_idle(&self, acked: u64) -> bool {
        !self.in_tx
            && self.tx_rows == 0
            && self.batch_rows == 0
            && !self.split_closed
            && self.windows.is_empty()
            && self.closed_end.is_none_or(|c| acked >= c)
    }

    /// Publishes the lag after an acknowledgement up to `acked`.
    fn report_lag(&mut self, acked: u64) {
        while self.unacked.front().is_some_and(|(l, _)| *l <= acked) {
            self.unacked.pop_front();
        }
        let seconds = match self.unacked.front() {
            Some((_, ts)) => (chrono::Utc::now().timestamp_micros() - ts).max(0) as f64 / 1e6,
            None => 0.0,
        };
        self.metrics.source_lag(
            &self.source_name,
            Some(self.received.saturating_sub(acked)),
            Some(seconds),
        );
    }

    /// The closed transactions as one batch (`None`: nothing new).
    fn take_batch(&mut self) -> Result<Option<SourceBatch>, SourceError> {
        let Some(end) = self.closed_end else {
            return Ok(None);
        };
        if self.batch_rows == 0 && self.emitted_end == Some(end) && !self.snapshot_moved {
            return Ok(None);
        }
        let tables = self.finish_tables()?;
        self.batch_rows = 0;
        self.batch_snapshot_rows = 0;
        self.batch_opened = None;
        self.snapshot_moved = false;
        self.split_closed = false;
        self.emitted_end = Some(end);
        self.last_emit = Instant::now();
        Ok(Some(SourceBatch {
            tables,
            end: Position::new(LsnPosition(end)),
            snapshot: self.snapshot_progress.clone(),
            open_transaction: false,
        }))
    }
}

async fn stream(
    cfg: StreamCfg,
    tx: &mpsc::Sender<Result<SourceBatch, SourceError>>,
) -> Result<ReplicationClient, SourceError> {
    let mut conn = catalog::connect(&cfg.uri).await?;
    let pg_tables: Vec<PgTable> = cfg.tables.iter().map(|t| t.pg.clone()).collect();
    let prepared = catalog::prepare(
        &mut conn,
        &pg_tables,
        &cfg.slot,
        &cfg.publication,
        cfg.keep_replica_identity,
    )
    .await?;
    let start = match cfg.start {
        Some(p) if prepared.slot_created => {
            return Err(SourceError::new(format!(
                "replication slot {} did not exist and was created now, at {}, but the sink holds position {}: the changes in between are gone; drop the slot and the tables to start over",
                cfg.slot,
                LsnPosition(prepared.slot_lsn),
                LsnPosition(p)
            )));
        }
        Some(p) => {
            if p < prepared.slot_lsn {
                // An idle stream acknowledges the server's WAL end, which
                // holds no routed change past what the sinks committed.
                tracing::info!(slot = %cfg.slot, committed = %LsnPosition(p), confirmed = %LsnPosition(prepared.slot_lsn),
                    "the slot is ahead of the sinks' oldest committed position (acknowledged over WAL without routed changes); the server streams from the slot's position");
            }
            p
        }
        None => prepared.slot_lsn,
    };
    let mark = if cfg.exit_when_caught_up {
        Some(catalog::caught_up_mark(&mut conn, CAUGHT_UP_PREFIX).await?)
    } else {
        None
    };
    catalog::close(conn).await;
    // The slot exists (created above when absent) before any snapshot read.
    let mut snapshotter = if cfg.snapshot {
        let targets = cfg.snapshot_targets(|_| true);
        Some(Snapshotter::open(&cfg.uri, targets, cfg.metrics.clone()).await?)
    } else {
        None
    };

    let rcfg = replication_config(&cfg.uri, &cfg.slot, &cfg.publication)?
        .with_start_lsn(Lsn(start))
        .with_status_interval(STATUS_INTERVAL);
    let mut client = match ReplicationClient::connect(rcfg).await {
        Ok(client) => client,
        Err(e) => {
            let doing = format!("starting replication from slot {}", cfg.slot);
            return Err(match &e {
                pgwire_replication::PgWireError::Tls(text) => {
                    super::tls::failed(&doing, &cfg.uri, text).await
                }
                _ => super::tls::with_hint(errors::replication(&doing, &e)),
            });
        }
    };
    tracing::info!(slot = %cfg.slot, start = %LsnPosition(start), "streaming");
    cfg.metrics.source_up(&cfg.source_name);

    let mut a = Assembler::new(&cfg, cfg.tables.clone(), start)?;
    a.snapshot_progress = snapshotter
        .as_ref()
        .map(|s| s.progress())
        .unwrap_or_default();
    let policy = cfg.policy;
    let mut acked_sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut caught_up = false;
    let mut silence = silence::SilenceWatch::new();
    // The chunk readers: they read ahead while earlier windows wait for
    // their high watermarks. Chunks read whose high watermark the stream
    // has not reached wait in `chunks` (bounded: beyond it, the readers
    // wait on the channel).
    let mut readers = snapshotter
        .as_ref()
        .filter(|s| !s.all_complete())
        .map(|s| spawn_readers(&cfg, s))
        .transpose()?;
    // Chunks whose window closed wait in `in_order` for the chunks before
    // them in key order (counted in the bound too).
    let held_chunks = cfg.snapshot_parallelism.max(1) * snapshot::READ_AHEAD_PER_READER;
    let mut chunks: HashMap<u64, Chunk> = HashMap::new();
    let mut in_order = snapshot::KeyOrder::default();
    loop {
        let event = tokio::select! {
            ev = client.recv() => Some(ev),
            chunk = next_chunk(&mut readers), if chunks.len() + in_order.len() < held_chunks => {
                match chunk {
                    Some(chunk) => {
                        let chunk = chunk?;
                        chunks.insert(chunk.id, chunk);
                    }
                    // Every table read: the readers have ended.
                    None => readers = None,
                }
                continue;
            }
            _ = tick.tick() => None,
        };
        let acked = cfg.acked.load(Ordering::SeqCst);
        if acked > acked_sent {
            client.update_applied_lsn(Lsn(acked));
            acked_sent = acked;
        }
        if event.is_none() {
            a.report_lag(acked_sent.max(start));
            silence.check(&cfg.uri, &cfg.slot).await?;
        } else {
            silence.heard();
        }
        if cfg.stop.load(Ordering::Relaxed) {
            break;
        }
        match event {
            None => {}
            Some(Err(e)) => {
                return Err(errors::replication(
                    &format!("replication from slot {}", cfg.slot),
                    &e,
                ));
            }
            // Not asked to stop (checked above): the server ended the
            // stream, as a shutting-down server does once the client has
            // confirmed everything sent.
            Some(Ok(None)) => {
                return Err(SourceError::transient(format!(
                    "replication from slot {}: the server ended the stream (shutting down or restarting?)",
                    cfg.slot
                )));
            }
            Some(Ok(Some(ev))) => match ev {
                ReplicationEvent::Begin {
                    final_lsn,
                    commit_time_micros,
                    ..
                } => a.begin(final_lsn.0, commit_time_micros + PG_EPOCH_MICROS),
                ReplicationEvent::XLogData { data, .. } => {
                    let m = pgoutput::decode(&data).map_err(|e| SourceError::new(e.to_string()))?;
                    if let Message::Relation(rel) = &m {
                        a.prepare_relation(&cfg.uri, rel).await?;
                    }
                    a.change(m)?;
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    a.commit(end_lsn.0);
                    if mark.is_some_and(|m| end_lsn.0 >= m) {
                        caught_up = true;
                    }
                }
                ReplicationEvent::Message {
                    prefix,
                    lsn,
                    content,
                    ..
                } if prefix == snapshot::WATERMARK_PREFIX => {
                    let content = String::from_utf8_lossy(&content);
                    if let Some(snap) = &mut snapshotter {
                        if let Some((id, i)) = snapshot::reader::parse_low(&snap.run, &content)
                            && let Some(t) = snap.tables.get(i)
                        {
                            // Changes decoded from here on are newer than
                            // the low watermark: the window watches them.
                            a.windows.push(Window {
                                id,
                                table: t.table,
                                key: t.watch_indexes(),
                                touched: Default::default(),
                            });
                        } else if let Some(id) = snapshot::reader::parse_high(&snap.run, &content) {
                            a.window_of(id)?;
                            let chunk = match chunks.remove(&id) {
                                Some(c) => c,
                                None => wait_for_chunk(&mut readers, &mut chunks, id).await?,
                            };
                            let table = chunk.snapshot;
                            in_order.proved(chunk);
                            // Emitted in key order: this chunk and the ones
                            // it held back, or none while one before it is
                            // still open (their windows keep watching).
                            while let Some(chunk) = in_order.next_ready(table) {
                                let emitted = a.close_window(&chunk, lsn.0)?;
                                snap.chunk_done(&chunk, emitted);
                                a.snapshot_progress = snap.progress();
                                a.snapshot_moved = true;
                            }
                        }
                    }
                }
                ReplicationEvent::Message { prefix, lsn, .. } => {
                    if prefix == CAUGHT_UP_PREFIX && mark.is_some_and(|m| lsn.0 >= m) && !a.in_tx {
                        caught_up = true;
                    }
                }
                // No stop LSN is ever set: as the end of the stream.
                ReplicationEvent::StoppedAt { .. } => {
                    return Err(SourceError::transient(format!(
                        "replication from slot {}: the server ended the stream",
                        cfg.slot
                    )));
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    a.received = a.received.max(wal_end.0);
                    if mark.is_some_and(|m| wal_end.0 >= m) && !a.in_tx {
                        caught_up = true;
                    }
                    // Idle: the slot follows the server over WAL that holds
                    // no change of a routed table.
                    if a.is_idle(acked)
                        && snapshotter.as_ref().is_none_or(|s| s.all_complete())
                        && wal_end.0 > acked_sent
                    {
                        client.update_applied_lsn(wal_end);
                        acked_sent = wal_end.0;
                    }
                }
            },
        }
        if a.in_tx {
            // A transaction larger than a batch goes on in parts, so
            // memory stays bounded by the batch size.
            if a.part_due(a.batch_limit(policy.max_rows, cfg.snapshot_batch_rows)) {
                // Nothing of the open transaction built yet (a watermark's,
                // whose chunk rows are closed at its message): what waits
                // is a whole batch, committed, not a part to stage.
                let whole = match a.tx_rows == 0 && !a.tx_split {
                    true => a.take_batch()?,
                    false => None,
                };
                let batch = match whole {
                    Some(b) => b,
                    None => a.take_part()?,
                };
                if tx.send(Ok(batch)).await.is_err() {
                    break;
                }
            }
            continue;
        }
        // Exit only when caught up AND every table is copied.
        let finished = caught_up && snapshotter.as_ref().is_none_or(|s| s.all_complete());
        let limit = BatchPolicy {
            max_rows: a.batch_limit(policy.max_rows, cfg.snapshot_batch_rows),
            ..policy
        };
        let due = limit.should_close(a.batch_rows, a.batch_opened)
            || a.split_closed
            || (a.batch_rows == 0 && a.last_emit.elapsed() >= policy.max_interval)
            || (a.snapshot_moved && a.batch_rows == 0);
        if (due || finished)
            && let Some(batch) = a.take_batch()?
            && tx.send(Ok(batch)).await.is_err()
        {
            break;
        }
        if finished {
            break;
        }
    }
    if !a.in_tx
        && let Some(batch) = a.take_batch()?
    {
        let _ = tx.send(Ok(batch)).await;
    }
    Ok(client)
}

/// Starts the chunk readers over the tables `snap` has left to copy.
fn spawn_readers(cfg: &StreamCfg, snap: &Snapshotter) -> Result<ChunkReaders, SourceError> {
    let plans = snap.read_plans();
    let parallelism = cfg.snapshot_parallelism.max(1);
    ChunkReaders::spawn(
        ReaderSettings {
            uri: cfg.uri.clone(),
            run: snap.run.clone(),
            chunk_rows: cfg.snapshot_chunk_rows,
            parallelism,
            read_ahead: parallelism * snapshot::READ_AHEAD_PER_READER,
            window_pause: snapshot::test_window_pause(),
        },
        plans,
    )
}

/// The next chunk the readers hand over (`None` once they have all ended;
/// never, without readers).
async fn next_chunk(readers: &mut Option<ChunkReaders>) -> Option<Result<Chunk, SourceError>> {
    match readers {
        Some(r) => r.rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The stream reached the high watermark of chunk `id` before the chunk
/// came over the channel (its reader writes the watermark, then hands the
/// chunk over): waits for it, keeping the chunks that come before it.
async fn wait_for_chunk(
    readers: &mut Option<ChunkReaders>,
    chunks: &mut HashMap<u64, Chunk>,
    id: u64,
) -> Result<Chunk, SourceError> {
    while let Some(r) = readers.as_mut() {
        match r.rx.recv().await {
            Some(chunk) => {
                let chunk = chunk?;
                if chunk.id == id {
                    return Ok(chunk);
                }
                chunks.insert(chunk.id, chunk);
            }
            None => *readers = None,
        }
    }
    Err(SourceError::new(format!(
        "internal: the stream reached the high watermark of snapshot chunk {id}, but its reader ended without handing the chunk over"
    )))
}

/// The stream has ended (caught up or stopped): waits for the runner's
/// last acknowledgement, sends it to the server, and only then disconnects
/// — proved by the client's report of what it sent, not by a timer (the
/// wait is bounded: a server that stops answering is not waited for
/// forever; the slot then keeps that WAL until the next run).
async fn finish(
    mut client: ReplicationClient,
    acked: Arc<AtomicU64>,
    close: tokio::sync::oneshot::Receiver<()>,
    slot: String,
) {
    let mut close = close;
    // Until the runner closes the source, keep the session alive (events
    // are drained: nothing new is read into batches).
    loop {
        tokio::select! {
            _ = &mut close => break,
            ev = client.recv() => match ev {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            },
        }
    }
    let target = acked.load(Ordering::SeqCst);
    if target > 0 {
        client.update_applied_lsn(Lsn(target));
        let metrics = client.metrics();
        let deadline = Instant::now() + Duration::from_secs(10);
        while metrics.last_applied_lsn().0 < target && Instant::now() < deadline {
            tokio::select! {
                ev = client.recv() => if !matches!(ev, Ok(Some(_))) { break },
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        if metrics.last_applied_lsn().0 >= target {
            tracing::debug!(slot = %slot, acknowledged = %LsnPosition(target), "final acknowledgement sent");
        } else {
            tracing::warn!(slot = %slot, acknowledged = %LsnPosition(target), "the final acknowledgement was not confirmed sent; the slot keeps that WAL until the next run");
        }
    }
    let _ = client.shutdown().await;
}
