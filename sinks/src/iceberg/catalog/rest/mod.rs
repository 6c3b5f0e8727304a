//! The REST catalog: tables are created and loaded with
//! `iceberg-catalog-rest`; a commit is our own `POST` of the commit request
//! (requirements + updates) to the table's endpoint, because the crate's
//! `update_table` takes only the crate-private `TableCommit` (no delete
//! files). OAuth2 client credentials or a bearer token authenticate both.
//! Storage is S3 (path-style optional); keys come from the sink's options
//! or the standard AWS environment variables.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{MAIN_BRANCH, TableMetadataBuildResult};
use iceberg::table::Table;
use iceberg::{
    Catalog, CatalogBuilder, NamespaceIdent, Runtime, TableCreation, TableIdent, TableRequirement,
};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, RestCatalog, RestCatalogBuilder,
};
use iceberg_storage_opendal::OpenDalStorageFactory;
use tokio::sync::Mutex;
use urutau_planner::sink::SinkError;

use super::Outcome;
use crate::iceberg::commit::STAGING_BRANCH;
use crate::iceberg::io_error;

/// What a REST catalog connection needs.
#[derive(Debug, Clone)]
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
}

/// A connected REST catalog.
pub struct RestCatalogConn {
    catalog: RestCatalog,
    http: reqwest::Client,
    config: RestConfig,
    /// Path prefix the server assigns to the warehouse (`/v1/config`).
    prefix: Option<String>,
    token: Mutex<Option<String>>,
}

impl std::fmt::Debug for RestCatalogConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestCatalogConn")
            .field("uri", &self.config.uri)
            .finish()
    }
}

fn http_error(doing: &'static str) -> impl Fn(reqwest::Error) -> SinkError {
    // reqwest's messages carry the URL, never credentials (they travel in
    // headers or form bodies).
    move |e| SinkError::Io(format!("{doing}: {}", e.without_url()))
}

impl RestCatalogConn {
    /// Connects: loads the catalog's config (prefix) and authenticates.
    pub async fn connect(config: RestConfig, name: &str) -> Result<Self, SinkError> {
        let mut props: HashMap<String, String> = HashMap::new();
        props.insert("uri".into(), config.uri.clone());
        props.insert("warehouse".into(), config.warehouse.clone());
        if let (Some(id), Some(secret)) = (&config.client_id, &config.client_secret) {
            props.insert("credential".into(), format!("{id}:{secret}"));
        }
        if let Some(scope) = &config.scope {
            props.insert("scope".into(), scope.clone());
        }
        if let Some(token) = &config.token {
            props.insert("token".into(), token.clone());
        }
        let env = |k: &str| std::env::var(k).ok();
        let s3 = [
            ("s3.endpoint", config.s3_endpoint.clone()),
            (
                "s3.region",
                config.s3_region.clone().or_else(|| env("AWS_REGION")),
            ),
            (
                "s3.path-style-access",
                config.s3_path_style.map(|b| b.to_string()),
            ),
            (
                "s3.access-key-id",
                config
                    .s3_access_key_id
                    .clone()
                    .or_else(|| env("AWS_ACCESS_KEY_ID")),
            ),
            (
                "s3.secret-access-key",
                config
                    .s3_secret_access_key
                    .clone()
                    .or_else(|| env("AWS_SECRET_ACCESS_KEY")),
            ),
        ];
        for (k, v) in s3 {
            if let Some(v) = v {
                props.insert(k.into(), v);
            }
        }
        let catalog = RestCatalogBuilder::default()
            .with_storage_factory(Arc::new(OpenDalStorageFactory::S3 {
                customized_credential_load: None,
            }))
            .load(name, props)
            .await
            .map_err(io_error("connecting to the REST catalog"))?;
        let http = reqwest::Client::new();
        let mut conn = RestCatalogConn {
            catalog,
            http,
            config,
            prefix: None,
            token: Mutex::new(None),
        };
        conn.prefix = conn.fetch_prefix().await?;
        Ok(conn)
    }

    fn base(&self) -> &str {
        self.config.uri.trim_end_matches('/')
    }

    async fn bearer(&self) -> Result<Option<String>, SinkError> {
        if let Some(t) = &self.config.token {
            return Ok(Some(t.clone()));
        }
        let (Some(id), Some(secret)) = (&self.config.client_id, &self.config.client_secret) else {
            return Ok(None);
        };
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref() {
            return Ok(Some(t.clone()));
        }
        let mut form = vec![
            ("grant_type", "client_credentials".to_string()),
            ("client_id", id.clone()),
            ("client_secret", secret.clone()),
        ];
        form.push((
            "scope",
            self.config
                .scope
                .clone()
                .unwrap_or_else(|| "catalog".into()),
        ));
        let response = self
            .http
            .post(format!("{}/v1/oauth/tokens", self.base()))
            .form(&form)
            .send()
            .await
            .map_err(http_error("authenticating to the REST catalog"))?;
        if !response.status().is_success() {
            return Err(SinkError::Io(format!(
                "authenticating to the REST catalog: HTTP {}",
                response.status()
            )));
        }
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(http_error("authenticating to the REST catalog"))?;
        let token = body["access_token"]
            .as_str()
            .ok_or_else(|| {
                SinkError::Io("the REST catalog's token response has no access_token".into())
            })?
            .to_string();
        *cached = Some(token.clone());
        Ok(Some(token))
    }

    fn authorized(
        &self,
        request: reqwest::RequestBuilder,
        token: &Option<String>,
    ) -> reqwest::RequestBuilder {
        match token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }

    async fn fetch_prefix(&self) -> Result<Option<String>, SinkError> {
        let token = self.bearer().await?;
        let request = self
            .http
            .get(format!("{}/v1/config", self.base()))
            .query(&[("warehouse", self.config.warehouse.as_str())]);
        let response = self
            .authorized(request, &token)
            .send()
            .await
            .map_err(http_error("reading the REST catalog's config"))?;
        if !response.status().is_success() {
            return Err(SinkError::Io(format!(
                "reading the REST catalog's config: HTTP {}",
                response.status()
            )));
        }
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(http_error("reading the REST catalog's config"))?;
        Ok(body["overrides"]["prefix"]
            .as_str()
            .or_else(|| body["defaults"]["prefix"].as_str())
            .map(str::to_string))
    }

    /// The table, if it exists.
    pub async fn load(&self, ident: &TableIdent) -> Result<Option<Table>, SinkError> {
        let exists = self
            .catalog
            .table_exists(ident)
            .await
            .map_err(io_error("looking the table up"))?;
        if !exists {
            return Ok(None);
        }
        self.catalog
            .load_table(ident)
            .await
            .map(Some)
            .map_err(io_error("loading the table"))
    }

    /// Creates the table (and its namespace when absent).
    pub async fn create(
        &self,
        ident: &TableIdent,
        creation: TableCreation,
    ) -> Result<Table, SinkError> {
        let ns: &NamespaceIdent = ident.namespace();
        if !self
            .catalog
            .namespace_exists(ns)
            .await
            .map_err(io_error("looking the namespace up"))?
        {
            self.catalog
                .create_namespace(ns, HashMap::new())
                .await
                .map_err(io_error("creating the namespace"))?;
        }
        self.catalog
            .create_table(ns, creation)
            .await
            .map_err(io_error("creating the table"))
    }

    /// Posts the change with the requirements that make it atomic: the same
    /// table, and the main branch (and the staging branch, when there is
    /// one) still at the snapshot it was built on.
    pub async fn commit(&self, table: &Table, result: TableMetadataBuildResult) -> Outcome {
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
        let namespace = ident.namespace().join("\u{1f}");
        let url = match &self.prefix {
            Some(p) => format!(
                "{}/v1/{p}/namespaces/{namespace}/tables/{}",
                self.base(),
                ident.name()
            ),
            None => format!(
                "{}/v1/namespaces/{namespace}/tables/{}",
                self.base(),
                ident.name()
            ),
        };
        let token = match self.bearer().await {
            Ok(t) => t,
            Err(e) => return Outcome::Unknown(e),
        };
        let sent = self
            .authorized(self.http.post(url).json(&request), &token)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            // The request may or may not have reached the catalog.
            Err(e) => return Outcome::Unknown(http_error("committing to the REST catalog")(e)),
        };
        let status = response.status();
        if status == reqwest::StatusCode::CONFLICT {
            return Outcome::Conflict;
        }
        if status == reqwest::StatusCode::UNAUTHORIZED {
            *self.token.lock().await = None;
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Outcome::Unknown(SinkError::Io(format!(
                "committing to the REST catalog: HTTP {status}: {}",
                body.chars().take(500).collect::<String>()
            )));
        }
        let committed: CommitTableResponse = match response.json().await {
            Ok(c) => c,
            Err(e) => {
                return Outcome::Unknown(http_error("reading the REST catalog's commit response")(
                    e,
                ));
            }
        };
        let runtime = match Runtime::try_current() {
            Ok(r) => r,
            Err(e) => return Outcome::Unknown(SinkError::Io(e.to_string())),
        };
        match Table::builder()
            .file_io(table.file_io().clone())
            .identifier(ident.clone())
            .metadata(committed.metadata)
            .metadata_location(committed.metadata_location)
            .runtime(runtime)
            .build()
        {
            Ok(t) => Outcome::Committed(t),
            Err(e) => Outcome::Unknown(SinkError::Io(format!("the committed table: {e}"))),
        }
    }
}
