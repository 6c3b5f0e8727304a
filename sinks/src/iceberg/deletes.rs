//! The keys a table's equality deletes remove, read once and applied by
//! hashing each data row's key: what compaction rewrites with, and what a
//! query reads with (a delete applies to the data files of a lower
//! sequence number, as the spec says).

use std::collections::HashMap;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef as ArrowSchemaRef;
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
}

impl DeletedKeys {
    /// Reads every equality-delete file among `live` (each must delete by
    /// the table's key; a position-delete file is an error). `doing` names
    /// the caller in errors.
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
        for f in live {
            let e = &f.entry;
            match e.content_type() {
                DataContentType::Data => continue,
                DataContentType::EqualityDeletes => {}
                DataContentType::PositionDeletes => {
                    return Err(SinkError::Io(format!(
                        "{doing}: {} holds position deletes, which this build does not apply",
                        e.file_path()
                    )));
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
        })
    }

    /// `batch` (rows of a data file of sequence number `data_seq`, in the
    /// table's schema) without the rows a later delete removes.
    pub(super) fn apply(
        &self,
        batch: RecordBatch,
        data_seq: i64,
    ) -> Result<RecordBatch, SinkError> {
        self.apply_keyed(batch, &self.key, data_seq)
    }

    /// How many keys are deleted.
    pub(super) fn len(&self) -> usize {
        self.seq.len()
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
        data_seq: i64,
    ) -> Result<RecordBatch, SinkError> {
        if self.seq.is_empty() {
            return Ok(batch);
        }
        let columns: Vec<ArrayRef> = key.iter().map(|i| batch.column(*i).clone()).collect();
        let rows = self
            .converter
            .convert_columns(&columns)
            .map_err(|e| SinkError::Io(e.to_string()))?;
        let keep: BooleanArray = rows
            .iter()
            .map(|r| Some(self.seq.get(r.as_ref()).is_none_or(|s| *s <= data_seq)))
            .collect();
        filter_record_batch(&batch, &keep).map_err(|e| SinkError::Io(e.to_string()))
    }
}
