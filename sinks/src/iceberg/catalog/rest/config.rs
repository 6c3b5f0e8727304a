//! The properties a REST catalog connection and each of its tables work
//! with, layered as the REST spec (and Iceberg's Java client) layer them:
//!
//! - catalog: the server's `/v1/config` `defaults`, then the client's own
//!   properties (the sink's options), then the server's `overrides` — which
//!   may set the path `prefix` and the `uri` every later request goes to;
//! - table (its storage): the catalog's, then the `config` of the table's
//!   load (or create, or commit) response, then the storage credential the
//!   server vends for the longest prefix of the table's location.
//!
//! A layer that sets an access key replaces the whole key set below it: a
//! session token of a lower layer never travels with another layer's keys.

use std::collections::HashMap;

use iceberg::io::{S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN};
use iceberg_catalog_rest::StorageCredential;

/// Properties (`s3.endpoint`, `prefix`, ...).
pub type Props = HashMap<String, String>;

/// `/v1/config`'s answer.
#[derive(Debug, Default, serde::Deserialize)]
pub struct ConfigResponse {
    #[serde(default)]
    pub defaults: Props,
    #[serde(default)]
    pub overrides: Props,
}

/// Keys whose values are secrets: never logged, never in an error.
const SECRET_KEYS: &[&str] = &[
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
    "token",
    "credential",
    "gcs.oauth2.token",
];

/// Whether `key`'s value must never be shown.
pub fn is_secret(key: &str) -> bool {
    SECRET_KEYS.contains(&key) || key.contains("secret") || key.contains("token")
}

/// The keys of `props`, with the values of secret ones hidden (for logs).
pub fn describe(props: &Props) -> String {
    let mut keys: Vec<String> = props
        .iter()
        .map(|(k, v)| {
            if is_secret(k) {
                format!("{k}=***")
            } else {
                format!("{k}={v}")
            }
        })
        .collect();
    keys.sort();
    keys.join(", ")
}

/// `base` with `layer` on top (see the module doc for access keys).
fn overlay(mut base: Props, layer: &Props) -> Props {
    if layer.contains_key(S3_ACCESS_KEY_ID) && !layer.contains_key(S3_SESSION_TOKEN) {
        base.remove(S3_SESSION_TOKEN);
    }
    base.extend(layer.iter().map(|(k, v)| (k.clone(), v.clone())));
    base
}

/// The catalog's properties: `defaults` < the client's < `overrides`.
pub fn catalog_props(server: &ConfigResponse, client: &Props) -> Props {
    overlay(overlay(server.defaults.clone(), client), &server.overrides)
}

/// The properties of a table's storage: the catalog's, then the table's
/// `config`, then the vended credential whose prefix is the longest that
/// `location` starts with.
pub fn table_props(
    catalog: &Props,
    table_config: &Props,
    credentials: Option<&[StorageCredential]>,
    location: &str,
) -> Props {
    let props = overlay(catalog.clone(), table_config);
    let best = credentials
        .unwrap_or_default()
        .iter()
        .filter(|c| location.starts_with(&c.prefix))
        .max_by_key(|c| c.prefix.len());
    match best {
        Some(c) => overlay(props, &c.config),
        None => props,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> Props {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn overrides_beat_the_client_which_beats_defaults() {
        let server = ConfigResponse {
            defaults: props(&[
                ("s3.region", "eu-west-1"),
                ("clients", "4"),
                ("prefix", "d"),
            ]),
            overrides: props(&[("prefix", "wh-1"), ("s3.endpoint", "http://s3.internal")]),
        };
        let client = props(&[("s3.region", "us-east-1"), ("s3.endpoint", "http://mine")]);
        assert_eq!(
            catalog_props(&server, &client),
            props(&[
                ("s3.region", "us-east-1"),
                ("clients", "4"),
                ("prefix", "wh-1"),
                ("s3.endpoint", "http://s3.internal"),
            ])
        );
        // No answer: the client's own.
        assert_eq!(catalog_props(&ConfigResponse::default(), &client), client);
    }

    #[test]
    fn the_table_config_then_the_longest_matching_credential_win() {
        let catalog = props(&[
            ("s3.region", "us-east-1"),
            ("s3.access-key-id", "mine"),
            ("s3.secret-access-key", "my-secret"),
        ]);
        let table = props(&[("s3.endpoint", "http://t")]);
        let credentials = vec![
            StorageCredential {
                prefix: "s3://b/".into(),
                config: props(&[
                    ("s3.access-key-id", "bucket"),
                    ("s3.secret-access-key", "bucket-secret"),
                    ("s3.session-token", "bucket-token"),
                ]),
            },
            StorageCredential {
                prefix: "s3://b/ns/t".into(),
                config: props(&[
                    ("s3.access-key-id", "table"),
                    ("s3.secret-access-key", "table-secret"),
                    ("s3.session-token", "table-token"),
                ]),
            },
            StorageCredential {
                prefix: "s3://other/".into(),
                config: props(&[("s3.access-key-id", "other")]),
            },
        ];
        let got = table_props(&catalog, &table, Some(&credentials), "s3://b/ns/t");
        assert_eq!(
            got,
            props(&[
                ("s3.region", "us-east-1"),
                ("s3.endpoint", "http://t"),
                ("s3.access-key-id", "table"),
                ("s3.secret-access-key", "table-secret"),
                ("s3.session-token", "table-token"),
            ])
        );
        // Another table of the bucket: the bucket's credential.
        let got = table_props(&catalog, &table, Some(&credentials), "s3://b/ns/u");
        assert_eq!(got["s3.access-key-id"], "bucket");
        // None matches: the catalog's keys.
        let got = table_props(&catalog, &Props::new(), Some(&credentials), "s3://c/t");
        assert_eq!(got, catalog);
    }

    #[test]
    fn keys_from_a_layer_drop_a_lower_session_token() {
        let catalog = props(&[
            ("s3.access-key-id", "temp"),
            ("s3.secret-access-key", "temp-secret"),
            ("s3.session-token", "temp-token"),
        ]);
        // The table's config vends long-lived keys (as Iceberg's fixture
        // does with include-credentials): no token goes with them.
        let table = props(&[
            ("s3.access-key-id", "key"),
            ("s3.secret-access-key", "secret"),
        ]);
        let got = table_props(&catalog, &table, None, "s3://b/t");
        assert_eq!(
            got,
            props(&[
                ("s3.access-key-id", "key"),
                ("s3.secret-access-key", "secret")
            ])
        );
    }

    #[test]
    fn secrets_are_hidden() {
        let p = props(&[
            ("s3.secret-access-key", "S"),
            ("s3.session-token", "T"),
            ("token", "B"),
            ("s3.access-key-id", "AK"),
            ("prefix", "p"),
        ]);
        let shown = describe(&p);
        assert_eq!(
            shown,
            "prefix=p, s3.access-key-id=AK, s3.secret-access-key=***, s3.session-token=***, token=***"
        );
    }
}
