//! Authentication to a REST catalog: a bearer token given as is, or one
//! obtained with OAuth2 client credentials from the catalog's
//! `/v1/oauth/tokens` endpoint and cached until the catalog refuses it.
//! Neither the token nor the client secret ever appears in an error or a
//! log line.

use tokio::sync::Mutex;
use urutau_planner::sink::SinkError;

use super::http_error;

/// Who the connection authenticates as.
#[derive(Clone, Default)]
pub struct Credentials {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub scope: Option<String>,
    pub token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "***"))
            .field("scope", &self.scope)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The bearer token of a connection.
#[derive(Default)]
pub struct Auth {
    credentials: Credentials,
    cached: Mutex<Option<String>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl Auth {
    pub fn new(credentials: Credentials) -> Self {
        Auth {
            credentials,
            cached: Mutex::new(None),
        }
    }

    /// The token to send (none without credentials), fetched from
    /// `{base}/v1/oauth/tokens` when not cached.
    pub async fn bearer(
        &self,
        http: &reqwest::Client,
        base: &str,
    ) -> Result<Option<String>, SinkError> {
        let c = &self.credentials;
        if let Some(t) = &c.token {
            return Ok(Some(t.clone()));
        }
        let (Some(id), Some(secret)) = (&c.client_id, &c.client_secret) else {
            return Ok(None);
        };
        let mut cached = self.cached.lock().await;
        if let Some(t) = cached.as_ref() {
            return Ok(Some(t.clone()));
        }
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", id.as_str()),
            ("client_secret", secret.as_str()),
            ("scope", c.scope.as_deref().unwrap_or("catalog")),
        ];
        let doing = "authenticating to the REST catalog";
        let response = http
            .post(format!("{base}/v1/oauth/tokens"))
            .form(&form)
            .send()
            .await
            .map_err(http_error(doing))?;
        if !response.status().is_success() {
            return Err(SinkError::Io(format!(
                "{doing}: HTTP {}",
                response.status()
            )));
        }
        let body: serde_json::Value = response.json().await.map_err(http_error(doing))?;
        let token = body["access_token"]
            .as_str()
            .ok_or_else(|| {
                SinkError::Io("the REST catalog's token response has no access_token".into())
            })?
            .to_string();
        *cached = Some(token.clone());
        Ok(Some(token))
    }

    /// Forgets a token the catalog refused (HTTP 401): the next request
    /// gets a new one.
    pub async fn refused(&self) {
        *self.cached.lock().await = None;
    }

    /// `request` with the token, if any.
    pub fn authorize(
        request: reqwest::RequestBuilder,
        token: &Option<String>,
    ) -> reqwest::RequestBuilder {
        match token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }
}
