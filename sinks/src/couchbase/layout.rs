//! The sink's layout in the cluster: connect, then the bucket (created
//! when absent, with 0 replicas: what durability majority needs on a
//! single node), the scope and the table's collection, each created only
//! when missing (so a user with data rights only can write into a layout
//! an administrator made).

use couchbase::authenticator::PasswordAuthenticator;
use couchbase::cluster::Cluster;
use couchbase::collection::Collection;
use couchbase::error::ErrorKind;
use couchbase::management::buckets::bucket_settings::BucketSettings;
use couchbase::options::cluster_options::{ClusterOptions, TlsOptions};
use urutau_planner::sink::SinkError;

use super::Config;
use super::client::{Failure, classify};

/// RAM of a bucket the sink creates.
const NEW_BUCKET_RAM_MB: u64 = 100;

/// Connects (bounded, retried like every call).
pub async fn connect(config: &Config, table: &str) -> Result<Cluster, SinkError> {
    if super::is_tls(&config.uri)
        && let Some(refusal) =
            super::tls_probe::refused_certificate(&config.uri, config.ca_certs.as_deref()).await
    {
        return Err(SinkError::Io(format!(
            "couchbase: connect on table {table} at {}: {refusal}",
            config.calls.server
        )));
    }
    config
        .calls
        .run("connect", table, || {
            let auth = PasswordAuthenticator::new(&config.username, &config.password);
            let mut options = ClusterOptions::new(auth.into());
            if let Some(cas) = &config.ca_certs {
                options = options.tls_options(TlsOptions::new().add_ca_certificates(cas.clone()));
            }
            Cluster::connect(&config.uri, options)
        })
        .await
}

/// A scope or collection name Couchbase accepts: 1-251 characters of
/// `A-Z a-z 0-9 _ - %`, not starting with `_` or `%` (but `_default`).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '%'));
    if name == "_default" {
        return Ok(());
    }
    if name.is_empty() || name.len() > 251 || !ok_chars || name.starts_with(['_', '%']) {
        return Err(format!(
            "`{name}` is not a Couchbase scope or collection name (1-251 characters of A-Z a-z 0-9 _ - %, not starting with _ or %)"
        ));
    }
    Ok(())
}

/// The sink's bucket's settings (`None`: no such bucket).
async fn bucket_settings(
    cluster: &Cluster,
    config: &Config,
    table: &str,
) -> Result<Option<BucketSettings>, SinkError> {
    let buckets = cluster.buckets();
    config
        .calls
        .run_classified(
            "read bucket settings",
            table,
            || async {
                match buckets.get_bucket(&config.bucket, None).await {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if *e.kind() == ErrorKind::BucketNotFound => Ok(None),
                    Err(e) => Err(e),
                }
            },
            classify,
        )
        .await
}

/// Makes sure the bucket, the scope and the collection exist, and returns
/// the collection.
pub async fn ensure_collection(
    cluster: &Cluster,
    config: &Config,
    scope: &str,
    collection: &str,
) -> Result<Collection, SinkError> {
    let table = format!("{scope}.{collection}");
    let calls = &config.calls;
    let buckets = cluster.buckets();
    match bucket_settings(cluster, config, &table).await? {
        Some(b) => {
            if b.num_replicas.unwrap_or(0) > 0 {
                tracing::info!(bucket = %config.bucket, replicas = ?b.num_replicas, "the bucket has replicas: durable writes need that many nodes besides the active one");
            }
        }
        None => {
            calls
                .run_classified(
                    "create bucket",
                    &table,
                    || async {
                        let settings = BucketSettings::new(&config.bucket)
                            .ram_quota_mb(NEW_BUCKET_RAM_MB)
                            .num_replicas(0);
                        match buckets.create_bucket(settings, None).await {
                            Err(e) if *e.kind() == ErrorKind::BucketExists => Ok(()),
                            r => r,
                        }
                    },
                    classify,
                )
                .await?;
            tracing::info!(bucket = %config.bucket, "created the bucket (0 replicas)");
        }
    }
    let bucket = cluster.bucket(&config.bucket);
    let manager = bucket.collections();
    let scopes = calls
        .run_classified(
            "list scopes",
            &table,
            || manager.get_all_scopes(None),
            // A bucket that was just created may not answer yet.
            |e| match e.kind() {
                ErrorKind::BucketNotFound => Failure::Transient,
                _ => classify(e),
            },
        )
        .await?;
    let existing = scopes.iter().find(|s| s.name() == scope);
    if existing.is_none() {
        calls
            .run("create scope", &table, || async {
                match manager.create_scope(scope, None).await {
                    Err(e) if *e.kind() == ErrorKind::ScopeExists => Ok(()),
                    r => r,
                }
            })
            .await?;
        tracing::info!(bucket = %config.bucket, scope, "created the scope");
    }
    let has_collection =
        existing.is_some_and(|s| s.collections().iter().any(|c| c.name() == collection));
    if !has_collection {
        calls
            .run("create collection", &table, || async {
                match manager
                    .create_collection(scope, collection, None, None)
                    .await
                {
                    Err(e) if *e.kind() == ErrorKind::CollectionExists => Ok(()),
                    r => r,
                }
            })
            .await?;
        tracing::info!(bucket = %config.bucket, collection = %table, "created the collection");
    }
    Ok(bucket.scope(scope).collection(collection))
}

/// The collection when the bucket, the scope and the collection all
/// exist, `None` otherwise; creates nothing (a preview's read of the
/// position).
pub async fn find_collection(
    cluster: &Cluster,
    config: &Config,
    scope: &str,
    collection: &str,
) -> Result<Option<Collection>, SinkError> {
    let table = format!("{scope}.{collection}");
    let calls = &config.calls;
    if bucket_settings(cluster, config, &table).await?.is_none() {
        return Ok(None);
    }
    let bucket = cluster.bucket(&config.bucket);
    let manager = bucket.collections();
    let scopes = calls
        .run("list scopes", &table, || manager.get_all_scopes(None))
        .await?;
    let exists = scopes
        .iter()
        .find(|s| s.name() == scope)
        .is_some_and(|s| s.collections().iter().any(|c| c.name() == collection));
    Ok(exists.then(|| bucket.scope(scope).collection(collection)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_names() {
        for ok in ["orders", "_default", "a-b_c%1"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "_sys", "%x", "a.b", "ü", &"x".repeat(252)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
