//! S3 storage whose https client trusts a CA file of the user's (`ca_cert`,
//! else `SSL_CERT_FILE`): an object store behind a company or test CA.
//!
//! iceberg-storage-opendal builds its OpenDAL operators with OpenDAL's
//! global HTTP client, which no option reaches. This storage builds the
//! same kind of operator (OpenDAL's S3 service, configured from the same
//! Iceberg properties) with an HTTP client of ours that trusts exactly the
//! certificates of the CA file, as the REST catalog's client does. One
//! operator per bucket, built on first use.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    CLIENT_REGION, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, S3_ACCESS_KEY_ID,
    S3_ALLOW_ANONYMOUS, S3_ASSUME_ROLE_ARN, S3_ASSUME_ROLE_EXTERNAL_ID,
    S3_ASSUME_ROLE_SESSION_NAME, S3_DISABLE_CONFIG_LOAD, S3_DISABLE_EC2_METADATA, S3_ENDPOINT,
    S3_PATH_STYLE_ACCESS, S3_REGION, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN, S3_SSE_KEY,
    S3_SSE_MD5, S3_SSE_TYPE, Storage, StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use opendal::layers::{HttpClientLayer, RetryLayer, TimeoutLayer};
use opendal::raw::HttpClient;
use opendal::services::S3Config;
use opendal::{Configurator, Operator};
use serde::{Deserialize, Serialize};

/// Builds [`TrustingS3`] storage for a `FileIO`: S3 through a client that
/// trusts the CA file `ca_file`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrustingS3Factory {
    pub ca_file: PathBuf,
}

#[typetag::serde(name = "UrutauTrustingS3Factory")]
impl StorageFactory for TrustingS3Factory {
    fn build(&self, config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(TrustingS3 {
            config: s3_config(config.props())?,
            ca_file: self.ca_file.clone(),
            operators: Arc::default(),
        }))
    }
}

/// S3 (`s3://`, `s3a://`, `s3n://` locations) through OpenDAL, its https
/// client trusting exactly the certificates of `ca_file`.
#[derive(Clone, Serialize, Deserialize)]
pub struct TrustingS3 {
    config: S3Config,
    ca_file: PathBuf,
    /// Operators by bucket, built on first use (not serialized: rebuilt).
    #[serde(skip)]
    operators: Arc<Mutex<HashMap<String, Operator>>>,
}

impl std::fmt::Debug for TrustingS3 {
    /// Without the keys: `S3Config`'s own form leaves them out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustingS3")
            .field("config", &self.config)
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

/// An error of this storage, in iceberg's terms.
fn invalid(message: String) -> Error {
    Error::new(ErrorKind::DataInvalid, message)
}

/// An OpenDAL error in iceberg's terms, its cause kept (the sink's error
/// mapping reads a refused certificate from the causes).
fn io(e: opendal::Error) -> Error {
    Error::new(ErrorKind::Unexpected, "S3 request failed").with_source(e)
}

/// Whether an Iceberg boolean property is set.
fn truthy(v: &str) -> bool {
    matches!(v.to_ascii_lowercase().as_str(), "true" | "t" | "1" | "on")
}

/// OpenDAL's S3 configuration from the table's Iceberg S3 properties
/// (`s3.endpoint`, `s3.access-key-id`, ...), read as
/// iceberg-storage-opendal reads them, so a table is configured the same
/// with and without a CA file (with one, requests also get OpenDAL's
/// timeout and retry layers, which iceberg-storage-opendal's do not).
/// Addressing is virtual-host style unless
/// `s3.path-style-access` (Iceberg's default).
pub fn s3_config(props: &HashMap<String, String>) -> Result<S3Config> {
    let get = |k: &str| props.get(k).cloned();
    let on = |k: &str| props.get(k).is_some_and(|v| truthy(v));
    let mut c = S3Config::default();
    c.endpoint = get(S3_ENDPOINT);
    c.access_key_id = get(S3_ACCESS_KEY_ID);
    c.secret_access_key = get(S3_SECRET_ACCESS_KEY);
    c.session_token = get(S3_SESSION_TOKEN);
    c.region = get(CLIENT_REGION).or_else(|| get(S3_REGION));
    c.enable_virtual_host_style = !on(S3_PATH_STYLE_ACCESS);
    c.role_arn = get(S3_ASSUME_ROLE_ARN);
    c.external_id = get(S3_ASSUME_ROLE_EXTERNAL_ID);
    c.role_session_name = get(S3_ASSUME_ROLE_SESSION_NAME);
    c.skip_signature = on(S3_ALLOW_ANONYMOUS);
    c.disable_ec2_metadata = on(S3_DISABLE_EC2_METADATA);
    c.disable_config_load = on(S3_DISABLE_CONFIG_LOAD);
    if let Some(sse) = get(S3_SSE_TYPE) {
        match sse.to_ascii_lowercase().as_str() {
            "none" => {}
            "s3" => c.server_side_encryption = Some("AES256".into()),
            "kms" => {
                c.server_side_encryption = Some("aws:kms".into());
                c.server_side_encryption_aws_kms_key_id = get(S3_SSE_KEY);
            }
            "custom" => {
                c.server_side_encryption_customer_algorithm = Some("AES256".into());
                c.server_side_encryption_customer_key = get(S3_SSE_KEY);
                c.server_side_encryption_customer_key_md5 = get(S3_SSE_MD5);
            }
            other => {
                return Err(invalid(format!(
                    "{S3_SSE_TYPE} = {other}: expected none, s3, kms or custom"
                )));
            }
        }
    }
    Ok(c)
}

impl TrustingS3 {
    /// The operator of `path`'s bucket and the path within the bucket.
    fn operator<'a>(&self, path: &'a str) -> Result<(Operator, &'a str)> {
        let (bucket, key) = split(path)?;
        let mut operators = self.operators.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(op) = operators.get(bucket) {
            return Ok((op.clone(), key));
        }
        let op = self.build_operator(bucket)?;
        operators.insert(bucket.to_string(), op.clone());
        Ok((op, key))
    }

    /// An operator on `bucket` whose client trusts the CA file. The
    /// timeout sits inside the retries, so each attempt is bounded.
    fn build_operator(&self, bucket: &str) -> Result<Operator> {
        let client = http_client(&self.ca_file)?;
        let builder = self.config.clone().into_builder().bucket(bucket);
        Ok(Operator::new(builder)
            .map_err(io)?
            .layer(HttpClientLayer::new(HttpClient::with(client)))
            .layer(TimeoutLayer::new())
            .layer(RetryLayer::new())
            .finish())
    }
}

/// The https client: trusts exactly the certificates of `ca_file`.
fn http_client(ca_file: &std::path::Path) -> Result<reqwest013::Client> {
    let tls = crate::tls::client_config_trusting(ca_file).map_err(|e| invalid(e.to_string()))?;
    reqwest013::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| invalid(format!("the object store's https client: {e}")))
}

/// `s3://bucket/a/b` as (`bucket`, `a/b`).
fn split(path: &str) -> Result<(&str, &str)> {
    let rest = ["s3://", "s3a://", "s3n://"]
        .iter()
        .find_map(|scheme| path.strip_prefix(scheme))
        .ok_or_else(|| invalid(format!("{path}: not an s3:// location")))?;
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() => Ok((bucket, key)),
        _ => Err(invalid(format!("{path}: no bucket and key"))),
    }
}

#[typetag::serde(name = "UrutauTrustingS3")]
#[async_trait]
impl Storage for TrustingS3 {
    async fn exists(&self, path: &str) -> Result<bool> {
        let (op, key) = self.operator(path)?;
        op.exists(key).await.map_err(io)
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let (op, key) = self.operator(path)?;
        let meta = op.stat(key).await.map_err(io)?;
        Ok(FileMetadata {
            size: meta.content_length(),
        })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let (op, key) = self.operator(path)?;
        Ok(op.read(key).await.map_err(io)?.to_bytes())
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let (op, key) = self.operator(path)?;
        Ok(Box::new(Reader(op.reader(key).await.map_err(io)?)))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let (op, key) = self.operator(path)?;
        op.write(key, bs).await.map_err(io).map(|_| ())
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let (op, key) = self.operator(path)?;
        Ok(Box::new(Writer(op.writer(key).await.map_err(io)?)))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let (op, key) = self.operator(path)?;
        op.delete(key).await.map_err(io)
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        // A whole bucket is never a table's prefix: refused, not emptied.
        if split(path)?.1.trim_end_matches('/').is_empty() {
            return Err(invalid(format!("{path} is a whole bucket: not deleted")));
        }
        let (op, key) = self.operator(path)?;
        let dir = format!("{}/", key.trim_end_matches('/'));
        op.delete_with(&dir).recursive(true).await.map_err(io)
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        // One deleter per bucket, so a long list goes in batches.
        let mut deleters: HashMap<String, opendal::Deleter> = HashMap::new();
        while let Some(path) = paths.next().await {
            let (bucket, _) = split(&path)?;
            let (op, key) = self.operator(&path)?;
            if !deleters.contains_key(bucket) {
                deleters.insert(bucket.to_string(), op.deleter().await.map_err(io)?);
            }
            if let Some(d) = deleters.get_mut(bucket) {
                d.delete(key.to_string()).await.map_err(io)?;
            }
        }
        for (_, mut d) in deleters {
            d.close().await.map_err(io)?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// An OpenDAL reader as iceberg's [`FileRead`].
struct Reader(opendal::Reader);

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: std::ops::Range<u64>) -> Result<Bytes> {
        Ok(self.0.read(range).await.map_err(io)?.to_bytes())
    }
}

/// An OpenDAL writer as iceberg's [`FileWrite`].
struct Writer(opendal::Writer);

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.0.write(bs).await.map_err(io)
    }

    async fn close(&mut self) -> Result<()> {
        self.0.close().await.map_err(io).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn iceberg_properties_configure_the_s3_service() {
        let c = s3_config(&props(&[
            ("s3.endpoint", "https://s3.internal:8333"),
            ("s3.access-key-id", "id"),
            ("s3.secret-access-key", "secret"),
            ("s3.region", "eu-west-1"),
            ("client.region", "us-east-1"),
            ("s3.path-style-access", "true"),
            ("s3.sse.type", "kms"),
            ("s3.sse.key", "key-1"),
        ]))
        .unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("https://s3.internal:8333"));
        assert_eq!(c.access_key_id.as_deref(), Some("id"));
        assert_eq!(c.secret_access_key.as_deref(), Some("secret"));
        assert_eq!(c.region.as_deref(), Some("us-east-1"), "client.region wins");
        assert!(!c.enable_virtual_host_style);
        assert_eq!(c.server_side_encryption.as_deref(), Some("aws:kms"));
        assert_eq!(
            c.server_side_encryption_aws_kms_key_id.as_deref(),
            Some("key-1")
        );
        // Iceberg's default addressing is virtual-host style.
        assert!(s3_config(&props(&[])).unwrap().enable_virtual_host_style);
        let e = s3_config(&props(&[("s3.sse.type", "rot13")])).unwrap_err();
        assert!(e.to_string().contains("rot13"), "{e}");
    }

    #[test]
    fn locations_split_into_bucket_and_key() {
        assert_eq!(
            split("s3://b/ns/t/x.parquet").unwrap(),
            ("b", "ns/t/x.parquet")
        );
        assert_eq!(split("s3a://b/k").unwrap(), ("b", "k"));
        assert!(split("s3://b").is_err());
        assert!(split("gs://b/k").is_err());
    }

    #[tokio::test]
    async fn a_whole_bucket_is_never_deleted_as_a_prefix() {
        let s = TrustingS3Factory {
            ca_file: "/no/such/ca.pem".into(),
        }
        .build(&StorageConfig::from_props(props(&[])))
        .unwrap();
        for path in ["s3://b/", "s3://b//"] {
            let e = s.delete_prefix(path).await.unwrap_err().to_string();
            assert!(e.contains("whole bucket"), "{e}");
        }
    }

    #[test]
    fn the_keys_stay_out_of_its_debug_form() {
        let s = TrustingS3Factory {
            ca_file: "/ca.pem".into(),
        }
        .build(&StorageConfig::from_props(props(&[
            ("s3.access-key-id", "AKID"),
            ("s3.secret-access-key", "hush"),
        ])));
        let shown = format!("{:?}", s.unwrap());
        assert!(
            !shown.contains("hush") && !shown.contains("AKID"),
            "{shown}"
        );
    }
}
