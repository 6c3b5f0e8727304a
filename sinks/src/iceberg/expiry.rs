//! Snapshot expiry: removes the snapshots a reader no longer needs.
//!
//! Every batch is a snapshot, so a long-running pipeline's table metadata
//! (which lists every snapshot) and its manifest lists grow without bound:
//! after a day of one commit a second the metadata file rewritten by each
//! commit holds 86,400 snapshots.
//!
//! What expires: a snapshot no branch or tag points at, not among the
//! newest `retain_last` of the main branch, and older than `max_age`. The
//! table property `cdc.position` is untouched (resume stays O(1)); only the
//! summaries the ancestry walk-back would read go, which is why `max_age`
//! bounds how long a stopped pipeline can still fall back on them. The
//! expired snapshots' manifest lists are deleted (each snapshot has its
//! own); data files, delete files and manifests stay. Most are still
//! referenced (every commit's list carries the live manifests forward),
//! but not all: files compaction replaced, and manifests a commit merged
//! away ([`super::manifest_merge`]), are read only by older snapshots.
//! Once those are expired, such files are orphan cleanup's work
//! ([`super::orphans`]), which is why a table with expiry should also
//! have orphan cleanup.

use std::collections::HashSet;

use iceberg::spec::{TableMetadata, TableMetadataBuildResult};
use iceberg::table::Table;
use urutau_planner::sink::SinkError;

use super::maintenance::SnapshotExpiry;
use super::{commit, io_error};

/// The ids of the snapshots of `md` that expire at `now_ms`.
pub fn expired_snapshots(
    md: &TableMetadata,
    policy: &SnapshotExpiry,
    now_ms: i64,
) -> Result<Vec<i64>, SinkError> {
    let mut kept: HashSet<i64> = ref_heads(md)?;
    kept.extend(
        commit::ancestry(md)
            .take(policy.retain_last)
            .map(|s| s.snapshot_id()),
    );
    let cutoff =
        now_ms.saturating_sub(i64::try_from(policy.max_age.as_millis()).unwrap_or(i64::MAX));
    let mut ids: Vec<i64> = md
        .snapshots()
        .filter(|s| !kept.contains(&s.snapshot_id()) && s.timestamp_ms() < cutoff)
        .map(|s| s.snapshot_id())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// The snapshots branches and tags point at. (`TableMetadata` has no
/// public list of its refs; its serialized form does.)
/// Unreadable refs are an error: expiring a snapshot a tag points at
/// would drop the tag.
fn ref_heads(md: &TableMetadata) -> Result<HashSet<i64>, SinkError> {
    let mut heads: HashSet<i64> = md.current_snapshot_id().into_iter().collect();
    let v = serde_json::to_value(md)
        .map_err(|e| SinkError::Io(format!("reading the table's refs: {e}")))?;
    match v.get("refs").and_then(|r| r.as_object()) {
        Some(refs) => heads.extend(
            refs.values()
                .filter_map(|r| r.get("snapshot-id").and_then(|id| id.as_i64())),
        ),
        None if md.snapshots().len() > 0 => {
            return Err(SinkError::Io(
                "the table's metadata lists no refs; not expiring snapshots".into(),
            ));
        }
        None => {}
    }
    Ok(heads)
}

/// New metadata for `table` without the snapshots `ids`.
pub fn build_expiry(table: &Table, ids: &[i64]) -> Result<TableMetadataBuildResult, SinkError> {
    commit::next_metadata(table)
        .and_then(|b| b.remove_snapshots(ids).build())
        .map_err(io_error("expiring snapshots"))
}

/// The manifest lists of the snapshots `ids` in `md` (each snapshot has
/// its own, so once the snapshots are gone nothing references them).
pub fn manifest_lists(md: &TableMetadata, ids: &[i64]) -> Vec<String> {
    ids.iter()
        .filter_map(|id| md.snapshot_by_id(*id))
        .map(|s| s.manifest_list().to_string())
        .collect()
}
