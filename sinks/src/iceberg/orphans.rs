//! Orphan cleanup: files under the table's `data/` and `metadata/`
//! directories that nothing a kept snapshot reads references (a commit
//! that lost a conflict, files compaction and expiry let go, metadata files
//! that fell out of the metadata log), and that are older than
//! `older_than` — the window that protects a file another writer has
//! written but not committed yet. A directory holding a table of its own
//! (a `metadata/` with a metadata file) is never entered, and a directory
//! shared with another table is not cleaned at all. Local warehouses only
//! in this build: the storage layer lists no object store.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use iceberg::table::Table;
use urutau_planner::sink::SinkError;

use super::commit::{alive_entries, current_metadata_location};
use super::durable::local_path;
use super::io_error;

/// Every file the table's metadata references, as local paths: the current
/// metadata file and those in the metadata log, statistics files, and per
/// kept snapshot its manifest list, the manifests in it and the live files
/// those list (an entry marked deleted is a file that snapshot no longer
/// reads: once no kept snapshot lists it live, it is an orphan).
pub async fn referenced_files(table: &Table) -> Result<HashSet<PathBuf>, SinkError> {
    let doing = "listing the table's files";
    let err = io_error(doing);
    let md = table.metadata();
    let mut paths: Vec<String> = md
        .metadata_log()
        .iter()
        .map(|m| m.metadata_file.clone())
        .collect();
    let current =
        current_metadata_location(table).map_err(|e| SinkError::Io(format!("{doing}: {e}")))?;
    paths.push(current.to_string());
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
                let live = alive_entries(table, m).await.map_err(&err)?;
                paths.extend(live.iter().map(|e| e.file_path().to_string()));
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
/// and not `table_uuid`'s. A metadata file that is not JSON is no table's
/// (none can read it): a writer killed while writing it leaves it cut
/// short, and counting it as another table's stopped every later cleanup
/// of the table. Like any orphan it goes only once older than the cutoff,
/// which keeps a file still being written. A JSON file without a uuid
/// counts as another table's: better not to clean than to guess.
fn foreign_table(path: &Path, table_uuid: &str) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if !name.ends_with(".metadata.json") {
        return None;
    }
    let json = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())?;
    let uuid = json
        .get("table-uuid")
        .and_then(|u| u.as_str())
        .map_or_else(|| "no table-uuid".to_string(), str::to_string);
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
    use std::time::Duration;

    use super::*;

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
        // A metadata file cut short (its writer killed mid-write) is no
        // table's: an orphan once old enough, kept while young.
        std::fs::write(
            t.join("metadata/v3.metadata.json"),
            r#"{"format-version": 2, "tab"#,
        )
        .unwrap();
        assert_eq!(
            orphan_files(t, "u1", &referenced, later).unwrap(),
            vec![
                t.join("data/day=1/stray.parquet"),
                t.join("metadata/stray.avro"),
                t.join("metadata/v3.metadata.json"),
            ]
        );
        assert!(
            orphan_files(t, "u1", &referenced, earlier)
                .unwrap()
                .is_empty()
        );
        std::fs::remove_file(t.join("metadata/v3.metadata.json")).unwrap();
        // A referenced file that is not there: the paths do not name the
        // files on disk; nothing is cleaned.
        let mut gone = referenced.clone();
        gone.insert(t.join("data/day=1/gone.parquet"));
        let e = orphan_files(t, "u1", &gone, later).unwrap_err();
        assert!(e.to_string().contains("not there"), "{e}");
    }
}
