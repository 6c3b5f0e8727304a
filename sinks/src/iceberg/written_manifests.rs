//! The live entries of the manifests this process wrote, kept in memory.
//! Every 50 commits a table's small manifests are merged, and compaction
//! lists a table's live files: both read manifests back, and iceberg-rust's
//! reader parses the file's Avro schema and the table schema in its header
//! and builds its reader schema for every file, about 5M instructions for
//! a manifest of one entry (one merge of 100 was a seventh of a 1M-change
//! Kafka run's sink). A manifest is never changed once written and its
//! path is unique (snapshot id and commit uuid), so entries kept by path
//! are what the file holds; what an entry inherits from the manifest's
//! list entry (the snapshot id, an added file's sequence numbers) is
//! applied at each use, as the reader applies it. A manifest another
//! writer wrote, or one no longer kept, is read from its file as before.
//! Debug builds (the tests) read the file on every hit too and fail when
//! the two differ.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use iceberg::spec::{FormatVersion, ManifestEntry, ManifestEntryRef, ManifestFile, ManifestStatus};

/// The sequence number of a table's first snapshot (v1 tables' manifests
/// carry it): iceberg-rust's constant is private to it.
const INITIAL_SEQUENCE_NUMBER: i64 = 0;

/// Entries kept at most, over all manifests; past it the oldest
/// manifests are dropped (read from their files again when needed).
const KEEP_ENTRIES: usize = 10_000;

/// The manifests kept: their live entries as written, by path, and the
/// paths oldest first.
#[derive(Default)]
pub(super) struct WrittenManifests {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    by_path: HashMap<String, Arc<[ManifestEntry]>>,
    order: VecDeque<String>,
    entries: usize,
}

/// This process's manifests.
pub(super) static WRITTEN_MANIFESTS: LazyLock<WrittenManifests> =
    LazyLock::new(WrittenManifests::default);

impl WrittenManifests {
    /// Keeps the live entries of the manifest at `path` as its writer
    /// wrote them (before what they inherit). Only v2 manifests are kept
    /// (v3 readers assign row ids too).
    pub(super) fn keep(&self, path: &str, version: FormatVersion, entries: Vec<ManifestEntry>) {
        if version != FormatVersion::V2 || entries.len() > KEEP_ENTRIES {
            return;
        }
        let entries: Arc<[ManifestEntry]> = entries.into_iter().filter(|e| e.is_alive()).collect();
        let mut kept = self.lock();
        kept.remove(path);
        while kept.entries + entries.len() > KEEP_ENTRIES {
            let Some(oldest) = kept.order.front().cloned() else {
                break;
            };
            kept.remove(&oldest);
        }
        kept.entries += entries.len();
        kept.order.push_back(path.to_string());
        kept.by_path.insert(path.to_string(), entries);
    }

    /// The live entries of `manifest`, as `ManifestFile::load_manifest`
    /// gives them, when this process wrote it and keeps it.
    pub(super) fn alive_entries(&self, manifest: &ManifestFile) -> Option<Vec<ManifestEntryRef>> {
        let entries = Arc::clone(self.lock().by_path.get(&manifest.manifest_path)?);
        Some(
            entries
                .iter()
                .map(|e| Arc::new(inherit(e, manifest)))
                .collect(),
        )
    }

    /// Drops the manifests at `paths` (merged into another: no commit
    /// lists them again).
    pub(super) fn forget<'a>(&self, paths: impl IntoIterator<Item = &'a str>) {
        let mut kept = self.lock();
        for p in paths {
            kept.remove(p);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Kept {
    fn remove(&mut self, path: &str) {
        if let Some(entries) = self.by_path.remove(path) {
            self.entries -= entries.len();
            self.order.retain(|p| p != path);
        }
    }
}

/// `entry` with what it inherits from its manifest's list entry `from`:
/// what iceberg-rust's reader does (`ManifestEntry::inherit_data`, private
/// to that crate), after the spec: a null snapshot id is the manifest's
/// adding snapshot, and a null sequence number of an added entry (or of
/// any entry of a manifest at the initial sequence number) is the
/// manifest's.
fn inherit(entry: &ManifestEntry, from: &ManifestFile) -> ManifestEntry {
    let mut e = entry.clone();
    let inherits =
        e.status == ManifestStatus::Added || from.sequence_number == INITIAL_SEQUENCE_NUMBER;
    if e.snapshot_id.is_none() {
        e.snapshot_id = Some(from.added_snapshot_id);
    }
    if e.sequence_number.is_none() && inherits {
        e.sequence_number = Some(from.sequence_number);
    }
    if e.file_sequence_number.is_none() && inherits {
        e.file_sequence_number = Some(from.sequence_number);
    }
    e
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Struct};

    use super::*;
    use crate::iceberg::test_manifest as manifest;

    fn file(path: &str) -> DataFile {
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::empty())
            .record_count(1)
            .file_size_in_bytes(10)
            .build()
            .unwrap()
    }

    fn entry(status: ManifestStatus, seq: Option<i64>, path: &str) -> ManifestEntry {
        ManifestEntry {
            status,
            snapshot_id: None,
            sequence_number: seq,
            file_sequence_number: seq,
            data_file: file(path),
        }
    }

    #[test]
    fn kept_entries_inherit_from_their_list_entry_as_the_reader_does() {
        let kept = WrittenManifests::default();
        kept.keep(
            "m1",
            FormatVersion::V2,
            vec![
                entry(ManifestStatus::Added, None, "added"),
                entry(ManifestStatus::Existing, Some(3), "existing"),
                entry(ManifestStatus::Deleted, Some(2), "deleted"),
            ],
        );
        let got = kept.alive_entries(&manifest("m1", 7, 5)).expect("kept");
        assert_eq!(got.len(), 2, "deleted entries are not live");
        assert_eq!(
            (
                got[0].snapshot_id,
                got[0].sequence_number,
                got[0].file_sequence_number
            ),
            (Some(7), Some(5), Some(5))
        );
        assert_eq!(
            (
                got[1].snapshot_id,
                got[1].sequence_number,
                got[1].file_sequence_number
            ),
            (Some(7), Some(3), Some(3)),
            "an existing entry keeps its numbers"
        );
        assert!(kept.alive_entries(&manifest("m2", 7, 5)).is_none());
        kept.keep(
            "v3",
            FormatVersion::V3,
            vec![entry(ManifestStatus::Added, None, "f")],
        );
        assert!(kept.alive_entries(&manifest("v3", 7, 5)).is_none());
        kept.forget(["m1"]);
        assert!(kept.alive_entries(&manifest("m1", 7, 5)).is_none());
        assert_eq!(kept.lock().entries, 0);
    }

    #[test]
    fn past_the_limit_the_oldest_manifests_go() {
        let kept = WrittenManifests::default();
        let many = |n: usize| {
            (0..n)
                .map(|i| entry(ManifestStatus::Added, None, &format!("f{i}")))
                .collect::<Vec<_>>()
        };
        kept.keep("old", FormatVersion::V2, many(KEEP_ENTRIES / 2));
        kept.keep("mid", FormatVersion::V2, many(KEEP_ENTRIES / 2));
        kept.keep("new", FormatVersion::V2, many(10));
        assert!(kept.alive_entries(&manifest("old", 1, 1)).is_none());
        assert!(kept.alive_entries(&manifest("mid", 1, 1)).is_some());
        assert!(kept.alive_entries(&manifest("new", 1, 1)).is_some());
        assert_eq!(kept.lock().entries, KEEP_ENTRIES / 2 + 10);
    }
}
