//! The ClickHouse sink: upserts into `ReplacingMergeTree(seq, is_deleted)`,
//! appends into `MergeTree` (append-idempotent: `ReplacingMergeTree(seq)` by
//! the transport coordinate), the position in the data itself.
//!
//! One batch is ONE `INSERT ... FORMAT ArrowStream` (the official
//! `clickhouse` crate with `clickhouse-ext-arrow`), never row by row:
//! upserts land as rows with `is_deleted = 0`, deletes as tombstones with
//! `is_deleted = 1` that `FINAL` reads hide. Every row carries the
//! reserved columns `position` (the source position the batch ends at) and
//! `seq` (one number per batch, increasing across restarts: the next batch
//! takes `max(seq) + 1` of the table), so the data and its position are
//! written by the same insert and resume is `argMax(position, seq)` over
//! the table — no control table. ClickHouse makes an insert atomic per
//! partition: without `partition_by` (the default) a batch lands whole or
//! not at all; with it, per partition only (`validate` warns).
//!
//! A transaction larger than a batch reaches an unpartitioned single-writer
//! table in parts, each inserted into a staging table and attached to the
//! table at once by the commit that closes it (`staging.rs`).
//!
//! A failed insert whose outcome is unknown (a lost response) is looked
//! for by its `seq` before anything else happens, so the runner never
//! double-applies it.
//!
//! Progress without rows (the source advanced without touching a table)
//! writes nothing: ClickHouse has no row-free place for a position without
//! a control table. The position is held in memory for acknowledgements;
//! that is safe because no change between the table's last data row and
//! that position belongs to the table, so a restart that resumes from the
//! older position in the data skips nothing of it.
//!
//! Maintenance is not the sink's job: tombstones are removed by the
//! operator command `urutau clickhouse cleanup` ([`cleanup`]); reads under
//! `FINAL` are correct whether or not it ran.
//!
//! Needs a ClickHouse with `ReplacingMergeTree(ver, is_deleted)`, `Time64`
//! and `Nullable(Tuple)` (tested on the 26.9 engine).

pub mod ddl;
mod insert;
mod owners;
mod read;
mod staging;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use clickhouse::{Client, Compression};
use datafusion::catalog::TableProvider;
use serde_json::Value;
use tokio::sync::Mutex;
use urutau_planner::evolution::SchemaChanges;
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SinkKindDef, SinkProvider};
use urutau_planner::sink::{Sink, SinkBatch, SinkError};
use urutau_planner::spec::{SinkSpec, WriteMode};
use urutau_planner::target::TargetTable;

use ddl::{ident, literal};

fn options() -> Vec<OptionDef> {
    use OptionType as T;
    vec![
        OptionDef::retry_timeout(),
        OptionDef::new("uri", T::String, "http://host:8123 (or https://)").required(),
        OptionDef::new("database", T::String, "database of one-part target names")
            .aliases(&["namespace"])
            .default("default"),
        OptionDef::new("user", T::String, "user name").default("default"),
        OptionDef::new("password", T::String, "password").secret(),
        OptionDef::new(
            "ca_cert",
            T::String,
            "PEM file of the CA that signed the server's certificate (https; default: SSL_CERT_FILE, else the built-in web CAs)",
        ),
        OptionDef::new(
            "compression",
            T::Enum(&["lz4", "none"]),
            "how insert bodies travel (lz4: ClickHouse's compressed blocks)",
        )
        .default("lz4"),
    ]
}

/// Registers the `clickhouse` kind.
pub struct ClickHouseSinkProvider {
    def: SinkKindDef,
}

impl ClickHouseSinkProvider {
    /// The `clickhouse` kind's definition.
    pub fn new() -> Self {
        ClickHouseSinkProvider {
            def: SinkKindDef {
                name: "clickhouse",
                exec_name: "ClickHouseSinkExec",
                doc: "ClickHouse: ReplacingMergeTree upserts, position in the data",
                options: options(),
                maintenance: false,
                partitioning: true,
                partitioning_warning: Some(
                    "partition_by on ClickHouse makes a batch atomic per partition only: a batch crossing partitions commits as several parts",
                ),
                partitioned_tables: true,
                write_modes: &[
                    WriteMode::Upsert,
                    WriteMode::Append,
                    WriteMode::AppendIdempotent,
                ],
                namespace_option: Some("database"),
                route_rules: vec![],
            },
        }
    }
}

impl Default for ClickHouseSinkProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl SinkProvider for ClickHouseSinkProvider {
    fn def(&self) -> &SinkKindDef {
        &self.def
    }

    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(ClickHouseSink::new(spec)?))
    }
}

/// Builds the client a sink spec describes.
fn client_for(spec: &SinkSpec) -> Result<Client, SinkError> {
    let get = |k: &str| spec.options.get(k).map(str::to_string);
    let client = https_client(match crate::tls::ca_file(spec.options.get("ca_cert")) {
        Some(ca) => crate::tls::client_config_trusting(&ca)?,
        None => crate::tls::client_config_web()?,
    });
    let mut client = client
        .with_url(get("uri").unwrap_or_default())
        .with_user(get("user").unwrap_or_else(|| "default".into()))
        .with_compression(match get("compression").as_deref() {
            Some("none") => Compression::None,
            _ => Compression::Lz4,
        });
    if let Some(p) = get("password") {
        client = client.with_password(p);
    }
    Ok(client)
}

/// A client over the HTTP client the `clickhouse` crate builds by default
/// (keepalive, ClickHouse's idle timeout), its TLS ours: trusting the CA
/// file or the web CAs (as the crate's own), and naming a refused
/// certificate ([`crate::tls::client_config`]).
fn https_client(config: rustls::ClientConfig) -> Client {
    use hyper_util::client::legacy::{Client as HyperClient, connect::HttpConnector};
    let mut http = HttpConnector::new();
    http.set_keepalive(Some(std::time::Duration::from_secs(60)));
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::with_http_client(
        HyperClient::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(2))
            .build(https),
    )
}

/// Maps a client error, with what was being done.
fn ch_error(doing: impl std::fmt::Display, e: clickhouse::error::Error) -> SinkError {
    let text = crate::tls::with_causes(&e);
    match crate::tls::hint(&text, "ca_cert") {
        Some(hint) => SinkError::Io(format!("clickhouse: {doing}: {hint} ({text})")),
        None => SinkError::Io(format!("clickhouse: {doing}: {text}")),
    }
}

/// Runs a statement.
pub(crate) async fn execute(client: &Client, sql: &str) -> Result<(), SinkError> {
    client
        .query_raw(sql)
        .execute()
        .await
        .map_err(|e| ch_error(first_line(sql), e))
}

/// Runs a query and returns its rows as JSON objects.
pub(crate) async fn query_rows(
    client: &Client,
    sql: &str,
) -> Result<Vec<serde_json::Map<String, Value>>, SinkError> {
    let bytes = client
        .query_raw(sql)
        .fetch_bytes("JSONEachRow")
        .map_err(|e| ch_error(first_line(sql), e))?
        .collect()
        .await
        .map_err(|e| ch_error(first_line(sql), e))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| SinkError::Io(format!("clickhouse: a reply that is not UTF-8: {e}")))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(SinkError::Io(format!(
                "clickhouse: an unexpected reply line: {l}"
            ))),
        })
        .collect()
}

fn first_line(sql: &str) -> &str {
    sql.lines().next().unwrap_or(sql)
}

/// A JSON number or a quoted 64-bit integer as u64.
pub(crate) fn as_u64(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

/// What a table's rows say of its last commit.
struct LastCommit {
    rows: u64,
    /// The highest `seq` (0 when empty).
    max_seq: u64,
    /// The position in the newest data row; `None` when empty.
    position: Option<String>,
}

/// Reads [`LastCommit`] of `database.table` (one query; resume is
/// `argMax(position, seq)`, see the module docs).
async fn last_commit(
    client: &Client,
    database: &str,
    table: &str,
) -> Result<LastCommit, SinkError> {
    let row = query_rows(
        client,
        &format!(
            "SELECT max({seq}) AS max_seq, argMax({pos}, {seq}) AS last_position, count() AS n FROM {}.{}",
            ident(database),
            ident(table),
            seq = ident(ddl::SEQ),
            pos = ident(ddl::POSITION),
        ),
    )
    .await?;
    let row = row.first().cloned().unwrap_or_default();
    let rows = as_u64(row.get("n"));
    let position = if rows > 0 {
        row.get("last_position")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
    } else {
        None
    };
    Ok(LastCommit {
        rows,
        max_seq: as_u64(row.get("max_seq")),
        position,
    })
}

/// One table the sink writes, as prepared by `ensure_table`.
struct TableState {
    /// A client whose default database is the table's.
    client: Client,
    database: String,
    table: String,
    /// The `seq` of the next batch.
    next_seq: u64,
    /// The position in the newest data row.
    committed: Option<String>,
    /// A newer position of progress without rows (memory only).
    progress: Option<String>,
    /// Owners of a partitioned table (workers > 1).
    owners: Option<owners::Owners>,
    /// The open transaction's parts in the staging table, if any.
    staged: Option<staging::Staged>,
}

/// The ClickHouse sink.
pub struct ClickHouseSink {
    name: String,
    client: Client,
    database: String,
    tables: Mutex<HashMap<String, Arc<Mutex<TableState>>>>,
}

impl std::fmt::Debug for ClickHouseSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouseSink")
            .field("name", &self.name)
            .field("database", &self.database)
            .finish()
    }
}

impl ClickHouseSink {
    /// A sink as `spec` configures it (connects on first use); a CA file
    /// that cannot be read is an error.
    pub fn new(spec: &SinkSpec) -> Result<Self, SinkError> {
        Ok(ClickHouseSink {
            name: spec.name.name.clone(),
            client: client_for(spec)?,
            database: spec
                .options
                .get("database")
                .unwrap_or("default")
                .to_string(),
            tables: Mutex::new(HashMap::new()),
        })
    }

    /// `(database, table)` of a target name.
    fn names(&self, target: &TargetTable) -> Result<(String, String), SinkError> {
        match target.name.as_slice() {
            [t] => Ok((self.database.clone(), t.clone())),
            [d, t] => Ok((d.clone(), t.clone())),
            _ => Err(SinkError::TableMismatch(format!(
                "{}: a ClickHouse table name is `database.table` or `table`",
                target.display_name()
            ))),
        }
    }

    /// Whether `database.table` exists (asked without creating anything).
    async fn table_exists(&self, database: &str, table: &str) -> Result<bool, SinkError> {
        let found = query_rows(
            &self.client,
            &format!(
                "SELECT 1 AS found FROM system.tables WHERE database = {} AND name = {}",
                literal(database),
                literal(table)
            ),
        )
        .await?;
        Ok(!found.is_empty())
    }

    async fn state(&self, target: &TargetTable) -> Result<Arc<Mutex<TableState>>, SinkError> {
        let key = target.display_name();
        if let Some(s) = self.tables.lock().await.get(&key) {
            return Ok(Arc::clone(s));
        }
        self.ensure_table(target).await?;
        self.tables
            .lock()
            .await
            .get(&key)
            .cloned()
            .ok_or_else(|| SinkError::Io(format!("table {key} was not prepared")))
    }

    /// Checks an existing table against the route: columns and engine.
    async fn check_existing(
        &self,
        database: &str,
        table: &str,
        target: &TargetTable,
        engine: &str,
        sorting_key: &str,
    ) -> Result<(), SinkError> {
        let rows = query_rows(
            &self.client,
            &format!(
                "SELECT name, type FROM system.columns WHERE database = {} AND table = {} ORDER BY position",
                literal(database),
                literal(table)
            ),
        )
        .await?;
        let existing: Vec<(String, String)> = rows
            .iter()
            .map(|r| {
                (
                    r.get("name").and_then(Value::as_str).unwrap_or("").into(),
                    r.get("type").and_then(Value::as_str).unwrap_or("").into(),
                )
            })
            .collect();
        let mut problems = match target.schema_changes {
            SchemaChanges::Fail => ddl::column_problems(&existing, &ddl::table_columns(target)),
            SchemaChanges::Evolve => match ddl::evolution(database, table, &existing, target) {
                Ok(alters) => {
                    for sql in &alters {
                        execute(&self.client, sql).await?;
                    }
                    if !alters.is_empty() {
                        tracing::info!(table = %format!("{database}.{table}"), changes = %alters.join("; "), "evolved the table");
                    }
                    Vec::new()
                }
                Err(problems) => problems,
            },
        };
        let wanted_engine = ddl::engine_name(target);
        if engine != wanted_engine {
            problems.push(format!(
                "the engine is {engine}, the route needs {wanted_engine}"
            ));
        }
        // A replacing engine is unique by its ORDER BY.
        let what = match target.mode {
            WriteMode::Upsert => Some("key"),
            WriteMode::AppendIdempotent => Some("coordinate"),
            WriteMode::Append => None,
        };
        let order = target.order_columns();
        if let Some(what) = what
            && ddl::sorting_columns(sorting_key) != order
        {
            problems.push(format!(
                "ORDER BY is ({}), the route's {what} is ({})",
                sorting_key.trim_matches(|c| c == '(' || c == ')'),
                order.join(", ")
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SinkError::TableMismatch(format!(
                "{database}.{table} exists and does not match route {}: {}",
                target.display_name(),
                problems.join("; ")
            )))
        }
    }
}

#[async_trait]
impl Sink for ClickHouseSink {
    async fn ensure_table(&self, target: &TargetTable) -> Result<(), SinkError> {
        let (database, table) = self.names(target)?;
        let clashes = ddl::reserved_collisions(target);
        if !clashes.is_empty() {
            return Err(SinkError::TableMismatch(format!(
                "route {} writes column(s) {} that the ClickHouse sink reserves ({}); rename them in the SELECT",
                target.display_name(),
                clashes.join(", "),
                ddl::RESERVED.join(", ")
            )));
        }
        execute(
            &self.client,
            &format!("CREATE DATABASE IF NOT EXISTS {}", ident(&database)),
        )
        .await?;
        let found = query_rows(
            &self.client,
            &format!(
                "SELECT engine, sorting_key FROM system.tables WHERE database = {} AND name = {}",
                literal(&database),
                literal(&table)
            ),
        )
        .await?;
        match found.first() {
            Some(t) => {
                let engine = t.get("engine").and_then(Value::as_str).unwrap_or("");
                let sorting = t.get("sorting_key").and_then(Value::as_str).unwrap_or("");
                self.check_existing(&database, &table, target, engine, sorting)
                    .await?;
            }
            None => {
                execute(&self.client, &ddl::create_table(&database, &table, target)).await?;
                tracing::info!(table = %format!("{database}.{table}"), "created the table");
                for c in &target.columns {
                    if c.nullable && ddl::loses_null(&c.ty) {
                        tracing::warn!(
                            table = %format!("{database}.{table}"),
                            column = %c.name,
                            "ClickHouse has no NULL {}: a NULL value lands as an empty one",
                            if matches!(c.ty, urutau_planner::types::CanonicalType::List(_)) { "Array" } else { "Map" }
                        );
                    }
                }
            }
        }
        let client = self.client.clone().with_database(&database);
        let LastCommit {
            rows,
            max_seq,
            position: committed,
        } = last_commit(&client, &database, &table).await?;
        let owners = if target.workers > 1 {
            Some(
                owners::Owners::prepare(&client, &database, &table, target.workers, rows, max_seq)
                    .await?,
            )
        } else {
            None
        };
        let next_seq = match &owners {
            Some(o) => max_seq.max(o.max_seq()) + 1,
            None => max_seq + 1,
        };
        let state = TableState {
            client,
            database,
            table,
            next_seq,
            committed,
            progress: None,
            owners,
            staged: None,
        };
        if staging::stages(target) {
            staging::discard(&state).await?;
        }
        self.tables
            .lock()
            .await
            .insert(target.display_name(), Arc::new(Mutex::new(state)));
        Ok(())
    }

    async fn peek_position(&self, target: &TargetTable) -> Result<Option<String>, SinkError> {
        if target.workers > 1 {
            return Err(SinkError::Unavailable(format!(
                "table {}: previewing a table written by several workers is not supported; preview with workers = 1",
                target.display_name()
            )));
        }
        let (database, table) = self.names(target)?;
        if !self.table_exists(&database, &table).await? {
            return Ok(None);
        }
        Ok(last_commit(&self.client, &database, &table).await?.position)
    }

    async fn read_table(
        &self,
        target: &TargetTable,
    ) -> Result<Option<Arc<dyn TableProvider>>, SinkError> {
        let (database, table) = self.names(target)?;
        if !self.table_exists(&database, &table).await? {
            return Ok(None);
        }
        Ok(Some(Arc::new(read::ClickHouseTableReader::new(
            self.client.clone(),
            &database,
            &table,
            target,
        ))))
    }

    async fn committed_position(&self, target: &TargetTable) -> Result<Option<String>, SinkError> {
        let state = self.state(target).await?;
        let s = state.lock().await;
        if let Some(o) = &s.owners {
            return o.resume_position();
        }
        Ok(s.progress.clone().or_else(|| s.committed.clone()))
    }

    async fn commit(
        &self,
        target: &TargetTable,
        batch: &SinkBatch,
        position: &str,
    ) -> Result<(), SinkError> {
        let state = self.state(target).await?;
        let mut s = state.lock().await;
        if let Some(staged) = s.staged {
            return staging::commit(&mut s, staged, batch, position).await;
        }
        if batch.rows.num_rows() == 0 {
            // Nothing to write; see the module docs for why memory is enough.
            s.progress = Some(position.to_string());
            return Ok(());
        }
        if s.owners.is_some() {
            return owners::commit(&mut s, target, batch, position).await;
        }
        let seq = s.next_seq;
        let rows = insert::with_reserved(&batch.rows, &batch.deletes, position, seq)?;
        insert::insert_once(&s.client, &s.database, &s.table, &rows, seq).await?;
        s.next_seq = seq + 1;
        s.committed = Some(position.to_string());
        s.progress = None;
        Ok(())
    }

    fn stages_transactions(&self, target: &TargetTable) -> bool {
        staging::stages(target)
    }

    async fn stage(&self, target: &TargetTable, batch: &SinkBatch) -> Result<(), SinkError> {
        let state = self.state(target).await?;
        let mut s = state.lock().await;
        staging::stage_part(&mut s, batch).await
    }
}

/// What `urutau clickhouse cleanup` did to one table.
#[derive(Debug)]
pub struct CleanupOutcome {
    pub table: String,
    /// Tombstones and replaced rows before and after (rows not visible
    /// under `FINAL`).
    pub hidden_before: u64,
    pub hidden_after: u64,
    /// Why nothing was done, when nothing was.
    pub skipped: Option<String>,
}

/// Removes tombstones and replaced rows of an upsert table physically:
/// `OPTIMIZE TABLE .. FINAL CLEANUP`, after setting the table setting it
/// requires; and the duplicates of an append-idempotent table (rows sharing
/// a coordinate): `OPTIMIZE TABLE .. FINAL`. Reads under `FINAL` are the
/// same before and after.
pub async fn cleanup(spec: &SinkSpec, target: &TargetTable) -> Result<CleanupOutcome, SinkError> {
    let sink = ClickHouseSink::new(spec)?;
    let (database, table) = sink.names(target)?;
    let name = format!("{database}.{table}");
    let full = format!("{}.{}", ident(&database), ident(&table));
    if target.mode == WriteMode::Append {
        return Ok(CleanupOutcome {
            table: name,
            hidden_before: 0,
            hidden_after: 0,
            skipped: Some("an append table has no tombstones and nothing to merge".into()),
        });
    }
    let exists = query_rows(
        &sink.client,
        &format!(
            "SELECT 1 AS x FROM system.tables WHERE database = {} AND name = {}",
            literal(&database),
            literal(&table)
        ),
    )
    .await?;
    if exists.is_empty() {
        return Ok(CleanupOutcome {
            table: name,
            hidden_before: 0,
            hidden_after: 0,
            skipped: Some("the table does not exist yet".into()),
        });
    }
    let hidden = |sql_table: String| {
        let client = sink.client.clone();
        async move {
            let r = query_rows(
                &client,
                &format!(
                    "SELECT (SELECT count() FROM {sql_table}) - (SELECT count() FROM {sql_table} FINAL) AS hidden"
                ),
            )
            .await?;
            Ok::<u64, SinkError>(as_u64(r.first().and_then(|r| r.get("hidden"))))
        }
    };
    let hidden_before = hidden(full.clone()).await?;
    if target.mode == WriteMode::Upsert {
        execute(
            &sink.client,
            &format!(
                "ALTER TABLE {full} MODIFY SETTING allow_experimental_replacing_merge_with_cleanup = 1"
            ),
        )
        .await?;
        execute(
            &sink.client,
            &format!("OPTIMIZE TABLE {full} FINAL CLEANUP"),
        )
        .await?;
    } else {
        // Append-idempotent: the copies of a change merge into one.
        execute(&sink.client, &format!("OPTIMIZE TABLE {full} FINAL")).await?;
    }
    let hidden_after = hidden(full).await?;
    Ok(CleanupOutcome {
        table: name,
        hidden_before,
        hidden_after,
        skipped: None,
    })
}
