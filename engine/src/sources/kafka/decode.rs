//! The Kafka source's decoding stage: batches of messages (as the consumer
//! copied them) into change batches, one table per topic.
//!
//! A message that cannot be decoded stops the run, naming topic, partition
//! and offset, or with `on_decode_error = 'skip'` is logged and left out:
//! the batch's tables are then decoded again without it, since a row that
//! failed half-way has left its columns uneven.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender};

use tokio::sync::mpsc;
use urutau_planner::evolution::{SchemaChange, SchemaChanges};
use urutau_planner::plan::{BeforeImages, SourceTablePlan};

use super::avro::Registry;
use super::offsets::Offsets;
use crate::change_batch::{MessageMeta, RowKind};
use crate::position::Position;
use crate::sources::debezium::{
    ConnectFields, Encodings, EventRows, SchemaCache, parse_event, row_images,
};
use crate::sources::decode::{RowMeta, TableDecoder};
use crate::sources::{SourceBatch, SourceError, TableChanges};

/// How message values are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Debezium change events.
    DebeziumJson,
    /// The value is the row (a JSON object): an insert.
    Raw,
    /// Confluent's Avro wire format: a Debezium envelope or a row.
    Avro,
}

/// A routed table and the topic it reads.
pub struct TopicTable {
    pub table: Vec<String>,
    pub topic: Arc<str>,
    decoder: TableDecoder,
    before_images: BeforeImages,
    /// What a change of the table's shape (an event's schema part with
    /// more or wider columns) does.
    schema_changes: SchemaChanges,
    /// The schema part the table's plan was last found to read as it is.
    checked: Option<Arc<ConnectFields>>,
}

impl TopicTable {
    /// The routed tables, each with its topic (`topic` of the declaration,
    /// else the table's name); an error when two tables read one topic.
    /// Each declaration is a strict contract when `strict`
    /// (`on_schema_mismatch = 'fail'`).
    pub fn group(
        tables: &[SourceTablePlan],
        encodings: &Encodings,
        strict: bool,
    ) -> Result<Vec<TopicTable>, SourceError> {
        let mut out: Vec<TopicTable> = Vec::new();
        for t in tables {
            let name = t.table.join(".");
            let topic = t
                .options
                .get("topic")
                .map(str::to_string)
                .unwrap_or_else(|| name.clone());
            if let Some(other) = out.iter().find(|o| *o.topic == *topic) {
                return Err(SourceError::new(format!(
                    "tables {} and {name} both read topic {topic}: a topic feeds one table (route the one table to several targets instead)",
                    other.table.join(".")
                )));
            }
            out.push(TopicTable {
                table: t.table.clone(),
                topic: Arc::from(topic),
                decoder: TableDecoder::with_encodings(
                    &t.schema,
                    Arc::clone(&t.scan_schema),
                    name,
                    encodings.column_logicals(&t.schema),
                )
                .with_strict_schema(strict),
                before_images: t.before_images.clone(),
                schema_changes: t.schema_changes,
                checked: None,
            });
        }
        Ok(out)
    }
}

/// One message, as the consumer copied it: its key and value are ranges of
/// its batch's [`RawBatch::bytes`].
pub struct RawMessage {
    /// Index of its table.
    pub table: usize,
    pub partition: i32,
    pub offset: i64,
    pub ts_micros: Option<i64>,
    pub key: Option<Range<usize>>,
    /// `None`: a tombstone.
    pub value: Option<Range<usize>>,
    /// The headers as a JSON object, when the message has any.
    pub headers: Option<String>,
}

/// Messages read in order, and the offsets after them. Their keys and
/// values are copied into one buffer: no allocation per message, and once
/// the stages are full none per batch either (see [`EmptyBuffers`]).
pub struct RawBatch {
    pub messages: Vec<RawMessage>,
    pub bytes: Vec<u8>,
    pub end: Offsets,
}

/// A decoded batch's buffers, emptied, on their way back to the consumer
/// for a later batch: their room is kept, where new buffers (megabytes per
/// batch) had their pages faulted in again every time.
pub struct EmptyBuffers {
    pub messages: Vec<RawMessage>,
    pub bytes: Vec<u8>,
}

impl RawBatch {
    /// Its buffers, emptied (the messages' headers are freed here).
    pub fn empty(mut self) -> EmptyBuffers {
        self.messages.clear();
        self.bytes.clear();
        EmptyBuffers {
            messages: self.messages,
            bytes: self.bytes,
        }
    }

    /// A message's key.
    pub fn key(&self, m: &RawMessage) -> Option<&[u8]> {
        m.key.clone().map(|r| &self.bytes[r])
    }

    /// A message's value (`None`: a tombstone).
    pub fn value(&self, m: &RawMessage) -> Option<&[u8]> {
        m.value.clone().map(|r| &self.bytes[r])
    }
}

/// Forwards the lanes' decoded batches in the order the consumer handed
/// them out (batch `i` from lane `i % lanes`), until a lane ends or fails,
/// or nobody listens. The lane whose turn it is ends once the consumer has
/// stopped and every batch before has been forwarded: then the consumer's
/// failure, if it failed (sent to `failed` before it closed the lanes), is
/// forwarded last.
pub fn merge_lanes(
    lanes: Vec<Receiver<Result<SourceBatch, SourceError>>>,
    failed: Receiver<SourceError>,
    out: mpsc::Sender<Result<SourceBatch, SourceError>>,
) {
    for lane in lanes.iter().cycle() {
        let Ok(decoded) = lane.recv() else {
            if let Ok(e) = failed.try_recv() {
                let _ = out.blocking_send(Err(e));
            }
            return;
        };
        let failed = decoded.is_err();
        if out.blocking_send(decoded).is_err() || failed {
            return;
        }
    }
}

/// The decoding stage's state.
pub struct MessageDecoder {
    /// The source's name (metrics).
    source: String,
    metrics: crate::metrics::Metrics,
    tables: Vec<TopicTable>,
    format: Format,
    /// Avro: the schemas, by id.
    registry: Option<Registry>,
    /// Avro: the message rendered as JSON.
    rendered: String,
    skip_bad: bool,
    ignore_truncate: bool,
    schemas: SchemaCache,
    pos_text: String,
    /// Undeclared fields already warned about (`topic.field`), shared by
    /// the lanes so each is warned about once.
    warned: Arc<std::sync::Mutex<HashSet<String>>>,
    /// A table's shape changed (its events' schema part): the batch stops
    /// there and the run plans the table again.
    change: Option<SchemaChange>,
}

impl MessageDecoder {
    /// A stage decoding into `tables`.
    pub fn new(
        source: String,
        metrics: crate::metrics::Metrics,
        tables: Vec<TopicTable>,
        format: Format,
        registry: Option<Registry>,
        skip_bad: bool,
        ignore_truncate: bool,
    ) -> Self {
        MessageDecoder {
            source,
            metrics,
            tables,
            format,
            registry,
            rendered: String::new(),
            skip_bad,
            ignore_truncate,
            schemas: SchemaCache::default(),
            pos_text: String::new(),
            warned: Arc::default(),
            change: None,
        }
    }

    /// Shares the set of undeclared fields warned about with other lanes
    /// (a field is warned about once, whichever lane meets it first).
    pub fn sharing_warnings(mut self, warned: Arc<std::sync::Mutex<HashSet<String>>>) -> Self {
        self.warned = warned;
        self
    }

    /// Decodes batches until the consumer ends (its sender is dropped), an
    /// error is sent, or nobody listens; each batch's buffers go back to
    /// the consumer through `emptied` when it has room for them.
    pub fn run(
        mut self,
        input: Receiver<RawBatch>,
        out: SyncSender<Result<SourceBatch, SourceError>>,
        emptied: SyncSender<EmptyBuffers>,
    ) {
        while let Ok(raw) = input.recv() {
            let decoded =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.decode_batch(&raw)))
                    .unwrap_or_else(|panic| {
                        Err(SourceError::new(format!(
                            "the Kafka decoder failed: {}",
                            crate::sources::panic_message(panic.as_ref())
                        )))
                    });
            let _ = emptied.try_send(raw.empty());
            let failed = decoded.is_err();
            if out.send(decoded).is_err() || failed {
                return;
            }
        }
    }

    /// One batch's change batch; with `skip`, messages that fail are left
    /// out (and logged once).
    fn decode_batch(&mut self, raw: &RawBatch) -> Result<SourceBatch, SourceError> {
        let mut bad: HashSet<usize> = HashSet::new();
        'again: loop {
            for (i, m) in raw.messages.iter().enumerate() {
                if bad.contains(&i) {
                    continue;
                }
                if let Err(e) = self.decode_message(raw, m) {
                    if let Some(change) = self.change.take() {
                        return Err(SourceError::schema_changed(change));
                    }
                    let t = &self.tables[m.table];
                    let message = format!(
                        "topic {} partition {} offset {}: table {}: {e}",
                        t.topic,
                        m.partition,
                        m.offset,
                        t.table.join(".")
                    );
                    if !self.skip_bad {
                        return Err(SourceError::new(message));
                    }
                    tracing::warn!(topic = %t.topic, partition = m.partition, offset = m.offset, "skipped a message that cannot be decoded (on_decode_error = 'skip'): {e}");
                    self.metrics.decode_skipped(&self.source);
                    bad.insert(i);
                    for t in &mut self.tables {
                        t.decoder.reset();
                    }
                    continue 'again;
                }
            }
            break;
        }
        let ingest = chrono::Utc::now().timestamp_micros();
        let mut tables = Vec::new();
        for t in &mut self.tables {
            if t.decoder.rows() > 0 {
                let batch = t.decoder.finish(ingest).map_err(|e| {
                    SourceError::new(format!(
                        "topic {}: table {}: {e}",
                        t.topic,
                        t.table.join(".")
                    ))
                })?;
                tables.push(TableChanges {
                    table: t.table.clone(),
                    batch,
                });
            }
        }
        Ok(SourceBatch {
            tables,
            end: Position::new(raw.end.clone()),
            snapshot: Vec::new(),
            open_transaction: false,
        })
    }

    /// Decodes one message into its table's builders.
    fn decode_message(&mut self, raw: &RawBatch, m: &RawMessage) -> Result<(), String> {
        let Some(value) = raw.value(m) else {
            // A tombstone (Debezium sends one after each delete, for log
            // compaction): no change.
            return Ok(());
        };
        let (text, envelope) = match self.format {
            Format::Avro => {
                let registry = self.registry.as_mut().expect("avro has a registry");
                let (schema, body) = registry.frame(value)?;
                self.rendered.clear();
                schema
                    .render(body, &mut self.rendered)
                    .map_err(|e| format!("Avro body: {e}"))?;
                (self.rendered.as_str(), schema.envelope)
            }
            Format::Raw => (utf8(value)?, false),
            Format::DebeziumJson => (utf8(value)?, true),
        };
        let t = &mut self.tables[m.table];
        let message = MessageMeta {
            ts_micros: m.ts_micros,
            key: raw.key(m),
            headers: m.headers.as_deref(),
        };
        let mut meta = RowMeta {
            kind: RowKind::Insert,
            commit_ts: m.ts_micros,
            snapshot: false,
            line: m.offset as u64,
            stream: &t.topic,
            shard: m.partition,
            sequence: m.offset,
            message,
            connect: None,
        };
        match envelope {
            false => {
                t.decoder
                    .append_row(text, &meta)
                    .map_err(|e| e.to_string())?;
            }
            true => {
                let event = parse_event(text)?;
                let env = &event.envelope;
                let Some(op) = env.op.as_deref() else {
                    return Err("change event without `op`".to_string());
                };
                let (images, snapshot) = match row_images(
                    op,
                    env.before,
                    env.after,
                    &t.before_images,
                )? {
                    EventRows::Rows { images, snapshot } => (images, snapshot),
                    EventRows::Truncate if self.ignore_truncate => {
                        tracing::warn!(topic = %t.topic, partition = m.partition, offset = m.offset, "TRUNCATE ignored (on_truncate = 'ignore'): the sink keeps the rows");
                        self.metrics.truncate_ignored(&self.source);
                        return Ok(());
                    }
                    EventRows::Truncate => {
                        return Err("a TRUNCATE of the table (op t; on_truncate = 'fail'): set on_truncate = 'ignore' to go on without it".to_string());
                    }
                };
                let connect = match event.schema {
                    Some(s) => Some(self.schemas.get(s)?),
                    None => None,
                };
                if let Some(c) = &connect
                    && !t.checked.as_ref().is_some_and(|k| Arc::ptr_eq(k, c))
                {
                    if let Some(change) = c.shape_change(
                        &self.source,
                        &t.table,
                        t.decoder.schema(),
                        t.schema_changes,
                    )? {
                        self.change = Some(change);
                        return Err("the table changed at the source".to_string());
                    }
                    t.checked = Some(Arc::clone(c));
                }
                meta.connect = connect.as_ref();
                meta.snapshot = snapshot;
                meta.commit_ts = if snapshot {
                    None
                } else {
                    env.commit_ts_micros()
                };
                for (kind, image) in images.into_iter().flatten() {
                    meta.kind = kind;
                    t.decoder
                        .append_row(image, &meta)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        if !t.decoder.undeclared.is_empty() {
            for field in std::mem::take(&mut t.decoder.undeclared) {
                let first = self
                    .warned
                    .lock()
                    .map_or(true, |mut w| w.insert(format!("{}.{field}", t.topic)));
                if first {
                    tracing::warn!(topic = %t.topic, partition = m.partition, offset = m.offset, field = %field, "the message has a field the table declaration lacks; it is not read (on_schema_mismatch = 'fail' stops instead)");
                }
            }
            self.metrics
                .mismatched_rows(&self.source, t.decoder.take_mismatched_rows());
        }
        if t.decoder.open_rows() > 0 {
            // A message is a transaction of its own: its rows' position is
            // its partition's next offset (`topic:pN=offset`, written
            // without the formatting machinery: it runs for every message).
            let mut digits = itoa::Buffer::new();
            self.pos_text.clear();
            self.pos_text.push_str(&t.topic);
            self.pos_text.push_str(":p");
            self.pos_text.push_str(digits.format(m.partition));
            self.pos_text.push('=');
            self.pos_text.push_str(digits.format(m.offset + 1));
            t.decoder.close_transaction(&self.pos_text);
        }
        Ok(())
    }
}

/// A message value as text. simdutf8's check, not the standard library's:
/// it runs on every message, where the standard one cost a fortieth of a
/// decoding lane.
fn utf8(value: &[u8]) -> Result<&str, String> {
    simdutf8::basic::from_utf8(value).map_err(|_| "the message value is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::utf8;

    #[test]
    fn a_value_that_is_not_utf8_is_refused_and_one_that_is_is_read() {
        assert_eq!(utf8("{\"a\":\"é\"}".as_bytes()), Ok("{\"a\":\"é\"}"));
        assert_eq!(
            utf8(b"{\"a\":\"\xff\"}"),
            Err("the message value is not UTF-8".to_string())
        );
        // Cut inside a two-byte character.
        assert!(utf8(&"é".as_bytes()[..1]).is_err());
    }
}
