//! Building the context columns of change batches (see
//! [`urutau_planner::context`]) beside a source's data columns.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, StringArray, StringBuilder, TimestampMicrosecondBuilder,
};
use urutau_planner::context;
use urutau_planner::types::UTC;

/// What a change row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    Insert,
    Update,
    /// The before image of an update.
    UpdateBefore,
    Delete,
}

impl RowKind {
    fn op(self) -> &'static str {
        match self {
            RowKind::Insert => context::OP_INSERT,
            RowKind::Update | RowKind::UpdateBefore => context::OP_UPDATE,
            RowKind::Delete => context::OP_DELETE,
        }
    }
}

/// Accumulates the CDC context columns of one table's rows.
pub struct ContextBuilder {
    op: Vec<&'static str>,
    before: BooleanBuilder,
    pos: StringBuilder,
    commit_ts: TimestampMicrosecondBuilder,
    phase: Vec<&'static str>,
    rows: usize,
    /// Rows whose position is not known yet (their transaction is open).
    pending_pos: usize,
}

impl Default for ContextBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ContextBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        ContextBuilder {
            op: Vec::new(),
            before: BooleanBuilder::new(),
            pos: StringBuilder::new(),
            commit_ts: TimestampMicrosecondBuilder::new(),
            phase: Vec::new(),
            rows: 0,
            pending_pos: 0,
        }
    }

    /// Rows appended so far.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// True before the first row.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Appends the context of one row; its position follows with
    /// [`Self::close_transaction`].
    pub fn append(&mut self, kind: RowKind, commit_ts_micros: Option<i64>, snapshot: bool) {
        self.op.push(kind.op());
        self.before.append_value(kind == RowKind::UpdateBefore);
        self.commit_ts.append_option(commit_ts_micros);
        self.phase.push(if snapshot {
            context::PHASE_SNAPSHOT
        } else {
            context::PHASE_STREAM
        });
        self.rows += 1;
        self.pending_pos += 1;
    }

    /// Gives every row of the transaction just closed its position.
    pub fn close_transaction(&mut self, position: &str) {
        for _ in 0..self.pending_pos {
            self.pos.append_value(position);
        }
        self.pending_pos = 0;
    }

    /// Rows appended since the last closed transaction.
    pub fn open_rows(&self) -> usize {
        self.pending_pos
    }

    /// The context columns, in [`context::cdc_fields`] order. Every
    /// transaction must be closed.
    pub fn finish(&mut self, ingest_ts_micros: i64, source_table: &str) -> Vec<ArrayRef> {
        assert_eq!(self.pending_pos, 0, "finish with an open transaction");
        let n = self.rows;
        self.rows = 0;
        let op: ArrayRef = Arc::new(StringArray::from_iter_values(self.op.drain(..)));
        let phase: ArrayRef = Arc::new(StringArray::from_iter_values(self.phase.drain(..)));
        let mut ingest = TimestampMicrosecondBuilder::with_capacity(n);
        ingest.append_value_n(ingest_ts_micros, n);
        let mut table = StringBuilder::with_capacity(n, n * source_table.len());
        for _ in 0..n {
            table.append_value(source_table);
        }
        vec![
            op,
            Arc::new(self.before.finish()),
            Arc::new(self.pos.finish()),
            Arc::new(self.commit_ts.finish().with_timezone(UTC)),
            Arc::new(ingest.finish().with_timezone(UTC)),
            phase,
            Arc::new(table.finish()),
        ]
    }
}
