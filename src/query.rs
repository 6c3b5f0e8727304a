//! Queries of what landed: DataFusion SQL over a pipeline's sink tables,
//! each named as the pipeline writes it (`lake.orders`: the sink, then the
//! table), read through the sink's own reader
//! ([`Sink::read_table`](urutau_planner::sink::Sink::read_table)) when a
//! query names it. Read-only: DDL and DML are refused.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{MemoryCatalogProvider, SchemaProvider, TableProvider};
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionContext};
use urutau_planner::plan::PipelinePlan;
use urutau_planner::sink::Sink;
use urutau_planner::target::TargetTable;

/// A query's rows.
#[derive(Debug, Clone)]
pub struct QueryResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

impl QueryResult {
    /// How many rows the result holds.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// The tables of one schema (`lake` of `lake.orders`): the routes writing
/// into one sink.
#[derive(Debug)]
struct SinkTables {
    /// `lake` (or `catalog.schema` for three-part names), for messages.
    schema: String,
    tables: BTreeMap<String, (Arc<dyn Sink>, Arc<TargetTable>)>,
}

#[async_trait]
impl SchemaProvider for SinkTables {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.tables.keys().cloned().collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        let Some((sink, target)) = self.tables.get(name) else {
            return Ok(None);
        };
        match sink.read_table(target).await {
            Ok(Some(p)) => Ok(Some(p)),
            Ok(None) => Err(DataFusionError::Plan(format!(
                "table {}.{name} is not in its sink yet ({} there): nothing was committed to it; run the pipeline first",
                self.schema,
                target.display_name()
            ))),
            Err(e) => Err(DataFusionError::External(
                format!("reading {}.{name}: {e}", self.schema).into(),
            )),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.tables.contains_key(name)
    }
}

/// A session whose catalog holds the pipeline's sink tables.
fn context(plan: &PipelinePlan) -> Result<SessionContext, String> {
    let ctx = SessionContext::new();
    // (catalog or None for the default one, schema) -> tables.
    let mut schemas: BTreeMap<(Option<String>, String), SinkTables> = BTreeMap::new();
    for route in &plan.routes {
        let parts: Vec<&str> = route.name.split('.').collect();
        let (catalog, schema, table) = match parts.as_slice() {
            [s, t] => (None, s.to_string(), t.to_string()),
            [c, s, t] => (Some(c.to_string()), s.to_string(), t.to_string()),
            _ => {
                return Err(format!(
                    "route {}: a queried table is named sink.table or sink.schema.table",
                    route.name
                ));
            }
        };
        let shown = match &catalog {
            Some(c) => format!("{c}.{schema}"),
            None => schema.clone(),
        };
        schemas
            .entry((catalog, schema))
            .or_insert_with(|| SinkTables {
                schema: shown,
                tables: BTreeMap::new(),
            })
            .tables
            .insert(table, (Arc::clone(&route.sink), Arc::clone(&route.target)));
    }
    let default_catalog = ctx
        .catalog("datafusion")
        .ok_or_else(|| "the query session has no default catalog".to_string())?;
    for ((catalog, schema), tables) in schemas {
        let target = match catalog {
            None => Arc::clone(&default_catalog),
            Some(c) => match ctx.catalog(&c) {
                Some(existing) => existing,
                None => {
                    let made = Arc::new(MemoryCatalogProvider::new());
                    ctx.register_catalog(&c, made.clone());
                    made
                }
            },
        };
        target
            .register_schema(&schema, Arc::new(tables))
            .map_err(|e| e.to_string())?;
    }
    Ok(ctx)
}

/// The pipeline's queryable tables, for messages.
fn table_list(plan: &PipelinePlan) -> String {
    plan.routes
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `sql` (read-only) over the pipeline's sink tables.
pub(crate) async fn run(plan: &PipelinePlan, sql: &str) -> Result<QueryResult, String> {
    let ctx = context(plan)?;
    let options = SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    let explain = |e: DataFusionError| {
        let text = e.to_string();
        if text.contains("not found") {
            format!("{text} (the pipeline's tables: {})", table_list(plan))
        } else {
            text
        }
    };
    let df = ctx.sql_with_options(sql, options).await.map_err(explain)?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await.map_err(explain)?;
    Ok(QueryResult { schema, batches })
}

/// Every row of one table (`lake.orders`).
pub(crate) async fn read(plan: &PipelinePlan, table: &str) -> Result<QueryResult, String> {
    let Some(route) = plan.routes.iter().find(|r| r.name == table) else {
        return Err(format!(
            "no table {table} in the pipeline (its tables: {})",
            table_list(plan)
        ));
    };
    let provider = match route.sink.read_table(&route.target).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Err(format!(
                "table {table} is not in its sink yet: nothing was committed to it; run the pipeline first"
            ));
        }
        Err(e) => return Err(format!("reading {table}: {e}")),
    };
    let ctx = SessionContext::new();
    let df = ctx.read_table(provider).map_err(|e| e.to_string())?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await.map_err(|e| e.to_string())?;
    Ok(QueryResult { schema, batches })
}
