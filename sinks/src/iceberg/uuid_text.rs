//! A table's `uuid` columns as their canonical text when it is queried
//! (`urutau query`, `Pipeline::sql`, the notebook).
//!
//! Arrow reads an Iceberg `uuid` as 16 raw bytes (`FixedSizeBinary(16)`):
//! shown as 32 hex digits, and not comparable with a string, so
//! `WHERE id = '0a8b6c1e-…'` failed to plan ("Cannot infer common argument
//! type for comparison operation FixedSizeBinary(16) = Utf8"). Here such a
//! column is a string in the form Postgres, DuckDB and the Java reader
//! print (`0a8b6c1e-0000-4000-8000-000000000002`), so it reads and filters
//! as users write it. Filters on the table are applied above the scan.
//! Only top-level columns are converted (a uuid inside a struct or list
//! stays bytes).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;
use iceberg::spec::{PrimitiveType, Type};

/// `inner` (a table of `schema`) with its top-level uuid columns as text;
/// `inner` itself when it has none.
pub fn wrap(
    inner: Arc<dyn TableProvider>,
    schema: &iceberg::spec::Schema,
) -> Arc<dyn TableProvider> {
    let arrow = inner.schema();
    let uuid: Vec<bool> = arrow
        .fields()
        .iter()
        .map(|f| {
            *f.data_type() == DataType::FixedSizeBinary(16)
                && matches!(
                    schema
                        .field_by_name(f.name())
                        .map(|s| s.field_type.as_ref()),
                    Some(Type::Primitive(PrimitiveType::Uuid))
                )
        })
        .collect();
    if !uuid.contains(&true) {
        return inner;
    }
    let fields: Vec<Field> = arrow
        .fields()
        .iter()
        .zip(&uuid)
        .map(|(f, u)| match u {
            true => Field::new(f.name(), DataType::Utf8, f.is_nullable())
                .with_metadata(f.metadata().clone()),
            false => f.as_ref().clone(),
        })
        .collect();
    let schema = Arc::new(Schema::new_with_metadata(fields, arrow.metadata().clone()));
    Arc::new(UuidAsText {
        inner,
        schema,
        uuid,
    })
}

/// See the module docs.
#[derive(Debug)]
struct UuidAsText {
    inner: Arc<dyn TableProvider>,
    schema: SchemaRef,
    /// Which of the table's columns are uuids.
    uuid: Vec<bool>,
}

#[async_trait]
impl TableProvider for UuidAsText {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // No filter is pushed down (the default): a filter on a uuid
        // column compares text, which the inner scan cannot.
        let input = self.inner.scan(state, projection, &[], limit).await?;
        let columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        let uuid: Vec<bool> = columns.iter().map(|c| self.uuid[*c]).collect();
        let schema = Arc::new(self.schema.project(&columns)?);
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            input.output_partitioning().clone(),
            input.pipeline_behavior(),
            input.boundedness(),
        ));
        Ok(Arc::new(UuidTextExec {
            input,
            schema,
            uuid,
            properties,
        }))
    }
}

/// Converts the uuid columns of its input's batches to text.
#[derive(Debug)]
struct UuidTextExec {
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    /// Which output columns are uuids.
    uuid: Vec<bool>,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for UuidTextExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .zip(&self.uuid)
            .filter(|(_, u)| **u)
            .map(|(f, _)| f.name().as_str())
            .collect();
        write!(f, "UuidTextExec: columns=[{}]", names.join(", "))
    }
}

impl ExecutionPlan for UuidTextExec {
    fn name(&self) -> &str {
        "UuidTextExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(UuidTextExec {
            input: children.swap_remove(0),
            schema: Arc::clone(&self.schema),
            uuid: self.uuid.clone(),
            properties: Arc::clone(&self.properties),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.schema);
        let uuid = self.uuid.clone();
        let out = Arc::clone(&schema);
        let stream = self
            .input
            .execute(partition, context)?
            .map(move |batch| as_text(&batch?, &uuid, &out));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// `batch` with its `uuid` columns as canonical text, in `schema`.
fn as_text(batch: &RecordBatch, uuid: &[bool], schema: &SchemaRef) -> Result<RecordBatch> {
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .zip(uuid)
        .map(|(c, u)| match (u, c.data_type()) {
            (true, DataType::FixedSizeBinary(16)) => {
                let bytes = c.as_fixed_size_binary();
                let mut text = StringBuilder::with_capacity(bytes.len(), bytes.len() * 36);
                let mut buf = uuid::Uuid::encode_buffer();
                for v in bytes.iter() {
                    match v.and_then(|b| uuid::Uuid::from_slice(b).ok()) {
                        Some(u) => text.append_value(u.hyphenated().encode_lower(&mut buf)),
                        None => text.append_null(),
                    }
                }
                Arc::new(text.finish()) as ArrayRef
            }
            _ => Arc::clone(c),
        })
        .collect();
    // The row count too: a projection of no column (`count(*)`) has rows.
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &options,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{FixedSizeBinaryArray, Int64Array};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;
    use iceberg::spec::NestedField;

    #[tokio::test]
    async fn uuid_columns_read_and_filter_as_canonical_text() {
        let ids: [u128; 3] = [0x0a8b6c1e_0000_4000_8000_000000000002, u128::MAX, 7];
        let arrow = Arc::new(Schema::new(vec![
            Field::new("id", DataType::FixedSizeBinary(16), true),
            Field::new("v", DataType::Int64, false),
            Field::new("raw", DataType::FixedSizeBinary(16), true),
        ]));
        let bytes = |n: usize| {
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                ids.iter()
                    .take(n)
                    .map(|i| Some(i.to_be_bytes()))
                    .chain([None]),
                16,
            )
            .unwrap()
        };
        let batch = RecordBatch::try_new(
            Arc::clone(&arrow),
            vec![
                Arc::new(bytes(3)),
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(bytes(3)),
            ],
        )
        .unwrap();
        let mem = Arc::new(MemTable::try_new(arrow, vec![vec![batch]]).unwrap());
        // `raw` is a fixed(16), not a uuid: it stays bytes.
        let iceberg = iceberg::spec::Schema::builder()
            .with_fields(vec![
                NestedField::optional(1, "id", Type::Primitive(PrimitiveType::Uuid)).into(),
                NestedField::required(2, "v", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(3, "raw", Type::Primitive(PrimitiveType::Fixed(16))).into(),
            ])
            .build()
            .unwrap();
        let ctx = SessionContext::new();
        ctx.register_table("t", wrap(mem, &iceberg)).unwrap();
        let rows = |sql: &str| {
            let ctx = ctx.clone();
            let sql = sql.to_string();
            async move {
                let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
                arrow::util::pretty::pretty_format_batches(&batches)
                    .unwrap()
                    .to_string()
            }
        };
        let found =
            rows("SELECT id, v FROM t WHERE id = '0a8b6c1e-0000-4000-8000-000000000002'").await;
        assert!(
            found.contains("| 0a8b6c1e-0000-4000-8000-000000000002 | 1 |"),
            "{found}"
        );
        assert_eq!(found.lines().count(), 5, "one row:\n{found}");
        let all = rows("SELECT id, v, raw FROM t ORDER BY v").await;
        assert!(
            all.contains("| ffffffff-ffff-ffff-ffff-ffffffffffff | 2 |"),
            "{all}"
        );
        assert!(
            all.contains("| 00000000-0000-0000-0000-000000000007 | 3 |"),
            "{all}"
        );
        // NULL stays NULL; the fixed(16) column is not converted.
        assert!(
            all.contains("|                                      | 4 |"),
            "{all}"
        );
        assert!(all.contains("0a8b6c1e000040008000000000000002"), "{all}");
        // Projections that leave the uuid out, or take only it, plan too.
        assert!(rows("SELECT count(*) FROM t").await.contains("| 4 "));
        assert!(rows("SELECT v FROM t WHERE v = 2").await.contains("| 2 |"));
    }
}
