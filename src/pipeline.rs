//! A loaded, validated and planned pipeline, and what can be done with it:
//! explain it, run it (with a handle that can stop it), query what landed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use urutau_engine::metrics::Metrics;
use urutau_engine::{RunOptions, RunReport, Shutdown};
use urutau_planner::diagnostic::{Diagnostic, Diagnostics};
use urutau_planner::plan::{
    ExplainFormat, PipelinePlan, SchemaOverrides, plan_pipeline, plan_pipeline_with,
};
use urutau_planner::registry::Registry;
use urutau_planner::spec::{PipelineSpec, SinkSpec};
use urutau_planner::target::TargetTable;
use urutau_sql::{LoadedPipeline, load_pipeline, parse_pipeline_sql, parse_pipeline_yaml};

use crate::preview::PreviewError;
use crate::query::{self, QueryResult};
use crate::secrets::Secrets;

/// What went wrong, with the CLI's exit code ([`Error::exit_code`]).
/// Every message is scrubbed of the pipeline's secrets.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline is invalid: the rendered diagnostics (file:line:col,
    /// the quoted line, rule, hint) and the items themselves.
    #[error("{rendered}")]
    Invalid {
        rendered: String,
        diagnostics: Vec<Diagnostic>,
    },
    /// Nothing wrong with the pipeline: a server it reads could not be
    /// asked while planning.
    #[error("{0}")]
    Unavailable(String),
    /// The run failed (a source, a commit, a sink).
    #[error("{0}")]
    Run(String),
    /// A query of the sink tables failed (bad SQL, a table not there yet,
    /// a sink that could not be read).
    #[error("{0}")]
    Query(String),
}

impl Error {
    /// 2 for an invalid pipeline, 1 for a runtime failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Invalid { .. } | Error::Query(_) => 2,
            Error::Unavailable(_) | Error::Run(_) => 1,
        }
    }
}

/// A pipeline, planned. Loading validates it completely (a source is asked
/// for its tables' schemas); nothing is created or committed until
/// [`Pipeline::run`].
pub struct Pipeline {
    /// How the text is named in diagnostics (its path, or `<name>.sql`).
    shown: String,
    text: String,
    spec: PipelineSpec,
    registry: Registry,
    secrets: Secrets,
    /// The plan made at load; the first run takes it, later runs plan
    /// afresh (a plan executes once).
    planned: Mutex<Option<PipelinePlan>>,
    /// The plan whose sinks queries read, made on the first query and kept
    /// (a query executes no plan, so one serves them all).
    query_plan: tokio::sync::OnceCell<PipelinePlan>,
    /// What describes the pipeline (explain, describe, routes): the plan
    /// made at load, kept.
    shape: PipelineShape,
    warnings: Option<String>,
    /// The figures of this pipeline's runs (its own: two pipelines in one
    /// process never mix them).
    metrics: Metrics,
}

/// The parts of a plan shown without running it.
struct PipelineShape {
    name: String,
    explain_indent: String,
    explain_tree: String,
    describe: String,
    routes: Vec<String>,
    /// Each route's sink and target table.
    targets: Vec<(String, Arc<TargetTable>)>,
}

/// What a pipeline's text is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Sql,
    Yaml,
}

impl Pipeline {
    /// Loads, validates and plans a pipeline file (`.sql` or `.yaml`).
    /// `${VAR}` references read the process environment.
    pub async fn load(path: &Path) -> Result<Pipeline, Error> {
        match load_pipeline(path, &urutau_sql::process_env) {
            Ok(LoadedPipeline { path, text, spec }) => Self::plan(path, text, spec).await,
            Err(invalid) => {
                let secrets = Secrets::default();
                Err(Error::Invalid {
                    rendered: secrets.scrub(&invalid.to_string()),
                    diagnostics: invalid.diagnostics.items,
                })
            }
        }
    }

    /// A pipeline from pipeline SQL text; `name` names it in diagnostics
    /// (`name.sql`) and is its default pipeline name.
    pub async fn from_sql(text: &str, name: &str) -> Result<Pipeline, Error> {
        Self::from_text(text, name, Language::Sql, None).await
    }

    /// A pipeline from the Go engine's YAML.
    pub async fn from_yaml(text: &str, name: &str) -> Result<Pipeline, Error> {
        Self::from_text(text, name, Language::Yaml, None).await
    }

    /// A pipeline from text; with `base_dir`, its relative local paths (a
    /// file source's `path`, a Kafka source's `tls_*` files, an Iceberg
    /// sink's SQLite `uri` and `warehouse`) are taken relative to that
    /// directory instead of the working directory.
    pub async fn from_text(
        text: &str,
        name: &str,
        language: Language,
        base_dir: Option<&Path>,
    ) -> Result<Pipeline, Error> {
        let env = &urutau_sql::process_env;
        let (parsed, shown) = match language {
            Language::Sql => (parse_pipeline_sql(text, name, env), format!("{name}.sql")),
            Language::Yaml => (parse_pipeline_yaml(text, name, env), format!("{name}.yaml")),
        };
        match parsed {
            Ok(mut spec) => {
                if let Some(base) = base_dir {
                    let base = std::path::absolute(base).map_err(|e| {
                        Error::Run(format!("base directory {}: {e}", base.display()))
                    })?;
                    crate::paths::resolve_relative(&mut spec, &base, &crate::registry());
                }
                Self::plan(shown, text.to_string(), spec).await
            }
            Err(diags) => Err(invalid(&shown, text, &Secrets::default(), diags)),
        }
    }

    async fn plan(shown: String, text: String, spec: PipelineSpec) -> Result<Pipeline, Error> {
        let registry = crate::registry();
        let secrets = Secrets::of(&spec);
        match plan_pipeline(spec.clone(), &registry).await {
            Ok(plan) => {
                let warnings = (!plan.warnings.items.is_empty())
                    .then(|| secrets.scrub(&plan.warnings.render(&shown, Some(&text))));
                let shape = PipelineShape {
                    name: plan.name.clone(),
                    explain_indent: secrets.scrub(&plan.explain(ExplainFormat::Indent)),
                    explain_tree: secrets.scrub(&plan.explain(ExplainFormat::Tree)),
                    describe: secrets.scrub(&plan.describe(&registry)),
                    routes: plan.routes.iter().map(|r| r.name.clone()).collect(),
                    targets: plan
                        .routes
                        .iter()
                        .map(|r| (r.sink_name.clone(), Arc::clone(&r.target)))
                        .collect(),
                };
                Ok(Pipeline {
                    shown,
                    text,
                    spec,
                    registry,
                    secrets,
                    planned: Mutex::new(Some(plan)),
                    query_plan: tokio::sync::OnceCell::new(),
                    shape,
                    warnings,
                    metrics: Metrics::default(),
                })
            }
            Err(diags) => {
                if diags.errors().all(|d| d.unavailable) {
                    let rendered = diags.render(&shown, Some(&text));
                    return Err(Error::Unavailable(secrets.scrub(&format!(
                        "{rendered}{shown}: cannot plan: a server the pipeline reads could not be asked (see above)"
                    ))));
                }
                Err(invalid(&shown, &text, &secrets, diags))
            }
        }
    }

    /// The pipeline's name.
    pub fn name(&self) -> &str {
        &self.shape.name
    }

    /// Where the pipeline came from, as diagnostics name it.
    pub fn source_name(&self) -> &str {
        &self.shown
    }

    /// The warnings validation found, rendered like errors; `None` when
    /// there are none.
    pub fn warnings(&self) -> Option<&str> {
        self.warnings.as_deref()
    }

    /// The logical and physical DataFusion plan of every route (what
    /// `urutau plan --explain` prints), secrets redacted.
    pub fn explain(&self, format: ExplainFormat) -> &str {
        match format {
            ExplainFormat::Indent => &self.shape.explain_indent,
            ExplainFormat::Tree => &self.shape.explain_tree,
        }
    }

    /// The pipeline's sources, sinks and tables (what `urutau plan`
    /// prints), secrets redacted.
    pub fn describe(&self) -> &str {
        &self.shape.describe
    }

    /// The routes' names, `sink.table` as the pipeline writes them (the
    /// names queries use).
    pub fn routes(&self) -> &[String] {
        &self.shape.routes
    }

    /// The ClickHouse tables the pipeline writes, with their sinks (all,
    /// or the one named `database.table` or `table`), for the operator
    /// commands; an error names the tables there are.
    pub fn clickhouse_tables(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<(SinkSpec, TargetTable)>, String> {
        let ours: Vec<(&SinkSpec, &Arc<TargetTable>)> = self
            .shape
            .targets
            .iter()
            .filter_map(|(sink, target)| {
                self.spec
                    .sink(sink)
                    .filter(|s| s.kind.name == "clickhouse")
                    .map(|s| (s, target))
            })
            .collect();
        let picked: Vec<(SinkSpec, TargetTable)> = ours
            .iter()
            .filter(|(_, t)| {
                only.is_none_or(|o| {
                    o == t.display_name() || Some(o) == t.name.last().map(String::as_str)
                })
            })
            .map(|(s, t)| ((*s).clone(), TargetTable::clone(t)))
            .collect();
        if !picked.is_empty() {
            return Ok(picked);
        }
        Err(match only {
            Some(t) if !ours.is_empty() => format!(
                "no ClickHouse table `{t}` in the pipeline (its ClickHouse tables: {})",
                ours.iter()
                    .map(|(_, t)| t.display_name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => "the pipeline writes no ClickHouse table".to_string(),
        })
    }

    /// The figures of this pipeline's runs (what `/metrics` and `/statusz`
    /// serve for it).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// `text` with this pipeline's secrets replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        self.secrets.scrub(text)
    }

    /// A plan to execute: the one made at load the first time, a fresh one
    /// after (a plan executes once).
    async fn take_plan(&self) -> Result<PipelinePlan, Error> {
        let kept = self.planned.lock().expect("plan lock").take();
        match kept {
            Some(p) => Ok(p),
            None => plan_pipeline(self.spec.clone(), &self.registry)
                .await
                .map_err(|diags| {
                    let rendered = diags.render(&self.shown, Some(&self.text));
                    if diags.errors().all(|d| d.unavailable) {
                        Error::Unavailable(self.scrub(&rendered))
                    } else {
                        invalid(&self.shown, &self.text, &self.secrets, diags)
                    }
                }),
        }
    }

    /// Starts a run in the background of the current Tokio runtime: each
    /// table resumes from the position its sink holds. The run reports
    /// into this pipeline's [`Pipeline::metrics`] (`options.metrics` is
    /// replaced). The handle stops it
    /// (after the commit in flight) and waits for its report.
    ///
    /// A transient failure (a server restarting, a lost connection) is
    /// retried from the committed positions, within the failing part's
    /// `retry_timeout` ([`urutau_engine::supervisor`]); the pipeline is
    /// planned afresh before each retry.
    pub async fn start(&self, mut options: RunOptions) -> Result<RunHandle, Error> {
        let plan = self.take_plan().await?;
        options.metrics = self.metrics.clone();
        let shutdown = Shutdown::new();
        let stopper = shutdown.clone();
        let secrets = self.secrets.clone();
        let (spec, registry) = (self.spec.clone(), self.registry.clone());
        let (shown, text) = (self.shown.clone(), self.text.clone());
        let replan = move |overrides: &SchemaOverrides| {
            let (spec, registry) = (spec.clone(), registry.clone());
            let (shown, text) = (shown.clone(), text.clone());
            let overrides = overrides.clone();
            async move {
                plan_pipeline_with(spec, &registry, &overrides)
                    .await
                    .map_err(|diags| {
                        // A server that could not be asked, not a change that
                        // made the pipeline invalid: one line per distinct
                        // cause, as a retry logs it.
                        let transient = diags.errors().all(|d| d.unavailable);
                        let message = if transient {
                            let mut causes: Vec<&str> =
                                diags.errors().map(|d| d.message.as_str()).collect();
                            causes.dedup();
                            causes.join("; ")
                        } else {
                            diags.render(&shown, Some(&text))
                        };
                        urutau_engine::RunError::Plan { message, transient }
                    })
            }
        };
        let task = tokio::spawn(async move {
            urutau_engine::run_with_retries(plan, replan, options, stopper)
                .await
                .map_err(|e| Error::Run(secrets.scrub(&e.to_string())))
        });
        Ok(RunHandle {
            shutdown,
            task,
            metrics: self.metrics.clone(),
        })
    }

    /// Runs the pipeline to its end: until caught up with
    /// `exit_when_caught_up`, else until it fails.
    pub async fn run(&self, options: RunOptions) -> Result<RunReport, Error> {
        self.start(options).await?.wait().await
    }

    /// What each table would receive from its next `limit` changes (after
    /// the position its sink holds; from the beginning when none): per
    /// route, the rows after the filter, casts, metadata columns and
    /// collapse, with [`preview::CHANGE_COLUMN`](crate::preview::CHANGE_COLUMN)
    /// at the end. Commits, acknowledges and creates nothing.
    pub async fn preview(&self, limit: u64) -> Result<BTreeMap<String, QueryResult>, Error> {
        crate::preview::preview(&self.spec, &self.registry, limit)
            .await
            .map_err(|e| match e {
                PreviewError::Run(m) => Error::Run(self.scrub(&m)),
                PreviewError::Plan(m) => Error::Unavailable(self.scrub(&m)),
            })
    }

    /// Runs DataFusion SQL over the pipeline's sink tables, named as in the
    /// pipeline (`lake.orders`): Iceberg with its deletes applied,
    /// ClickHouse as `FINAL` reads it, the memory sink's live rows.
    /// Reading creates and commits nothing.
    pub async fn sql(&self, query: &str) -> Result<QueryResult, Error> {
        let plan = self.query_plan().await?;
        query::run(plan, query)
            .await
            .map_err(|e| Error::Query(self.scrub(&e)))
    }

    /// Every row of one sink table (`lake.orders`).
    pub async fn read(&self, table: &str) -> Result<QueryResult, Error> {
        let plan = self.query_plan().await?;
        query::read(plan, table)
            .await
            .map_err(|e| Error::Query(self.scrub(&e)))
    }

    /// The plan whose sinks queries read (its own: the load's plan is kept
    /// for the run).
    async fn query_plan(&self) -> Result<&PipelinePlan, Error> {
        self.query_plan
            .get_or_try_init(|| async {
                plan_pipeline(self.spec.clone(), &self.registry)
                    .await
                    .map_err(|diags| {
                        Error::Unavailable(self.scrub(&diags.render(&self.shown, None)))
                    })
            })
            .await
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.shape.name)
            .field("source", &self.shown)
            .field("routes", &self.shape.routes)
            .finish()
    }
}

/// An invalid pipeline's error: the diagnostics rendered with the quoted
/// lines, and a summary line.
fn invalid(shown: &str, text: &str, secrets: &Secrets, diags: Diagnostics) -> Error {
    let errors = diags.errors().count();
    let rendered = format!(
        "{}{shown}: invalid pipeline ({errors} error{})\n",
        diags.render(shown, Some(text)),
        if errors == 1 { "" } else { "s" }
    );
    Error::Invalid {
        rendered: secrets.scrub(&rendered),
        diagnostics: diags.items,
    }
}

/// A run in progress.
pub struct RunHandle {
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<RunReport, Error>>,
    metrics: Metrics,
}

impl RunHandle {
    /// Asks the run to stop after the commit in flight; [`RunHandle::wait`]
    /// then returns its report with `stopped`.
    pub fn stop(&self) {
        self.shutdown.trigger();
    }

    /// Makes SIGINT and SIGTERM stop the run (the CLI; a notebook stops it
    /// with [`RunHandle::stop`]).
    pub fn stop_on_signals(&self) {
        self.shutdown.listen_for_signals();
    }

    /// The run's figures so far (per table: phase, position, commits,
    /// rows; per source: lag; snapshot progress), as `/statusz` serves them.
    pub fn status(&self) -> serde_json::Value {
        self.metrics.status_json()
    }

    /// Whether the run has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the run's end.
    pub async fn wait(self) -> Result<RunReport, Error> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(Error::Run(format!("the run ended abnormally: {e}"))),
        }
    }
}
