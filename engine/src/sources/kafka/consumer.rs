//! The Kafka source's consuming stage: assigns every partition of the
//! routed topics at its resume offset, takes their messages from the
//! source's fetch queue ([`FetchQueue`]) many at a time, copies them into
//! batches (closed by the pipeline's batching rule) and hands them to the
//! decoding lanes in turn (batch `i` to lane `i % lanes`, read back in that
//! order).
//!
//! Offsets are explicit throughout: `auto.offset.reset = error`, so an
//! offset the broker no longer holds is reported, never skipped past; a
//! partition no route knows is assigned at its beginning. A batch's end is
//! the next offset of every partition read so far (a partition never read
//! is left out: it resumes from its beginning).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::decode::{EmptyBuffers, RawBatch, RawMessage};
use super::fetch_queue::{FetchQueue, Fetched};
use super::offsets::Offsets;
use super::refusal::Refusals;
use super::security::Security;
use crate::batching::BatchPolicy;
use crate::sources::SourceError;

/// How long a metadata or watermark request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// While connecting, how often the client's errors are looked at (a
/// refusal ends the wait).
const CONNECT_SLICE: Duration = Duration::from_millis(500);
/// ... and for how long its events are served each time.
const CONNECT_EVENTS: Duration = Duration::from_millis(100);
/// How long one take waits for a message when none is queued (the
/// client's events wait as long at most).
const POLL: Duration = Duration::from_millis(100);
/// Transient client errors are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What the consuming stage needs.
pub struct ConsumerConfig {
    pub source: String,
    pub brokers: String,
    pub security: Security,
    /// The routed topics; a message's table is its topic's index here.
    pub topics: Vec<String>,
    pub start: Option<Offsets>,
    pub exit_when_caught_up: bool,
    pub policy: BatchPolicy,
    pub metadata_refresh: Duration,
    /// Whether a route reads the messages' headers: librdkafka parses a
    /// message's headers (and allocates their list) when asked, even when
    /// there are none.
    pub headers: bool,
}

/// One assigned partition.
struct Partition {
    /// The next offset to read; `None`: nothing read, none committed (it
    /// is read from its beginning).
    next: Option<i64>,
    /// The beginning, as of the last look (for a partition never read).
    low: i64,
    /// For `exit_when_caught_up`: the high watermark at start (`None` for
    /// a partition found later, which is not waited for).
    stop_at: Option<i64>,
}

impl Partition {
    fn caught_up(&self) -> bool {
        match self.stop_at {
            Some(stop) => self.next.unwrap_or(self.low) >= stop,
            None => true,
        }
    }
}

/// Runs the consuming stage until it is caught up (exit mode), `stop` is
/// set, or the decoding stage is gone; a failure goes to `failed` before
/// the lanes are closed, so it is handed on after every batch read before
/// it ([`merge_lanes`](super::decode::merge_lanes)).
pub fn run_consumer(
    cfg: ConsumerConfig,
    lanes: Vec<SyncSender<RawBatch>>,
    emptied: Receiver<EmptyBuffers>,
    failed: std::sync::mpsc::Sender<SourceError>,
    stop: Arc<AtomicBool>,
) {
    let mut consuming = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        consuming
            .insert(Consuming::start(cfg, emptied)?)
            .run(&lanes, &stop)
    }))
    .unwrap_or_else(|panic| {
        Err(SourceError::new(format!(
            "the Kafka consumer failed: {}",
            crate::sources::panic_message(panic.as_ref())
        )))
    });
    if let Err(e) = result {
        let _ = failed.send(e);
    }
    drop(lanes);
    // The client goes last: librdkafka's destroy waits for its threads to
    // end (about 65 ms after the bench's caught-up run, every thread of
    // the process idle), which the decoders, the sinks and a caught-up
    // run's end need not wait for.
    drop(consuming);
}

/// The consuming stage's state.
struct Consuming {
    cfg: ConsumerConfig,
    /// Every assigned partition's messages. Declared before `consumer`:
    /// dropped first, as librdkafka wants its queues gone before the client.
    fetched: FetchQueue,
    consumer: BaseConsumer<Refusals>,
    /// Each routed topic's index (looked up for every message).
    topic_index: foldhash::HashMap<Box<[u8]>, usize>,
    /// By (topic index, partition).
    parts: BTreeMap<(usize, i32), Partition>,
    batch: Vec<RawMessage>,
    /// The batch's keys and values ([`RawBatch::bytes`]).
    bytes: Vec<u8>,
    /// Buffers of decoded batches, for the next batches.
    emptied: Receiver<EmptyBuffers>,
    /// Batches handed over so far (the next goes to lane `handed % lanes`).
    handed: usize,
    opened: Option<Instant>,
    last_refresh: Instant,
    last_warning: Option<Instant>,
}

impl Consuming {
    /// Connects, looks up every topic's partitions, checks the resume
    /// offsets against what the broker holds, and assigns.
    fn start(
        cfg: ConsumerConfig,
        emptied: Receiver<EmptyBuffers>,
    ) -> Result<Consuming, SourceError> {
        let refusals = Refusals::new(&cfg.brokers, cfg.security.clone());
        let mut client = ClientConfig::new();
        cfg.security.configure(&mut client);
        let consumer: BaseConsumer<Refusals> = client
            .set("bootstrap.servers", &cfg.brokers)
            // No group is joined and nothing is committed to Kafka; the id
            // only names the client in the broker's logs.
            .set("group.id", format!("urutau-{}", cfg.source))
            .set("client.id", format!("urutau-{}", cfg.source))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            .set("allow.auto.create.topics", "false")
            // librdkafka pauses a partition's fetching for this long once
            // its local queue is full (1 s by default): the source, which
            // drains the queue in batches, stalled for most of a second
            // each time (a third of the run's time in the bench).
            .set("fetch.queue.backoff.ms", "10")
            // A fetch brings up to 4 MiB of a partition (1 MiB by
            // default): a quarter of the requests for a backlog, which
            // halved the broker's CPU for the bench's 1M messages. The
            // queued bytes are bounded as before
            // (`queued.max.messages.kbytes`), and the whole response by
            // `fetch.max.bytes` (50 MiB).
            .set("max.partition.fetch.bytes", "4194304")
            // Fetched ahead: up to 20,000 messages a partition (100,000 by
            // default, about 100 MB for three partitions of 270-byte
            // messages with their per-message records): tens of
            // milliseconds of reading, several fetches' worth.
            .set("queued.min.messages", "20000")
            // librdkafka connects to a broker it learnt from the metadata
            // (the partitions' leaders) no sooner than half this after its
            // last connection (100 ms by default): 50 ms of every start
            // was spent waiting. 20 ms, as the first of the doubling
            // backoffs, also retries a lost broker sooner (Java's client
            // waits 50 ms); `reconnect.backoff.max.ms` (10 s) still bounds
            // the retries of a broker that stays away.
            .set("reconnect.backoff.ms", "20")
            .create_with_context(refusals)
            .map_err(|e| {
                SourceError::new(format!(
                    "cannot create a Kafka consumer for {}: {}",
                    cfg.brokers,
                    // The client's words may quote its settings.
                    Refusals::new("", cfg.security.clone()).scrub(&e.to_string())
                ))
            })?;
        let topic_index = cfg
            .topics
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_bytes().into(), i))
            .collect();
        let mut c = Consuming {
            fetched: FetchQueue::new(&consumer),
            consumer,
            topic_index,
            parts: BTreeMap::new(),
            batch: Vec::new(),
            bytes: Vec::new(),
            emptied,
            handed: 0,
            opened: None,
            last_refresh: Instant::now(),
            last_warning: None,
            cfg,
        };
        c.connect()?;
        let start = c.cfg.start.clone().unwrap_or_default();
        for (i, topic) in c.cfg.topics.clone().iter().enumerate() {
            let ids = c.partition_ids(topic)?;
            let committed = start.0.get(topic.as_str());
            if let Some(committed) = committed
                && let Some(gone) = committed.keys().find(|p| !ids.contains(p))
            {
                return Err(SourceError::new(format!(
                    "topic {topic}: the sinks hold an offset of partition {gone}, which the topic no longer has (was it deleted and re-created?)"
                )));
            }
            for id in ids {
                let (low, high) = c.watermarks(topic, id)?;
                let next = committed.and_then(|m| m.get(&id)).copied();
                if let Some(n) = next {
                    check_offset(topic, id, n, low, high)?;
                }
                c.parts.insert(
                    (i, id),
                    Partition {
                        next,
                        low,
                        stop_at: Some(high),
                    },
                );
            }
        }
        let all: Vec<(usize, i32)> = c.parts.keys().copied().collect();
        c.forward(&all)?;
        c.assign()?;
        tracing::info!(
            source = %c.cfg.source,
            partitions = c.parts.len(),
            position = %c.end(),
            "Kafka partitions assigned"
        );
        Ok(c)
    }

    /// Waits up to [`REQUEST_TIMEOUT`] for a broker to answer, serving the
    /// client's events meanwhile: librdkafka tells a refusal (failed
    /// authentication, a refused certificate) only to a client that polls,
    /// and would otherwise retry it until the timeout, and the supervisor
    /// the run after it. Nothing is assigned yet, so polling reads no
    /// message.
    fn connect(&self) -> Result<(), SourceError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let topic = self.cfg.topics.first().map(String::as_str);
        loop {
            let slice = CONNECT_SLICE.min(deadline.saturating_duration_since(Instant::now()));
            let result = self.consumer.fetch_metadata(topic, slice);
            if result.is_err() {
                // A refusal may be why. (When a broker answers, nothing
                // refused the client: serving its events for a while then
                // only delayed every start by that while.)
                self.serve_events(CONNECT_EVENTS);
            }
            if let Some(refused) = self.consumer.context().refused() {
                return Err(refused);
            }
            match result {
                Ok(_) => return Ok(()),
                Err(e) if brokers_away(e.rdkafka_error_code()) && Instant::now() < deadline => {}
                Err(e) => {
                    let last = self
                        .consumer
                        .context()
                        .last_error()
                        .map_or_else(String::new, |l| format!(" (last client error: {l})"));
                    return Err(client_error(
                        format!(
                            "cannot reach the Kafka brokers {}: {e}{last}",
                            self.cfg.brokers
                        ),
                        e.rdkafka_error_code(),
                    ));
                }
            }
        }
    }

    /// Hands the client's queued events (errors, log lines) to its
    /// context for `window`, or until a refusal is seen. A poll that
    /// serves a log line returns nothing when its timeout is zero, so the
    /// queue is served for a while rather than until the first empty poll.
    fn serve_events(&self, window: Duration) {
        let end = Instant::now() + window;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() || self.consumer.context().refused().is_some() {
                return;
            }
            // Nothing is assigned: no message can come.
            let _ = self.consumer.poll(left);
        }
    }

    fn partition_ids(&self, topic: &str) -> Result<Vec<i32>, SourceError> {
        let md = self
            .consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
            .map_err(|e| {
                client_error(
                    format!(
                        "cannot read the metadata of topic {topic} from {}: {e}",
                        self.cfg.brokers
                    ),
                    e.rdkafka_error_code(),
                )
            })?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Err(SourceError::new(format!(
                "topic {topic} does not exist on {}",
                self.cfg.brokers
            )));
        };
        if let Some(err) = t.error() {
            let code = RDKafkaErrorCode::from(err);
            let message = match code {
                RDKafkaErrorCode::UnknownTopicOrPartition => format!(
                    "topic {topic} does not exist on {} (create it, or set the table's topic)",
                    self.cfg.brokers
                ),
                other => format!("topic {topic}: {other}"),
            };
            return Err(client_error(message, Some(code)));
        }
        let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ids.sort_unstable();
        Ok(ids)
    }

    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), SourceError> {
        self.consumer
            .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
            .map_err(|e| {
                client_error(
                    format!("cannot read the offsets of topic {topic} partition {partition}: {e}"),
                    e.rdkafka_error_code(),
                )
            })
    }

    /// Sends the messages of `parts` to the fetch queue; before they are
    /// assigned (see [`FetchQueue`]).
    fn forward(&self, parts: &[(usize, i32)]) -> Result<(), SourceError> {
        for &(t, p) in parts {
            self.fetched
                .forward(&self.consumer, &self.cfg.topics[t], p)
                .map_err(SourceError::new)?;
        }
        Ok(())
    }

    /// Assigns every partition at its next offset (or its beginning); at
    /// start only (a re-assignment would stop the partitions' forwards).
    fn assign(&self) -> Result<(), SourceError> {
        let mut tpl = TopicPartitionList::new();
        for ((t, p), part) in &self.parts {
            let offset = match part.next {
                Some(n) => Offset::Offset(n),
                None => Offset::Beginning,
            };
            tpl.add_partition_offset(&self.cfg.topics[*t], *p, offset)
                .map_err(|e| SourceError::new(format!("cannot assign partitions: {e}")))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| SourceError::new(format!("cannot assign partitions: {e}")))
    }

    /// The next offset of every partition read so far.
    fn end(&self) -> Offsets {
        let mut o: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for ((t, p), part) in &self.parts {
            if let Some(n) = part.next {
                o.entry(self.cfg.topics[*t].clone())
                    .or_default()
                    .insert(*p, n);
            }
        }
        Offsets(o)
    }

    fn run(&mut self, out: &[SyncSender<RawBatch>], stop: &AtomicBool) -> Result<(), SourceError> {
        loop {
            if stop.load(Ordering::Relaxed) {
                // What is not handed over is not committed: read again on
                // restart.
                return Ok(());
            }
            if self.cfg.exit_when_caught_up && self.parts.values().all(Partition::caught_up) {
                self.flush(out);
                return Ok(());
            }
            if !self.cfg.exit_when_caught_up
                && self.last_refresh.elapsed() >= self.cfg.metadata_refresh
            {
                self.refresh()?;
            }
            // The client's own events (errors, refusals). No message comes
            // here: every partition is forwarded before it is assigned.
            match self.consumer.poll(Duration::ZERO) {
                None => {}
                Some(Err(e)) => self.consume_error(e)?,
                Some(Ok(m)) => {
                    return Err(SourceError::new(format!(
                        "topic {} partition {}: offset {} came outside the source's fetch queue; stopping rather than risk reading out of order",
                        m.topic(),
                        m.partition(),
                        m.offset()
                    )));
                }
            }
            // Up to the batch's limit; a wait only when nothing is queued,
            // and not past the open batch's `max_batch_interval`.
            let room = self.cfg.policy.max_rows.saturating_sub(self.batch.len());
            let wait = self
                .cfg
                .policy
                .wait_limit(self.batch.len(), self.opened, POLL);
            if self.take(room, Duration::ZERO)? == 0 && self.take(room, wait)? == 0 {
                self.idle()?;
            }
            if self.cfg.policy.should_close(self.batch.len(), self.opened) && !self.flush(out) {
                return Ok(());
            }
        }
    }

    /// Takes up to `at_most` messages from the fetch queue into the batch
    /// (waiting up to `wait` for the first); then answers the partition
    /// errors among them. Returns how many were taken.
    fn take(&mut self, at_most: usize, wait: Duration) -> Result<usize, SourceError> {
        let mut errors = Vec::new();
        // The table of the last message's topic handle: a take's messages
        // are mostly of one topic, whose name is then neither measured nor
        // hashed again. Only within this take, whose messages keep their
        // handles alive.
        let mut last_topic: Option<(usize, Option<usize>)> = None;
        let taken = self.fetched.take(at_most, wait, |m| {
            if let Some(code) = m.error() {
                // Answered after the messages taken with it are in the
                // batch: a transient error drops none of them.
                errors.push(KafkaError::MessageConsumption(code));
                return;
            }
            let handle = m.topic_handle();
            let table = match last_topic {
                Some((h, table)) if h == handle => table,
                _ => {
                    let table = self.topic_index.get(m.topic()).copied();
                    last_topic = Some((handle, table));
                    table
                }
            };
            let Some(table) = table else {
                return;
            };
            let (partition, offset) = (m.partition(), m.offset());
            let Some(part) = self.parts.get_mut(&(table, partition)) else {
                return;
            };
            if part.next.is_some_and(|n| offset < n) {
                // Already read (a partition is assigned once, so only a
                // client's retried fetch could give it again).
                return;
            }
            part.next = Some(offset + 1);
            self.batch.push(RawMessage {
                table,
                partition,
                offset,
                ts_micros: m.timestamp_millis().map(|ms| ms * 1000),
                key: m.key().map(|k| copy_into(&mut self.bytes, k)),
                value: m.payload().map(|v| copy_into(&mut self.bytes, v)),
                headers: if self.cfg.headers {
                    headers_json(&m)
                } else {
                    None
                },
            });
        });
        if !self.batch.is_empty() {
            // Errors alone (or messages already read) open no batch.
            self.opened.get_or_insert_with(Instant::now);
        }
        for e in errors {
            self.consume_error(e)?;
        }
        Ok(taken)
    }

    /// Hands the batch over to the next lane; false when the decoding
    /// stage is gone.
    fn flush(&mut self, lanes: &[SyncSender<RawBatch>]) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        // The next batch likely needs as much room as this one (growing
        // its buffers again was a tenth of this thread's time): the buffers
        // of a batch already decoded, else new ones as large as these.
        let next = self.emptied.try_recv().unwrap_or_else(|_| EmptyBuffers {
            messages: Vec::with_capacity(self.batch.len()),
            bytes: Vec::with_capacity(self.bytes.len()),
        });
        let batch = RawBatch {
            messages: std::mem::replace(&mut self.batch, next.messages),
            bytes: std::mem::replace(&mut self.bytes, next.bytes),
            end: self.end(),
        };
        self.opened = None;
        let lane = &lanes[self.handed % lanes.len()];
        self.handed += 1;
        lane.send(batch).is_ok()
    }

    /// Nothing to read right now: for exit mode, a partition whose fetch
    /// position passed its last records (transaction markers are not
    /// delivered) counts as read up to there.
    fn idle(&mut self) -> Result<(), SourceError> {
        if !self.cfg.exit_when_caught_up {
            return Ok(());
        }
        let Ok(positions) = self.consumer.position() else {
            return Ok(());
        };
        for e in positions.elements() {
            let (Some(&t), Offset::Offset(o)) =
                (self.topic_index.get(e.topic().as_bytes()), e.offset())
            else {
                continue;
            };
            if let Some(part) = self.parts.get_mut(&(t, e.partition()))
                && part.next.is_none_or(|n| o > n)
                && part.stop_at.is_some_and(|s| o <= s)
            {
                part.next = Some(o);
            }
        }
        Ok(())
    }

    /// Finds partitions added to the topics since the last look; they are
    /// read from their beginning.
    fn refresh(&mut self) -> Result<(), SourceError> {
        self.last_refresh = Instant::now();
        let mut added = Vec::new();
        for (i, topic) in self.cfg.topics.clone().iter().enumerate() {
            let ids = match self.partition_ids(topic) {
                Ok(ids) => ids,
                Err(e) => {
                    self.warn(&format!("partition lookup failed, retrying later: {e}"));
                    continue;
                }
            };
            for id in ids {
                if !self.parts.contains_key(&(i, id)) {
                    added.push((i, id));
                }
            }
        }
        if added.is_empty() {
            return Ok(());
        }
        for (i, id) in &added {
            tracing::info!(source = %self.cfg.source, topic = %self.cfg.topics[*i], partition = id, "new partition: read from its beginning");
            self.parts.insert(
                (*i, *id),
                Partition {
                    next: None,
                    low: 0,
                    stop_at: None,
                },
            );
        }
        // Only the new partitions are assigned: a re-assignment would stop
        // the others, and clear their forwards to the fetch queue.
        self.forward(&added)?;
        let mut tpl = TopicPartitionList::new();
        for (t, p) in &added {
            tpl.add_partition_offset(&self.cfg.topics[*t], *p, Offset::Beginning)
                .map_err(|e| SourceError::new(format!("cannot assign partitions: {e}")))?;
        }
        self.consumer
            .incremental_assign(&tpl)
            .map_err(|e| SourceError::new(format!("cannot assign the new partitions: {e}")))
    }

    /// A consumer error: a refusal ([`Refusals`]) and an offset the broker
    /// no longer has are terminal (named); anything else is the client's
    /// to retry.
    fn consume_error(&mut self, e: KafkaError) -> Result<(), SourceError> {
        if let Some(refused) = self.consumer.context().refused() {
            return Err(refused);
        }
        match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange) => {
                Err(self.out_of_range(&e))
            }
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Err(SourceError::new(format!(
                "a routed topic or partition disappeared from {}: {e}",
                self.cfg.brokers
            ))),
            _ => {
                self.warn(&format!("Kafka client error (retrying): {e}"));
                Ok(())
            }
        }
    }

    /// Names the partition whose offset is out of range.
    fn out_of_range(&self, e: &KafkaError) -> SourceError {
        for ((t, p), part) in &self.parts {
            let topic = &self.cfg.topics[*t];
            let Some(next) = part.next else { continue };
            if let Ok((low, high)) = self.watermarks(topic, *p)
                && let Err(err) = check_offset(topic, *p, next, low, high)
            {
                return err;
            }
        }
        SourceError::new(format!(
            "an offset to read is no longer on the broker ({e}); nothing was skipped"
        ))
    }

    fn warn(&mut self, message: &str) {
        if self.last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.last_warning = Some(Instant::now());
            tracing::warn!(source = %self.cfg.source, "{message}");
        }
    }
}

/// Whether a client error's code says the brokers are away or briefly
/// unable to serve (down, restarting, electing a leader), not that the
/// request is wrong: the run retries it within `retry_timeout`.
fn brokers_away(code: Option<RDKafkaErrorCode>) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        Some(
            C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::Resolve
                | C::OperationTimedOut
                | C::RequestTimedOut
                | C::NetworkException
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::BrokerNotAvailable
        )
    )
}

/// A client error with `message`, transient when its `code` says the
/// brokers are away ([`brokers_away`]).
fn client_error(message: String, code: Option<RDKafkaErrorCode>) -> SourceError {
    SourceError {
        message,
        transient: brokers_away(code),
        schema_change: None,
    }
}

/// A resume offset must lie within what the broker holds.
fn check_offset(
    topic: &str,
    partition: i32,
    next: i64,
    low: i64,
    high: i64,
) -> Result<(), SourceError> {
    if next < low {
        return Err(SourceError::new(format!(
            "topic {topic} partition {partition}: offset {next} is no longer on the broker (it keeps offsets {low} to {}): retention removed changes the sinks have not committed; nothing was skipped (re-create the tables to start over from offset {low})",
            high - 1
        )));
    }
    if next > high {
        return Err(SourceError::new(format!(
            "topic {topic} partition {partition}: the sinks committed offset {next}, past the partition's end ({high}): was the topic deleted and re-created?"
        )));
    }
    Ok(())
}

/// Appends `b` to a batch's bytes; returns where it lies.
fn copy_into(bytes: &mut Vec<u8>, b: &[u8]) -> std::ops::Range<usize> {
    let start = bytes.len();
    bytes.extend_from_slice(b);
    start..bytes.len()
}

/// A message's headers as a JSON object: a UTF-8 value as a string, other
/// bytes as `{"base64": "..."}`, no value as null (a repeated name keeps
/// its last value); `None` when it has none.
fn headers_json(m: &Fetched<'_>) -> Option<String> {
    let headers = m.headers();
    if headers.is_empty() {
        return None;
    }
    let mut map = serde_json::Map::new();
    for (name, value) in headers {
        let value = match value {
            None => serde_json::Value::Null,
            Some(v) => match std::str::from_utf8(v) {
                Ok(s) => serde_json::Value::String(s.to_string()),
                Err(_) => serde_json::json!({
                    "base64": base64::engine::general_purpose::STANDARD.encode(v)
                }),
            },
        };
        map.insert(name, value);
    }
    Some(serde_json::Value::Object(map).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brokers_away_are_transient_a_missing_topic_is_not() {
        use RDKafkaErrorCode as C;
        for code in [
            C::AllBrokersDown,
            C::BrokerTransportFailure,
            C::LeaderNotAvailable,
        ] {
            assert!(client_error("x".into(), Some(code)).transient, "{code:?}");
        }
        for code in [
            Some(C::UnknownTopicOrPartition),
            Some(C::TopicAuthorizationFailed),
            None,
        ] {
            assert!(!client_error("x".into(), code).transient, "{code:?}");
        }
    }
}
