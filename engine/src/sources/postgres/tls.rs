//! TLS for both Postgres sessions (the SQL session and the replication
//! connection) from the libpq settings users already write: `sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey` in the URI's query, as source options
//! of the same names, or in libpq's `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGSSLCERT`, `PGSSLKEY`. The SQL session (sqlx) reads the URI itself;
//! this module puts the options into the URI and gives the replication
//! connection the same settings, so the two never disagree.
//!
//! The default is libpq's, `prefer`: TLS when the server offers it. A
//! connection that ends up unencrypted is said once in the log
//! ([`warn_if_unencrypted`]).

use std::path::PathBuf;
use std::sync::Mutex;

use pgwire_replication::{SslMode, TlsConfig};
use urutau_planner::certificate::Refusal;
use urutau_planner::options::OptionMap;

use crate::sources::SourceError;

/// The libpq settings this module reads, as URI parameters and source
/// options.
pub const SETTINGS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// The libpq environment variable of each of [`SETTINGS`].
fn env_name(setting: &str) -> String {
    format!("PG{}", setting.to_ascii_uppercase())
}

/// `uri` with the source options of [`SETTINGS`] added to its query. A
/// setting given both ways must agree.
pub fn effective_uri(uri: &str, options: &OptionMap) -> Result<String, SourceError> {
    let mut url = url::Url::parse(uri)
        .map_err(|e| SourceError::new(format!("the source uri is not a postgres:// URL: {e}")))?;
    let mut added = Vec::new();
    for name in SETTINGS {
        let Some(value) = options.get(name) else {
            continue;
        };
        match url.query_pairs().find(|(k, _)| k == name) {
            Some((_, in_uri)) if in_uri != value => {
                return Err(SourceError::new(format!(
                    "{name} is `{in_uri}` in the uri and `{value}` as an option; set it once"
                )));
            }
            Some(_) => {}
            None => added.push((name, value.to_string())),
        }
    }
    if added.is_empty() {
        return Ok(uri.to_string());
    }
    {
        let mut query = url.query_pairs_mut();
        for (name, value) in &added {
            query.append_pair(name, value);
        }
    }
    Ok(url.to_string())
}

/// The TLS settings of one source, as libpq would read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// `sslmode` as written (default `prefer`).
    pub mode: String,
    pub root_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// `name`'s value in `url`'s query, or else in libpq's environment
/// (`PG<NAME>`); empty counts as unset.
fn setting(url: &url::Url, name: &str) -> Option<String> {
    url.query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .or_else(|| std::env::var(env_name(name)).ok())
        .filter(|v| !v.is_empty())
}

/// The `sslmode` a connection to `url` uses, as libpq reads it (the uri,
/// else `PGSSLMODE`, else `prefer`), unchecked: what `plan` shows.
pub fn mode(url: &url::Url) -> String {
    setting(url, "sslmode").unwrap_or_else(|| "prefer".into())
}

impl TlsSettings {
    /// The settings `url`'s query (or else libpq's environment) gives;
    /// an unknown `sslmode`, a missing file, or a certificate without its
    /// key is an error naming it.
    pub fn of(url: &url::Url) -> Result<TlsSettings, SourceError> {
        let get = |name: &str| setting(url, name);
        let mode = mode(url);
        if !matches!(
            mode.as_str(),
            "disable" | "allow" | "prefer" | "require" | "verify-ca" | "verify-full"
        ) {
            return Err(SourceError::new(format!(
                "sslmode `{mode}` is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )));
        }
        let file = |name: &str| -> Result<Option<PathBuf>, SourceError> {
            let Some(path) = get(name) else {
                return Ok(None);
            };
            let path = PathBuf::from(path);
            if !path.is_file() {
                return Err(SourceError::new(format!(
                    "{name} `{}` is not a readable file",
                    path.display()
                )));
            }
            Ok(Some(path))
        };
        let settings = TlsSettings {
            mode,
            root_cert: file("sslrootcert")?,
            cert: file("sslcert")?,
            key: file("sslkey")?,
        };
        if settings.cert.is_some() != settings.key.is_some() {
            return Err(SourceError::new(
                "a client certificate needs both sslcert and sslkey".to_string(),
            ));
        }
        Ok(settings)
    }

    /// The replication connection's TLS, connecting to `host`.
    pub fn replication(&self, host: &str) -> TlsConfig {
        let mode = match self.mode.as_str() {
            "disable" => SslMode::Disable,
            // pgwire-replication has no `allow` (plain first, then TLS):
            // `prefer` (TLS first) reaches every server `allow` reaches.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            _ => SslMode::VerifyFull,
        };
        let mut tls = TlsConfig {
            mode,
            ca_pem_path: self.root_cert.clone(),
            ..TlsConfig::default()
        }
        .with_sni_hostname(host);
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.with_client_cert(cert.clone(), key.clone());
        }
        tls
    }

    /// What a failed TLS handshake means, and how to fix it: `error` is
    /// the TLS library's words.
    pub fn explain(&self, error: &str) -> String {
        let roots = match &self.root_cert {
            Some(p) => format!("the CA in sslrootcert `{}`", p.display()),
            None => "the built-in web CAs (no sslrootcert given)".into(),
        };
        match Refusal::in_text(error) {
            Some(Refusal::UnknownIssuer) => {
                return format!(
                    "the server's certificate is not signed by {roots} (sslmode={}); set sslrootcert to the CA that signed it",
                    self.mode
                );
            }
            Some(Refusal::NotValidForName) => {
                return "the server's certificate does not name the host of the uri (sslmode=verify-full checks it); connect by a name the certificate holds, or use verify-ca".to_string();
            }
            Some(Refusal::Expired) => return "the server's certificate has expired".to_string(),
            None => {}
        }
        if error.contains("does not support TLS")
            || error.contains("does not support SSL")
            || error.contains("server does not support")
        {
            format!(
                "the server does not offer TLS, and sslmode={} requires it",
                self.mode
            )
        } else {
            format!("TLS with the server failed (sslmode={})", self.mode)
        }
    }
}

/// Whether an error's text is a TLS handshake that cannot succeed by
/// retrying (a certificate refused by either side, TLS not offered).
pub fn is_handshake_failure(text: &str) -> bool {
    [
        "invalid peer certificate",
        "does not support TLS",
        "does not support SSL",
        "CertificateRequired",
        "BadCertificate",
        "UnknownCA",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// The terminal error of a TLS handshake that failed while `doing`, on
/// the source whose effective URI is `uri`: what it means and how to fix
/// it, then the TLS library's words (credentials removed).
/// A refused certificate is named (subject, issuer, names), read by one
/// more handshake ([`super::tls_probe`]).
pub async fn failed(doing: &str, uri: &str, error: &str) -> SourceError {
    let url = url::Url::parse(uri).ok();
    let mut why = url
        .as_ref()
        .and_then(|u| TlsSettings::of(u).ok())
        .map_or_else(|| "TLS failed".to_string(), |s| s.explain(error));
    if Refusal::in_text(error).is_some()
        && let Some(url) = &url
        && let Some(host) = url.host_str()
        && let Some(seen) = probe(host, url.port().unwrap_or(5432)).await
    {
        why.push_str(&format!("; the server presented a certificate with {seen}"));
    }
    SourceError::new(format!(
        "{doing}: {why} ({})",
        urutau_planner::options::redact_text(error)
    ))
}

/// What the certificate of the Postgres server at `host:port` says.
async fn probe(host: &str, port: u16) -> Option<urutau_planner::certificate::Described> {
    use crate::sources::tls_probe::{Preamble, server_certificate};
    let host = host.to_string();
    tokio::task::spawn_blocking(move || {
        server_certificate(&host, port, Preamble::PostgresSslRequest)
    })
    .await
    .ok()?
}

/// `error` with a hint when the server refused an unencrypted connection
/// (pg_hba.conf has only `hostssl` lines for it: "no encryption").
pub fn with_hint(mut error: SourceError) -> SourceError {
    if error.message.contains("no encryption") {
        error.message.push_str(
            " (the server accepts this connection only over TLS: set sslmode = 'require' or 'verify-full')",
        );
    }
    error
}

/// Sources already said to be unencrypted (once per source a process).
static SAID_UNENCRYPTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Says once, as a warning, that `source`'s connection carries its data
/// unencrypted (the server offered no TLS under `prefer`, or TLS is
/// disabled).
pub async fn warn_if_unencrypted(conn: &mut sqlx::PgConnection, source: &str) {
    let encrypted: Option<bool> =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_optional(&mut *conn)
            .await
            .ok()
            .flatten();
    if encrypted != Some(false) {
        return;
    }
    let mut said = SAID_UNENCRYPTED.lock().unwrap_or_else(|e| e.into_inner());
    if said.iter().any(|s| s == source) {
        return;
    }
    said.push(source.to_string());
    tracing::warn!(
        source,
        "the connection to Postgres is not encrypted; set sslmode = 'require' or 'verify-full' to insist on TLS"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> OptionMap {
        use urutau_planner::diagnostic::Span;
        use urutau_planner::options::OptionValue;
        let mut m = OptionMap::default();
        for (k, v) in pairs {
            m.push(
                *k,
                OptionValue::string(*v),
                Span::default(),
                Span::default(),
            );
        }
        m
    }

    #[test]
    fn options_join_the_uri_and_must_agree_with_it() {
        let uri = "postgres://u:pw@db.example:5432/app?sslmode=require";
        assert_eq!(effective_uri(uri, &options(&[])).unwrap(), uri);
        let both = effective_uri(
            uri,
            &options(&[("sslmode", "require"), ("sslrootcert", "/x/ca.crt")]),
        )
        .unwrap();
        assert!(
            both.ends_with("?sslmode=require&sslrootcert=%2Fx%2Fca.crt"),
            "{both}"
        );
        let e = effective_uri(uri, &options(&[("sslmode", "verify-full")])).unwrap_err();
        assert!(
            e.message.contains("`require` in the uri and `verify-full`"),
            "{e:?}"
        );
        assert!(!e.message.contains("pw"));
    }

    #[test]
    fn settings_are_read_like_libpq_and_checked() {
        let ca = std::env::temp_dir().join(format!("urutau-tls-test-{}.crt", std::process::id()));
        std::fs::write(&ca, "x").unwrap();
        let url = url::Url::parse(&format!(
            "postgres://h/db?sslmode=verify-full&sslrootcert={}",
            ca.display()
        ))
        .unwrap();
        let s = TlsSettings::of(&url).unwrap();
        assert_eq!(s.mode, "verify-full");
        let tls = s.replication("h");
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.ca_pem_path.as_deref(), Some(ca.as_path()));

        let bad = url::Url::parse("postgres://h/db?sslmode=always").unwrap();
        assert!(
            TlsSettings::of(&bad)
                .unwrap_err()
                .message
                .contains("not one of")
        );
        let missing = url::Url::parse("postgres://h/db?sslrootcert=/no/such/ca.crt").unwrap();
        assert!(
            TlsSettings::of(&missing)
                .unwrap_err()
                .message
                .contains("/no/such/ca.crt")
        );
        let half = url::Url::parse(&format!("postgres://h/db?sslcert={}", ca.display())).unwrap();
        assert!(
            TlsSettings::of(&half)
                .unwrap_err()
                .message
                .contains("both sslcert and sslkey")
        );
    }

    #[test]
    fn handshake_failures_say_what_to_fix() {
        let s = TlsSettings {
            mode: "verify-full".into(),
            root_cert: Some("/etc/ca.crt".into()),
            cert: None,
            key: None,
        };
        let m = s.explain("invalid peer certificate: UnknownIssuer");
        assert!(
            m.contains("not signed by the CA in sslrootcert `/etc/ca.crt`"),
            "{m}"
        );
        let m = s.explain("invalid peer certificate: NotValidForName");
        assert!(m.contains("does not name the host"), "{m}");
    }
}
