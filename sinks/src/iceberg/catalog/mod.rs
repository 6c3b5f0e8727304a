//! The catalogs an Iceberg sink commits through, behind one interface:
//! load and create tables, and commit a metadata change atomically.

pub(crate) mod local;
mod rest;
mod s3;
mod sql;
mod storage;

use iceberg::spec::TableMetadataBuildResult;
use iceberg::table::Table;
use iceberg::{TableCreation, TableIdent};
use urutau_planner::sink::SinkError;

pub use rest::{RestCatalogConn, RestConfig};
pub use sql::{SqlCatalogConn, load_read_only as load_sql_read_only};

/// How a commit ended.
pub enum Outcome {
    /// The change is the table's current state.
    Committed(Table),
    /// Another writer committed first; nothing of this commit landed.
    Conflict,
    /// The outcome is unknown (an error after the request left): the table
    /// must be reloaded and searched for the commit before a retry.
    Unknown(SinkError),
}

/// A connected catalog.
#[derive(Debug)]
pub enum Conn {
    Sql(Box<SqlCatalogConn>),
    Rest(Box<RestCatalogConn>),
}

impl Conn {
    /// The table, if it exists.
    pub async fn load(&self, ident: &TableIdent) -> Result<Option<Table>, SinkError> {
        match self {
            Conn::Sql(c) => c.load(ident).await,
            Conn::Rest(c) => c.load(ident).await,
        }
    }

    /// Creates the table (and its namespace when absent).
    pub async fn create(
        &self,
        ident: &TableIdent,
        creation: TableCreation,
    ) -> Result<Table, SinkError> {
        match self {
            Conn::Sql(c) => c.create(ident, creation).await,
            Conn::Rest(c) => c.create(ident, creation).await,
        }
    }

    /// Commits `result` (built on `table`) if `table` is still current.
    /// `added` are the data and delete files the commit adds (a local
    /// warehouse, of either catalog, makes their directory entries durable
    /// before the swap).
    pub async fn commit(
        &self,
        table: &Table,
        result: TableMetadataBuildResult,
        added: &[String],
    ) -> Outcome {
        match self {
            Conn::Sql(c) => c.commit(table, result, added).await,
            Conn::Rest(c) => c.commit(table, result, added).await,
        }
    }
}
