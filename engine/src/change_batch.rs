//! Building the context columns of change batches (see
//! [`urutau_planner::context`]) beside a source's data columns.

use std::sync::Arc;

use arrow::array::{
    ArrayBuilder, ArrayRef, BinaryBuilder, BooleanBuilder, Int32Array, Int64Array, StringArray,
    StringBuilder, TimestampMicrosecondBuilder,
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
        // The next batch gets this one's room (see `MessageBuilder::finish`).
        let pos_bytes = self.pos.values_slice().len();
        let mut before = std::mem::replace(&mut self.before, BooleanBuilder::with_capacity(n));
        let mut pos = std::mem::replace(&mut self.pos, StringBuilder::with_capacity(n, pos_bytes));
        let mut commit_ts = std::mem::replace(
            &mut self.commit_ts,
            TimestampMicrosecondBuilder::with_capacity(n),
        );
        vec![
            op,
            Arc::new(before.finish()),
            Arc::new(pos.finish()),
            Arc::new(commit_ts.finish().with_timezone(UTC)),
            Arc::new(ingest.finish().with_timezone(UTC)),
            phase,
            Arc::new(table.finish()),
        ]
    }
}

/// Accumulates the transport coordinate columns ([`context::STREAM`],
/// [`context::SHARD`], [`context::SEQUENCE`]) of one table's rows, for a
/// source whose changes each have one (see [`context::Transport`]).
///
/// Streams come in runs (a change file's rows are consecutive), so a run is
/// counted instead of appending the name per row.
#[derive(Debug, Default)]
pub struct CoordinateBuilder {
    streams: Vec<(Arc<str>, usize)>,
    shards: Vec<i32>,
    sequences: Vec<i64>,
}

impl CoordinateBuilder {
    /// Appends one row's coordinate.
    pub fn append(&mut self, stream: &Arc<str>, shard: i32, sequence: i64) {
        match self.streams.last_mut() {
            Some((s, n)) if Arc::ptr_eq(s, stream) || **s == **stream => *n += 1,
            _ => self.streams.push((stream.clone(), 1)),
        }
        self.shards.push(shard);
        self.sequences.push(sequence);
    }

    /// The coordinate columns, in [`context::coordinate_fields`] order.
    pub fn finish(&mut self) -> Vec<ArrayRef> {
        let bytes = self.streams.iter().map(|(s, n)| s.len() * n).sum();
        let mut stream = StringBuilder::with_capacity(self.sequences.len(), bytes);
        for (s, n) in self.streams.drain(..) {
            for _ in 0..n {
                stream.append_value(&*s);
            }
        }
        let n = self.sequences.len();
        vec![
            Arc::new(stream.finish()),
            Arc::new(Int32Array::from(std::mem::replace(
                &mut self.shards,
                Vec::with_capacity(n),
            ))),
            Arc::new(Int64Array::from(std::mem::replace(
                &mut self.sequences,
                Vec::with_capacity(n),
            ))),
        ]
    }
}

/// One message's transport fields: its timestamp, key and headers (as a
/// JSON object text).
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageMeta<'a> {
    pub ts_micros: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub headers: Option<&'a str>,
}

/// Accumulates the message columns ([`context::MSG_TS`],
/// [`context::MSG_KEY`], [`context::HEADERS`]) of one table's rows, for a
/// source of messages ([`context::Transport::Full`]).
#[derive(Debug, Default)]
pub struct MessageBuilder {
    ts: TimestampMicrosecondBuilder,
    key: BinaryBuilder,
    headers: StringBuilder,
}

impl MessageBuilder {
    /// Appends one row's message fields.
    pub fn append(&mut self, m: &MessageMeta<'_>) {
        self.ts.append_option(m.ts_micros);
        self.key.append_option(m.key);
        self.headers.append_option(m.headers);
    }

    /// The message columns, in [`context::message_fields`] order. The
    /// builders start the next batch with this one's room: grown from
    /// empty again, their reallocations showed in a decoding lane's time.
    pub fn finish(&mut self) -> Vec<ArrayRef> {
        let n = self.ts.len();
        let (key_bytes, header_bytes) = (
            self.key.values_slice().len(),
            self.headers.values_slice().len(),
        );
        let mut ts = std::mem::replace(&mut self.ts, TimestampMicrosecondBuilder::with_capacity(n));
        let mut key = std::mem::replace(&mut self.key, BinaryBuilder::with_capacity(n, key_bytes));
        let mut headers = std::mem::replace(
            &mut self.headers,
            StringBuilder::with_capacity(n, header_bytes),
        );
        vec![
            Arc::new(ts.finish().with_timezone(UTC)),
            Arc::new(key.finish()),
            Arc::new(headers.finish()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int32Type, Int64Type};

    use super::*;

    #[test]
    fn coordinates_keep_their_rows_order_across_streams() {
        let (a, b) = (Arc::<str>::from("a.jsonl"), Arc::<str>::from("b.jsonl"));
        let mut c = CoordinateBuilder::default();
        c.append(&a, 0, 0);
        c.append(&a, 0, 17);
        c.append(&b, 0, 0);
        let cols = c.finish();
        let streams: Vec<&str> = cols[0].as_string::<i32>().iter().flatten().collect();
        assert_eq!(streams, ["a.jsonl", "a.jsonl", "b.jsonl"]);
        assert_eq!(cols[1].as_primitive::<Int32Type>().values(), &[0, 0, 0]);
        assert_eq!(cols[2].as_primitive::<Int64Type>().values(), &[0, 17, 0]);
        assert_eq!(cols[0].null_count(), 0);
        // The builder is empty again.
        assert_eq!(c.finish()[2].len(), 0);
    }
}
