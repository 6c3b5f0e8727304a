//! `<Kind>SinkExec`: the one batch loop every sink shares. For each batch it
//! receives, in order, it hands the rows to the sink with the position the
//! source batch ends at; a batch the sink cannot write stops the route (the
//! error names table, position and cause) — nothing is skipped. A part of a
//! transaction that continues ([`crate::feed::Boundary::open_transaction`])
//! is staged instead, and reports no commit; so is a batch the sink defers
//! ([`crate::sink::Committed::Deferred`], a snapshot's rows gathered into
//! large files), which a later commit makes visible with its own position.
//!
//! Two stages: a task prepares each batch ([`Sink::prepare`], e.g. writes
//! its data files) while the stream commits the batch before it, so a
//! commit's waits (fsyncs, the catalog's round trip) overlap the next
//! batch's encoding; and ahead of them a task computes the plan's next
//! batch (casts, collapse). Commits stay one at a time and in order, and a
//! batch's position is committed only with its own data.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow::compute::kernels::cmp::eq;
use arrow::compute::{and_not, filter_record_batch, not};
use arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result, internal_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use crate::context;
use crate::feed::{Boundary, RouteFeed};
use crate::logical::commit_stats_schema;
use crate::sink::{Committed, PreparedBatch, Sink, SinkBatch, SinkError};
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

/// A batch stage one made ready: the sink's prepared batch, the boundary
/// it ends at, and how long preparing it took.
struct Prepared {
    batch: PreparedBatch,
    boundary: Boundary,
    micros: u64,
}

/// What stage two did with a prepared batch.
enum Done {
    /// Staged (a part of an open transaction), or deferred by the sink
    /// ([`Committed::Deferred`]): a later commit reports it.
    Staged {
        rows: u64,
        deletes: u64,
        micros: u64,
    },
    /// Committed with its position.
    Committed {
        table: String,
        position: String,
        rows: u64,
        deletes: u64,
        /// Preparing and committing it.
        micros: u64,
    },
}

/// The plan's batches, computed on a task of their own (the casts of the
/// projection, the collapse by key) one batch ahead of stage one, which
/// meanwhile writes the batch before (on one task, neither overlapped the
/// other). Dropping the receiver ends the task at its next batch; dropping
/// the task aborts it.
fn read_ahead(
    mut input: SendableRecordBatchStream,
) -> (
    tokio::sync::mpsc::Receiver<Result<RecordBatch>>,
    SpawnedTask<()>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let reading = SpawnedTask::spawn(async move {
        while let Some(batch) = input.next().await {
            let failed = batch.is_err();
            if tx.send(batch).await.is_err() || failed {
                break;
            }
        }
    });
    (rx, reading)
}

/// Stage one for one plan batch: its boundary, the rows the sink writes,
/// and the sink's work ahead of the commit.
async fn prepare(
    sink: &dyn Sink,
    target: &TargetTable,
    feed: &RouteFeed,
    target_schema: &SchemaRef,
    skip_deletes: bool,
    batch: Result<RecordBatch>,
) -> Result<Prepared> {
    let batch = batch?;
    let Some(boundary) = feed.pop_boundary() else {
        return internal_err!("a batch reached the sink without its position");
    };
    let started = std::time::Instant::now();
    let sink_batch = to_sink_batch(&batch, target_schema, target.mode, skip_deletes)?;
    let batch = sink
        .prepare(target, sink_batch, boundary.may_defer)
        .await
        .map_err(|cause| commit_error(target, &boundary, cause))?;
    Ok(Prepared {
        batch,
        boundary,
        micros: started.elapsed().as_micros() as u64,
    })
}

/// Stage two for one prepared batch: staged when its transaction goes on,
/// else committed with its position.
async fn commit(sink: &dyn Sink, target: &TargetTable, prepared: Prepared) -> Result<Done> {
    let Prepared {
        batch,
        boundary,
        micros,
    } = prepared;
    let (rows, deletes) = (
        batch.batch.rows.num_rows() as u64,
        batch.batch.delete_count() as u64,
    );
    let started = std::time::Instant::now();
    if boundary.open_transaction {
        // A part of a transaction that goes on: staged, and committed by the
        // batch that closes it (no commit to report yet).
        sink.stage_prepared(target, batch)
            .await
            .map_err(|cause| commit_error(target, &boundary, cause))?;
        return Ok(Done::Staged {
            rows,
            deletes,
            micros: micros + started.elapsed().as_micros() as u64,
        });
    }
    let committed = sink
        .commit_prepared(target, batch, &boundary.end)
        .await
        .map_err(|cause| commit_error(target, &boundary, cause))?;
    if committed == Committed::Deferred {
        return Ok(Done::Staged {
            rows,
            deletes,
            micros: micros + started.elapsed().as_micros() as u64,
        });
    }
    Ok(Done::Committed {
        table: target.display_name(),
        position: boundary.end,
        rows,
        deletes,
        micros: micros + started.elapsed().as_micros() as u64,
    })
}

/// A sink's failure for the batch ending at `boundary`: terminal for the
/// run, naming the table and the position.
fn commit_error(target: &TargetTable, boundary: &Boundary, cause: SinkError) -> DataFusionError {
    let position = if boundary.open_transaction {
        format!("{} (a staged part of an open transaction)", boundary.end)
    } else {
        boundary.end.clone()
    };
    DataFusionError::External(Box::new(SinkCommitError {
        table: target.display_name(),
        position,
        cause,
    }))
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
        // Stage one, a task of its own: each batch, in order, with its
        // boundary, prepared by the sink (its files written) while stage two
        // commits the one before. One prepared batch waits at most, so the
        // sink works at most one batch ahead of its commits. It stops at
        // its first error, which stage two reports in its turn.
        let (prepared_tx, prepared_rx) = tokio::sync::mpsc::channel::<Result<Prepared>>(1);
        let preparing = {
            let sink = Arc::clone(&sink);
            let target = Arc::clone(&target);
            SpawnedTask::spawn(async move {
                let (mut input, reading) = read_ahead(input);
                while let Some(batch) = input.recv().await {
                    let item =
                        prepare(&*sink, &target, &feed, &target_schema, skip_deletes, batch).await;
                    let failed = item.is_err();
                    if prepared_tx.send(item).await.is_err() || failed {
                        return;
                    }
                }
                // The input ended: a panic there is an error, not an end.
                if let Err(e) = reading.join().await {
                    let _ = prepared_tx
                        .send(internal_err!("reading the sink's input stopped: {e}"))
                        .await;
                }
            })
        };
        // Stage two commits one batch at a time: commits of a table are
        // serialized and in position order. Dropping the stream drops the
        // receiver and the task (which is then aborted); stage one's end is
        // looked at, so a panic there is an error here, not an end.
        let commits = futures::stream::unfold(Some((prepared_rx, preparing)), |state| async move {
            let (mut rx, task) = state?;
            match rx.recv().await {
                Some(item) => Some((item, Some((rx, task)))),
                None => match task.join().await {
                    Ok(()) => None,
                    Err(e) => Some((
                        internal_err!("preparing the sink's batches stopped: {e}"),
                        None,
                    )),
                },
            }
        })
        .then(move |item| {
            let sink = Arc::clone(&sink);
            let target = Arc::clone(&target);
            async move { commit(&*sink, &target, item?).await }
        });
        // Rows, deletes and sink time staged or deferred since the last
        // commit: the commit that makes them visible reports them.
        let mut staged = (0u64, 0u64, 0u64);
        let stream = commits.map(move |done| match done? {
            Done::Staged {
                rows,
                deletes,
                micros,
            } => {
                staged.0 += rows;
                staged.1 += deletes;
                staged.2 += micros;
                Ok(RecordBatch::new_empty(Arc::clone(&stats_schema)))
            }
            Done::Committed {
                table,
                position,
                rows,
                deletes,
                micros,
            } => {
                let (staged_rows, staged_deletes, staged_micros) = std::mem::take(&mut staged);
                Ok(RecordBatch::try_new(
                    Arc::clone(&stats_schema),
                    vec![
                        Arc::new(StringArray::from(vec![table])),
                        Arc::new(StringArray::from(vec![position])),
                        Arc::new(UInt64Array::from(vec![rows + staged_rows])),
                        Arc::new(UInt64Array::from(vec![deletes + staged_deletes])),
                        Arc::new(UInt64Array::from(vec![micros + staged_micros])),
                    ],
                )?)
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, stream)))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::exec_err;

    use super::*;

    fn batch(v: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()
    }

    fn stream(items: Vec<Result<RecordBatch>>) -> SendableRecordBatchStream {
        Box::pin(RecordBatchStreamAdapter::new(
            batch(0).schema(),
            futures::stream::iter(items),
        ))
    }

    #[tokio::test]
    async fn read_ahead_gives_the_batches_in_order_and_stops_at_the_first_error() {
        let (mut rx, reading) = read_ahead(stream(vec![
            Ok(batch(1)),
            Ok(batch(2)),
            exec_err!("the plan failed"),
            Ok(batch(4)),
        ]));
        let mut got = Vec::new();
        while let Some(item) = rx.recv().await {
            got.push(item.map(|b| {
                b.column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .value(0)
            }));
        }
        assert_eq!(got.len(), 3, "nothing after the error");
        assert_eq!(got[0].as_ref().unwrap(), &1);
        assert_eq!(got[1].as_ref().unwrap(), &2);
        assert!(
            got[2]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("the plan failed")
        );
        reading.join().await.expect("the task ended by itself");
    }

    #[tokio::test]
    async fn a_panic_while_reading_is_seen_by_joining_the_task() {
        let panicking = futures::stream::iter([1]).map(|_| -> Result<RecordBatch> {
            panic!("the collapse panicked");
        });
        let input: SendableRecordBatchStream =
            Box::pin(RecordBatchStreamAdapter::new(batch(0).schema(), panicking));
        let (mut rx, reading) = read_ahead(input);
        assert!(rx.recv().await.is_none(), "the channel closes");
        assert!(reading.join().await.is_err(), "the panic is an error");
    }
}
