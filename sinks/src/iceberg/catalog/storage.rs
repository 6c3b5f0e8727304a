//! Which storage a table's files go through, chosen by the table's
//! location: `file:` URLs and absolute paths through the local file system
//! ([`super::local`]: iceberg's local storage whose streaming writers sync
//! a file in the background once closed; the rules of
//! [`crate::iceberg::durable`] build on that),
//! `s3://` (and `s3a://`, `s3n://`) through S3 with the table's properties.
//! A REST catalog's warehouse can be either: its server says where each
//! table lives. S3 with a CA file to trust (`ca_cert`, else
//! `SSL_CERT_FILE`) goes through [`super::s3::TrustingS3`], whose client
//! trusts exactly that file, as the catalog's does.

use std::path::Path;
use std::sync::Arc;

use iceberg::io::{FileIO, FileIOBuilder};
use iceberg_storage_opendal::OpenDalStorageFactory;
use urutau_planner::sink::SinkError;

use super::rest::config::Props;
use super::s3::TrustingS3Factory;
use crate::iceberg::durable;

/// How a location is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Local,
    S3,
}

/// The storage of `location`, or an error naming what is supported.
pub fn kind(location: &str) -> Result<Kind, SinkError> {
    if durable::local_path(location).is_some() {
        return Ok(Kind::Local);
    }
    let scheme = location.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("s3" | "s3a" | "s3n") => Ok(Kind::S3),
        _ => Err(SinkError::Unavailable(format!(
            "table location {location}: storage other than the local file system (file://, /path) and S3 (s3://) is not in this build"
        ))),
    }
}

/// The file IO of a table at `location`, configured with `props` (S3
/// endpoint, region, keys...; unused locally). S3's https client trusts
/// exactly the certificates of `ca_file` when given, else the system's.
pub fn file_io(location: &str, props: &Props, ca_file: Option<&Path>) -> Result<FileIO, SinkError> {
    Ok(match (kind(location)?, ca_file) {
        (Kind::Local, _) => super::local::file_io(),
        (Kind::S3, Some(ca)) => {
            // The file is read now, so a bad one is said before any write.
            crate::tls::root_store(ca)?;
            FileIOBuilder::new(Arc::new(TrustingS3Factory {
                ca_file: ca.to_path_buf(),
            }))
            .with_props(props.clone())
            .build()
        }
        (Kind::S3, None) => FileIOBuilder::new(Arc::new(OpenDalStorageFactory::S3 {
            customized_credential_load: None,
        }))
        .with_props(props.clone())
        .build(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_location_picks_the_storage() {
        assert_eq!(kind("file:///w/ns/t").unwrap(), Kind::Local);
        assert_eq!(kind("file:/w/ns/t").unwrap(), Kind::Local);
        assert_eq!(kind("/w/ns/t").unwrap(), Kind::Local);
        assert_eq!(kind("s3://bucket/ns/t").unwrap(), Kind::S3);
        assert_eq!(kind("s3a://bucket/ns/t").unwrap(), Kind::S3);
        let e = kind("gs://bucket/t").unwrap_err();
        assert!(e.to_string().contains("gs://bucket/t"), "{e}");
        assert!(kind("relative/t").is_err());
    }

    #[tokio::test]
    async fn a_local_table_is_written_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let location = format!("file://{}/t", dir.path().display());
        let io = file_io(&location, &Props::new(), None).unwrap();
        io.new_output(format!("{location}/metadata/x.json"))
            .unwrap()
            .write("{}".into())
            .await
            .unwrap();
        assert!(dir.path().join("t/metadata/x.json").is_file());
    }
}
