//! Local warehouses: a commit's files made durable before the catalog
//! points at them.
//!
//! iceberg 0.10.1's local storage fsyncs a file it writes through its
//! streaming writer (Parquet data and delete files, manifests, the manifest
//! list) when it closes it, but not a file written whole (the table's
//! metadata JSON), and never a directory that gained an entry. After a
//! power loss the catalog, which syncs its own commit, could then point at
//! a metadata file that is empty or not there at all, or at a snapshot
//! whose files' directory entries were lost: a broken table. So before
//! every swap the SQL catalog syncs the new metadata file and the
//! directories of every file the commit added; a new table's first
//! metadata file and directories are durable before its catalog row is
//! inserted; and a warehouse (or an SQLite catalog's directory) urutau
//! creates has its entries synced up to the first directory that existed.
//! Remote storage (S3) needs none of this: a completed PUT is durable.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use futures::StreamExt;
use urutau_planner::sink::SinkError;

/// The local path of `location`, when it is on the local filesystem
/// (`file:` URLs and absolute paths); `None` for object storage.
pub fn local_path(location: &str) -> Option<PathBuf> {
    if let Some(rest) = location.strip_prefix("file://") {
        return Some(PathBuf::from(if rest.starts_with('/') {
            rest.to_string()
        } else {
            format!("/{rest}")
        }));
    }
    if let Some(rest) = location.strip_prefix("file:") {
        // As iceberg's local storage reads it: always absolute.
        return Some(PathBuf::from(if rest.starts_with('/') {
            rest.to_string()
        } else {
            format!("/{rest}")
        }));
    }
    location.starts_with('/').then(|| PathBuf::from(location))
}

/// Creates `dir` and any missing ancestors, and syncs the parent of every
/// directory it created, so their entries survive a power loss (a
/// warehouse or a catalog file's directory urutau makes must not vanish
/// under data committed into it). Returns the directories synced.
pub fn create_dir_durably(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        if d.as_os_str().is_empty() || d.exists() {
            break;
        }
        missing.push(d.to_path_buf());
        at = d.parent();
    }
    std::fs::create_dir_all(dir)?;
    let mut synced = Vec::new();
    for d in missing.iter().rev() {
        if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(parent)?.sync_all()?;
            synced.push(parent.to_path_buf());
        }
    }
    Ok(synced)
}

/// Directories whose own entry (in their parent) this process has made
/// durable: a commit then syncs only the directories that gained entries,
/// not their ancestors again. Kept per catalog connection; a directory
/// removed and made again by someone else is synced again only after a
/// restart (urutau itself never removes a table's directories).
#[derive(Debug, Default)]
pub struct DurableDirs(std::sync::Mutex<HashSet<PathBuf>>);

impl DurableDirs {
    fn contains(&self, dir: &Path) -> bool {
        self.0.lock().is_ok_and(|d| d.contains(dir))
    }

    fn extend(&self, dirs: impl IntoIterator<Item = PathBuf>) {
        if let Ok(mut d) = self.0.lock() {
            d.extend(dirs);
        }
    }
}

/// The directories to sync for new entries at `paths`: each path's
/// directory, and, up to `root`, the parent of every such directory whose
/// own entry `known` does not hold (those are returned second: their
/// entries are durable once the sync succeeds).
fn dirs_to_sync<'a>(
    paths: impl Iterator<Item = &'a PathBuf>,
    root: Option<&Path>,
    known: &DurableDirs,
) -> (BTreeSet<PathBuf>, Vec<PathBuf>) {
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut entered: Vec<PathBuf> = Vec::new();
    for path in paths {
        let mut dir = path.parent();
        while let Some(d) = dir {
            if !dirs.insert(d.to_path_buf()) {
                break;
            }
            match root {
                Some(r) if d.starts_with(r) && d != r && !known.contains(d) => {
                    entered.push(d.to_path_buf());
                    dir = d.parent();
                }
                _ => break,
            }
        }
    }
    (dirs, entered)
}

/// Syncs the local files in `files` and the directories holding every
/// local path in `files` and `entries` (files whose content is already
/// durable, but whose directory entry is new), and, up to `root` (the
/// table's location: a partition directory may be new too), the parent of
/// every such directory whose own entry `known` does not hold yet.
/// Object-storage locations are skipped. The syncs run side by side (up to
/// 16 at once), each on a blocking thread: a commit waits for about the
/// slowest, not for their sum.
pub async fn sync_local(
    files: Vec<String>,
    entries: Vec<String>,
    root: &str,
    known: &DurableDirs,
) -> Result<(), SinkError> {
    let files: Vec<PathBuf> = files.iter().filter_map(|l| local_path(l)).collect();
    let entries: Vec<PathBuf> = entries.iter().filter_map(|l| local_path(l)).collect();
    let (dirs, entered) = dirs_to_sync(
        files.iter().chain(&entries),
        local_path(root).as_deref(),
        known,
    );
    // At most this many at once (a compaction may touch hundreds of
    // partition directories).
    const AT_ONCE: usize = 16;
    let mut syncs = futures::stream::iter(files.into_iter().chain(dirs).map(|path| {
        tokio::task::spawn_blocking(move || {
            // A read-only handle can be synced; a directory can only be
            // opened read-only.
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| SinkError::Io(format!("syncing {}: {e}", path.display())))
        })
    }))
    .buffer_unordered(AT_ONCE);
    let mut first_error = None;
    while let Some(done) = syncs.next().await {
        let result = done.map_err(|e| SinkError::Io(format!("syncing the commit's files: {e}")))?;
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => {
            known.extend(entered);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_directory_chain_has_its_entries_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let deep = root.join("a/b/c");
        let synced = create_dir_durably(&deep).unwrap();
        assert!(deep.is_dir());
        assert_eq!(synced, [root.clone(), root.join("a"), root.join("a/b")]);
        // Nothing new: nothing to sync.
        assert!(create_dir_durably(&deep).unwrap().is_empty());
    }

    #[test]
    fn local_locations_are_recognised() {
        assert_eq!(
            local_path("/w/t/m.json"),
            Some(PathBuf::from("/w/t/m.json"))
        );
        assert_eq!(
            local_path("file:///w/t/m.json"),
            Some(PathBuf::from("/w/t/m.json"))
        );
        assert_eq!(
            local_path("file:/w/t/m.json"),
            Some(PathBuf::from("/w/t/m.json"))
        );
        assert_eq!(local_path("s3://bucket/t/m.json"), None);
    }

    #[tokio::test]
    async fn syncs_files_and_their_directories() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let file = dir.path().join("v1.metadata.json");
        std::fs::write(&file, "{}").unwrap();
        let parquet = data.join("d.parquet");
        std::fs::write(&parquet, "x").unwrap();
        sync_local(
            vec![file.display().to_string()],
            vec![
                format!("file://{}", parquet.display()),
                "s3://b/k".to_string(),
            ],
            &dir.path().display().to_string(),
            &DurableDirs::default(),
        )
        .await
        .unwrap();
        // A file that is not there is an error naming it, never a silent
        // success.
        let missing = dir.path().join("gone.json").display().to_string();
        let err = sync_local(vec![missing.clone()], vec![], "/", &DurableDirs::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&missing), "{err}");
    }

    #[test]
    fn a_directory_whose_entry_is_durable_is_not_climbed_again() {
        let root = PathBuf::from("/w/t");
        let known = DurableDirs::default();
        let paths = [
            PathBuf::from("/w/t/data/day=1/a.parquet"),
            PathBuf::from("/w/t/metadata/v2.metadata.json"),
        ];
        let set = |v: &[&str]| v.iter().map(PathBuf::from).collect::<BTreeSet<_>>();
        // First commit: every new directory's parent, up to the table.
        let (dirs, entered) = dirs_to_sync(paths.iter(), Some(&root), &known);
        assert_eq!(
            dirs,
            set(&["/w/t", "/w/t/data", "/w/t/data/day=1", "/w/t/metadata"])
        );
        known.extend(entered);
        // Next commit: only the directories that gained entries.
        let (dirs, entered) = dirs_to_sync(paths.iter(), Some(&root), &known);
        assert_eq!(dirs, set(&["/w/t/data/day=1", "/w/t/metadata"]));
        assert!(entered.is_empty());
        // A new partition directory: it and its parent (its entry).
        let new = [PathBuf::from("/w/t/data/day=2/b.parquet")];
        let (dirs, entered) = dirs_to_sync(new.iter(), Some(&root), &known);
        assert_eq!(dirs, set(&["/w/t/data", "/w/t/data/day=2"]));
        assert_eq!(entered, vec![PathBuf::from("/w/t/data/day=2")]);
    }
}
