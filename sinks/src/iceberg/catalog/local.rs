//! Local warehouse storage (`file:` locations and absolute paths):
//! iceberg's own local file system storage, except for when a file written
//! through a streaming writer (Parquet data and delete files, manifests,
//! manifest lists) is synced.
//!
//! iceberg's writer syncs the file in `close`, on the async worker that
//! closes it: every file of a batch waited for its sync in turn (about
//! eight a commit), each one holding a worker. Here `close` hands the file
//! to a blocking thread that syncs it ([`durable::sync_in_background`])
//! and returns: the worker goes on writing the next file while the disk
//! syncs. A file is not yet durable when `close` returns: every commit
//! waits for the syncs started before it, and fails on any that failed,
//! before its catalog may point at the files ([`durable::sync_local`]).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage,
    OutputFile, Storage, StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

use crate::iceberg::durable;

/// The file IO of local tables: [`LocalStorage`].
pub fn file_io() -> FileIO {
    FileIOBuilder::new(Arc::new(LocalStorageFactory)).build()
}

/// Builds [`LocalStorage`] for a `FileIO` (and for the SQL catalog's own).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorageFactory;

#[typetag::serde(name = "UrutauLocalStorageFactory")]
impl StorageFactory for LocalStorageFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LocalStorage::default()))
    }
}

/// iceberg's [`LocalFsStorage`] whose streaming writers sync in the
/// background (see the module's documentation).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorage {
    inner: LocalFsStorage,
}

/// `path` as iceberg's local storage reads it.
fn local(path: &str) -> PathBuf {
    durable::local_path(path).unwrap_or_else(|| PathBuf::from(path))
}

fn unexpected(message: String) -> Error {
    Error::new(ErrorKind::Unexpected, message)
}

#[typetag::serde(name = "UrutauLocalStorage")]
#[async_trait]
impl Storage for LocalStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        self.inner.exists(path).await
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        self.inner.metadata(path).await
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        self.inner.read(path).await
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        self.inner.reader(path).await
    }

    /// A whole file at once (table metadata): not synced, as by iceberg's
    /// storage; the commit syncs the metadata file it writes.
    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        self.inner.write(path, bs).await
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let path = local(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                unexpected(format!(
                    "Failed to create directory {}: {e}",
                    parent.display()
                ))
            })?;
        }
        let file = std::fs::File::create(&path)
            .map_err(|e| unexpected(format!("Failed to create file {}: {e}", path.display())))?;
        Ok(Box::new(SyncedLater {
            file: Some(file),
            path,
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(path).await
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        self.inner.delete_prefix(path).await
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> Result<()> {
        self.inner.delete_stream(paths).await
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// A file being written; synced in the background once closed.
struct SyncedLater {
    file: Option<std::fs::File>,
    path: PathBuf,
}

#[async_trait]
impl FileWrite for SyncedLater {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::DataInvalid, "Cannot write to closed file"))?;
        file.write_all(&bs).map_err(|e| {
            unexpected(format!(
                "Failed to write to file {}: {e}",
                self.path.display()
            ))
        })
    }

    async fn close(&mut self) -> Result<()> {
        let file = self
            .file
            .take()
            .ok_or_else(|| Error::new(ErrorKind::DataInvalid, "File already closed"))?;
        durable::sync_in_background(self.path.clone(), file);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_written_file_is_read_back_and_its_sync_awaited_by_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = format!("file://{}/t/data/a.parquet", dir.path().display());
        let io = file_io();
        let mut w = io.new_output(&path).unwrap().writer().await.unwrap();
        w.write(Bytes::from_static(b"abc")).await.unwrap();
        w.write(Bytes::from_static(b"def")).await.unwrap();
        w.close().await.unwrap();
        assert!(
            durable::syncing(&dir.path().join("t/data/a.parquet")),
            "its sync runs in the background once closed"
        );
        let read = io.new_input(&path).unwrap().read().await.unwrap();
        assert_eq!(&read[..], b"abcdef");
        durable::sync_local(
            vec![],
            vec![path],
            &format!("file://{}/t", dir.path().display()),
            &durable::DurableDirs::default(),
        )
        .await
        .unwrap();
        assert!(
            !durable::syncing(&dir.path().join("t/data/a.parquet")),
            "a commit waits for the sync"
        );
    }
}
