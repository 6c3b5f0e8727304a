//! How the Kafka source authenticates and encrypts its broker connections
//! (issues 14 and 20): SASL (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`)
//! and TLS, from the source options, as librdkafka settings.
//!
//! `security.protocol` follows from the options: a SASL mechanism makes it
//! `sasl_*`, `tls = true` or any `tls_*` option makes it `*ssl`. With TLS the
//! broker's certificate is always verified (against `tls_ca`, else the
//! system's CAs) and must name the host connected to: no option turns
//! either check off. Passwords are secrets: they are never printed, and the
//! settings' `Debug` masks them.

use std::fmt;
use std::path::{Path, PathBuf};

use rdkafka::ClientConfig;
use urutau_planner::diagnostic::{Diagnostic, Diagnostics, Span};
use urutau_planner::options::{OptionDef, OptionMap, OptionType};
use urutau_planner::spec::SourceSpec;

/// The SASL mechanisms the bundled librdkafka offers without Cyrus SASL.
pub const MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// The source options of this module.
pub fn options() -> Vec<OptionDef> {
    use OptionType as T;
    vec![
        OptionDef::new(
            "sasl_mechanism",
            T::Enum(MECHANISMS),
            "authenticate with SASL: PLAIN or SCRAM-SHA-256/512 (needs sasl_username and sasl_password)",
        ),
        OptionDef::new("sasl_username", T::String, "the SASL user"),
        OptionDef::new(
            "sasl_password",
            T::String,
            "the SASL user's password (a secret: env('VAR') keeps it out of the file)",
        )
        .secret(),
        OptionDef::new(
            "tls",
            T::Bool,
            "encrypt the connections with TLS, verifying the brokers' certificates and host names (implied by any tls_* option)",
        ),
        OptionDef::new(
            "tls_ca",
            T::String,
            "the PEM file of the CA(s) that signed the brokers' certificates (default: the system's CAs); an https schema_registry trusts it too",
        ),
        OptionDef::new(
            "tls_cert",
            T::String,
            "this client's certificate (PEM) for brokers that require one (mutual TLS); needs tls_key",
        ),
        OptionDef::new("tls_key", T::String, "the private key (PEM) of tls_cert"),
        OptionDef::new(
            "tls_key_password",
            T::String,
            "the password of an encrypted tls_key",
        )
        .secret(),
    ]
}

/// A secret text: its `Debug` form is `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// SASL authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sasl {
    /// One of [`MECHANISMS`].
    pub mechanism: String,
    pub username: String,
    pub password: Secret,
}

/// TLS: the brokers' CA and this client's certificate, if any.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tls {
    /// `None`: the system's CAs.
    pub ca: Option<PathBuf>,
    /// Certificate and key, for mutual TLS.
    pub client: Option<(PathBuf, PathBuf)>,
    pub key_password: Option<Secret>,
}

/// The security settings of one Kafka source.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Security {
    pub sasl: Option<Sasl>,
    pub tls: Option<Tls>,
}

/// One thing wrong with the options: the option to point at, the message,
/// what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub option: &'static str,
    pub message: String,
    pub help: Option<String>,
    /// The problem is the value (a file), not the option's presence.
    pub at_value: bool,
}

impl Problem {
    fn new(option: &'static str, message: impl Into<String>) -> Self {
        Problem {
            option,
            message: message.into(),
            help: None,
            at_value: false,
        }
    }

    fn at_value(mut self) -> Self {
        self.at_value = true;
        self
    }

    fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

const TLS_FILES: [&str; 3] = ["tls_ca", "tls_cert", "tls_key"];

impl Security {
    /// The settings `options` give, or every problem with them: a SASL
    /// option without the others, half a client certificate, `tls = false`
    /// beside a `tls_*` option, a file that cannot be read.
    pub fn parse(options: &OptionMap) -> Result<Security, Vec<Problem>> {
        let mut problems = Vec::new();
        let get = |name: &str| options.get(name).filter(|v| !v.is_empty());

        let mechanism = get("sasl_mechanism");
        let username = get("sasl_username");
        let password = get("sasl_password");
        let sasl = match (mechanism, username, password) {
            (Some(m), Some(u), Some(p)) => Some(Sasl {
                mechanism: m.to_string(),
                username: u.to_string(),
                password: Secret(p.to_string()),
            }),
            (Some(m), u, p) => {
                let missing: Vec<&str> = [("sasl_username", u), ("sasl_password", p)]
                    .iter()
                    .filter(|(_, v)| v.is_none())
                    .map(|(n, _)| *n)
                    .collect();
                problems.push(
                    Problem::new(
                        "sasl_mechanism",
                        format!("sasl_mechanism = '{m}' needs {}", missing.join(" and ")),
                    )
                    .help(format!(
                        "add {}",
                        missing
                            .iter()
                            .map(|n| format!("{n} = '...'"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                );
                None
            }
            (None, u, p) => {
                for (name, v) in [("sasl_username", u), ("sasl_password", p)] {
                    if v.is_some() {
                        problems.push(
                            Problem::new(
                                name,
                                format!("{name} is for SASL authentication, and no sasl_mechanism is set"),
                            )
                            .help(format!("add sasl_mechanism = one of {}", MECHANISMS.join(", "))),
                        );
                    }
                }
                None
            }
        };

        let file = |name: &'static str, problems: &mut Vec<Problem>| -> Option<PathBuf> {
            let path = PathBuf::from(get(name)?);
            match std::fs::File::open(&path) {
                Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => Some(path),
                Ok(_) => {
                    problems.push(
                        Problem::new(name, format!("{name} `{}` is not a file", path.display()))
                            .at_value(),
                    );
                    None
                }
                Err(e) => {
                    problems.push(
                        Problem::new(
                            name,
                            format!("{name} `{}` cannot be read: {e}", path.display()),
                        )
                        .at_value(),
                    );
                    None
                }
            }
        };
        let ca = file("tls_ca", &mut problems);
        let cert = file("tls_cert", &mut problems);
        let key = file("tls_key", &mut problems);
        let key_password = get("tls_key_password").map(|p| Secret(p.to_string()));
        for (have, lacks) in
            [("tls_cert", "tls_key"), ("tls_key", "tls_cert")] as [(&'static str, &str); 2]
        {
            if get(have).is_some() && get(lacks).is_none() {
                problems.push(
                    Problem::new(
                        have,
                        format!("a client certificate needs both tls_cert and tls_key; {lacks} is missing"),
                    )
                    .help(format!("add {lacks} = '...'")),
                );
            }
        }
        if key_password.is_some() && get("tls_key").is_none() {
            problems.push(Problem::new(
                "tls_key_password",
                "tls_key_password is the password of tls_key, which is not set",
            ));
        }
        let any_tls_option = TLS_FILES
            .iter()
            .chain(&["tls_key_password"])
            .find(|n| get(n).is_some());
        let tls_flag = get("tls").map(|v| v.eq_ignore_ascii_case("true"));
        if let (Some(false), Some(name)) = (tls_flag, any_tls_option) {
            problems.push(
                Problem::new(
                    "tls",
                    format!("tls = false, but {name} is set: TLS options need TLS"),
                )
                .help(format!("remove tls = false, or remove {name}")),
            );
        }
        let tls = (tls_flag == Some(true) || any_tls_option.is_some()).then(|| Tls {
            ca,
            client: cert.zip(key),
            key_password,
        });
        if problems.is_empty() {
            Ok(Security { sasl, tls })
        } else {
            Err(problems)
        }
    }

    /// librdkafka's `security.protocol`.
    pub fn protocol(&self) -> &'static str {
        match (&self.sasl, &self.tls) {
            (None, None) => "plaintext",
            (None, Some(_)) => "ssl",
            (Some(_), None) => "sasl_plaintext",
            (Some(_), Some(_)) => "sasl_ssl",
        }
    }

    /// Puts the settings into a librdkafka client configuration.
    pub fn configure(&self, cfg: &mut ClientConfig) {
        cfg.set("security.protocol", self.protocol());
        if let Some(sasl) = &self.sasl {
            cfg.set("sasl.mechanisms", &sasl.mechanism)
                .set("sasl.username", &sasl.username)
                .set("sasl.password", sasl.password.expose());
        }
        if let Some(tls) = &self.tls {
            // librdkafka's defaults, stated: the chain is verified and the
            // certificate must name the host (bootstrap or advertised).
            cfg.set("enable.ssl.certificate.verification", "true")
                .set("ssl.endpoint.identification.algorithm", "https");
            if let Some(ca) = &tls.ca {
                cfg.set("ssl.ca.location", path_text(ca));
            }
            if let Some((cert, key)) = &tls.client {
                cfg.set("ssl.certificate.location", path_text(cert))
                    .set("ssl.key.location", path_text(key));
            }
            if let Some(p) = &tls.key_password {
                cfg.set("ssl.key.password", p.expose());
            }
        }
    }

    /// What EXPLAIN shows: the protocol and the mechanism, never a secret.
    pub fn describe(&self) -> String {
        match &self.sasl {
            Some(s) => format!(
                "security={}, sasl_mechanism={}",
                self.protocol(),
                s.mechanism
            ),
            None => format!("security={}", self.protocol()),
        }
    }

    /// The CA file brokers are verified with, if one is given.
    pub fn ca(&self) -> Option<&Path> {
        self.tls.as_ref()?.ca.as_deref()
    }

    /// The secret values, to mask in any text the client hands back.
    pub fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(s) = &self.sasl {
            out.push(s.password.expose().to_string());
        }
        if let Some(p) = self.tls.as_ref().and_then(|t| t.key_password.as_ref()) {
            out.push(p.expose().to_string());
        }
        out.retain(|s| !s.is_empty());
        out
    }
}

fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The source rule: [`Security::parse`]'s problems as diagnostics at the
/// option they concern.
pub fn security_options(source: &SourceSpec, d: &mut Diagnostics) {
    let Err(problems) = Security::parse(&source.options) else {
        return;
    };
    for p in problems {
        let span: Span = source
            .options
            .entry(p.option)
            .map_or(source.name.span, |e| {
                if p.at_value {
                    e.value_span
                } else {
                    e.name_span
                }
            });
        d.push(
            Diagnostic::error(span, format!("source `{}`: {}", source.name, p.message))
                .with_help_opt(p.help),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use urutau_planner::options::OptionValue;

    fn options(pairs: &[(&str, &str)]) -> OptionMap {
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

    /// A readable file, named for the test and the process.
    fn file(name: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("urutau-kafka-{name}-{}.pem", std::process::id()));
        std::fs::write(&p, "x").unwrap();
        p
    }

    fn messages(pairs: &[(&str, &str)]) -> Vec<String> {
        Security::parse(&options(pairs))
            .unwrap_err()
            .into_iter()
            .map(|p| format!("{}: {}", p.option, p.message))
            .collect()
    }

    #[test]
    fn the_protocol_follows_the_options() {
        let file = file("protocol");
        let path = file.to_str().unwrap();
        let protocol =
            |pairs: &[(&str, &str)]| Security::parse(&options(pairs)).unwrap().protocol();
        assert_eq!(protocol(&[]), "plaintext");
        assert_eq!(protocol(&[("tls", "true")]), "ssl");
        assert_eq!(protocol(&[("tls", "false")]), "plaintext");
        assert_eq!(protocol(&[("tls_ca", path)]), "ssl");
        let sasl = [
            ("sasl_mechanism", "SCRAM-SHA-256"),
            ("sasl_username", "u"),
            ("sasl_password", "pw-123"),
        ];
        assert_eq!(protocol(&sasl), "sasl_plaintext");
        let with_tls = [sasl.as_slice(), &[("tls_ca", path)]].concat();
        let s = Security::parse(&options(&with_tls)).unwrap();
        assert_eq!(s.protocol(), "sasl_ssl");
        assert_eq!(
            s.describe(),
            "security=sasl_ssl, sasl_mechanism=SCRAM-SHA-256"
        );
        assert_eq!(s.secrets(), vec!["pw-123".to_string()]);
        assert!(!format!("{s:?}").contains("pw-123"), "{s:?}");
        let mut cfg = ClientConfig::new();
        s.configure(&mut cfg);
        assert_eq!(cfg.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(cfg.get("sasl.mechanisms"), Some("SCRAM-SHA-256"));
        assert_eq!(cfg.get("ssl.ca.location"), Some(path));
        assert_eq!(
            cfg.get("ssl.endpoint.identification.algorithm"),
            Some("https")
        );
        assert_eq!(cfg.get("enable.ssl.certificate.verification"), Some("true"));
    }

    #[test]
    fn bad_combinations_are_named() {
        let file = file("combinations");
        let path = file.to_str().unwrap();
        assert_eq!(
            messages(&[("sasl_mechanism", "PLAIN"), ("sasl_username", "u")]),
            ["sasl_mechanism: sasl_mechanism = 'PLAIN' needs sasl_password"]
        );
        assert_eq!(
            messages(&[("sasl_password", "pw")]),
            [
                "sasl_password: sasl_password is for SASL authentication, and no sasl_mechanism is set"
            ]
        );
        assert_eq!(
            messages(&[("tls_cert", path)]),
            ["tls_cert: a client certificate needs both tls_cert and tls_key; tls_key is missing"]
        );
        assert_eq!(
            messages(&[("tls", "false"), ("tls_ca", path)]),
            ["tls: tls = false, but tls_ca is set: TLS options need TLS"]
        );
        let missing = messages(&[("tls_ca", "/no/such/ca.pem")]);
        assert_eq!(missing.len(), 1);
        assert!(
            missing[0].starts_with("tls_ca: tls_ca `/no/such/ca.pem` cannot be read"),
            "{missing:?}"
        );
        let dir = std::env::temp_dir();
        let not_file = messages(&[("tls_ca", dir.to_str().unwrap())]);
        assert!(not_file[0].ends_with("is not a file"), "{not_file:?}");
    }
}
