//! The hand-off between the runner and a route's plan: the runner pushes
//! the route's share of each source batch in; the scan node reads it; the
//! sink node learns at which source position each batch ends.
//!
//! Every node between a route's scan and its sink maps one input batch to
//! exactly one output batch (the planner builds no coalescing or
//! repartitioning operator; see [`crate::plan`]), so the sink node pairs the
//! n-th batch it receives with the n-th boundary the scan recorded.

use std::collections::VecDeque;
use std::sync::Mutex;

use arrow::record_batch::RecordBatch;
use tokio::sync::mpsc;

/// A route's share of one source batch, and the position the source batch
/// ends at (after its last whole transaction).
#[derive(Debug, Clone)]
pub struct RouteBatch {
    pub batch: RecordBatch,
    pub end: String,
    /// The batch is a part of a transaction that continues in the next
    /// batch (one larger than `max_batch_rows`): the sink stages it, and
    /// `end` is not a position to commit. The batch that closes the
    /// transaction commits every staged part with it.
    pub open_transaction: bool,
    /// The sink may hold the batch back and commit it, with its position,
    /// together with the batches after it ([`crate::sink::Sink::prepare`]):
    /// an initial snapshot's rows, so they land in files of the target
    /// size. The runner says so only while the table's snapshot runs and
    /// no transaction of the table is staged.
    pub may_defer: bool,
}

/// Where a batch reaching the sink node ends ([`RouteBatch::end`],
/// [`RouteBatch::open_transaction`] and [`RouteBatch::may_defer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boundary {
    pub end: String,
    pub open_transaction: bool,
    pub may_defer: bool,
}

/// The channel into one route's plan.
#[derive(Debug, Default)]
pub struct RouteFeed {
    receiver: Mutex<Option<mpsc::Receiver<RouteBatch>>>,
    boundaries: Mutex<VecDeque<Boundary>>,
}

impl RouteFeed {
    /// A feed not connected yet (planning builds it; the runner connects it).
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens the feed; batches sent into the returned sender reach the scan.
    /// A bounded channel: a slow sink holds the source back.
    pub fn connect(&self, capacity: usize) -> mpsc::Sender<RouteBatch> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        *self.receiver.lock().expect("feed lock") = Some(rx);
        tx
    }

    /// Takes the receiving end (once: a plan executes once).
    pub fn take_receiver(&self) -> Option<mpsc::Receiver<RouteBatch>> {
        self.receiver.lock().expect("feed lock").take()
    }

    /// Records where the batch the scan just emitted ends.
    pub fn push_boundary(&self, boundary: Boundary) {
        self.boundaries
            .lock()
            .expect("feed lock")
            .push_back(boundary);
    }

    /// Where the next batch reaching the sink node ends.
    pub fn pop_boundary(&self) -> Option<Boundary> {
        self.boundaries.lock().expect("feed lock").pop_front()
    }
}
