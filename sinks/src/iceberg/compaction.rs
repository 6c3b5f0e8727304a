//! Compaction: small data files of a partition group rewritten into few
//! large ones, with the table's equality deletes applied, in one `replace`
//! snapshot; delete files that no longer apply to anything dropped.
//!
//! Upsert by equality delete adds a delete file per batch, and every reader
//! applies every delete file to every older data file: left alone, a table
//! gets slower to read with each commit. Once a partition group (one
//! partition of one spec) has `min_input_files` candidates — data files
//! below `target_file_size`, and delete files applying to files a pass
//! would act on — a pass reads that group's small files (and, on a format-3
//! table, the large ones a delete applies to), with
//! the deletes applied (a delete applies only to data files of a lower
//! sequence number, as the spec says; one whose exact key bounds are
//! disjoint from a file's cannot apply to it), writes the rows as data
//! files of about `target_file_size`, and commits ONE snapshot that adds
//! them, marks the files read deleted, and keeps every other live file
//! with its own sequence numbers (a manifest with no file removed is
//! carried as it is). The rewritten files get the new snapshot's sequence
//! number, so no delete they already reflect applies to them again, and
//! every later batch's deletes do. A delete file is dropped once every
//! data file it applies to has been rewritten or converted (below); the
//! deletes are global (unpartitioned), so they go when every group they
//! touch has been.
//!
//! A data file at or above the target size that an equality delete
//! applies to is not rewritten: only its key columns are read, and the rows
//! the deletes remove from it are written as one position-delete file
//! naming it (this pass's; the position-delete files that named only files
//! rewritten or converted go), so a table of large files (an initial
//! snapshot's) is not
//! rewritten whole each time the stream updates a few of its keys, and
//! readers skip those rows by position instead of testing every row
//! against every deleted key (DuckDB: seconds per equality-delete file on
//! a million rows, milliseconds per position-delete file). A large file
//! only position deletes apply to is left as it is; one an equality delete
//! that must stay (for a group not rewritten) applies to is rewritten, as
//! it would otherwise be converted again every pass. Tables of format 3
//! (deletion vectors instead of position-delete files) rewrite it as
//! before.
//!
//! A pass runs in the sink's maintenance turn, under the table's lock, so
//! none of this pipeline's commits interleave; another writer's commit
//! makes the swap fail and the pass is abandoned until its next turn (its
//! files become orphans). The snapshot carries the table's current
//! `cdc.position` mark, so every snapshot keeps one.

use futures::TryStreamExt;
use iceberg::spec::{
    DataContentType, DataFile, Datum, ManifestEntryRef, ManifestFile, Struct,
    TableMetadataBuildResult,
};
use iceberg::table::Table;
use urutau_planner::sink::SinkError;

use super::deletes::DeletedKeys;
use super::files::{DataWriter, write_position_deletes};
use super::{commit, conform_by_name, io_error};
use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef as ArrowSchemaRef;
use iceberg::Runtime;
use iceberg::arrow::{ArrowReaderBuilder, schema_to_arrow_schema};
use iceberg::scan::{FileScanTask, FileScanTaskStream};

/// A live file of the current snapshot, with the partition spec of the
/// manifest that lists it.
pub struct LiveFile {
    pub entry: ManifestEntryRef,
    pub spec_id: i32,
    /// The manifest listing it: its index in [`LiveSnapshot::manifests`].
    pub manifest: usize,
}

/// The current snapshot's manifests and their live entries.
#[derive(Default)]
pub struct LiveSnapshot {
    pub manifests: Vec<ManifestFile>,
    pub files: Vec<LiveFile>,
}

/// The live entries (data and delete files) of the table's current
/// snapshot, and the manifests listing them.
pub async fn live_files(table: &Table) -> Result<LiveSnapshot, SinkError> {
    let err = io_error("reading the table's manifests");
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(LiveSnapshot::default());
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(&err)?;
    let mut live = LiveSnapshot::default();
    for (i, m) in list.entries().iter().enumerate() {
        live.files.extend(
            commit::alive_entries(table, m)
                .await
                .map_err(&err)?
                .into_iter()
                .map(|entry| LiveFile {
                    entry,
                    spec_id: m.partition_spec_id,
                    manifest: i,
                }),
        );
        live.manifests.push(m.clone());
    }
    Ok(live)
}

/// Whether the current snapshot's summary leaves room for `min_files`
/// candidates (its file totals bound them), so a turn that cannot compact
/// reads no manifest. Without totals, it may.
pub fn may_compact(table: &Table, min_files: usize) -> bool {
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return false;
    };
    let props = &snapshot.summary().additional_properties;
    let total = |k: &str| props.get(k).and_then(|v| v.parse::<usize>().ok());
    match (total("total-data-files"), total("total-delete-files")) {
        (Some(data), Some(deletes)) => data + deletes >= min_files,
        _ => true,
    }
}

/// What a compaction pass does with each live file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A data file read (deletes applied) and written anew.
    Rewrite,
    /// A large data file an equality delete applies to: it stays, and the
    /// rows the deletes remove from it are written as one position-delete
    /// file naming it.
    Convert,
    /// A delete file that no longer applies to any remaining data file:
    /// removed.
    Drop,
    /// Carried as it is.
    Keep,
}

/// One pass over the current snapshot's files: each live file's role.
pub struct CompactionPlan<'a> {
    pub files: Vec<(&'a LiveFile, Role)>,
    /// Partition groups rewritten.
    pub groups: usize,
}

impl CompactionPlan<'_> {
    /// The files of `role`.
    pub fn with(&self, role: Role) -> impl Iterator<Item = &LiveFile> {
        self.files
            .iter()
            .filter(move |(_, r)| *r == role)
            .map(|(f, _)| *f)
    }
}

/// What choosing roles needs to know of a live file.
#[derive(Debug, Clone, Copy)]
struct Facts {
    data: bool,
    /// An equality-delete file.
    equality: bool,
    size: u64,
    /// The partition group (data files; deletes are global).
    group: usize,
}

/// The pass over `live`, or `None` when it would do nothing.
///
/// An equality-delete file applies to a data file when its sequence
/// number is higher and, on every key column (`key_ids`) whose bounds both
/// files record exactly, their value ranges overlap (as Java's delete
/// index decides); a position-delete file, when its sequence number is
/// not lower and it names the data file (or names none).
/// The candidates of a partition group (one partition of one spec) are its
/// data files below `target_size` and the delete files that apply to one
/// of its data files a pass would act on (see below). In a group that has
/// `min_files` of them, every data file that is small or has a delete
/// applying to it is rewritten; the rewritten files take the new
/// snapshot's sequence number, so no old delete applies to them. With
/// `position_deletes` (a table that takes position-delete files), a large
/// file (at or above `target_size`) that an equality delete applies to is
/// converted instead ([`Role::Convert`]) unless such a delete must stay
/// (it applies to a file left as it is: then the file is rewritten, as it
/// would otherwise be converted again every pass), and one only position
/// deletes apply to stays as it is and is not acted on. A delete file goes
/// once every data file it applies to is rewritten or converted (one that
/// applies to nothing goes even when no group is rewritten); until then
/// it stays.
pub fn plan<'a>(
    live: &'a [LiveFile],
    target_size: u64,
    min_files: usize,
    key_ids: &[i32],
    position_deletes: bool,
) -> Option<CompactionPlan<'a>> {
    let mut groups: HashMap<(i32, &Struct), usize> = HashMap::new();
    let facts: Vec<Facts> = live
        .iter()
        .map(|f| {
            let e = &f.entry;
            let data = e.content_type() == DataContentType::Data;
            let next = groups.len();
            let group = if data {
                *groups
                    .entry((f.spec_id, e.data_file().partition()))
                    .or_insert(next)
            } else {
                usize::MAX
            };
            Facts {
                data,
                equality: e.content_type() == DataContentType::EqualityDeletes,
                size: e.file_size_in_bytes(),
                group,
            }
        })
        .collect();
    let applies = |delete: usize, data: usize| {
        let (d, f) = (&live[delete].entry, &live[data].entry);
        if d.content_type() == DataContentType::PositionDeletes {
            // Of a lower or equal sequence number, and the file it names
            // (when it names one).
            let not_earlier = match (d.sequence_number(), f.sequence_number()) {
                (Some(d), Some(f)) => d >= f,
                _ => true,
            };
            let names = d
                .data_file()
                .referenced_data_file()
                .is_none_or(|p| p == f.file_path());
            return not_earlier && names;
        }
        let later = match (d.sequence_number(), f.sequence_number()) {
            (Some(d), Some(f)) => d > f,
            _ => true,
        };
        later && key_ranges_overlap(d.data_file(), f.data_file(), key_ids)
    };
    let (roles, rewritten) = choose(&facts, target_size, min_files, position_deletes, applies)?;
    Some(CompactionPlan {
        files: live.iter().zip(roles).collect(),
        groups: rewritten,
    })
}

/// Whether two files may hold a common key: false only when, on some key
/// column, both record exact bounds and the ranges are disjoint. Bounds of
/// text and binary columns may be truncated, so they are not trusted.
fn key_ranges_overlap(a: &DataFile, b: &DataFile, key_ids: &[i32]) -> bool {
    fn bounds<'f>(f: &'f DataFile, id: &i32) -> Option<(&'f Datum, &'f Datum)> {
        let lower = f.lower_bounds().get(id)?;
        let upper = f.upper_bounds().get(id)?;
        exact_bound(lower).then_some((lower, upper))
    }
    key_ids
        .iter()
        .all(|id| match (bounds(a, id), bounds(b, id)) {
            (Some((a_low, a_high)), Some((b_low, b_high))) => !(a_high < b_low || b_high < a_low),
            _ => true,
        })
}

/// Whether a bound of this type is the exact minimum or maximum.
fn exact_bound(d: &Datum) -> bool {
    use iceberg::spec::PrimitiveType as P;
    matches!(
        d.data_type(),
        P::Int
            | P::Long
            | P::Date
            | P::Time
            | P::Timestamp
            | P::Timestamptz
            | P::TimestampNs
            | P::TimestamptzNs
            | P::Decimal { .. }
            | P::Uuid
            | P::Boolean
    )
}

/// The roles of `files` (see [`plan`]) given which delete applies to which
/// data file (`applies(delete index, data index)`), and how many groups
/// are rewritten; `None` when nothing would change.
fn choose(
    files: &[Facts],
    target_size: u64,
    min_files: usize,
    convert: bool,
    applies: impl Fn(usize, usize) -> bool,
) -> Option<(Vec<Role>, usize)> {
    let deletes: Vec<usize> = (0..files.len()).filter(|i| !files[*i].data).collect();
    // Which delete applies to which data file, asked once per pair: the
    // data files each delete applies to.
    let targets: Vec<Vec<usize>> = deletes
        .iter()
        .map(|d| {
            (0..files.len())
                .filter(|f| files[*f].data && applies(*d, *f))
                .collect()
        })
        .collect();
    // Data files some delete applies to, and some equality delete.
    let (mut hit, mut hit_by_equality) = (vec![false; files.len()], vec![false; files.len()]);
    for (d, t) in deletes.iter().zip(&targets) {
        for f in t {
            hit[*f] = true;
            hit_by_equality[*f] |= files[*d].equality;
        }
    }
    let groups = files
        .iter()
        .filter(|f| f.data)
        .map(|f| f.group + 1)
        .max()
        .unwrap_or(0);
    // What a pass of the file's group would do something with: a small
    // file (rewritten), or a large one a delete applies to (converted when
    // an equality delete does, else left with its position deletes;
    // rewritten when position-delete files are not an option).
    let acted_on = |f: usize| {
        files[f].size < target_size
            || match convert {
                true => hit_by_equality[f],
                false => hit[f],
            }
    };
    // Candidates per group: small files, then deletes applying to a file
    // a pass would act on (a position-delete file that stays with a large
    // file, a conversion's own, would otherwise call a pass every turn).
    let mut candidates = vec![0usize; groups];
    for f in files.iter().filter(|f| f.data && f.size < target_size) {
        candidates[f.group] += 1;
    }
    for t in &targets {
        let mut touched: Vec<usize> = t
            .iter()
            .filter(|f| acted_on(**f))
            .map(|f| files[*f].group)
            .collect();
        touched.sort_unstable();
        touched.dedup();
        touched.into_iter().for_each(|g| candidates[g] += 1);
    }
    let chosen: Vec<bool> = candidates.iter().map(|c| *c >= min_files).collect();
    let mut roles: Vec<Role> = files
        .iter()
        .enumerate()
        .map(|(i, f)| match f.data && chosen[f.group] {
            false => Role::Keep,
            true if f.size < target_size => Role::Rewrite,
            true if convert && hit_by_equality[i] => Role::Convert,
            // Position deletes are already what a conversion writes.
            true if convert => Role::Keep,
            true if hit[i] => Role::Rewrite,
            true => Role::Keep,
        })
        .collect();
    // A delete that applies to no data file that stays as it is goes: the
    // rewritten files hold its effect, and a converted file's new
    // position deletes do. A converted file keeps its sequence number, so
    // an equality delete that stays (it applies to a file of a group not
    // rewritten too) would apply to it again and convert it on every pass:
    // such a file is rewritten instead (then no delete of now applies to
    // it). Rewritten or converted counts the same for a delete, so which
    // deletes go is known before that change.
    let spent: Vec<bool> = targets
        .iter()
        .map(|t| {
            t.iter()
                .all(|f| matches!(roles[*f], Role::Rewrite | Role::Convert))
        })
        .collect();
    for ((d, t), spent) in deletes.iter().zip(&targets).zip(&spent) {
        if *spent {
            roles[*d] = Role::Drop;
        } else if files[*d].equality {
            for f in t {
                if roles[*f] == Role::Convert {
                    roles[*f] = Role::Rewrite;
                }
            }
        }
    }
    if roles.iter().all(|r| *r == Role::Keep) {
        return None;
    }
    Some((roles, chosen.iter().filter(|c| **c).count()))
}

/// Carries out `plan` on the table's current snapshot and builds the
/// `replace` snapshot; also returns the files written (data files, then
/// the converted files' position-delete files).
///
/// The deletes are applied here, not by iceberg-rust's scan: its delete
/// loader can wait forever on a notifier it replaced (apache/iceberg-rust
/// PR 2630, seen here as a compaction that never finished). Each data file
/// is read on its own without deletes, and a row is dropped when an
/// equality delete of its key has a higher sequence number than the file.
pub async fn build_compaction(
    table: &Table,
    plan: &CompactionPlan<'_>,
    manifests: &[ManifestFile],
    target_size: u64,
) -> Result<(TableMetadataBuildResult, Vec<DataFile>), SinkError> {
    let err = io_error("compacting");
    let md = table.metadata();
    let schema = md.current_schema().clone();
    // The rows are rewritten in the table's current schema (the one the
    // data writer writes), whatever schema this sink loaded at start.
    let arrow: ArrowSchemaRef = Arc::new(schema_to_arrow_schema(&schema).map_err(&err)?);
    // Every live delete applies to the rewritten rows, dropped or not.
    let live: Vec<&LiveFile> = plan.files.iter().map(|(f, _)| *f).collect();
    let deletes = DeletedKeys::load(table, &arrow, &live, "compacting").await?;
    let field_ids: Vec<i32> = schema.as_struct().fields().iter().map(|f| f.id).collect();
    let reader = ArrowReaderBuilder::new(
        table.file_io().clone(),
        Runtime::try_current().map_err(&err)?,
    )
    .with_data_file_concurrency_limit(1)
    .build();
    // Keys may repeat (an append table): the key keeps its dictionary.
    let mut writer = DataWriter::new(
        table,
        usize::try_from(target_size).unwrap_or(usize::MAX),
        false,
    );
    let data_seq = |e: &ManifestEntryRef| {
        e.sequence_number().ok_or_else(|| {
            SinkError::Io(format!(
                "compacting: {} has no sequence number",
                e.file_path()
            ))
        })
    };
    let whole_file = |e: &ManifestEntryRef, field_ids: &[i32]| {
        let task = FileScanTask::builder()
            .with_file_size_in_bytes(e.file_size_in_bytes())
            .with_start(0)
            .with_length(e.file_size_in_bytes())
            .with_record_count(Some(e.record_count()))
            .with_data_file_path(e.file_path().to_string())
            .with_data_file_format(e.file_format())
            .with_schema(schema.clone())
            .with_project_field_ids(field_ids.to_vec())
            .with_case_sensitive(true)
            .build();
        let tasks: FileScanTaskStream = Box::pin(futures::stream::iter([Ok(task)]));
        reader.clone().read(tasks).map_err(&err)
    };
    for f in plan.with(Role::Rewrite) {
        let e = &f.entry;
        let data_seq = data_seq(e)?;
        let mut rows = whole_file(e, &field_ids)?.stream();
        // The file is read whole and in order: a batch's first row's
        // position is the rows before it.
        let mut first_row = 0i64;
        while let Some(batch) = rows.try_next().await.map_err(&err)? {
            let read = batch.num_rows() as i64;
            let batch = conform_by_name(&batch, &arrow)
                .map_err(|e| SinkError::Io(format!("compacting: {e}")))?;
            let batch = deletes.apply(batch, e.file_path(), data_seq, first_row)?;
            first_row += read;
            writer.write(batch).await?;
        }
    }
    let mut added = writer.close().await?;
    // A converted file: its key columns only, and the positions of the
    // rows the deletes remove.
    let key_ids: Vec<i32> = schema.identifier_field_ids().collect();
    let key_arrow: ArrowSchemaRef = Arc::new(
        arrow
            .project(deletes.key())
            .map_err(|e| SinkError::Io(format!("compacting: {e}")))?,
    );
    let key: Vec<usize> = (0..key_ids.len()).collect();
    let mut added_deletes = Vec::new();
    for f in plan.with(Role::Convert) {
        let e = &f.entry;
        let data_seq = data_seq(e)?;
        let mut rows = whole_file(e, &key_ids)?.stream();
        let (mut first_row, mut positions) = (0i64, Vec::new());
        while let Some(batch) = rows.try_next().await.map_err(&err)? {
            let read = batch.num_rows() as i64;
            let batch = conform_by_name(&batch, &key_arrow)
                .map_err(|e| SinkError::Io(format!("compacting: {e}")))?;
            positions.extend(deletes.deleted_positions(
                &batch,
                &key,
                e.file_path(),
                data_seq,
                first_row,
            )?);
            first_row += read;
        }
        if !positions.is_empty() {
            let file = write_position_deletes(table, e.data_file(), positions, f.spec_id).await?;
            added_deletes.push((file, f.spec_id));
        }
    }
    let removed: Vec<&LiveFile> = plan
        .with(Role::Rewrite)
        .chain(plan.with(Role::Drop))
        .collect();
    let kept: Vec<&LiveFile> = plan
        .with(Role::Keep)
        .chain(plan.with(Role::Convert))
        .collect();
    let result =
        commit::build_replace(table, &added, &added_deletes, &removed, &kept, manifests).await?;
    added.extend(added_deletes.into_iter().map(|(f, _)| f));
    Ok((result, added))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    /// A file and its sequence number.
    type File = (Facts, i64);

    fn data(group: usize, size: u64, seq: i64) -> File {
        (
            Facts {
                data: true,
                equality: false,
                size,
                group,
            },
            seq,
        )
    }

    /// An equality-delete file.
    fn delete(seq: i64) -> File {
        (
            Facts {
                data: false,
                equality: true,
                size: MB,
                group: usize::MAX,
            },
            seq,
        )
    }

    fn position_delete(seq: i64) -> File {
        let (facts, seq) = delete(seq);
        (
            Facts {
                equality: false,
                ..facts
            },
            seq,
        )
    }

    /// `choose` with the sequence-number rule alone, on a table that takes
    /// position-delete files.
    fn roles(files: &[File], target: u64, min: usize) -> Option<(Vec<Role>, usize)> {
        roles_of(files, target, min, true)
    }

    fn roles_of(
        files: &[File],
        target: u64,
        min: usize,
        convert: bool,
    ) -> Option<(Vec<Role>, usize)> {
        let facts: Vec<Facts> = files.iter().map(|f| f.0).collect();
        choose(&facts, target, min, convert, |d, f| {
            applies_by_sequence(files, d, f)
        })
    }

    /// The spec's rule: an equality delete applies to data files of a lower
    /// sequence number, a position delete to those of a lower or equal one.
    fn applies_by_sequence(files: &[File], d: usize, f: usize) -> bool {
        match files[d].0.equality {
            true => files[d].1 > files[f].1,
            false => files[d].1 >= files[f].1,
        }
    }

    #[test]
    fn a_group_with_enough_candidates_is_rewritten_and_spent_deletes_go() {
        let files = [
            data(0, MB, 1),
            data(0, MB, 2),
            data(0, MB, 3),
            delete(4),
            delete(5),
        ];
        let (r, groups) = roles(&files, 512 * MB, 5).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Rewrite, Rewrite, Drop, Drop]);
        assert_eq!(groups, 1);
        assert!(roles(&files, 512 * MB, 6).is_none(), "5 candidates < 6");
    }

    #[test]
    fn only_groups_with_enough_candidates_are_rewritten() {
        // Group 0: four small files; group 1: one. The delete (seq 10)
        // applies to both, so it stays while group 1's file does.
        let files = [
            data(0, MB, 1),
            data(0, MB, 2),
            data(0, MB, 3),
            data(0, MB, 4),
            data(1, MB, 5),
            delete(10),
        ];
        let (r, groups) = roles(&files, 512 * MB, 5).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Rewrite, Rewrite, Rewrite, Keep, Keep]);
        assert_eq!(groups, 1);
    }

    #[test]
    fn a_large_file_no_delete_applies_to_stays_and_older_deletes_go() {
        // The large file (seq 7) is newer than every delete: nothing
        // applies to it, so it is not read, and the deletes apply to
        // nothing that remains.
        let files = [
            data(0, MB, 1),
            data(0, MB, 2),
            data(0, 600 * MB, 7),
            delete(3),
            delete(6),
        ];
        let (r, _) = roles(&files, 512 * MB, 4).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Rewrite, Keep, Drop, Drop]);
    }

    #[test]
    fn a_large_file_an_equality_delete_applies_to_is_converted() {
        // Its old position deletes (seq 3) and the equality delete (seq 4)
        // go: the conversion's position-delete file holds both.
        let files = [
            data(0, MB, 1),
            data(0, 600 * MB, 2),
            position_delete(3),
            delete(4),
        ];
        let (r, _) = roles(&files, 512 * MB, 2).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Convert, Drop, Drop]);
        // Format 3 (no position-delete files): rewritten.
        let (r, _) = roles_of(&files, 512 * MB, 2, false).unwrap();
        assert_eq!(r, [Rewrite, Rewrite, Drop, Drop]);
    }

    #[test]
    fn position_deletes_that_stay_with_large_files_call_no_pass() {
        // Four large files, each with the position-delete file its
        // conversion wrote, and the small output of the last pass: one
        // candidate, not five, so no pass rewrites that file every turn.
        let files = [
            data(0, 600 * MB, 1),
            data(0, 600 * MB, 2),
            data(0, 600 * MB, 3),
            data(0, 600 * MB, 4),
            position_delete(5),
            position_delete(5),
            position_delete(5),
            position_delete(5),
            data(0, MB, 5),
        ];
        let facts: Vec<Facts> = files.iter().map(|f| f.0).collect();
        // The position-delete file at index 4 + i names data file i.
        let applies = |d: usize, f: usize| d - 4 == f;
        assert!(choose(&facts, 512 * MB, 5, true, applies).is_none());
        // On a format-3 table the files they name are rewritten.
        let (r, _) = choose(&facts, 512 * MB, 5, false, applies).unwrap();
        use Role::*;
        assert_eq!(
            r,
            [
                Rewrite, Rewrite, Rewrite, Rewrite, Drop, Drop, Drop, Drop, Rewrite
            ]
        );
    }

    #[test]
    fn a_large_file_an_equality_delete_of_a_group_not_rewritten_applies_to_is_rewritten() {
        // Group 0 (a large file, two small ones) is compacted, group 1's
        // small file is not; the equality delete of seq 5 applies to both
        // groups, so it stays, and the large file is rewritten (converted,
        // that delete would apply to it again and convert it every pass).
        // The delete of seq 6 applies to the large file only: it goes.
        let files = [
            data(0, 600 * MB, 1),
            data(0, MB, 2),
            data(0, MB, 3),
            data(1, MB, 4),
            delete(5),
            delete(6),
        ];
        let facts: Vec<Facts> = files.iter().map(|f| f.0).collect();
        let applies = |d: usize, f: usize| match d {
            5 => f == 0,
            _ => applies_by_sequence(&files, d, f),
        };
        let (r, groups) = choose(&facts, 512 * MB, 3, true, applies).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Rewrite, Rewrite, Keep, Keep, Drop]);
        assert_eq!(groups, 1);
    }

    #[test]
    fn a_large_file_only_position_deletes_apply_to_stays_with_them() {
        let files = [
            data(0, MB, 1),
            data(0, MB, 2),
            data(0, 600 * MB, 3),
            position_delete(4),
        ];
        let (r, _) = roles(&files, 512 * MB, 2).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Rewrite, Keep, Keep]);
    }

    #[test]
    fn a_delete_newer_than_a_kept_file_stays() {
        // Group 1's file (seq 2) stays and the delete of seq 9 applies to
        // it; the delete of seq 1 applies to nothing that remains.
        let files = [
            data(0, MB, 3),
            data(0, MB, 4),
            data(0, MB, 5),
            data(1, 600 * MB, 2),
            delete(1),
            delete(9),
        ];
        let (r, _) = roles(&files, 512 * MB, 3).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Rewrite, Rewrite, Keep, Drop, Keep]);
    }

    #[test]
    fn a_delete_that_applies_to_nothing_goes_without_a_rewrite() {
        // Too few candidates to rewrite anything, but the delete of seq 1
        // is older than every data file.
        let files = [data(0, 600 * MB, 2), delete(1), delete(3)];
        let (r, groups) = roles(&files, 512 * MB, 5).unwrap();
        use Role::*;
        assert_eq!(r, [Keep, Drop, Keep]);
        assert_eq!(groups, 0);
        // A table of deletes only: they all go.
        let (r, _) = roles(&[delete(1), delete(2)], 512 * MB, 5).unwrap();
        assert_eq!(r, [Drop, Drop]);
    }

    #[test]
    fn disjoint_key_ranges_keep_a_delete_off_a_group() {
        // Group 1's file holds keys another range than the deletes touch:
        // they neither make it a candidate nor stay for it.
        let files = [
            data(0, MB, 1),
            data(0, MB, 2),
            data(1, MB, 3),
            delete(4),
            delete(5),
        ];
        let facts: Vec<Facts> = files.iter().map(|f| f.0).collect();
        let applies = |d: usize, f: usize| files[d].1 > files[f].1 && files[f].0.group == 0;
        let (r, groups) = choose(&facts, 512 * MB, 4, true, applies).unwrap();
        use Role::*;
        assert_eq!(r, [Rewrite, Rewrite, Keep, Drop, Drop]);
        assert_eq!(groups, 1);
    }

    fn file_with_bounds(low: Datum, high: Datum) -> DataFile {
        use iceberg::spec::{DataFileBuilder, DataFileFormat};
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path("f".into())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::empty())
            .record_count(1)
            .file_size_in_bytes(1)
            .lower_bounds(HashMap::from([(1, low)]))
            .upper_bounds(HashMap::from([(1, high)]))
            .build()
            .unwrap()
    }

    #[test]
    fn key_ranges_overlap_only_on_exact_bounds() {
        let a = file_with_bounds(Datum::long(1), Datum::long(20));
        let b = file_with_bounds(Datum::long(1001), Datum::long(1020));
        let c = file_with_bounds(Datum::long(15), Datum::long(1005));
        assert!(!key_ranges_overlap(&a, &b, &[1]));
        assert!(key_ranges_overlap(&a, &c, &[1]) && key_ranges_overlap(&b, &c, &[1]));
        assert!(key_ranges_overlap(&a, &b, &[]), "no key: no evidence");
        assert!(key_ranges_overlap(&a, &b, &[2]), "no bounds: no evidence");
        // Text bounds may be truncated: never trusted.
        let s = file_with_bounds(Datum::string("a"), Datum::string("b"));
        let t = file_with_bounds(Datum::string("x"), Datum::string("y"));
        assert!(key_ranges_overlap(&s, &t, &[1]));
    }
}
