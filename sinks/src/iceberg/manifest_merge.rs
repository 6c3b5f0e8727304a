//! Merging the small manifests a table's commits leave behind.
//!
//! Every row-delta commit adds up to two manifests (its data files, its
//! equality deletes) and carries every earlier one forward. Without
//! merging, a table replicated for a day holds tens of thousands of tiny
//! manifests, and each commit reads and rewrites a manifest list that grows
//! with the table's history (and each reader plans over all of them). As
//! Java's commits do by default (`commit.manifest.min-count-to-merge` 100,
//! `commit.manifest.target-size-bytes` 8 MiB), once the carried manifests
//! of one kind (data or deletes, under one partition spec) number
//! [`MERGE_AT`], the small ones are rewritten into manifests of up to
//! [`TARGET_BYTES`]. A merged manifest lists the same live files as
//! `EXISTING` entries with their own snapshot ids and data and file
//! sequence numbers, so which deletes apply to which rows is unchanged.
//! Deleted entries (kept only for the snapshot that deleted them) are not
//! carried into it.

use std::collections::BTreeMap;

use iceberg::spec::{ManifestContentType, ManifestEntryRef, ManifestFile};
use urutau_planner::sink::SinkError;

use super::commit::{ManifestFiles, NewSnapshot, alive_entries};
use super::written_manifests::WRITTEN_MANIFESTS;

/// Carried manifests of one kind are merged once they number this many.
pub const MERGE_AT: usize = 100;

/// Manifests this large are left alone, and merged ones stop growing here.
pub const TARGET_BYTES: i64 = 8 << 20;

/// `carried`, with the small manifests of every kind that number
/// [`MERGE_AT`] or more merged (written as manifests of `snap`).
pub async fn merge_manifests(
    snap: &NewSnapshot<'_>,
    carried: Vec<ManifestFile>,
) -> Vec<ManifestFile> {
    let mut kinds: BTreeMap<(bool, i32), Vec<ManifestFile>> = BTreeMap::new();
    for m in carried {
        let deletes = m.content == ManifestContentType::Deletes;
        kinds
            .entry((deletes, m.partition_spec_id))
            .or_default()
            .push(m);
    }
    let mut out = Vec::new();
    let mut written = 0usize;
    for ((deletes, spec_id), manifests) in kinds {
        let (small, large): (Vec<_>, Vec<_>) = manifests
            .into_iter()
            .partition(|m| m.manifest_length < TARGET_BYTES);
        out.extend(large);
        if small.len() < MERGE_AT {
            out.extend(small);
            continue;
        }
        for bin in bins(small) {
            if bin.len() == 1 {
                out.extend(bin);
                continue;
            }
            written += 1;
            // Merging only saves work: a manifest it cannot rewrite (say,
            // another writer's entry without a file sequence number) is
            // carried as it is, never a reason to fail the commit.
            match merge(snap, deletes, spec_id, &bin, written).await {
                Ok(merged) => {
                    // No commit lists the merged ones again (a retry of
                    // this one reads them from their files).
                    WRITTEN_MANIFESTS.forget(bin.iter().map(|m| m.manifest_path.as_str()));
                    out.push(merged);
                }
                Err(e) => {
                    tracing::warn!(table = %snap.table().identifier(), error = %e, "small manifests are carried unmerged");
                    out.extend(bin);
                }
            }
        }
    }
    out
}

/// Consecutive manifests grouped up to [`TARGET_BYTES`] each.
fn bins(manifests: Vec<ManifestFile>) -> Vec<Vec<ManifestFile>> {
    let mut bins: Vec<Vec<ManifestFile>> = Vec::new();
    let mut bytes = 0i64;
    for m in manifests {
        match bins.last_mut() {
            Some(bin) if bytes + m.manifest_length <= TARGET_BYTES => {
                bytes += m.manifest_length;
                bin.push(m);
            }
            _ => {
                bytes = m.manifest_length;
                bins.push(vec![m]);
            }
        }
    }
    bins
}

/// One manifest holding the live entries of `manifests`.
async fn merge(
    snap: &NewSnapshot<'_>,
    deletes: bool,
    spec_id: i32,
    manifests: &[ManifestFile],
    n: usize,
) -> Result<ManifestFile, SinkError> {
    let err = |e: iceberg::Error| SinkError::Io(format!("merging manifests: {e}"));
    let table = snap.table();
    let spec = table
        .metadata()
        .partition_spec_by_id(spec_id)
        .ok_or_else(|| SinkError::Io(format!("merging manifests: no partition spec {spec_id}")))?
        .clone();
    let mut live: Vec<ManifestEntryRef> = Vec::new();
    for m in manifests {
        for e in alive_entries(table, m).await.map_err(err)? {
            if e.sequence_number().is_none() || e.file_sequence_number.is_none() {
                return Err(SinkError::Io(format!(
                    "{} in {} has no data or file sequence number to keep",
                    e.file_path(),
                    m.manifest_path
                )));
            }
            live.push(e);
        }
    }
    snap.manifest(
        &format!("-merged{n}.avro"),
        &spec,
        deletes,
        ManifestFiles::Existing(&live),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iceberg::test_manifest;

    #[test]
    fn small_manifests_are_binned_up_to_the_target() {
        let m = |len: i64| ManifestFile {
            manifest_length: len,
            ..test_manifest("m.avro", 1, 1)
        };
        let sizes = |bins: Vec<Vec<ManifestFile>>| {
            bins.iter()
                .map(|b| b.iter().map(|m| m.manifest_length).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        let half = TARGET_BYTES / 2;
        assert_eq!(
            sizes(bins(vec![m(half), m(half), m(1), m(half - 1), m(10)])),
            vec![vec![half, half], vec![1, half - 1, 10]]
        );
        assert!(bins(vec![]).is_empty());
    }
}
