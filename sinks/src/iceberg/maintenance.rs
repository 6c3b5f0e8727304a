//! Table maintenance, in process: snapshot expiry.
//!
//! Every batch is a snapshot, so a long-running pipeline's table metadata
//! (which lists every snapshot) and its manifest lists grow without bound:
//! after a day of one commit a second the metadata file rewritten by each
//! commit holds 86,400 snapshots. Snapshot expiry removes the snapshots a
//! reader no longer needs and deletes their manifest lists.
//!
//! The single-process runner has no maintenance worker to launch (the
//! spec's collapsed mode), so the pass runs in the sink, right after one of
//! the table's commits and under the same per-table lock: it never races
//! that table's commits, and a conflict with another writer just skips the
//! pass until its next turn. Compaction and orphan cleanup are not in this
//! build; configuring them is an error, never a silent no-op.
//!
//! What expires: a snapshot no branch or tag points at, not among the
//! newest `retain_last` of the main branch, and older than `max_age`. The
//! table property `cdc.position` is untouched (resume stays O(1)); only the
//! summaries the ancestry walk-back would read go, which is why `max_age`
//! bounds how long a stopped pipeline can still fall back on them. Data
//! files, delete files and manifests stay: every commit's manifest list
//! carries the table's live manifests forward, so they are still
//! referenced; files only an expired snapshot referenced (off the branch,
//! after a rollback) are orphan cleanup's work.

use std::collections::HashSet;
use std::time::Duration;

use iceberg::spec::{TableMetadata, TableMetadataBuildResult};
use iceberg::table::Table;
use urutau_planner::options::parse_duration;
use urutau_planner::sink::SinkError;

use super::{commit, io_error};

/// The maintenance a sink's options ask for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Maintenance {
    /// Snapshot expiry, when configured.
    pub expiry: Option<SnapshotExpiry>,
}

/// How snapshots expire.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotExpiry {
    /// Time between passes over one table.
    pub interval: Duration,
    /// Snapshots of the main branch always kept, newest first.
    pub retain_last: usize,
    /// Older snapshots expire.
    pub max_age: Duration,
}

impl Maintenance {
    /// Reads the `maintenance_*` options (`get` returns an option's text).
    /// Nothing runs unless `maintenance_enabled = true`; then each
    /// sub-block runs only when one of its settings is given (the others
    /// take the defaults: every 10m, keep the newest 1, expire after 7d).
    pub fn from_options(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        if get("maintenance_enabled").as_deref() != Some("true") {
            return Ok(Maintenance::default());
        }
        let given = |prefix: &str| {
            [
                "interval",
                "target_file_size",
                "min_input_files",
                "retain_last",
                "max_age",
                "older_than",
            ]
            .iter()
            .any(|s| get(&format!("maintenance_{prefix}_{s}")).is_some())
        };
        for (prefix, what) in [
            ("compaction", "compaction"),
            ("orphan_cleanup", "orphan cleanup"),
        ] {
            if given(prefix) {
                return Err(format!(
                    "table maintenance: {what} is not in this build (snapshot expiry is); remove the maintenance_{prefix}_* settings rather than have them silently not run"
                ));
            }
        }
        if !given("snapshot_expiry") {
            return Err(
                "maintenance_enabled = true but no maintenance is configured; set maintenance_snapshot_expiry_* (compaction and orphan cleanup are not in this build)"
                    .to_string(),
            );
        }
        let duration = |name: &str, default: Duration| match get(name) {
            Some(text) => parse_duration(&text).map_err(|e| format!("{name}: {e}")),
            None => Ok(default),
        };
        let retain_last = match get("maintenance_snapshot_expiry_retain_last") {
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    format!("maintenance_snapshot_expiry_retain_last: `{text}` is not a count >= 1")
                })?,
            None => 1,
        };
        Ok(Maintenance {
            expiry: Some(SnapshotExpiry {
                interval: duration(
                    "maintenance_snapshot_expiry_interval",
                    Duration::from_secs(600),
                )?,
                retain_last,
                max_age: duration(
                    "maintenance_snapshot_expiry_max_age",
                    Duration::from_secs(7 * 86_400),
                )?,
            }),
        })
    }
}

/// The ids of the snapshots of `md` that expire at `now_ms`.
pub fn expired_snapshots(md: &TableMetadata, policy: &SnapshotExpiry, now_ms: i64) -> Vec<i64> {
    let mut kept: HashSet<i64> = ref_heads(md);
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
    ids
}

/// The snapshots branches and tags point at. (`TableMetadata` has no
/// public list of its refs; its serialized form does.)
fn ref_heads(md: &TableMetadata) -> HashSet<i64> {
    let mut heads: HashSet<i64> = md.current_snapshot_id().into_iter().collect();
    if let Ok(v) = serde_json::to_value(md)
        && let Some(refs) = v.get("refs").and_then(|r| r.as_object())
    {
        heads.extend(
            refs.values()
                .filter_map(|r| r.get("snapshot-id").and_then(|id| id.as_i64())),
        );
    }
    heads
}

/// New metadata for `table` without the snapshots `ids`.
pub fn build_expiry(table: &Table, ids: &[i64]) -> Result<TableMetadataBuildResult, SinkError> {
    let err = io_error("expiring snapshots");
    let current = table.metadata_location_result().map_err(&err)?.to_string();
    table
        .metadata()
        .clone()
        .into_builder(Some(current))
        .remove_snapshots(ids)
        .build()
        .map_err(&err)
}

/// The manifest lists of the snapshots `ids` in `md` (each snapshot has
/// its own, so once the snapshots are gone nothing references them).
pub fn manifest_lists(md: &TableMetadata, ids: &[i64]) -> Vec<String> {
    ids.iter()
        .filter_map(|id| md.snapshot_by_id(*id))
        .map(|s| s.manifest_list().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn disabled_unless_enabled() {
        let m =
            Maintenance::from_options(options(&[("maintenance_snapshot_expiry_retain_last", "3")]))
                .unwrap();
        assert_eq!(m, Maintenance::default());
    }

    #[test]
    fn expiry_settings_with_defaults() {
        let m = Maintenance::from_options(options(&[
            ("maintenance_enabled", "true"),
            ("maintenance_snapshot_expiry_max_age", "1h"),
        ]))
        .unwrap();
        assert_eq!(
            m.expiry,
            Some(SnapshotExpiry {
                interval: Duration::from_secs(600),
                retain_last: 1,
                max_age: Duration::from_secs(3600),
            })
        );
    }

    #[test]
    fn what_this_build_cannot_run_is_an_error() {
        for key in [
            "maintenance_compaction_interval",
            "maintenance_orphan_cleanup_older_than",
        ] {
            let e = Maintenance::from_options(options(&[
                ("maintenance_enabled", "true"),
                ("maintenance_snapshot_expiry_interval", "1m"),
                (key, "5m"),
            ]))
            .unwrap_err();
            assert!(e.contains("not in this build"), "{e}");
        }
        let e = Maintenance::from_options(options(&[("maintenance_enabled", "true")])).unwrap_err();
        assert!(e.contains("no maintenance is configured"), "{e}");
        let e = Maintenance::from_options(options(&[
            ("maintenance_enabled", "true"),
            ("maintenance_snapshot_expiry_retain_last", "0"),
        ]))
        .unwrap_err();
        assert!(e.contains("retain_last"), "{e}");
    }
}
