//! `<Kind>SinkExec`: the one batch loop every sink shares. For each batch it
//! receives, in order, it hands the rows to the sink with the position the
//! source batch ends at; a batch the sink cannot write stops the route (the
//! error names table, position and cause) — nothing is skipped. A part of a
//! transaction that continues ([`crate::feed::Boundary::open_transaction`])
//! is staged instead, and reports no commit.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow::compute::kernels::cmp::eq;
use arrow::compute::{and_not, filter_record_batch, not};
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, internal_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use crate::context;
use crate::feed::RouteFeed;
use crate::logical::commit_stats_schema;
use crate::sink::{Sink, SinkBatch, SinkError};
use crate::spec::WriteMode;
use crate::target::TargetTable;

/// A commit the sink refused or failed: terminal for the run.
#[derive(Debug, thiserror::Error)]
#[error("table {table}: the batch ending at position {position} was not committed: {cause}")]
pub struct SinkCommitError {
    pub table: String,
    pub position: String,
    #[source]
    pub cause: SinkError,
}

/// The sink node.
#[derive(Debug)]
pub struct SinkExec {
    input: Arc<dyn ExecutionPlan>,
    sink: Arc<dyn Sink>,
    target: Arc<TargetTable>,
    feed: Arc<RouteFeed>,
    exec_name: &'static str,
    skip_deletes: bool,
    properties: Arc<PlanProperties>,
}

impl SinkExec {
    /// The node committing `input` into `sink` for `target`.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        sink: Arc<dyn Sink>,
        target: Arc<TargetTable>,
        feed: Arc<RouteFeed>,
        exec_name: &'static str,
        skip_deletes: bool,
    ) -> Self {
        SinkExec {
            input,
            sink,
            target,
            feed,
            exec_name,
            skip_deletes,
            properties: super::stream_properties(Arc::new(commit_stats_schema())),
        }
    }
}

impl DisplayAs for SinkExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let key = self.target.key.join(", ");
        // What an append-idempotent table is unique by.
        let coordinate = (self.target.mode == WriteMode::AppendIdempotent)
            .then(|| self.target.coordinate_columns().join(", "));
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "table={}", self.target.display_name())?;
                write!(f, "mode={}", self.target.mode)?;
                if !key.is_empty() {
                    write!(f, "\nkey=[{key}]")?;
                }
                if let Some(c) = &coordinate {
                    write!(f, "\ncoordinate=[{c}]")?;
                }
                Ok(())
            }
            _ => {
                write!(
                    f,
                    "{}: table={}, mode={}",
                    self.exec_name,
                    self.target.display_name(),
                    self.target.mode
                )?;
                if !key.is_empty() {
                    write!(f, ", key=[{key}]")?;
                }
                if let Some(c) = &coordinate {
                    write!(f, ", coordinate=[{c}]")?;
                }
                if self.skip_deletes {
                    write!(f, ", on_delete=skip")?;
                }
                if let Some(extra) = self.sink.extra_work() {
                    write!(f, ", {extra}")?;
                }
                Ok(())
            }
        }
    }
}

/// Turns a plan batch (`__op`, `__before`, target columns) into what the
/// sink commits.
fn to_sink_batch(
    batch: &RecordBatch,
    target_schema: &SchemaRef,
    mode: WriteMode,
    skip_deletes: bool,
) -> Result<SinkBatch> {
    let ops = batch.column(0).as_string::<i32>();
    let before = batch.column(1).as_boolean();
    let deletes = eq(ops, &StringArray::new_scalar(context::OP_DELETE))?;
    let keep: Option<BooleanArray> = match mode {
        WriteMode::Upsert => None,
        // Append modes record changes, not states: an update's before image
        // is not a change of its own.
        WriteMode::Append | WriteMode::AppendIdempotent => {
            let mut keep = not(before)?;
            if skip_deletes {
                keep = and_not(&keep, &deletes)?;
            }
            (keep.true_count() < keep.len()).then_some(keep)
        }
    };
    let (batch, deletes) = match keep {
        Some(k) => (
            filter_record_batch(batch, &k)?,
            arrow::compute::filter(&deletes, &k)?.as_boolean().clone(),
        ),
        None => (batch.clone(), deletes),
    };
    let columns: Vec<ArrayRef> = batch.columns()[2..].to_vec();
    let rows = RecordBatch::try_new(Arc::clone(target_schema), columns)?;
    Ok(SinkBatch { rows, deletes })
}

impl ExecutionPlan for SinkExec {
    fn name(&self) -> &str {
        self.exec_name
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
        Ok(Arc::new(SinkExec::new(
            children.swap_remove(0),
            Arc::clone(&self.sink),
            Arc::clone(&self.target),
            Arc::clone(&self.feed),
            self.exec_name,
            self.skip_deletes,
        )))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("{} has one partition", self.exec_name);
        }
        let input = self.input.execute(partition, context)?;
        let sink = Arc::clone(&self.sink);
        let target = Arc::clone(&self.target);
        let feed = Arc::clone(&self.feed);
        let target_schema = target.arrow_schema();
        let skip_deletes = self.skip_deletes;
        let out_schema = self.schema();
        let stats_schema = Arc::clone(&out_schema);
        // Rows and deletes staged since the last commit: the commit that
        // closes their transaction reports them.
        let staged = Arc::new(std::sync::Mutex::new((0u64, 0u64)));
        // `then` runs one commit at a time: commits of a table are serialized
        // and in position order.
        let stream = input.then(move |batch| {
            let staged = Arc::clone(&staged);
            let sink = Arc::clone(&sink);
            let target = Arc::clone(&target);
            let feed = Arc::clone(&feed);
            let target_schema = Arc::clone(&target_schema);
            let stats_schema = Arc::clone(&stats_schema);
            async move {
                let batch = batch?;
                let Some(boundary) = feed.pop_boundary() else {
                    return internal_err!("a batch reached the sink without its position");
                };
                let sink_batch = to_sink_batch(&batch, &target_schema, target.mode, skip_deletes)?;
                let table = target.display_name();
                if boundary.open_transaction {
                    // A part of a transaction that goes on: staged, and
                    // committed by the batch that closes it (no commit to
                    // report yet).
                    sink.stage(&target, &sink_batch).await.map_err(|cause| {
                        DataFusionError::External(Box::new(SinkCommitError {
                            table: table.clone(),
                            position: format!(
                                "{} (a staged part of an open transaction)",
                                boundary.end
                            ),
                            cause,
                        }))
                    })?;
                    let mut counts = staged.lock().expect("staged counts");
                    counts.0 += sink_batch.rows.num_rows() as u64;
                    counts.1 += sink_batch.delete_count() as u64;
                    return Ok(RecordBatch::new_empty(stats_schema));
                }
                let position = boundary.end;
                let started = std::time::Instant::now();
                sink.commit(&target, &sink_batch, &position)
                    .await
                    .map_err(|cause| {
                        DataFusionError::External(Box::new(SinkCommitError {
                            table: table.clone(),
                            position: position.clone(),
                            cause,
                        }))
                    })?;
                let (staged_rows, staged_deletes) =
                    std::mem::take(&mut *staged.lock().expect("staged counts"));
                let rows = sink_batch.rows.num_rows() as u64 + staged_rows;
                let deletes = sink_batch.delete_count() as u64 + staged_deletes;
                Ok(RecordBatch::try_new(
                    stats_schema,
                    vec![
                        Arc::new(StringArray::from(vec![table])),
                        Arc::new(StringArray::from(vec![position])),
                        Arc::new(UInt64Array::from(vec![rows])),
                        Arc::new(UInt64Array::from(vec![deletes])),
                        Arc::new(UInt64Array::from(
                            vec![started.elapsed().as_micros() as u64],
                        )),
                    ],
                )?)
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, stream)))
    }
}
