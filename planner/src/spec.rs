//! `PipelineSpec`: what a pipeline file says, independent of the language it
//! was written in (pipeline SQL or the Go engine's YAML), with the location of
//! every part for error messages.

use std::fmt;

use sqlparser::ast::Expr as SqlExpr;

use crate::diagnostic::Span;
use crate::options::OptionMap;
use crate::types::CanonicalType;

/// A name as written, with its location.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

impl Ident {
    /// A name at `span`.
    pub fn new(name: impl Into<String>, span: Span) -> Self {
        Ident {
            name: name.into(),
            span,
        }
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// A dotted name (`public.orders`, `bronze.orders`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    pub parts: Vec<String>,
    pub span: Span,
}

impl QualifiedName {
    /// A dotted name at `span`.
    pub fn new(parts: Vec<String>, span: Span) -> Self {
        QualifiedName { parts, span }
    }

    /// The last part (the table's own name).
    pub fn leaf(&self) -> &str {
        self.parts.last().map(String::as_str).unwrap_or("")
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.parts.join("."))
    }
}

/// A whole pipeline file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineSpec {
    pub name: Ident,
    /// Pipeline-level options (batching).
    pub options: OptionMap,
    pub sources: Vec<SourceSpec>,
    pub sinks: Vec<SinkSpec>,
    /// Declared tables of sources that carry no schema (file, Kafka).
    pub source_tables: Vec<SourceTableSpec>,
    pub routes: Vec<RouteSpec>,
}

impl PipelineSpec {
    /// The source of this name.
    pub fn source(&self, name: &str) -> Option<&SourceSpec> {
        self.sources.iter().find(|s| s.name.name == name)
    }

    /// The sink of this name.
    pub fn sink(&self, name: &str) -> Option<&SinkSpec> {
        self.sinks.iter().find(|s| s.name.name == name)
    }

    /// The declaration of `table` in `source`, if it has one.
    pub fn source_table(&self, source: &str, table: &[String]) -> Option<&SourceTableSpec> {
        self.source_tables
            .iter()
            .find(|t| t.source.name == source && t.table.parts == table)
    }
}

/// `CREATE SOURCE name FROM kind WITH (...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    pub name: Ident,
    pub kind: Ident,
    pub options: OptionMap,
}

/// `CREATE SINK name INTO kind WITH (...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkSpec {
    pub name: Ident,
    pub kind: Ident,
    pub options: OptionMap,
}

/// `CREATE TABLE source.table (columns..., PRIMARY KEY (...))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTableSpec {
    pub source: Ident,
    pub table: QualifiedName,
    pub columns: Vec<ColumnSpec>,
    pub primary_key: Vec<Ident>,
    /// `WITH (...)` of the declaration: per-table settings of the source
    /// kind (a Kafka table's `topic`), checked against
    /// [`SourceKindDef::table_options`](crate::registry::SourceKindDef::table_options).
    pub options: OptionMap,
}

/// One declared source column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    pub name: Ident,
    pub ty: CanonicalType,
    pub nullable: bool,
}

/// How a route writes its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteMode {
    /// Reflect source state by primary key.
    Upsert,
    /// Every change is a new row.
    Append,
    /// Append, made duplicate-free by the transport's own coordinate.
    AppendIdempotent,
}

impl WriteMode {
    /// Parses `upsert` | `append` | `append-idempotent`.
    pub fn parse(text: &str) -> Option<WriteMode> {
        match text {
            "upsert" => Some(WriteMode::Upsert),
            "append" => Some(WriteMode::Append),
            "append-idempotent" => Some(WriteMode::AppendIdempotent),
            _ => None,
        }
    }

    /// The mode as written in a pipeline.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMode::Upsert => "upsert",
            WriteMode::Append => "append",
            WriteMode::AppendIdempotent => "append-idempotent",
        }
    }
}

impl fmt::Display for WriteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A SQL expression with the location of its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpannedExpr {
    pub expr: SqlExpr,
    pub span: Span,
}

/// One item of a route's `SELECT` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectionItem {
    /// `*` (data columns only), with `REPLACE (expr AS col)` replacements —
    /// the form YAML's `cast:` produces.
    Wildcard {
        replace: Vec<(Ident, SpannedExpr)>,
        span: Span,
    },
    /// `expr [AS alias]`.
    Expr {
        expr: Box<SpannedExpr>,
        alias: Option<Ident>,
    },
}

/// `CREATE TABLE sink.target WITH (...) AS SELECT ... FROM source.table [WHERE ...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub sink: Ident,
    pub target: QualifiedName,
    pub source: Ident,
    pub source_table: QualifiedName,
    /// Route options: `primary_key`, `write_mode`, `partition_by`, `workers`, ...
    pub options: OptionMap,
    pub projection: Vec<ProjectionItem>,
    pub filter: Option<SpannedExpr>,
    /// Where the route statement starts.
    pub span: Span,
}

impl RouteSpec {
    /// `sink.target`, as messages name the route.
    pub fn display_name(&self) -> String {
        format!("{}.{}", self.sink.name, self.target)
    }
}
