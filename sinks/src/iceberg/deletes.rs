//! The keys a table's equality deletes remove and the rows its position
//! deletes remove, read once and applied by hashing each data row's key
//! and looking up its position: what compaction rewrites with, and what a
//! query reads with (an equality delete applies to the data files of a
//! lower sequence number, a position delete to those of a lower or equal
//! one, as the spec says).

use std::collections::{HashMap, HashSet};

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::{cast, filter_record_batch};
use arrow::datatypes::SchemaRef as ArrowSchemaRef;
use arrow::datatypes::{DataType, Int64Type};
use arrow_row::{RowConverter, SortField};
use iceberg::spec::DataContentType;
use iceberg::table::Table;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use urutau_planner::sink::SinkError;

use super::compaction::LiveFile;
use super::schema;

/// The keys the table's equality deletes remove, each with the highest
/// sequence number a delete of it carries.
pub(super) struct DeletedKeys {
    /// Key columns' positions in the table's Arrow schema.
    key: Vec<usize>,
    converter: RowConverter,
    seq: HashMap<Vec<u8>, i64>,
    /// Position deletes: data file path -> row position -> the highest
    /// sequence number a delete of it carries.
    positions: HashMap<String, HashMap<i64, i64>>,
}

impl DeletedKeys {
    /// Reads every delete file among `live` (an equality delete must
    /// delete by the table's key). `doing` names the caller in errors.
    pub(super) async fn load(
        table: &Table,
        arrow: &ArrowSchemaRef,
        live: &[&LiveFile],
        doing: &str,
    ) -> Result<DeletedKeys, SinkError> {
        let err =
            |e: iceberg::Error| SinkError::Io(format!("{doing}: reading the delete files: {e}"));
        let schema = table.metadata().current_schema();
        let key_ids: Vec<i32> = schema.identifier_field_ids().collect();
        let mut key = Vec::new();
        for id in &key_ids {
            let name = schema
                .name_by_field_id(*id)
                .ok_or_else(|| SinkError::Io(format!("{doing}: no field {id}")))?;
            key.push(
                arrow
                    .index_of(name)
                    .map_err(|e| SinkError::Io(e.to_string()))?,
            );
        }
        let fields = key
            .iter()
            .map(|i| SortField::new(arrow.field(*i).data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(|e| SinkError::Io(e.to_string()))?;
        let mut seq: HashMap<Vec<u8>, i64> = HashMap::new();
        let mut positions: HashMap<String, HashMap<i64, i64>> = HashMap::new();
        let data_files: HashSet<&str> = live
            .iter()
            .filter(|f| f.entry.content_type() == DataContentType::Data)
            .map(|f| f.entry.file_path())
            .collect();
        for f in live {
            let e = &f.entry;
            match e.content_type() {
                DataContentType::Data => continue,
                DataContentType::EqualityDeletes => {}
                DataContentType::PositionDeletes => {
                    if e.file_format() != iceberg::spec::DataFileFormat::Parquet {
                        return Err(SinkError::Io(format!(
                            "{doing}: {} is a deletion vector, which this build does not apply",
                            e.file_path()
                        )));
                    }
                    // Ours name their one data file; another engine's
                    // (Spark's merge-on-read deletes) may name many, of
                    // which only the live ones are kept.
                    let delete_seq = e.sequence_number().unwrap_or(i64::MAX);
                    read_positions(
                        table,
                        e.file_path(),
                        delete_seq,
                        &data_files,
                        &mut positions,
                        doing,
                    )
                    .await?;
                    continue;
                }
            }
            let mut ids = e.data_file().equality_ids().unwrap_or_default();
            ids.sort_unstable();
            let mut wanted = key_ids.clone();
            wanted.sort_unstable();
            if ids != wanted {
                return Err(SinkError::Io(format!(
                    "{doing}: {} deletes on fields {ids:?}, not on the table's key",
                    e.file_path()
                )));
            }
            let delete_seq = e.sequence_number().unwrap_or(i64::MAX);
            let bytes = table
                .file_io()
                .new_input(e.file_path())
                .map_err(&err)?
                .read()
                .await
                .map_err(&err)?;
            let batches = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .and_then(|b| b.build())
                .map_err(|e| SinkError::Io(format!("{doing}: reading a delete file: {e}")))?;
            for batch in batches {
                let batch = batch.map_err(|e| SinkError::Io(e.to_string()))?;
                let columns = key
                    .iter()
                    .map(|i| {
                        let name = arrow.field(*i).name();
                        let c = batch.column_by_name(name).ok_or_else(|| {
                            SinkError::Io(format!("{doing}: a delete file has no {name}"))
                        })?;
                        schema::conform(c, arrow.field(*i).data_type())
                            .map_err(|e| SinkError::Io(format!("{doing}: {name}: {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let rows = converter
                    .convert_columns(&columns)
                    .map_err(|e| SinkError::Io(e.to_string()))?;
                for row in rows.iter() {
                    let s = seq.entry(row.as_ref().to_vec()).or_insert(delete_seq);
                    *s = (*s).max(delete_seq);
                }
            }
        }
        Ok(DeletedKeys {
            key,
            converter,
            seq,
            positions,
        })
    }

    /// `batch` (rows of the data file `path`, of sequence number
    /// `data_seq`, starting at row `first_row` of it, in the table's
    /// schema) without the rows a later delete removes.
    pub(super) fn apply(
        &self,
        batch: RecordBatch,
        path: &str,
        data_seq: i64,
        first_row: i64,
    ) -> Result<RecordBatch, SinkError> {
        self.apply_keyed(batch, &self.key, path, data_seq, first_row)
    }

    /// How many keys and rows are deleted.
    pub(super) fn len(&self) -> usize {
        self.seq.len() + self.positions.values().map(HashMap::len).sum::<usize>()
    }

    /// The key columns' positions in the table's schema.
    pub(super) fn key(&self) -> &[usize] {
        &self.key
    }

    /// As [`Self::apply`], for a batch whose key columns are at `key` (a
    /// projection of the table's schema).
    pub(super) fn apply_keyed(
        &self,
        batch: RecordBatch,
        key: &[usize],
        path: &str,
        data_seq: i64,
        first_row: i64,
    ) -> Result<RecordBatch, SinkError> {
        match self.kept(&batch, key, path, data_seq, first_row)? {
            None => Ok(batch),
            Some(keep) => {
                filter_record_batch(&batch, &keep).map_err(|e| SinkError::Io(e.to_string()))
            }
        }
    }

    /// The positions in the data file `path` (of sequence number
    /// `data_seq`) of the rows of `batch` (its rows from `first_row` on,
    /// key columns at `key`) that a delete removes, ascending: what a
    /// position-delete file of that data file must name to remove the same
    /// rows.
    pub(super) fn deleted_positions(
        &self,
        batch: &RecordBatch,
        key: &[usize],
        path: &str,
        data_seq: i64,
        first_row: i64,
    ) -> Result<Vec<i64>, SinkError> {
        Ok(match self.kept(batch, key, path, data_seq, first_row)? {
            None => Vec::new(),
            Some(keep) => keep
                .iter()
                .enumerate()
                .filter(|(_, kept)| *kept == Some(false))
                .map(|(i, _)| first_row + i as i64)
                .collect(),
        })
    }

    /// Which rows of `batch` no delete removes (see
    /// [`Self::deleted_positions`]); `None` when no delete can apply to
    /// the file.
    fn kept(
        &self,
        batch: &RecordBatch,
        key: &[usize],
        path: &str,
        data_seq: i64,
        first_row: i64,
    ) -> Result<Option<BooleanArray>, SinkError> {
        let deleted_rows = self.positions.get(path);
        if self.seq.is_empty() && deleted_rows.is_none() {
            return Ok(None);
        }
        let by_key: Option<Vec<bool>> = match self.seq.is_empty() {
            true => None,
            false => {
                let columns: Vec<ArrayRef> = key.iter().map(|i| batch.column(*i).clone()).collect();
                let rows = self
                    .converter
                    .convert_columns(&columns)
                    .map_err(|e| SinkError::Io(e.to_string()))?;
                Some(
                    rows.iter()
                        .map(|r| self.seq.get(r.as_ref()).is_none_or(|s| *s <= data_seq))
                        .collect(),
                )
            }
        };
        Ok(Some(
            (0..batch.num_rows())
                .map(|i| {
                    let key_kept = by_key.as_ref().is_none_or(|k| k[i]);
                    let position_kept = deleted_rows.is_none_or(|d| {
                        d.get(&(first_row + i as i64)).is_none_or(|s| *s < data_seq)
                    });
                    Some(key_kept && position_kept)
                })
                .collect(),
        ))
    }
}

/// Reads a position-delete file into `positions` (path -> row -> the
/// highest sequence number deleting it), for the rows of `data_files`
/// only: one file may name many data files (another engine's), some of
/// them gone since.
async fn read_positions(
    table: &Table,
    file: &str,
    delete_seq: i64,
    data_files: &HashSet<&str>,
    positions: &mut HashMap<String, HashMap<i64, i64>>,
    doing: &str,
) -> Result<(), SinkError> {
    let err = |e: String| {
        SinkError::Io(format!(
            "{doing}: reading the position-delete file {file}: {e}"
        ))
    };
    let bytes = table
        .file_io()
        .new_input(file)
        .map_err(|e| err(e.to_string()))?
        .read()
        .await
        .map_err(|e| err(e.to_string()))?;
    let batches = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| err(e.to_string()))?;
    for batch in batches {
        let batch = batch.map_err(|e| err(e.to_string()))?;
        // Another writer's Arrow schema may make the path a large string
        // or a string view.
        let paths = batch
            .column_by_name("file_path")
            .and_then(|c| cast(c, &DataType::Utf8).ok())
            .ok_or_else(|| err("no text column file_path".to_string()))?;
        let paths = paths.as_string::<i32>();
        let rows = batch
            .column_by_name("pos")
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| err("no 64-bit column pos".to_string()))?;
        for (path, pos) in paths.iter().zip(rows.iter()) {
            let (Some(path), Some(pos)) = (path, pos) else {
                return Err(err("a NULL file_path or pos".to_string()));
            };
            // A file no longer live (compacted away) has nothing to apply.
            if !data_files.contains(path) {
                continue;
            }
            let rows = match positions.get_mut(path) {
                Some(rows) => rows,
                None => positions.entry(path.to_string()).or_default(),
            };
            let s = rows.entry(pos).or_insert(delete_seq);
            *s = (*s).max(delete_seq);
        }
    }
    Ok(())
}
