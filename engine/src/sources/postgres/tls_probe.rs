//! The certificate a Postgres server presents, for the error that refuses
//! it. sqlx and pgwire-replication say only why a certificate was refused
//! ("UnknownIssuer"); one more handshake of our own reads the certificate
//! (subject, issuer, names), so the error says which CA signed it. The
//! probe trusts nothing: its verifier records the certificate and fails
//! the handshake, so no byte is ever sent over it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use urutau_planner::certificate::{self, Described};

/// How long the probe's connect and handshake may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Postgres's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// What the certificate of the server at `host:port` says; `None` when it
/// cannot be read (no TLS offered, no answer).
pub async fn server_certificate(host: &str, port: u16) -> Option<Described> {
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
    let probe = async {
        let mut tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        tcp.write_all(&SSL_REQUEST).await.ok()?;
        if tcp.read_u8().await.ok()? != b'S' {
            return None;
        }
        // Fails by design: the verifier refuses once it has the certificate.
        let _ = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await;
        Some(())
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe).await.ok()??;
    let der = seen.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    certificate::describe(&der)
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
        Err(rustls::Error::General("read only, never trusted".into()))
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("read only, never trusted".into()))
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("read only, never trusted".into()))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}
