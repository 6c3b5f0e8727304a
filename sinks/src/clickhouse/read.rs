//! Reading a ClickHouse table for queries (`urutau query`, the Python
//! `sql()`): the rows a `FINAL` read shows (tombstones and replaced
//! versions hidden), in the route's columns and Arrow types, without the
//! reserved columns. The read happens when a query scans the table, with
//! only the columns it projects, as one `SELECT ... FORMAT ArrowStream`.

use std::any::Any;
use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use async_trait::async_trait;
use clickhouse::Client;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use urutau_planner::target::{TargetColumn, TargetTable};
use urutau_planner::types::{CanonicalType, StructField};

use super::ddl::{self, ident};

/// One ClickHouse table as a DataFusion table.
#[derive(Debug)]
pub struct ClickHouseTableReader {
    client: Client,
    /// `` `db`.`table` ``.
    table: String,
    /// The route's columns.
    schema: SchemaRef,
    columns: Vec<TargetColumn>,
    /// Read under `FINAL` (the engine replaces rows).
    final_read: bool,
}

impl ClickHouseTableReader {
    /// A reader of `database.table`, written by the route `target`.
    pub fn new(client: Client, database: &str, table: &str, target: &TargetTable) -> Self {
        ClickHouseTableReader {
            client,
            table: format!("{}.{}", ident(database), ident(table)),
            schema: target.arrow_schema(),
            columns: target.columns.clone(),
            final_read: ddl::engine_name(target) == "ReplacingMergeTree",
        }
    }

    /// The rows of the projected columns.
    async fn fetch(&self, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
        let columns: Vec<String> = schema
            .fields()
            .iter()
            .map(
                |f| match self.columns.iter().find(|c| &c.name == f.name()) {
                    // UUIDs travel in Arrow as 16 bytes in ClickHouse's own
                    // order; the route holds their text.
                    Some(c) if contains_uuid(&c.ty) => format!(
                        "CAST({name} AS {}) AS {name}",
                        ddl::column_type(&uuid_as_string(&c.ty), true),
                        name = ident(&c.name)
                    ),
                    _ => ident(f.name()),
                },
            )
            .collect();
        // A projection without columns (count(*)) still needs the rows.
        let select = if columns.is_empty() {
            "1 AS `_row`".to_string()
        } else {
            columns.join(", ")
        };
        // Strings arrive as Arrow binary (ClickHouse's String holds bytes);
        // the cast below makes them text where the route has text, and
        // checks that they are UTF-8.
        let sql = format!(
            "SELECT {select} FROM {}{} SETTINGS output_format_arrow_string_as_string = 0",
            self.table,
            if self.final_read { " FINAL" } else { "" }
        );
        let bytes = self
            .client
            .query_raw(&sql)
            .fetch_bytes("ArrowStream")
            .map_err(|e| external(&self.table, e))?
            .collect()
            .await
            .map_err(|e| external(&self.table, e))?;
        if bytes.is_empty() {
            return Ok(Vec::new());
        }
        let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
        let mut out = Vec::new();
        for batch in reader {
            let batch = batch?;
            if columns.is_empty() {
                out.push(RecordBatch::try_new_with_options(
                    Arc::clone(schema),
                    vec![],
                    &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
                )?);
                continue;
            }
            let arrays = schema
                .fields()
                .iter()
                .zip(batch.columns())
                .map(|(f, a)| {
                    cast_with_options(a, f.data_type(), &CastOptions::default()).map_err(|e| {
                        DataFusionError::Execution(format!(
                            "clickhouse: {}: column {} ({} as ClickHouse sends it) is not {}: {e}",
                            self.table,
                            f.name(),
                            a.data_type(),
                            f.data_type()
                        ))
                    })
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            out.push(RecordBatch::try_new(Arc::clone(schema), arrays)?);
        }
        Ok(out)
    }
}

/// Whether a UUID is anywhere in `ty`.
fn contains_uuid(ty: &CanonicalType) -> bool {
    match ty {
        CanonicalType::Uuid => true,
        CanonicalType::Struct(fields) => fields.iter().any(|f| contains_uuid(&f.ty)),
        CanonicalType::List(item) => contains_uuid(item),
        CanonicalType::Map(k, v) => contains_uuid(k) || contains_uuid(v),
        _ => false,
    }
}

/// `ty` with every UUID as a string.
fn uuid_as_string(ty: &CanonicalType) -> CanonicalType {
    match ty {
        CanonicalType::Uuid => CanonicalType::String,
        CanonicalType::Struct(fields) => CanonicalType::Struct(
            fields
                .iter()
                .map(|f| StructField {
                    name: f.name.clone(),
                    ty: uuid_as_string(&f.ty),
                })
                .collect(),
        ),
        CanonicalType::List(item) => CanonicalType::List(Box::new(uuid_as_string(item))),
        CanonicalType::Map(k, v) => {
            CanonicalType::Map(Box::new(uuid_as_string(k)), Box::new(uuid_as_string(v)))
        }
        other => other.clone(),
    }
}

fn external(table: &str, e: clickhouse::error::Error) -> DataFusionError {
    DataFusionError::External(format!("clickhouse: reading {table}: {e}").into())
}

#[async_trait]
impl TableProvider for ClickHouseTableReader {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => Arc::clone(&self.schema),
        };
        let batches = self.fetch(&schema).await?;
        Ok(MemorySourceConfig::try_new_exec(&[batches], schema, None)?)
    }
}
