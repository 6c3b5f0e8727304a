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
//! directories of every file the commit added. Remote storage (S3) needs
//! none of this: a completed PUT is durable.

use std::collections::BTreeSet;
use std::path::PathBuf;

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

/// Syncs the local files in `files` and the directories holding every
/// local path in `files` and `entries` (files whose content is already
/// durable, but whose directory entry is new), and their ancestors up to
/// `root` (the table's location: a partition directory may be new too).
/// Object-storage locations are skipped.
pub async fn sync_local(
    files: Vec<String>,
    entries: Vec<String>,
    root: &str,
) -> Result<(), SinkError> {
    let files: Vec<PathBuf> = files.iter().filter_map(|l| local_path(l)).collect();
    let root = local_path(root);
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for path in files
        .iter()
        .cloned()
        .chain(entries.iter().filter_map(|l| local_path(l)))
    {
        let mut dir = path.parent();
        while let Some(d) = dir {
            if !dirs.insert(d.to_path_buf()) {
                break;
            }
            match &root {
                Some(r) if d.starts_with(r) && d != r.as_path() => dir = d.parent(),
                _ => break,
            }
        }
    }
    if files.is_empty() && dirs.is_empty() {
        return Ok(());
    }
    tokio::task::spawn_blocking(move || {
        for path in files.iter().chain(dirs.iter()) {
            // A read-only handle can be synced; a directory can only be
            // opened read-only.
            std::fs::File::open(path)
                .and_then(|f| f.sync_all())
                .map_err(|e| SinkError::Io(format!("syncing {}: {e}", path.display())))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| SinkError::Io(format!("syncing the commit's files: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

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
        )
        .await
        .unwrap();
        // A file that is not there is an error naming it, never a silent
        // success.
        let missing = dir.path().join("gone.json").display().to_string();
        let err = sync_local(vec![missing.clone()], vec![], "/")
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&missing), "{err}");
    }
}
