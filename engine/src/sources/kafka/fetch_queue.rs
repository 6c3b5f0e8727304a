//! A queue of the source's own that every assigned partition's fetched
//! messages are forwarded to, taken many at a time
//! (`rd_kafka_consume_batch_queue`).
//!
//! `BaseConsumer::poll` hands out one message per call, and each call
//! wrapped it in an event, allocated a reference count for it and read the
//! clock four times: about 8% of the source's CPU in the bench, as much as
//! copying the messages. Taking a thousand at a time does that work once.
//!
//! The consumer's own queue still carries the client's events (errors,
//! refusals) and is polled for them; a partition's own errors (an offset
//! out of range) come here with its messages, in order.
//!
//! A partition is forwarded here before it is assigned: librdkafka keeps a
//! forward the application set when it starts fetching the partition
//! (`RD_KAFKA_Q_F_FWD_APP`), so none of its messages goes to the
//! consumer's queue. An assignment that stops a partition (a full
//! re-assignment) clears its forward: partitions are only ever added
//! (`incremental_assign`), never re-assigned.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaErrorCode;

/// The most messages taken by one call.
const TAKE_AT_MOST: usize = 1024;

/// The queue, and room for the messages of one take.
pub struct FetchQueue {
    queue: NonNull<rd::rd_kafka_queue_t>,
    taken: Vec<*mut rd::rd_kafka_message_t>,
}

// librdkafka's queues may be used from any thread; the messages taken are
// destroyed before `take` returns.
unsafe impl Send for FetchQueue {}

impl FetchQueue {
    /// A new, empty queue of `consumer`'s client. It must be dropped
    /// before the consumer (declare it first in a struct holding both).
    pub fn new<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> FetchQueue {
        // SAFETY: the client pointer is live while `consumer` is.
        let queue = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        FetchQueue {
            queue: NonNull::new(queue).expect("librdkafka returns a new queue"),
            taken: vec![std::ptr::null_mut(); TAKE_AT_MOST],
        }
    }

    /// Forwards `topic`'s `partition` here: its messages and its errors,
    /// from before the call (moved, in order) and after it. Call it before
    /// the partition is assigned.
    pub fn forward<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
    ) -> Result<(), String> {
        let name = CString::new(topic).map_err(|_| format!("topic {topic:?} holds a NUL"))?;
        // SAFETY: the client pointer is live while `consumer` is; the
        // partition's queue handle is released once it forwards (the
        // forward holds a reference of its own to this queue).
        unsafe {
            let part = rd::rd_kafka_queue_get_partition(
                consumer.client().native_ptr(),
                name.as_ptr(),
                partition,
            );
            if part.is_null() {
                return Err(format!(
                    "topic {topic} partition {partition}: the Kafka client has no queue for it"
                ));
            }
            rd::rd_kafka_queue_forward(part, self.queue.as_ptr());
            rd::rd_kafka_queue_destroy(part);
        }
        Ok(())
    }

    /// Takes up to `at_most` messages (and partition errors), waiting up to
    /// `wait` for the first, and hands each to `each` in the order they
    /// were fetched; each is destroyed once handed (or when `each`
    /// panics). Returns how many were taken.
    pub fn take(
        &mut self,
        at_most: usize,
        wait: Duration,
        mut each: impl FnMut(Fetched<'_>),
    ) -> usize {
        let room = at_most.clamp(1, self.taken.len());
        let queue = self.queue.as_ptr();
        let n = fill(&mut self.taken[..room], wait, |wait_ms, into| {
            // SAFETY: `into` has room for `into.len()` pointers; librdkafka
            // fills the first `n` with messages the caller then owns.
            unsafe {
                rd::rd_kafka_consume_batch_queue(queue, wait_ms, into.as_mut_ptr(), into.len())
            }
        });
        let taken = Destroyed(&self.taken[..n]);
        for &m in taken.0 {
            // SAFETY: a message librdkafka handed over, destroyed only by
            // `taken`'s drop, after this loop.
            each(Fetched(unsafe { &*m }));
        }
        n
    }
}

impl Drop for FetchQueue {
    fn drop(&mut self) {
        // SAFETY: the queue was made by `rd_kafka_queue_new` and is
        // destroyed once; messages still in it are purged.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// Fills the front of `room` by `consume(wait_ms, slots)` (librdkafka's
/// `rd_kafka_consume_batch_queue`, which returns how many it put at the
/// front of `slots`, or -1 for an invalid argument); returns how many.
///
/// librdkafka's call waits until its slots are full or its timeout has
/// passed (`rd_kafka_q_serve_rkmessages`), not only for a first message:
/// asked for 1024 with a wait, it held a lone message (or the last ones of
/// a backlog) for the rest of the wait, and the batch holding them could
/// not close meanwhile. So a wait asks for one message, and the rest of
/// the room is taken from what is queued then, without waiting.
fn fill<T>(
    room: &mut [T],
    wait: Duration,
    mut consume: impl FnMut(i32, &mut [T]) -> isize,
) -> usize {
    let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // -1 is an invalid argument, which these are not.
    let mut call =
        |wait_ms: i32, slots: &mut [T]| usize::try_from(consume(wait_ms, slots)).unwrap_or(0);
    if wait_ms == 0 || room.len() == 1 {
        return call(wait_ms, room);
    }
    let (first, rest) = room.split_at_mut(1);
    match call(wait_ms, first) {
        0 => 0,
        _ => 1 + call(0, rest),
    }
}

/// Taken messages, destroyed on drop.
struct Destroyed<'a>(&'a [*mut rd::rd_kafka_message_t]);

impl Drop for Destroyed<'_> {
    fn drop(&mut self) {
        for &m in self.0 {
            // SAFETY: each was handed over by `rd_kafka_consume_batch_queue`
            // and is destroyed here once.
            unsafe { rd::rd_kafka_message_destroy(m) }
        }
    }
}

/// One message taken, or a partition's error.
pub struct Fetched<'a>(&'a rd::rd_kafka_message_t);

impl<'a> Fetched<'a> {
    /// The error this stands for, when it is one rather than a message.
    pub fn error(&self) -> Option<RDKafkaErrorCode> {
        (self.0.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
            .then(|| self.0.err.into())
    }

    /// The identity of the message's topic handle (0 for none): equal for
    /// messages of one topic while they are alive.
    pub fn topic_handle(&self) -> usize {
        self.0.rkt as usize
    }

    /// The topic's name (empty for an error of no topic).
    pub fn topic(&self) -> &'a [u8] {
        if self.0.rkt.is_null() {
            return b"";
        }
        // SAFETY: the message holds a reference to its topic, whose name
        // is a NUL-terminated string of the topic's lifetime.
        unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(self.0.rkt)).to_bytes() }
    }

    pub fn partition(&self) -> i32 {
        self.0.partition
    }

    pub fn offset(&self) -> i64 {
        self.0.offset
    }

    pub fn key(&self) -> Option<&'a [u8]> {
        // SAFETY: `key_len` bytes at `key`, owned by the message.
        unsafe { bytes(self.0.key, self.0.key_len) }
    }

    /// The value; `None` for a tombstone.
    pub fn payload(&self) -> Option<&'a [u8]> {
        // SAFETY: `len` bytes at `payload`, owned by the message.
        unsafe { bytes(self.0.payload, self.0.len) }
    }

    /// The message's timestamp (create or log-append time), milliseconds
    /// since the epoch.
    pub fn timestamp_millis(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a live message; `kind` is written.
        let ts = unsafe { rd::rd_kafka_message_timestamp(self.0, &mut kind) };
        (ts != -1 && kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
            .then_some(ts)
    }

    /// The message's headers in order, name and value (`None`: no value).
    /// librdkafka parses them when first asked.
    pub fn headers(&self) -> Vec<(String, Option<&'a [u8]>)> {
        let mut list = std::ptr::null_mut();
        // SAFETY: a live message; the headers it returns are its own.
        let err = unsafe { rd::rd_kafka_message_headers(self.0, &mut list) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || list.is_null() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for idx in 0.. {
            let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0usize);
            // SAFETY: `list` is the message's; a found header's name is
            // NUL-terminated and its value `size` bytes, both the message's.
            unsafe {
                if rd::rd_kafka_header_get_all(list, idx, &mut name, &mut value, &mut size)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                {
                    break;
                }
                out.push((
                    CStr::from_ptr(name).to_string_lossy().into_owned(),
                    bytes(value.cast_mut(), size),
                ));
            }
        }
        out
    }
}

/// `len` bytes at `ptr`; `None` when `ptr` is null.
///
/// # Safety
/// A non-null `ptr` must point to `len` readable bytes living for `'a`.
unsafe fn bytes<'a>(ptr: *mut std::ffi::c_void, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: per the contract above.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// librdkafka's batch call, as `fill` sees it: `queued` messages are
    /// there now, and each call is recorded as (wait, slots). The real
    /// call waits out its timeout whenever it is given a wait and more
    /// slots than there are messages; the tests assert that `fill` never
    /// gives it the chance (a broker cannot be made to show the wait
    /// without timing the test).
    struct Queue {
        queued: usize,
        calls: Vec<(i32, usize)>,
    }

    impl Queue {
        fn fill(&mut self, room: usize, wait: Duration) -> usize {
            let mut slots = vec![0u8; room];
            fill(&mut slots, wait, |wait_ms, slots| {
                self.calls.push((wait_ms, slots.len()));
                let n = self.queued.min(slots.len());
                self.queued -= n;
                n as isize
            })
        }
    }

    #[test]
    fn a_wait_is_for_the_first_message_and_the_rest_is_taken_as_queued() {
        let mut q = Queue {
            queued: 3,
            calls: vec![],
        };
        assert_eq!(q.fill(1024, Duration::from_millis(100)), 3);
        assert_eq!(q.calls, [(100, 1), (0, 1023)]);
        // Nothing queued: the one call that waits, for one message.
        assert_eq!(q.fill(1024, Duration::from_millis(100)), 0);
        assert_eq!(q.calls[2..], [(100, 1)]);
    }

    #[test]
    fn no_wait_takes_what_is_queued_up_to_the_room() {
        let mut q = Queue {
            queued: 5000,
            calls: vec![],
        };
        assert_eq!(q.fill(1024, Duration::ZERO), 1024);
        assert_eq!(q.calls, [(0, 1024)]);
        assert_eq!(q.fill(1024, Duration::from_secs(1)), 1024);
        assert_eq!(q.calls[1..], [(1000, 1), (0, 1023)]);
        assert_eq!(q.fill(1, Duration::from_secs(1)), 1);
        assert_eq!(q.calls[3..], [(1000, 1)]);
        assert_eq!(q.queued, 5000 - 2049);
    }
}
