//! One batch = one snapshot: the row-delta commit.
//!
//! The spec describes the Go engine's early design: delete, then append, as
//! two snapshots. We write ONE snapshot holding the equality-delete files
//! for every key the batch touched and the data files of the surviving
//! images, with the position in the snapshot summary and in the table
//! property `cdc.position`, in one metadata update. That is correct because
//! an equality delete applies only to data files with a *lower* sequence
//! number: the rows added by the same snapshot survive it, the older images
//! of the same keys do not. It is strictly better than two commits: a reader
//! never sees a key missing between them. (The Go engine moved to the same
//! design.)
//!
//! iceberg 0.10.1 writes data and equality-delete files but cannot commit
//! delete files (no row delta; `TableCommit` is crate-private), so the
//! snapshot is built here on the crate's public pieces: manifest writers,
//! the manifest-list writer, `Snapshot::builder`, and `TableMetadata`'s
//! builder; the catalog then swaps the metadata location.
//!
//! Retries: only the catalog swap is retried (the files stay written). Each
//! snapshot records a commit id in its summary; after an error whose
//! outcome is unknown (a lost response), the reloaded table is searched for
//! that id, so a retry never adds the files twice.

use std::collections::HashMap;
use std::str::FromStr;

use iceberg::spec::{
    DataFile, MAIN_BRANCH, ManifestFile, ManifestListWriter, ManifestWriterBuilder, Operation,
    PartitionSpecRef, Snapshot, SnapshotSummaryCollector, Summary, TableMetadata,
    TableMetadataBuildResult, UNASSIGNED_SEQUENCE_NUMBER,
};
use iceberg::table::Table;
use iceberg::{MetadataLocation, Runtime};
use urutau_planner::progress::{CommitMark, SnapshotProgress};
use urutau_planner::sink::SinkError;

use super::io_error;

/// Table property and snapshot summary key of the committed position.
pub const POSITION_KEY: &str = "cdc.position";
/// Snapshot summary key of the commit id (idempotent retries).
pub const COMMIT_ID_KEY: &str = "cdc.commit-id";
/// Table property and summary key of the initial snapshot's state
/// (`not_started`, `in_progress`, `complete`).
pub const SNAPSHOT_STATE_KEY: &str = "cdc.snapshot.state";
/// Table property and summary key of the last copied key (JSON array).
pub const SNAPSHOT_BOUNDS_KEY: &str = "cdc.snapshot.bounds";

/// The properties a commit mark sets (the position, and the snapshot
/// progress when the source snapshots), and the ones it clears.
pub fn mark_properties(mark: &str) -> (HashMap<String, String>, Vec<String>) {
    let m = CommitMark::parse(mark);
    let mut set = HashMap::from([(POSITION_KEY.to_string(), m.position)]);
    let mut clear = Vec::new();
    if let Some(s) = &m.snapshot {
        set.insert(SNAPSHOT_STATE_KEY.to_string(), s.state().to_string());
        match s.bounds() {
            Some(b) => {
                set.insert(SNAPSHOT_BOUNDS_KEY.to_string(), b);
            }
            None => clear.push(SNAPSHOT_BOUNDS_KEY.to_string()),
        }
    }
    (set, clear)
}

/// The commit mark held by a property map (table properties or a
/// snapshot summary); `None` without `cdc.position`.
fn mark_from(props: &HashMap<String, String>) -> Option<String> {
    let position = props.get(POSITION_KEY)?;
    let snapshot = props.get(SNAPSHOT_STATE_KEY).and_then(|state| {
        SnapshotProgress::from_parts(state, props.get(SNAPSHOT_BOUNDS_KEY).map(String::as_str))
    });
    Some(
        CommitMark {
            position: position.clone(),
            snapshot,
        }
        .to_string(),
    )
}

/// What one commit adds.
pub struct RowDelta {
    pub data_files: Vec<DataFile>,
    pub delete_files: Vec<DataFile>,
    /// The spec the delete files were written with (unpartitioned: global).
    pub delete_spec: PartitionSpecRef,
    pub position: String,
    pub commit_id: String,
}

fn new_snapshot_id(md: &TableMetadata) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) as i64).wrapping_abs();
        if id > 0 && md.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// `total-*` summary entries: the parent's totals plus this snapshot's
/// additions (Java's convention: equality-deleted rows are not subtracted
/// from `total-records`).
fn add_totals(props: &mut HashMap<String, String>, parent: Option<&Summary>) {
    let get = |m: &HashMap<String, String>, k: &str| -> u64 {
        m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    for (total, added, removed) in [
        ("total-data-files", "added-data-files", "deleted-data-files"),
        (
            "total-delete-files",
            "added-delete-files",
            "removed-delete-files",
        ),
        ("total-records", "added-records", "deleted-records"),
        ("total-files-size", "added-files-size", "removed-files-size"),
        (
            "total-position-deletes",
            "added-position-deletes",
            "removed-position-deletes",
        ),
        (
            "total-equality-deletes",
            "added-equality-deletes",
            "removed-equality-deletes",
        ),
    ] {
        let before = parent.map_or(0, |s| get(&s.additional_properties, total));
        let value = (before + get(props, added)).saturating_sub(get(props, removed));
        props.insert(total.to_string(), value.to_string());
    }
}

/// New metadata for `table` with the row delta as the main branch's new
/// snapshot and `cdc.position` set. Writes the manifests and the manifest
/// list; the catalog commits the result (its `changes` are the updates).
pub async fn build_row_delta(
    table: &Table,
    delta: &RowDelta,
) -> Result<TableMetadataBuildResult, SinkError> {
    let md = table.metadata();
    let io = table.file_io();
    let schema = md.current_schema().clone();
    let spec = md.default_partition_spec().clone();
    let snapshot_id = new_snapshot_id(md);
    let seq = md.next_sequence_number();
    let parent = md.current_snapshot();
    let parent_id = md.current_snapshot_id();
    let commit = uuid::Uuid::now_v7();
    let dir = format!("{}/metadata", md.location());
    let err = io_error("writing the snapshot");

    let mut collector = SnapshotSummaryCollector::default();
    collector.set_partition_summary_limit(0);
    for f in &delta.data_files {
        collector.add_file(f, schema.clone(), spec.clone());
    }
    for f in &delta.delete_files {
        collector.add_file(f, schema.clone(), delta.delete_spec.clone());
    }
    let mut props = collector.build();
    add_totals(&mut props, parent.map(|p| p.summary()));
    let (mark_set, mark_clear) = mark_properties(&delta.position);
    props.extend(mark_set.clone());
    props.insert(COMMIT_ID_KEY.to_string(), delta.commit_id.clone());
    let operation = match (delta.data_files.is_empty(), delta.delete_files.is_empty()) {
        (false, true) => Operation::Append,
        (true, false) => Operation::Delete,
        _ => Operation::Overwrite,
    };

    let mut manifests: Vec<ManifestFile> = Vec::new();
    if !delta.data_files.is_empty() {
        let out = io
            .new_output(format!("{dir}/{commit}-m0.avro"))
            .map_err(&err)?;
        let mut w = ManifestWriterBuilder::new(
            out,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        )
        .build_v2_data();
        for f in &delta.data_files {
            w.add_file(f.clone(), UNASSIGNED_SEQUENCE_NUMBER)
                .map_err(&err)?;
        }
        manifests.push(w.write_manifest_file().await.map_err(&err)?);
    }
    if !delta.delete_files.is_empty() {
        let out = io
            .new_output(format!("{dir}/{commit}-m1.avro"))
            .map_err(&err)?;
        let mut w = ManifestWriterBuilder::new(
            out,
            Some(snapshot_id),
            schema.clone(),
            delta.delete_spec.as_ref().clone(),
        )
        .build_v2_deletes();
        for f in &delta.delete_files {
            w.add_file(f.clone(), UNASSIGNED_SEQUENCE_NUMBER)
                .map_err(&err)?;
        }
        manifests.push(w.write_manifest_file().await.map_err(&err)?);
    }
    // The parent's manifests carry forward unchanged (they keep their
    // sequence numbers).
    if let Some(p) = parent {
        let list = table.manifest_list_reader(p).load().await.map_err(&err)?;
        manifests.extend(list.consume_entries());
    }
    let list_path = format!("{dir}/snap-{snapshot_id}-0-{commit}.avro");
    let mut list = ManifestListWriter::v2(
        io.new_output(&list_path)
            .map_err(&err)?
            .writer()
            .await
            .map_err(&err)?,
        snapshot_id,
        parent_id,
        seq,
    );
    list.add_manifests(manifests.into_iter()).map_err(&err)?;
    list.close().await.map_err(&err)?;

    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent_id)
        .with_sequence_number(seq)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .with_manifest_list(list_path)
        .with_summary(Summary {
            operation,
            additional_properties: props,
        })
        .with_schema_id(md.current_schema_id())
        .build();
    let current = table.metadata_location_result().map_err(&err)?.to_string();
    md.clone()
        .into_builder(Some(current))
        .set_branch_snapshot(snapshot, MAIN_BRANCH)
        .and_then(|b| b.set_properties(mark_set))
        .and_then(|b| b.remove_properties(&mark_clear))
        .and_then(|b| b.build())
        .map_err(&err)
}

/// New metadata with only `cdc.position` changed (progress without data:
/// no snapshot, no files).
pub fn build_position_only(
    table: &Table,
    position: &str,
) -> Result<TableMetadataBuildResult, SinkError> {
    let err = io_error("the table metadata");
    let current = table.metadata_location_result().map_err(&err)?.to_string();
    let (set, clear) = mark_properties(position);
    table
        .metadata()
        .clone()
        .into_builder(Some(current))
        .set_properties(set)
        .and_then(|b| b.remove_properties(&clear))
        .and_then(|b| b.build())
        .map_err(&err)
}

/// Writes `metadata` as the next version after `current`.
pub async fn write_metadata(
    table: &Table,
    metadata: TableMetadata,
    current: &str,
) -> Result<(TableMetadata, String), SinkError> {
    let err = io_error("writing the table metadata");
    let location = MetadataLocation::from_str(current)
        .map_err(&err)?
        .with_next_version()
        .with_new_metadata(&metadata);
    metadata
        .write_to(table.file_io(), &location)
        .await
        .map_err(&err)?;
    Ok((metadata, location.to_string()))
}

/// The table as it is after a successful swap.
pub fn committed_table(
    table: &Table,
    metadata: TableMetadata,
    location: String,
) -> Result<Table, SinkError> {
    let err = io_error("reloading the table");
    Table::builder()
        .file_io(table.file_io().clone())
        .identifier(table.identifier().clone())
        .metadata(metadata)
        .metadata_location(location)
        .runtime(Runtime::try_current().map_err(&err)?)
        .build()
        .map_err(&err)
}

/// Whether the main branch's history already holds the commit `id`.
pub fn holds_commit(md: &TableMetadata, id: &str) -> bool {
    ancestry(md).any(|s| {
        s.summary()
            .additional_properties
            .get(COMMIT_ID_KEY)
            .map(String::as_str)
            == Some(id)
    })
}

/// The main branch's snapshots, newest first, following parent ids (not
/// the flat snapshot list: after a rollback, snapshots no longer on the
/// branch must not count).
pub fn ancestry(md: &TableMetadata) -> impl Iterator<Item = &iceberg::spec::SnapshotRef> {
    let mut next = md.current_snapshot_id();
    std::iter::from_fn(move || {
        let s = md.snapshot_by_id(next?)?;
        next = s.parent_snapshot_id();
        Some(s)
    })
}

/// The committed position: the table property (O(1)), else the newest
/// snapshot summary on the main branch that carries one.
pub fn committed_position(md: &TableMetadata) -> Option<String> {
    if let Some(m) = mark_from(md.properties()) {
        return Some(m);
    }
    ancestry(md).find_map(|s| mark_from(&s.summary().additional_properties))
}
