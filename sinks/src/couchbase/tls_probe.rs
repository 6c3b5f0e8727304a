//! A refused certificate, found before the SDK connects: couchbase-rs 1.1
//! logs a TLS handshake its roots refuse and tries again without end, so
//! `Cluster::connect` never says why it does not answer. Given CAs
//! (`ca_cert`, `SSL_CERT_FILE`), the SDK trusts exactly those, so one
//! handshake of our own with the same roots to a seed node tells a refused
//! certificate apart, as a terminal error saying what to set; anything
//! else (a node that is down, a port that does not answer) is left to the
//! SDK and its retries. Without given CAs the SDK trusts the web CAs plus
//! Capella's own CA, which it does not export: no probe then, so a Capella
//! cluster is never refused by a root store that is not the SDK's.

use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, ServerName};

/// The default TLS (kvSSL) port of a `couchbases://` seed.
const DEFAULT_TLS_PORT: u16 = 11207;
/// How long one probe's connect and handshake may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The seed nodes of a `couchbases://` connection string, as
/// `(host, port)`.
pub fn seeds(uri: &str) -> Vec<(String, u16)> {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let hosts = rest.split(['?', '/']).next().unwrap_or("");
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts
        .split([',', ';'])
        .filter(|h| !h.is_empty())
        .map(|h| {
            let (host, port) = match h.rsplit_once(':') {
                Some((host, port)) if !host.ends_with(':') && !port.contains(']') => {
                    (host, port.parse().unwrap_or(DEFAULT_TLS_PORT))
                }
                _ => (h, DEFAULT_TLS_PORT),
            };
            (host.trim_matches(['[', ']']).to_string(), port)
        })
        .collect()
}

/// Why the first seed that answers refuses TLS with exactly the CAs
/// `ca_certs` (what the SDK trusts when given them), if its certificate is
/// what fails: the message, with what to set.
pub async fn refused_certificate(
    uri: &str,
    ca_certs: &[CertificateDer<'static>],
) -> Option<String> {
    let mut roots = RootCertStore::empty();
    for cert in ca_certs {
        roots.add(cert.clone()).ok()?;
    }
    let config = crate::tls::client_config(roots).ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    for (host, port) in seeds(uri) {
        let Ok(name) = ServerName::try_from(host.clone()) else {
            continue;
        };
        let handshake = async {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            connector.connect(name, tcp).await.map(drop)
        };
        match tokio::time::timeout(PROBE_TIMEOUT, handshake).await {
            Ok(Ok(())) => return None,
            Ok(Err(e)) => {
                let text = crate::tls::with_causes(&e);
                if let Some(hint) = crate::tls::hint(&text, "ca_cert") {
                    return Some(format!("{hint} (TLS to {host}:{port}: {text})"));
                }
            }
            // Down or silent: the next seed, then the SDK's own tries.
            Err(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_take_ports_or_the_tls_default() {
        assert_eq!(
            seeds("couchbases://a:1,b?x=y"),
            vec![("a".to_string(), 1), ("b".to_string(), DEFAULT_TLS_PORT)]
        );
        assert_eq!(
            seeds("couchbases://u@127.0.0.1:4000/bucket"),
            vec![("127.0.0.1".to_string(), 4000)]
        );
        assert_eq!(seeds("couchbases://[::1]:5"), vec![("::1".to_string(), 5)]);
    }
}
