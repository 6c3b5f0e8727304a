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

/// A primary-key column: its place in the table's schema and its SQL type.
#[derive(Clone)]
pub struct KeyColumn {
    name: String,
    type_name: String,
    schema_index: usize,
}

/// One table to copy.
pub struct TableSnapshot {
    /// The table's index among the stream's routed tables.
    pub table: usize,
    pub pg: PgTable,
    pub plan_table: Vec<String>,
    key: Vec<KeyColumn>,
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
    /// The schema indexes of the primary key's columns.
    pub fn key_indexes(&self) -> Vec<usize> {
        self.key.iter().map(|k| k.schema_index).collect()
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

/// Each target's key columns, committed progress and estimated size.
async fn describe(
    conn: &mut sqlx::PgConnection,
    targets: Vec<SnapshotTarget<'_>>,
) -> Result<Vec<TableSnapshot>, SourceError> {
    let mut tables = Vec::new();
    for t in targets {
        let progress = t.resume.unwrap_or(SnapshotProgress::NotStarted);
        let key_rows = sqlx::query(
            "SELECT a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS type_name
             FROM pg_index i
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = $1::regclass AND i.indisprimary
             ORDER BY array_position(i.indkey::int2[], a.attnum)",
        )
        .bind(t.pg.quoted())
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| errors::sql(&format!("reading the primary key of {}", t.pg), &e))?;
        if key_rows.is_empty() {
            return Err(SourceError::new(format!(
                "{} has no primary key: the initial snapshot reads a table in key order; add a primary key, or set snapshot = 'none'",
                t.pg
            )));
        }
        let mut key = Vec::new();
        for r in &key_rows {
            let name: String = r.get("name");
            let schema_index = t.columns.iter().position(|c| *c == name).ok_or_else(|| {
                SourceError::new(format!(
                    "{}: key column {name} is not in the planned schema; restart the pipeline",
                    t.pg
                ))
            })?;
            key.push(KeyColumn {
                name,
                type_name: r.get("type_name"),
                schema_index,
            });
        }
        if let SnapshotProgress::InProgress { after: Some(a) } = &progress
            && a.len() != key.len()
        {
            return Err(SourceError::new(format!(
                "{}: the committed snapshot progress has {} key values but the primary key has {} columns; the table's key changed since — drop the target tables to start over",
                t.pg,
                a.len(),
                key.len()
            )));
        }
        let estimated: i64 = sqlx::query_scalar(
            "SELECT GREATEST(reltuples, 0)::int8 FROM pg_class WHERE oid = $1::regclass",
        )
        .bind(t.pg.quoted())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| errors::sql(&format!("estimating the size of {}", t.pg), &e))?;
        tables.push(TableSnapshot {
            table: t.table,
            pg: t.pg.clone(),
            plan_table: t.plan_table.to_vec(),
            key,
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
    /// The schema indexes of the table's key columns.
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

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(duration_text(12.4), "12s");
        assert_eq!(duration_text(185.0), "3m05s");
        assert_eq!(duration_text(3720.0), "1h02m");
    }
}
