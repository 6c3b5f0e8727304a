//! The Kafka source: topics read by manual partition assignment (no
//! consumer group), each message decoded as a Debezium change event
//! (`debezium-json`) or as a row (`raw`).
//!
//! Nothing is committed to Kafka: the position is the offset of the next
//! message of every partition (`topic:p0=10,p1=20;topic2:p0=5`), stored in
//! the sinks with the data. At start each partition resumes at the offset
//! every route has committed (the per-partition minimum); a partition no
//! route knows starts at the earliest offset the broker keeps, and so does
//! a partition added while running (found by a metadata refresh). An
//! offset the broker no longer holds (retention deleted it) stops the run
//! with the topic, partition and offset: a silent reset would skip
//! changes. Order within a partition is kept; a batch may span partitions.
//!
//! Each change carries its transport coordinate and message fields:
//! `_stream` (topic), `_shard` (partition), `_sequence` (offset),
//! `_msg_ts`, `_msg_key`, `_headers` (a JSON object).
//!
//! Client: `rdkafka` with its bundled librdkafka; the consumer runs on a
//! thread of its own and hands batches of messages to a decoding thread.
//! Connections may be authenticated (SASL) and encrypted (TLS):
//! [`security`]; a broker refusing them ends the run: [`refusal`].

mod avro;
mod consumer;
mod decode;
mod fetch_queue;
pub mod offsets;
mod refusal;
mod security;

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;
use urutau_planner::context::Transport;
use urutau_planner::diagnostic::{Diagnostic, Diagnostics};
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SourceKindDef, SourceProvider};
use urutau_planner::spec::SourceSpec;

use super::debezium::{DecimalHandling, Encodings};
use super::{ChangeSource, OpenArgs, SourceBatch, SourceError, SourceKind};
use crate::position::{Position, PositionKind};
use consumer::{ConsumerConfig, run_consumer};
use decode::{Format, MessageDecoder, TopicTable};

/// Plans the `kafka` kind.
pub struct KafkaSourceProvider {
    def: SourceKindDef,
}

impl KafkaSourceProvider {
    /// The `kafka` kind's definition.
    pub fn new() -> Self {
        use OptionType as T;
        KafkaSourceProvider {
            def: SourceKindDef {
                name: "kafka",
                exec_name: "KafkaSourceExec",
                doc: "Kafka topics, by manual partition assignment (offsets live in the sinks)",
                options: vec![
                    OptionDef::retry_timeout(),
                    OptionDef::new(
                        "brokers",
                        T::String,
                        "bootstrap brokers: host:port[,host:port...]",
                    )
                    .required(),
                    OptionDef::new(
                        "format",
                        T::Enum(&["debezium-json", "raw", "avro"]),
                        "the message format: debezium-json = Debezium change events (with or without the schema part), raw = each message value is a row as a JSON object (an insert), avro = Confluent's Avro wire format with schemas from `schema_registry` (Debezium envelopes or plain rows)",
                    )
                    .default("debezium-json"),
                    OptionDef::new(
                        "schema_registry",
                        T::String,
                        "the Confluent-compatible schema registry of format = 'avro' (http://host:8081); credentials in the URL are never printed",
                    )
                    .secret(),
                    OptionDef::new(
                        "on_decode_error",
                        T::Enum(&["fail", "skip"]),
                        "a message that cannot be decoded: fail = stop the run naming topic, partition and offset; skip = log it and go on",
                    )
                    .default("fail"),
                    OptionDef::new(
                        "on_schema_mismatch",
                        T::Enum(&["ignore", "fail"]),
                        "when a message does not fit its table's declared columns: ignore = a field the declaration lacks is left out (the row is counted in /metrics) and a declared column the message lacks is NULL; fail = either stops the run naming topic, partition, offset and field",
                    )
                    .default("ignore"),
                    OptionDef::new(
                        "on_truncate",
                        T::Enum(&["fail", "ignore"]),
                        "a Debezium truncate event (op t): fail = stop the run; ignore = log it, the sink keeps its rows",
                    )
                    .default("fail"),
                    OptionDef::new(
                        "decimal_handling",
                        T::Enum(&["precise", "string", "double"]),
                        "how events without a schema part encode DECIMAL columns (Debezium's decimal.handling.mode); an event's schema part always decides",
                    )
                    .default("precise"),
                    OptionDef::new(
                        "time_precision",
                        T::Enum(&["adaptive", "adaptive_time_microseconds", "connect"]),
                        "the unit of integer TIME and TIMESTAMP values in events without a schema part (Debezium's time.precision.mode): adaptive = microseconds, connect = milliseconds",
                    )
                    .default("adaptive"),
                    OptionDef::new(
                        "metadata_refresh",
                        T::Duration,
                        "how often the topics' partitions are looked up again (new partitions are read from their earliest offset)",
                    )
                    .default("10s"),
                ]
                .into_iter()
                .chain(security::options())
                .collect(),
                declares_tables: true,
                table_options: vec![OptionDef::new(
                    "topic",
                    T::String,
                    "the topic holding the table's changes (default: the table's name)",
                )],
                transport: Transport::Full,
                rules: vec![format_options, security::security_options],
            },
        }
    }
}

impl Default for KafkaSourceProvider {
    fn default() -> Self {
        Self::new()
    }
}

/// `schema_registry` goes with Avro, and only there; Avro messages carry
/// their types, so the JSON encoding settings do not apply to them.
fn format_options(source: &SourceSpec, d: &mut Diagnostics) {
    let avro = source.options.get("format") == Some("avro");
    let at = |name: &str| {
        source
            .options
            .entry(name)
            .map_or(source.name.span, |e| e.name_span)
    };
    if avro && source.options.get("schema_registry").is_none() {
        d.push(
            Diagnostic::error(
                at("format"),
                format!(
                    "source `{}`: format = 'avro' needs schema_registry",
                    source.name
                ),
            )
            .with_help("add schema_registry = 'http://host:8081'"),
        );
    }
    if !avro && source.options.get("schema_registry").is_some() {
        d.push(Diagnostic::error(
            at("schema_registry"),
            format!(
                "source `{}`: schema_registry is for format = 'avro'; this source's messages are JSON",
                source.name
            ),
        ));
    }
    for name in ["decimal_handling", "time_precision"] {
        // Written in the file (a default stands at the source's name;
        // spans take no part in equality, so their places are compared).
        let here = |s: urutau_planner::diagnostic::Span| (s.line, s.col);
        let written = source
            .options
            .entry(name)
            .is_some_and(|e| here(e.name_span) != here(source.name.span));
        if avro && written {
            d.push(
                Diagnostic::error(
                    at(name),
                    format!(
                        "source `{}`: {name} is for JSON messages; Avro schemas carry their types",
                        source.name
                    ),
                )
                .with_help(format!("remove {name}")),
            );
        }
    }
}

#[async_trait]
impl SourceProvider for KafkaSourceProvider {
    fn def(&self) -> &SourceKindDef {
        &self.def
    }

    fn describe(&self, source: &SourceSpec) -> String {
        let security = security::Security::parse(&source.options)
            .map_or_else(|_| "security=?".to_string(), |s| s.describe());
        format!(
            "brokers={}, format={}, {security}",
            source.options.get("brokers").unwrap_or("?"),
            source.options.get("format").unwrap_or("debezium-json")
        )
    }
}

/// The `kafka` kind: offset positions.
pub struct KafkaKind {
    provider: Arc<KafkaSourceProvider>,
}

impl KafkaKind {
    /// The kind.
    pub fn new() -> Self {
        KafkaKind {
            provider: Arc::new(KafkaSourceProvider::new()),
        }
    }
}

impl Default for KafkaKind {
    fn default() -> Self {
        Self::new()
    }
}

impl SourceKind for KafkaKind {
    fn provider(&self) -> Arc<dyn SourceProvider> {
        Arc::clone(&self.provider) as Arc<dyn SourceProvider>
    }

    fn position_kind(&self) -> &'static dyn PositionKind {
        &offsets::OFFSETS
    }

    fn open(&self, args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError> {
        open(args)
    }
}

/// Decoding lanes at most (one per core up to this).
const MAX_LANES: usize = 4;

/// The Kafka source, running: a consumer thread, decoding lanes (a thread
/// each) and the thread that puts their batches back in order, feeding a
/// channel.
struct KafkaSource {
    rx: mpsc::Receiver<Result<SourceBatch, SourceError>>,
}

fn open(args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError> {
    let spec = &args.plan.spec;
    let options = &spec.options;
    let start = match &args.start {
        None => None,
        Some(p) => Some(
            p.downcast_ref::<offsets::Offsets>()
                .cloned()
                .ok_or_else(|| {
                    SourceError::new(format!("{p} is not a Kafka position (topic:p0=N,...)"))
                })?,
        ),
    };
    let format = match options.get("format") {
        Some("raw") => Format::Raw,
        Some("avro") => Format::Avro,
        _ => Format::DebeziumJson,
    };
    let encodings = if format == Format::Avro {
        // Avro values are rendered in the units the decoder reads as they
        // are (decimal text, microseconds).
        Encodings::from_options(None, None, DecimalHandling::String)
    } else {
        Encodings::from_options(
            options.get("decimal_handling"),
            options.get("time_precision"),
            DecimalHandling::Precise,
        )
    };
    let security = security::Security::parse(options).map_err(|problems| {
        SourceError::new(
            problems
                .into_iter()
                .map(|p| p.message)
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    // One registry client, cloned per lane: a schema is fetched once.
    let registry = match options.get("schema_registry") {
        Some(url) if format == Format::Avro => Some(
            avro::Registry::new(url, security.ca(), tokio::runtime::Handle::current())
                .map_err(SourceError::new)?,
        ),
        _ => None,
    };
    let group = || {
        TopicTable::group(
            &args.plan.tables,
            &encodings,
            options.get("on_schema_mismatch") == Some("fail"),
        )
    };
    let topics: Vec<String> = group()?.iter().map(|t| t.topic.to_string()).collect();
    let refresh = options
        .get("metadata_refresh")
        .map(urutau_planner::options::parse_duration)
        .transpose()
        .map_err(SourceError::new)?
        .unwrap_or(std::time::Duration::from_secs(10));
    let cfg = ConsumerConfig {
        source: spec.name.name.clone(),
        brokers: options.get("brokers").unwrap_or_default().to_string(),
        security: security.clone(),
        topics,
        start,
        exit_when_caught_up: args.exit_when_caught_up,
        policy: args.policy,
        metadata_refresh: refresh,
        headers: args.plan.tables.iter().any(|t| t.reads_headers),
    };
    // Decoding lanes: batches are decoded on as many threads as there are
    // cores (up to MAX_LANES), each lane a decoder of its own, and put
    // back in order. One batch in flight per lane and between stages:
    // consuming, decoding and committing overlap.
    let lanes = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_LANES);
    let (tx, rx) = mpsc::channel(2);
    let (failed_tx, failed_rx) = std::sync::mpsc::channel();
    let (mut lane_inputs, mut lane_outputs) = (Vec::new(), Vec::new());
    let warned = Arc::default();
    // Decoded batches' buffers, back to the consumer: as many as can be in
    // flight, so none is allocated again once the stages are full.
    let (emptied_tx, emptied_rx) = std::sync::mpsc::sync_channel(2 * lanes + 1);
    for lane in 0..lanes {
        let decoder = MessageDecoder::new(
            spec.name.name.clone(),
            args.metrics.clone(),
            group()?,
            format,
            registry.clone(),
            options.get("on_decode_error") == Some("skip"),
            options.get("on_truncate") == Some("ignore"),
        )
        .sharing_warnings(Arc::clone(&warned));
        let (raw_tx, raw_rx) = std::sync::mpsc::sync_channel(1);
        let (decoded_tx, decoded_rx) = std::sync::mpsc::sync_channel(1);
        lane_inputs.push(raw_tx);
        lane_outputs.push(decoded_rx);
        std::thread::Builder::new()
            .name(format!("kafka-decoder-{}-{lane}", spec.name))
            .spawn({
                let emptied = emptied_tx.clone();
                move || decoder.run(raw_rx, decoded_tx, emptied)
            })
            .map_err(|e| SourceError::new(format!("cannot start a Kafka decoder: {e}")))?;
    }
    std::thread::Builder::new()
        .name(format!("kafka-merge-{}", spec.name))
        .spawn(move || decode::merge_lanes(lane_outputs, failed_rx, tx))
        .map_err(|e| SourceError::new(format!("cannot start the Kafka decoder: {e}")))?;
    let stop = Arc::clone(&args.stop);
    std::thread::Builder::new()
        .name(format!("kafka-consumer-{}", spec.name))
        .spawn(move || run_consumer(cfg, lane_inputs, emptied_rx, failed_tx, stop))
        .map_err(|e| SourceError::new(format!("cannot start the Kafka consumer: {e}")))?;
    Ok(Box::new(KafkaSource { rx }))
}

#[async_trait]
impl ChangeSource for KafkaSource {
    async fn next_batch(&mut self) -> Result<Option<SourceBatch>, SourceError> {
        match self.rx.recv().await {
            Some(Ok(b)) => Ok(Some(b)),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    async fn acknowledge(&mut self, _position: &Position) -> Result<(), SourceError> {
        // Offsets live in the sinks; the broker's retention is its own.
        Ok(())
    }
}
