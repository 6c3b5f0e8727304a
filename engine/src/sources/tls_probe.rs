//! The certificate a server presents, for the error that refuses it.
//! sqlx, pgwire-replication and librdkafka say only why a certificate was
//! refused ("UnknownIssuer", "certificate verify failed"); one more
//! handshake of our own reads the certificate (subject, issuer, names), so
//! the error says which CA signed it. The probe trusts nothing: its
//! verifier records the certificate and fails the handshake, so no byte is
//! ever sent over it. Blocking (std sockets, bounded by a timeout): it runs
//! on error paths only, from librdkafka's callback thread or from
//! `spawn_blocking`.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use urutau_planner::certificate::{self, Described};

/// How long each step of the probe (connect, read, write) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What comes before the TLS handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preamble {
    /// TLS from the first byte (Kafka, HTTPS).
    None,
    /// Postgres's SSLRequest, answered `S` by a server that offers TLS.
    PostgresSslRequest,
}

/// Postgres's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// What the certificate of the server at `host:port` says; `None` when it
/// cannot be read (no TLS offered, no answer).
/// (`host` may be an IPv6 address in brackets, as URIs write it.)
pub fn server_certificate(host: &str, port: u16, preamble: Preamble) -> Option<Described> {
    let host = host.trim_matches(['[', ']']);
    let seen = Arc::new(Mutex::new(None));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Record {
            seen: seen.clone(),
            schemes: provider
                .signature_verification_algorithms
                .supported_schemes(),
        }))
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_string()).ok()?;
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let mut tcp = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).ok()?;
    tcp.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    tcp.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    if preamble == Preamble::PostgresSslRequest {
        tcp.write_all(&SSL_REQUEST).ok()?;
        let mut answer = [0u8; 1];
        tcp.read_exact(&mut answer).ok()?;
        if answer[0] != b'S' {
            return None;
        }
    }
    let mut tls = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    // Fails by design: the verifier refuses once it has the certificate.
    while tls.is_handshaking() {
        if tls.complete_io(&mut tcp).is_err() {
            break;
        }
    }
    let der = seen.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    certificate::describe(&der)
}

/// The probe's answer to everything the server offers.
fn never_trusted() -> rustls::Error {
    rustls::Error::General("read only, never trusted".into())
}

/// Records the server's certificate and refuses it.
#[derive(Debug)]
struct Record {
    seen: Arc<Mutex<Option<Vec<u8>>>>,
    schemes: Vec<SignatureScheme>,
}

impl ServerCertVerifier for Record {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(end_entity.to_vec());
        Err(never_trusted())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(never_trusted())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(never_trusted())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}
