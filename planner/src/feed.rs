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
}

/// The channel into one route's plan.
#[derive(Debug, Default)]
pub struct RouteFeed {
    receiver: Mutex<Option<mpsc::Receiver<RouteBatch>>>,
    boundaries: Mutex<VecDeque<String>>,
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

    /// Records that the batch the scan just emitted ends at `end`.
    pub fn push_boundary(&self, end: String) {
        self.boundaries.lock().expect("feed lock").push_back(end);
    }

    /// The end position of the next batch reaching the sink node.
    pub fn pop_boundary(&self) -> Option<String> {
        self.boundaries.lock().expect("feed lock").pop_front()
    }
}
