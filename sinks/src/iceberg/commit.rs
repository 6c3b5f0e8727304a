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
//! A transaction larger than a batch arrives in parts
//! ([`urutau_planner::sink::Sink::stage`]). Each part is a snapshot of its
//! own on the branch [`STAGING_BRANCH`], so a later part's equality deletes
//! (higher sequence number) remove an earlier part's images of the same
//! keys, exactly as between batches. Readers and the committed position
//! follow `main`, which does not move until the transaction's last batch:
//! that snapshot's parent is the branch's head, and one metadata update
//! moves `main` to it, sets the position and removes the branch. Memory
//! stays bounded by the batch size, and the transaction still lands at
//! once. A branch left by a crash is removed when the table is next
//! prepared ([`discard_staging`]); its snapshots are then on no branch, and
//! expiry and orphan cleanup reclaim them.
//!
//! Retries: only the catalog swap is retried (the files stay written). Each
//! snapshot records a commit id in its summary; after an error whose
//! outcome is unknown (a lost response), the reloaded table is searched for
//! that id, so a retry never adds the files twice.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, MAIN_BRANCH, ManifestEntry, ManifestEntryRef,
    ManifestFile, ManifestListWriter, ManifestStatus, ManifestWriterBuilder, Operation,
    PartitionSpecRef, Snapshot, SnapshotRef, SnapshotSummaryCollector, Summary, TableMetadata,
    TableMetadataBuildResult, TableMetadataBuilder, UNASSIGNED_SEQUENCE_NUMBER,
};
use iceberg::table::Table;
use iceberg::{MetadataLocation, Runtime};
use urutau_planner::progress::{CommitMark, SnapshotProgress};
use urutau_planner::sink::SinkError;

use super::compaction::LiveFile;
use super::io_error;
use super::manifest_merge::merge_manifests;
use super::written_lists::WRITTEN;
use super::written_manifests::WRITTEN_MANIFESTS;

/// The branch the parts of an open transaction are staged on.
pub const STAGING_BRANCH: &str = "urutau-staging";

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
    /// A part of an open transaction: added to [`STAGING_BRANCH`], with no
    /// position. Otherwise the commit onto `main` (closing any staged
    /// parts).
    pub staged: bool,
    /// The head of the staging branch as this writer left it (its staged
    /// parts), `None` when it has staged nothing: a branch it did not
    /// build (another urutau writer's) is neither built on nor removed.
    pub own_staging: Option<i64>,
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
/// from `total-records`). A total the parent does not carry (another
/// writer's snapshot) is left out, as Java does, rather than restarted
/// from 0.
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
        let before = match parent {
            None => 0,
            Some(s) => match s
                .additional_properties
                .get(total)
                .and_then(|v| v.parse::<u64>().ok())
            {
                Some(v) => v,
                None => continue,
            },
        };
        let value = (before + get(props, added)).saturating_sub(get(props, removed));
        props.insert(total.to_string(), value.to_string());
    }
}

/// The snapshot a commit is building: its ids and where its files go.
pub(super) struct NewSnapshot<'a> {
    table: &'a Table,
    id: i64,
    seq: i64,
    parent_id: Option<i64>,
    /// Names this commit's metadata files.
    commit: uuid::Uuid,
    err: fn(iceberg::Error) -> SinkError,
}

impl<'a> NewSnapshot<'a> {
    fn new(table: &'a Table, err: fn(iceberg::Error) -> SinkError) -> Self {
        Self::after(table, table.metadata().current_snapshot_id(), err)
    }

    /// A snapshot whose parent is `parent_id` (a branch's head).
    fn after(
        table: &'a Table,
        parent_id: Option<i64>,
        err: fn(iceberg::Error) -> SinkError,
    ) -> Self {
        let md = table.metadata();
        NewSnapshot {
            table,
            id: new_snapshot_id(md),
            seq: md.next_sequence_number(),
            parent_id,
            commit: uuid::Uuid::now_v7(),
            err,
        }
    }

    /// The table the snapshot is for.
    pub(super) fn table(&self) -> &'a Table {
        self.table
    }

    fn path(&self, name: &str) -> String {
        format!(
            "{}/metadata/{}{name}",
            self.table.metadata().location(),
            self.commit
        )
    }

    /// Writes a manifest (`name`) of `files` under `spec`: added by this
    /// snapshot, or, with `removed` sequence numbers, marked deleted.
    pub(super) async fn manifest(
        &self,
        name: &str,
        spec: &PartitionSpecRef,
        deletes: bool,
        files: ManifestFiles<'_>,
    ) -> Result<ManifestFile, SinkError> {
        let err = self.err;
        let out = self
            .table
            .file_io()
            .new_output(self.path(name))
            .map_err(err)?;
        let builder = ManifestWriterBuilder::new(
            out,
            Some(self.id),
            self.table.metadata().current_schema().clone(),
            spec.as_ref().clone(),
        );
        let mut w = if deletes {
            builder.build_v2_deletes()
        } else {
            builder.build_v2_data()
        };
        let kept = written_entries(self.id, &files);
        match files {
            ManifestFiles::Added(files) => {
                for f in files {
                    w.add_file(f.clone(), UNASSIGNED_SEQUENCE_NUMBER)
                        .map_err(err)?;
                }
            }
            ManifestFiles::Removed(entries) => {
                for e in entries {
                    let data_seq = e.sequence_number().ok_or_else(|| {
                        SinkError::Io(format!("{} has no sequence number", e.file_path()))
                    })?;
                    w.add_delete_file(e.data_file().clone(), data_seq, e.file_sequence_number)
                        .map_err(err)?;
                }
            }
            ManifestFiles::Existing(entries) => {
                for e in entries {
                    let missing =
                        |what: &str| SinkError::Io(format!("{} has no {what}", e.file_path()));
                    let snapshot = e.snapshot_id().ok_or_else(|| missing("snapshot id"))?;
                    let data_seq = e
                        .sequence_number()
                        .ok_or_else(|| missing("sequence number"))?;
                    w.add_existing_file(
                        e.data_file().clone(),
                        snapshot,
                        data_seq,
                        e.file_sequence_number,
                    )
                    .map_err(err)?;
                }
            }
        }
        let written = w.write_manifest_file().await.map_err(err)?;
        let version = self.table.metadata().format_version();
        WRITTEN_MANIFESTS.keep(&written.manifest_path, version, kept);
        Ok(written)
    }

    /// Writes the manifest list of `manifests` and returns the snapshot.
    async fn finish(
        self,
        manifests: Vec<ManifestFile>,
        operation: Operation,
        props: HashMap<String, String>,
    ) -> Result<Snapshot, SinkError> {
        let err = self.err;
        let list_path = format!(
            "{}/metadata/snap-{}-0-{}.avro",
            self.table.metadata().location(),
            self.id,
            self.commit
        );
        let mut list = ManifestListWriter::v2(
            self.table
                .file_io()
                .new_output(&list_path)
                .map_err(err)?
                .writer()
                .await
                .map_err(err)?,
            self.id,
            self.parent_id,
            self.seq,
        );
        let version = self.table.metadata().format_version();
        let written = (version == FormatVersion::V2).then(|| manifests.clone());
        list.add_manifests(manifests.into_iter()).map_err(err)?;
        list.close().await.map_err(err)?;
        if let Some(manifests) = written {
            WRITTEN.keep(&list_path, version, self.id, self.seq, manifests);
        }
        Ok(Snapshot::builder()
            .with_snapshot_id(self.id)
            .with_parent_snapshot_id(self.parent_id)
            .with_sequence_number(self.seq)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path)
            .with_summary(Summary {
                operation,
                additional_properties: props,
            })
            .with_schema_id(self.table.metadata().current_schema_id())
            .build())
    }
}

/// The live entries of a manifest of `files` written by snapshot
/// `snapshot_id`, as `ManifestWriter` writes them: an added file with no
/// sequence numbers (they are assigned at commit) and this snapshot's id;
/// an existing one with its own.
fn written_entries(snapshot_id: i64, files: &ManifestFiles<'_>) -> Vec<ManifestEntry> {
    match files {
        ManifestFiles::Added(files) => files
            .iter()
            .map(|f| ManifestEntry {
                status: ManifestStatus::Added,
                snapshot_id: Some(snapshot_id),
                sequence_number: None,
                file_sequence_number: None,
                data_file: f.clone(),
            })
            .collect(),
        ManifestFiles::Removed(_) => Vec::new(),
        ManifestFiles::Existing(entries) => entries
            .iter()
            .map(|e| ManifestEntry {
                status: ManifestStatus::Existing,
                snapshot_id: e.snapshot_id(),
                sequence_number: e.sequence_number(),
                file_sequence_number: e.file_sequence_number,
                data_file: e.data_file().clone(),
            })
            .collect(),
    }
}

/// What a manifest lists.
pub(super) enum ManifestFiles<'a> {
    /// Files this snapshot adds.
    Added(&'a [DataFile]),
    /// Files this snapshot removes (their sequence numbers are kept).
    Removed(&'a [ManifestEntryRef]),
    /// Live files of earlier snapshots, rewritten into a merged manifest
    /// (their snapshot ids and sequence numbers are kept).
    Existing(&'a [ManifestEntryRef]),
}

fn snapshot_error(e: iceberg::Error) -> SinkError {
    SinkError::Io(format!("writing the snapshot: {e}"))
}

/// New metadata for `table` with the row delta as the main branch's new
/// snapshot and `cdc.position` set (or, for a staged part, as the staging
/// branch's). Builds on the staging branch's head when there is one.
/// Writes the manifests and the manifest list; the catalog commits the
/// result (its `changes` are the updates).
pub async fn build_row_delta(
    table: &Table,
    delta: &RowDelta,
) -> Result<TableMetadataBuildResult, SinkError> {
    let md = table.metadata();
    let schema = md.current_schema().clone();
    let spec = md.default_partition_spec().clone();
    let staging = match (md.snapshot_for_ref(STAGING_BRANCH), delta.own_staging) {
        (Some(s), Some(mine)) if s.snapshot_id() == mine => Some(s),
        (None, None) => None,
        // Another writer's transaction: this commit goes onto `main`
        // beside it.
        (Some(_), None) if !delta.staged => None,
        (Some(_), None) => {
            return Err(SinkError::Io(format!(
                "another writer has parts of a transaction staged on {STAGING_BRANCH} of this table (temporary): this transaction's parts wait until it ends"
            )));
        }
        (_, Some(_)) => {
            return Err(SinkError::Io(format!(
                "the parts this writer staged on {STAGING_BRANCH} were moved or removed by another writer (temporary): the transaction is written again"
            )));
        }
    };
    // Parts staged on the branch were built on `main` as it was; had
    // another writer committed to `main` since, building on the branch
    // would drop that commit from `main`. The transaction is read again
    // (the run restarts, which discards the branch) on top of it.
    if let (Some(staged), Some(main)) = (staging, md.current_snapshot())
        && !ancestry_from(md, Some(staged.snapshot_id()))
            .any(|s| s.snapshot_id() == main.snapshot_id())
    {
        return Err(SinkError::Io(format!(
            "another writer committed to the table while parts of a transaction were staged on {STAGING_BRANCH} (temporary): the transaction is written again on top of it"
        )));
    }
    let parent = staging.or(md.current_snapshot());
    let snap = NewSnapshot::after(table, parent.map(|p| p.snapshot_id()), snapshot_error);

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
    if !delta.staged {
        props.extend(mark_set.clone());
    }
    props.insert(COMMIT_ID_KEY.to_string(), delta.commit_id.clone());
    let operation = match (delta.data_files.is_empty(), delta.delete_files.is_empty()) {
        (false, true) => Operation::Append,
        (true, false) => Operation::Delete,
        _ => Operation::Overwrite,
    };

    // The two manifests are written, and the parent's list read, at once:
    // a commit waits for the slowest of their syncs, not for their sum.
    let data_manifest = async {
        match delta.data_files.is_empty() {
            true => Ok(None),
            false => {
                let files = ManifestFiles::Added(&delta.data_files);
                snap.manifest("-m0.avro", &spec, false, files)
                    .await
                    .map(Some)
            }
        }
    };
    let delete_manifest = async {
        match delta.delete_files.is_empty() {
            true => Ok(None),
            false => {
                let files = ManifestFiles::Added(&delta.delete_files);
                snap.manifest("-m1.avro", &delta.delete_spec, true, files)
                    .await
                    .map(Some)
            }
        }
    };
    // The parent's manifests carry forward unchanged (they keep their
    // sequence numbers). A manifest with no live file left (compaction's
    // deleted entries) is dropped: readers would skip it, and orphan
    // cleanup can then reclaim the files it lists once no kept snapshot
    // reads them.
    let carried = async {
        match parent {
            None => Ok(Vec::new()),
            Some(p) => carried_manifests(table, p).await,
        }
    };
    // Many small manifests are merged (see `manifest_merge`).
    let carried = async { Ok(merge_manifests(&snap, carried.await?).await) };
    let (data_manifest, delete_manifest, carried) =
        tokio::try_join!(data_manifest, delete_manifest, carried)?;
    let manifests: Vec<ManifestFile> = data_manifest
        .into_iter()
        .chain(delete_manifest)
        .chain(carried)
        .collect();
    let snapshot = snap.finish(manifests, operation, props).await?;
    if delta.staged {
        return next_metadata(table)
            .and_then(|b| b.set_branch_snapshot(snapshot, STAGING_BRANCH))
            .and_then(|b| b.build())
            .map_err(snapshot_error);
    }
    next_metadata(table)
        .and_then(|b| b.set_branch_snapshot(snapshot, MAIN_BRANCH))
        .map(|b| match staging {
            Some(_) => b.remove_ref(STAGING_BRANCH),
            None => b,
        })
        .and_then(|b| b.set_properties(mark_set))
        .and_then(|b| b.remove_properties(&mark_clear))
        .and_then(|b| b.build())
        .map_err(snapshot_error)
}

/// The manifests of `parent`'s list that still hold live files (see
/// [`build_row_delta`]): from the list as this process wrote it, when it
/// did ([`WRITTEN`]), else from the list file.
async fn carried_manifests(
    table: &Table,
    parent: &SnapshotRef,
) -> Result<Vec<ManifestFile>, SinkError> {
    let live = |m: &ManifestFile| m.has_added_files() || m.has_existing_files();
    let read = || async {
        table
            .manifest_list_reader(parent)
            .load()
            .await
            .map_err(snapshot_error)
            .map(|list| list.consume_entries().into_iter().collect::<Vec<_>>())
    };
    let kept = match parent.encryption_key_id() {
        None => WRITTEN.get(parent.manifest_list()),
        Some(_) => None,
    };
    let Some(kept) = kept else {
        return Ok(read().await?.into_iter().filter(|m| live(m)).collect());
    };
    if cfg!(debug_assertions) {
        // The tests' check that what is kept is what the file holds.
        let from_file = read().await?;
        assert_eq!(
            from_file.as_slice(),
            &kept[..],
            "the manifest list {} as kept differs from its file",
            parent.manifest_list()
        );
    }
    Ok(kept.iter().filter(|m| live(m)).cloned().collect())
}

/// Whether `md` holds parts of a transaction staged by a run that did not
/// commit them.
pub fn has_staging(md: &TableMetadata) -> bool {
    md.snapshot_for_ref(STAGING_BRANCH).is_some()
}

/// New metadata without the staging branch: its parts are discarded (the
/// transaction is read again from the committed position).
pub fn discard_staging(table: &Table) -> Result<TableMetadataBuildResult, SinkError> {
    next_metadata(table)
        .map(|b| b.remove_ref(STAGING_BRANCH))
        .and_then(|b| b.build())
        .map_err(io_error("removing the staging branch"))
}

fn compaction_error(e: iceberg::Error) -> SinkError {
    SinkError::Io(format!("writing the compaction snapshot: {e}"))
}

/// New metadata for `table` with a `replace` snapshot on the main branch:
/// `added` data files in, `added_deletes` position-delete files in (each
/// with the partition spec id of the data file it names), every file of
/// `removed` marked deleted with its
/// sequence numbers kept, every file of `kept` still live, and the table's
/// current commit mark in the summary. `removed` and `kept` are together
/// the current snapshot's live files, listed by `manifests` (the current
/// snapshot's). A manifest none of whose files is removed is carried as it
/// is; the kept files of the others are rewritten as existing entries
/// (snapshot id and sequence numbers kept). Compaction's commit (see
/// [`super::compaction`]).
pub async fn build_replace(
    table: &Table,
    added: &[DataFile],
    added_deletes: &[(DataFile, i32)],
    removed: &[&LiveFile],
    kept: &[&LiveFile],
    manifests: &[ManifestFile],
) -> Result<TableMetadataBuildResult, SinkError> {
    let md = table.metadata();
    let schema = md.current_schema().clone();
    let spec = md.default_partition_spec().clone();
    let snap = NewSnapshot::new(table, compaction_error);
    let spec_of = |id: i32| {
        md.partition_spec_by_id(id)
            .cloned()
            .ok_or_else(|| SinkError::Io(format!("compacting: no partition spec {id}")))
    };

    let mut collector = SnapshotSummaryCollector::default();
    collector.set_partition_summary_limit(0);
    for f in added {
        collector.add_file(f, schema.clone(), spec.clone());
    }
    for (f, spec_id) in added_deletes {
        collector.add_file(f, schema.clone(), spec_of(*spec_id)?);
    }
    for f in removed {
        collector.remove_file(f.entry.data_file(), schema.clone(), spec_of(f.spec_id)?);
    }
    let mut props = collector.build();
    add_totals(&mut props, md.current_snapshot().map(|p| p.summary()));
    if let Some(mark) = mark_from(md.properties()) {
        props.extend(mark_properties(&mark).0);
    }
    props.insert(COMMIT_ID_KEY.to_string(), snap.commit.to_string());

    let current = manifests;
    let mut manifests: Vec<ManifestFile> = Vec::new();
    if !added.is_empty() {
        let files = ManifestFiles::Added(added);
        manifests.push(snap.manifest("-m0.avro", &spec, false, files).await?);
    }
    // One manifest of added position deletes per partition spec.
    let mut specs: Vec<i32> = added_deletes.iter().map(|(_, id)| *id).collect();
    specs.sort_unstable();
    specs.dedup();
    for (n, spec_id) in specs.into_iter().enumerate() {
        let files: Vec<DataFile> = added_deletes
            .iter()
            .filter(|(_, id)| *id == spec_id)
            .map(|(f, _)| f.clone())
            .collect();
        let name = format!("-p{n}.avro");
        let listed = ManifestFiles::Added(&files);
        manifests.push(
            snap.manifest(&name, &spec_of(spec_id)?, true, listed)
                .await?,
        );
    }
    // Manifests that list a removed file are rewritten; the others, carried.
    let touched: BTreeSet<usize> = removed.iter().map(|f| f.manifest).collect();
    let (rewritten, carried): (Vec<&LiveFile>, Vec<&LiveFile>) =
        kept.iter().partition(|f| touched.contains(&f.manifest));
    let carried: BTreeSet<usize> = carried.iter().map(|f| f.manifest).collect();
    // One manifest of deleted entries, and one of the files that stay, per
    // content type and spec.
    for (prefix, files) in [("-d", removed), ("-k", &rewritten[..])] {
        for (n, ((deletes, spec_id), entries)) in by_content_and_spec(files).iter().enumerate() {
            let listed = if prefix == "-d" {
                ManifestFiles::Removed(entries)
            } else {
                ManifestFiles::Existing(entries)
            };
            let name = format!("{prefix}{n}.avro");
            manifests.push(
                snap.manifest(&name, &spec_of(*spec_id)?, *deletes, listed)
                    .await?,
            );
        }
    }
    for i in carried {
        let m = current
            .get(i)
            .ok_or_else(|| SinkError::Io(format!("compacting: no manifest {i}")))?;
        manifests.push(m.clone());
    }
    let snapshot = snap.finish(manifests, Operation::Replace, props).await?;
    next_metadata(table)
        .and_then(|b| b.set_branch_snapshot(snapshot, MAIN_BRANCH))
        .and_then(|b| b.build())
        .map_err(compaction_error)
}

/// `files`' entries grouped by (holds deletes, partition spec id): what one
/// manifest may list.
fn by_content_and_spec(files: &[&LiveFile]) -> Vec<((bool, i32), Vec<ManifestEntryRef>)> {
    let mut groups: Vec<((bool, i32), Vec<ManifestEntryRef>)> = Vec::new();
    for f in files {
        let key = (f.entry.content_type() != DataContentType::Data, f.spec_id);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(f.entry.clone()),
            None => groups.push((key, vec![f.entry.clone()])),
        }
    }
    groups
}

/// The table's metadata as the builder of its next version (the current
/// metadata file recorded as its predecessor).
pub fn next_metadata(table: &Table) -> Result<TableMetadataBuilder, iceberg::Error> {
    let current = current_metadata_location(table)
        .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e))?;
    Ok(table
        .metadata()
        .clone()
        .into_builder(Some(current.to_string())))
}

/// The table's current metadata file, or why there is none: the one way
/// the sink reads it (a commit, the SQL catalog's swap, orphan cleanup).
/// Not `metadata_location_result`, which builds its error (a backtrace,
/// when enabled) even when there is a location: twice on every commit.
pub fn current_metadata_location(table: &Table) -> Result<&str, String> {
    table
        .metadata_location()
        .ok_or_else(|| format!("the table {} has no metadata location", table.identifier()))
}

/// New metadata with only `cdc.position` changed (progress without data:
/// no snapshot, no files).
pub fn build_position_only(
    table: &Table,
    position: &str,
) -> Result<TableMetadataBuildResult, SinkError> {
    let (set, clear) = mark_properties(position);
    next_metadata(table)
        .and_then(|b| b.set_properties(set))
        .and_then(|b| b.remove_properties(&clear))
        .and_then(|b| b.build())
        .map_err(io_error("the table metadata"))
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

/// Whether the main branch's history, or the staging branch's, already
/// holds the commit `id`.
pub fn holds_commit(md: &TableMetadata, id: &str) -> bool {
    let staged = md.snapshot_for_ref(STAGING_BRANCH).map(|s| s.snapshot_id());
    ancestry(md).chain(ancestry_from(md, staged)).any(|s| {
        s.summary()
            .additional_properties
            .get(COMMIT_ID_KEY)
            .map(String::as_str)
            == Some(id)
    })
}

/// The live (added or existing) entries of `manifest`, with the sequence
/// numbers and snapshot ids they inherit from the manifest list: as this
/// process wrote them, when it did ([`WRITTEN_MANIFESTS`]), else from the
/// manifest file.
pub async fn alive_entries(
    table: &Table,
    manifest: &ManifestFile,
) -> Result<Vec<ManifestEntryRef>, iceberg::Error> {
    let read = || async {
        let loaded = manifest.load_manifest(table.file_io()).await?;
        Ok::<_, iceberg::Error>(
            loaded
                .entries()
                .iter()
                .filter(|e| e.is_alive())
                .cloned()
                .collect::<Vec<_>>(),
        )
    };
    let kept = match manifest.key_metadata {
        None => WRITTEN_MANIFESTS.alive_entries(manifest),
        Some(_) => None,
    };
    let Some(kept) = kept else {
        return read().await;
    };
    if cfg!(debug_assertions) {
        // The tests' check that what is kept is what the file holds.
        let from_file = read().await?;
        assert_eq!(
            from_file, kept,
            "the manifest {} as kept differs from its file",
            manifest.manifest_path
        );
    }
    Ok(kept)
}

/// The main branch's snapshots, newest first, following parent ids (not
/// the flat snapshot list: after a rollback, snapshots no longer on the
/// branch must not count).
pub fn ancestry(md: &TableMetadata) -> impl Iterator<Item = &iceberg::spec::SnapshotRef> {
    ancestry_from(md, md.current_snapshot_id())
}

/// The snapshots from `head` back, following parent ids.
fn ancestry_from(
    md: &TableMetadata,
    head: Option<i64>,
) -> impl Iterator<Item = &iceberg::spec::SnapshotRef> {
    let mut next = head;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn totals_continue_the_parents_or_are_left_out() {
        // The first snapshot: totals are its additions.
        let mut first = props(&[("added-data-files", "2"), ("added-records", "10")]);
        add_totals(&mut first, None);
        assert_eq!(first["total-data-files"], "2");
        assert_eq!(first["total-records"], "10");
        // Then: the parent's, plus and minus this snapshot's.
        let parent = Summary {
            operation: Operation::Append,
            additional_properties: first,
        };
        let mut next = props(&[("added-data-files", "1"), ("deleted-data-files", "2")]);
        add_totals(&mut next, Some(&parent));
        assert_eq!(next["total-data-files"], "1");
        assert_eq!(next["total-records"], "10");
        // A parent without totals (another writer's): none, not a restart
        // from 0.
        let foreign = Summary {
            operation: Operation::Append,
            additional_properties: HashMap::new(),
        };
        let mut after = props(&[("added-data-files", "1")]);
        add_totals(&mut after, Some(&foreign));
        assert!(!after.contains_key("total-data-files"), "{after:?}");
    }
}
