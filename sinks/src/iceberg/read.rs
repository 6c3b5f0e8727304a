//! Reading a table for `urutau query` and `Pipeline::sql`: the current
//! snapshot's data files with its equality deletes applied by hashing
//! each row's key, and its position deletes by each row's position.
//!
//! Why not only iceberg-datafusion's scan: iceberg-rust 0.10 turns every
//! equality-delete row into a predicate (`NOT (id = 1) AND NOT (id = 2)
//! ...`) evaluated on every data row, so a read costs data rows x deleted
//! keys; an upsert table gets a delete file per commit, and a count over a
//! million changes did not finish in minutes. Here the deleted keys are
//! read once into a hash map (key -> the highest sequence number deleting
//! it, [`DeletedKeys`]) and a data row is dropped when a delete of its key
//! has a higher sequence number than its file, which is the spec's rule.
//!
//! What the sink writes is what this reads: equality deletes on the
//! table's key, unpartitioned (global), and Parquet position deletes (a
//! snapshot group's, of one data file, or another engine's, of many). A
//! table with anything else (a deletion vector, a partitioned equality
//! delete, deletes on other fields, written by another engine) is read by
//! iceberg-datafusion's scan, which applies every kind.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef as ArrowSchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use iceberg::Runtime;
use iceberg::arrow::{ArrowReaderBuilder, schema_to_arrow_schema};
use iceberg::scan::{FileScanTask, FileScanTaskStream};
use iceberg::spec::{DataContentType, DataFileFormat};
use iceberg::table::Table;
use iceberg_datafusion::IcebergStaticTableProvider;
use urutau_planner::sink::SinkError;

use super::compaction::{LiveFile, live_files};
use super::deletes::DeletedKeys;
use super::uuid_text;
use super::{conform_by_name, io_error};

/// One live data file to read.
#[derive(Debug, Clone)]
struct DataFileToRead {
    path: String,
    size: u64,
    records: u64,
    format: DataFileFormat,
    sequence: i64,
}

/// The table's current snapshot as a DataFusion table.
pub async fn provider(table: Table) -> Result<Arc<dyn TableProvider>, SinkError> {
    let live = live_files(&table).await?;
    if !hashable_deletes(&table, &live.files) {
        tracing::debug!(table = %table.identifier(), "delete files this reader does not hash: iceberg-datafusion's scan");
        let schema = table.metadata().current_schema().clone();
        let provider = IcebergStaticTableProvider::try_new_from_table(table)
            .await
            .map_err(io_error("reading the table"))?;
        return Ok(uuid_text::wrap(Arc::new(provider), &schema));
    }
    let schema = table.metadata().current_schema().clone();
    let arrow: ArrowSchemaRef =
        Arc::new(schema_to_arrow_schema(&schema).map_err(io_error("reading the table's schema"))?);
    let all: Vec<&LiveFile> = live.files.iter().collect();
    let deletes = DeletedKeys::load(&table, &arrow, &all, "reading the table").await?;
    let mut files = Vec::new();
    for f in &live.files {
        let e = &f.entry;
        if e.content_type() != DataContentType::Data {
            continue;
        }
        files.push(DataFileToRead {
            path: e.file_path().to_string(),
            size: e.file_size_in_bytes(),
            records: e.record_count(),
            format: e.file_format(),
            sequence: e.sequence_number().ok_or_else(|| {
                SinkError::Io(format!(
                    "reading the table: {} has no sequence number",
                    e.file_path()
                ))
            })?,
        });
    }
    Ok(uuid_text::wrap(
        Arc::new(IcebergTableReader {
            table,
            arrow,
            files: Arc::new(files),
            deletes: Arc::new(deletes),
        }),
        &schema,
    ))
}

/// Whether every delete file is one this reader applies: equality
/// deletes on the table's key, unpartitioned, and Parquet position
/// deletes.
fn hashable_deletes(table: &Table, files: &[LiveFile]) -> bool {
    let schema = table.metadata().current_schema();
    let mut key: Vec<i32> = schema.identifier_field_ids().collect();
    key.sort_unstable();
    files.iter().all(|f| {
        let e = &f.entry;
        match e.content_type() {
            DataContentType::Data => true,
            // Parquet ones (a deletion vector is a Puffin blob), of one
            // data file or of many.
            DataContentType::PositionDeletes => e.file_format() == DataFileFormat::Parquet,
            DataContentType::EqualityDeletes => {
                let mut ids = e.data_file().equality_ids().unwrap_or_default();
                ids.sort_unstable();
                !key.is_empty() && ids == key && e.data_file().partition().fields().is_empty()
            }
        }
    })
}

/// The reader's table; see the module docs.
pub struct IcebergTableReader {
    table: Table,
    arrow: ArrowSchemaRef,
    files: Arc<Vec<DataFileToRead>>,
    deletes: Arc<DeletedKeys>,
}

impl fmt::Debug for IcebergTableReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IcebergTableReader")
            .field("table", &self.table.identifier())
            .field("files", &self.files.len())
            .field("deleted_keys", &self.deletes.len())
            .finish()
    }
}

#[async_trait]
impl TableProvider for IcebergTableReader {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> ArrowSchemaRef {
        Arc::clone(&self.arrow)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let wanted: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.arrow.fields().len()).collect(),
        };
        // The key columns are read too (the deletes need them), then
        // dropped unless asked for.
        let mut read: Vec<usize> = wanted.clone();
        if self.deletes.len() > 0 {
            read.extend(self.deletes.key().iter().copied());
        }
        // A query that needs no column (`count(*)`) still reads one, for
        // the row counts; the projection drops it.
        if read.is_empty() && !self.arrow.fields().is_empty() {
            read.push(0);
        }
        read.sort_unstable();
        read.dedup();
        let read_schema = Arc::new(self.arrow.project(&read)?);
        let key: Vec<usize> = self
            .deletes
            .key()
            .iter()
            .filter_map(|k| read.iter().position(|r| r == k))
            .collect();
        let output: Vec<usize> = wanted
            .iter()
            .map(|w| read.iter().position(|r| r == w).expect("read holds wanted"))
            .collect();
        let out_schema = Arc::new(read_schema.project(&output)?);
        let schema = self.table.metadata().current_schema();
        let field_ids = read_schema
            .fields()
            .iter()
            .map(|f| {
                schema.field_by_name(f.name()).map(|s| s.id).ok_or_else(|| {
                    DataFusionError::Internal(format!("no field {} in the table", f.name()))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let partitions = state
            .config()
            .target_partitions()
            .min(self.files.len())
            .max(1);
        Ok(Arc::new(IcebergReadExec {
            table: self.table.clone(),
            files: Arc::clone(&self.files),
            deletes: Arc::clone(&self.deletes),
            read_schema,
            field_ids,
            key,
            output,
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(Arc::clone(&out_schema)),
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )),
            out_schema,
        }))
    }
}

/// Reads the data files (each partition every n-th file), applies the
/// deleted keys, projects.
struct IcebergReadExec {
    table: Table,
    files: Arc<Vec<DataFileToRead>>,
    deletes: Arc<DeletedKeys>,
    /// What is read from each file: the projection and the key.
    read_schema: ArrowSchemaRef,
    field_ids: Vec<i32>,
    /// The key columns' positions in `read_schema`.
    key: Vec<usize>,
    /// The output columns' positions in `read_schema`.
    output: Vec<usize>,
    out_schema: ArrowSchemaRef,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for IcebergReadExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IcebergReadExec")
            .field("table", &self.table.identifier())
            .field("files", &self.files.len())
            .finish()
    }
}

impl DisplayAs for IcebergReadExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IcebergReadExec: table={}, data_files={}, deleted_keys={}",
            self.table.identifier(),
            self.files.len(),
            self.deletes.len()
        )
    }
}

impl ExecutionPlan for IcebergReadExec {
    fn name(&self) -> &str {
        "IcebergReadExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let n = self.properties.partitioning.partition_count();
        let mine: Vec<DataFileToRead> = self
            .files
            .iter()
            .skip(partition)
            .step_by(n.max(1))
            .cloned()
            .collect();
        let table = self.table.clone();
        let read_schema = Arc::clone(&self.read_schema);
        let field_ids = self.field_ids.clone();
        let deletes = Arc::clone(&self.deletes);
        let key = self.key.clone();
        let output = self.output.clone();
        let schema = table.metadata().current_schema().clone();
        let external = |e: String| DataFusionError::External(e.into());
        let stream = futures::stream::iter(mine)
            .then(move |f| {
                let table = table.clone();
                let schema = schema.clone();
                let field_ids = field_ids.clone();
                let read_schema = Arc::clone(&read_schema);
                let deletes = Arc::clone(&deletes);
                let key = key.clone();
                let output = output.clone();
                async move {
                    let task = FileScanTask::builder()
                        .with_file_size_in_bytes(f.size)
                        .with_start(0)
                        .with_length(f.size)
                        .with_record_count(Some(f.records))
                        .with_data_file_path(f.path.clone())
                        .with_data_file_format(f.format)
                        .with_schema(schema)
                        .with_project_field_ids(field_ids)
                        .with_case_sensitive(true)
                        .build();
                    let tasks: FileScanTaskStream = Box::pin(futures::stream::iter([Ok(task)]));
                    let runtime = Runtime::try_current()
                        .map_err(|e| external(format!("reading {}: {e}", f.path)))?;
                    let rows = ArrowReaderBuilder::new(table.file_io().clone(), runtime)
                        .with_data_file_concurrency_limit(1)
                        .build()
                        .read(tasks)
                        .map_err(|e| external(format!("reading {}: {e}", f.path)))?
                        .stream();
                    let path = f.path;
                    let sequence = f.sequence;
                    // The file is read whole and in order: a batch's first
                    // row's position is the rows before it.
                    let mut first_row = 0i64;
                    Ok::<_, DataFusionError>(rows.map(move |batch| {
                        let batch = batch.map_err(|e| external(format!("reading {path}: {e}")))?;
                        let at = first_row;
                        first_row += batch.num_rows() as i64;
                        let batch = conform_by_name(&batch, &read_schema)
                            .map_err(|e| external(format!("reading {path}: {e}")))?;
                        let batch = deletes
                            .apply_keyed(batch, &key, &path, sequence, at)
                            .map_err(|e| external(e.to_string()))?;
                        Ok(batch.project(&output)?)
                    }))
                }
            })
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.out_schema),
            stream,
        )))
    }
}
