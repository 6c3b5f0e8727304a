//! The manifest lists this process wrote last, kept in memory: the next
//! commit of the same table carries its parent's manifests forward, and
//! reading them back (the list file's Avro) was a sixtieth of a Kafka
//! run's CPU, on every commit. A list file is never changed once written
//! and its path is unique (snapshot id and commit uuid), so an entry kept
//! by its path is exactly what the file holds; a list another writer
//! wrote, or one pushed out of the few kept, is read from its file as
//! before. Debug builds (the tests) read the file on every hit too and
//! fail when the two differ.

use std::collections::VecDeque;
use std::sync::{Arc, LazyLock, Mutex};

use iceberg::spec::{FormatVersion, ManifestFile, UNASSIGNED_SEQUENCE_NUMBER};

/// Lists kept: the last one of each table a process writes to, for up to
/// this many tables at once.
const KEEP: usize = 32;

/// The lists kept, the newest last.
#[derive(Default)]
pub(super) struct WrittenLists {
    kept: Mutex<VecDeque<(String, Arc<[ManifestFile]>)>>,
}

/// This process's lists.
pub(super) static WRITTEN: LazyLock<WrittenLists> = LazyLock::new(WrittenLists::default);

impl WrittenLists {
    /// Keeps what the list at `path` holds: `manifests` as the v2 list
    /// writer of snapshot `snapshot_id` with sequence number `seq` wrote
    /// them (an unassigned sequence number becomes `seq`). Other format
    /// versions are not kept (v3 assigns row ids too).
    pub(super) fn keep(
        &self,
        path: &str,
        version: FormatVersion,
        snapshot_id: i64,
        seq: i64,
        mut manifests: Vec<ManifestFile>,
    ) {
        if version != FormatVersion::V2 {
            return;
        }
        for m in &mut manifests {
            let added_by = m.added_snapshot_id;
            // As `ManifestListWriter` assigns them (it refuses an
            // unassigned number of another snapshot's manifest, so nothing
            // is kept then).
            for n in [&mut m.sequence_number, &mut m.min_sequence_number] {
                if *n == UNASSIGNED_SEQUENCE_NUMBER {
                    if added_by != snapshot_id {
                        return;
                    }
                    *n = seq;
                }
            }
        }
        let mut kept = self.lock();
        kept.retain(|(p, _)| p != path);
        if kept.len() >= KEEP {
            kept.pop_front();
        }
        kept.push_back((path.to_string(), manifests.into()));
    }

    /// What the list at `path` holds, when this process wrote it lately.
    pub(super) fn get(&self, path: &str) -> Option<Arc<[ManifestFile]>> {
        self.lock()
            .iter()
            .rev()
            .find(|(p, _)| p == path)
            .map(|(_, m)| Arc::clone(m))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, Arc<[ManifestFile]>)>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iceberg::test_manifest as manifest;

    #[test]
    fn a_kept_list_holds_its_manifests_with_their_sequence_numbers_assigned() {
        let lists = WrittenLists::default();
        let new = manifest("m-new", 7, UNASSIGNED_SEQUENCE_NUMBER);
        let old = manifest("m-old", 3, 2);
        lists.keep("list-a", FormatVersion::V2, 7, 5, vec![new, old.clone()]);
        let got = lists.get("list-a").expect("kept");
        assert_eq!(got[0].sequence_number, 5);
        assert_eq!(got[0].min_sequence_number, 5);
        assert_eq!(got[1], old, "a carried manifest keeps its numbers");
        assert!(lists.get("list-b").is_none());
        // Another snapshot's unassigned manifest: the writer refuses it, so
        // nothing is kept.
        lists.keep(
            "list-c",
            FormatVersion::V2,
            7,
            5,
            vec![manifest("m", 6, UNASSIGNED_SEQUENCE_NUMBER)],
        );
        assert!(lists.get("list-c").is_none());
        lists.keep("list-d", FormatVersion::V3, 7, 5, vec![old]);
        assert!(lists.get("list-d").is_none(), "only v2 lists are kept");
    }

    #[test]
    fn only_the_last_lists_are_kept() {
        let lists = WrittenLists::default();
        for i in 0..KEEP + 3 {
            lists.keep(
                &format!("many-{i}"),
                FormatVersion::V2,
                1,
                1,
                vec![manifest("m", 1, 1)],
            );
        }
        assert!(lists.get("many-0").is_none());
        assert!(lists.get(&format!("many-{}", KEEP + 2)).is_some());
    }
}
