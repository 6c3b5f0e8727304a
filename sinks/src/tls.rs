//! Trusting a private CA: sinks whose servers carry certificates of a CA
//! of their own (a company CA, a test CA) take its PEM file as `ca_cert`,
//! or from the standard `SSL_CERT_FILE`; without either, the client's
//! built-in web CAs verify the server as before. Certificates are always
//! verified: there is no setting that turns verification off.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
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
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| {
            SinkError::Unavailable(format!(
                "the CA file {} holds a certificate rustls refuses: {e}",
                path.display()
            ))
        })?;
    }
    Ok(roots)
}

/// A TLS client configuration that trusts exactly `roots` (HTTP/1.1).
pub fn client_config(roots: RootCertStore) -> Result<rustls::ClientConfig, SinkError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SinkError::Unavailable(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// What to change when `message` is a refused server certificate, for a
/// sink whose CA option is `option`.
pub fn hint(message: &str, option: &str) -> Option<String> {
    if message.contains("UnknownIssuer") {
        Some(format!(
            "the server's certificate is not signed by a CA the sink trusts: set {option} to the PEM file of the CA that signed it"
        ))
    } else if message.contains("NotValidForName") {
        Some("the server's certificate does not name the host of the uri: connect by a name the certificate holds".into())
    } else {
        None
    }
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
