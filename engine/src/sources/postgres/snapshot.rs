//! The initial snapshot, DBLog style: each table is read in chunks in
//! primary-key order while the replication stream keeps flowing, so a
//! snapshot never holds a long transaction and never blocks the stream.
//!
//! Per chunk: a low watermark is written into the WAL
//! (`pg_logical_emit_message`, non-transactional), the chunk is read
//! (`COPY (SELECT ...) TO STDOUT`), and a high watermark is written
//! ([`reader`]: tasks that read ahead, across tables and across the key
//! [`ranges`] of one table). The stream loop watches the table's live
//! changes from the low watermark of every open window on; when the stream
//! reaches a high watermark — a proof that every transaction committed
//! before it has been seen, never a timer — and every chunk before it in
//! key order is emitted ([`KeyOrder`]), the chunk's rows whose key changed
//! since its low watermark are dropped (the stream's own events carry
//! their newer state) and the rest are emitted as `snapshot` rows (op
//! insert, commit_ts NULL) at the stream's position.
//!
//! Why that is right: a chunk row whose key did not change since the low
//! watermark holds the value the key has where it is emitted; a key that
//! changed inside the window gets its state from the stream. Changes
//! before the window are older than the chunk row and are overwritten by
//! it; changes after it are applied after it. Upsert sinks therefore end
//! equal to the source whichever chunk a crash interrupts.
//!
//! The key a table is read by is its primary key; without one, a unique
//! index on NOT NULL columns whose values every change's old row carries;
//! without one, `ctid` (the row's place: chunks are page ranges read by a
//! TID range scan), when the table has REPLICA IDENTITY FULL: a window
//! then tells the rows live changes touched by all their values (every
//! version a chunk can read is the old or new row of a change inside the
//! window), and a rewrite of the table (VACUUM FULL, CLUSTER, TRUNCATE:
//! rows move) restarts its snapshot from the start. Rows copied twice
//! that way are written again by the route's key, as after a crash.
//!
//! Progress (the last copied key, or `complete`) rides each batch's
//! [`CommitMark`](urutau_planner::progress::CommitMark), so it is committed
//! with the rows it covers; a restart resumes after the last committed
//! chunk.

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::time::Instant;

use sqlx::Row;
use urutau_planner::progress::SnapshotProgress;

use super::catalog::{self, PgTable};
use super::errors;
use crate::sources::SourceError;

pub mod ranges;
pub mod reader;
pub mod rows;

pub use reader::{ChunkReaders, ReadPlan, ReaderSettings};
pub use rows::ChunkRows;

/// The prefix of the watermark messages.
pub const WATERMARK_PREFIX: &str = "urutau.watermark";

/// Chunks read ahead of the stream per reader.
pub const READ_AHEAD_PER_READER: usize = 2;

/// A column the snapshot orders a table's rows by (of its primary key or
/// of a unique index; or `ctid`): its place in the table's schema (past
/// its columns for `ctid`, which the chunk reads after them) and its SQL
/// type.
#[derive(Clone)]
pub struct KeyColumn {
    name: String,
    type_name: String,
    schema_index: usize,
}

impl KeyColumn {
    /// The system column `ctid`, read after the `columns` columns of the
    /// schema (no user column may be named so).
    fn ctid(columns: usize) -> KeyColumn {
        KeyColumn {
            name: "ctid".into(),
            type_name: "tid".into(),
            schema_index: columns,
        }
    }

    /// True for `ctid`.
    pub fn is_ctid(&self) -> bool {
        self.name == "ctid" && self.type_name == "tid"
    }
}

/// One table to copy.
pub struct TableSnapshot {
    /// The table's index among the stream's routed tables.
    pub table: usize,
    pub pg: PgTable,
    pub plan_table: Vec<String>,
    key: Vec<KeyColumn>,
    /// The schema indexes that tell a row apart in a window: the key's,
    /// or every column's for a table read by ctid.
    watch: Vec<usize>,
    /// For a table read by ctid: the relation file (`pg_relation_filenode`)
    /// its ctids are places in.
    layout: Option<i64>,
    columns: Vec<String>,
    /// Columns of `columns` the table no longer has (see
    /// [`SnapshotTarget::dropped`]).
    dropped: Vec<String>,
    pub progress: SnapshotProgress,
    pub copied: u64,
    pub estimated: u64,
    /// Chunks emitted in this run (logged when the table is done: about
    /// one per key range when the ranges are even).
    chunks: u64,
    /// When this run's first chunk of the table closed (the rate's start).
    started: Option<Instant>,
}

impl TableSnapshot {
    /// The schema indexes whose values tell a row apart in a window.
    pub fn watch_indexes(&self) -> Vec<usize> {
        self.watch.clone()
    }

    /// Rows copied per second in this run, from its first chunk on
    /// (`None` in the first quarter second, whose figure would mislead).
    fn rate(&self) -> Option<f64> {
        let seconds = self.started?.elapsed().as_secs_f64();
        (seconds >= 0.25 && self.copied > 0).then(|| self.copied as f64 / seconds)
    }

    /// Seconds left at the current rate, by the row estimate.
    fn eta_seconds(&self) -> Option<f64> {
        if self.progress.is_complete() {
            return Some(0.0);
        }
        let rate = self.rate()?;
        Some(self.estimated.saturating_sub(self.copied) as f64 / rate)
    }
}

/// A chunk read between two watermarks, waiting for the stream to reach
/// the high one (and for the chunks before it in key order).
pub struct Chunk {
    /// The chunk's number in this run (its watermarks carry it).
    pub id: u64,
    /// The index into [`Snapshotter::tables`].
    pub snapshot: usize,
    /// The key range the chunk belongs to ([`ranges::Split`]) and its
    /// place in that range: the stream emits a table's chunks in
    /// (range, piece) order.
    pub range: u64,
    pub piece: u64,
    /// Each row's values (text, as pgoutput sends them) by schema column.
    pub rows: ChunkRows,
    /// The key below which the table is copied once this chunk is emitted
    /// (`None`: no further than before it).
    pub resume_after: Option<Vec<String>>,
    /// Fewer rows than asked: the range is done after this chunk.
    pub range_done: bool,
    /// The last range is done: the table is done after this chunk.
    pub last: bool,
}

impl Chunk {
    /// Row `row`'s key, encoded as [`encode_key`] does.
    pub fn key(&self, row: usize, key_indexes: &[usize]) -> Vec<u8> {
        encode_key(key_indexes.iter().map(|k| self.rows.value(row, *k)))
    }
}

/// Encodes a key from its columns' text values (NULL apart from every
/// text), so keys read by SELECT and keys decoded from the stream compare
/// byte for byte.
pub fn encode_key<'a>(values: impl IntoIterator<Item = Option<&'a [u8]>>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match v {
            None => out.push(0),
            Some(t) => {
                out.push(1);
                out.extend_from_slice(&(t.len() as u32).to_le_bytes());
                out.extend_from_slice(t);
            }
        }
    }
    out
}

/// The tables to copy and their progress, as the stream's windows close.
pub struct Snapshotter {
    pub tables: Vec<TableSnapshot>,
    /// This run's id, in every watermark (a watermark of an earlier run,
    /// still in the WAL, is never taken for one of ours).
    pub run: String,
    terminal: bool,
    metrics: crate::metrics::Metrics,
}

/// A table to copy, as the stream describes it.
pub struct SnapshotTarget<'a> {
    pub table: usize,
    pub pg: &'a PgTable,
    pub plan_table: &'a [String],
    pub columns: Vec<String>,
    /// Columns of the plan the table no longer has (dropped at the source
    /// and kept for the targets): read as NULL.
    pub dropped: Vec<String>,
    pub resume: Option<SnapshotProgress>,
}

impl Snapshotter {
    /// Looks up each table's key and size (in a session of its own, closed
    /// before it returns).
    pub async fn open(
        uri: &str,
        targets: Vec<SnapshotTarget<'_>>,
        metrics: crate::metrics::Metrics,
    ) -> Result<Snapshotter, SourceError> {
        let mut conn = catalog::connect(uri).await?;
        let tables = describe(&mut conn, targets).await;
        catalog::close(conn).await;
        let tables = tables?;
        for t in &tables {
            tracing::info!(table = %t.pg, state = t.progress.state(), estimated_rows = t.estimated, "initial snapshot");
            publish(&metrics, t, false);
        }
        Ok(Snapshotter {
            tables,
            run: uuid::Uuid::new_v4().simple().to_string(),
            terminal: std::io::stderr().is_terminal(),
            metrics,
        })
    }

    /// True once every table is copied.
    pub fn all_complete(&self) -> bool {
        self.tables.iter().all(|t| t.progress.is_complete())
    }

    /// Each table's progress (what the next batch commits).
    pub fn progress(&self) -> Vec<(Vec<String>, SnapshotProgress)> {
        self.tables
            .iter()
            .map(|t| (t.plan_table.clone(), t.progress.clone()))
            .collect()
    }

    /// What the readers need for each table not yet copied.
    pub fn read_plans(&self) -> Vec<ReadPlan> {
        self.tables
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.progress.is_complete())
            .map(|(i, t)| ReadPlan {
                snapshot: i,
                pg: t.pg.clone(),
                key: t.key.clone(),
                layout: t.layout,
                columns: t.columns.clone(),
                dropped: t.dropped.clone(),
                after: reader::start_after(&t.progress),
            })
            .collect()
    }

    /// The stream reached the chunk's high watermark: records the progress
    /// the emitted rows carry.
    pub fn chunk_done(&mut self, chunk: &Chunk, emitted: usize) {
        let t = &mut self.tables[chunk.snapshot];
        t.started.get_or_insert_with(Instant::now);
        t.copied += emitted as u64;
        t.chunks += 1;
        if chunk.last {
            t.progress = SnapshotProgress::Complete;
        } else if let Some(k) = &chunk.resume_after {
            t.progress = SnapshotProgress::InProgress {
                after: Some(k.clone()),
            };
        } else if matches!(t.progress, SnapshotProgress::NotStarted) {
            t.progress = SnapshotProgress::InProgress { after: None };
        }
        publish(&self.metrics, t, self.terminal);
        if t.progress.is_complete() {
            tracing::info!(table = %t.pg, rows = t.copied, chunks = t.chunks, rows_per_second = t.rate().map(|r| r.round()), "initial snapshot complete");
        }
    }
}

/// Each target's chunk key, committed progress and estimated size.
async fn describe(
    conn: &mut sqlx::PgConnection,
    targets: Vec<SnapshotTarget<'_>>,
) -> Result<Vec<TableSnapshot>, SourceError> {
    let mut tables = Vec::new();
    for t in targets {
        let what = |doing: &str| format!("{doing} {}", t.pg);
        let facts = sqlx::query(
            "SELECT GREATEST(reltuples, 0)::int8 AS estimated, relreplident::text AS replident,
                    pg_relation_filenode(oid)::int8 AS filenode,
                    current_setting('server_version_num')::int4 AS version
             FROM pg_class WHERE oid = $1::regclass",
        )
        .bind(t.pg.quoted())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| errors::sql(&what("looking up the size of"), &e))?;
        let candidates = sqlx::query(UNIQUE_KEYS_SQL)
            .bind(t.pg.quoted())
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| errors::sql(&what("reading the unique keys of"), &e))?;
        let keys: Vec<UniqueKey> = candidates
            .iter()
            .map(|r| UniqueKey {
                index: r.get("index_name"),
                primary: r.get("is_primary"),
                replica_identity: r.get("is_replident"),
                columns: r.get::<Vec<String>, _>("names"),
                types: r.get::<Vec<String>, _>("types"),
            })
            .collect();
        let replident: String = facts.get("replident");
        let chosen = choose_key(t.pg, &keys, &replident, facts.get("filenode"))?;
        let mut progress = t.resume.unwrap_or(SnapshotProgress::NotStarted);
        let (key, layout) = match chosen {
            Chosen::Key(k) => {
                let mut key = Vec::new();
                for (name, type_name) in k.columns.iter().zip(&k.types) {
                    let schema_index =
                        t.columns.iter().position(|c| c == name).ok_or_else(|| {
                            SourceError::new(format!(
                                "{}: key column {name} is not in the planned schema; restart the pipeline",
                                t.pg
                            ))
                        })?;
                    key.push(KeyColumn {
                        name: name.clone(),
                        type_name: type_name.clone(),
                        schema_index,
                    });
                }
                if !k.primary {
                    tracing::info!(table = %t.pg, index = %k.index, "no primary key: the snapshot reads the table in the order of a unique index on NOT NULL columns");
                }
                (key, None)
            }
            Chosen::Ctid { filenode } => {
                tracing::info!(table = %t.pg, "no primary key nor unique index on NOT NULL columns: the snapshot reads the table in ctid ranges");
                if facts.get::<i32, _>("version") < 140_000 {
                    tracing::warn!(table = %t.pg, "PostgreSQL before 14 has no TID range scan: every chunk of a table read by ctid scans the whole table; add a primary key, or raise snapshot_chunk_rows");
                }
                (vec![KeyColumn::ctid(t.columns.len())], Some(filenode))
            }
        };
        match (&progress, layout) {
            (SnapshotProgress::InProgress { after: Some(a) }, Some(filenode))
                if a.len() != 2 || a[1] != layout_tag(filenode) =>
            {
                tracing::warn!(table = %t.pg, "the table was rewritten (VACUUM FULL, CLUSTER or TRUNCATE) since its snapshot was interrupted: its rows moved, so the snapshot copies it again from the start");
                progress = SnapshotProgress::NotStarted;
            }
            (SnapshotProgress::InProgress { after: Some(a) }, None)
                if a.len() == 2 && a[1].starts_with("filenode=") =>
            {
                tracing::warn!(table = %t.pg, "the table gained a key since its snapshot (read by ctid) was interrupted: the snapshot copies it again from the start, by the key");
                progress = SnapshotProgress::NotStarted;
            }
            (SnapshotProgress::InProgress { after: Some(a) }, None) if a.len() != key.len() => {
                return Err(SourceError::new(format!(
                    "{}: the committed snapshot progress has {} key values but the key the snapshot reads by has {} columns; the table's key changed since — drop the target tables to start over",
                    t.pg,
                    a.len(),
                    key.len()
                )));
            }
            _ => {}
        }
        let watch = match layout {
            // No key: a row is told apart by all the values the stream
            // carries (not a dropped column's, nor a generated one's,
            // which pgoutput leaves out).
            Some(_) => {
                let generated = generated_columns(conn, t.pg, facts.get("version")).await?;
                (0..t.columns.len())
                    .filter(|i| {
                        !t.dropped.contains(&t.columns[*i]) && !generated.contains(&t.columns[*i])
                    })
                    .collect()
            }
            None => key.iter().map(|k| k.schema_index).collect(),
        };
        let estimated: i64 = facts.get("estimated");
        tables.push(TableSnapshot {
            table: t.table,
            pg: t.pg.clone(),
            plan_table: t.plan_table.to_vec(),
            key,
            watch,
            layout,
            columns: t.columns,
            dropped: t.dropped,
            progress,
            copied: 0,
            estimated: estimated as u64,
            chunks: 0,
            started: None,
        });
    }
    Ok(tables)
}

/// The generated columns of `table` (none before PostgreSQL 12).
async fn generated_columns(
    conn: &mut sqlx::PgConnection,
    table: &PgTable,
    version: i32,
) -> Result<Vec<String>, SourceError> {
    if version < 120_000 {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(
        "SELECT attname::text FROM pg_attribute
         WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated <> ''",
    )
    .bind(table.quoted())
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| errors::sql(&format!("reading the generated columns of {table}"), &e))
}

/// A table's unique indexes the snapshot may read it by: valid,
/// immediate, on plain NOT NULL columns (INCLUDE columns apart), whole
/// (not partial); the primary key first, then the replica identity's
/// index, then the narrowest.
const UNIQUE_KEYS_SQL: &str = "
SELECT i.indexrelid::regclass::text AS index_name, i.indisprimary AS is_primary,
       i.indisreplident AS is_replident,
       array_agg(a.attname::text ORDER BY k.ord) AS names,
       array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY k.ord) AS types
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indisvalid AND i.indimmediate
  AND i.indpred IS NULL AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts
GROUP BY i.indexrelid, i.indisprimary, i.indisreplident
HAVING bool_and(a.attnotnull)
ORDER BY i.indisprimary DESC, i.indisreplident DESC, count(*), 1";

/// A unique index the snapshot may read a table by.
struct UniqueKey {
    index: String,
    primary: bool,
    /// The index is the table's replica identity.
    replica_identity: bool,
    columns: Vec<String>,
    types: Vec<String>,
}

/// What a table is read by.
enum Chosen<'a> {
    Key(&'a UniqueKey),
    /// ctid ranges of the relation file `filenode`.
    Ctid {
        filenode: i64,
    },
}

/// Picks what the snapshot reads a table by: its primary key; else a
/// unique index on NOT NULL columns whose values every change's old row
/// carries (REPLICA IDENTITY FULL, or the index is the replica
/// identity); else, with REPLICA IDENTITY FULL, ctid ranges (a window
/// then tells a changed row by all its values, which only a full old row
/// carries).
fn choose_key<'a>(
    table: &PgTable,
    keys: &'a [UniqueKey],
    replident: &str,
    filenode: Option<i64>,
) -> Result<Chosen<'a>, SourceError> {
    let full = replident == "f";
    if let Some(k) = keys
        .iter()
        .find(|k| k.primary || full || k.replica_identity)
    {
        return Ok(Chosen::Key(k));
    }
    match filenode {
        Some(filenode) if full => Ok(Chosen::Ctid { filenode }),
        None => Err(SourceError::new(format!(
            "{table} has no primary key nor a unique index on NOT NULL columns, and is partitioned: the initial snapshot cannot read it in chunks; add a primary key, or set snapshot = 'none'"
        ))),
        Some(_) => Err(SourceError::new(format!(
            "{table} has no primary key nor a unique index on NOT NULL columns, and its REPLICA IDENTITY is not FULL: the initial snapshot reads such a table in ctid ranges and tells the rows that changed meanwhile by their full old values; set replica_identity = 'full' (the default), add a primary key, or set snapshot = 'none'"
        ))),
    }
}

/// The second value of a ctid-read table's progress: the relation file
/// its ctids are places in (a rewrite makes a new one).
pub fn layout_tag(filenode: i64) -> String {
    format!("filenode={filenode}")
}

/// The pause `URUTAU_TEST_SNAPSHOT_WINDOW_MS` asks for, in builds with the
/// `fault-injection` feature (the test suite's); never in a release.
pub fn test_window_pause() -> Option<std::time::Duration> {
    #[cfg(feature = "fault-injection")]
    {
        std::env::var("URUTAU_TEST_SNAPSHOT_WINDOW_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(std::time::Duration::from_millis)
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        None
    }
}

/// Publishes a table's progress: metrics, and a progress line on a
/// terminal (rows copied, the share of the estimate, rows/s and the time
/// left at that rate).
fn publish(metrics: &crate::metrics::Metrics, t: &TableSnapshot, terminal: bool) {
    let done = t.progress.is_complete();
    let rate = t.rate();
    let eta = t.eta_seconds();
    metrics.snapshot_progress(
        &t.pg.to_string(),
        crate::metrics::SnapshotStatus {
            rows_copied: t.copied,
            rows_estimated: t.estimated,
            done,
            rows_per_second: rate,
            eta_seconds: eta,
        },
    );
    if terminal {
        let pct = if t.estimated > 0 {
            format!(
                " ({:.0}%)",
                (t.copied as f64 / t.estimated as f64 * 100.0).min(100.0)
            )
        } else {
            String::new()
        };
        let speed = match (rate, eta) {
            (Some(r), Some(e)) if !done => format!(", {:.0} rows/s, ~{} left", r, duration_text(e)),
            (Some(r), _) => format!(", {:.0} rows/s", r),
            _ => String::new(),
        };
        eprint!(
            "\rsnapshot {}: {} / ~{} rows{pct}{speed}{}\x1b[K",
            t.pg,
            t.copied,
            t.estimated,
            if done { " done\n" } else { "" }
        );
    }
}

/// `1h02m`, `3m05s`, `12s`.
fn duration_text(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

/// A window opened by a chunk's low watermark: the keys of its table that
/// live changes touched since, collected by the stream until the chunk's
/// high watermark.
pub struct Window {
    /// The chunk's id.
    pub id: u64,
    /// The stream's index of the chunk's table.
    pub table: usize,
    /// The schema indexes whose values tell a row apart (the key's, or
    /// every column's for a table read by ctid).
    pub key: Vec<usize>,
    pub touched: HashSet<Vec<u8>>,
}

/// Chunks whose high watermark the stream has passed, held until every
/// chunk before them in their table's key order is emitted, so a table's
/// progress is always one key below which everything is copied (chunks
/// of several ranges are read at once and may close in any order).
///
/// A held chunk's window stays open: a live change of one of its keys
/// after the high watermark still drops that row, so what is emitted is
/// the key's state at the moment of emission, as DBLog requires.
#[derive(Default)]
pub struct KeyOrder {
    /// Each table's next chunk to emit: (range, piece).
    next: HashMap<usize, (u64, u64)>,
    proved: HashMap<(usize, u64, u64), Chunk>,
}

impl KeyOrder {
    /// The stream passed `chunk`'s high watermark.
    pub fn proved(&mut self, chunk: Chunk) {
        self.proved
            .insert((chunk.snapshot, chunk.range, chunk.piece), chunk);
    }

    /// Chunks held.
    pub fn len(&self) -> usize {
        self.proved.len()
    }

    /// The next chunk of table `snapshot` in key order, once its high
    /// watermark has passed.
    pub fn next_ready(&mut self, snapshot: usize) -> Option<Chunk> {
        let (range, piece) = self.next.get(&snapshot).copied().unwrap_or((0, 0));
        let chunk = self.proved.remove(&(snapshot, range, piece))?;
        let next = match chunk.range_done {
            true => (range + 1, 0),
            false => (range, piece + 1),
        };
        self.next.insert(snapshot, next);
        Some(chunk)
    }
}

/// Every table's committed progress, keyed the way the runner passes it.
pub type ResumeProgress = HashMap<Vec<String>, SnapshotProgress>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_encode_nulls_apart_and_without_ambiguity() {
        let a = encode_key([Some(&b"1"[..]), Some(&b"23"[..])]);
        let b = encode_key([Some(&b"12"[..]), Some(&b"3"[..])]);
        assert_ne!(a, b);
        assert_ne!(encode_key([None]), encode_key([Some(&b""[..])]));
        assert_eq!(a, encode_key([Some(&b"1"[..]), Some(&b"23"[..])]));
    }

    fn chunk(snapshot: usize, range: u64, piece: u64, range_done: bool) -> Chunk {
        Chunk {
            id: range * 10 + piece,
            snapshot,
            range,
            piece,
            rows: ChunkRows::new(1),
            resume_after: None,
            range_done,
            last: false,
        }
    }

    #[test]
    fn chunks_closed_out_of_order_are_emitted_in_key_order() {
        let mut order = KeyOrder::default();
        let place = |c: Option<Chunk>| c.map(|c| (c.snapshot, c.range, c.piece));
        // Range 1 closes before range 0: held.
        order.proved(chunk(0, 1, 0, true));
        assert_eq!(place(order.next_ready(0)), None);
        // Another table's chunks are not held by this one's.
        order.proved(chunk(1, 0, 0, true));
        assert_eq!(place(order.next_ready(1)), Some((1, 0, 0)));
        // Range 0 in two pieces: each frees what follows it.
        order.proved(chunk(0, 0, 1, true));
        assert_eq!(place(order.next_ready(0)), None);
        order.proved(chunk(0, 0, 0, false));
        assert_eq!(place(order.next_ready(0)), Some((0, 0, 0)));
        assert_eq!(place(order.next_ready(0)), Some((0, 0, 1)));
        assert_eq!(place(order.next_ready(0)), Some((0, 1, 0)));
        assert_eq!(place(order.next_ready(0)), None);
        assert_eq!(order.len(), 0);
    }

    fn unique(index: &str, primary: bool, replica_identity: bool) -> UniqueKey {
        UniqueKey {
            index: index.into(),
            primary,
            replica_identity,
            columns: vec!["id".into()],
            types: vec!["bigint".into()],
        }
    }

    fn chosen(
        keys: &[UniqueKey],
        replident: &str,
        filenode: Option<i64>,
    ) -> Result<String, String> {
        let table = PgTable {
            schema: "public".into(),
            name: "t".into(),
        };
        match choose_key(&table, keys, replident, filenode) {
            Ok(Chosen::Key(k)) => Ok(k.index.clone()),
            Ok(Chosen::Ctid { filenode }) => Ok(format!("ctid of {filenode}")),
            Err(e) => Err(e.message),
        }
    }

    #[test]
    fn a_table_is_read_by_its_primary_key_else_a_unique_index_else_ctid() {
        let pk = unique("t_pkey", true, false);
        let other = unique("t_code_key", false, false);
        let ident = unique("t_ident_key", false, true);
        // The query lists the primary key first.
        assert_eq!(
            chosen(&[pk, unique("x", false, false)], "d", Some(1)).unwrap(),
            "t_pkey"
        );
        // A unique index: its values must be in every change's old row.
        assert_eq!(
            chosen(std::slice::from_ref(&other), "f", Some(1)).unwrap(),
            "t_code_key"
        );
        assert_eq!(
            chosen(&[unique("t_code_key", false, false), ident], "i", Some(1)).unwrap(),
            "t_ident_key"
        );
        let e = chosen(std::slice::from_ref(&other), "d", Some(1)).unwrap_err();
        assert!(e.contains("REPLICA IDENTITY is not FULL"), "{e}");
        // No key: ctid ranges, with REPLICA IDENTITY FULL only.
        assert_eq!(chosen(&[], "f", Some(16_384)).unwrap(), "ctid of 16384");
        let e = chosen(&[], "n", Some(16_384)).unwrap_err();
        assert!(
            e.contains("public.t has no primary key") && e.contains("snapshot = 'none'"),
            "{e}"
        );
        let e = chosen(&[], "f", None).unwrap_err();
        assert!(e.contains("partitioned"), "{e}");
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(duration_text(12.4), "12s");
        assert_eq!(duration_text(185.0), "3m05s");
        assert_eq!(duration_text(3720.0), "1h02m");
    }
}
