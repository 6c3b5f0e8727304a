//! The target a route writes: its columns with canonical types, key, write
//! mode and partitioning — what a sink's `ensure_table` creates or validates.

use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};

use crate::evolution::SchemaChanges;
use crate::partition::PartitionField;
use crate::spec::WriteMode;
use crate::types::CanonicalType;

/// Where a target column comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnOrigin {
    /// A data column (an expression over source data columns).
    Data,
    /// A metadata column, by catalog name (`commit_ts`).
    Metadata(String),
}

/// One column of a target table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetColumn {
    pub name: String,
    pub ty: CanonicalType,
    pub nullable: bool,
    pub origin: ColumnOrigin,
}

/// A route's target table, as the sink must hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetTable {
    /// The table's name inside the sink (`bronze.orders` or `orders`).
    pub name: Vec<String>,
    /// Data columns first, then metadata columns in selected order.
    pub columns: Vec<TargetColumn>,
    /// Key column names (empty for append routes without a key).
    pub key: Vec<String>,
    pub mode: WriteMode,
    pub partition_by: Vec<PartitionField>,
    /// Workers that split the key space (1 = collapsed).
    pub workers: u32,
    /// Whether the sink may evolve an existing table toward this one (add
    /// columns, promote types, relax columns the route no longer writes to
    /// nullable) instead of refusing the difference.
    pub schema_changes: SchemaChanges,
}

impl TargetTable {
    /// Dotted name for messages.
    pub fn display_name(&self) -> String {
        self.name.join(".")
    }

    /// The Arrow schema of the rows a sink receives.
    pub fn arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|c| Field::new(&c.name, c.ty.arrow_type(), c.nullable))
                .collect::<Vec<_>>(),
        ))
    }

    /// The target names of the transport coordinate's columns (the
    /// metadata columns `stream`, `shard`, `sequence`, in that order) that
    /// the table holds: what an `append-idempotent` table is unique by.
    pub fn coordinate_columns(&self) -> Vec<&str> {
        crate::metadata::COORDINATE
            .iter()
            .filter_map(|m| {
                self.columns.iter().find_map(|c| match &c.origin {
                    ColumnOrigin::Metadata(n) if n == m => Some(c.name.as_str()),
                    _ => None,
                })
            })
            .collect()
    }

    /// The columns the table is ordered by, and which a replacing sink
    /// makes unique: an `append-idempotent` table's coordinate (changes of
    /// one key must not collapse), otherwise the key.
    pub fn order_columns(&self) -> Vec<&str> {
        match self.mode {
            WriteMode::AppendIdempotent => self.coordinate_columns(),
            _ => self.key.iter().map(String::as_str).collect(),
        }
    }

    /// Index of the key columns in [`Self::columns`].
    pub fn key_indices(&self) -> Vec<usize> {
        self.key
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| &c.name == k))
            .collect()
    }
}
