//! Table maintenance, in process: compaction (see [`super::compaction`]),
//! snapshot expiry and orphan cleanup.
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
//! pass until its next turn. The spec's order holds: compaction, then
//! expiry, then orphan cleanup, so the files compaction and expiry
//! dereference are cleaned in the same turn.
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
//!
//! Orphan cleanup: files under the table's `data/` and `metadata/`
//! directories that no metadata file, manifest list or manifest of the
//! table references (a commit that lost a conflict, metadata files that
//! fell out of the metadata log, files of expired snapshots), and that are
//! older than `older_than` — the window that protects a file another
//! writer has written but not committed yet. A directory holding a table
//! of its own (a `metadata/` with a metadata file) is never entered. Local
//! warehouses only in this build: the storage layer lists no object store.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use iceberg::spec::{TableMetadata, TableMetadataBuildResult};
use iceberg::table::Table;
use urutau_planner::options::{parse_duration, parse_size};
use urutau_planner::sink::SinkError;

use super::durable::local_path;
use super::{commit, io_error};

/// The maintenance a sink's options ask for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Maintenance {
    /// Compaction, when configured.
    pub compaction: Option<Compaction>,
    /// Snapshot expiry, when configured.
    pub expiry: Option<SnapshotExpiry>,
    /// Orphan cleanup, when configured.
    pub orphans: Option<OrphanCleanup>,
}

/// When and how the table is compacted.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// Time between passes over one table.
    pub interval: Duration,
    /// Data files are written up to this size; smaller ones are candidates.
    pub target_file_size: u64,
    /// Candidates (small data files and delete files) a pass needs.
    pub min_input_files: usize,
}

/// How orphan files are removed.
#[derive(Debug, Clone, PartialEq)]
pub struct OrphanCleanup {
    /// Time between passes over one table.
    pub interval: Duration,
    /// Only files last modified longer ago than this are orphans.
    pub older_than: Duration,
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
    /// take the defaults: compaction every 5m into 512Mi files once 5 files
    /// are candidates; expiry every 10m, keep the newest 1, expire after
    /// 7d; orphan cleanup every 1h, of files older than 72h).
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
        if !given("compaction") && !given("snapshot_expiry") && !given("orphan_cleanup") {
            return Err(
                "maintenance_enabled = true but no maintenance is configured; set maintenance_compaction_*, maintenance_snapshot_expiry_* or maintenance_orphan_cleanup_*"
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
        let compaction = match given("compaction") {
            false => None,
            true => Some(Compaction {
                interval: duration("maintenance_compaction_interval", Duration::from_secs(300))?,
                target_file_size: match get("maintenance_compaction_target_file_size") {
                    Some(text) => parse_size(&text)
                        .map_err(|e| format!("maintenance_compaction_target_file_size: {e}"))?,
                    None => 512 << 20,
                },
                min_input_files: match get("maintenance_compaction_min_input_files") {
                    Some(text) => text.parse::<usize>().ok().filter(|n| *n >= 2).ok_or_else(|| {
                        format!("maintenance_compaction_min_input_files: `{text}` is not a count >= 2")
                    })?,
                    None => 5,
                },
            }),
        };
        let expiry = match given("snapshot_expiry") {
            false => None,
            true => Some(SnapshotExpiry {
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
        };
        let orphans = match given("orphan_cleanup") {
            false => None,
            true => Some(OrphanCleanup {
                interval: duration(
                    "maintenance_orphan_cleanup_interval",
                    Duration::from_secs(3600),
                )?,
                older_than: duration(
                    "maintenance_orphan_cleanup_older_than",
                    Duration::from_secs(72 * 3600),
                )?,
            }),
        };
        Ok(Maintenance {
            compaction,
            expiry,
            orphans,
        })
    }
}

impl Maintenance {
    /// The passes that run, for `plan --explain`
    /// (`maintenance=[compaction every 5m, ...]`); `None` when none.
    pub fn describe(&self) -> Option<String> {
        let secs = |d: Duration| humantime(d);
        let mut parts = Vec::new();
        if let Some(c) = &self.compaction {
            parts.push(format!(
                "compaction every {} (>= {} files, {} bytes)",
                secs(c.interval),
                c.min_input_files,
                c.target_file_size
            ));
        }
        if let Some(e) = &self.expiry {
            parts.push(format!(
                "snapshot expiry every {} (keep {}, max age {})",
                secs(e.interval),
                e.retain_last,
                secs(e.max_age)
            ));
        }
        if let Some(o) = &self.orphans {
            parts.push(format!(
                "orphan cleanup every {} (older than {})",
                secs(o.interval),
                secs(o.older_than)
            ));
        }
        (!parts.is_empty()).then(|| format!("maintenance=[{}]", parts.join(", ")))
    }
}

/// `90s` -> `1m30s`: durations as a pipeline file writes them.
fn humantime(d: Duration) -> String {
    let mut s = d.as_secs();
    if s == 0 {
        return format!("{}ms", d.as_millis());
    }
    let mut out = String::new();
    for (unit, n) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if s >= n {
            out.push_str(&format!("{}{unit}", s / n));
            s %= n;
        }
    }
    out
}

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

/// Every file the table's metadata references, as local paths: the current
/// metadata file and those in the metadata log, statistics files, and per
/// kept snapshot its manifest list, the manifests in it and the live files
/// those list (an entry marked deleted is a file that snapshot no longer
/// reads: once no kept snapshot lists it live, it is an orphan).
pub async fn referenced_files(table: &Table) -> Result<HashSet<PathBuf>, SinkError> {
    let err = io_error("listing the table's files");
    let md = table.metadata();
    let mut paths: Vec<String> = md
        .metadata_log()
        .iter()
        .map(|m| m.metadata_file.clone())
        .collect();
    paths.push(table.metadata_location_result().map_err(&err)?.to_string());
    // Statistics another engine may have written beside the metadata.
    paths.extend(md.statistics_iter().map(|s| s.statistics_path.clone()));
    paths.extend(
        md.partition_statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    let mut manifests = HashSet::new();
    for snapshot in md.snapshots() {
        paths.push(snapshot.manifest_list().to_string());
        let list = table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(&err)?;
        for m in list.entries() {
            if manifests.insert(m.manifest_path.clone()) {
                let manifest = m.load_manifest(table.file_io()).await.map_err(&err)?;
                paths.extend(
                    manifest
                        .entries()
                        .iter()
                        .filter(|e| e.is_alive())
                        .map(|e| e.file_path().to_string()),
                );
            }
        }
    }
    paths.extend(manifests);
    paths
        .iter()
        .map(|p| {
            local_path(p).ok_or_else(|| {
                SinkError::Io(format!(
                    "orphan cleanup needs a local warehouse; the table references {p}"
                ))
            })
        })
        .collect()
}

/// Files under `table_dir`'s `data/` and `metadata/` that `referenced`
/// does not hold and that were last modified before `cutoff`.
///
/// Refuses (an error, nothing to delete) when the directory is not this
/// table's alone — a metadata file of another table (`table_uuid`
/// differs: two catalogs can place same-named tables in one directory) —
/// or when a referenced file under it is missing, which would mean the
/// referenced paths do not name the files on disk.
pub fn orphan_files(
    table_dir: &Path,
    table_uuid: &str,
    referenced: &HashSet<PathBuf>,
    cutoff: SystemTime,
) -> Result<Vec<PathBuf>, SinkError> {
    if let Some(missing) = referenced
        .iter()
        .find(|p| p.starts_with(table_dir) && !p.exists())
    {
        return Err(SinkError::Io(format!(
            "the table references {}, which is not there; not cleaning",
            missing.display()
        )));
    }
    let mut found = Vec::new();
    let mut pending: Vec<PathBuf> = ["data", "metadata"]
        .iter()
        .map(|d| table_dir.join(d))
        .filter(|d| d.is_dir())
        .collect();
    while let Some(dir) = pending.pop() {
        let read = |e: std::io::Error| SinkError::Io(format!("listing {}: {e}", dir.display()));
        for entry in std::fs::read_dir(&dir).map_err(read)? {
            let entry = entry.map_err(read)?;
            let path = entry.path();
            let meta = entry.metadata().map_err(read)?;
            if meta.is_dir() {
                if !holds_a_table(&path) {
                    pending.push(path);
                }
            } else if meta.is_file() && !referenced.contains(&path) {
                if let Some(other) = foreign_table(&path, table_uuid) {
                    return Err(SinkError::Io(format!(
                        "{} belongs to another table ({other}) in the same directory; not cleaning",
                        path.display()
                    )));
                }
                if meta.modified().map_err(read)? < cutoff {
                    found.push(path);
                }
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The uuid of the table `path` is the metadata file of, when it is one
/// and not `table_uuid`'s. (An unreadable metadata file counts as another
/// table's: better not to clean than to guess.)
fn foreign_table(path: &Path, table_uuid: &str) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if !name.ends_with(".metadata.json") {
        return None;
    }
    let uuid = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("table-uuid")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "unreadable".to_string());
    (uuid != table_uuid).then_some(uuid)
}

/// Whether `dir` is another table's root (a `metadata/` directory with a
/// metadata file in it): never cleaned as part of this table.
fn holds_a_table(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("metadata")).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.ends_with(".metadata.json"))
        })
    })
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
        assert_eq!(m.orphans, None);
        let m = Maintenance::from_options(options(&[
            ("maintenance_enabled", "true"),
            ("maintenance_orphan_cleanup_older_than", "1h"),
        ]))
        .unwrap();
        assert_eq!(m.expiry, None);
        assert_eq!(m.compaction, None);
        assert_eq!(
            m.orphans,
            Some(OrphanCleanup {
                interval: Duration::from_secs(3600),
                older_than: Duration::from_secs(3600),
            })
        );
    }

    #[test]
    fn orphans_are_unreferenced_old_files_outside_other_tables() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        for d in ["data/day=1", "metadata", "data/nested/metadata", "other"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        let files = [
            "data/day=1/kept.parquet",
            "data/day=1/stray.parquet",
            "metadata/v1.metadata.json",
            "metadata/stray.avro",
            "data/nested/metadata/v1.metadata.json",
            "data/nested/x.parquet",
            "other/stray.parquet",
        ];
        for f in files {
            std::fs::write(t.join(f), "x").unwrap();
        }
        let referenced: HashSet<PathBuf> = ["data/day=1/kept.parquet", "metadata/v1.metadata.json"]
            .iter()
            .map(|f| t.join(f))
            .collect();
        let later = SystemTime::now() + Duration::from_secs(60);
        assert_eq!(
            orphan_files(t, "u1", &referenced, later).unwrap(),
            vec![
                t.join("data/day=1/stray.parquet"),
                t.join("metadata/stray.avro")
            ],
            "unreferenced files in data/ and metadata/, never another table's"
        );
        let earlier = SystemTime::now() - Duration::from_secs(60);
        assert!(
            orphan_files(t, "u1", &referenced, earlier)
                .unwrap()
                .is_empty(),
            "young files are kept"
        );
        // Another table's metadata file in the directory: nothing is
        // cleaned, however old.
        std::fs::write(
            t.join("metadata/v9.metadata.json"),
            r#"{"table-uuid": "u2"}"#,
        )
        .unwrap();
        let e = orphan_files(t, "u1", &referenced, later).unwrap_err();
        assert!(e.to_string().contains("another table (u2)"), "{e}");
        std::fs::remove_file(t.join("metadata/v9.metadata.json")).unwrap();
        // A referenced file that is not there: the paths do not name the
        // files on disk; nothing is cleaned.
        let mut gone = referenced.clone();
        gone.insert(t.join("data/day=1/gone.parquet"));
        let e = orphan_files(t, "u1", &gone, later).unwrap_err();
        assert!(e.to_string().contains("not there"), "{e}");
    }

    #[test]
    fn empty_or_invalid_settings_are_errors() {
        let e = Maintenance::from_options(options(&[
            ("maintenance_enabled", "true"),
            ("maintenance_compaction_min_input_files", "1"),
        ]))
        .unwrap_err();
        assert!(e.contains("min_input_files"), "{e}");
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
