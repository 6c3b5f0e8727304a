//! Local warehouses: a commit's files made durable before the catalog
//! points at them.
//!
//! A local table's files go through [`LocalStorage`](super::catalog::local),
//! whose streaming writer (Parquet data and delete files, manifests, the
//! manifest list) starts a file's sync on a blocking thread when it closes
//! it ([`sync_in_background`]); a file written whole (the table's metadata
//! JSON) is not synced, and no directory that gained an entry is. After a
//! power loss the catalog, which syncs its own commit, could then point at
//! a metadata file that is empty or not there at all, or at a snapshot
//! whose files or directory entries were lost: a broken table. So before
//! every swap the catalog waits for the background syncs of the table's
//! files (a failed one fails the commit, and any later commit naming it),
//! and syncs the new metadata file and the directories of every file the
//! commit added ([`sync_local`]); a new table's first metadata file and
//! directories are durable before its catalog row is inserted; and a
//! warehouse (or an SQLite catalog's directory) urutau creates has its
//! entries synced up to the first directory that existed. Remote storage
//! (S3) needs none of this: a completed PUT is durable.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, MutexGuard};

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

/// The syncs [`sync_in_background`] started that no commit has waited
/// for yet, and the files whose sync failed (a commit naming one fails:
/// after a failed sync its content may be lost, whatever a later sync
/// says).
#[derive(Default)]
struct Background {
    running: Vec<(PathBuf, tokio::task::JoinHandle<std::io::Result<()>>)>,
    failed: HashMap<PathBuf, String>,
}

fn background() -> MutexGuard<'static, Background> {
    static BACKGROUND: LazyLock<Mutex<Background>> = LazyLock::new(Mutex::default);
    // A panic while holding the lock left the lists whole.
    BACKGROUND.lock().unwrap_or_else(|p| p.into_inner())
}

/// Syncs `file` (just written at `path`) on a blocking thread; the next
/// [`sync_local`] waits for it. Outside a Tokio runtime it is synced
/// here and then.
pub fn sync_in_background(path: PathBuf, file: std::fs::File) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            let sync = rt.spawn_blocking(move || file.sync_all());
            background().running.push((path, sync));
        }
        Err(_) => {
            if let Err(e) = file.sync_all() {
                background().failed.insert(path, e.to_string());
            }
        }
    }
}

/// Whether the sync of `path` was started and no commit has waited for
/// it yet.
#[cfg(test)]
pub fn syncing(path: &Path) -> bool {
    background().running.iter().any(|(p, _)| p == path)
}

/// Waits for the background syncs started so far of the files under
/// `root` (a table's location: its data, delete, manifest and manifest
/// list files) and of `listed` (files the commit adds, wherever they are);
/// an error names the first that failed. Each failed file stays failed.
/// Other tables' syncs are left to their own commits.
async fn settle_background(root: Option<&Path>, listed: &[&PathBuf]) -> Result<(), SinkError> {
    let ours = |p: &PathBuf| root.is_some_and(|r| p.starts_with(r)) || listed.contains(&p);
    let running = {
        let mut b = background();
        let (ours, others): (Vec<_>, Vec<_>) = std::mem::take(&mut b.running)
            .into_iter()
            .partition(|(p, _)| ours(p));
        b.running = others;
        ours
    };
    let mut first_error = None;
    for (path, sync) in running {
        let failed = match sync.await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("the sync stopped: {e}"),
        };
        first_error
            .get_or_insert_with(|| SinkError::Io(format!("syncing {}: {failed}", path.display())));
        background().failed.insert(path, failed);
    }
    first_error.map_or(Ok(()), Err)
}

/// The first of `paths` whose background sync failed, as an error.
fn failed_among<'a>(mut paths: impl Iterator<Item = &'a PathBuf>) -> Result<(), SinkError> {
    let b = background();
    match paths.find_map(|p| b.failed.get(p).map(|why| (p, why))) {
        Some((path, why)) => Err(SinkError::Io(format!(
            "syncing {}: {why} (it cannot be committed)",
            path.display()
        ))),
        None => Ok(()),
    }
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

/// Makes a commit's local files durable before the catalog may point at
/// them: waits for the background syncs ([`sync_in_background`]) of the
/// files under `root` (the table's location) and of `files` and `entries`
/// (failing on any that failed, now or before), then syncs the files in
/// `files` (written whole) and the directories holding every local path
/// in `files` and `entries` (files whose entry in their directory is new),
/// and, up to `root` (a partition directory may be new too), the parent
/// of every such directory whose own entry `known` does not hold yet.
/// Object-storage locations are skipped. The syncs run side by side (up
/// to 16 at once), each on a blocking thread: a commit waits for about
/// the slowest, not for their sum.
pub async fn sync_local(
    files: Vec<String>,
    entries: Vec<String>,
    root: &str,
    known: &DurableDirs,
) -> Result<(), SinkError> {
    let files: Vec<PathBuf> = files.iter().filter_map(|l| local_path(l)).collect();
    let entries: Vec<PathBuf> = entries.iter().filter_map(|l| local_path(l)).collect();
    let listed: Vec<&PathBuf> = files.iter().chain(&entries).collect();
    settle_background(local_path(root).as_deref(), &listed).await?;
    failed_among(listed.iter().copied())?;
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
        // (Rooted at the test's directory: a commit rooted at `/` would
        // wait for the background syncs of every test running beside it.)
        let root = dir.path().display().to_string();
        let err = sync_local(
            vec![missing.clone()],
            vec![],
            &root,
            &DurableDirs::default(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains(&missing), "{err}");
    }

    /// A file whose sync fails fails the commit that waits for it, and
    /// every later commit naming it; a commit of other files goes on. The
    /// failure is real: Linux refuses to sync a character device
    /// (`EINVAL`), and the file is written through the local storage's
    /// writer as a data file would be.
    #[tokio::test]
    async fn a_failed_background_sync_fails_every_commit_naming_its_file() {
        let io = super::super::catalog::local::file_io();
        let mut w = io.new_output("/dev/null").unwrap().writer().await.unwrap();
        w.write(bytes::Bytes::from_static(b"x")).await.unwrap();
        w.close().await.unwrap();
        let commit = |entries: Vec<String>, root: &str| {
            let (entries, root) = (entries, root.to_string());
            async move { sync_local(vec![], entries, &root, &DurableDirs::default()).await }
        };
        // A commit of another table does not wait for it.
        let other = tempfile::tempdir().unwrap();
        let other_root = other.path().display().to_string();
        commit(vec![], &other_root).await.unwrap();
        assert!(syncing(Path::new("/dev/null")), "left to its own commit");
        // The table's commit waits for it and fails.
        let err = commit(vec!["/dev/null".into()], "/dev").await.unwrap_err();
        assert!(err.to_string().contains("syncing /dev/null"), "{err}");
        // Retried, the commit still fails: the failure is remembered.
        let err = commit(vec!["/dev/null".into()], "/dev/shm")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cannot be committed"), "{err}");
        // A commit without the file goes on.
        commit(vec![], &other_root).await.unwrap();
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
