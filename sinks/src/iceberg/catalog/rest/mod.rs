//! The REST catalog, spoken directly over HTTP with the request and response
//! types of `iceberg-catalog-rest` (its client is not used: it creates
//! tables Java-based catalogs refuse, gives every table the one storage of
//! the catalog, ignores vended storage credentials, and its `update_table`
//! takes only the crate-private `TableCommit`, which cannot carry delete
//! files).
//!
//! - `/v1/config` is read once: its `defaults` and `overrides` layer with
//!   the sink's options ([`config`]); the result gives the path prefix, the
//!   URI, and the storage settings of every table.
//! - A table is loaded and created with vended credentials asked for; its
//!   storage follows its location ([`super::storage`]): a local warehouse
//!   (`file://`) through the local file system, S3 with the table's
//!   properties.
//! - A commit is one `POST` of requirements + updates to the table's
//!   endpoint. On a local warehouse the files it adds are made durable
//!   first, under the same rules as the SQL catalog's (the server writes
//!   and syncs — or not — its own metadata file).
//!
//! OAuth2 client credentials or a bearer token authenticate every request
//! ([`auth`]).

mod auth;
pub mod config;
#[cfg(test)]
mod fixture_tests;
mod requests;

use std::collections::HashMap;

use iceberg::spec::{MAIN_BRANCH, TableMetadataBuildResult};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, Runtime, TableCreation, TableIdent, TableRequirement, TableUpdate};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, LoadTableResult,
};
use reqwest::StatusCode;
use urutau_planner::sink::SinkError;

use self::auth::{Auth, Credentials};
use self::config::{ConfigResponse, Props};
use super::{Outcome, storage};
use crate::iceberg::commit::STAGING_BRANCH;
use crate::iceberg::durable;

/// What a REST catalog connection needs.
#[derive(Clone)]
pub struct RestConfig {
    pub uri: String,
    pub warehouse: String,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub scope: Option<String>,
    pub token: Option<String>,
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    pub s3_path_style: Option<bool>,
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    /// The PEM file of the CA whose certificates the https clients, the
    /// catalog's and S3's, trust (`ca_cert`, else `SSL_CERT_FILE`; none:
    /// the catalog client's built-in web CAs, the S3 client's system CAs).
    pub ca_cert: Option<String>,
}

impl std::fmt::Debug for RestConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestConfig")
            .field("uri", &shown(&self.uri))
            .field("warehouse", &self.warehouse)
            .finish_non_exhaustive()
    }
}

impl RestConfig {
    /// The client's own properties (the sink's S3 options, or the standard
    /// AWS environment variables), beneath the server's overrides.
    fn client_props(&self) -> Props {
        let env = |k: &str| std::env::var(k).ok();
        let pairs = [
            (iceberg::io::S3_ENDPOINT, self.s3_endpoint.clone()),
            (
                iceberg::io::S3_REGION,
                self.s3_region.clone().or_else(|| env("AWS_REGION")),
            ),
            (
                iceberg::io::S3_PATH_STYLE_ACCESS,
                self.s3_path_style.map(|b| b.to_string()),
            ),
            (
                iceberg::io::S3_ACCESS_KEY_ID,
                self.s3_access_key_id
                    .clone()
                    .or_else(|| env("AWS_ACCESS_KEY_ID")),
            ),
            (
                iceberg::io::S3_SECRET_ACCESS_KEY,
                self.s3_secret_access_key
                    .clone()
                    .or_else(|| env("AWS_SECRET_ACCESS_KEY")),
            ),
        ];
        pairs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect()
    }
}

/// A connected REST catalog.
pub struct RestCatalogConn {
    http: reqwest::Client,
    /// The catalog's URI (the server's `uri` setting, or the sink's).
    base: String,
    /// Path prefix the server assigns to the warehouse (`/v1/config`).
    prefix: Option<String>,
    /// The catalog's properties ([`config::catalog_props`]).
    props: Props,
    auth: Auth,
    /// Directories of a local warehouse already made durable.
    durable_dirs: durable::DurableDirs,
    /// The CA file the https clients trust, the catalog's and the object
    /// store's (`ca_cert`, else `SSL_CERT_FILE`); none: the catalog
    /// client's built-in web CAs, the S3 client's system CAs.
    ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for RestCatalogConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestCatalogConn")
            .field("uri", &shown(&self.base))
            .finish()
    }
}

/// `uri` with the password of its user info (`https://user:pw@host`)
/// hidden, for logs and errors.
fn shown(uri: &str) -> String {
    match reqwest::Url::parse(uri) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => uri.to_string(),
        Err(_) => "(not a URL)".to_string(),
    }
}

/// A transport error as a sink error, with its causes (a refused
/// certificate is named only there) and, for a refused certificate, what
/// to change. reqwest's messages carry the URL, never credentials (they
/// travel in headers or form bodies); the URL is left out all the same.
fn http_error(doing: &'static str) -> impl Fn(reqwest::Error) -> SinkError {
    move |e| {
        let text = crate::tls::with_causes(&e.without_url());
        match crate::tls::hint(&text, "ca_cert") {
            Some(hint) => SinkError::Io(format!("{doing}: {hint} ({text})")),
            None => SinkError::Io(format!("{doing}: {text}")),
        }
    }
}

/// The catalog's HTTP client: one that trusts exactly the CA in `ca_cert`
/// (else `SSL_CERT_FILE`), or the built-in web CAs without either.
fn http_client(ca_cert: Option<&str>) -> Result<reqwest::Client, SinkError> {
    let tls = match crate::tls::ca_file(ca_cert) {
        Some(ca) => crate::tls::client_config_trusting(&ca)?,
        None => crate::tls::client_config_web()?,
    };
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .map_err(|e| SinkError::Unavailable(format!("the REST catalog's https client: {e}")))
}

/// An unexpected answer as a sink error: the status and the server's own
/// message (an Iceberg `ErrorModel`), shortened.
async fn status_error(doing: &str, response: reqwest::Response) -> SinkError {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            let e = &v["error"];
            Some(format!(
                "{}: {}",
                e["type"].as_str().unwrap_or("error"),
                e["message"].as_str()?
            ))
        })
        .unwrap_or(body);
    SinkError::Io(format!(
        "{doing}: HTTP {status}: {}",
        message.chars().take(500).collect::<String>()
    ))
}

/// Asks the catalog to vend storage credentials with a table (REST spec:
/// access delegation); a catalog that vends none ignores it.
const ACCESS_DELEGATION: (&str, &str) = ("X-Iceberg-Access-Delegation", "vended-credentials");

impl RestCatalogConn {
    /// Connects: authenticates and reads the catalog's config.
    pub async fn connect(config: RestConfig, _name: &str) -> Result<Self, SinkError> {
        let http = http_client(config.ca_cert.as_deref())?;
        let base = config.uri.trim_end_matches('/').to_string();
        let auth = Auth::new(Credentials {
            client_id: config.client_id.clone(),
            client_secret: config.client_secret.clone(),
            scope: config.scope.clone(),
            token: config.token.clone(),
        });
        let doing = "reading the REST catalog's config";
        let token = auth.bearer(&http, &base).await?;
        let mut request = http.get(format!("{base}/v1/config"));
        if !config.warehouse.is_empty() {
            request = request.query(&[("warehouse", config.warehouse.as_str())]);
        }
        let response = Auth::authorize(request, &token)
            .send()
            .await
            .map_err(http_error(doing))?;
        if !response.status().is_success() {
            return Err(status_error(doing, response).await);
        }
        let server: ConfigResponse = response.json().await.map_err(http_error(doing))?;
        let props = config::catalog_props(&server, &config.client_props());
        tracing::debug!(uri = %shown(&base), config = %config::describe(&props), "the REST catalog's config");
        let base = match props.get("uri") {
            Some(uri) if uri.trim_end_matches('/') != base => {
                tracing::info!(from = %shown(&base), to = %shown(uri), "the REST catalog's config moves it to another uri");
                uri.trim_end_matches('/').to_string()
            }
            _ => base,
        };
        Ok(RestCatalogConn {
            http,
            base,
            prefix: props.get("prefix").filter(|p| !p.is_empty()).cloned(),
            props,
            auth,
            durable_dirs: durable::DurableDirs::default(),
            ca_file: crate::tls::ca_file(config.ca_cert.as_deref()),
        })
    }

    /// The URL of `/v1/{prefix}/` followed by `segments` (each encoded as
    /// one path segment: a multi-level namespace joined by 0x1F, as the
    /// REST spec says).
    fn url(&self, segments: &[&str]) -> Result<reqwest::Url, SinkError> {
        let root = match &self.prefix {
            Some(p) => format!("{}/v1/{}", self.base, p.trim_matches('/')),
            None => format!("{}/v1", self.base),
        };
        let shown_root = || shown(&root);
        let mut url = reqwest::Url::parse(&root)
            .map_err(|e| SinkError::Io(format!("the REST catalog's uri: {e}")))?;
        url.path_segments_mut()
            .map_err(|_| {
                SinkError::Io(format!(
                    "the REST catalog's uri {} has no path",
                    shown_root()
                ))
            })?
            .extend(segments);
        Ok(url)
    }

    fn namespace_segment(ns: &NamespaceIdent) -> String {
        ns.join("\u{1f}")
    }

    fn table_url(&self, ident: &TableIdent) -> Result<reqwest::Url, SinkError> {
        self.url(&[
            "namespaces",
            &Self::namespace_segment(ident.namespace()),
            "tables",
            ident.name(),
        ])
    }

    /// Sends what `build` makes (with the token); a token the catalog
    /// refuses is fetched anew and the request sent once more (a refused
    /// request changed nothing).
    async fn send(
        &self,
        doing: &'static str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, SinkError> {
        for _ in 0..2 {
            let token = self.auth.bearer(&self.http, &self.base).await?;
            let response = Auth::authorize(build(), &token)
                .send()
                .await
                .map_err(http_error(doing))?;
            if response.status() == StatusCode::UNAUTHORIZED {
                self.auth.refused().await;
                continue;
            }
            return Ok(response);
        }
        Err(SinkError::Io(format!(
            "{doing}: HTTP 401: the REST catalog refused the credentials"
        )))
    }

    /// A table from a load or create response: its storage follows its
    /// location, with the table's config and vended credentials.
    fn table(&self, ident: &TableIdent, loaded: LoadTableResult) -> Result<Table, SinkError> {
        let location = loaded.metadata.location().to_string();
        let props = config::table_props(
            &self.props,
            &loaded.config,
            loaded.storage_credentials.as_deref(),
            &location,
        );
        let file_io = storage::file_io(&location, &props, self.ca_file.as_deref())?;
        let err = |e: iceberg::Error| SinkError::Io(format!("loading {ident}: {e}"));
        let builder = Table::builder()
            .identifier(ident.clone())
            .file_io(file_io)
            .metadata(loaded.metadata)
            .runtime(Runtime::try_current().map_err(err)?);
        match loaded.metadata_location {
            Some(m) => builder.metadata_location(m).build(),
            None => builder.build(),
        }
        .map_err(err)
    }

    /// The table, if it exists.
    pub async fn load(&self, ident: &TableIdent) -> Result<Option<Table>, SinkError> {
        let doing = "loading the table";
        let url = self.table_url(ident)?;
        let response = self
            .send(doing, || {
                self.http
                    .get(url.clone())
                    .header(ACCESS_DELEGATION.0, ACCESS_DELEGATION.1)
            })
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => {
                let loaded: LoadTableResult = response.json().await.map_err(http_error(doing))?;
                self.table(ident, loaded).map(Some)
            }
            _ => Err(status_error(doing, response).await),
        }
    }

    /// Creates the namespace unless it exists.
    async fn ensure_namespace(&self, ns: &NamespaceIdent) -> Result<(), SinkError> {
        let doing = "looking the namespace up";
        let url = self.url(&["namespaces", &Self::namespace_segment(ns)])?;
        let response = self.send(doing, || self.http.get(url.clone())).await?;
        match response.status() {
            s if s.is_success() => return Ok(()),
            StatusCode::NOT_FOUND => {}
            _ => return Err(status_error(doing, response).await),
        }
        let doing = "creating the namespace";
        let body = CreateNamespaceRequest {
            namespace: ns.clone(),
            properties: HashMap::new(),
        };
        let url = self.url(&["namespaces"])?;
        let response = self
            .send(doing, || self.http.post(url.clone()).json(&body))
            .await?;
        match response.status() {
            // Another writer created it meanwhile.
            s if s.is_success() || s == StatusCode::CONFLICT => Ok(()),
            _ => Err(status_error(doing, response).await),
        }
    }

    /// Creates the table (and its namespace when absent). A table another
    /// writer created meanwhile is loaded instead (the caller checks it).
    pub async fn create(
        &self,
        ident: &TableIdent,
        creation: TableCreation,
    ) -> Result<Table, SinkError> {
        let ns = ident.namespace();
        self.ensure_namespace(ns).await?;
        let doing = "creating the table";
        let body = requests::create_table(creation);
        let url = self.url(&["namespaces", &Self::namespace_segment(ns), "tables"])?;
        let response = self
            .send(doing, || {
                self.http
                    .post(url.clone())
                    .header(ACCESS_DELEGATION.0, ACCESS_DELEGATION.1)
                    .json(&body)
            })
            .await?;
        match response.status() {
            StatusCode::CONFLICT => self.load(ident).await?.ok_or_else(|| {
                SinkError::Io(format!(
                    "{doing}: the catalog says {ident} exists, and then that it does not"
                ))
            }),
            s if s.is_success() => {
                let created: LoadTableResult = response.json().await.map_err(http_error(doing))?;
                self.table(ident, created)
            }
            _ => Err(status_error(doing, response).await),
        }
    }

    /// On a local warehouse, makes the directory entries of the files the
    /// commit adds durable before the catalog can point at them: `added`
    /// (data and delete files) and each new snapshot's manifest list, whose
    /// directory holds the manifests written with it. Their contents were
    /// synced in the background since they were written
    /// ([`durable::sync_local`] waits for that).
    async fn sync_local_files(
        &self,
        table: &Table,
        changes: &[TableUpdate],
        added: &[String],
    ) -> Result<(), SinkError> {
        let root = table.metadata().location();
        if storage::kind(root)? != storage::Kind::Local {
            return Ok(());
        }
        let mut entries = added.to_vec();
        for change in changes {
            if let TableUpdate::AddSnapshot { snapshot } = change {
                entries.push(snapshot.manifest_list().to_string());
            }
        }
        durable::sync_local(vec![], entries, root, &self.durable_dirs).await
    }

    /// Posts the change with the requirements that make it atomic: the same
    /// table, and the main branch (and the staging branch, when there is
    /// one) still at the snapshot it was built on. `added` are the data and
    /// delete files the change adds.
    pub async fn commit(
        &self,
        table: &Table,
        result: TableMetadataBuildResult,
        added: &[String],
    ) -> Outcome {
        if let Err(e) = self.sync_local_files(table, &result.changes, added).await {
            // Nothing was sent.
            return Outcome::Unknown(e);
        }
        let md = table.metadata();
        let mut requirements = vec![
            TableRequirement::UuidMatch { uuid: md.uuid() },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: MAIN_BRANCH.to_string(),
                snapshot_id: md.current_snapshot_id(),
            },
        ];
        if let Some(staged) = md.snapshot_for_ref(STAGING_BRANCH) {
            requirements.push(TableRequirement::RefSnapshotIdMatch {
                r#ref: STAGING_BRANCH.to_string(),
                snapshot_id: Some(staged.snapshot_id()),
            });
        }
        let request = CommitTableRequest {
            identifier: Some(table.identifier().clone()),
            requirements,
            updates: result.changes,
        };
        let ident = table.identifier();
        let doing = "committing to the REST catalog";
        let url = match self.table_url(ident) {
            Ok(u) => u,
            Err(e) => return Outcome::Unknown(e),
        };
        let token = match self.auth.bearer(&self.http, &self.base).await {
            Ok(t) => t,
            Err(e) => return Outcome::Unknown(e),
        };
        let sent = Auth::authorize(self.http.post(url).json(&request), &token)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            // The request may or may not have reached the catalog.
            Err(e) => return Outcome::Unknown(http_error(doing)(e)),
        };
        let status = response.status();
        if status == StatusCode::CONFLICT {
            return Outcome::Conflict;
        }
        if status == StatusCode::UNAUTHORIZED {
            self.auth.refused().await;
        }
        if !status.is_success() {
            return Outcome::Unknown(status_error(doing, response).await);
        }
        let committed: CommitTableResponse = match response.json().await {
            Ok(c) => c,
            Err(e) => {
                return Outcome::Unknown(http_error("reading the REST catalog's commit response")(
                    e,
                ));
            }
        };
        match crate::iceberg::commit::committed_table(
            table,
            committed.metadata,
            committed.metadata_location,
        ) {
            Ok(t) => Outcome::Committed(t),
            Err(e) => Outcome::Unknown(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(base: &str, prefix: Option<&str>) -> RestCatalogConn {
        RestCatalogConn {
            http: reqwest::Client::new(),
            base: base.to_string(),
            prefix: prefix.map(str::to_string),
            props: Props::new(),
            auth: Auth::default(),
            durable_dirs: durable::DurableDirs::default(),
            ca_file: None,
        }
    }

    #[test]
    fn a_uri_password_is_never_shown() {
        let shown = format!(
            "{:?} {}",
            conn("https://admin:hunter22@catalog.example/api", None),
            super::shown("https://admin:hunter22@catalog.example/api")
        );
        assert!(!shown.contains("hunter22"), "{shown}");
        assert!(shown.contains("admin:***@catalog.example"), "{shown}");
    }

    #[test]
    fn urls_carry_the_prefix_and_encode_names() {
        let ident = TableIdent::from_strs(["a", "b c", "items"]).unwrap();
        assert_eq!(
            conn("http://h:1/cat", Some("wh/1"))
                .table_url(&ident)
                .unwrap()
                .as_str(),
            "http://h:1/cat/v1/wh/1/namespaces/a%1Fb%20c/tables/items"
        );
        let ident = TableIdent::from_strs(["bronze", "t/x"]).unwrap();
        assert_eq!(
            conn("http://h:1", None).table_url(&ident).unwrap().as_str(),
            "http://h:1/v1/namespaces/bronze/tables/t%2Fx"
        );
    }

    #[test]
    fn the_sink_options_are_the_client_props_and_no_secret_is_shown() {
        let config = RestConfig {
            uri: "http://h".into(),
            warehouse: "w".into(),
            client_id: Some("id".into()),
            client_secret: Some("client-secret".into()),
            scope: None,
            token: Some("bearer-token".into()),
            s3_endpoint: Some("http://s3".into()),
            s3_region: Some("r".into()),
            s3_path_style: Some(true),
            s3_access_key_id: Some("ak".into()),
            s3_secret_access_key: Some("s3-secret".into()),
            ca_cert: None,
        };
        let props = config.client_props();
        assert_eq!(props["s3.endpoint"], "http://s3");
        assert_eq!(props["s3.path-style-access"], "true");
        assert_eq!(props["s3.secret-access-key"], "s3-secret");
        let shown = format!("{config:?} {}", config::describe(&props));
        for secret in ["client-secret", "bearer-token", "s3-secret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        let creds = Credentials {
            client_secret: config.client_secret.clone(),
            token: config.token.clone(),
            ..Credentials::default()
        };
        let shown = format!("{creds:?}");
        assert!(!shown.contains("client-secret") && !shown.contains("bearer-token"));
    }
}
