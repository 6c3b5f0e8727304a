//! The SQL catalog (SQLite — the embedded default — or Postgres):
//! namespaces are created and tables loaded with `iceberg-catalog-sql`;
//! a table is created by writing and syncing its first metadata file, then
//! inserting its row;
//! a commit writes the next metadata file and swaps
//! `iceberg_tables.metadata_location` with a compare-and-swap
//! `UPDATE ... WHERE metadata_location = <old>` on the same tables, the
//! layout PyIceberg and Java's JDBC catalog use. (iceberg 0.10.1's
//! `Catalog::update_table` cannot carry delete files: its `TableCommit` is
//! built only inside the crate.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalog, SqlCatalogBuilder};
use sqlx::any::AnyPoolOptions;
use urutau_planner::sink::SinkError;

use iceberg::MetadataLocation;
use iceberg::spec::{TableMetadataBuildResult, TableMetadataBuilder};

use super::Outcome;
use crate::iceberg::{commit, durable, io_error};

/// A connected SQL catalog.
pub struct SqlCatalogConn {
    catalog: SqlCatalog,
    pool: sqlx::AnyPool,
    /// The `catalog_name` column value of this catalog's rows.
    name: String,
    /// Postgres binds `$1`, SQLite `?` (see [`Self::bind_style`]).
    dollar: bool,
    /// Directories of the warehouse already made durable.
    durable_dirs: durable::DurableDirs,
    /// The warehouse's absolute path.
    warehouse: String,
}

impl std::fmt::Debug for SqlCatalogConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlCatalogConn")
            .field("name", &self.name)
            .finish()
    }
}

/// `sqlite://relative/path.db` -> `sqlite:///abs/path.db?mode=rwc`, with the
/// parent directory created (the embedded default needs no set-up), and
/// the file's path.
fn sqlite_uri(uri: &str) -> Result<(String, PathBuf), SinkError> {
    let rest = uri
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let abs = absolute(Path::new(path))?;
    if let Some(parent) = abs.parent() {
        durable::create_dir_durably(parent)
            .map_err(|e| SinkError::Io(format!("creating {}: {e}", parent.display())))?;
    }
    let uri = match query {
        Some(q) => format!("sqlite://{}?{q}", abs.display()),
        None => format!("sqlite://{}?mode=rwc", abs.display()),
    };
    Ok((uri, abs))
}

fn absolute(p: &Path) -> Result<PathBuf, SinkError> {
    std::path::absolute(p).map_err(|e| SinkError::Io(format!("{}: {e}", p.display())))
}

/// A local warehouse directory as an absolute path (created if absent,
/// durably).
pub fn local_warehouse(warehouse: &str) -> Result<String, SinkError> {
    let path = warehouse.strip_prefix("file://").unwrap_or(warehouse);
    let abs = absolute(Path::new(path))?;
    durable::create_dir_durably(&abs)
        .map_err(|e| SinkError::Io(format!("creating {}: {e}", abs.display())))?;
    Ok(abs.display().to_string())
}

impl SqlCatalogConn {
    /// Connects (creating an SQLite file and the catalog tables if absent).
    pub async fn connect(uri: &str, warehouse: &str, name: &str) -> Result<Self, SinkError> {
        // A SQLite file this call creates.
        let mut new_sqlite_file = false;
        let (uri, dollar) = if uri.starts_with("sqlite:") {
            let (uri, path) = sqlite_uri(uri)?;
            new_sqlite_file = !path.exists();
            (uri, false)
        } else if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            (uri.to_string(), true)
        } else {
            return Err(SinkError::Io(
                "a SQL catalog's uri is sqlite://path or postgres://...".to_string(),
            ));
        };
        let warehouse = if warehouse.contains("://") && !warehouse.starts_with("file://") {
            return Err(SinkError::Unavailable(format!(
                "warehouse {warehouse}: object storage warehouses with the SQL catalog are not in this build; use a local path"
            )));
        } else {
            local_warehouse(warehouse)?
        };
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(2)
            .connect(&uri)
            .await
            .map_err(|e| SinkError::Io(format!("opening the SQL catalog: {e}")))?;
        if new_sqlite_file {
            // Write-ahead logging: a commit syncs the log once instead of
            // the rollback journal's four syncs, with the same durability
            // (synchronous stays FULL). Only on a file created here: the
            // mode sticks to the file, and a catalog someone else made
            // keeps the mode they chose.
            sqlx::query("PRAGMA journal_mode = WAL")
                .fetch_all(&pool)
                .await
                .map_err(|e| SinkError::Io(format!("opening the SQL catalog: {e}")))?;
        }
        let catalog = SqlCatalogBuilder::default()
            .uri(uri.clone())
            .warehouse_location(warehouse.clone())
            .sql_bind_style(if dollar {
                SqlBindStyle::DollarNumeric
            } else {
                SqlBindStyle::QMark
            })
            .with_storage_factory(Arc::new(super::local::LocalStorageFactory))
            .load(name, HashMap::new())
            .await
            .map_err(io_error("opening the SQL catalog"))?;
        Ok(SqlCatalogConn {
            catalog,
            pool,
            name: name.to_string(),
            dollar,
            durable_dirs: durable::DurableDirs::default(),
            warehouse,
        })
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
        let has_ns = self
            .catalog
            .namespace_exists(ns)
            .await
            .map_err(io_error("looking the namespace up"))?;
        if !has_ns {
            self.catalog
                .create_namespace(ns, HashMap::new())
                .await
                .map_err(io_error("creating the namespace"))?;
        }
        // The table is created here, not by `SqlCatalog::create_table`,
        // which inserts the catalog row right after writing the first
        // metadata file whole, unsynced: a power loss could then leave a
        // row pointing at an empty or missing file. Here the file and the
        // new directories (the table's and its namespace's, up to the
        // warehouse) are durable before the row is inserted. The location
        // is the one the catalog crate would choose: the namespace's
        // `location` property, or `<warehouse>/<namespace>`, then the name.
        let namespace_location = self
            .catalog
            .get_namespace(ns)
            .await
            .map_err(io_error("looking the namespace up"))?
            .properties()
            .get("location")
            .cloned()
            .unwrap_or_else(|| format!("{}/{}", self.warehouse, ns.join("/")));
        let location = creation
            .location
            .clone()
            .unwrap_or_else(|| format!("{namespace_location}/{}", ident.name()));
        let creation = TableCreation {
            location: Some(location.clone()),
            ..creation
        };
        let err = io_error("creating the table");
        let metadata = TableMetadataBuilder::from_table_creation(creation)
            .and_then(|b| b.build())
            .map_err(&err)?
            .metadata;
        // The table's directories, made durably wherever the location is
        // (a namespace's `location` may lie outside the warehouse).
        let Some(local) = durable::local_path(&location) else {
            return Err(SinkError::Io(format!(
                "creating {ident}: its location {location} is not an absolute local path, which the SQL catalog's warehouse needs"
            )));
        };
        let metadata_dir = local.join("metadata");
        let made = metadata_dir.clone();
        tokio::task::spawn_blocking(move || durable::create_dir_durably(&made))
            .await
            .map_err(|e| SinkError::Io(format!("creating {ident}: {e}")))?
            .map_err(|e| SinkError::Io(format!("creating {}: {e}", metadata_dir.display())))?;
        let metadata_location = MetadataLocation::new_with_metadata(location.clone(), &metadata);
        metadata
            .write_to(&super::local::file_io(), &metadata_location)
            .await
            .map_err(&err)?;
        let metadata_location = metadata_location.to_string();
        durable::sync_local(
            vec![metadata_location.clone()],
            vec![],
            &location,
            &self.durable_dirs,
        )
        .await?;
        if let Err(e) = self.insert(ident, &metadata_location).await {
            // Not the table's: a file left there would look like another
            // table's to orphan cleanup.
            if let Some(path) = durable::local_path(&metadata_location) {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
        self.load(ident).await?.ok_or_else(|| {
            SinkError::Io(format!("{ident} is not in the catalog after its creation"))
        })
    }

    /// `sql` in this catalog's bind style (see [`numbered_placeholders`]).
    fn bind_style(&self, sql: &str) -> String {
        if self.dollar {
            numbered_placeholders(sql)
        } else {
            sql.to_string()
        }
    }

    /// Adds the catalog row of a new table. Fails when the name is taken
    /// (another writer created it meanwhile: the next run loads and checks
    /// that table).
    async fn insert(&self, ident: &TableIdent, metadata_location: &str) -> Result<(), SinkError> {
        let sql = self.bind_style(
            "INSERT INTO iceberg_tables \
             (catalog_name, table_namespace, table_name, metadata_location, iceberg_type) \
             VALUES (?, ?, ?, ?, 'TABLE')",
        );
        sqlx::query(&sql)
            .bind(self.name.clone())
            .bind(ident.namespace().join("."))
            .bind(ident.name().to_string())
            .bind(metadata_location.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| SinkError::Io(format!("creating {ident} in the SQL catalog: {e}")))?;
        Ok(())
    }

    /// Writes `result`'s metadata as the next version, makes it and the
    /// directory entries of `added` durable, and swaps it in.
    pub async fn commit(
        &self,
        table: &Table,
        result: TableMetadataBuildResult,
        added: &[String],
    ) -> Outcome {
        let current = match commit::current_metadata_location(table) {
            Ok(c) => c.to_string(),
            Err(e) => return Outcome::Unknown(SinkError::Io(e)),
        };
        let (metadata, location) =
            match commit::write_metadata(table, result.metadata, &current).await {
                Ok(x) => x,
                // Nothing was swapped: safe to retry.
                Err(e) => return Outcome::Unknown(e),
            };
        let root = table.metadata().location();
        if let Err(e) = durable::sync_local(
            vec![location.clone()],
            added.to_vec(),
            root,
            &self.durable_dirs,
        )
        .await
        {
            return Outcome::Unknown(e);
        }
        match self.swap(table.identifier(), &current, &location).await {
            Ok(true) => match commit::committed_table(table, metadata, location) {
                Ok(t) => Outcome::Committed(t),
                Err(e) => Outcome::Unknown(e),
            },
            Ok(false) => Outcome::Conflict,
            Err(e) => Outcome::Unknown(e),
        }
    }

    /// Makes `new` the table's metadata if `old` still is; false when
    /// another writer committed first.
    async fn swap(&self, ident: &TableIdent, old: &str, new: &str) -> Result<bool, SinkError> {
        let sql = self.bind_style(
            "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) AND metadata_location = ?",
        );
        let done = sqlx::query(&sql)
            .bind(new.to_string())
            .bind(old.to_string())
            .bind(self.name.clone())
            .bind(ident.namespace().join("."))
            .bind(ident.name().to_string())
            .bind(old.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| SinkError::Io(format!("committing to the SQL catalog: {e}")))?;
        Ok(done.rows_affected() == 1)
    }
}

/// `sql`, written with `?` placeholders (none inside literals), with them
/// numbered `$1, $2, ...` as Postgres binds them.
fn numbered_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    for (n, part) in sql.split('?').enumerate() {
        if n > 0 {
            out.push('$');
            out.push_str(&n.to_string());
        }
        out.push_str(part);
    }
    out
}

/// A table of a SQL catalog, loaded without changing anything: no SQLite
/// file, catalog table, namespace or directory is created, and the
/// catalog's rows are only read (for queries of what landed). `None` when
/// the catalog or the table does not exist.
pub async fn load_read_only(
    uri: &str,
    catalog_name: &str,
    ident: &TableIdent,
) -> Result<Option<Table>, SinkError> {
    let urls = if uri.starts_with("sqlite:") {
        let rest = uri
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let path = rest.split_once('?').map_or(rest, |(p, _)| p);
        let abs = absolute(Path::new(path))?;
        if !abs.exists() {
            return Ok(None);
        }
        // Read-only first; a WAL file with no shared-memory file beside it
        // (no writer running) can need a read-write open, which never
        // creates the database (`rw`, not `rwc`).
        vec![
            (format!("sqlite://{}?mode=ro", abs.display()), false),
            (format!("sqlite://{}?mode=rw", abs.display()), false),
        ]
    } else if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
        vec![(uri.to_string(), true)]
    } else {
        return Err(SinkError::Io(
            "a SQL catalog's uri is sqlite://path or postgres://...".to_string(),
        ));
    };
    sqlx::any::install_default_drivers();
    let mut last = None;
    for (url, dollar) in urls {
        let pool = match AnyPoolOptions::new().max_connections(1).connect(&url).await {
            Ok(p) => p,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let sql = if dollar {
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3"
        } else {
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?"
        };
        let found = sqlx::query_scalar::<_, Option<String>>(sql)
            .bind(catalog_name)
            .bind(ident.namespace().join("."))
            .bind(ident.name())
            .fetch_optional(&pool)
            .await;
        pool.close().await;
        let location = match found {
            Ok(row) => row.flatten(),
            Err(e) if is_missing_relation(&e) => None,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let Some(location) = location else {
            return Ok(None);
        };
        let table = iceberg::table::StaticTable::from_metadata_file(
            &location,
            ident.clone(),
            super::local::file_io(),
        )
        .await
        .map_err(io_error("reading the table's metadata"))?;
        return Ok(Some(table.into_table()));
    }
    Err(SinkError::Io(format!(
        "opening the SQL catalog: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

/// The catalog's tables were never created (nothing was committed).
fn is_missing_relation(e: &sqlx::Error) -> bool {
    match e.as_database_error() {
        Some(d) => d.code().as_deref() == Some("42P01") || d.message().contains("no such table"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_for_postgres() {
        assert_eq!(
            numbered_placeholders("UPDATE t SET a = ? WHERE b = ? AND c = 'TABLE'"),
            "UPDATE t SET a = $1 WHERE b = $2 AND c = 'TABLE'"
        );
    }
}
