//! Registries of source and sink kinds.
//!
//! The planner never depends on a concrete source or sink: the binary fills a
//! [`Registry`] with what the engine (sources) and the sinks crate provide,
//! and the planner validates options, reads table schemas and builds sink
//! nodes through these traits.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::context::Transport;
use crate::diagnostic::Diagnostics;
use crate::options::OptionDef;
use crate::sink::{Sink, SinkError};
use crate::spec::{
    ColumnSpec, QualifiedName, RouteSpec, SinkSpec, SourceSpec, SourceTableSpec, WriteMode,
};

/// What a source kind is, for validation and planning.
#[derive(Debug, Clone)]
pub struct SourceKindDef {
    /// `file`, `postgres`, ...
    pub name: &'static str,
    /// The scan node's name in EXPLAIN (`FileSourceExec`).
    pub exec_name: &'static str,
    pub doc: &'static str,
    pub options: Vec<OptionDef>,
    /// The source carries no schema: routed tables must be declared with
    /// `CREATE TABLE source.table (...)`.
    pub declares_tables: bool,
    /// The options a declared table of this kind takes (`CREATE TABLE
    /// k.orders (...) WITH (topic = '...')`); empty: none.
    pub table_options: Vec<OptionDef>,
    /// The transport context the source provides beyond the CDC columns:
    /// its coordinate (stream, shard, sequence) is what `append-idempotent`
    /// needs.
    pub transport: Transport,
    /// Extra checks of a source's options (settings this build cannot
    /// honour, combinations).
    pub rules: Vec<SourceRule>,
}

/// A check a source kind imposes on its sources.
pub type SourceRule = fn(&SourceSpec, &mut Diagnostics);

/// The schema of one source table, as the source reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTableSchema {
    pub columns: Vec<ColumnSpec>,
    pub primary_key: Vec<String>,
    /// Columns kept for the targets though the source no longer has them
    /// (dropped or renamed after the pipeline was planned; see
    /// [`crate::evolution`]): they read as NULL, and a route that names one
    /// explicitly is refused.
    pub dropped: Vec<String>,
}

/// Why a table's schema could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SchemaError {
    /// The pipeline names something the source does not have (a missing
    /// table, an undeclared schema): an invalid pipeline.
    #[error("{0}")]
    Invalid(String),
    /// The source could not be asked (unreachable, refused): a runtime
    /// failure, not a fault of the pipeline.
    #[error("{0}")]
    Unavailable(String),
}

/// A source kind, as the planner sees it.
#[async_trait]
pub trait SourceProvider: Send + Sync {
    fn def(&self) -> &SourceKindDef;

    /// The schema of a routed table: its declaration when the kind declares
    /// tables, otherwise what the source itself reports.
    async fn table_schema(
        &self,
        source: &SourceSpec,
        table: &QualifiedName,
        declared: Option<&SourceTableSpec>,
    ) -> Result<SourceTableSchema, SchemaError> {
        let _ = source;
        match declared {
            Some(d) => Ok(SourceTableSchema {
                columns: d.columns.clone(),
                primary_key: d.primary_key.iter().map(|k| k.name.clone()).collect(),
                dropped: vec![],
            }),
            None => Err(SchemaError::Invalid(format!(
                "source kind {} carries no schema: declare the table with CREATE TABLE {}.{} (...)",
                self.def().name,
                source.name,
                table
            ))),
        }
    }

    /// Parameters shown in EXPLAIN on the scan node (redacted).
    fn describe(&self, source: &SourceSpec) -> String;
}

/// Extra route checks a sink kind imposes (e.g. Couchbase: partitioned
/// tables need atomic commits).
pub type RouteRule = fn(&SinkSpec, &RouteSpec, u32, &mut Diagnostics);

/// What a sink kind is, for validation and planning.
#[derive(Debug, Clone)]
pub struct SinkKindDef {
    /// `iceberg`, `clickhouse`, `couchbase`, `debug`, `memory`.
    pub name: &'static str,
    /// The sink node's name in EXPLAIN (`IcebergSinkExec`).
    pub exec_name: &'static str,
    pub doc: &'static str,
    pub options: Vec<OptionDef>,
    /// Accepts `maintenance_*` options (Iceberg only).
    pub maintenance: bool,
    /// Accepts `partition_by`.
    pub partitioning: bool,
    /// Printed by `validate` when a route sets `partition_by`.
    pub partitioning_warning: Option<&'static str>,
    /// Accepts `workers > 1`.
    pub partitioned_tables: bool,
    pub write_modes: &'static [WriteMode],
    /// The option naming the sink's namespace, prefixed to one-part targets.
    pub namespace_option: Option<&'static str>,
    pub route_rules: Vec<RouteRule>,
}

/// A sink kind, as the planner sees it.
pub trait SinkProvider: Send + Sync {
    fn def(&self) -> &SinkKindDef;

    /// The sink a `CREATE SINK` configures. Must not connect anywhere yet:
    /// `plan` and `validate` open sinks too.
    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError>;
}

/// The source and sink kinds available to a pipeline.
#[derive(Default, Clone)]
pub struct Registry {
    sources: BTreeMap<&'static str, Arc<dyn SourceProvider>>,
    sinks: BTreeMap<&'static str, Arc<dyn SinkProvider>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a source kind.
    pub fn register_source(&mut self, provider: Arc<dyn SourceProvider>) {
        self.sources.insert(provider.def().name, provider);
    }

    /// Adds a sink kind.
    pub fn register_sink(&mut self, provider: Arc<dyn SinkProvider>) {
        self.sinks.insert(provider.def().name, provider);
    }

    /// The source kind of this name.
    pub fn source(&self, kind: &str) -> Option<&Arc<dyn SourceProvider>> {
        self.sources.get(kind)
    }

    /// The sink kind of this name.
    pub fn sink(&self, kind: &str) -> Option<&Arc<dyn SinkProvider>> {
        self.sinks.get(kind)
    }

    /// Names of the source kinds (for messages).
    pub fn source_kinds(&self) -> Vec<&'static str> {
        self.sources.keys().copied().collect()
    }

    /// Names of the sink kinds (for messages).
    pub fn sink_kinds(&self) -> Vec<&'static str> {
        self.sinks.keys().copied().collect()
    }
}
