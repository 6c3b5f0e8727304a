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
}
