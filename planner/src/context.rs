//! The context columns every change batch carries beside its data columns.
//!
//! A source appends these to the data columns of each table it emits; they
//! flow through a route's plan (filter, projection, collapse) and are how the
//! sink node learns what a row means. A context column reaches the target
//! only when the route selects it as a metadata column (see
//! [`crate::metadata`]).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, TimeUnit};

use crate::types::UTC;

/// `insert` | `update` | `delete` (Utf8, never null).
pub const OP: &str = "__op";
/// True for the before image of an update (Flink's UPDATE_BEFORE): upsert
/// routes use it to delete an old key when an update changed the key, append
/// routes drop it. Never null.
pub const BEFORE: &str = "__before";
/// Text form of the position of the transaction the row belongs to. Never null.
pub const POS: &str = "__pos";
/// Source commit time of the row's transaction; NULL for snapshot rows.
pub const COMMIT_TS: &str = "__commit_ts";
/// When the engine read the row.
pub const INGEST_TS: &str = "__ingest_ts";
/// `snapshot` | `stream` | `incremental`.
pub const PHASE: &str = "__phase";
/// The source table the row came from (`schema.table`).
pub const SOURCE_TABLE: &str = "__source_table";
/// Transport stream (topic; a change file's name).
pub const STREAM: &str = "__stream";
/// Transport shard (partition; 0 for a change file).
pub const SHARD: &str = "__shard";
/// Transport sequence (offset; a change file's line's byte offset).
pub const SEQUENCE: &str = "__sequence";
/// Transport message timestamp.
pub const MSG_TS: &str = "__msg_ts";
/// Transport message key.
pub const MSG_KEY: &str = "__msg_key";
/// Transport headers as JSON text.
pub const HEADERS: &str = "__headers";

/// Values of [`OP`].
pub const OP_INSERT: &str = "insert";
/// `__op` of an update (after and before images alike).
pub const OP_UPDATE: &str = "update";
/// `__op` of a delete (its before image).
pub const OP_DELETE: &str = "delete";

/// Values of [`PHASE`].
pub const PHASE_SNAPSHOT: &str = "snapshot";
/// `__phase` of rows read from the change stream.
pub const PHASE_STREAM: &str = "stream";

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC)))
}

/// Context columns every source provides, in batch order.
pub fn cdc_fields() -> Vec<FieldRef> {
    vec![
        Arc::new(Field::new(OP, DataType::Utf8, false)),
        Arc::new(Field::new(BEFORE, DataType::Boolean, false)),
        Arc::new(Field::new(POS, DataType::Utf8, false)),
        Arc::new(Field::new(COMMIT_TS, ts(), true)),
        Arc::new(Field::new(INGEST_TS, ts(), false)),
        Arc::new(Field::new(PHASE, DataType::Utf8, false)),
        Arc::new(Field::new(SOURCE_TABLE, DataType::Utf8, false)),
    ]
}

/// How much transport context a source carries, beyond the CDC columns.
///
/// A transport's coordinate (stream, shard, sequence: Kafka's topic,
/// partition and offset) names each change uniquely and in order; it is what
/// `append-idempotent` relies on. Message context (timestamp, key, headers)
/// exists only where a change travelled as a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    /// CDC columns only (a database's replication stream).
    None,
    /// The coordinate: [`STREAM`], [`SHARD`], [`SEQUENCE`] (a change file:
    /// the file, one shard, the line's byte offset).
    Coordinate,
    /// The coordinate and the message's timestamp, key and headers (Kafka).
    Full,
}

/// The coordinate columns, in batch order after [`cdc_fields`]. Never
/// null: every change of a source with a coordinate has one (a sink that
/// replaces by it relies on that).
pub fn coordinate_fields() -> Vec<FieldRef> {
    vec![
        Arc::new(Field::new(STREAM, DataType::Utf8, false)),
        Arc::new(Field::new(SHARD, DataType::Int32, false)),
        Arc::new(Field::new(SEQUENCE, DataType::Int64, false)),
    ]
}

/// The message columns, in batch order after [`coordinate_fields`].
pub fn message_fields() -> Vec<FieldRef> {
    vec![
        Arc::new(Field::new(MSG_TS, ts(), true)),
        Arc::new(Field::new(MSG_KEY, DataType::Binary, true)),
        Arc::new(Field::new(HEADERS, DataType::Utf8, true)),
    ]
}

/// The context columns a source with `transport` delivers after the data
/// columns, in batch order.
pub fn context_fields(transport: Transport) -> Vec<FieldRef> {
    let mut fields = cdc_fields();
    if transport >= Transport::Coordinate {
        fields.extend(coordinate_fields());
    }
    if transport >= Transport::Full {
        fields.extend(message_fields());
    }
    fields
}

/// True for the name of a context column (they all start with `__`).
pub fn is_context_column(name: &str) -> bool {
    name.starts_with("__")
}
