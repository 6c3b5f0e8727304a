//! The chunk readers: tasks, each with its own session, that copy tables
//! chunk by chunk, write the watermarks around each chunk and hand the
//! chunks to the stream, which closes each window when the replication
//! stream reaches its high watermark.
//!
//! The readers never wait for a window to close: they read ahead (bounded
//! by the channel), so the time a chunk waits for its proof overlaps the
//! reading of the next ones. The high watermark is written by a statement
//! that also takes a transaction id, so its commit flushes the WAL and the
//! walsender sends the watermark at once (a non-transactional logical
//! message alone waits for the WAL writer, up to `wal_writer_delay`).
//!
//! The readers run on a runtime of their own, a thread per reader. On the
//! pipeline's runtime a reader woken while the stream loop or a sink was
//! encoding a batch on its worker waited for that worker, and the server
//! sat idle between a chunk's statements: at `snapshot_parallelism = 1`
//! the 2,000 watermark statements of a 5M-row table took 1.2 s instead of
//! 0.2 s, a quarter of the run.
//!
//! Up to `snapshot_parallelism` readers work at once, across the tables
//! and across the key ranges of one table ([`super::ranges`]): a reader
//! takes the next range not taken and copies it chunk after chunk, each
//! chunk `COPY (SELECT ... ORDER BY key LIMIT n) TO STDOUT` in text
//! format (the server's cheapest way out; the values are the same text
//! SELECT and pgoutput give). Chunks of a table may close out of key
//! order; the stream emits them in key order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use sqlx::Executor;
use sqlx::postgres::PgConnection;
use tokio::sync::mpsc;
use urutau_planner::progress::SnapshotProgress;

use super::super::catalog::{self, PgTable, quote_ident};
use super::super::errors;
use super::ranges::{self, Split};
use super::rows::ChunkRows;
use super::{Chunk, KeyColumn, WATERMARK_PREFIX};
use crate::sources::SourceError;

/// What a reader needs to copy one table.
#[derive(Clone)]
pub struct ReadPlan {
    /// The index into [`super::Snapshotter::tables`].
    pub snapshot: usize,
    pub pg: PgTable,
    pub key: Vec<KeyColumn>,
    /// For a table read by ctid: the relation file its ctids are places in
    /// (each chunk checks it is still the one).
    pub layout: Option<i64>,
    pub columns: Vec<String>,
    /// Columns of `columns` the table no longer has: selected as NULL.
    pub dropped: Vec<String>,
    /// The last key committed (the copy goes on after it).
    pub after: Option<Vec<String>>,
}

/// The watermark texts of chunk `id` of snapshot table `snapshot` in run
/// `run`: the low one names the table, so the stream knows whose changes
/// to watch before the chunk itself arrives.
pub fn watermarks(run: &str, id: u64, snapshot: usize) -> (String, String) {
    (
        format!("low:{run}:{id}:{snapshot}"),
        format!("high:{run}:{id}"),
    )
}

/// A low watermark of run `run`: the chunk's id and its table's index.
pub fn parse_low(run: &str, text: &str) -> Option<(u64, usize)> {
    let rest = text
        .strip_prefix("low:")?
        .strip_prefix(run)?
        .strip_prefix(':')?;
    let (id, snapshot) = rest.split_once(':')?;
    Some((id.parse().ok()?, snapshot.parse().ok()?))
}

/// A high watermark of run `run`: the chunk's id.
pub fn parse_high(run: &str, text: &str) -> Option<u64> {
    text.strip_prefix("high:")?
        .strip_prefix(run)?
        .strip_prefix(':')?
        .parse()
        .ok()
}

/// The running readers; dropping it stops them.
pub struct ChunkReaders {
    pub rx: mpsc::Receiver<Result<Chunk, SourceError>>,
    /// The readers' own runtime (see the module's doc): shut down without
    /// waiting when the readers are dropped, which drops their tasks.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for ChunkReaders {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// How the readers run.
pub struct ReaderSettings {
    pub uri: String,
    pub run: String,
    pub chunk_rows: usize,
    /// Readers (sessions) at most.
    pub parallelism: usize,
    /// Chunks read ahead of the stream (the channel's capacity).
    pub read_ahead: usize,
    /// A pause between a chunk's read and its high watermark (tests).
    pub window_pause: Option<Duration>,
}

/// A table's place in the shared work: how its keys are split (once the
/// first reader to reach it has asked) and the next range to hand out.
struct TableWork {
    plan: ReadPlan,
    split: SplitState,
    next_range: u64,
}

enum SplitState {
    NotAsked,
    Asking,
    Known(Split),
}

/// One range of one table, as a reader copies it.
struct RangeWork {
    plan: ReadPlan,
    split: Split,
    range: u64,
}

/// What a reader does next.
enum Next {
    Copy(RangeWork),
    /// Split table `i` (as [`Work::next`] numbers it), whose plan this is.
    Split(usize, ReadPlan),
    /// Another reader is splitting the only table left: look again soon.
    Wait,
    Done,
}

/// The tables to copy, shared by the readers.
struct Work {
    tables: Mutex<Vec<TableWork>>,
}

impl Work {
    /// The first range not yet handed out, in table order; a table not yet
    /// split is split first (by the reader that reaches it).
    fn next(&self) -> Next {
        let mut tables = self.tables.lock().expect("work lock");
        let mut waiting = false;
        for (i, t) in tables.iter_mut().enumerate() {
            match &t.split {
                SplitState::NotAsked => {
                    t.split = SplitState::Asking;
                    return Next::Split(i, t.plan.clone());
                }
                SplitState::Asking => waiting = true,
                SplitState::Known(split) if t.next_range < split.count() => {
                    t.next_range += 1;
                    return Next::Copy(RangeWork {
                        plan: t.plan.clone(),
                        split: split.clone(),
                        range: t.next_range - 1,
                    });
                }
                SplitState::Known(_) => {}
            }
        }
        if waiting { Next::Wait } else { Next::Done }
    }

    /// Records how table `i` (as [`Work::next`] numbered it) is split.
    fn split_known(&self, i: usize, split: Split) {
        let mut tables = self.tables.lock().expect("work lock");
        tables[i].split = SplitState::Known(split);
    }
}

impl ChunkReaders {
    /// Starts the readers over `plans` (tables handed out in order), on a
    /// runtime of their own.
    pub fn spawn(
        settings: ReaderSettings,
        plans: Vec<ReadPlan>,
    ) -> Result<ChunkReaders, SourceError> {
        let (tx, rx) = mpsc::channel(settings.read_ahead.max(1));
        let readers = settings.parallelism.max(1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(readers)
            .thread_name("snapshot-reader")
            .enable_all()
            .build()
            .map_err(|e| SourceError::new(format!("starting the snapshot's chunk readers: {e}")))?;
        let work = Arc::new(Work {
            tables: Mutex::new(
                plans
                    .into_iter()
                    .map(|plan| TableWork {
                        plan,
                        split: SplitState::NotAsked,
                        next_range: 0,
                    })
                    .collect(),
            ),
        });
        let ids = Arc::new(AtomicU64::new(0));
        let settings = Arc::new(settings);
        for _ in 0..readers {
            let (tx, work, ids, settings) = (
                tx.clone(),
                Arc::clone(&work),
                Arc::clone(&ids),
                Arc::clone(&settings),
            );
            runtime.spawn(async move {
                if let Err(e) = read_ranges(&settings, &work, &ids, &tx).await {
                    let _ = tx.send(Err(e)).await;
                }
            });
        }
        Ok(ChunkReaders {
            rx,
            runtime: Some(runtime),
        })
    }
}

/// One reader: copies ranges until none is left.
async fn read_ranges(
    settings: &ReaderSettings,
    work: &Work,
    ids: &AtomicU64,
    tx: &mpsc::Sender<Result<Chunk, SourceError>>,
) -> Result<(), SourceError> {
    let mut conn: Option<PgConnection> = None;
    loop {
        let job = match work.next() {
            Next::Done => break,
            Next::Wait => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            Next::Split(i, plan) => {
                let c = session(&mut conn, &settings.uri).await?;
                let split = ranges::split(
                    c,
                    &plan.pg,
                    &plan.key,
                    plan.after.as_deref(),
                    settings.chunk_rows,
                )
                .await?;
                tracing::info!(
                    table = %plan.pg,
                    ranges = split.count(),
                    "snapshot key ranges"
                );
                work.split_known(i, split);
                continue;
            }
            Next::Copy(job) => job,
        };
        let c = session(&mut conn, &settings.uri).await?;
        if !copy_range(settings, c, ids, tx, job).await? {
            break;
        }
    }
    if let Some(conn) = conn {
        catalog::close(conn).await;
    }
    Ok(())
}

/// The reader's session, opened at its first use.
async fn session<'a>(
    conn: &'a mut Option<PgConnection>,
    uri: &str,
) -> Result<&'a mut PgConnection, SourceError> {
    if conn.is_none() {
        *conn = Some(open_session(uri).await?);
    }
    Ok(conn.as_mut().expect("opened"))
}

/// Copies one range chunk after chunk, each between its watermarks;
/// false once the stream is gone.
async fn copy_range(
    settings: &ReaderSettings,
    conn: &mut PgConnection,
    ids: &AtomicU64,
    tx: &mpsc::Sender<Result<Chunk, SourceError>>,
    job: RangeWork,
) -> Result<bool, SourceError> {
    let RangeWork { plan, split, range } = job;
    let (lower, upper) = split.bounds(range);
    let last_range = range + 1 == split.count();
    // Range 0 starts after the committed key; the others above their
    // lower bound.
    let mut after = if range == 0 { plan.after.clone() } else { None };
    for piece in 0.. {
        let id = ids.fetch_add(1, Ordering::Relaxed) + 1;
        let (low, high) = watermarks(&settings.run, id, plan.snapshot);
        emit(conn, &low, false).await?;
        let bounds = Bounds {
            after: after.as_deref(),
            lower: if after.is_none() { lower } else { None },
            upper,
        };
        let rows = copy_chunk(conn, &plan, &bounds, settings.chunk_rows).await?;
        if let Some(pause) = settings.window_pause {
            // Tests widen the window so live changes land inside it.
            tokio::time::sleep(pause).await;
        }
        emit_high(conn, &high, &plan).await?;
        let range_done = rows.len() < settings.chunk_rows;
        let last_key = last_key(&plan, &rows)?;
        // The key below which the table is copied once this chunk is in:
        // the range's upper bound when the range is done and the key is
        // that one column, else the chunk's last key (for a table read by
        // ctid, with the relation file its ctids are places in).
        let resume_after = match (range_done, upper) {
            (true, Some(u)) if plan.key.len() == 1 => Some(vec![u.to_string()]),
            _ => last_key.clone(),
        }
        .map(|mut key| {
            key.extend(plan.layout.map(super::layout_tag));
            key
        });
        if last_key.is_some() {
            after = last_key;
        }
        let chunk = Chunk {
            id,
            snapshot: plan.snapshot,
            range,
            piece,
            rows,
            resume_after,
            range_done,
            last: range_done && last_range,
        };
        if tx.send(Ok(chunk)).await.is_err() {
            return Ok(false);
        }
        if range_done {
            break;
        }
    }
    Ok(true)
}

/// Where a chunk's rows lie: after a key (the previous chunk's last, or
/// the committed one), else above `lower` on the first key column; at or
/// below `upper` on it.
struct Bounds<'a> {
    after: Option<&'a [String]>,
    lower: Option<&'a str>,
    upper: Option<&'a str>,
}

/// A snapshot session: text output as the replication session's, and
/// commits that flush locally (the watermark's proof reaches the stream
/// without waiting for the WAL writer, nor for a synchronous standby).
async fn open_session(uri: &str) -> Result<PgConnection, SourceError> {
    let mut conn = catalog::connect(uri).await?;
    catalog::set_text_output(&mut conn, "the snapshot session").await?;
    Executor::execute(&mut conn, sqlx::raw_sql("SET synchronous_commit = local"))
        .await
        .map_err(|e| errors::sql("setting up the snapshot session", &e))?;
    Ok(conn)
}

/// Writes a chunk's high watermark, flushed; for a table read by ctid,
/// checks in the same statement that the table was not rewritten since
/// its snapshot began (its rows would have moved: a range read after a
/// rewrite could miss rows that moved below it). A rewrite is a
/// transient error: the run restarts, and the snapshot of the table
/// starts over from the committed progress, which names the old file.
async fn emit_high(
    conn: &mut PgConnection,
    content: &str,
    plan: &ReadPlan,
) -> Result<(), SourceError> {
    let Some(layout) = plan.layout else {
        return emit(conn, content, true).await;
    };
    let now: Option<i64> = sqlx::query_scalar(
        "SELECT pg_relation_filenode($3::regclass)::int8
         FROM (SELECT pg_logical_emit_message(false, $1, $2), txid_current()) w",
    )
    .bind(WATERMARK_PREFIX)
    .bind(content)
    .bind(plan.pg.quoted())
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| errors::sql("writing a snapshot watermark", &e))?;
    if now != Some(layout) {
        return Err(SourceError::transient(format!(
            "{} was rewritten (VACUUM FULL, CLUSTER or TRUNCATE) while the snapshot read it by ctid: its rows moved, so the run restarts and copies the table again from the start",
            plan.pg
        )));
    }
    Ok(())
}

/// Writes a watermark. `flush`: in a statement that takes a transaction
/// id, so its commit flushes the WAL up to (and past) the message.
async fn emit(conn: &mut PgConnection, content: &str, flush: bool) -> Result<(), SourceError> {
    let sql = if flush {
        "SELECT pg_logical_emit_message(false, $1, $2), txid_current()"
    } else {
        "SELECT pg_logical_emit_message(false, $1, $2)"
    };
    sqlx::query(sql)
        .bind(WATERMARK_PREFIX)
        .bind(content)
        .execute(&mut *conn)
        .await
        .map_err(|e| errors::sql("writing a snapshot watermark", &e))?;
    Ok(())
}

/// The first `limit` rows of each table's next chunk, read by the chunk's
/// own query and nothing else (no watermark, nothing recorded): the
/// preview's snapshot rows.
pub async fn peek(uri: &str, plans: &[ReadPlan], limit: usize) -> Result<Vec<Chunk>, SourceError> {
    let mut conn = open_session(uri).await?;
    let mut chunks = Vec::new();
    for plan in plans {
        let bounds = Bounds {
            after: plan.after.as_deref(),
            lower: None,
            upper: None,
        };
        let rows = copy_chunk(&mut conn, plan, &bounds, limit).await?;
        let last = rows.len() < limit;
        chunks.push(Chunk {
            id: 0,
            snapshot: plan.snapshot,
            range: 0,
            piece: 0,
            resume_after: last_key(plan, &rows)?,
            rows,
            range_done: last,
            last,
        });
    }
    catalog::close(conn).await;
    Ok(chunks)
}

/// Reads a chunk: the first `limit` rows within `bounds` in key order.
async fn copy_chunk(
    conn: &mut PgConnection,
    plan: &ReadPlan,
    bounds: &Bounds<'_>,
    limit: usize,
) -> Result<ChunkRows, SourceError> {
    let sql = format!("COPY ({}) TO STDOUT", chunk_sql(plan, bounds, limit));
    let what = || format!("reading a snapshot chunk of {}", plan.pg);
    let mut rows = ChunkRows::with_hidden(plan.columns.len(), hidden_key(plan).count());
    let mut lines = conn
        .copy_out_raw(&sql)
        .await
        .map_err(|e| errors::sql(&what(), &e))?;
    while let Some(line) = lines
        .try_next()
        .await
        .map_err(|e| errors::sql(&what(), &e))?
    {
        rows.push_copy_line(&line)
            .map_err(|e| SourceError::new(format!("{}: {e}", what())))?;
    }
    Ok(rows)
}

/// The `SELECT` of a chunk: the first `limit` rows within `bounds`, in key
/// order (dropped columns as NULL).
fn chunk_sql(plan: &ReadPlan, bounds: &Bounds<'_>, limit: usize) -> String {
    let columns: Vec<String> = plan
        .columns
        .iter()
        .map(|c| match plan.dropped.contains(c) {
            true => "NULL".to_string(),
            false => quote_ident(c),
        })
        .chain(hidden_key(plan).map(|k| quote_ident(&k.name)))
        .collect();
    let order: Vec<String> = plan.key.iter().map(|k| quote_ident(&k.name)).collect();
    let first = &order[0];
    let bound = |value: &str| format!("{}::{}", ranges::literal(value), plan.key[0].type_name);
    let mut filters = Vec::new();
    if let Some(values) = bounds.after {
        filters.push(ranges::after_filter(&plan.key, values));
    }
    if let Some(l) = bounds.lower {
        filters.push(format!("{first} > {}", bound(l)));
    }
    if let Some(u) = bounds.upper {
        filters.push(format!("{first} <= {}", bound(u)));
    }
    let filter = match filters.is_empty() {
        true => String::new(),
        false => format!(" WHERE {}", filters.join(" AND ")),
    };
    format!(
        "SELECT {} FROM {}{filter} ORDER BY {} LIMIT {limit}",
        columns.join(", "),
        plan.pg.quoted(),
        order.join(", "),
    )
}

/// The key columns not among the schema's (`ctid`): read after them.
fn hidden_key(plan: &ReadPlan) -> impl Iterator<Item = &KeyColumn> {
    plan.key
        .iter()
        .filter(|k| k.schema_index >= plan.columns.len())
}

/// The key values of a chunk's last row (the next chunk starts after it).
fn last_key(plan: &ReadPlan, rows: &ChunkRows) -> Result<Option<Vec<String>>, SourceError> {
    let Some(row) = rows.len().checked_sub(1) else {
        return Ok(None);
    };
    plan.key
        .iter()
        .map(|k| {
            rows.value(row, k.schema_index)
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .ok_or_else(|| {
                    SourceError::new(format!("{}: a primary key value is NULL", plan.pg))
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Where a table's copy starts from its committed progress.
pub fn start_after(progress: &SnapshotProgress) -> Option<Vec<String>> {
    match progress {
        SnapshotProgress::InProgress { after } => after.clone(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermarks_parse_back_only_for_their_run() {
        let (low, high) = watermarks("abc", 7, 2);
        assert_eq!(parse_low("abc", &low), Some((7, 2)));
        assert_eq!(parse_high("abc", &high), Some(7));
        assert_eq!(parse_low("abd", &low), None);
        assert_eq!(parse_high("ab", &high), None);
        assert_eq!(parse_high("abc", &low), None);
    }
}
