//! An initial snapshot's rows gathered into data files of the target size.
//!
//! While a table's snapshot runs, the runner lets the sink defer its
//! batches ([`urutau_planner::sink::Sink::prepare`]'s `may_defer`): each
//! batch's rows that are plain appends (a key outside every known key
//! range, not deleted: every snapshot row of a key the stream has not
//! written) go into one data writer kept open across batches, so a
//! snapshot leaves files of the target size instead of one small file per
//! commit. The rest of a batch (rows replacing or deleting a key the table
//! or the group may hold: the stream's changes to keys already copied) is
//! held in memory, in order. A delete of a key neither holds deletes
//! nothing and is dropped: held, it would be written after the appends and
//! delete the key if the stream inserted it again.
//!
//! The group closes when a file reaches the target size, after
//! [`MAX_AGE`], once [`MAX_HELD_ROWS`] rows are held, or at a batch that
//! may not be deferred; the batch that closes it commits it (its rows
//! join the group first): the appended rows are staged, then the held
//! rows, collapsed to the last change of each key and written as one
//! part, are committed with the batch's position, which publishes both on
//! `main`. Why the order is right: the appended part's sequence number is
//! below the held part's, and an equality delete applies to rows of lower
//! ones. A held row's key was present when it was held (in the table or
//! appended to the group); every appended row's key was absent when
//! appended and key ranges only grow, so an appended row's key is never
//! one held before it, while a held change of a key appended before it
//! applies, as it must; and of several held changes of one key only the
//! last is written, as applying them in order would leave. Crash safety
//! is the staging branch's: a group not committed leaves nothing visible
//! and no position, and the source sends its batches again.
//!
//! Position deletes: a held change of a key the group appended removes
//! that row by its position in the group's file ([`find_appended`] reads
//! the key column back), not by an equality delete: the key was in no
//! committed file when appended, so the appended row is the only one to
//! remove, and readers apply a position per row where an equality delete
//! costs DuckDB and iceberg-rust a predicate on every row. The held part's
//! sequence number is above the group's file's, and a position delete
//! applies to data files of a lower or equal one.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::collections::{HashMap, HashSet};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::compute::{concat, concat_batches, take, take_record_batch};
use arrow::datatypes::Field;
use arrow::row::{RowConverter, SortField};
use iceberg::spec::DataFile;
use iceberg::table::Table;
use urutau_planner::sink::{SinkBatch, SinkError};

use super::files::{DataWriter, each_column_batch};
use super::key_ranges::integers;
use super::{Fresh, PreparedFiles, durable, io_error};

/// The longest a group stays open: the rows it holds are neither visible
/// nor acknowledged to the source until it closes.
pub(super) const MAX_AGE: Duration = Duration::from_secs(60);

/// Rows a group holds at most (the stream's changes to copied keys, kept in
/// memory until the group closes).
pub(super) const MAX_HELD_ROWS: usize = 100_000;

/// The size a group's row groups end at: an eighth of the target, between
/// 1 MiB and 16 MiB. An open row group is held in memory (twice, briefly,
/// when it is flushed), so this bounds what a group adds to the process.
fn row_group_bytes(target_size: usize) -> usize {
    (target_size / 8).clamp(1 << 20, 16 << 20)
}

/// Rows of deferred batches not committed yet (see the module doc).
pub(super) struct SnapshotGroup {
    writer: DataWriter,
    target_size: usize,
    /// The size row groups end at ([`row_group_bytes`]).
    row_group_bytes: usize,
    /// Upsert: the appended keys are new (no equality delete), and a
    /// commit that finds another writer's reads them back from the files
    /// to check them (kept in memory they would cost 8 bytes a row).
    upsert: bool,
    /// [`super::Writing::others_seen`] when the group opened.
    others_seen: u64,
    opened: Instant,
    /// Rows that are not plain appends, in the route's form, in order.
    held: Vec<SinkBatch>,
    held_rows: usize,
}

/// A closed group: its appended rows' files, to stage first, and its held
/// rows as one batch (the last change of each key), to write and stage
/// after them.
pub(super) struct ClosedGroup {
    pub(super) appended: PreparedFiles,
    pub(super) held: Option<SinkBatch>,
}

impl SnapshotGroup {
    /// An empty group writing `table`'s data files of `target_size` bytes;
    /// `unique_keys` when the rows hold each key once (an upsert table).
    pub(super) fn open(
        table: &Table,
        target_size: usize,
        unique_keys: bool,
        others_seen: u64,
    ) -> Self {
        let target_size = target_size.max(1);
        let row_group_bytes = row_group_bytes(target_size);
        SnapshotGroup {
            // The group closes its files itself, at the target size.
            writer: DataWriter::new(table, usize::MAX, unique_keys)
                .with_row_group_bytes(row_group_bytes),
            target_size,
            row_group_bytes,
            upsert: unique_keys,
            others_seen,
            opened: Instant::now(),
            held: Vec::new(),
            held_rows: 0,
        }
    }

    /// Appends `rows` (the table's Arrow form; upserting, rows of new
    /// keys).
    pub(super) async fn append(&mut self, rows: RecordBatch) -> Result<(), SinkError> {
        self.writer.write(rows).await
    }

    /// Holds rows that are not plain appends (changes of keys the table
    /// may hold), to be written after the appended rows.
    pub(super) fn hold(&mut self, rows: SinkBatch) {
        if rows.rows.num_rows() > 0 {
            self.held_rows += rows.rows.num_rows();
            self.held.push(rows);
        }
    }

    /// The local files the group has written so far (none of them is
    /// referenced by the table yet: orphan cleanup must leave them).
    pub(super) fn local_paths(&self) -> Vec<PathBuf> {
        self.writer
            .open_paths()
            .iter()
            .map(|p| p.as_str())
            .chain(self.writer.closed().iter().map(|f| f.file_path()))
            .filter_map(durable::local_path)
            .collect()
    }

    /// Why the group should close now (`None`: it stays open). A file's
    /// size is its flushed row groups (exact) and an estimate of the open
    /// one, which is below `row_group_bytes` after every write: past
    /// `target + row_group_bytes` the flushed part alone exceeds the
    /// target, so every file the group closes for its size is at least the
    /// target (and at most about the target and two row groups).
    pub(super) fn due(&self) -> Option<&'static str> {
        let full = self.target_size.saturating_add(self.row_group_bytes);
        if self.writer.largest_open_size() >= full {
            Some("file size")
        } else if self.opened.elapsed() >= MAX_AGE {
            Some("age")
        } else if self.held_rows >= MAX_HELD_ROWS {
            Some("held rows")
        } else {
            None
        }
    }

    /// Closes the group's files; `key` names the key column of the held
    /// rows.
    pub(super) async fn close(self, key: &str) -> Result<ClosedGroup, SinkError> {
        let data_files = self.writer.close().await?;
        Ok(ClosedGroup {
            appended: PreparedFiles {
                data_files,
                delete_files: vec![],
                fresh: match self.upsert {
                    true => Fresh::InDataFiles,
                    false => Fresh::None,
                },
                others_seen: self.others_seen,
            },
            held: last_change_of_each_key(self.held, key)?,
        })
    }
}

/// `held` as one batch with the last change of each key only (`None` when
/// nothing is held).
fn last_change_of_each_key(
    held: Vec<SinkBatch>,
    key: &str,
) -> Result<Option<SinkBatch>, SinkError> {
    let err = io_error("collapsing the held changes");
    let Some(first) = held.first() else {
        return Ok(None);
    };
    let rows = concat_batches(&first.rows.schema(), held.iter().map(|b| &b.rows)).map_err(&err)?;
    let deletes: Vec<&dyn Array> = held.iter().map(|b| &b.deletes as &dyn Array).collect();
    let deletes = concat(&deletes).map_err(&err)?;
    let column = rows
        .column_by_name(key)
        .ok_or_else(|| SinkError::Io(format!("the held rows have no key column {key}")))?;
    let converter =
        RowConverter::new(vec![SortField::new(column.data_type().clone())]).map_err(&err)?;
    let keys = converter
        .convert_columns(std::slice::from_ref(column))
        .map_err(&err)?;
    let mut seen = HashSet::new();
    let mut last: Vec<u32> = (0..rows.num_rows())
        .rev()
        .filter(|i| seen.insert(keys.row(*i).as_ref().to_vec()))
        .map(|i| i as u32)
        .collect();
    last.reverse();
    let last = UInt32Array::from(last);
    Ok(Some(SinkBatch {
        rows: take_record_batch(&rows, &last).map_err(&err)?,
        deletes: take(&deletes, &last, None)
            .map_err(&err)?
            .as_boolean()
            .clone(),
    }))
}

/// Where a closed group's data files hold keys of its held rows.
pub(super) struct Appended {
    /// Which held rows' keys the group appended.
    pub(super) held: BooleanArray,
    /// For each data file (by index) holding such keys, their rows'
    /// positions, ascending.
    pub(super) positions: Vec<(usize, Vec<i64>)>,
}

impl Appended {
    /// No held row's key found (`rows` held rows).
    pub(super) fn none(rows: usize) -> Self {
        Appended {
            held: BooleanArray::from(vec![false; rows]),
            positions: Vec::new(),
        }
    }
}

/// Finds the held rows' keys (`held_keys`, the table's Arrow form of
/// `field`, an integer key: a group opens for no other) in the group's
/// data files `files`, reading back their key column: each key is in them
/// once at most (it was appended only while no range held it, and then
/// joined the ranges).
pub(super) async fn find_appended(
    table: &Table,
    files: &[DataFile],
    held_keys: &ArrayRef,
    field: &Field,
) -> Result<Appended, SinkError> {
    let not_integer = || {
        SinkError::Io(format!(
            "internal: a snapshot group's key {} is not an integer",
            field.name()
        ))
    };
    let wanted: HashMap<i64, usize> = integers(held_keys)
        .ok_or_else(not_integer)?
        .enumerate()
        .filter_map(|(i, k)| Some((k?, i)))
        .collect();
    let mut found = vec![false; held_keys.len()];
    let mut positions = Vec::new();
    for (n, file) in files.iter().enumerate() {
        let mut at = Vec::new();
        let mut first_row = 0i64;
        each_column_batch(table, file, field, |keys| {
            for (i, key) in integers(keys).ok_or_else(not_integer)?.enumerate() {
                if let Some(h) = key.and_then(|k| wanted.get(&k)) {
                    found[*h] = true;
                    at.push(first_row + i as i64);
                }
            }
            first_row += keys.len() as i64;
            Ok(())
        })
        .await?;
        if !at.is_empty() {
            positions.push((n, at));
        }
    }
    Ok(Appended {
        held: BooleanArray::from(found),
        positions,
    })
}
