//! Preview: what each table would receive from the next changes, without
//! committing anything.
//!
//! The pipeline is planned again with every sink kind wrapped in a
//! [`PreviewSink`], so each route's plan (scan, filter, casts, metadata
//! columns, collapse) is exactly the one a run executes, and only the last
//! step differs: the wrapper prepares no table (nothing is created), asks
//! the real sink for its position read-only
//! ([`Sink::peek_position`]), and keeps each batch it is handed instead of
//! writing it. The run is limited to `limit` changes per route
//! ([`RunOptions::changes_per_route`]) and ends when every route had them
//! or the source is caught up, so a preview of a huge file reads only its
//! beginning. Sources read without creating or moving anything
//! ([`RunOptions::peek`]): a Postgres source peeks at its slot and reads
//! its unfinished snapshots by `SELECT`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::TableProvider;
use urutau_engine::RunOptions;
use urutau_planner::plan::{PipelinePlan, plan_pipeline};
use urutau_planner::registry::{Registry, SinkKindDef, SinkProvider};
use urutau_planner::sink::{Sink, SinkBatch, SinkError};
use urutau_planner::spec::{PipelineSpec, SinkSpec, WriteMode};
use urutau_planner::target::TargetTable;

use crate::QueryResult;

/// The column a preview appends to each table's rows: what the sink would
/// do with the row (`upsert` or `delete` on an upsert table, `append` on
/// an append table).
pub const CHANGE_COLUMN: &str = "_change";

/// The batches each table was handed: (sink name, table) -> batches.
#[derive(Debug, Default)]
struct Captures {
    tables: Mutex<BTreeMap<(String, String), Vec<SinkBatch>>>,
}

impl Captures {
    fn take(&self, sink: &str, table: &str) -> Vec<SinkBatch> {
        self.tables
            .lock()
            .expect("captures lock")
            .remove(&(sink.to_string(), table.to_string()))
            .unwrap_or_default()
    }
}

/// A sink kind whose sinks capture instead of committing.
struct PreviewSinkProvider {
    inner: Arc<dyn SinkProvider>,
    captures: Arc<Captures>,
}

impl SinkProvider for PreviewSinkProvider {
    fn def(&self) -> &SinkKindDef {
        self.inner.def()
    }

    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(PreviewSink {
            sink: spec.name.name.clone(),
            inner: self.inner.open(spec)?,
            captures: Arc::clone(&self.captures),
        }))
    }
}

/// A sink that keeps what it is handed; see the module docs.
#[derive(Debug)]
struct PreviewSink {
    sink: String,
    inner: Arc<dyn Sink>,
    captures: Arc<Captures>,
}

#[async_trait]
impl Sink for PreviewSink {
    async fn ensure_table(&self, _table: &TargetTable) -> Result<(), SinkError> {
        Ok(())
    }

    async fn committed_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError> {
        self.inner.peek_position(table).await
    }

    async fn commit(
        &self,
        table: &TargetTable,
        batch: &SinkBatch,
        _position: &str,
    ) -> Result<(), SinkError> {
        if batch.rows.num_rows() > 0 {
            self.captures
                .tables
                .lock()
                .expect("captures lock")
                .entry((self.sink.clone(), table.display_name()))
                .or_default()
                .push(batch.clone());
        }
        Ok(())
    }

    async fn peek_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError> {
        self.inner.peek_position(table).await
    }

    async fn read_table(
        &self,
        table: &TargetTable,
    ) -> Result<Option<Arc<dyn TableProvider>>, SinkError> {
        self.inner.read_table(table).await
    }
}

/// `base` with every sink kind capturing into `captures`.
fn preview_registry(base: &Registry, captures: &Arc<Captures>) -> Registry {
    let mut r = base.clone();
    for kind in base.sink_kinds() {
        if let Some(inner) = base.sink(kind) {
            r.register_sink(Arc::new(PreviewSinkProvider {
                inner: Arc::clone(inner),
                captures: Arc::clone(captures),
            }));
        }
    }
    r
}

/// Why a preview cannot run, or what it returned: per route name, the
/// rows the sink would receive with [`CHANGE_COLUMN`] at the end.
pub(crate) async fn preview(
    spec: &PipelineSpec,
    base: &Registry,
    limit: u64,
) -> Result<BTreeMap<String, QueryResult>, PreviewError> {
    let captures = Arc::new(Captures::default());
    let registry = preview_registry(base, &captures);
    let plan: PipelinePlan = plan_pipeline(spec.clone(), &registry)
        .await
        .map_err(|d| PreviewError::Plan(d.render("pipeline", None)))?;
    // Figures of its own: a preview never shows in a run's metrics.
    let options = RunOptions {
        exit_when_caught_up: true,
        changes_per_route: Some(limit),
        peek: true,
        metrics: Default::default(),
        continues: false,
    };
    urutau_engine::run(&plan, options, urutau_engine::Shutdown::new())
        .await
        .map_err(|e| PreviewError::Run(e.to_string()))?;
    let mut out = BTreeMap::new();
    for route in &plan.routes {
        let batches = captures.take(&route.sink_name, &route.target.display_name());
        let result = with_change_column(&route.target, batches)
            .map_err(|e| PreviewError::Run(format!("route {}: {e}", route.name)))?;
        out.insert(route.name.clone(), result);
    }
    Ok(out)
}

/// Why a preview failed.
#[derive(Debug)]
pub(crate) enum PreviewError {
    /// Planning again failed (a server could not be asked).
    Plan(String),
    /// The limited run failed.
    Run(String),
}

/// The captured batches as one result, each row with its change kind.
fn with_change_column(
    target: &TargetTable,
    batches: Vec<SinkBatch>,
) -> Result<QueryResult, arrow::error::ArrowError> {
    let base = batches
        .first()
        .map_or_else(|| target.arrow_schema(), |b| b.rows.schema());
    let mut fields: Vec<Field> = base.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGE_COLUMN, DataType::Utf8, false));
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let upsert = target.mode == WriteMode::Upsert;
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let kinds: StringArray = (0..b.rows.num_rows())
            .map(|i| {
                Some(match (upsert, is_delete(&b.deletes, i)) {
                    (true, true) => "delete",
                    (true, false) => "upsert",
                    (false, _) => "append",
                })
            })
            .collect();
        let mut columns: Vec<ArrayRef> = b.rows.columns().to_vec();
        columns.push(Arc::new(kinds));
        out.push(RecordBatch::try_new(Arc::clone(&schema), columns)?);
    }
    Ok(QueryResult {
        schema,
        batches: out,
    })
}

fn is_delete(deletes: &BooleanArray, i: usize) -> bool {
    deletes.is_valid(i) && deletes.value(i)
}
