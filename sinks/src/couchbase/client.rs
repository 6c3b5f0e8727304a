//! Every call to Couchbase goes through [`Calls::run`]: bounded by the
//! sink's `timeout` per attempt, retried with backoff while the failure is
//! transient and the `retry_for` budget lasts, then a terminal error that
//! names Couchbase, the operation, the table and the server.
//!
//! Why every call: the SDK 1.1 waits forever once the server is gone (no
//! per-operation timeout; a custom retry strategy is never consulted), and
//! a write to a collection the server does not know yet is retried by the
//! SDK without end.

use std::future::Future;
use std::time::{Duration, Instant};

use couchbase::error::{Error as CbError, ErrorKind};
use urutau_planner::sink::SinkError;

/// How a failed call is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Worth another try (a timeout, a lost connection, a busy server).
    Transient,
    /// Retrying cannot help (a document too large, durability the bucket
    /// cannot give, a refused login).
    Terminal,
}

/// Which failures of the SDK are transient.
pub fn classify(e: &CbError) -> Failure {
    // A refused certificate stays refused.
    if certificate_hint(e).is_some() {
        return Failure::Terminal;
    }
    match e.kind() {
        ErrorKind::ServerTimeout
        | ErrorKind::TemporaryFailure
        | ErrorKind::RequestCanceled
        | ErrorKind::ServiceNotAvailable(_)
        | ErrorKind::InternalServerFailure
        | ErrorKind::DurabilityAmbiguous
        | ErrorKind::DurabilityWriteInProgress
        | ErrorKind::DurableWriteRecommitInProgress
        | ErrorKind::DocumentLocked
        | ErrorKind::RateLimitedFailure
        | ErrorKind::ClusterDropped => Failure::Transient,
        ErrorKind::OtherFailure(m) if is_connection_text(m) => Failure::Transient,
        _ => Failure::Terminal,
    }
}

fn is_connection_text(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    [
        "connection",
        "connect",
        "broken pipe",
        "reset",
        "eof",
        "closed",
        "cancel",
        "timeout",
        "timed out",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// What to change when `e` is a refused server certificate.
fn certificate_hint(e: &CbError) -> Option<String> {
    let text = crate::tls::with_causes(e);
    crate::tls::hint(&text, "ca_cert").map(|hint| format!("{hint} ({text})"))
}

/// What a terminal SDK failure means for the user, with the fix where
/// there is one.
pub fn explain(e: &CbError, bucket: &str) -> String {
    if let Some(hint) = certificate_hint(e) {
        return hint;
    }
    match e.kind() {
        ErrorKind::DurabilityImpossible => format!(
            "{e}: bucket `{bucket}` cannot acknowledge the configured durability with the nodes it has (a single node with replicas >= 1 never can); use a bucket with 0 replicas (the sink creates its bucket so), add nodes, or choose another durability; urutau never downgrades durability silently"
        ),
        ErrorKind::DurabilityLevelNotAvailable => format!(
            "{e}: the cluster does not offer the configured durability level for bucket `{bucket}`"
        ),
        ErrorKind::ValueTooLarge => {
            format!("{e}: the document is larger than Couchbase allows (20 MiB)")
        }
        ErrorKind::AuthenticationFailure => {
            format!("{e}: check the username and its credentials (never shown)")
        }
        ErrorKind::BucketNotFound => format!("{e}: bucket `{bucket}` does not exist"),
        _ => e.to_string(),
    }
}

/// Runs calls against one cluster with the sink's time rules.
#[derive(Debug, Clone)]
pub struct Calls {
    /// One attempt's limit.
    pub timeout: Duration,
    /// How long transient failures are retried before the run stops.
    pub retry_for: Duration,
    /// The server, as messages name it (hosts only, never credentials).
    pub server: String,
    pub bucket: String,
}

impl Calls {
    /// Runs `call` until it succeeds, fails terminally, or the retry
    /// budget is spent. `op` and `table` name the call in errors.
    pub async fn run<T, F, Fut>(&self, op: &str, table: &str, call: F) -> Result<T, SinkError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CbError>>,
    {
        self.run_classified(op, table, call, classify).await
    }

    /// [`Self::run`] with the caller's classification (e.g. a removal of a
    /// missing document is success, decided by the caller's `call`).
    pub async fn run_classified<T, F, Fut>(
        &self,
        op: &str,
        table: &str,
        call: F,
        classify: impl Fn(&CbError) -> Failure,
    ) -> Result<T, SinkError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, CbError>>,
    {
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let cause = match tokio::time::timeout(self.timeout, call()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => match classify(&e) {
                    Failure::Terminal => {
                        return Err(SinkError::Io(format!(
                            "couchbase: {op} on table {table} at {}: {}",
                            self.server,
                            explain(&e, &self.bucket)
                        )));
                    }
                    Failure::Transient => e.to_string(),
                },
                Err(_) => format!("no answer within {:?}", self.timeout),
            };
            if started.elapsed() + pause >= self.retry_for {
                return Err(SinkError::Io(format!(
                    "couchbase: {op} on table {table} at {} failed {tries} time(s) over {:.1} s (timeout {:?}, retry_for {:?}); last: {cause}",
                    self.server,
                    started.elapsed().as_secs_f64(),
                    self.timeout,
                    self.retry_for
                )));
            }
            tracing::warn!(op, table, server = %self.server, tries, %cause, "couchbase call failed; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }
}

/// The hosts of a connection string, without scheme options or
/// credentials: how messages name the server.
pub fn server_name(uri: &str) -> String {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let rest = rest.split(['?', '/']).next().unwrap_or("");
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let scheme = uri.split_once("://").map_or("couchbase", |(s, _)| s);
    format!("{scheme}://{hosts}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_impossible_is_terminal_and_names_bucket_and_fix() {
        let e = CbError::new(ErrorKind::DurabilityImpossible);
        assert_eq!(classify(&e), Failure::Terminal);
        let text = explain(&e, "shop");
        assert!(text.contains("bucket `shop`"), "{text}");
        assert!(text.contains("0 replicas"), "{text}");
        assert!(text.contains("never downgrades"), "{text}");
    }

    #[test]
    fn transient_and_terminal_kinds() {
        for k in [
            ErrorKind::ServerTimeout,
            ErrorKind::TemporaryFailure,
            ErrorKind::DurabilityAmbiguous,
            ErrorKind::RequestCanceled,
        ] {
            assert_eq!(
                classify(&CbError::new(k.clone())),
                Failure::Transient,
                "{k}"
            );
        }
        for k in [
            ErrorKind::ValueTooLarge,
            ErrorKind::AuthenticationFailure,
            ErrorKind::DurabilityLevelNotAvailable,
            ErrorKind::CasMismatch,
        ] {
            assert_eq!(classify(&CbError::new(k.clone())), Failure::Terminal, "{k}");
        }
    }

    #[test]
    fn server_names_carry_no_credentials() {
        assert_eq!(
            server_name("couchbase://u:secret@h1:11210,h2?network=external"),
            "couchbase://h1:11210,h2"
        );
        assert_eq!(
            server_name("couchbases://db.example"),
            "couchbases://db.example"
        );
    }

    #[tokio::test]
    async fn a_call_that_never_answers_ends_within_the_budget() {
        let calls = Calls {
            timeout: Duration::from_millis(50),
            retry_for: Duration::from_millis(400),
            server: "couchbase://h".into(),
            bucket: "b".into(),
        };
        let started = Instant::now();
        let r: Result<(), _> = calls
            .run("upsert", "t", || {
                std::future::pending::<Result<(), CbError>>()
            })
            .await;
        let msg = r.unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(
            msg.contains("couchbase: upsert on table t at couchbase://h"),
            "{msg}"
        );
        assert!(msg.contains("no answer within"), "{msg}");
    }
}
