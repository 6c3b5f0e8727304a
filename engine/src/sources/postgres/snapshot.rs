//! The initial snapshot, DBLog style: each table is read in chunks in
//! primary-key order while the replication stream keeps flowing, so a
//! snapshot never holds a long transaction and never blocks the stream.
//!
//! Per chunk: a low watermark is written into the WAL
//! (`pg_logical_emit_message`, non-transactional), the chunk is SELECTed,
//! and a high watermark is written. The stream loop watches the table's
//! live changes between the two watermarks; when the stream reaches the
//! high watermark — a proof that every transaction committed before it has
//! been seen, never a timer — the chunk's rows whose key changed inside the
//! window are dropped (the stream's own events carry their newer state) and
//! the rest are emitted as `snapshot` rows (op insert, commit_ts NULL) at
//! the high watermark's position.
//!
//! Why that is right: a chunk row whose key did not change between the
//! watermarks holds the value the key had at the high watermark; a key
//! that changed inside the window gets its state from the stream. Changes
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

use sqlx::postgres::PgConnection;
use sqlx::{Executor, Row, ValueRef};
use urutau_planner::progress::SnapshotProgress;

use super::catalog::{self, PgTable, quote_ident};
use super::errors;
use crate::sources::SourceError;

/// The prefix of the watermark messages.
pub const WATERMARK_PREFIX: &str = "urutau.watermark";

/// A primary-key column: its place in the table's schema and its SQL type.
struct KeyColumn {
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
    pub progress: SnapshotProgress,
    pub copied: u64,
    pub estimated: u64,
}

impl TableSnapshot {
    /// The schema indexes of the primary key's columns.
    pub fn key_indexes(&self) -> Vec<usize> {
        self.key.iter().map(|k| k.schema_index).collect()
    }
}

/// A chunk read between two watermarks, waiting for the stream to reach
/// the high one.
pub struct Chunk {
    /// The index into [`Snapshotter::tables`].
    pub snapshot: usize,
    pub low: String,
    pub high: String,
    /// Each row's values (text, as pgoutput sends them) by schema column.
    pub rows: Vec<Vec<Option<Vec<u8>>>>,
    /// Each row's key, encoded as [`encode_key`] does.
    pub keys: Vec<Vec<u8>>,
    /// The last row's key values (the next chunk starts after them).
    pub last_key: Option<Vec<String>>,
    /// Fewer rows than asked: the table is done after this chunk.
    pub last: bool,
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

/// Reads the chunks.
pub struct Snapshotter {
    /// The snapshot session (closed once every table is copied).
    conn: Option<PgConnection>,
    pub tables: Vec<TableSnapshot>,
    chunk_rows: usize,
    run: String,
    next_chunk: u64,
    terminal: bool,
    /// A pause between a chunk's SELECT and its high watermark
    /// (`URUTAU_TEST_SNAPSHOT_WINDOW_MS`, test builds only): a load a real server produces
    /// at random (a slow network, a busy server), made reproducible for
    /// the tests that prove live changes inside a window win.
    window_pause: Option<std::time::Duration>,
    metrics: crate::metrics::Metrics,
}

/// A table to copy, as the stream describes it.
pub struct SnapshotTarget<'a> {
    pub table: usize,
    pub pg: &'a PgTable,
    pub plan_table: &'a [String],
    pub columns: Vec<String>,
    pub resume: Option<SnapshotProgress>,
}

impl Snapshotter {
    /// Opens the snapshot session and looks up each table's key and size.
    pub async fn open(
        uri: &str,
        targets: Vec<SnapshotTarget<'_>>,
        chunk_rows: usize,
        metrics: crate::metrics::Metrics,
    ) -> Result<Snapshotter, SourceError> {
        let mut conn = catalog::connect(uri).await?;
        // Text output exactly as the replication session's.
        catalog::set_text_output(&mut conn, "the snapshot session").await?;
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
            .fetch_all(&mut conn)
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
            .fetch_one(&mut conn)
            .await
            .map_err(|e| errors::sql(&format!("estimating the size of {}", t.pg), &e))?;
            tables.push(TableSnapshot {
                table: t.table,
                pg: t.pg.clone(),
                plan_table: t.plan_table.to_vec(),
                key,
                columns: t.columns,
                progress,
                copied: 0,
                estimated: estimated as u64,
            });
        }
        for t in &tables {
            tracing::info!(table = %t.pg, state = t.progress.state(), estimated_rows = t.estimated, "initial snapshot");
            publish(&metrics, t, false);
        }
        Ok(Snapshotter {
            conn: Some(conn),
            tables,
            chunk_rows: chunk_rows.max(1),
            run: uuid::Uuid::new_v4().simple().to_string(),
            next_chunk: 0,
            terminal: std::io::stderr().is_terminal(),
            window_pause: test_window_pause(),
            metrics,
        })
    }

    /// The first table whose copy is not complete.
    pub fn pending(&self) -> Option<usize> {
        self.tables.iter().position(|t| !t.progress.is_complete())
    }

    /// True once every table is copied.
    pub fn all_complete(&self) -> bool {
        self.pending().is_none()
    }

    /// Each table's progress (what the next batch commits).
    pub fn progress(&self) -> Vec<(Vec<String>, SnapshotProgress)> {
        self.tables
            .iter()
            .map(|t| (t.plan_table.clone(), t.progress.clone()))
            .collect()
    }

    /// Writes the low watermark, reads the next chunk of table `i`, writes
    /// the high watermark.
    pub async fn read_chunk(&mut self, i: usize) -> Result<Chunk, SourceError> {
        self.next_chunk += 1;
        let low = format!("low:{}:{}", self.run, self.next_chunk);
        let high = format!("high:{}:{}", self.run, self.next_chunk);
        let sql = self.chunk_sql(i, self.chunk_rows);
        let pg = self.tables[i].pg.clone();
        let pause = self.window_pause;
        let conn = self.session(&pg)?;
        emit(conn, &low).await?;
        // The simple query protocol: values arrive as text, produced by the
        // same output functions pgoutput uses.
        let result = Executor::fetch_all(&mut *conn, sqlx::raw_sql(&sql))
            .await
            .map_err(|e| errors::sql(&format!("reading a snapshot chunk of {pg}"), &e))?;
        if let Some(pause) = pause {
            // Tests widen the window so live changes land inside it.
            tokio::time::sleep(pause).await;
        }
        emit(conn, &high).await?;
        self.chunk(i, &result, low, high, self.chunk_rows)
    }

    /// Preview: the first `limit` rows the next chunk of table `i` would
    /// hold, by the chunk's own `SELECT` and nothing else (no watermark is
    /// written, nothing is recorded as copied).
    pub async fn peek_rows(&mut self, i: usize, limit: usize) -> Result<Chunk, SourceError> {
        let sql = self.chunk_sql(i, limit);
        let pg = self.tables[i].pg.clone();
        let conn = self.session(&pg)?;
        let result = Executor::fetch_all(&mut *conn, sqlx::raw_sql(&sql))
            .await
            .map_err(|e| errors::sql(&format!("reading the first rows of {pg}"), &e))?;
        self.chunk(i, &result, String::new(), String::new(), limit)
    }

    /// The snapshot session, while it is open.
    fn session(&mut self, pg: &PgTable) -> Result<&mut PgConnection, SourceError> {
        self.conn.as_mut().ok_or_else(|| {
            SourceError::new(format!(
                "internal: a chunk of {pg} was asked for after the snapshot session closed"
            ))
        })
    }

    /// The `SELECT` of table `i`'s next `limit` rows in key order, after
    /// the last key copied.
    fn chunk_sql(&self, i: usize, limit: usize) -> String {
        let t = &self.tables[i];
        let after = match &t.progress {
            SnapshotProgress::InProgress { after } => after.clone(),
            _ => None,
        };
        let columns: Vec<String> = t.columns.iter().map(|c| quote_ident(c)).collect();
        let order: Vec<String> = t.key.iter().map(|k| quote_ident(&k.name)).collect();
        let filter = match &after {
            None => String::new(),
            Some(values) => {
                let bounds: Vec<String> = values
                    .iter()
                    .zip(&t.key)
                    .map(|(v, k)| format!("{}::{}", literal(v), k.type_name))
                    .collect();
                format!(" WHERE ({}) > ({})", order.join(", "), bounds.join(", "))
            }
        };
        format!(
            "SELECT {} FROM {}{filter} ORDER BY {} LIMIT {limit}",
            columns.join(", "),
            t.pg.quoted(),
            order.join(", "),
        )
    }

    /// A chunk of table `i` from its `SELECT`'s rows (`limit` asked for).
    fn chunk(
        &self,
        i: usize,
        result: &[sqlx::postgres::PgRow],
        low: String,
        high: String,
        limit: usize,
    ) -> Result<Chunk, SourceError> {
        let t = &self.tables[i];
        let pg = &t.pg;
        let key_indexes = t.key_indexes();
        let mut rows = Vec::with_capacity(result.len());
        let mut keys = Vec::with_capacity(result.len());
        for r in result {
            let mut values = Vec::with_capacity(t.columns.len());
            for (c, name) in t.columns.iter().enumerate() {
                let fail = |e: &dyn std::fmt::Display| {
                    SourceError::new(format!("{pg}: snapshot column {name}: {e}"))
                };
                let raw = r.try_get_raw(c).map_err(|e| fail(&e))?;
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
            snapshot: i,
            low,
            high,
            last: rows.len() < limit,
            rows,
            keys,
            last_key,
        })
    }

    /// The stream reached the chunk's high watermark: records the progress
    /// the emitted rows carry.
    pub fn chunk_done(&mut self, chunk: &Chunk, emitted: usize) {
        let t = &mut self.tables[chunk.snapshot];
        t.copied += emitted as u64;
        t.progress = match (&chunk.last_key, chunk.last) {
            (_, true) | (None, _) => SnapshotProgress::Complete,
            (Some(k), false) => SnapshotProgress::InProgress {
                after: Some(k.clone()),
            },
        };
        publish(&self.metrics, t, self.terminal);
        if t.progress.is_complete() {
            tracing::info!(table = %t.pg, rows = t.copied, "initial snapshot complete");
        }
    }

    /// Closes the snapshot session.
    pub async fn close(mut self) {
        if let Some(conn) = self.conn.take() {
            catalog::close(conn).await;
        }
    }

    /// Closes the snapshot session once every table is copied.
    pub async fn release_when_complete(&mut self) {
        if self.all_complete()
            && let Some(conn) = self.conn.take()
        {
            catalog::close(conn).await;
        }
    }
}

/// A SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

async fn emit(conn: &mut PgConnection, content: &str) -> Result<(), SourceError> {
    sqlx::query("SELECT pg_logical_emit_message(false, $1, $2)")
        .bind(WATERMARK_PREFIX)
        .bind(content)
        .execute(&mut *conn)
        .await
        .map_err(|e| errors::sql("writing a snapshot watermark", &e))?;
    Ok(())
}

/// The pause `URUTAU_TEST_SNAPSHOT_WINDOW_MS` asks for, in builds with the
/// `fault-injection` feature (the test suite's); never in a release.
fn test_window_pause() -> Option<std::time::Duration> {
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
/// terminal.
fn publish(metrics: &crate::metrics::Metrics, t: &TableSnapshot, terminal: bool) {
    let done = t.progress.is_complete();
    metrics.snapshot_progress(&t.pg.to_string(), t.copied, t.estimated, done);
    if terminal {
        let pct = if t.estimated > 0 {
            format!(
                " ({:.0}%)",
                (t.copied as f64 / t.estimated as f64 * 100.0).min(100.0)
            )
        } else {
            String::new()
        };
        eprint!(
            "\rsnapshot {}: {} / ~{} rows{pct}{}",
            t.pg,
            t.copied,
            t.estimated,
            if done { " done\n" } else { "" }
        );
    }
}

/// A chunk waiting for its high watermark, and the keys of its table that
/// live changes touched inside the window, collected by the stream between
/// the watermarks.
pub struct Window {
    pub chunk: Chunk,
    /// The stream's index of the chunk's table.
    pub table: usize,
    /// The schema indexes of the table's key columns.
    pub key: Vec<usize>,
    /// The low watermark went by: changes now count.
    pub open: bool,
    pub touched: HashSet<Vec<u8>>,
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

    #[test]
    fn literals_double_quotes() {
        assert_eq!(literal("o'brien"), "'o''brien'");
    }
}
