//! `ChangeFilterExec`: `WHERE` over a change stream, one output batch per
//! input batch (DataFusion's `FilterExec` may buffer and coalesce rows, which
//! would hold a transaction back or split it from its position).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use arrow::compute::kernels::zip::zip;
use arrow::compute::{and_not, filter_record_batch, not, or};
use datafusion::common::{Result, internal_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use crate::context;
use crate::logical::OnMiss;

/// The change filter.
#[derive(Debug)]
pub struct ChangeFilterExec {
    input: Arc<dyn ExecutionPlan>,
    predicate: Arc<dyn PhysicalExpr>,
    on_miss: OnMiss,
    properties: Arc<PlanProperties>,
}

impl ChangeFilterExec {
    /// A filter over `input`.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        predicate: Arc<dyn PhysicalExpr>,
        on_miss: OnMiss,
    ) -> Self {
        let properties = super::stream_properties(input.schema());
        ChangeFilterExec {
            input,
            predicate,
            on_miss,
            properties,
        }
    }
}

impl DisplayAs for ChangeFilterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "predicate={}", self.predicate)?;
                write!(f, "on_miss={}", self.on_miss)
            }
            _ => write!(
                f,
                "ChangeFilterExec: {}, on_miss={}",
                self.predicate, self.on_miss
            ),
        }
    }
}

/// Applies the filter to one batch.
fn filter_changes(
    batch: &RecordBatch,
    predicate: &dyn PhysicalExpr,
    on_miss: OnMiss,
) -> Result<RecordBatch> {
    let matched = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
    let Some(matched) = matched.as_any().downcast_ref::<BooleanArray>() else {
        return internal_err!("filter predicate is not boolean");
    };
    // NULL counts as "does not match".
    let matched = match matched.nulls() {
        Some(nulls) => BooleanArray::new(matched.values() & nulls.inner(), None),
        None => matched.clone(),
    };
    let schema = batch.schema();
    let op_idx = schema.index_of(context::OP)?;
    let before_idx = schema.index_of(context::BEFORE)?;
    let ops = batch.column(op_idx).as_string::<i32>();
    let before = batch.column(before_idx).as_boolean();
    let is_delete =
        arrow::compute::kernels::cmp::eq(ops, &StringArray::new_scalar(context::OP_DELETE))?;
    match on_miss {
        OnMiss::Drop => Ok(filter_record_batch(batch, &matched)?),
        OnMiss::Delete => {
            // Deletes and update before-images delete their key anyway.
            let keep = or(&or(&matched, &is_delete)?, before)?;
            if keep.true_count() == keep.len() {
                return Ok(batch.clone());
            }
            let turn_into_delete = not(&keep)?;
            let delete = StringArray::new_scalar(context::OP_DELETE);
            let new_ops: ArrayRef = zip(&turn_into_delete, &delete, ops)?;
            let mut columns = batch.columns().to_vec();
            columns[op_idx] = new_ops;
            // A missed row is an after image turned delete: not a before image.
            columns[before_idx] = Arc::new(and_not(before, &turn_into_delete)?);
            Ok(RecordBatch::try_new(schema, columns)?)
        }
    }
}

impl ExecutionPlan for ChangeFilterExec {
    fn name(&self) -> &str {
        "ChangeFilterExec"
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
        Ok(Arc::new(ChangeFilterExec::new(
            children.swap_remove(0),
            Arc::clone(&self.predicate),
            self.on_miss,
        )))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let predicate = Arc::clone(&self.predicate);
        let on_miss = self.on_miss;
        let stream = input.map(move |batch| filter_changes(&batch?, predicate.as_ref(), on_miss));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }
}
