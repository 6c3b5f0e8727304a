//! Compaction: the table's live rows rewritten into few large data files,
//! every delete file dropped, in one `replace` snapshot.
//!
//! Upsert by equality delete adds a delete file per batch, and every reader
//! applies every delete file to every older data file: left alone, a table
//! gets slower to read with each commit. A compaction pass reads the
//! current snapshot's data files with its equality deletes applied (a
//! delete applies only to data files of a lower sequence number, as the
//! spec says), writes the rows as data files of about
//! `target_file_size`, and commits ONE snapshot that adds them and marks
//! every live data and delete file deleted. The rewritten files get the new
//! snapshot's sequence number, so no delete they already reflect applies
//! to them again, and every later batch's deletes do.
//!
//! In this build a pass rewrites the whole table (every partition) once it
//! holds at least `min_input_files` candidates (data files below the target
//! size, and delete files): the deletes of a table can only be dropped
//! when every data file older than them has been rewritten. It runs in the
//! sink's maintenance turn, under the table's lock, so none of this
//! pipeline's commits interleave; another writer's commit makes the swap
//! fail and the pass is abandoned until its next turn (its files become
//! orphans). The snapshot carries the table's current `cdc.position` mark,
//! so every snapshot keeps one.

use futures::TryStreamExt;
use iceberg::spec::{DataContentType, DataFile, ManifestEntryRef, TableMetadataBuildResult};
use iceberg::table::Table;
use urutau_planner::sink::SinkError;

use super::files::DataWriter;
use super::{commit, conform_by_name, io_error, schema};
use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef as ArrowSchemaRef;
use arrow_row::{RowConverter, SortField};
use iceberg::Runtime;
use iceberg::arrow::{ArrowReaderBuilder, schema_to_arrow_schema};
use iceberg::scan::{FileScanTask, FileScanTaskStream};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// A live file of the current snapshot, with the partition spec of the
/// manifest that lists it.
pub struct LiveFile {
    pub entry: ManifestEntryRef,
    pub spec_id: i32,
}

/// The live entries (data and delete files) of the table's current
/// snapshot.
pub async fn live_files(table: &Table) -> Result<Vec<LiveFile>, SinkError> {
    let err = io_error("reading the table's manifests");
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(vec![]);
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(&err)?;
    let mut live = Vec::new();
    for m in list.entries() {
        live.extend(
            commit::alive_entries(table, m)
                .await
                .map_err(&err)?
                .into_iter()
                .map(|entry| LiveFile {
                    entry,
                    spec_id: m.partition_spec_id,
                }),
        );
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

/// How many of `live` a compaction would merge away: data files smaller
/// than `target_size`, and every delete file.
pub fn candidates(live: &[LiveFile], target_size: u64) -> usize {
    live.iter()
        .filter(|f| {
            f.entry.content_type() != DataContentType::Data
                || f.entry.file_size_in_bytes() < target_size
        })
        .count()
}

/// Rewrites the table's current snapshot (`live` are its files) and builds
/// the `replace` snapshot; also returns the data files written.
///
/// The deletes are applied here, not by iceberg-rust's scan: its delete
/// loader can wait forever on a notifier it replaced (apache/iceberg-rust
/// PR 2630, seen here as a compaction that never finished). Each data file
/// is read on its own without deletes, and a row is dropped when an
/// equality delete of its key has a higher sequence number than the file.
pub async fn build_compaction(
    table: &Table,
    live: &[LiveFile],
    target_size: u64,
) -> Result<(TableMetadataBuildResult, Vec<DataFile>), SinkError> {
    let err = io_error("compacting");
    let md = table.metadata();
    let schema = md.current_schema().clone();
    // The rows are rewritten in the table's current schema (the one the
    // data writer writes), whatever schema this sink loaded at start.
    let arrow: ArrowSchemaRef = Arc::new(schema_to_arrow_schema(&schema).map_err(&err)?);
    let deletes = DeletedKeys::load(table, &arrow, live).await?;
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
    for f in live {
        let e = &f.entry;
        if e.content_type() != DataContentType::Data {
            continue;
        }
        let data_seq = e.sequence_number().ok_or_else(|| {
            SinkError::Io(format!(
                "compacting: {} has no sequence number",
                e.file_path()
            ))
        })?;
        let task = FileScanTask::builder()
            .with_file_size_in_bytes(e.file_size_in_bytes())
            .with_start(0)
            .with_length(e.file_size_in_bytes())
            .with_record_count(Some(e.record_count()))
            .with_data_file_path(e.file_path().to_string())
            .with_data_file_format(e.file_format())
            .with_schema(schema.clone())
            .with_project_field_ids(field_ids.clone())
            .with_case_sensitive(true)
            .build();
        let tasks: FileScanTaskStream = Box::pin(futures::stream::iter([Ok(task)]));
        let mut rows = reader.clone().read(tasks).map_err(&err)?.stream();
        while let Some(batch) = rows.try_next().await.map_err(&err)? {
            let batch = conform_by_name(&batch, &arrow)
                .map_err(|e| SinkError::Io(format!("compacting: {e}")))?;
            let batch = deletes.apply(batch, data_seq)?;
            writer.write(batch).await?;
        }
    }
    let added = writer.close().await?;
    let result = commit::build_replace(table, &added, live).await?;
    Ok((result, added))
}

/// The keys the table's equality deletes remove, each with the highest
/// sequence number a delete of it carries.
struct DeletedKeys {
    /// Key columns' positions in the table's Arrow schema.
    key: Vec<usize>,
    converter: RowConverter,
    seq: HashMap<Vec<u8>, i64>,
}

impl DeletedKeys {
    async fn load(
        table: &Table,
        arrow: &ArrowSchemaRef,
        live: &[LiveFile],
    ) -> Result<DeletedKeys, SinkError> {
        let err = io_error("compacting: reading the delete files");
        let schema = table.metadata().current_schema();
        let key_ids: Vec<i32> = schema.identifier_field_ids().collect();
        let mut key = Vec::new();
        for id in &key_ids {
            let name = schema
                .name_by_field_id(*id)
                .ok_or_else(|| SinkError::Io(format!("compacting: no field {id}")))?;
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
                        "compacting: {} holds position deletes, which this build does not compact",
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
                    "compacting: {} deletes on fields {ids:?}, not on the table's key",
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
                .map_err(|e| SinkError::Io(format!("compacting: reading a delete file: {e}")))?;
            for batch in batches {
                let batch = batch.map_err(|e| SinkError::Io(e.to_string()))?;
                let columns = key
                    .iter()
                    .map(|i| {
                        let name = arrow.field(*i).name();
                        let c = batch.column_by_name(name).ok_or_else(|| {
                            SinkError::Io(format!("compacting: a delete file has no {name}"))
                        })?;
                        schema::conform(c, arrow.field(*i).data_type())
                            .map_err(|e| SinkError::Io(format!("compacting: {name}: {e}")))
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

    /// `batch` (rows of a data file of sequence number `data_seq`) without
    /// the rows a later delete removes.
    fn apply(&self, batch: RecordBatch, data_seq: i64) -> Result<RecordBatch, SinkError> {
        if self.seq.is_empty() {
            return Ok(batch);
        }
        let columns: Vec<ArrayRef> = self.key.iter().map(|i| batch.column(*i).clone()).collect();
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
