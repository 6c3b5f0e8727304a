//! A refused certificate, found before the SDK connects: couchbase-rs 1.1
//! logs a TLS handshake its roots refuse and tries again without end, so
//! `Cluster::connect` never says why it does not answer. One handshake of
//! our own to a seed node, with the roots the SDK will use, tells a
//! refused certificate apart, as a terminal error saying what to set;
//! anything else (a node that is down, a port that does not answer) is
//! left to the SDK and its retries. Given CAs (`ca_cert`, `SSL_CERT_FILE`),
//! the SDK trusts exactly those. Without them it trusts the web CAs
//! (webpki-roots, as here) plus Capella's own CA, which it does not
//! export: Capella's hosts (`*.cloud.couchbase.com`) are not probed then,
//! so a Capella cluster is never refused by roots that are not the SDK's.

use std::sync::Arc;
use std::time::Duration;

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

/// Capella's host names: the SDK trusts Capella's CA for them.
const CAPELLA_DOMAIN: &str = ".cloud.couchbase.com";

/// Why the first seed that answers refuses TLS with the roots the SDK
/// uses (exactly `ca_certs` when given, else the web CAs), if its
/// certificate is what fails: the message, with what to set.
pub async fn refused_certificate(
    uri: &str,
    ca_certs: Option<&[CertificateDer<'static>]>,
) -> Option<String> {
    let config = match ca_certs {
        Some(certs) => {
            let roots = crate::tls::roots_of(certs.iter().cloned()).ok()?;
            crate::tls::client_config(roots, "the given CAs").ok()?
        }
        None => crate::tls::client_config_web().ok()?,
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    for (host, port) in seeds(uri) {
        if ca_certs.is_none() && host.to_ascii_lowercase().ends_with(CAPELLA_DOMAIN) {
            return None;
        }
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
