//! The Iceberg sink: upsert by equality delete, one snapshot per batch with
//! the position in it (see [`commit`]), tables created from the route's
//! target, resume from the table itself.
//!
//! Catalogs: the SQL catalog on SQLite with a local warehouse (the embedded
//! default) or on Postgres; the REST catalog, whose tables are on S3 or on
//! the local file system (each table's storage follows its location).

mod catalog;
pub mod commit;
mod compaction;
mod deletes;
mod dictionary;
mod durable;
mod expiry;
mod files;
mod key_ranges;
pub mod maintenance;
mod maintenance_turn;
mod manifest_merge;
mod orphans;
mod parquet_file;
mod read;
pub mod schema;
mod snapshot_group;
mod uuid_text;
mod written_lists;
mod written_manifests;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{and, concat, concat_batches, filter, filter_record_batch, not};
use arrow::datatypes::SchemaRef as ArrowSchemaRef;
use async_trait::async_trait;
use datafusion::catalog::TableProvider;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{
    DataFile, FormatVersion, PartitionSpecRef, TableMetadataBuildResult, UnboundPartitionSpec,
};
use iceberg::table::Table;
use iceberg::{TableCreation, TableIdent};
use tokio::sync::{Mutex, OnceCell};
use urutau_planner::evolution::SchemaChanges;
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SinkKindDef, SinkProvider};
use urutau_planner::sink::{Committed, PreparedBatch, Sink, SinkBatch, SinkError};
use urutau_planner::spec::{SinkSpec, WriteMode};
use urutau_planner::target::TargetTable;

use catalog::{Conn, Outcome, RestCatalogConn, RestConfig, SqlCatalogConn};
use commit::RowDelta;
use key_ranges::KeyRanges;
use maintenance::Maintenance;
use snapshot_group::SnapshotGroup;

/// Maps an error of the iceberg crate (or any other) into a sink error with
/// what was being done. A certificate the object store's client refused
/// (named only deep in the error's causes) is said, with what to set.
pub(crate) fn io_error<E: std::error::Error + 'static>(
    doing: &'static str,
) -> impl Fn(E) -> SinkError {
    move |e| {
        let causes = crate::tls::with_causes(&e);
        match crate::tls::hint(&causes, "ca_cert") {
            Some(hint) => SinkError::Io(format!(
                "{doing}: the object store refused: {hint} ({causes})"
            )),
            None => SinkError::Io(format!("{doing}: {e}")),
        }
    }
}

/// Fault injection for tests: the next `n` successful catalog swaps report
/// a failure, as a lost response would (a fault no real catalog can be made
/// to produce on demand). The sink must then find its commit by id instead
/// of committing it twice. Only in builds with the `fault-injection`
/// feature (the test suite's), never in a release.
#[cfg(feature = "fault-injection")]
pub mod faults {
    use std::sync::atomic::{AtomicU32, Ordering};

    static LOSE_RESPONSES: AtomicU32 = AtomicU32::new(0);

    /// Makes the next `n` successful swaps look failed.
    pub fn lose_next_responses(n: u32) {
        LOSE_RESPONSES.store(n, Ordering::SeqCst);
    }

    pub(super) fn take_lost_response() -> bool {
        LOSE_RESPONSES
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Test hook: when `URUTAU_TEST_PAUSE_AT` names `point` (`compaction`:
/// its files written, not committed; `expiry`: committed, its manifest
/// lists not deleted; `orphans`: the first orphan removed), writes the file
/// `URUTAU_TEST_PAUSE_MARK` names and blocks this thread for good, so that
/// a test kills the process with SIGKILL exactly there. Only in builds
/// with the `fault-injection` feature; a no-op otherwise.
pub(crate) fn pause_point(point: &str) {
    #[cfg(feature = "fault-injection")]
    if std::env::var("URUTAU_TEST_PAUSE_AT").is_ok_and(|p| p == point) {
        if let Ok(mark) = std::env::var("URUTAU_TEST_PAUSE_MARK") {
            let _ = std::fs::write(mark, point);
        }
        tracing::warn!(point, "test hook: paused for a kill -9");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = point;
}

/// Whether a test armed a lost response for this swap
/// ([`faults::lose_next_responses`]); always false without the
/// `fault-injection` feature.
fn injected_lost_response() -> bool {
    #[cfg(feature = "fault-injection")]
    {
        faults::take_lost_response()
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        false
    }
}

/// Catalog commits retried after a conflict (each with a fresh table load).
const COMMIT_TRIES: u32 = 5;
/// First retry delay; doubles each time.
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

fn options() -> Vec<OptionDef> {
    use OptionType as T;
    vec![
        OptionDef::retry_timeout(),
        OptionDef::new(
            "catalog",
            T::Enum(&["sql", "rest"]),
            "sql (SQLite or Postgres catalog; the embedded default) | rest",
        )
        .default("sql"),
        OptionDef::new(
            "uri",
            T::String,
            "sql: sqlite://path or postgres://...; rest: http(s)://host/path",
        )
        .required(),
        OptionDef::new(
            "warehouse",
            T::String,
            "local path or s3://bucket/prefix (rest: the catalog's warehouse)",
        )
        .default("warehouse"),
        OptionDef::new("namespace", T::String, "namespace of one-part target names").required(),
        OptionDef::new(
            "catalog_name",
            T::String,
            "sql: the catalog_name of the catalog's rows (default: the sink's name)",
        ),
        OptionDef::new("client_id", T::String, "REST: OAuth2 client id"),
        OptionDef::new("client_secret", T::String, "REST: OAuth2 client secret").secret(),
        OptionDef::new("scope", T::String, "REST: OAuth2 scope"),
        OptionDef::new(
            "token",
            T::String,
            "REST: a bearer token instead of client credentials",
        )
        .secret(),
        OptionDef::new(
            "s3_endpoint",
            T::String,
            "S3 endpoint (MinIO, SeaweedFS, ...)",
        ),
        OptionDef::new("s3_region", T::String, "S3 region"),
        OptionDef::new("s3_path_style", T::Bool, "S3 path-style addressing"),
        OptionDef::new(
            "s3_access_key_id",
            T::String,
            "S3 access key (default: AWS_ACCESS_KEY_ID)",
        )
        .secret(),
        OptionDef::new(
            "s3_secret_access_key",
            T::String,
            "S3 secret key (default: AWS_SECRET_ACCESS_KEY)",
        )
        .secret(),
        OptionDef::new(
            "ca_cert",
            T::String,
            "REST and S3 over https: PEM file of the CA(s) the catalog's and the object store's certificates are signed by; both then trust exactly these (default: SSL_CERT_FILE, else the catalog client's built-in web CAs and the object store client's system CAs)",
        ),
        OptionDef::new(
            "target_file_size",
            T::Size,
            "data files are written up to this size, and an initial snapshot's rows are gathered into files of it (default: maintenance_compaction_target_file_size when set, else the table's write.target-file-size-bytes, 512Mi)",
        ),
        OptionDef::new("maintenance_enabled", T::Bool, "run table maintenance"),
        OptionDef::new(
            "maintenance_compaction_interval",
            T::Duration,
            "how often to compact",
        ),
        OptionDef::new(
            "maintenance_compaction_target_file_size",
            T::Size,
            "compacted file size",
        ),
        OptionDef::new(
            "maintenance_compaction_min_input_files",
            T::Int {
                min: 2,
                max: 100_000,
            },
            "files a partition group needs before it is compacted",
        ),
        OptionDef::new(
            "maintenance_snapshot_expiry_interval",
            T::Duration,
            "how often to expire snapshots",
        ),
        OptionDef::new(
            "maintenance_snapshot_expiry_retain_last",
            T::Int {
                min: 1,
                max: 1_000_000,
            },
            "snapshots always kept",
        ),
        OptionDef::new(
            "maintenance_snapshot_expiry_max_age",
            T::Duration,
            "snapshots older than this expire (bounds how long a stopped pipeline can resume)",
        ),
        OptionDef::new(
            "maintenance_orphan_cleanup_interval",
            T::Duration,
            "how often to remove orphan files",
        ),
        OptionDef::new(
            "maintenance_orphan_cleanup_older_than",
            T::Duration,
            "only files older than this are orphans",
        ),
    ]
}

/// Registers the `iceberg` kind.
pub struct IcebergSinkProvider {
    def: SinkKindDef,
}

impl IcebergSinkProvider {
    /// The `iceberg` kind's definition.
    pub fn new() -> Self {
        IcebergSinkProvider {
            def: SinkKindDef {
                name: "iceberg",
                exec_name: "IcebergSinkExec",
                doc: "Apache Iceberg: upsert by equality delete, one snapshot per batch, position in the table",
                options: options(),
                maintenance: true,
                partitioning: true,
                partitioning_warning: None,
                // The writer does not split a table among owners yet.
                partitioned_tables: false,
                write_modes: &[
                    WriteMode::Upsert,
                    WriteMode::Append,
                    WriteMode::AppendIdempotent,
                ],
                namespace_option: Some("namespace"),
                route_rules: vec![],
            },
        }
    }
}

impl Default for IcebergSinkProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl SinkProvider for IcebergSinkProvider {
    fn def(&self) -> &SinkKindDef {
        &self.def
    }

    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        let get = |k: &str| spec.options.get(k).map(str::to_string);
        let rest = RestConfig {
            uri: get("uri").unwrap_or_default(),
            warehouse: get("warehouse").unwrap_or_default(),
            client_id: get("client_id"),
            client_secret: get("client_secret"),
            scope: get("scope"),
            token: get("token"),
            s3_endpoint: get("s3_endpoint"),
            s3_region: get("s3_region"),
            s3_path_style: get("s3_path_style").map(|v| v == "true"),
            s3_access_key_id: get("s3_access_key_id"),
            s3_secret_access_key: get("s3_secret_access_key"),
            ca_cert: get("ca_cert"),
        };
        if rest.ca_cert.is_some() && get("catalog").as_deref() != Some("rest") {
            return Err(SinkError::Unavailable(
                "ca_cert is the REST catalog's CA (catalog = 'rest'); a Postgres SQL catalog takes sslrootcert (and sslmode) in its uri"
                    .to_string(),
            ));
        }
        Ok(Arc::new(IcebergSink {
            name: spec.name.name.clone(),
            rest,
            catalog: get("catalog").unwrap_or_else(|| "sql".into()),
            uri: get("uri").unwrap_or_default(),
            warehouse: get("warehouse").unwrap_or_else(|| "warehouse".into()),
            catalog_name: get("catalog_name").unwrap_or_else(|| spec.name.name.clone()),
            maintenance: {
                let m = Maintenance::from_options(get).map_err(SinkError::Unavailable)?;
                if let Some(o) = &m.orphans
                    && o.older_than < Duration::from_secs(3600)
                {
                    tracing::warn!(
                        sink = %spec.name.name,
                        "maintenance_orphan_cleanup_older_than is under 1h: a file another writer has written but not yet committed can be removed as an orphan; keep it this short only when this pipeline is the table's one writer"
                    );
                }
                // (A REST warehouse may also be a name: its tables' locations
                // tell, and cleanup skips a table that is not local.)
                if m.orphans.is_some()
                    && get("catalog").as_deref() == Some("rest")
                    && get("warehouse")
                        .is_some_and(|w| w.contains("://") && !w.starts_with("file:"))
                {
                    return Err(SinkError::Unavailable(
                        "table maintenance: orphan cleanup needs a local warehouse in this build; remove the maintenance_orphan_cleanup_* settings"
                            .to_string(),
                    ));
                }
                m
            },
            target_file_size: match get("target_file_size") {
                Some(text) => Some(
                    urutau_planner::options::parse_size(&text)
                        .map_err(|e| SinkError::Unavailable(format!("target_file_size: {e}")))?,
                ),
                None => None,
            },
            conn: OnceCell::new(),
            tables: Mutex::new(HashMap::new()),
        }))
    }
}

/// What writing a table's files needs, apart from its commits: the next
/// batch's files are written ([`Sink::prepare`]) while a commit holds the
/// table's [`TableState`].
struct Writing {
    /// The table as prepared: its schema, specs, location and storage (a
    /// run does not change them; a schema change prepares the table anew).
    table: Table,
    /// The table's Arrow schema (field ids, Iceberg's nested names).
    arrow: ArrowSchemaRef,
    /// Key columns: their positions in `arrow` and their field ids.
    key_indices: Vec<usize>,
    key_ids: Vec<i32>,
    /// The spec equality deletes are written with (unpartitioned, so they
    /// apply in every partition).
    delete_spec: PartitionSpecRef,
    /// Where the table's keys may be: a row outside every range is new and
    /// needs no equality delete (see [`key_ranges`]). Read and grown by
    /// batches in order, as they are prepared.
    key_ranges: std::sync::Mutex<KeyRanges>,
    /// How many times a commit found another writer's commits (and took
    /// their key ranges in): files prepared before then may write a key as
    /// new that the other writer's files hold, so their commit checks.
    others_seen: AtomicU64,
    /// Held (shared) while a batch's files are written, and (alone) by
    /// orphan cleanup: a file being written is never taken for an orphan.
    files_gate: tokio::sync::RwLock<()>,
    /// Local files written for batches not committed yet: no snapshot
    /// references them, and orphan cleanup must leave them.
    pending: std::sync::Mutex<HashSet<PathBuf>>,
    /// A snapshot's deferred batches not committed yet ([`snapshot_group`]).
    group: Mutex<Option<SnapshotGroup>>,
    /// The size data files grow to, those a snapshot group gathers too:
    /// the sink's `target_file_size`, else compaction's target when
    /// configured, else the table's `write.target-file-size-bytes` (512
    /// MiB by default).
    target_file_size: usize,
}

impl Writing {
    fn key_ranges(&self) -> std::sync::MutexGuard<'_, KeyRanges> {
        self.key_ranges.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The local paths of `files` (object-storage files have none: orphan
    /// cleanup does not list object stores).
    fn local_paths(files: &[DataFile]) -> impl Iterator<Item = PathBuf> + '_ {
        files
            .iter()
            .filter_map(|f| durable::local_path(f.file_path()))
    }
}

/// A batch's files, written ahead of its commit ([`Sink::prepare`]).
struct PreparedFiles {
    data_files: Vec<DataFile>,
    delete_files: Vec<DataFile>,
    /// The keys written without an equality delete (none was in the
    /// table as far as [`Writing::key_ranges`] knew).
    fresh: Fresh,
    /// [`Writing::others_seen`] before the key ranges were read.
    others_seen: u64,
}

/// The keys a commit writes as new ([`IcebergSink::commit_with_retries`]).
enum Fresh {
    None,
    Keys(ArrayRef),
    /// Every row of the delta's data files (a snapshot group's): read back
    /// from them when a commit must check them.
    InDataFiles,
}

/// What [`IcebergSink::prepare`] did for a batch.
enum Work {
    /// The batch's own files (`None`: it has no rows).
    Files(Option<PreparedFiles>),
    /// The batch joined the open snapshot group: nothing to commit yet.
    Deferred,
    /// A snapshot group closed (the batch's rows are in it): its appended
    /// rows staged first, then its held rows with the batch's position.
    Group(GroupFiles),
}

/// A closed snapshot group's files: the appended rows', and its held rows'
/// (one part), staged in that order.
struct GroupFiles {
    appended: PreparedFiles,
    held: Option<PreparedFiles>,
}

/// A table's entry: what writing files needs, and the state commits hold.
#[derive(Clone)]
struct TableEntry {
    writing: Arc<Writing>,
    state: Arc<Mutex<TableState>>,
}

/// One table the sink writes, as loaded.
struct TableState {
    ident: TableIdent,
    table: Table,
    writing: Arc<Writing>,
    /// When compaction last ran on this table (never: due).
    last_compaction: Option<Instant>,
    /// When snapshot expiry last ran on this table (never: due).
    last_expiry: Option<Instant>,
    /// When orphan cleanup last ran on this table (never: due).
    last_orphan_cleanup: Option<Instant>,
    /// The head of the staging branch this sink built (parts of an open
    /// transaction), `None` while it has staged nothing
    /// ([`commit::RowDelta::own_staging`]).
    own_staging: Option<i64>,
}

/// The Iceberg sink.
pub struct IcebergSink {
    name: String,
    rest: RestConfig,
    catalog: String,
    uri: String,
    warehouse: String,
    catalog_name: String,
    maintenance: Maintenance,
    /// `target_file_size`, when given ([`IcebergSink::target_file_size`]).
    target_file_size: Option<u64>,
    conn: OnceCell<Conn>,
    tables: Mutex<HashMap<String, TableEntry>>,
}

impl std::fmt::Debug for IcebergSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcebergSink")
            .field("name", &self.name)
            .finish()
    }
}

fn ident_of(target: &TargetTable) -> Result<TableIdent, SinkError> {
    TableIdent::from_strs(&target.name).map_err(io_error("the table name"))
}

impl IcebergSink {
    async fn conn(&self) -> Result<&Conn, SinkError> {
        self.conn
            .get_or_try_init(|| async {
                if self.catalog == "rest" {
                    RestCatalogConn::connect(self.rest.clone(), &self.catalog_name)
                        .await
                        .map(|c| Conn::Rest(Box::new(c)))
                } else {
                    SqlCatalogConn::connect(&self.uri, &self.warehouse, &self.catalog_name)
                        .await
                        .map(|c| Conn::Sql(Box::new(c)))
                }
            })
            .await
    }

    async fn state(&self, target: &TargetTable) -> Result<Arc<Mutex<TableState>>, SinkError> {
        Ok(self.entry(target).await?.state)
    }

    async fn entry(&self, target: &TargetTable) -> Result<TableEntry, SinkError> {
        let key = target.display_name();
        if let Some(s) = self.tables.lock().await.get(&key) {
            return Ok(s.clone());
        }
        self.ensure_table(target).await?;
        self.tables
            .lock()
            .await
            .get(&key)
            .cloned()
            .ok_or_else(|| SinkError::Io(format!("table {key} was not prepared")))
    }

    /// The table as the catalog holds it, loaded without creating anything
    /// (queries, previews); `None` when it does not exist.
    async fn load_read_only(&self, target: &TargetTable) -> Result<Option<Table>, SinkError> {
        let ident = ident_of(target)?;
        if self.catalog == "rest" {
            self.conn().await?.load(&ident).await
        } else {
            catalog::load_sql_read_only(&self.uri, &self.catalog_name, &ident).await
        }
    }

    async fn reload(&self, ident: &TableIdent) -> Result<Table, SinkError> {
        self.conn()
            .await?
            .load(ident)
            .await?
            .ok_or_else(|| SinkError::Io(format!("table {ident} no longer exists in the catalog")))
    }

    /// Commits the metadata-only change `change` makes of the current
    /// table, if any (`Ok(None)`: the table needs none), with a note for
    /// the log; after a conflict, or an error that leaves the outcome
    /// unknown, the table is reloaded (it shows whether the change landed)
    /// and `change` asked again.
    async fn commit_metadata<F>(
        &self,
        mut table: Table,
        what: &str,
        change: F,
    ) -> Result<Table, SinkError>
    where
        F: Fn(&Table) -> Result<Option<(TableMetadataBuildResult, String)>, SinkError>,
    {
        let mut attempt = 0;
        loop {
            let Some((result, note)) = change(&table)? else {
                return Ok(table);
            };
            if attempt == COMMIT_TRIES {
                return Err(SinkError::Io(format!("{what}: too many conflicts")));
            }
            match self.conn().await?.commit(&table, result, &[]).await {
                Outcome::Committed(t) => {
                    tracing::info!(table = %t.identifier(), schema_id = t.metadata().current_schema_id(), "{note}");
                    table = t;
                }
                Outcome::Conflict | Outcome::Unknown(_) => {
                    tokio::time::sleep(RETRY_BACKOFF * 2u32.pow(attempt)).await;
                    table = self.reload(table.identifier()).await?;
                }
            }
            attempt += 1;
        }
    }

    /// Removes the parts of a transaction an earlier run staged and did not
    /// commit (it crashed or failed mid-transaction): the transaction is
    /// read again from the committed position.
    async fn discard_staging(&self, table: Table) -> Result<Table, SinkError> {
        self.commit_metadata(table, "removing the staging branch", |table| {
            if !commit::has_staging(table.metadata()) {
                return Ok(None);
            }
            let note = "discarded the parts of a transaction an earlier run staged and did not commit; it is read again";
            Ok(Some((commit::discard_staging(table)?, note.to_string())))
        })
        .await
    }

    /// Evolves an existing table's schema toward `target` when it differs
    /// ([`schema::evolve`]: columns added, types promoted, columns relaxed
    /// to optional), in a metadata-only commit that keeps the table's
    /// position: the rows of the new shape come in later commits, so a
    /// crash never leaves them without their columns.
    async fn evolve_table(&self, table: Table, target: &TargetTable) -> Result<Table, SinkError> {
        self.commit_metadata(table, "evolving the table's schema", |table| {
            let md = table.metadata();
            let evolved = schema::evolve(md.current_schema(), md.last_column_id(), target)
                .map_err(|problems| {
                    SinkError::TableMismatch(format!(
                        "{} exists and cannot be evolved to route {}: {}",
                        table.identifier(),
                        target.display_name(),
                        problems.join("; ")
                    ))
                })?;
            let Some(evolved) = evolved else {
                return Ok(None);
            };
            let result = commit::next_metadata(table)
                .and_then(|b| b.add_current_schema(evolved.schema))
                .and_then(|b| b.build())
                .map_err(io_error("evolving the table's schema"))?;
            let note = format!("evolved the table's schema: {}", evolved.changes.join("; "));
            Ok(Some((result, note)))
        })
        .await
    }

    /// Adds an unpartitioned spec to a partitioned table (for global
    /// equality deletes) unless it has one; returns the table and the spec.
    async fn delete_spec(&self, table: Table) -> Result<(Table, PartitionSpecRef), SinkError> {
        let unpartitioned = |table: &Table| {
            let md = table.metadata();
            if md.default_partition_spec().is_unpartitioned() {
                Some(md.default_partition_spec().clone())
            } else {
                md.partition_specs_iter()
                    .find(|s| s.is_unpartitioned())
                    .cloned()
            }
        };
        let table = self
            .commit_metadata(table, "adding an unpartitioned spec", |table| {
                if unpartitioned(table).is_some() {
                    return Ok(None);
                }
                let result = commit::next_metadata(table)
                    .and_then(|b| b.add_partition_spec(UnboundPartitionSpec::builder().build()))
                    .and_then(|b| b.build())
                    .map_err(io_error("adding an unpartitioned spec"))?;
                Ok(Some((result, "added an unpartitioned spec".to_string())))
            })
            .await?;
        let spec = unpartitioned(&table).expect("committed above");
        Ok((table, spec))
    }

    /// Swaps in what `build` makes of the current table, reloading and
    /// rebuilding after a conflict; a commit whose outcome is unknown is
    /// looked for by its id before it is tried again.
    ///
    /// `fresh` holds the keys of the rows written without an equality
    /// delete (none was in the table), or says every row of the delta's
    /// data files has one: when a conflict shows another writer's commit,
    /// or `others_since` says one was found after the files were written,
    /// those of them its files may hold get one.
    async fn commit_with_retries(
        &self,
        state: &mut TableState,
        delta: &mut RowDelta,
        position_only: bool,
        fresh: Fresh,
        others_since: bool,
    ) -> Result<(), SinkError> {
        let (mut fresh, mut fresh_in_data_files) = match fresh {
            Fresh::None => (None, false),
            Fresh::Keys(keys) => (Some(keys), false),
            Fresh::InDataFiles => (None, true),
        };
        let conn = self.conn().await?;
        let mut table = state.table.clone();
        let mut last_error = None;
        let mut added: Vec<String> = delta
            .data_files
            .iter()
            .chain(&delta.delete_files)
            .map(|f| f.file_path().to_string())
            .collect();
        for attempt in 0..COMMIT_TRIES {
            if attempt > 0 {
                tokio::time::sleep(RETRY_BACKOFF * 2u32.pow(attempt - 1)).await;
                table = self.reload(&state.ident).await?;
                if !position_only && commit::holds_commit(table.metadata(), &delta.commit_id) {
                    // Landed; the reload may show another writer's commits
                    // too, whose keys must join the ranges.
                    self.take_in_other_writers_or_anywhere(state, &table).await;
                    state.own_staging = own_staging_after(&table, delta);
                    state.table = table;
                    return Ok(());
                }
            }
            // A reload, or one since the files were written, may show
            // another writer's commits.
            let theirs =
                if attempt > 0 || (others_since && (fresh.is_some() || fresh_in_data_files)) {
                    self.take_in_other_writers(state, &table).await?
                } else {
                    None
                };
            if theirs.is_some() && fresh_in_data_files {
                fresh_in_data_files = false;
                fresh = Some(self.read_back_keys(state, &delta.data_files).await?);
            }
            if let Some(theirs) = &theirs
                && let Some(keys) = fresh.take()
            {
                fresh = self
                    .delete_fresh_keys_now_present(state, &table, theirs, keys, delta, &mut added)
                    .await?;
            }
            let result = if position_only {
                commit::build_position_only(&table, &delta.position)?
            } else {
                commit::build_row_delta(&table, delta).await?
            };
            let outcome = match conn.commit(&table, result, &added).await {
                Outcome::Committed(_) if injected_lost_response() => Outcome::Unknown(
                    SinkError::Io("the catalog's response was lost (injected fault)".into()),
                ),
                other => other,
            };
            match outcome {
                Outcome::Committed(t) => {
                    state.own_staging = own_staging_after(&t, delta);
                    state.table = t;
                    return Ok(());
                }
                Outcome::Conflict => {
                    tracing::info!(table = %state.ident, attempt, "commit conflict: reloading and retrying");
                    last_error = Some(SinkError::Io("another writer committed first".into()));
                }
                Outcome::Unknown(e) => {
                    tracing::warn!(table = %state.ident, attempt, error = %e, "commit failed: checking whether it landed");
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| SinkError::Io("commit failed".into())))
    }
}

#[async_trait]
impl Sink for IcebergSink {
    fn extra_work(&self) -> Option<String> {
        let files = self
            .target_file_size
            .map(|n| format!("target_file_size={n} (snapshots gathered into files of it)"));
        let parts: Vec<String> = files
            .into_iter()
            .chain(self.maintenance.describe())
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    async fn ensure_table(&self, target: &TargetTable) -> Result<(), SinkError> {
        let conn = self.conn().await?;
        let ident = ident_of(target)?;
        let wanted = schema::table_schema(target).map_err(io_error("the table's schema"))?;
        let table = match conn.load(&ident).await? {
            Some(t) if target.schema_changes == SchemaChanges::Fail => {
                let problems = schema::check_existing(t.metadata().current_schema(), &wanted);
                if !problems.is_empty() {
                    return Err(SinkError::TableMismatch(format!(
                        "{ident} exists and does not match route {} (schema_changes = 'fail'): {}",
                        target.display_name(),
                        problems.join("; ")
                    )));
                }
                t
            }
            Some(t) => self.evolve_table(t, target).await?,
            None => {
                let spec = schema::partition_spec(&target.partition_by, &wanted)
                    .map_err(io_error("the partition spec"))?;
                let order =
                    schema::sort_order(target, &wanted).map_err(io_error("the sort order"))?;
                let mut properties =
                    vec![("write.format.default".to_string(), "parquet".to_string())];
                if target.mode == WriteMode::Upsert {
                    properties.push(("write.upsert.enabled".to_string(), "true".to_string()));
                }
                let creation = TableCreation::builder()
                    .name(ident.name().to_string())
                    .schema(wanted)
                    .partition_spec(spec)
                    .sort_order(order)
                    .properties(properties)
                    .build();
                let t = conn.create(&ident, creation).await?;
                tracing::info!(table = %ident, "created the table");
                t
            }
        };
        let table = self.discard_staging(table).await?;
        let (table, delete_spec) = if target.mode == WriteMode::Upsert {
            self.delete_spec(table).await?
        } else {
            let spec = table.metadata().default_partition_spec().clone();
            (table, spec)
        };
        // Field ids come from the table (creation reassigns them).
        let current = table.metadata().current_schema().clone();
        let arrow = Arc::new(
            schema_to_arrow_schema(&current).map_err(io_error("the table's Arrow schema"))?,
        );
        let mut key_indices = Vec::new();
        let mut key_ids = Vec::new();
        for k in &target.key {
            let i = arrow.index_of(k).map_err(|_| {
                SinkError::TableMismatch(format!("{ident} has no key column `{k}`"))
            })?;
            key_indices.push(i);
            key_ids.push(current.field_id_by_name(k).unwrap_or_default());
        }
        let key_ranges = match key_ids.as_slice() {
            [id] if target.mode == WriteMode::Upsert => {
                let live = compaction::live_files(&table).await?;
                KeyRanges::from_live_files(&live.files, *id)
            }
            _ => KeyRanges::anywhere(),
        };
        tracing::debug!(table = %ident, tracking = key_ranges.is_tracking(), "where the table's keys may be");
        let writing = Arc::new(Writing {
            table: table.clone(),
            arrow,
            key_indices,
            key_ids,
            delete_spec,
            key_ranges: std::sync::Mutex::new(key_ranges),
            others_seen: AtomicU64::new(0),
            files_gate: tokio::sync::RwLock::new(()),
            pending: std::sync::Mutex::new(HashSet::new()),
            group: Mutex::new(None),
            target_file_size: self.target_file_size(&table),
        });
        let state = Arc::new(Mutex::new(TableState {
            ident,
            table,
            writing: Arc::clone(&writing),
            last_compaction: None,
            last_expiry: None,
            last_orphan_cleanup: None,
            own_staging: None,
        }));
        self.tables
            .lock()
            .await
            .insert(target.display_name(), TableEntry { writing, state });
        Ok(())
    }

    async fn schema_version(&self, target: &TargetTable) -> Option<String> {
        let state = self.state(target).await.ok()?;
        let s = state.lock().await;
        Some(format!(
            "schema-id {}",
            s.table.metadata().current_schema_id()
        ))
    }

    async fn peek_position(&self, target: &TargetTable) -> Result<Option<String>, SinkError> {
        Ok(self
            .load_read_only(target)
            .await?
            .and_then(|t| commit::committed_position(t.metadata())))
    }

    async fn read_table(
        &self,
        target: &TargetTable,
    ) -> Result<Option<Arc<dyn TableProvider>>, SinkError> {
        let Some(table) = self.load_read_only(target).await? else {
            return Ok(None);
        };
        // The current snapshot with its deletes applied (`read`).
        Ok(Some(read::provider(table).await?))
    }

    async fn committed_position(&self, target: &TargetTable) -> Result<Option<String>, SinkError> {
        let state = self.state(target).await?;
        let s = state.lock().await;
        Ok(commit::committed_position(s.table.metadata()))
    }

    fn stages_transactions(&self, _table: &TargetTable) -> bool {
        true
    }

    async fn stage(&self, target: &TargetTable, batch: &SinkBatch) -> Result<(), SinkError> {
        let files = self.write_files(target, batch).await?;
        self.stage_files(target, files).await
    }

    async fn commit(
        &self,
        target: &TargetTable,
        batch: &SinkBatch,
        position: &str,
    ) -> Result<(), SinkError> {
        let files = self.write_files(target, batch).await?;
        self.commit_files(target, files, Some(position)).await
    }

    async fn prepare(
        &self,
        target: &TargetTable,
        batch: SinkBatch,
        may_defer: bool,
    ) -> Result<PreparedBatch, SinkError> {
        let work = self.prepare_work(target, &batch, may_defer).await?;
        Ok(PreparedBatch {
            batch,
            work: Some(Box::new(work)),
        })
    }

    async fn stage_prepared(
        &self,
        target: &TargetTable,
        prepared: PreparedBatch,
    ) -> Result<(), SinkError> {
        match prepared_work(prepared)? {
            Work::Files(files) => self.stage_files(target, files).await,
            Work::Deferred => Err(SinkError::Io(
                "internal: a staged part of a transaction was deferred".to_string(),
            )),
            Work::Group(group) => {
                self.stage_files(target, Some(group.appended)).await?;
                self.stage_files(target, group.held).await
            }
        }
    }

    async fn commit_prepared(
        &self,
        target: &TargetTable,
        prepared: PreparedBatch,
        position: &str,
    ) -> Result<Committed, SinkError> {
        match prepared_work(prepared)? {
            Work::Files(files) => self.commit_files(target, files, Some(position)).await?,
            Work::Deferred => return Ok(Committed::Deferred),
            Work::Group(group) => {
                // The held rows' part commits the transaction: no empty
                // snapshot after it.
                self.stage_files(target, Some(group.appended)).await?;
                self.commit_files(target, group.held, Some(position))
                    .await?
            }
        }
        Ok(Committed::Now)
    }
}

/// The staging branch's head once `delta` landed in `table`: a staged
/// part leaves it this writer's; a commit onto `main` closed it.
fn own_staging_after(table: &Table, delta: &RowDelta) -> Option<i64> {
    match delta.staged {
        true => table
            .metadata()
            .snapshot_for_ref(commit::STAGING_BRANCH)
            .map(|s| s.snapshot_id()),
        false => None,
    }
}

/// What [`IcebergSink::prepare`] did for a batch.
fn prepared_work(prepared: PreparedBatch) -> Result<Work, SinkError> {
    match prepared.work {
        None if prepared.batch.rows.num_rows() == 0 => Ok(Work::Files(None)),
        None => Err(SinkError::Io(
            "a batch with rows reached the Iceberg sink unprepared".to_string(),
        )),
        Some(work) => work
            .downcast::<Work>()
            .map(|w| *w)
            .map_err(|_| SinkError::Io("a batch prepared by another sink".to_string())),
    }
}

impl IcebergSink {
    /// The size data files grow to (see [`Writing::target_file_size`]).
    fn target_file_size(&self, table: &Table) -> usize {
        let given = self.target_file_size.or(self
            .maintenance
            .compaction
            .as_ref()
            .map(|c| c.target_file_size));
        if let Some(size) = given {
            return usize::try_from(size).unwrap_or(usize::MAX);
        }
        table
            .metadata()
            .properties()
            .get(iceberg::spec::TableProperties::PROPERTY_WRITE_TARGET_FILE_SIZE_BYTES)
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(
                iceberg::spec::TableProperties::PROPERTY_WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
            )
    }

    /// Stage one for a batch: its own files, or (`may_defer`, an upsert or
    /// append table) its plain appends into the snapshot group and the rest
    /// held there ([`snapshot_group`]). A batch that may not be deferred
    /// closes the open group (its plain appends join it first, so the
    /// snapshot's last rows do not make a small file of their own), and its
    /// commit commits the group before its own files.
    async fn prepare_work(
        &self,
        target: &TargetTable,
        batch: &SinkBatch,
        may_defer: bool,
    ) -> Result<Work, SinkError> {
        let w = self.entry(target).await?.writing;
        let mut group = w.group.lock().await;
        let groups = matches!(target.mode, WriteMode::Upsert | WriteMode::Append);
        if !groups || (!may_defer && group.is_none()) {
            return Ok(Work::Files(self.write_files(target, batch).await?));
        }
        // Read before the key ranges (as `write_files` does).
        let others_seen = w.others_seen.load(Ordering::SeqCst);
        let (appends, rest) = split_appends(&w, target.mode, batch)?;
        match appends {
            None if group.is_none() => {
                return Ok(Work::Files(self.write_files(target, batch).await?));
            }
            None => {}
            Some(rows) => {
                let g = group.get_or_insert_with(|| {
                    SnapshotGroup::open(
                        &w.table,
                        w.target_file_size,
                        target.mode == WriteMode::Upsert,
                        others_seen,
                    )
                });
                // Until the group's files are listed as pending, orphan
                // cleanup waits.
                let _writing = w.files_gate.read().await;
                g.append(rows).await?;
                w.pending().extend(g.local_paths());
            }
        }
        if !may_defer {
            let mut g = group.take().expect("open group");
            tracing::debug!(table = %target.display_name(), "a batch that may not be deferred closes the snapshot group");
            // Its other rows are the group's last changes: held with the
            // rest, a key the group appended is removed by position.
            g.hold(rest);
            return Ok(Work::Group(self.close_group(target, &w, g).await?));
        }
        let g = group.as_mut().expect("open group");
        g.hold(rest);
        let Some(reason) = g.due() else {
            return Ok(Work::Deferred);
        };
        let g = group.take().expect("open group");
        tracing::debug!(table = %target.display_name(), reason, "the snapshot group is due");
        Ok(Work::Group(self.close_group(target, &w, g).await?))
    }

    /// Closes a snapshot group: its files, and its held rows written as
    /// one part. A held row whose key the group appended removes that row
    /// by a position delete (the key was in no committed file when it was
    /// appended, so nothing else needs deleting) and, live, is written as
    /// a plain row; the other held rows' keys were committed before, and
    /// each gets its equality delete.
    async fn close_group(
        &self,
        target: &TargetTable,
        w: &Writing,
        group: SnapshotGroup,
    ) -> Result<GroupFiles, SinkError> {
        let key = match w.key_indices.as_slice() {
            [k] => w.arrow.field(*k).name().clone(),
            // Only an upsert table with one key column holds rows.
            _ => String::new(),
        };
        let closed = group.close(&key).await?;
        let Some(rows) = &closed.held else {
            return Ok(GroupFiles {
                appended: closed.appended,
                held: None,
            });
        };
        let held_rows = conform_by_name(&rows.rows, &w.arrow).map_err(SinkError::Rejected)?;
        let [k] = w.key_indices.as_slice() else {
            return Err(SinkError::Io(
                "internal: a snapshot group held rows of a table without one key column"
                    .to_string(),
            ));
        };
        // Position deletes share the delete manifest, whose spec is the
        // unpartitioned one: only files of that spec (the group writes the
        // default one) can have theirs there. Format v3 forbids adding
        // position-delete files (it has deletion vectors instead).
        let delete_spec = w.delete_spec.spec_id();
        let metadata = w.table.metadata();
        let positional = metadata.format_version() < FormatVersion::V3
            && metadata.default_partition_spec().is_unpartitioned()
            && metadata.default_partition_spec_id() == delete_spec;
        let found = match positional {
            true => {
                snapshot_group::find_appended(
                    &w.table,
                    &closed.appended.data_files,
                    held_rows.column(*k),
                    w.arrow.field(*k),
                )
                .await?
            }
            false => snapshot_group::Appended::none(held_rows.num_rows()),
        };
        let err = io_error::<arrow::error::ArrowError>("selecting the held rows");
        let others = not(&found.held).map_err(&err)?;
        let committed_before = SinkBatch {
            rows: filter_record_batch(&rows.rows, &others).map_err(&err)?,
            deletes: filter(&rows.deletes, &others)
                .map_err(&err)?
                .as_boolean()
                .clone(),
        };
        let mut plain = None;
        let mut delete_files = Vec::new();
        if found.held.true_count() > 0 {
            // Until the files are listed as pending, orphan cleanup waits
            // (not held across `write_files_with`, which takes it itself).
            let _writing = w.files_gate.read().await;
            for (file, positions) in found.positions {
                let data_file = &closed.appended.data_files[file];
                delete_files.push(
                    files::write_position_deletes(&w.table, data_file, positions, delete_spec)
                        .await?,
                );
            }
            w.pending().extend(Writing::local_paths(&delete_files));
            // Live, written without an equality delete, as the group's
            // appended rows were, in the same data file as the other held
            // rows: a commit that finds another writer's checks their keys.
            let live = and(&found.held, &not(&rows.deletes).map_err(&err)?).map_err(&err)?;
            plain = Some(filter_record_batch(&held_rows, &live).map_err(&err)?);
        }
        let mut part = self
            .write_files_with(target, &committed_before, plain)
            .await?;
        // A held row was found in the group's files exactly when one of
        // them has a position deleted.
        if !delete_files.is_empty() {
            let p = part.get_or_insert_with(|| PreparedFiles {
                data_files: vec![],
                delete_files: vec![],
                fresh: Fresh::None,
                others_seen: closed.appended.others_seen,
            });
            p.delete_files.extend(delete_files);
            // Their keys were found new when the group appended them.
            p.others_seen = p.others_seen.min(closed.appended.others_seen);
        }
        Ok(GroupFiles {
            appended: closed.appended,
            held: part,
        })
    }

    /// Stages a prepared batch (a part of an open transaction); an empty
    /// one stages nothing.
    async fn stage_files(
        &self,
        target: &TargetTable,
        files: Option<PreparedFiles>,
    ) -> Result<(), SinkError> {
        match files {
            None => Ok(()),
            Some(f) => self.commit_files(target, Some(f), None).await,
        }
    }

    /// Commits a prepared batch's files with `position` onto `main` (with
    /// the parts staged before it), or stages them (`None`: a part of an
    /// open transaction).
    async fn commit_files(
        &self,
        target: &TargetTable,
        files: Option<PreparedFiles>,
        position: Option<&str>,
    ) -> Result<(), SinkError> {
        let state = self.state(target).await?;
        let mut s = state.lock().await;
        let mut delta = RowDelta {
            data_files: vec![],
            delete_files: vec![],
            delete_spec: s.writing.delete_spec.clone(),
            position: position.unwrap_or_default().to_string(),
            commit_id: uuid::Uuid::now_v7().to_string(),
            staged: position.is_none(),
            own_staging: s.own_staging,
        };
        let (fresh, others_since) = match files {
            None if s.own_staging.is_none() => {
                // Progress without changes: no files, no snapshot.
                if commit::committed_position(s.table.metadata()).as_deref() == position {
                    return Ok(());
                }
                self.commit_with_retries(&mut s, &mut delta, true, Fresh::None, false)
                    .await?;
                self.maintain(&mut s).await;
                return Ok(());
            }
            None => (Fresh::None, false),
            Some(f) => {
                delta.data_files = f.data_files;
                delta.delete_files = f.delete_files;
                let seen = s.writing.others_seen.load(Ordering::SeqCst);
                (f.fresh, seen != f.others_seen)
            }
        };
        self.commit_with_retries(&mut s, &mut delta, false, fresh, others_since)
            .await?;
        {
            // Referenced now (a failed commit leaves them pending: the run
            // ends, and a later one's cleanup finds them).
            let mut pending = s.writing.pending();
            for p in Writing::local_paths(&delta.data_files)
                .chain(Writing::local_paths(&delta.delete_files))
            {
                pending.remove(&p);
            }
        }
        // Maintenance rewrites `main` only: it waits for the transaction's
        // end.
        if !delta.staged {
            self.maintain(&mut s).await;
        }
        Ok(())
    }

    /// Writes the batch's data files (and, upserting, its equality-delete
    /// file), without holding the table's [`TableState`]: a commit of the
    /// batch before may be under way. The keys the batch writes are added
    /// to [`Writing::key_ranges`] here, so batches must be written in
    /// order. `None` for a batch without rows.
    async fn write_files(
        &self,
        target: &TargetTable,
        batch: &SinkBatch,
    ) -> Result<Option<PreparedFiles>, SinkError> {
        self.write_files_with(target, batch, None).await
    }

    /// As [`Self::write_files`], with `plain`: live rows in the table's
    /// schema whose keys no committed file holds (a snapshot group's held
    /// rows of keys it appended, removed by position), written into the
    /// same data files without an equality delete, their keys checked as
    /// new ones at commit. So a group's held part is one data file, not
    /// two.
    async fn write_files_with(
        &self,
        target: &TargetTable,
        batch: &SinkBatch,
        plain: Option<RecordBatch>,
    ) -> Result<Option<PreparedFiles>, SinkError> {
        let plain = plain.filter(|p| p.num_rows() > 0);
        if batch.rows.num_rows() == 0 && plain.is_none() {
            return Ok(None);
        }
        let w = self.entry(target).await?.writing;
        // Until the files are written and listed as pending, orphan cleanup
        // waits.
        let _writing = w.files_gate.read().await;
        // Read before the key ranges: a conflict that takes another
        // writer's ranges in after this makes the commit check.
        let others_seen = w.others_seen.load(Ordering::SeqCst);
        let rows = conform_by_name(&batch.rows, &w.arrow).map_err(SinkError::Rejected)?;
        let mut deletes = None;
        let mut fresh = Fresh::None;
        let data = match target.mode {
            WriteMode::Upsert => {
                let keys: Vec<ArrayRef> = w
                    .key_indices
                    .iter()
                    .map(|i| Arc::clone(rows.column(*i)))
                    .collect();
                let keys = RecordBatch::try_new(schema::key_schema(&w.arrow, &w.key_indices), keys)
                    .map_err(io_error("the key columns"))?;
                // Only a key the table may hold needs an equality delete; a
                // delete of a key it cannot hold has nothing to remove.
                let present = w.key_ranges().may_contain(keys.column(0));
                let live = not(&batch.deletes).map_err(io_error("selecting rows"))?;
                let keys = if present.true_count() == present.len() {
                    keys
                } else {
                    let new = and(&not(&present).map_err(io_error("selecting rows"))?, &live)
                        .map_err(io_error("selecting rows"))?;
                    let new_keys =
                        filter(keys.column(0), &new).map_err(io_error("selecting rows"))?;
                    if !new_keys.is_empty() {
                        fresh = Fresh::Keys(new_keys);
                    }
                    filter_record_batch(&keys, &present).map_err(io_error("selecting rows"))?
                };
                // The delete file is encoded on another worker while this
                // one encodes the data files.
                let (table, key_ids, spec_id) =
                    (w.table.clone(), w.key_ids.clone(), w.delete_spec.spec_id());
                deletes = Some(tokio::spawn(async move {
                    files::write_equality_deletes(&table, keys, &key_ids, spec_id).await
                }));
                // Rows that stay: every key's latest image, unless deleted
                // (with no deletes the kernel returns the columns as they
                // are), whether or not the table may hold its key. One pass
                // over the batch.
                let data = filter_record_batch(&rows, &live).map_err(io_error("selecting rows"))?;
                // The live keys join the ranges: only the new ones can add
                // anything (a key the set may hold lies in a range already).
                if let ([_], Fresh::Keys(new_keys)) = (w.key_indices.as_slice(), &fresh) {
                    w.key_ranges().add_keys(new_keys);
                }
                data
            }
            WriteMode::Append | WriteMode::AppendIdempotent => rows,
        };
        // The plain rows' keys joined the ranges when the group appended
        // them; they are checked as new ones at commit.
        let data = match &plain {
            None => data,
            Some(plain) => {
                if let [k] = w.key_indices.as_slice() {
                    let new_keys = Arc::clone(plain.column(*k));
                    fresh = match fresh {
                        Fresh::None => Fresh::Keys(new_keys),
                        Fresh::Keys(keys) => Fresh::Keys(
                            concat(&[keys.as_ref(), new_keys.as_ref()])
                                .map_err(io_error("joining the new keys"))?,
                        ),
                        Fresh::InDataFiles => Fresh::InDataFiles,
                    };
                }
                concat_batches(&w.arrow, [&data, plain])
                    .map_err(io_error("joining the plain rows"))?
            }
        };
        let unique_keys = target.mode == WriteMode::Upsert;
        let data_files = files::write_data(&w.table, data, unique_keys, w.target_file_size).await?;
        let delete_files = match deletes {
            Some(task) => task
                .await
                .map_err(|e| SinkError::Io(format!("writing equality-delete files: {e}")))??,
            None => vec![],
        };
        w.pending()
            .extend(Writing::local_paths(&data_files).chain(Writing::local_paths(&delete_files)));
        Ok(Some(PreparedFiles {
            data_files,
            delete_files,
            fresh,
            others_seen,
        }))
    }

    /// Another writer's commits are in `table` (a conflict's reload, or a
    /// reload since this batch's files were written): their key ranges join
    /// [`Writing::key_ranges`], so no later batch writes one of their keys
    /// as new; returns them (`None` when keys are not tracked).
    async fn take_in_other_writers(
        &self,
        state: &TableState,
        table: &Table,
    ) -> Result<Option<KeyRanges>, SinkError> {
        let w = &state.writing;
        let [key_id] = w.key_ids.as_slice() else {
            return Ok(None);
        };
        if !w.key_ranges().is_tracking() {
            // Every key may be present: keys written as new before the
            // ranges stopped tracking get their equality delete.
            return Ok(Some(KeyRanges::anywhere()));
        }
        let live = compaction::live_files(table).await?;
        let theirs = KeyRanges::from_live_files(&live.files, *key_id);
        w.key_ranges().absorb(&theirs);
        w.others_seen.fetch_add(1, Ordering::SeqCst);
        Ok(Some(theirs))
    }

    /// [`Self::take_in_other_writers`] where nothing waits on its answer
    /// (a reload after a maintenance pass, or after a commit found
    /// landed): when the table's files cannot be listed, every key counts
    /// as possibly present (the next batches write equality deletes for
    /// all their keys) rather than a key another writer holds being
    /// written as new.
    async fn take_in_other_writers_or_anywhere(&self, state: &TableState, table: &Table) {
        if let Err(e) = self.take_in_other_writers(state, table).await {
            tracing::warn!(table = %state.ident, error = %e, "listing the table's files after a reload failed: every key counts as possibly present");
            state.writing.key_ranges().absorb(&KeyRanges::anywhere());
            state.writing.others_seen.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The key column of `files` (data files this sink wrote, every key
    /// new when written), read back in the table's Arrow form.
    async fn read_back_keys(
        &self,
        state: &TableState,
        files: &[DataFile],
    ) -> Result<ArrayRef, SinkError> {
        let w = &state.writing;
        let [k] = w.key_indices.as_slice() else {
            return Err(SinkError::Io(
                "internal: keys read back for a table without one key column".to_string(),
            ));
        };
        let field = w.arrow.field(*k);
        let keys = files::read_column(&w.table, files, field).await?;
        schema::conform(&keys, field.data_type())
            .map_err(|e| SinkError::Io(format!("reading back {}: {e}", field.name())))
    }

    /// Another writer's commit may hold keys this delta writes as new:
    /// those of `fresh` that `theirs` (the table's key ranges) may hold get
    /// an equality delete (added to `delta` and `added`); returns the keys
    /// still known new.
    async fn delete_fresh_keys_now_present(
        &self,
        state: &TableState,
        table: &Table,
        theirs: &KeyRanges,
        fresh: ArrayRef,
        delta: &mut RowDelta,
        added: &mut Vec<String>,
    ) -> Result<Option<ArrayRef>, SinkError> {
        let w = &state.writing;
        let present = theirs.may_contain(&fresh);
        if present.true_count() == 0 {
            return Ok(Some(fresh));
        }
        let now_present = filter(&fresh, &present).map_err(io_error("selecting rows"))?;
        let keys = RecordBatch::try_new(
            schema::key_schema(&w.arrow, &w.key_indices),
            vec![now_present],
        )
        .map_err(io_error("the key columns"))?;
        tracing::info!(table = %state.ident, keys = keys.num_rows(), "another writer committed rows whose keys this batch writes as new: they get an equality delete");
        let files =
            files::write_equality_deletes(table, keys, &w.key_ids, w.delete_spec.spec_id()).await?;
        added.extend(files.iter().map(|f| f.file_path().to_string()));
        delta.delete_files.extend(files);
        let still = filter(&fresh, &not(&present).map_err(io_error("selecting rows"))?)
            .map_err(io_error("selecting rows"))?;
        Ok((!still.is_empty()).then_some(still))
    }
}

/// Splits a batch into its plain appends (a snapshot group takes them):
/// rows whose key lies outside every known key range and that are not
/// deletes (every row of an append table), in the table's Arrow form
/// (their keys join the key ranges here); and the rest, as a batch in
/// the route's form (empty when all are appends): the rows of keys the
/// table or the group may hold. A delete of a key outside every range is
/// in neither: nothing holds the key, so it deletes nothing (as
/// [`IcebergSink::write_files`] drops it), and held it would be written
/// after the group's appends and delete the key appended again after it.
/// `None` when no row is a plain append (an upsert table whose keys are
/// not tracked has none; the rest is then the whole batch).
fn split_appends(
    w: &Writing,
    mode: WriteMode,
    batch: &SinkBatch,
) -> Result<(Option<RecordBatch>, SinkBatch), SinkError> {
    let none = |b: &SinkBatch| (None, b.clone());
    if batch.rows.num_rows() == 0 {
        return Ok(none(batch));
    }
    let rows = conform_by_name(&batch.rows, &w.arrow).map_err(SinkError::Rejected)?;
    if mode != WriteMode::Upsert {
        let rest = SinkBatch {
            rows: batch.rows.slice(0, 0),
            deletes: batch.deletes.slice(0, 0),
        };
        return Ok((Some(rows), rest));
    }
    let ([k], [_]) = (w.key_indices.as_slice(), w.key_ids.as_slice()) else {
        return Ok(none(batch));
    };
    let err = io_error::<arrow::error::ArrowError>("selecting rows");
    let key = Arc::clone(rows.column(*k));
    let present = w.key_ranges().may_contain(&key);
    let live = not(&batch.deletes).map_err(&err)?;
    let append = and(&not(&present).map_err(&err)?, &live).map_err(&err)?;
    let appended = match append.true_count() {
        0 => None,
        _ => {
            let keys = filter(&key, &append).map_err(&err)?;
            w.key_ranges().add_keys(&keys);
            Some(filter_record_batch(&rows, &append).map_err(&err)?)
        }
    };
    let rest = match present.true_count() == present.len() {
        true => batch.clone(),
        false => SinkBatch {
            rows: filter_record_batch(&batch.rows, &present).map_err(&err)?,
            deletes: filter(&batch.deletes, &present)
                .map_err(&err)?
                .as_boolean()
                .clone(),
        },
    };
    Ok((appended, rest))
}

/// The batch's columns matched to the table's by name, in the table's
/// Arrow form.
/// A column of the table the route does not write (one it kept after the
/// source dropped it) is NULL.
fn conform_by_name(batch: &RecordBatch, table: &ArrowSchemaRef) -> Result<RecordBatch, String> {
    let columns = table
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) => {
                schema::conform(c, f.data_type()).map_err(|e| format!("column {}: {e}", f.name()))
            }
            None if f.is_nullable() => Ok(arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
            None => Err(format!(
                "the batch has no column {}, which the table requires",
                f.name()
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(Arc::clone(table), columns).map_err(|e| e.to_string())
}

/// A data manifest's entry in a list, for the tests of the modules that
/// read, keep or merge lists: one file of one row, added by `added_by` with
/// sequence number `seq`.
#[cfg(test)]
pub(crate) fn test_manifest(path: &str, added_by: i64, seq: i64) -> iceberg::spec::ManifestFile {
    iceberg::spec::ManifestFile {
        manifest_path: path.to_string(),
        manifest_length: 10,
        partition_spec_id: 0,
        content: iceberg::spec::ManifestContentType::Data,
        sequence_number: seq,
        min_sequence_number: seq,
        added_snapshot_id: added_by,
        added_files_count: Some(1),
        existing_files_count: Some(0),
        deleted_files_count: Some(0),
        added_rows_count: Some(1),
        existing_rows_count: Some(0),
        deleted_rows_count: Some(0),
        partitions: None,
        key_metadata: None,
        first_row_id: None,
    }
}
