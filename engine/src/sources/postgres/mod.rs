//! The Postgres source: logical replication with the built-in `pgoutput`
//! plugin, decoded straight into Arrow change batches.
//!
//! Client: `pgwire-replication` (a maintained replication-protocol client:
//! explicit start LSN, standby status updates on its own timer with the
//! LSN we mark applied, fail-fast errors; it never creates a slot, so a
//! missing slot is never silently recreated past a gap). Decoding pgoutput
//! (protocol v1) is ours ([`pgoutput`]), and so is turning text values into
//! Arrow columns ([`pgtypes`]).
//!
//! At every start, idempotently ([`catalog::prepare`]): `wal_level` and
//! privileges are checked; routed tables get REPLICA IDENTITY FULL (unless
//! `replica_identity = 'keep'`); the publication `<slot>_pub` holds exactly
//! the routed tables; the slot is created when absent, before anything is
//! read. Transactions are never split across batches; a change's position
//! is its transaction's commit end LSN — what `confirmed_flush_lsn` is set
//! to when that transaction is acknowledged, so a restart from a committed
//! position neither re-reads nor skips a transaction. The slot is
//! acknowledged only up to positions every route has committed.
//!
//! A preview ([`OpenArgs::peek`]) reads another way, creating and moving
//! nothing: the slot's backlog by `pg_logical_slot_peek_binary_changes`,
//! then each unfinished snapshot's first rows by a plain `SELECT`
//! (`stream::peek`).
//!
//! Unless `snapshot = 'none'`, the routed tables are copied first, DBLog
//! style, while the stream flows ([`snapshot`]): chunks in primary-key
//! order (or a unique index's, or ctid's for a table with neither)
//! between low and high watermarks, progress committed in the sink with
//! the rows.

mod catalog;
mod errors;
pub mod pgoutput;
pub mod pgtypes;
pub mod position;
mod snapshot;
mod stream;
mod tls;

use std::sync::Arc;

use async_trait::async_trait;
use urutau_planner::context::Transport;
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SchemaError, SourceKindDef, SourceProvider, SourceTableSchema};
use urutau_planner::spec::{QualifiedName, SourceSpec, SourceTableSpec};

use super::{ChangeSource, OpenArgs, SourceError, SourceKind};
use crate::position::PositionKind;

pub use catalog::PgTable;

/// Registers the `postgres` kind for planning.
pub struct PostgresSourceProvider {
    def: SourceKindDef,
}

impl PostgresSourceProvider {
    /// The `postgres` kind's definition.
    pub fn new() -> Self {
        use OptionType as T;
        PostgresSourceProvider {
            def: SourceKindDef {
                name: "postgres",
                exec_name: "PostgresSourceExec",
                doc: "PostgreSQL logical replication (pgoutput)",
                options: vec![
                    OptionDef::new("uri", T::String, "postgres://user:password@host:port/db")
                        .required()
                        .secret(),
                    OptionDef::new(
                        "slot",
                        T::String,
                        "the replication slot (created when absent)",
                    )
                    .aliases(&["slot_name"])
                    .required(),
                    OptionDef::new(
                        "publication",
                        T::String,
                        "the publication (default: <slot>_pub; made to hold exactly the routed tables)",
                    ),
                    OptionDef::new(
                        "replica_identity",
                        T::Enum(&["full", "keep"]),
                        "full: set REPLICA IDENTITY FULL on the routed tables; keep: leave it",
                    )
                    .default("full"),
                    OptionDef::new(
                        "snapshot",
                        T::Enum(&["initial", "none"]),
                        "initial: copy the tables first; none: stream changes only",
                    )
                    .aliases(&["snapshot_mode"])
                    .default("initial"),
                    OptionDef::new(
                        "snapshot_chunk_rows",
                        T::Int {
                            min: 1,
                            max: 10_000_000,
                        },
                        "rows per snapshot chunk (each chunk is one SELECT between two watermarks)",
                    )
                    .default("5000"),
                    OptionDef::new(
                        "snapshot_parallelism",
                        T::Int { min: 1, max: 64 },
                        "sessions the initial snapshot reads chunks in at once, across tables and across the key ranges of one table (default: the machine's cores)",
                    ),
                    OptionDef::new(
                        "snapshot_batch_rows",
                        T::Int {
                            min: 1,
                            max: 10_000_000,
                        },
                        "rows a batch (one commit per sink table) may grow to while it holds snapshot rows; never below the pipeline's max_batch_rows",
                    )
                    .default("100000"),
                    OptionDef::new(
                        "on_truncate",
                        T::Enum(&["ignore", "fail"]),
                        "what a TRUNCATE of a routed table does",
                    )
                    .default("ignore"),
                    OptionDef::new(
                        "sslmode",
                        T::Enum(&[
                            "disable",
                            "allow",
                            "prefer",
                            "require",
                            "verify-ca",
                            "verify-full",
                        ]),
                        "TLS as libpq's sslmode (also in the uri's query; default prefer)",
                    ),
                    OptionDef::new(
                        "sslrootcert",
                        T::String,
                        "the CA file that verifies the server (verify-ca, verify-full)",
                    ),
                    OptionDef::new(
                        "sslcert",
                        T::String,
                        "a client certificate file (with sslkey; pg_hba `cert`)",
                    ),
                    OptionDef::new("sslkey", T::String, "the client certificate's key file"),
                    OptionDef::retry_timeout(),
                ],
                declares_tables: false,
                table_options: vec![],
                transport: Transport::None,
                rules: vec![],
            },
        }
    }
}

impl Default for PostgresSourceProvider {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl SourceProvider for PostgresSourceProvider {
    fn def(&self) -> &SourceKindDef {
        &self.def
    }

    async fn table_schema(
        &self,
        source: &SourceSpec,
        table: &QualifiedName,
        _declared: Option<&SourceTableSpec>,
    ) -> Result<SourceTableSchema, SchemaError> {
        let t = PgTable::from_parts(&table.parts).map_err(SchemaError::Invalid)?;
        let uri = tls::effective_uri(
            source.options.get("uri").unwrap_or_default(),
            &source.options,
        )
        .map_err(|e| SchemaError::Invalid(e.message))?;
        let mut conn = catalog::connect(&uri)
            .await
            .map_err(|e| SchemaError::Unavailable(e.message))?;
        tls::warn_if_unencrypted(&mut conn, &source.name.name).await;
        let schema = catalog::table_schema(&mut conn, &t).await;
        catalog::close(conn).await;
        schema
    }

    fn describe(&self, source: &SourceSpec) -> String {
        // As the connections will read it: the option, the uri, PGSSLMODE.
        let sslmode = source
            .options
            .get("uri")
            .and_then(|uri| tls::effective_uri(uri, &source.options).ok())
            .and_then(|uri| url::Url::parse(&uri).ok())
            .map_or_else(|| "prefer".into(), |url| tls::mode(&url));
        format!(
            "slot={}, snapshot={}, sslmode={sslmode}",
            source.options.get("slot").unwrap_or("?"),
            source.options.get("snapshot").unwrap_or("?")
        )
    }
}

/// The `postgres` kind: LSN positions, streams from a replication slot.
pub struct PostgresKind {
    provider: Arc<PostgresSourceProvider>,
}

impl PostgresKind {
    /// The kind.
    pub fn new() -> Self {
        PostgresKind {
            provider: Arc::new(PostgresSourceProvider::new()),
        }
    }
}

impl Default for PostgresKind {
    fn default() -> Self {
        Self::new()
    }
}

impl SourceKind for PostgresKind {
    fn provider(&self) -> Arc<dyn SourceProvider> {
        Arc::clone(&self.provider) as Arc<dyn SourceProvider>
    }

    fn position_kind(&self) -> &'static dyn PositionKind {
        &position::LSN_POSITIONS
    }

    fn open(&self, args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError> {
        match args.peek {
            Some(limit) => {
                stream::open_peek(args, limit).map(|s| Box::new(s) as Box<dyn ChangeSource>)
            }
            None => stream::open(args).map(|s| Box::new(s) as Box<dyn ChangeSource>),
        }
    }
}
