//! When a source closes a batch: after `max_rows` rows or `max_interval`
//! since the batch's first change — and only at a transaction boundary, so
//! the position a commit records means "everything up to here".

use std::time::{Duration, Instant};

use urutau_planner::validate::BatchOptions;

/// The batching rule of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    pub max_rows: usize,
    pub max_interval: Duration,
}

impl From<BatchOptions> for BatchPolicy {
    fn from(o: BatchOptions) -> Self {
        BatchPolicy {
            max_rows: o.max_rows,
            max_interval: o.max_interval,
        }
    }
}

impl BatchPolicy {
    /// Whether a batch holding `rows` rows, whose first change arrived at
    /// `opened`, should close now. Ask only at transaction boundaries: a
    /// transaction larger than `max_rows` stays whole.
    pub fn should_close(&self, rows: usize, opened: Option<Instant>) -> bool {
        rows > 0
            && (rows >= self.max_rows || opened.is_some_and(|t| t.elapsed() >= self.max_interval))
    }

    /// How long a source may wait for more changes, `longest` at most,
    /// before it must look at [`BatchPolicy::should_close`] again: an open
    /// batch closes on time, not after a wait that began just before its
    /// `max_interval` ran out.
    pub fn wait_limit(&self, rows: usize, opened: Option<Instant>, longest: Duration) -> Duration {
        match opened {
            Some(t) if rows > 0 => self.max_interval.saturating_sub(t.elapsed()).min(longest),
            _ => longest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_on_rows_or_age_never_empty() {
        let p = BatchPolicy {
            max_rows: 3,
            max_interval: Duration::from_millis(50),
        };
        assert!(!p.should_close(0, Some(Instant::now() - Duration::from_secs(1))));
        assert!(!p.should_close(2, Some(Instant::now())));
        assert!(p.should_close(3, Some(Instant::now())));
        assert!(p.should_close(1, Some(Instant::now() - Duration::from_millis(60))));
    }

    #[test]
    fn an_open_batch_waits_no_longer_than_its_interval_has_left() {
        let p = BatchPolicy {
            max_rows: 3,
            max_interval: Duration::from_millis(500),
        };
        let longest = Duration::from_millis(100);
        // No batch open: the longest wait.
        assert_eq!(p.wait_limit(0, None, longest), longest);
        assert_eq!(p.wait_limit(0, Some(Instant::now()), longest), longest);
        // Open with most of its interval left: the longest wait still.
        assert_eq!(p.wait_limit(1, Some(Instant::now()), longest), longest);
        // Open with 50 ms at most left: no longer than that.
        let left = p.wait_limit(
            1,
            Some(Instant::now() - Duration::from_millis(450)),
            longest,
        );
        assert!(left <= Duration::from_millis(50), "{left:?}");
        // Due: no wait.
        let due = Some(Instant::now() - Duration::from_secs(1));
        assert_eq!(p.wait_limit(1, due, longest), Duration::ZERO);
    }
}
