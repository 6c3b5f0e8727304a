//! A broker refusing this client: failed SASL authentication, a broker
//! certificate that does not verify, a client certificate the broker
//! rejects, TLS spoken to a plaintext listener. librdkafka reports these
//! as client errors and reconnects for ever; retrying cannot fix them, so
//! the first one ends the run (terminal, not retried by the supervisor)
//! with the broker, the problem and the option to change.
//!
//! librdkafka hands an error's words only to its client context's error
//! callback ([`Refusals`]); the consumer reads the refusal kept there. Its
//! log lines pass through here too, on their way to `tracing`, so that no
//! secret of the source can reach the log.

use std::sync::Mutex;

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::security::Security;
use crate::sources::SourceError;

/// What the broker refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// SASL: wrong password, unknown user, mechanism not enabled.
    Authentication,
    /// The broker's certificate: not signed by a trusted CA, or not for
    /// the host connected to (OpenSSL reports both alike).
    BrokerCertificate,
    /// The broker wants a client certificate it trusts.
    ClientCertificate,
    /// TLS to a listener that does not speak it.
    NotTls,
    /// Any other TLS failure (no common protocol version or cipher, an
    /// unreadable key...).
    Tls,
}

/// Whether a client error (its code and librdkafka's words) is a refusal.
/// The words decide first: OpenSSL's verdict reaches the application as
/// `_SSL` or as `_TRANSPORT` depending on the step of the handshake that
/// met it.
pub fn classify(code: RDKafkaErrorCode, reason: &str) -> Option<Refusal> {
    use RDKafkaErrorCode as C;
    let has = |needle: &str| reason.contains(needle);
    let tls_words = matches!(code, C::SSL | C::BrokerTransportFailure);
    if matches!(code, C::Authentication | C::SaslAuthenticationFailed) {
        Some(Refusal::Authentication)
    } else if tls_words && has("certificate verify failed") {
        Some(Refusal::BrokerCertificate)
    } else if tls_words
        && (has("alert bad certificate")
            || has("alert certificate required")
            || has("alert unknown ca")
            || has("alert certificate unknown")
            || has("client SSL authentication might be required"))
    {
        Some(Refusal::ClientCertificate)
    } else if tls_words && has("connecting to a PLAINTEXT broker listener") {
        Some(Refusal::NotTls)
    } else if code == C::SSL {
        Some(Refusal::Tls)
    } else {
        None
    }
}

/// The broker a librdkafka error names (`sasl_ssl://host:port/bootstrap:
/// ...` gives `host:port`).
fn broker_of(reason: &str) -> Option<&str> {
    let (head, _) = reason.split_once(": ")?;
    let rest = head.split_once("://").map_or(head, |(_, r)| r);
    let addr = rest.split('/').next()?;
    addr.contains(':').then_some(addr)
}

/// What the certificate of the broker at `host:port` says (one more
/// handshake that trusts nothing, [`crate::sources::tls_probe`]).
fn presented_certificate(broker: &str) -> Option<urutau_planner::certificate::Described> {
    use crate::sources::tls_probe::{Preamble, server_certificate};
    let (host, port) = broker.rsplit_once(':')?;
    server_certificate(host, port.parse().ok()?, Preamble::None)
}

/// The client context of the Kafka source: keeps the first refusal.
pub struct Refusals {
    security: Security,
    brokers: String,
    secrets: Vec<String>,
    first: Mutex<Option<SourceError>>,
    /// The last other client error (scrubbed), for a timeout's message.
    last: Mutex<Option<String>>,
}

impl Refusals {
    /// For a client of `brokers` configured with `security`.
    pub fn new(brokers: &str, security: Security) -> Self {
        Refusals {
            secrets: security.secrets(),
            brokers: brokers.to_string(),
            security,
            first: Mutex::new(None),
            last: Mutex::new(None),
        }
    }

    /// The last client error that was not a refusal, with a hint when it
    /// looks like a listener expecting TLS or SASL that this source does
    /// not speak (the broker closes such connections while they are set
    /// up, which looks like an outage and is retried as one).
    pub fn last_error(&self) -> Option<String> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let closed_early = last.contains("Disconnected") && last.contains("APIVERSION_QUERY");
        Some(if closed_early && self.security.protocol() == "plaintext" {
            format!(
                "{last}; the broker closes the connection as it is set up: if this listener expects TLS or SASL, set tls = true or sasl_mechanism"
            )
        } else {
            last
        })
    }

    /// The first refusal seen, as the terminal error that ends the run.
    pub fn refused(&self) -> Option<SourceError> {
        self.first.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `text` with the source's secrets masked.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            out = out.replace(s.as_str(), "***");
        }
        out
    }

    /// The terminal error of `refusal`; `reason` is librdkafka's words,
    /// `seen` what the broker's certificate says when it was read.
    pub fn explain(
        &self,
        refusal: Refusal,
        reason: &str,
        seen: Option<&urutau_planner::certificate::Described>,
    ) -> SourceError {
        let broker = broker_of(reason).unwrap_or(&self.brokers);
        let protocol = self.security.protocol();
        let roots = match self.security.ca() {
            Some(ca) => format!("the CA in tls_ca `{}`", ca.display()),
            None => "a CA of the system's trust store (no tls_ca is set)".to_string(),
        };
        let what = match refusal {
            Refusal::Authentication => match &self.security.sasl {
                Some(s) => format!(
                    "Kafka broker {broker} refused the SASL authentication of user `{}` with {}: check sasl_username and sasl_password, and that the broker enables {} for this user",
                    s.username, s.mechanism, s.mechanism
                ),
                None => format!(
                    "Kafka broker {broker} asks for SASL authentication: set sasl_mechanism, sasl_username and sasl_password"
                ),
            },
            Refusal::BrokerCertificate => format!(
                "the TLS certificate of Kafka broker {broker} was refused: it is not signed by {roots}, or it does not name the host connected to; set tls_ca to the PEM file of the CA that signed the broker's certificate, and connect by a name the certificate holds (bootstrap and advertised names are both checked)"
            ),
            Refusal::ClientCertificate => {
                match self.security.tls.as_ref().and_then(|t| t.client.as_ref()) {
                    Some((cert, _)) => format!(
                        "Kafka broker {broker} refused the client certificate in tls_cert `{}`: it must be signed by a CA the broker trusts",
                        cert.display()
                    ),
                    None => format!(
                        "Kafka broker {broker} requires a client certificate (mutual TLS): set tls_cert and tls_key"
                    ),
                }
            }
            Refusal::Tls => format!(
                "TLS with Kafka broker {broker} failed (security.protocol={protocol}); check the tls options"
            ),
            Refusal::NotTls => format!(
                "Kafka broker {broker} does not speak TLS on this port (security.protocol={protocol}): connect to its TLS listener, or remove the tls options"
            ),
        };
        let seen = seen
            .map(|d| format!("; the broker presented a certificate with {d}"))
            .unwrap_or_default();
        SourceError::new(format!("{what}{seen} (librdkafka: {})", self.scrub(reason)))
    }

    /// Keeps the first refusal.
    fn note(&self, error: SourceError) {
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            tracing::debug!("{}", error.message);
            *first = Some(error);
        }
    }
}

impl ClientContext for Refusals {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        let line = self.scrub(log_message);
        if fac == "FAIL" {
            // A connection failure librdkafka logs without raising it as
            // an error (a disconnect).
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(line.clone());
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", "{fac} {line}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", "{fac} {line}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "{fac} {line}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "{fac} {line}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code().and_then(|c| classify(c, reason)) {
            Some(refusal) if self.refused().is_none() => {
                let seen = (refusal == Refusal::BrokerCertificate)
                    .then(|| broker_of(reason).and_then(presented_certificate))
                    .flatten();
                self.note(self.explain(refusal, reason, seen.as_ref()))
            }
            Some(_) => {}
            None => {
                let reason = self.scrub(reason);
                tracing::debug!(target: "librdkafka", "{error}: {reason}");
                // "1/1 brokers are down" says less than the error before it.
                if error.rdkafka_error_code() != Some(RDKafkaErrorCode::AllBrokersDown) {
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
                }
            }
        }
    }
}

impl ConsumerContext for Refusals {}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAM: &str = "sasl_ssl://127.0.0.1:42717/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256 (after 333ms in state AUTH_REQ)";
    const WRONG_CA: &str = "sasl_ssl://127.0.0.1:42717/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed (install ca-certificates package) (after 6ms in state SSL_HANDSHAKE)";
    const NO_CERT: &str = "ssl://127.0.0.1:37051/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert bad certificate: SSL alert number 42 (after 1ms in state APIVERSION_QUERY)";
    const PLAINTEXT: &str = "ssl://127.0.0.1:47481/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: connecting to a PLAINTEXT broker listener? (after 5ms in state SSL_HANDSHAKE)";

    #[test]
    fn refusals_are_told_apart_from_outages() {
        use RDKafkaErrorCode as C;
        assert_eq!(
            classify(C::Authentication, SCRAM),
            Some(Refusal::Authentication)
        );
        assert_eq!(classify(C::SSL, WRONG_CA), Some(Refusal::BrokerCertificate));
        assert_eq!(
            classify(C::BrokerTransportFailure, NO_CERT),
            Some(Refusal::ClientCertificate)
        );
        assert_eq!(
            classify(C::BrokerTransportFailure, PLAINTEXT),
            Some(Refusal::NotTls)
        );
        let early = "sasl_ssl://127.0.0.1:38753/bootstrap: error:0A000086:SSL routines::certificate verify failed (after 7ms in state SSL_HANDSHAKE)";
        assert_eq!(
            classify(C::BrokerTransportFailure, early),
            Some(Refusal::BrokerCertificate)
        );
        let down = "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)";
        assert_eq!(classify(C::BrokerTransportFailure, down), None);
        assert_eq!(classify(C::AllBrokersDown, "1/1 brokers are down"), None);
    }

    #[test]
    fn a_refusal_names_the_broker_and_the_option_but_no_secret() {
        use urutau_planner::diagnostic::Span;
        use urutau_planner::options::{OptionMap, OptionValue};
        let mut o = OptionMap::default();
        for (k, v) in [
            ("sasl_mechanism", "SCRAM-SHA-256"),
            ("sasl_username", "alice"),
            ("sasl_password", "hunter2-secret"),
        ] {
            o.push(k, OptionValue::string(v), Span::default(), Span::default());
        }
        let r = Refusals::new("b:9092", Security::parse(&o).unwrap());
        let m = r
            .explain(
                Refusal::Authentication,
                &format!("{SCRAM} hunter2-secret"),
                None,
            )
            .message;
        assert!(m.starts_with("Kafka broker 127.0.0.1:42717 refused the SASL authentication of user `alice` with SCRAM-SHA-256: check sasl_username and sasl_password"), "{m}");
        assert!(!m.contains("hunter2"), "{m}");
        let m = r
            .explain(Refusal::BrokerCertificate, WRONG_CA, None)
            .message;
        assert!(
            m.contains("not signed by a CA of the system's trust store (no tls_ca is set)"),
            "{m}"
        );
        assert!(m.contains("set tls_ca"), "{m}");
        let m = r.explain(Refusal::ClientCertificate, NO_CERT, None).message;
        assert!(m.contains("set tls_cert and tls_key"), "{m}");
        assert_eq!(broker_of("no colon here"), None);
    }
}
