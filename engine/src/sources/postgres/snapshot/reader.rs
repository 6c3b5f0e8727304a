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
//! A table is read by one reader, in key order, so its windows close in
//! order and its progress stays one key. Several tables are read at once
//! by up to `snapshot_parallelism` readers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{Executor, ValueRef};
use tokio::sync::mpsc;
use urutau_planner::progress::SnapshotProgress;

use super::super::catalog::{self, PgTable, quote_ident};
use super::super::errors;
use super::{Chunk, KeyColumn, WATERMARK_PREFIX, encode_key};
use crate::sources::SourceError;

/// What a reader needs to copy one table.
#[derive(Clone)]
pub struct ReadPlan {
    /// The index into [`super::Snapshotter::tables`].
    pub snapshot: usize,
    pub pg: PgTable,
    pub key: Vec<KeyColumn>,
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
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ChunkReaders {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How the readers run.
pub struct ReaderSettings {
    pub uri: String,
    pub run: String,
    pub chunk_rows: usize,
    /// Readers (sessions) at most; never more than the tables to copy.
    pub parallelism: usize,
    /// Chunks read ahead of the stream (the channel's capacity).
    pub read_ahead: usize,
    /// A pause between a chunk's SELECT and its high watermark (tests).
    pub window_pause: Option<Duration>,
}

impl ChunkReaders {
    /// Starts the readers over `plans` (tables handed out in order).
    pub fn spawn(settings: ReaderSettings, plans: Vec<ReadPlan>) -> ChunkReaders {
        let (tx, rx) = mpsc::channel(settings.read_ahead.max(1));
        let readers = settings.parallelism.clamp(1, plans.len().max(1));
        let queue = Arc::new(Mutex::new(plans.into_iter().collect::<VecDeque<_>>()));
        let ids = Arc::new(AtomicU64::new(0));
        let settings = Arc::new(settings);
        let tasks = (0..readers)
            .map(|_| {
                let (tx, queue, ids, settings) = (
                    tx.clone(),
                    Arc::clone(&queue),
                    Arc::clone(&ids),
                    Arc::clone(&settings),
                );
                tokio::spawn(async move {
                    if let Err(e) = read_tables(&settings, &queue, &ids, &tx).await {
                        let _ = tx.send(Err(e)).await;
                    }
                })
            })
            .collect();
        ChunkReaders { rx, tasks }
    }
}

/// One reader: takes tables from `queue` until none is left.
async fn read_tables(
    settings: &ReaderSettings,
    queue: &Mutex<VecDeque<ReadPlan>>,
    ids: &AtomicU64,
    tx: &mpsc::Sender<Result<Chunk, SourceError>>,
) -> Result<(), SourceError> {
    let next = || queue.lock().expect("queue lock").pop_front();
    let Some(mut plan) = next() else {
        return Ok(());
    };
    let mut conn = open_session(&settings.uri).await?;
    loop {
        let id = ids.fetch_add(1, Ordering::Relaxed) + 1;
        let (low, high) = watermarks(&settings.run, id, plan.snapshot);
        emit(&mut conn, &low, false).await?;
        let sql = chunk_sql(&plan, settings.chunk_rows);
        let result = Executor::fetch_all(&mut conn, sqlx::raw_sql(&sql))
            .await
            .map_err(|e| errors::sql(&format!("reading a snapshot chunk of {}", plan.pg), &e))?;
        if let Some(pause) = settings.window_pause {
            // Tests widen the window so live changes land inside it.
            tokio::time::sleep(pause).await;
        }
        emit(&mut conn, &high, true).await?;
        let mut chunk = to_chunk(&plan, &result, settings.chunk_rows)?;
        chunk.id = id;
        chunk.low = low;
        chunk.high = high;
        let last = chunk.last;
        plan.after = chunk.last_key.clone().or(plan.after);
        if tx.send(Ok(chunk)).await.is_err() {
            break;
        }
        if last {
            match next() {
                Some(p) => plan = p,
                None => break,
            }
        }
    }
    catalog::close(conn).await;
    Ok(())
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
/// own `SELECT` and nothing else (no watermark, nothing recorded): the
/// preview's snapshot rows.
pub async fn peek(uri: &str, plans: &[ReadPlan], limit: usize) -> Result<Vec<Chunk>, SourceError> {
    let mut conn = open_session(uri).await?;
    let mut chunks = Vec::new();
    for plan in plans {
        let result = Executor::fetch_all(&mut conn, sqlx::raw_sql(&chunk_sql(plan, limit)))
            .await
            .map_err(|e| errors::sql(&format!("reading the first rows of {}", plan.pg), &e))?;
        chunks.push(to_chunk(plan, &result, limit)?);
    }
    catalog::close(conn).await;
    Ok(chunks)
}

/// The `SELECT` of a table's next `limit` rows in key order, after the
/// last key copied. The simple query protocol: values arrive as text,
/// produced by the same output functions pgoutput uses.
fn chunk_sql(plan: &ReadPlan, limit: usize) -> String {
    let columns: Vec<String> = plan
        .columns
        .iter()
        .map(|c| match plan.dropped.contains(c) {
            true => "NULL".to_string(),
            false => quote_ident(c),
        })
        .collect();
    let order: Vec<String> = plan.key.iter().map(|k| quote_ident(&k.name)).collect();
    let filter = match &plan.after {
        None => String::new(),
        Some(values) => {
            let bounds: Vec<String> = values
                .iter()
                .zip(&plan.key)
                .map(|(v, k)| format!("{}::{}", literal(v), k.type_name))
                .collect();
            format!(" WHERE ({}) > ({})", order.join(", "), bounds.join(", "))
        }
    };
    format!(
        "SELECT {} FROM {}{filter} ORDER BY {} LIMIT {limit}",
        columns.join(", "),
        plan.pg.quoted(),
        order.join(", "),
    )
}

/// A chunk from its `SELECT`'s rows (`limit` asked for).
fn to_chunk(
    plan: &ReadPlan,
    result: &[sqlx::postgres::PgRow],
    limit: usize,
) -> Result<Chunk, SourceError> {
    let pg = &plan.pg;
    let key_indexes: Vec<usize> = plan.key.iter().map(|k| k.schema_index).collect();
    let mut rows = Vec::with_capacity(result.len());
    let mut keys = Vec::with_capacity(result.len());
    for r in result {
        let mut values = Vec::with_capacity(plan.columns.len());
        for (c, name) in plan.columns.iter().enumerate() {
            let fail = |e: &dyn std::fmt::Display| {
                SourceError::new(format!("{pg}: snapshot column {name}: {e}"))
            };
            let raw = sqlx::Row::try_get_raw(r, c).map_err(|e| fail(&e))?;
            values.push(if raw.is_null() {
                None
            } else {
                Some(raw.as_bytes().map_err(|e| fail(&e))?.to_vec())
            });
        }
        keys.push(encode_key(
            key_indexes.iter().map(|k| values[*k].as_deref()),
        ));
        rows.push(values);
    }
    let last_key = match rows.last() {
        Some(row) => Some(
            key_indexes
                .iter()
                .map(|k| {
                    row[*k]
                        .as_deref()
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .ok_or_else(|| {
                            SourceError::new(format!("{pg}: a primary key value is NULL"))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    Ok(Chunk {
        id: 0,
        snapshot: plan.snapshot,
        low: String::new(),
        high: String::new(),
        last: rows.len() < limit,
        rows,
        keys,
        last_key,
    })
}

/// A SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
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
    fn literals_double_quotes() {
        assert_eq!(literal("o'brien"), "'o''brien'");
    }

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
