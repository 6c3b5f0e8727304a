//! Noticing a replication connection the network silently dropped. An
//! idle server sends nothing on a replication connection (the client's
//! own status updates keep the walsender content), so a network that
//! drops packets without a reset leaves the stream waiting forever, until
//! TCP gives up many minutes later. After [`SILENCE`] without a message,
//! the stream checks on a new SQL session, within [`PROBE_TIMEOUT`], that
//! the server still streams from its slot: no answer, or a slot no
//! connection streams from (the server ended our walsender), is a lost
//! connection, retried like any other.

use std::time::{Duration, Instant};

use super::super::catalog;
use crate::sources::SourceError;

/// How long the server may say nothing before the stream checks on it.
pub const SILENCE: Duration = Duration::from_secs(30);
/// How long that check may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// When the server was last heard from, and when it was last checked.
pub struct SilenceWatch {
    silence: Duration,
    probe_timeout: Duration,
    last_heard: Instant,
    last_probe: Instant,
}

impl SilenceWatch {
    /// A watch that starts now, with [`SILENCE`] and [`PROBE_TIMEOUT`]
    /// (in the test suite's builds, both are `URUTAU_TEST_SILENCE_MS`
    /// when set).
    pub fn new() -> SilenceWatch {
        let (silence, probe_timeout) = match test_override() {
            Some(d) => (d, d),
            None => (SILENCE, PROBE_TIMEOUT),
        };
        SilenceWatch {
            silence,
            probe_timeout,
            last_heard: Instant::now(),
            last_probe: Instant::now(),
        }
    }

    /// A message arrived.
    pub fn heard(&mut self) {
        self.last_heard = Instant::now();
    }

    /// After a silence, checks that the server still streams from `slot`
    /// (at most once per silence period); an error when it does not answer
    /// or no longer streams to any connection.
    pub async fn check(&mut self, uri: &str, slot: &str) -> Result<(), SourceError> {
        if self.last_heard.elapsed() < self.silence || self.last_probe.elapsed() < self.silence {
            return Ok(());
        }
        self.last_probe = Instant::now();
        let quiet = self.last_heard.elapsed().as_secs_f64();
        match tokio::time::timeout(self.probe_timeout, catalog::slot_is_active(uri, slot)).await {
            Err(_) => Err(SourceError::transient(format!(
                "replication from slot {slot}: no message from the server for {quiet:.0}s, and a check on a new session got no answer within {:.0}s (is the network to the server down?)",
                self.probe_timeout.as_secs_f64()
            ))),
            Ok(Err(e)) => Err(SourceError {
                message: format!(
                    "replication from slot {slot}: no message from the server for {quiet:.0}s, and checking on it failed: {}",
                    e.message
                ),
                transient: e.transient,
                schema_change: None,
            }),
            Ok(Ok(false)) => Err(SourceError::transient(format!(
                "replication from slot {slot}: no message from the server for {quiet:.0}s, and the server no longer streams from the slot: the connection was lost"
            ))),
            Ok(Ok(true)) => Ok(()),
        }
    }
}

/// `URUTAU_TEST_SILENCE_MS`, in builds with the `fault-injection` feature
/// (the test suite's); never in a release.
fn test_override() -> Option<Duration> {
    #[cfg(feature = "fault-injection")]
    {
        std::env::var("URUTAU_TEST_SILENCE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        None
    }
}
