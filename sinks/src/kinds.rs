//! The option schema and rules of the Couchbase sink. Its writer is built
//! in its own issue; until then a pipeline using it validates and plans, and `run` stops at
//! `ensure_table` with a clear message instead of pretending to write.

use std::sync::Arc;

use async_trait::async_trait;
use urutau_planner::diagnostic::{Diagnostic, Diagnostics};
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SinkKindDef, SinkProvider};
use urutau_planner::sink::{Sink, SinkBatch, SinkError};
use urutau_planner::spec::{RouteSpec, SinkSpec, WriteMode};
use urutau_planner::target::TargetTable;

const ALL_MODES: &[WriteMode] = &[
    WriteMode::Upsert,
    WriteMode::Append,
    WriteMode::AppendIdempotent,
];

fn couchbase_options() -> Vec<OptionDef> {
    use OptionType as T;
    vec![
        OptionDef::new("uri", T::String, "couchbase://host").required(),
        OptionDef::new("bucket", T::String, "the bucket (collections are tables)")
            .aliases(&["namespace"])
            .required(),
        OptionDef::new("username", T::String, "user name"),
        OptionDef::new("password", T::String, "password").secret(),
        OptionDef::new(
            "commit_mode",
            T::Enum(&["fast", "atomic"]),
            "fast: data then control document; atomic: one distributed transaction",
        )
        .default("fast"),
    ]
}

/// Couchbase: a partitioned table's workers share one control document,
/// which only an atomic commit updates safely.
fn couchbase_partitioned_needs_atomic(
    sink: &SinkSpec,
    route: &RouteSpec,
    workers: u32,
    d: &mut Diagnostics,
) {
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

/// The kinds whose writers are not in this build yet.
pub fn planned_kinds() -> Vec<Arc<dyn SinkProvider>> {
    vec![Arc::new(NotBuiltProvider {
        def: SinkKindDef {
            name: "couchbase",
            exec_name: "CouchbaseSinkExec",
            doc: "Couchbase: key-document upserts, a control document per collection",
            options: couchbase_options(),
            maintenance: false,
            partitioning: false,
            partitioning_warning: None,
            partitioned_tables: true,
            write_modes: ALL_MODES,
            namespace_option: None,
            route_rules: vec![couchbase_partitioned_needs_atomic],
        },
    })]
}

struct NotBuiltProvider {
    def: SinkKindDef,
}

impl SinkProvider for NotBuiltProvider {
    fn def(&self) -> &SinkKindDef {
        &self.def
    }

    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(NotBuiltSink {
            kind: self.def.name,
            name: spec.name.name.clone(),
        }))
    }
}

/// Stands for a sink whose writer is not in this build: every call fails
/// with that message, before anything is written.
#[derive(Debug)]
struct NotBuiltSink {
    kind: &'static str,
    name: String,
}

impl NotBuiltSink {
    fn error(&self) -> SinkError {
        SinkError::Unavailable(format!(
            "sink `{}`: the {} sink's writer is not in this build yet; `validate` and `plan` work, `run` cannot",
            self.name, self.kind
        ))
    }
}

#[async_trait]
impl Sink for NotBuiltSink {
    async fn ensure_table(&self, _table: &TargetTable) -> Result<(), SinkError> {
        Err(self.error())
    }
    async fn committed_position(&self, _table: &TargetTable) -> Result<Option<String>, SinkError> {
        Err(self.error())
    }
    async fn commit(
        &self,
        _table: &TargetTable,
        _batch: &SinkBatch,
        _position: &str,
    ) -> Result<(), SinkError> {
        Err(self.error())
    }
}
