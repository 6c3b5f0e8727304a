//! Table maintenance settings: which passes run and how — compaction
//! ([`super::compaction`]), snapshot expiry ([`super::expiry`]) and orphan
//! cleanup ([`super::orphans`]).
//!
//! The single-process runner has no maintenance worker to launch (the
//! spec's collapsed mode), so the pass runs in the sink, right after one of
//! the table's commits and under the same per-table lock: it never races
//! that table's commits, and a conflict with another writer just skips the
//! pass until its next turn. The spec's order holds: compaction, then
//! expiry, then orphan cleanup, so the files compaction and expiry
//! dereference are cleaned in the same turn.

use std::time::Duration;

use urutau_planner::options::{parse_duration, parse_size};

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
        let mut parts = Vec::new();
        if let Some(c) = &self.compaction {
            parts.push(format!(
                "compaction every {} (>= {} files, {} bytes)",
                humantime(c.interval),
                c.min_input_files,
                c.target_file_size
            ));
        }
        if let Some(e) = &self.expiry {
            parts.push(format!(
                "snapshot expiry every {} (keep {}, max age {})",
                humantime(e.interval),
                e.retain_last,
                humantime(e.max_age)
            ));
        }
        if let Some(o) = &self.orphans {
            parts.push(format!(
                "orphan cleanup every {} (older than {})",
                humantime(o.interval),
                humantime(o.older_than)
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
