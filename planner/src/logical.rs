//! The user-defined logical nodes of a route's plan: the change filter, the
//! per-key collapse and the sink. They render in `EXPLAIN` like DataFusion's
//! own nodes.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{DFSchema, DFSchemaRef, Result};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};

use crate::spec::WriteMode;

/// What the change filter does with a row whose predicate is not true.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum OnMiss {
    /// Upsert: the row becomes a delete of its key (the target mirrors the
    /// filtered source: a row updated out of the filter leaves it).
    Delete,
    /// Append: the row is dropped.
    Drop,
}

impl fmt::Display for OnMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnMiss::Delete => "delete",
            OnMiss::Drop => "drop",
        })
    }
}

/// `WHERE` over a change stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChangeFilterNode {
    pub input: LogicalPlan,
    pub predicate: Expr,
    pub on_miss: OnMiss,
}

impl PartialOrd for ChangeFilterNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.input.partial_cmp(&other.input)
    }
}

impl UserDefinedLogicalNodeCore for ChangeFilterNode {
    fn name(&self) -> &str {
        "ChangeFilter"
    }
    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }
    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }
    fn expressions(&self) -> Vec<Expr> {
        vec![self.predicate.clone()]
    }
    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "ChangeFilter: {}, on_miss={}",
            self.predicate, self.on_miss
        )
    }
    fn with_exprs_and_inputs(
        &self,
        mut exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Ok(ChangeFilterNode {
            input: inputs.swap_remove(0),
            predicate: exprs.swap_remove(0),
            on_miss: self.on_miss,
        })
    }
}

/// Upsert collapse: one row per key per batch, last write wins.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CollapseNode {
    pub input: LogicalPlan,
    pub key: Vec<String>,
}

impl PartialOrd for CollapseNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.input.partial_cmp(&other.input)
    }
}

impl UserDefinedLogicalNodeCore for CollapseNode {
    fn name(&self) -> &str {
        "Collapse"
    }
    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }
    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }
    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }
    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Collapse: key=[{}]", self.key.join(", "))
    }
    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Ok(CollapseNode {
            input: inputs.swap_remove(0),
            key: self.key.clone(),
        })
    }
}

/// The commit node: writes each batch into the sink with its position.
#[derive(Debug, Clone)]
pub struct SinkNode {
    pub input: LogicalPlan,
    /// The sink's name in the pipeline.
    pub sink: String,
    /// The sink kind (`iceberg`).
    pub kind: String,
    /// The target table inside the sink (`bronze.orders`).
    pub table: String,
    pub mode: WriteMode,
    pub key: Vec<String>,
    schema: DFSchemaRef,
}

impl SinkNode {
    /// A sink node over `input` (its output: one statistics row per commit).
    pub fn new(
        input: LogicalPlan,
        sink: String,
        kind: String,
        table: String,
        mode: WriteMode,
        key: Vec<String>,
    ) -> Self {
        SinkNode {
            input,
            sink,
            kind,
            table,
            mode,
            key,
            schema: Arc::new(
                DFSchema::try_from(commit_stats_schema()).expect("static schema is valid"),
            ),
        }
    }
}

/// What a sink node outputs: one row per commit.
pub fn commit_stats_schema() -> Schema {
    Schema::new(vec![
        Field::new("table", DataType::Utf8, false),
        Field::new("position", DataType::Utf8, false),
        Field::new("rows", DataType::UInt64, false),
        Field::new("deletes", DataType::UInt64, false),
        Field::new("commit_micros", DataType::UInt64, false),
    ])
}

impl PartialEq for SinkNode {
    fn eq(&self, other: &Self) -> bool {
        self.input == other.input
            && self.sink == other.sink
            && self.table == other.table
            && self.mode == other.mode
            && self.key == other.key
    }
}
impl Eq for SinkNode {}
impl Hash for SinkNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.input.hash(state);
        self.sink.hash(state);
        self.table.hash(state);
    }
}
impl PartialOrd for SinkNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.input.partial_cmp(&other.input)
    }
}

impl UserDefinedLogicalNodeCore for SinkNode {
    fn name(&self) -> &str {
        "Sink"
    }
    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }
    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }
    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }
    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "Sink: sink={} ({}), table={}, mode={}",
            self.sink, self.kind, self.table, self.mode
        )?;
        if !self.key.is_empty() {
            write!(f, ", key=[{}]", self.key.join(", "))?;
        }
        Ok(())
    }
    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Ok(SinkNode {
            input: inputs.swap_remove(0),
            ..self.clone()
        })
    }
}

/// Wraps a node into a logical plan.
pub fn extension<N: UserDefinedLogicalNodeCore>(node: N) -> LogicalPlan {
    LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })
}
