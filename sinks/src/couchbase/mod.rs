//! The Couchbase sink: one collection per target table, one document per
//! key (upsert routes) or per change (append routes), and one control
//! document per collection holding the committed position.
//!
//! - Layout ([`layout`]): the bucket is created when absent with 0 replicas
//!   (what durability majority needs on one node), the scope and the
//!   collection too; the sink waits until the collection takes writes.
//! - Documents ([`document`]): the key is the key columns' JSON array
//!   text (`[42]`, `["eu",7]`); data columns at the top level as native
//!   JSON, the route's metadata columns under `_urutau`. A delete is a
//!   Remove (a document already gone is success). An append-idempotent
//!   route keys each change by its coordinate (`["orders.jsonl",0,812]`),
//!   so a replay overwrites itself; a plain append route by the position
//!   the batch follows and the change's index in the batch, which a
//!   replay reproduces while it ends where the first try ended (at-least-
//!   once otherwise, the spec's append contract).
//! - Position ([`control`]): the control document `_urutau::position`.
//! - Commit modes ([`commit`]): `fast` writes the documents, then the
//!   control document (a crash between replays the batch, idempotently);
//!   `atomic` commits through a journal with the control document as the
//!   commit record, so the batch and its position are all or nothing.
//! - Every call is bounded and retried ([`client`]).

pub mod client;
mod commit;
pub mod control;
pub mod document;
mod layout;
mod tls_probe;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use couchbase::durability_level::DurabilityLevel;
use tokio::sync::{Mutex, OnceCell};
use urutau_planner::diagnostic::{Diagnostic, Diagnostics};
use urutau_planner::options::{OptionDef, OptionType, parse_duration};
use urutau_planner::registry::{SinkKindDef, SinkProvider};
use urutau_planner::sink::{Sink, SinkBatch, SinkError};
use urutau_planner::spec::{ProjectionItem, RouteSpec, SinkSpec, WriteMode};
use urutau_planner::target::{ColumnOrigin, TargetTable};

pub use commit::FaultPoint;

fn options() -> Vec<OptionDef> {
    use OptionType as T;
    vec![
        OptionDef::retry_timeout(),
        OptionDef::new(
            "uri",
            T::String,
            "couchbase://host[:port],... (couchbases:// for TLS)",
        )
        .required(),
        OptionDef::new(
            "ca_cert",
            T::String,
            "couchbases://: PEM file of the CA the cluster's certificates are signed by (default: SSL_CERT_FILE, else the SDK's built-in CAs)",
        ),
        OptionDef::new("bucket", T::String, "the bucket (created when absent, 0 replicas)")
            .aliases(&["namespace"])
            .required(),
        OptionDef::new("scope", T::String, "the scope of one-part target names")
            .default("_default"),
        OptionDef::new("username", T::String, "user name"),
        OptionDef::new("password", T::String, "password").secret(),
        OptionDef::new(
            "commit_mode",
            T::Enum(&["fast", "atomic"]),
            "fast: documents, then the control document (replayed idempotently after a crash); atomic: all or nothing through a journal",
        )
        .default("fast"),
        OptionDef::new(
            "durability",
            T::Enum(&["majority", "majority_and_persist_active", "persist_to_majority"]),
            "synchronous durability of every write (never downgraded)",
        )
        .default("majority"),
        OptionDef::new("timeout", T::Duration, "the limit of one call to Couchbase")
            .default("10s"),
        OptionDef::new(
            "retry_for",
            T::Duration,
            "how long one call that times out or loses its connection is retried before it fails (the run then retries within retry_timeout)",
        )
        .default("30s"),
        OptionDef::new(
            "concurrency",
            T::Int { min: 1, max: 4096 },
            "document writes in flight at once",
        )
        .default("64"),
    ]
}

/// Couchbase: a partitioned table's workers share one control document,
/// which only an atomic commit updates safely.
fn partitioned_needs_atomic(sink: &SinkSpec, route: &RouteSpec, workers: u32, d: &mut Diagnostics) {
    if workers > 1 && sink.options.get("commit_mode") != Some("atomic") {
        let span = route
            .options
            .entry("workers")
            .map_or(route.span, |e| e.value_span);
        d.push(
            Diagnostic::error(
                span,
                format!(
                    "route {} has workers = {workers}, and sink `{}` (couchbase) commits in fast mode",
                    route.display_name(),
                    sink.name
                ),
            )
            .with_rule("partitioned Couchbase tables (workers > 1) require commit_mode = 'atomic': fast mode rewrites the control document outside a transaction, so workers lose each other's positions")
            .with_help("set commit_mode = 'atomic' on the sink, or workers = 1"),
        );
    }
}

/// Couchbase: `_urutau` holds a document's metadata, so no data column
/// may take that name.
fn reserved_metadata_name(_sink: &SinkSpec, route: &RouteSpec, _w: u32, d: &mut Diagnostics) {
    for item in &route.projection {
        let ProjectionItem::Expr { expr, alias } = item else {
            continue;
        };
        let (name, span) = match alias {
            Some(a) => (a.name.clone(), a.span),
            None => (
                expr.expr.to_string().trim_matches('"').to_string(),
                expr.span,
            ),
        };
        if name == document::METADATA_FIELD {
            d.push(
                Diagnostic::error(
                    span,
                    format!(
                        "route {} writes a column named {}, which the Couchbase sink reserves for a document's metadata",
                        route.display_name(),
                        document::METADATA_FIELD
                    ),
                )
                .with_rule("Couchbase documents hold the route's metadata columns under the reserved `_urutau` object")
                .with_help("rename the column in the SELECT (`... AS other_name`)"),
            );
        }
    }
}

/// Registers the `couchbase` kind.
pub struct CouchbaseSinkProvider {
    def: SinkKindDef,
}

impl CouchbaseSinkProvider {
    /// The `couchbase` kind's definition.
    pub fn new() -> Self {
        CouchbaseSinkProvider {
            def: SinkKindDef {
                name: "couchbase",
                exec_name: "CouchbaseSinkExec",
                doc: "Couchbase: key-document upserts, a control document per collection",
                options: options(),
                maintenance: false,
                partitioning: false,
                partitioning_warning: None,
                partitioned_tables: true,
                write_modes: &[
                    WriteMode::Upsert,
                    WriteMode::Append,
                    WriteMode::AppendIdempotent,
                ],
                namespace_option: None,
                route_rules: vec![partitioned_needs_atomic, reserved_metadata_name],
            },
        }
    }
}

impl Default for CouchbaseSinkProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl SinkProvider for CouchbaseSinkProvider {
    fn def(&self) -> &SinkKindDef {
        &self.def
    }

    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(CouchbaseSink::new(spec)?))
    }
}

/// How commits are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    Fast,
    Atomic,
}

/// The sink's settings, typed.
#[derive(Clone)]
pub struct Config {
    pub uri: String,
    pub bucket: String,
    pub scope: String,
    pub username: String,
    pub password: String,
    pub mode: CommitMode,
    pub durability: DurabilityLevel,
    pub concurrency: usize,
    pub calls: client::Calls,
    /// The CAs a `couchbases://` connection trusts (`ca_cert`, else
    /// `SSL_CERT_FILE`); `None`: the SDK's own.
    pub ca_certs: Option<Vec<rustls_pki_types::CertificateDer<'static>>>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("server", &self.calls.server)
            .field("bucket", &self.bucket)
            .field("scope", &self.scope)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// The settings of a `CREATE SINK ... INTO couchbase` (validated
    /// options; defaults filled).
    pub fn from_spec(spec: &SinkSpec) -> Result<Config, SinkError> {
        let get = |k: &str| spec.options.get(k).map(str::to_string);
        let duration = |k: &str, default: &str| {
            let text = get(k).unwrap_or_else(|| default.into());
            parse_duration(&text)
                .map_err(|e| SinkError::Unavailable(format!("sink `{}`: {k}: {e}", spec.name)))
        };
        let uri = get("uri").unwrap_or_default();
        let bucket = get("bucket").unwrap_or_default();
        let ca_certs = trusted_cas(&uri, get("ca_cert").as_deref())?;
        let calls = client::Calls {
            timeout: duration("timeout", "10s")?,
            retry_for: duration("retry_for", "30s")?,
            server: client::server_name(&uri),
            bucket: bucket.clone(),
        };
        Ok(Config {
            uri,
            scope: get("scope").unwrap_or_else(|| "_default".into()),
            username: get("username").unwrap_or_default(),
            password: get("password").unwrap_or_default(),
            mode: match get("commit_mode").as_deref() {
                Some("atomic") => CommitMode::Atomic,
                _ => CommitMode::Fast,
            },
            durability: match get("durability").as_deref() {
                Some("majority_and_persist_active") => DurabilityLevel::MAJORITY_AND_PERSIST_ACTIVE,
                Some("persist_to_majority") => DurabilityLevel::PERSIST_TO_MAJORITY,
                _ => DurabilityLevel::MAJORITY,
            },
            concurrency: get("concurrency")
                .and_then(|c| c.parse().ok())
                .unwrap_or(64),
            bucket,
            calls,
            ca_certs,
        })
    }
}

/// Whether `uri` connects over TLS (`couchbases://`).
pub(super) fn is_tls(uri: &str) -> bool {
    uri.get(..13)
        .is_some_and(|s| s.eq_ignore_ascii_case("couchbases://"))
}

/// The CA certificates a connection to `uri` trusts: for `couchbases://`,
/// those of `ca_cert`, else of `SSL_CERT_FILE`, else none given (the SDK's
/// built-in CAs). `ca_cert` beside a plain `couchbase://` uri is an error:
/// it would do nothing.
fn trusted_cas(
    uri: &str,
    ca_cert: Option<&str>,
) -> Result<Option<Vec<rustls_pki_types::CertificateDer<'static>>>, SinkError> {
    if !is_tls(uri) {
        return match ca_cert {
            Some(_) => Err(SinkError::Unavailable(
                "ca_cert is for TLS connections: write the uri as couchbases://host,... (the cluster's TLS ports), or remove ca_cert".to_string(),
            )),
            None => Ok(None),
        };
    }
    crate::tls::ca_file(ca_cert)
        .map(|path| crate::tls::certificates(&path))
        .transpose()
}

/// One collection the sink writes, as `ensure_table` prepared it.
struct TableState {
    collection: couchbase::collection::Collection,
    /// `scope.collection`, as messages name it.
    name: String,
    /// The control document as last read or written, with its CAS.
    control: control::Control,
    cas: Option<u64>,
    /// What this run staged of an open transaction ([`commit::Staged`]).
    staged: commit::Staged,
}

/// The Couchbase sink.
pub struct CouchbaseSink {
    name: String,
    config: Config,
    cluster: OnceCell<couchbase::cluster::Cluster>,
    tables: Mutex<HashMap<String, Arc<Mutex<TableState>>>>,
    /// Test hook: stop an atomic commit at a step of its protocol, as a
    /// crash there would (see [`FaultPoint`]).
    fault: std::sync::Mutex<Option<FaultPoint>>,
}

impl std::fmt::Debug for CouchbaseSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CouchbaseSink")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl CouchbaseSink {
    /// A sink as `spec` configures it (connects on first use).
    pub fn new(spec: &SinkSpec) -> Result<Self, SinkError> {
        Ok(CouchbaseSink {
            name: spec.name.name.clone(),
            config: Config::from_spec(spec)?,
            cluster: OnceCell::new(),
            tables: Mutex::new(HashMap::new()),
            fault: std::sync::Mutex::new(None),
        })
    }

    /// Makes the next atomic commit stop at `point`, leaving the cluster
    /// as a crash at that step would (the commit returns an error). For
    /// the tests of the protocol's recovery; no pipeline setting reaches it.
    pub fn inject_fault(&self, point: FaultPoint) {
        *self.fault.lock().expect("not poisoned") = Some(point);
    }

    async fn cluster(&self, table: &str) -> Result<&couchbase::cluster::Cluster, SinkError> {
        self.cluster
            .get_or_try_init(|| layout::connect(&self.config, table))
            .await
    }

    /// `(scope, collection)` of a target name.
    fn names(&self, target: &TargetTable) -> Result<(String, String), SinkError> {
        let (scope, collection) = match target.name.as_slice() {
            [c] => (self.config.scope.clone(), c.clone()),
            [s, c] => (s.clone(), c.clone()),
            _ => {
                return Err(SinkError::TableMismatch(format!(
                    "{}: a Couchbase table name is `scope.collection` or `collection` (the bucket is the sink's)",
                    target.display_name()
                )));
            }
        };
        for n in [&scope, &collection] {
            layout::check_name(n).map_err(|why| {
                SinkError::TableMismatch(format!("{}: {why}", target.display_name()))
            })?;
        }
        Ok((scope, collection))
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

    fn take_fault(&self) -> Option<FaultPoint> {
        self.fault.lock().expect("not poisoned").take()
    }
}

#[async_trait]
impl Sink for CouchbaseSink {
    async fn ensure_table(&self, target: &TargetTable) -> Result<(), SinkError> {
        if let Some(c) = target
            .columns
            .iter()
            .find(|c| c.origin == ColumnOrigin::Data && c.name == document::METADATA_FIELD)
        {
            return Err(SinkError::TableMismatch(format!(
                "route {} writes a data column named {}, which the Couchbase sink reserves for a document's metadata; rename it in the SELECT",
                target.display_name(),
                c.name
            )));
        }
        let (scope, collection) = self.names(target)?;
        let table = format!("{scope}.{collection}");
        let cluster = self.cluster(&table).await?;
        let coll = layout::ensure_collection(cluster, &self.config, &scope, &collection).await?;
        let (control, cas) = commit::read_control(&self.config, &coll, &table).await?;
        let mut state = TableState {
            collection: coll,
            name: table,
            control,
            cas,
            staged: commit::Staged::default(),
        };
        commit::recover(&self.config, &mut state, target.workers, self.config.mode).await?;
        self.tables
            .lock()
            .await
            .insert(target.display_name(), Arc::new(Mutex::new(state)));
        Ok(())
    }

    async fn read_table(
        &self,
        target: &TargetTable,
    ) -> Result<Option<Arc<dyn datafusion::catalog::TableProvider>>, SinkError> {
        Err(SinkError::Unavailable(format!(
            "table {}: a Couchbase collection cannot be queried here (listing its documents needs the query service, which this sink does not use); read documents by key with a Couchbase SDK",
            target.display_name()
        )))
    }

    /// The control document's position, read without preparing anything
    /// (no bucket, scope or collection is created; a missing one holds
    /// nothing). In `atomic` mode the control document is the commit
    /// record, so a journal a crash left does not change what it says.
    async fn peek_position(&self, target: &TargetTable) -> Result<Option<String>, SinkError> {
        let (scope, collection) = self.names(target)?;
        let table = format!("{scope}.{collection}");
        let cluster = self.cluster(&table).await?;
        let Some(coll) =
            layout::find_collection(cluster, &self.config, &scope, &collection).await?
        else {
            return Ok(None);
        };
        let (control, _) = commit::read_control(&self.config, &coll, &table).await?;
        commit::check_owners(&control, target.workers, &table)?;
        Ok(control.resume(target.workers))
    }

    async fn committed_position(&self, target: &TargetTable) -> Result<Option<String>, SinkError> {
        let state = self.state(target).await?;
        let s = state.lock().await;
        Ok(s.control.resume(target.workers))
    }

    async fn commit(
        &self,
        target: &TargetTable,
        batch: &SinkBatch,
        position: &str,
    ) -> Result<(), SinkError> {
        let state = self.state(target).await?;
        let mut s = state.lock().await;
        let docs = commit::documents(target, batch, &s)?;
        s.staged.rows = 0;
        match self.config.mode {
            CommitMode::Fast => commit::fast(&self.config, &mut s, docs, position).await,
            CommitMode::Atomic => {
                commit::atomic(
                    &self.config,
                    &mut s,
                    target,
                    docs,
                    position,
                    self.take_fault(),
                )
                .await
            }
        }
    }

    /// Fast mode writes a part's documents at once (as a replayed batch
    /// would be, idempotently); atomic mode stages them in the batch's
    /// journal, unless the table is partitioned among owners.
    fn stages_transactions(&self, table: &TargetTable) -> bool {
        self.config.mode == CommitMode::Fast || table.workers <= 1
    }

    async fn stage(&self, target: &TargetTable, batch: &SinkBatch) -> Result<(), SinkError> {
        let state = self.state(target).await?;
        let mut s = state.lock().await;
        let docs = commit::documents(target, batch, &s)?;
        s.staged.rows += batch.rows.num_rows();
        match self.config.mode {
            CommitMode::Fast => commit::fast_part(&self.config, &s, &docs).await,
            CommitMode::Atomic => commit::stage_part(&self.config, &mut s, &docs).await,
        }
    }

    fn extra_work(&self) -> Option<String> {
        Some(format!(
            "commit_mode={}",
            match self.config.mode {
                CommitMode::Fast => "fast",
                CommitMode::Atomic => "atomic",
            }
        ))
    }
}
