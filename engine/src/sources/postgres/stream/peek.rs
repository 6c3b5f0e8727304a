//! A Postgres source read for a preview: nothing is created, consumed or
//! acknowledged.
//!
//! What a run would read first, read another way:
//! - the slot's backlog by `pg_logical_slot_peek_binary_changes` (the
//!   slot's `confirmed_flush_lsn` and `restart_lsn` do not move; a slot
//!   that a run is streaming from is refused, as the server would), decoded
//!   by the stream's own [`Assembler`], so each change becomes the same row
//!   a run builds;
//! - then, for each table whose initial snapshot is not complete, the
//!   first rows of its next chunk by the chunk's own `SELECT ... ORDER BY
//!   key LIMIT n`, without the watermarks a run writes.
//!
//! That is a run's order: a run's first chunk waits for its high watermark,
//! written after everything the slot already holds. No slot, publication
//! or replica identity is created or changed; when the slot does not exist
//! yet, only the snapshot rows are shown (a run would create the slot now
//! and stream what comes after).
//!
//! The backlog is peeked whole transactions at a time, `limit`-sized
//! first and larger while some table has fewer than `limit` changes after
//! the position its sinks hold (a peek always starts at the slot's
//! confirmed position, which may be behind the sinks).

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::Row;
use sqlx::postgres::PgConnection;

use super::{Assembler, PG_EPOCH_MICROS, StreamCfg};
use crate::position::Position;
use crate::sources::postgres::catalog::{self, quote_ident};
use crate::sources::postgres::pgoutput::{self, Message};
use crate::sources::postgres::position::LsnPosition;
use crate::sources::postgres::snapshot::{self, Snapshotter};
use crate::sources::{ChangeSource, OpenArgs, SourceBatch, SourceError};

/// The preview's source: reads everything at the first batch asked for.
pub struct PgPeek {
    cfg: Option<StreamCfg>,
    limit: u64,
    batches: VecDeque<SourceBatch>,
}

/// A preview of at most `limit` changes per table.
pub fn open(args: OpenArgs<'_>, limit: u64) -> Result<PgPeek, SourceError> {
    Ok(PgPeek {
        cfg: Some(StreamCfg::from_args(&args)?),
        limit: limit.max(1),
        batches: VecDeque::new(),
    })
}

#[async_trait]
impl ChangeSource for PgPeek {
    async fn next_batch(&mut self) -> Result<Option<SourceBatch>, SourceError> {
        if let Some(cfg) = self.cfg.take() {
            self.batches.extend(read(cfg, self.limit).await?);
        }
        Ok(self.batches.pop_front())
    }

    /// Nothing is acknowledged: the slot stays where it is.
    async fn acknowledge(&mut self, _position: &Position) -> Result<(), SourceError> {
        Ok(())
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        Ok(())
    }
}

/// The slot as `pg_replication_slots` shows it.
struct SlotState {
    plugin: String,
    kind: String,
    same_database: bool,
    active_pid: Option<i32>,
}

/// Everything the preview shows, as one batch (`None`: nothing to show).
async fn read(cfg: StreamCfg, limit: u64) -> Result<Option<SourceBatch>, SourceError> {
    let mut conn = catalog::connect(&cfg.uri).await?;
    let result = read_on(&mut conn, &cfg, limit).await;
    catalog::close(conn).await;
    result
}

async fn read_on(
    conn: &mut PgConnection,
    cfg: &StreamCfg,
    limit: u64,
) -> Result<Option<SourceBatch>, SourceError> {
    // pgoutput renders values with the session's settings: the stream's.
    catalog::set_text_output(conn, "the preview session").await?;
    let start = cfg.start.unwrap_or(0);
    let mut a = match slot_state(conn, &cfg.slot).await? {
        Some(slot) => {
            check_slot(cfg, &slot)?;
            check_publication(conn, &cfg.publication, &cfg.slot).await?;
            wait_for_flush(conn).await?;
            peek_backlog(conn, cfg, limit, start).await?
        }
        None => {
            if let Some(p) = cfg.start {
                return Err(SourceError::new(format!(
                    "replication slot {} does not exist, but the sink holds position {}: a run would stop here (the changes after that position are gone); drop the slot's tables to start over",
                    cfg.slot,
                    LsnPosition(p)
                )));
            }
            tracing::info!(slot = %cfg.slot, "the slot does not exist yet: the preview shows the snapshot's first rows only");
            Assembler::new(cfg, cfg.tables.clone(), start)?
        }
    };
    if cfg.snapshot {
        // Snapshot rows come after everything the slot holds, as a run's
        // first chunk does: at the server's current position.
        let now = current_lsn(conn).await?;
        let at = now.max(start + 1).max(a.closed_end.unwrap_or(0));
        snapshot_rows(cfg, &mut a, limit, at).await?;
    }
    a.take_batch()
}

async fn slot_state(conn: &mut PgConnection, slot: &str) -> Result<Option<SlotState>, SourceError> {
    let row = sqlx::query(
        "SELECT plugin::text AS plugin, slot_type::text AS kind, active_pid,
                database IS NOT DISTINCT FROM current_database() AS same_database
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| SourceError::new(format!("reading replication slot {slot}: {e}")))?;
    Ok(row.map(|r| SlotState {
        plugin: r.get::<Option<String>, _>("plugin").unwrap_or_default(),
        kind: r.get("kind"),
        same_database: r.get::<Option<bool>, _>("same_database").unwrap_or(false),
        active_pid: r.get("active_pid"),
    }))
}

/// A slot the preview can peek at: this database's, pgoutput, idle.
fn check_slot(cfg: &StreamCfg, slot: &SlotState) -> Result<(), SourceError> {
    let name = &cfg.slot;
    if slot.kind != "logical" || slot.plugin != "pgoutput" {
        return Err(SourceError::new(format!(
            "replication slot {name} is a {} slot with plugin `{}`; this source needs a logical pgoutput slot",
            slot.kind, slot.plugin
        )));
    }
    if !slot.same_database {
        return Err(SourceError::new(format!(
            "replication slot {name} belongs to another database than the source uri's"
        )));
    }
    if let Some(pid) = slot.active_pid {
        return Err(SourceError::new(format!(
            "replication slot {name} is in use by process {pid} (a running pipeline?): a preview peeks at a slot only while nothing streams from it; stop the run first"
        )));
    }
    Ok(())
}

async fn check_publication(
    conn: &mut PgConnection,
    publication: &str,
    slot: &str,
) -> Result<(), SourceError> {
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_publication WHERE pubname = $1")
        .bind(publication)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| SourceError::new(format!("reading publications: {e}")))?;
    if exists.is_none() {
        return Err(SourceError::new(format!(
            "replication slot {slot} exists but publication {publication} does not: a preview does not create it; run the pipeline once, or set `publication`"
        )));
    }
    Ok(())
}

/// The slot's backlog decoded, peeked until every table has `limit`
/// changes after `start` or the backlog ends.
async fn peek_backlog(
    conn: &mut PgConnection,
    cfg: &StreamCfg,
    limit: u64,
    start: u64,
) -> Result<Assembler, SourceError> {
    // Rows of output per change: Begin, Relation, the change, Commit.
    let mut ask: i64 = (limit.saturating_mul(2).saturating_add(16)).min(i32::MAX as u64) as i64;
    loop {
        let rows = sqlx::query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2::int4,
                 'proto_version', '1', 'publication_names', $3)",
        )
        .bind(&cfg.slot)
        .bind(ask)
        .bind(quote_ident(&cfg.publication))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| {
            SourceError::new(format!(
                "peeking at replication slot {}: {}",
                cfg.slot,
                urutau_planner::options::redact_text(&e.to_string())
            ))
        })?;
        let exhausted = (rows.len() as i64) < ask;
        let mut a = Assembler::new(cfg, cfg.tables.clone(), start)?;
        a.peeking = true;
        let mut counted = vec![0u64; a.builders.len()];
        for r in &rows {
            let data: Vec<u8> = r.get("data");
            let m = pgoutput::decode(&Bytes::from(data))
                .map_err(|e| SourceError::new(e.to_string()))?;
            match m {
                Message::Begin {
                    commit_time_micros, ..
                } => {
                    a.in_tx = true;
                    a.commit_ts = Some(commit_time_micros + PG_EPOCH_MICROS);
                }
                Message::Commit { end_lsn, .. } => {
                    if end_lsn > start {
                        for (c, b) in counted.iter_mut().zip(&a.builders) {
                            *c += b.context.open_rows() as u64;
                        }
                    }
                    a.commit(end_lsn);
                }
                m => {
                    if let Message::Relation(rel) = &m {
                        a.prepare_relation(&cfg.uri, rel).await?;
                    }
                    a.change(m)?
                }
            }
        }
        if a.in_tx {
            return Err(SourceError::new(format!(
                "peeking at replication slot {}: the server returned a transaction without its commit",
                cfg.slot
            )));
        }
        if exhausted || counted.iter().all(|c| *c >= limit) || ask >= i32::MAX as i64 {
            return Ok(a);
        }
        ask = ask.saturating_mul(4).min(i32::MAX as i64);
    }
}

/// How long a preview waits for the WAL written before it to be flushed.
const FLUSH_WAIT: Duration = Duration::from_secs(3);

/// Waits (bounded) until the WAL written so far is flushed: logical
/// decoding reads flushed WAL only, and with `synchronous_commit = off` a
/// transaction committed just before the preview may not be flushed yet
/// (the WAL writer flushes within a few hundred milliseconds).
async fn wait_for_flush(conn: &mut PgConnection) -> Result<(), SourceError> {
    let read = |sql: &'static str| sqlx::query_scalar::<_, Option<String>>(sql);
    let target = read(
        "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_insert_lsn()::text END",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| SourceError::new(format!("reading the server's WAL position: {e}")))?;
    let Some(target) = target else {
        return Ok(());
    };
    let target = catalog::parse_lsn(&target)?;
    let deadline = Instant::now() + FLUSH_WAIT;
    loop {
        let flushed = read("SELECT pg_current_wal_flush_lsn()::text")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| SourceError::new(format!("reading the server's WAL position: {e}")))?;
        let flushed = flushed.as_deref().map(catalog::parse_lsn).transpose()?;
        if flushed.is_some_and(|f| f >= target) || Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The server's WAL position now.
async fn current_lsn(conn: &mut PgConnection) -> Result<u64, SourceError> {
    let text: String = sqlx::query_scalar(
        "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| SourceError::new(format!("reading the server's WAL position: {e}")))?;
    catalog::parse_lsn(&text)
}

/// The first `limit` rows of each table's next snapshot chunk, appended
/// at `at`.
async fn snapshot_rows(
    cfg: &StreamCfg,
    a: &mut Assembler,
    limit: u64,
    at: u64,
) -> Result<(), SourceError> {
    let targets = cfg.snapshot_targets(|t| {
        cfg.resume_snapshots
            .get(&t.plan_table)
            .is_none_or(|p| !p.is_complete())
    });
    if targets.is_empty() {
        return Ok(());
    }
    let rows = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .min(i64::MAX as usize);
    let snap = Snapshotter::open(&cfg.uri, targets, cfg.metrics.clone()).await?;
    let none = HashSet::new();
    for chunk in snapshot::reader::peek(&cfg.uri, &snap.read_plans(), rows).await? {
        a.snapshot_rows(snap.tables[chunk.snapshot].table, &chunk, &none, &[], at)?;
    }
    Ok(())
}
