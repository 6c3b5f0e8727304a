//! From a [`PipelineSpec`] to DataFusion plans, one per route:
//!
//! ```text
//! Sink (SinkNode)                               -> <Kind>SinkExec
//!   [Collapse (upsert)]                         -> CollapseExec
//!     Projection (casts, metadata at the end)   -> ProjectionExec
//!       [ChangeFilter (WHERE)]                  -> ChangeFilterExec
//!         TableScan (source table)              -> <Kind>SourceExec
//! ```
//!
//! The logical plan goes through DataFusion's analyzer (type coercion) but
//! not its optimizer, and the physical plan through no physical optimizer
//! rule: the shape is fixed, and rules such as batch coalescing or
//! repartitioning would hold a transaction back or split it from the
//! position it commits with.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::common::Result;
use datafusion::datasource::provider_as_source;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNode};
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use datafusion::prelude::SessionConfig;

use crate::bind::{BoundRoute, SourceContext, bind_route};
use crate::context;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::evolution::{SchemaChanges, merge_with_catalog};
use crate::feed::RouteFeed;
use crate::functions;
use crate::logical::{ChangeFilterNode, CollapseNode, OnMiss, SinkNode, extension};
use crate::options::OptionMap;
use crate::options::RedactedOptions;
use crate::physical::{ChangeFilterExec, ChangeTableProvider, CollapseExec, ScanInfo, SinkExec};
use crate::registry::{Registry, SchemaError, SourceTableSchema};
use crate::sink::Sink;
use crate::spec::{PipelineSpec, SourceSpec, WriteMode};
use crate::target::{ColumnOrigin, TargetTable};
use crate::validate::{BatchOptions, RouteSettings, batch_options, validate};

/// A planned pipeline: everything `run` and `plan` need.
pub struct PipelinePlan {
    pub name: String,
    pub batch: BatchOptions,
    pub sources: Vec<SourcePlan>,
    pub routes: Vec<RoutePlan>,
    /// Warnings found while validating and binding.
    pub warnings: Diagnostics,
    /// The validated spec.
    pub spec: PipelineSpec,
}

/// A source that feeds at least one route.
pub struct SourcePlan {
    pub spec: SourceSpec,
    pub tables: Vec<SourceTablePlan>,
}

/// A source table that feeds at least one route.
pub struct SourceTablePlan {
    pub table: Vec<String>,
    pub schema: SourceTableSchema,
    /// The declaration's checked options (empty when not declared).
    pub options: OptionMap,
    /// The change batches the source must produce for it.
    pub scan_schema: SchemaRef,
    /// Indices into [`PipelinePlan::routes`].
    pub routes: Vec<usize>,
    /// Which update before-images its routes need.
    pub before_images: BeforeImages,
    /// What a change of the table's shape does: `fail` when any of its
    /// routes says so (a change cannot be followed for one route and
    /// refused for another of the same stream).
    pub schema_changes: SchemaChanges,
    /// Whether any route reads the `headers` metadata column: a source of
    /// messages spares parsing every message's headers when none does
    /// (the column is then NULL, and nothing reads it).
    pub reads_headers: bool,
}

/// Shapes a run asks source tables to be planned with, keyed by (source,
/// table): what a stream found the table grown to
/// ([`SchemaChange`](crate::evolution::SchemaChange)). Planning merges each
/// with the shape the source reports now
/// ([`merge_with_catalog`](crate::evolution::merge_with_catalog)).
pub type SchemaOverrides = HashMap<(String, Vec<String>), SourceTableSchema>;

/// Which before images of updates a source must emit (as `__before`
/// rows) for a table. Upsert routes need one only when the update changed
/// their key (to delete the old key); append routes never do (they record
/// changes, not states). Emitting fewer is only an optimisation: a
/// before-image whose key equals the after-image's is superseded by it in
/// the collapse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeforeImages {
    Never,
    /// When any of these source columns differs between before and after.
    OnKeyChange(Vec<String>),
    Always,
}

impl BeforeImages {
    /// What a route of `mode` whose key reads `key_columns` needs.
    pub fn for_route(mode: WriteMode, key_columns: &[String]) -> Self {
        match mode {
            WriteMode::Upsert if key_columns.is_empty() => BeforeImages::Always,
            WriteMode::Upsert => BeforeImages::OnKeyChange(key_columns.to_vec()),
            _ => BeforeImages::Never,
        }
    }

    /// What two routes of one table need together.
    pub fn union(self, other: BeforeImages) -> Self {
        match (self, other) {
            (BeforeImages::Always, _) | (_, BeforeImages::Always) => BeforeImages::Always,
            (BeforeImages::Never, x) | (x, BeforeImages::Never) => x,
            (BeforeImages::OnKeyChange(mut a), BeforeImages::OnKeyChange(b)) => {
                for c in b {
                    if !a.contains(&c) {
                        a.push(c);
                    }
                }
                BeforeImages::OnKeyChange(a)
            }
        }
    }
}

/// One route, planned.
pub struct RoutePlan {
    /// `sink.target`.
    pub name: String,
    pub source: String,
    pub source_table: Vec<String>,
    pub sink_name: String,
    pub sink: Arc<dyn Sink>,
    pub target: Arc<TargetTable>,
    pub settings: RouteSettings,
    pub logical: LogicalPlan,
    pub physical: Arc<dyn ExecutionPlan>,
    /// Where the runner pushes the route's change batches.
    pub feed: Arc<RouteFeed>,
    pub bound: BoundRoute,
    /// What the route does when its source table changes shape (or, for
    /// a declared table, its declaration changes between runs).
    pub schema_changes: SchemaChanges,
}

/// How `plan --explain` renders physical plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExplainFormat {
    /// DataFusion's indented form.
    Indent,
    /// DataFusion's tree form.
    Tree,
}

/// The session every route is planned in: DataFusion's functions plus ours,
/// one partition, no physical optimizer rule.
pub fn session_state() -> SessionState {
    let mut config = SessionConfig::new().with_target_partitions(1);
    config.options_mut().sql_parser.collect_spans = true;
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rules(vec![])
        .build();
    for f in functions::all() {
        datafusion::execution::FunctionRegistry::register_udf(&mut state, f)
            .expect("registering a scalar function cannot fail");
    }
    state
}

/// Validates, binds and plans every route of `spec`. Errors (and the
/// warnings found with them) come back as diagnostics.
pub async fn plan_pipeline(
    spec: PipelineSpec,
    registry: &Registry,
) -> Result<PipelinePlan, Diagnostics> {
    plan_pipeline_with(spec, registry, &SchemaOverrides::new()).await
}

/// [`plan_pipeline`], with the tables in `overrides` planned with the
/// shapes a run found them grown to (a schema change at the source).
pub async fn plan_pipeline_with(
    mut spec: PipelineSpec,
    registry: &Registry,
    overrides: &SchemaOverrides,
) -> Result<PipelinePlan, Diagnostics> {
    let mut diags = validate(&mut spec, registry);
    if diags.has_errors() {
        return Err(diags);
    }
    let state = session_state();
    let mut sinks: HashMap<String, Arc<dyn Sink>> = HashMap::new();
    for sink in &spec.sinks {
        let provider = registry.sink(&sink.kind.name).expect("validated");
        match provider.open(sink) {
            Ok(s) => {
                sinks.insert(sink.name.name.clone(), s);
            }
            Err(e) => diags.push(Diagnostic::error(
                sink.name.span,
                format!("sink `{}`: {e}", sink.name),
            )),
        }
    }

    let mut routes = Vec::new();
    let mut sources: Vec<SourcePlan> = Vec::new();
    for route in &spec.routes {
        let source = spec.source(&route.source.name).expect("validated");
        let sink = spec.sink(&route.sink.name).expect("validated");
        let source_provider = registry.source(&source.kind.name).expect("validated");
        let sink_provider = registry.sink(&sink.kind.name).expect("validated");
        let declared = spec.source_table(&route.source.name, &route.source_table.parts);
        let schema = match source_provider
            .table_schema(source, &route.source_table, declared)
            .await
        {
            Ok(s) => s,
            Err(SchemaError::Invalid(e)) => {
                diags.push(Diagnostic::error(route.source_table.span, e));
                continue;
            }
            Err(SchemaError::Unavailable(e)) => {
                diags.push(Diagnostic::error(route.source_table.span, e).unavailable());
                continue;
            }
        };
        let schema =
            match overrides.get(&(source.name.name.clone(), route.source_table.parts.clone())) {
                Some(grown) => merge_with_catalog(&schema, grown),
                None => schema,
            };
        let namespace = sink_provider
            .def()
            .namespace_option
            .and_then(|o| sink.options.get(o));
        let Some(bound) = bind_route(
            &state,
            route,
            SourceContext {
                def: source_provider.def(),
                schema: schema.clone(),
            },
            namespace,
            &mut diags,
        ) else {
            continue;
        };
        diags.extend(bound.warnings.clone());
        let Some(sink_obj) = sinks.get(&sink.name.name).cloned() else {
            continue;
        };
        let feed = Arc::new(RouteFeed::new());
        let info = ScanInfo {
            exec_name: source_provider.def().exec_name,
            source: source.name.name.clone(),
            table: route.source_table.to_string(),
            detail: source_provider.describe(source),
        };
        let target = Arc::new(bound.target.clone());
        let planned = build_plans(
            &state,
            &bound,
            info,
            Arc::clone(&feed),
            sink.name.name.clone(),
            sink.kind.name.clone(),
            sink_provider.def().exec_name,
            Arc::clone(&sink_obj),
            Arc::clone(&target),
        )
        .await;
        let (logical, physical) = match planned {
            Ok(p) => p,
            Err(e) => {
                diags.push(Diagnostic::error(route.span, e.strip_backtrace()));
                continue;
            }
        };
        let index = routes.len();
        let source_plan = match sources.iter_mut().position(|s| s.spec.name == source.name) {
            Some(i) => &mut sources[i],
            None => {
                sources.push(SourcePlan {
                    spec: source.clone(),
                    tables: Vec::new(),
                });
                sources.last_mut().expect("just pushed")
            }
        };
        let needs = BeforeImages::for_route(bound.target.mode, &bound.key_source_columns);
        let reads_headers = bound.reads_column(context::HEADERS);
        match source_plan
            .tables
            .iter_mut()
            .find(|t| t.table == route.source_table.parts)
        {
            Some(t) => {
                t.routes.push(index);
                t.before_images =
                    std::mem::replace(&mut t.before_images, BeforeImages::Never).union(needs);
                if bound.settings.schema_changes == SchemaChanges::Fail {
                    t.schema_changes = SchemaChanges::Fail;
                }
                t.reads_headers |= reads_headers;
            }
            None => source_plan.tables.push(SourceTablePlan {
                table: route.source_table.parts.clone(),
                schema,
                options: spec
                    .source_table(&route.source.name, &route.source_table.parts)
                    .map(|t| t.options.clone())
                    .unwrap_or_default(),
                scan_schema: Arc::clone(&bound.scan_schema),
                routes: vec![index],
                before_images: needs,
                schema_changes: bound.settings.schema_changes,
                reads_headers,
            }),
        }
        let schema_changes = bound.settings.schema_changes;
        routes.push(RoutePlan {
            name: route.display_name(),
            source: source.name.name.clone(),
            source_table: route.source_table.parts.clone(),
            sink_name: sink.name.name.clone(),
            sink: sink_obj,
            target,
            settings: bound.settings.clone(),
            logical,
            physical,
            feed,
            bound,
            schema_changes,
        });
    }
    if diags.has_errors() {
        return Err(diags);
    }
    Ok(PipelinePlan {
        name: spec.name.name.clone(),
        batch: batch_options(&spec.options),
        sources,
        routes,
        warnings: diags,
        spec,
    })
}

#[allow(clippy::too_many_arguments)]
async fn build_plans(
    state: &SessionState,
    bound: &BoundRoute,
    info: ScanInfo,
    feed: Arc<RouteFeed>,
    sink_name: String,
    sink_kind: String,
    exec_name: &'static str,
    sink: Arc<dyn Sink>,
    target: Arc<TargetTable>,
) -> Result<(LogicalPlan, Arc<dyn ExecutionPlan>)> {
    let provider = Arc::new(ChangeTableProvider::new(
        Arc::clone(&bound.scan_schema),
        info,
        Arc::clone(&feed),
    ));
    let mut plan =
        LogicalPlanBuilder::scan(bound.table_ref.clone(), provider_as_source(provider), None)?
            .build()?;
    if let Some(predicate) = &bound.filter {
        plan = extension(ChangeFilterNode {
            input: plan,
            predicate: predicate.clone(),
            on_miss: match target.mode {
                WriteMode::Upsert => OnMiss::Delete,
                _ => OnMiss::Drop,
            },
        });
    }
    plan = LogicalPlanBuilder::from(plan)
        .project(bound.projection.clone())?
        .build()?;
    if target.mode == WriteMode::Upsert {
        plan = extension(CollapseNode {
            input: plan,
            key: target.key.clone(),
        });
    }
    plan = extension(SinkNode::new(
        plan,
        sink_name,
        sink_kind,
        target.display_name(),
        target.mode,
        target.key.clone(),
    ));
    let plan = state
        .analyzer()
        .execute_and_check(plan, state.config_options(), |_, _| {})?;
    let planner = DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(RoutePlanner {
        sink,
        target,
        feed,
        exec_name,
        skip_deletes: bound.settings.skip_deletes,
    })]);
    let physical = planner.create_physical_plan(&plan, state).await?;
    Ok((plan, physical))
}

/// Plans the route's own logical nodes.
struct RoutePlanner {
    sink: Arc<dyn Sink>,
    target: Arc<TargetTable>,
    feed: Arc<RouteFeed>,
    exec_name: &'static str,
    skip_deletes: bool,
}

#[async_trait]
impl ExtensionPlanner for RoutePlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session_state: &SessionState,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let input = || Arc::clone(&physical_inputs[0]);
        if let Some(f) = node.as_any().downcast_ref::<ChangeFilterNode>() {
            let predicate = planner.create_physical_expr(
                &f.predicate,
                logical_inputs[0].schema(),
                session_state,
            )?;
            return Ok(Some(Arc::new(ChangeFilterExec::new(
                input(),
                predicate,
                f.on_miss,
            ))));
        }
        if let Some(c) = node.as_any().downcast_ref::<CollapseNode>() {
            return Ok(Some(Arc::new(CollapseExec::try_new(
                input(),
                c.key.clone(),
            )?)));
        }
        if node.as_any().downcast_ref::<SinkNode>().is_some() {
            return Ok(Some(Arc::new(SinkExec::new(
                input(),
                Arc::clone(&self.sink),
                Arc::clone(&self.target),
                Arc::clone(&self.feed),
                self.exec_name,
                self.skip_deletes,
            ))));
        }
        Ok(None)
    }
}

impl PipelinePlan {
    /// The logical and physical plan of every route, as `plan --explain`
    /// prints them.
    pub fn explain(&self, format: ExplainFormat) -> String {
        let mut out = String::new();
        for (i, r) in self.routes.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            let _ = writeln!(
                out,
                "-- route {}: {}.{} -> {} ({}, schema_changes={})",
                r.name,
                r.source,
                r.source_table.join("."),
                r.target.display_name(),
                r.target.mode,
                r.schema_changes
            );
            let _ = writeln!(out, "logical plan:");
            let _ = writeln!(out, "{}", r.logical.display_indent());
            let _ = writeln!(out, "physical plan:");
            match format {
                ExplainFormat::Indent => {
                    let _ = write!(out, "{}", displayable(r.physical.as_ref()).indent(false));
                }
                ExplainFormat::Tree => {
                    let _ = writeln!(out, "{}", displayable(r.physical.as_ref()).tree_render());
                }
            }
        }
        out
    }

    /// What the pipeline means once bound, in a canonical text form:
    /// sources, sinks (options redacted), and per route the target schema,
    /// key, mode, filter and projection. Two files that mean the same
    /// pipeline — whatever their language — describe identically.
    pub fn describe(&self, registry: &Registry) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "pipeline {}", self.name);
        let _ = writeln!(
            out,
            "  batching: max_rows={} max_interval={:?} progress_interval={:?}",
            self.batch.max_rows, self.batch.max_interval, self.batch.progress_interval
        );
        let mut source_specs: Vec<&SourceSpec> = self.spec.sources.iter().collect();
        source_specs.sort_by(|a, b| a.name.name.cmp(&b.name.name));
        for s in source_specs {
            let defs = registry
                .source(&s.kind.name)
                .map(|p| p.def().options.clone())
                .unwrap_or_default();
            let mut sorted = s.options.clone();
            sorted.entries.sort_by(|a, b| a.name.cmp(&b.name));
            let _ = writeln!(
                out,
                "source {} ({}): {}",
                s.name,
                s.kind,
                RedactedOptions {
                    options: &sorted,
                    defs: &defs
                }
            );
        }
        let mut sink_specs: Vec<_> = self.spec.sinks.iter().collect();
        sink_specs.sort_by(|a, b| a.name.name.cmp(&b.name.name));
        for s in sink_specs {
            let defs = registry
                .sink(&s.kind.name)
                .map(|p| p.def().options.clone())
                .unwrap_or_default();
            let mut sorted = s.options.clone();
            sorted.entries.sort_by(|a, b| a.name.cmp(&b.name));
            let _ = writeln!(
                out,
                "sink {} ({}): {}",
                s.name,
                s.kind,
                RedactedOptions {
                    options: &sorted,
                    defs: &defs
                }
            );
        }
        for r in &self.routes {
            let t = &r.target;
            let _ = writeln!(
                out,
                "route {} <- {}.{}: mode={} key=[{}] workers={} partition_by=[{}]{}",
                r.name,
                r.source,
                r.source_table.join("."),
                t.mode,
                t.key.join(", "),
                t.workers,
                t.partition_by
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if r.settings.skip_deletes {
                    " on_delete=skip"
                } else {
                    ""
                }
            );
            if r.settings.schema_changes == SchemaChanges::Fail {
                let _ = writeln!(out, "  schema_changes=fail");
            }
            for c in &t.columns {
                let origin = match &c.origin {
                    ColumnOrigin::Data => String::new(),
                    ColumnOrigin::Metadata(m) => format!(" (metadata {m})"),
                };
                let _ = writeln!(
                    out,
                    "  {} {}{}{}",
                    c.name,
                    c.ty,
                    if c.nullable { "" } else { " NOT NULL" },
                    origin
                );
            }
            if let Some(f) = &r.bound.filter {
                let _ = writeln!(out, "  where {f}");
            }
            for e in &r.bound.projection {
                let _ = writeln!(out, "  select {e}");
            }
        }
        out
    }
}
