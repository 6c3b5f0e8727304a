//! Partitioned tables (`workers = N`): the key space is split among N
//! owners by a hash of the key, and each owner records its own coordinate
//! in `<table>_urutau_position (owner, position, seq)`.
//!
//! An owner's data and its coordinate are two statements: a crash between
//! them leaves the rows durable and the coordinate behind, and the restart
//! replays from there. Upsert collapses the replay onto the same rows
//! (`ReplacingMergeTree(seq)`); append has no key to collapse on, so the
//! rows of that window land twice — at-least-once, exactly as the spec's
//! delivery guarantees say; a table that must not duplicate uses upsert,
//! or append-idempotent, whose copies of a change share its transport
//! coordinate, the table's `ReplacingMergeTree` key: `FINAL` reads them
//! once, and merges (or `urutau clickhouse cleanup`) remove them.
//!
//! Resume is the minimum safe position over the owners: every owner must
//! have a coordinate (an incomplete owner set is an error, not a guess), and
//! the table resumes from the one that is furthest behind. Batches take N
//! consecutive `seq` numbers (owner `o` writes `base + o`), so the owner
//! with the lowest `seq` is the one furthest behind, without parsing
//! positions.
//!
//! This build commits the owners of a batch one after another from one
//! process; the storage contract is the one parallel workers share.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow_row::{RowConverter, SortField};
use clickhouse::Client;
use serde_json::Value;
use urutau_planner::sink::{SinkBatch, SinkError};
use urutau_planner::target::TargetTable;

use super::ddl::{ident, literal};
use super::{TableState, as_u64, execute, insert, query_rows};

/// The suffix of the side table holding the owners' coordinates.
pub const SIDE_SUFFIX: &str = "_urutau_position";

/// The owners of one partitioned table, as found at start.
#[derive(Debug)]
pub struct Owners {
    workers: u32,
    side: String,
    /// owner -> (position, seq), the newest of each.
    recorded: BTreeMap<u32, (String, u64)>,
    /// Rows the data table held at start, and their highest `seq`.
    data_rows: u64,
    data_max_seq: u64,
    table: String,
}

impl Owners {
    /// Creates the side table when absent and reads every owner's
    /// coordinate.
    pub async fn prepare(
        client: &Client,
        database: &str,
        table: &str,
        workers: u32,
        data_rows: u64,
        data_max_seq: u64,
    ) -> Result<Owners, SinkError> {
        let side = format!("{table}{SIDE_SUFFIX}");
        execute(
            client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {}.{} (`owner` UInt32, `position` String, `seq` UInt64) ENGINE = ReplacingMergeTree(`seq`) ORDER BY `owner`",
                ident(database),
                ident(&side)
            ),
        )
        .await?;
        let rows = query_rows(
            client,
            &format!(
                "SELECT `owner` AS o, argMax(`position`, `seq`) AS last_position, max(`seq`) AS max_seq FROM {}.{} GROUP BY `owner` ORDER BY `owner`",
                ident(database),
                ident(&side)
            ),
        )
        .await?;
        let recorded = rows
            .iter()
            .map(|r| {
                (
                    as_u64(r.get("o")) as u32,
                    (
                        r.get("last_position")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        as_u64(r.get("max_seq")),
                    ),
                )
            })
            .collect();
        Ok(Owners {
            workers,
            side,
            recorded,
            data_rows,
            data_max_seq,
            table: format!("{database}.{table}"),
        })
    }

    /// The highest `seq` any owner recorded.
    pub fn max_seq(&self) -> u64 {
        self.recorded.values().map(|(_, s)| *s).max().unwrap_or(0)
    }

    /// The minimum safe position over the owners; `None` for a table no
    /// owner has written yet. An incomplete owner set is an error.
    pub fn resume_position(&self) -> Result<Option<String>, SinkError> {
        if self.recorded.is_empty() {
            if self.data_rows > 0 && self.data_max_seq <= u64::from(self.workers) {
                // Rows of the first commit only, written before any owner
                // recorded its coordinate: nothing is committed yet.
                tracing::warn!(table = %self.table, rows = self.data_rows, "the first commit was interrupted before any owner recorded its coordinate: resuming from the beginning");
                return Ok(None);
            }
            if self.data_rows > 0 {
                return Err(SinkError::TableMismatch(format!(
                    "{} holds {} rows but no owner coordinates in {}: it was not written with workers = {}; resuming would be a guess",
                    self.table, self.data_rows, self.side, self.workers
                )));
            }
            return Ok(None);
        }
        let expected: Vec<u32> = (0..self.workers).collect();
        let found: Vec<u32> = self.recorded.keys().copied().collect();
        // A crash inside the table's very first commit (its owners write
        // `seq` 1..=workers): an owner without a coordinate has committed
        // nothing, so the table resumes from the beginning — what the
        // other owners hold again is replayed (collapsed by upsert and by
        // append-idempotent's coordinate; at-least-once for append).
        let first_commit = self.data_max_seq <= u64::from(self.workers)
            && self
                .recorded
                .iter()
                .all(|(o, (_, seq))| *o < self.workers && *seq <= u64::from(self.workers));
        if found != expected && first_commit {
            tracing::warn!(table = %self.table, owners = ?found, workers = self.workers, "the first commit was interrupted before every owner recorded its coordinate: resuming from the beginning");
            return Ok(None);
        }
        if found != expected {
            return Err(SinkError::TableMismatch(format!(
                "{}: the owner set in {} is {:?}, the route has workers = {} (owners {:?}); an incomplete owner set cannot be resumed safely",
                self.table, self.side, found, self.workers, expected
            )));
        }
        let lagging = self
            .recorded
            .values()
            .min_by_key(|(_, seq)| *seq)
            .map(|(p, _)| p.clone());
        Ok(lagging.filter(|p| !p.is_empty()))
    }

    fn record(&mut self, owner: u32, position: &str, seq: u64) {
        self.recorded.insert(owner, (position.to_string(), seq));
    }
}

/// The owner of every row: a stable hash (FNV-1a) of the key's row
/// encoding, modulo `workers`.
fn owners_of(
    rows: &RecordBatch,
    target: &TargetTable,
    workers: u32,
) -> Result<Vec<u32>, SinkError> {
    let keys: Vec<ArrayRef> = target
        .key_indices()
        .iter()
        .map(|i| Arc::clone(rows.column(*i)))
        .collect();
    if keys.is_empty() {
        // No key: owners by row number (append without a key).
        return Ok((0..rows.num_rows()).map(|i| (i as u32) % workers).collect());
    }
    let converter = RowConverter::new(
        keys.iter()
            .map(|a| SortField::new(a.data_type().clone()))
            .collect(),
    )
    .map_err(|e| SinkError::Io(format!("hashing keys: {e}")))?;
    let encoded = converter
        .convert_columns(&keys)
        .map_err(|e| SinkError::Io(format!("hashing keys: {e}")))?;
    Ok(encoded
        .iter()
        .map(|r| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in r.as_ref() {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            (h % u64::from(workers)) as u32
        })
        .collect())
}

/// Commits one batch owner by owner: each owner's rows (one insert), then
/// its coordinate; owners without rows advance their coordinates together
/// at the end.
pub async fn commit(
    s: &mut TableState,
    target: &TargetTable,
    batch: &SinkBatch,
    position: &str,
) -> Result<(), SinkError> {
    let workers = target.workers;
    let base = s.next_seq;
    let owner_of = owners_of(&batch.rows, target, workers)?;
    let side = format!("{}{SIDE_SUFFIX}", s.table);
    let mut idle = Vec::new();
    for owner in 0..workers {
        let seq = base + u64::from(owner);
        let mask: BooleanArray = owner_of.iter().map(|o| Some(*o == owner)).collect();
        if mask.true_count() == 0 {
            idle.push(owner);
            continue;
        }
        let rows = filter_record_batch(&batch.rows, &mask)
            .map_err(|e| SinkError::Io(format!("splitting by owner: {e}")))?;
        let deletes = arrow::compute::filter(&batch.deletes, &mask)
            .map_err(|e| SinkError::Io(format!("splitting by owner: {e}")))?;
        let deletes = deletes
            .as_any()
            .downcast_ref::<BooleanArray>()
            .cloned()
            .unwrap_or_else(|| BooleanArray::from(vec![false; rows.num_rows()]));
        let rows = insert::with_reserved(&rows, &deletes, position, seq)?;
        insert::insert_once(&s.client, &s.database, &s.table, &rows, seq).await?;
        record(s, &side, &[(owner, seq)], position).await?;
    }
    if !idle.is_empty() {
        let coords: Vec<(u32, u64)> = idle.iter().map(|o| (*o, base + u64::from(*o))).collect();
        record(s, &side, &coords, position).await?;
    }
    s.next_seq = base + u64::from(workers);
    s.committed = Some(position.to_string());
    s.progress = None;
    Ok(())
}

/// Writes owners' coordinates (one statement).
async fn record(
    s: &mut TableState,
    side: &str,
    coords: &[(u32, u64)],
    position: &str,
) -> Result<(), SinkError> {
    let values = coords
        .iter()
        .map(|(o, seq)| format!("({o}, {}, {seq})", literal(position)))
        .collect::<Vec<_>>()
        .join(", ");
    execute(
        &s.client,
        &format!(
            "INSERT INTO {}.{} (`owner`, `position`, `seq`) VALUES {values}",
            ident(&s.database),
            ident(side)
        ),
    )
    .await?;
    if let Some(o) = s.owners.as_mut() {
        for (owner, seq) in coords {
            o.record(*owner, position, *seq);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(workers: u32, recorded: &[(u32, &str, u64)]) -> Owners {
        Owners {
            workers,
            side: "t_urutau_position".into(),
            recorded: recorded
                .iter()
                .map(|(o, p, s)| (*o, (p.to_string(), *s)))
                .collect(),
            data_rows: 10,
            data_max_seq: 2,
            table: "db.t".into(),
        }
    }

    #[test]
    fn an_interrupted_first_commit_resumes_from_the_beginning() {
        // Owners 0 and 1 recorded the first batch (seq 1, 2); 2 and 3 never
        // committed anything.
        let o = owners(4, &[(0, "t:p0=5", 1), (1, "t:p0=5", 2)]);
        assert_eq!(o.resume_position().unwrap(), None);
        // Later, an owner missing is a loss of state: an error.
        let o = owners(4, &[(0, "t:p0=9", 5), (1, "t:p0=9", 6), (2, "t:p0=9", 7)]);
        assert!(o.resume_position().is_err());
        // An owner the route does not have: an error.
        let o = owners(2, &[(0, "5", 1), (3, "5", 2)]);
        assert!(o.resume_position().is_err());
        // Rows of the first commit, no coordinate yet: from the beginning.
        assert_eq!(owners(4, &[]).resume_position().unwrap(), None);
        // Rows of many commits and no coordinates: not written partitioned.
        let mut o = owners(4, &[]);
        o.data_max_seq = 30;
        assert!(o.resume_position().is_err());
        // Complete: the lagging owner.
        let o = owners(2, &[(0, "7", 3), (1, "5", 2)]);
        assert_eq!(o.resume_position().unwrap().as_deref(), Some("5"));
    }
}
