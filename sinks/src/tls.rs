//! Trusting a private CA: sinks whose servers carry certificates of a CA
//! of their own (a company CA, a test CA) take its PEM file as `ca_cert`,
//! or from the standard `SSL_CERT_FILE`; without either, the client's
//! built-in web CAs verify the server as before. Certificates are always
//! verified: there is no setting that turns verification off.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use urutau_planner::certificate::{self, Refusal};
use urutau_planner::sink::SinkError;

/// The CA file a sink trusts: its `ca_cert` option, else `SSL_CERT_FILE`,
/// else none (the built-in roots).
pub fn ca_file(option: Option<&str>) -> Option<PathBuf> {
    option
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("SSL_CERT_FILE").map(PathBuf::from))
}

/// The certificates of the PEM file at `path`; a file that cannot be read
/// or holds no certificate is an error naming it.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, SinkError> {
    let bytes = std::fs::read(path)
        .map_err(|e| SinkError::Unavailable(format!("the CA file {}: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            SinkError::Unavailable(format!(
                "the CA file {} is not PEM certificates: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(SinkError::Unavailable(format!(
            "the CA file {} holds no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// The certificates of the PEM file at `path` ([`certificates`]), as a
/// root store.
pub fn root_store(path: &Path) -> Result<RootCertStore, SinkError> {
    roots_of(certificates(path)?).map_err(|e| {
        SinkError::Unavailable(format!(
            "the CA file {} holds a certificate rustls refuses: {e}",
            path.display()
        ))
    })
}

/// A root store of `certs`.
pub fn roots_of(
    certs: impl IntoIterator<Item = CertificateDer<'static>>,
) -> Result<RootCertStore, rustls::Error> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert)?;
    }
    Ok(roots)
}

/// A TLS client configuration that trusts exactly `roots` (HTTP/1.1);
/// `trusted` says which they are (`the CA file /etc/ca.pem`) in the error
/// that refuses a certificate.
pub fn client_config(
    roots: RootCertStore,
    trusted: &str,
) -> Result<rustls::ClientConfig, SinkError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| SinkError::Unavailable(format!("TLS set-up: {e}")))?;
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SinkError::Unavailable(format!("TLS set-up: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Naming {
            inner: verifier,
            trusted: trusted.to_string(),
        }))
        .with_no_client_auth())
}

/// How [`client_config_web`]'s roots are named in a refusal.
pub const WEB_CAS: &str = "the built-in web CAs (no ca_cert given)";

/// A TLS client configuration that trusts the built-in web CAs
/// (webpki-roots, what the HTTP clients trust by default), naming a
/// refused certificate as [`client_config`] does.
pub fn client_config_web() -> Result<rustls::ClientConfig, SinkError> {
    let roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    client_config(roots, WEB_CAS)
}

/// A TLS client configuration that trusts exactly the CAs of the PEM file
/// at `path` ([`client_config`] with [`root_store`]).
pub fn client_config_trusting(path: &Path) -> Result<rustls::ClientConfig, SinkError> {
    client_config(
        root_store(path)?,
        &format!("the CA file {}", path.display()),
    )
}

/// Verifies as webpki does (the only judge); a refusal carries what the
/// refused certificate says (subject, issuer, names, and what it was
/// checked against) in the handshake's error itself ([`Refused`]), so
/// whichever client reports the error reports this certificate and no
/// other.
#[derive(Debug)]
struct Naming {
    inner: Arc<WebPkiServerVerifier>,
    trusted: String,
}

/// Opens and closes a refused certificate's description in an error's
/// text ([`hint`] finds it there).
const SEEN_OPEN: &str = "<<";
const SEEN_CLOSE: &str = ">>";

/// A certificate webpki refused, described. Its `Debug` (what rustls
/// prints of an `Other` certificate error) keeps webpki's reason first
/// (`UnknownIssuer`, ...), then the description between [`SEEN_OPEN`] and
/// [`SEEN_CLOSE`].
struct Refused {
    reason: rustls::CertificateError,
    seen: String,
}

impl std::fmt::Debug for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {SEEN_OPEN}{}{SEEN_CLOSE}", self.reason, self.seen)
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for Refused {}

impl ServerCertVerifier for Naming {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|e| match (e, certificate::describe(end_entity)) {
                (rustls::Error::InvalidCertificate(reason), Some(d)) => {
                    rustls::Error::InvalidCertificate(rustls::CertificateError::Other(
                        rustls::OtherError(Arc::new(Refused {
                            reason,
                            seen: format!(
                                "{} presented a certificate with {d}, checked against {}",
                                server_name.to_str(),
                                self.trusted
                            ),
                        })),
                    ))
                }
                (e, _) => e,
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// What to change when `message` is a refused server certificate, for a
/// sink whose CA option is `option`; names the certificate when one of
/// our clients ([`client_config`]) refused it.
pub fn hint(message: &str, option: &str) -> Option<String> {
    let why = match Refusal::in_text(message)? {
        Refusal::UnknownIssuer => format!(
            "the server's certificate is not signed by a CA the sink trusts: set {option} to the PEM file of the CA that signed it"
        ),
        Refusal::NotValidForName => "the server's certificate does not name the host of the uri: connect by a name the certificate holds".into(),
        Refusal::Expired => return None,
    };
    Some(match seen(message) {
        Some(seen) => format!("{why} ({seen})"),
        None => why,
    })
}

/// The refused certificate's description in an error's text, when one of
/// our clients ([`client_config`]) refused it.
fn seen(message: &str) -> Option<&str> {
    let start = message.find(SEEN_OPEN)? + SEEN_OPEN.len();
    let len = message[start..].find(SEEN_CLOSE)?;
    Some(&message[start..start + len])
}

/// An error with its causes: HTTP clients' own words ("error sending
/// request", "client error (Connect)") hide why, e.g. a refused
/// certificate, which only a cause names.
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal names the certificate it refused, from the error itself:
    /// two refusals never swap descriptions.
    #[test]
    fn a_refusal_carries_its_own_certificate() {
        let refusal = |host: &str| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
                Arc::new(Refused {
                    reason: rustls::CertificateError::UnknownIssuer,
                    seen: format!("{host} presented a certificate with subject \"CN={host}\""),
                }),
            )))
            .to_string()
        };
        let (a, b) = (refusal("a.example"), refusal("b.example"));
        let hint_b = hint(&b, "ca_cert").unwrap();
        let hint_a = hint(&a, "ca_cert").unwrap();
        assert!(hint_a.contains("set ca_cert"), "{hint_a}");
        assert!(
            hint_a.ends_with("(a.example presented a certificate with subject \"CN=a.example\")"),
            "{hint_a}"
        );
        assert!(
            hint_b.contains("CN=b.example") && !hint_b.contains("a.example"),
            "{hint_b}"
        );
        // Another client's refusal (no description) is not given one.
        let plain = hint("invalid peer certificate: UnknownIssuer", "ca_cert").unwrap();
        assert!(!plain.contains("presented"), "{plain}");
        let name = hint(
            "invalid peer certificate: certificate not valid for name \"x\"",
            "ca_cert",
        )
        .unwrap();
        assert!(name.contains("does not name the host"), "{name}");
    }

    #[test]
    fn a_file_without_certificates_is_an_error_naming_it() {
        let path = std::env::temp_dir().join(format!("urutau-ca-test-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = root_store(&path).unwrap_err().to_string();
        assert!(e.contains("holds no certificate"), "{e}");
        assert!(e.contains(&path.display().to_string()), "{e}");
        let missing = root_store(Path::new("/no/such/ca.pem"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("/no/such/ca.pem"), "{missing}");
        std::fs::remove_file(&path).unwrap();
    }
}
