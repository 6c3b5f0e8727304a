//! Binding a route: its SQL (projection, filter) resolved against the source
//! table's schema into DataFusion expressions, every cast checked against
//! the closed matrix, metadata columns moved to the end, the key resolved,
//! and the target table derived.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, DataFusionError, TableReference};
use datafusion::config::ConfigOptions;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::expr::{Alias, Cast, ScalarFunction};
use datafusion::logical_expr::planner::{ContextProvider, ExprPlanner};
use datafusion::logical_expr::{
    AggregateUDF, Expr, ExprSchemable, ScalarUDF, TableSource, WindowUDF,
};
use datafusion::sql::planner::{PlannerContext, SqlToRel};
use sqlparser::ast::{
    self as ast, CastKind, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments,
    ObjectName, Spanned, visit_expressions_mut,
};

use crate::cast::{CastPlan, check_cast};
use crate::context::{self, Transport};
use crate::diagnostic::{Diagnostic, Diagnostics, Span, did_you_mean};
use crate::functions::{AssumeUtc, CastPlaceholder, ToJson};
use crate::metadata;
use crate::registry::{SourceKindDef, SourceTableSchema};
use crate::spec::{ProjectionItem, RouteSpec, SpannedExpr, WriteMode};
use crate::target::{ColumnOrigin, TargetColumn, TargetTable};
use crate::types::{CanonicalType, Kind};
use crate::validate::{RouteSettings, route_settings};

/// A route, resolved against its source table's schema.
#[derive(Debug, Clone)]
pub struct BoundRoute {
    /// `sink.target`, for messages.
    pub name: String,
    /// The relation the route reads, as DataFusion names it.
    pub table_ref: TableReference,
    /// Data columns then context columns: the schema of the change batches
    /// the scan delivers.
    pub scan_schema: SchemaRef,
    pub source_schema: SourceTableSchema,
    pub target: TargetTable,
    pub settings: RouteSettings,
    /// The WHERE predicate, if any.
    pub filter: Option<Expr>,
    /// The projection: `__op`, `__before`, then every target column (data
    /// columns, then metadata columns), each aliased to its target name.
    pub projection: Vec<Expr>,
    /// Warnings produced while binding (bypassed casts, raw columns).
    pub warnings: Diagnostics,
    /// The source columns the target key is computed from: an update that
    /// leaves them unchanged cannot change the key.
    pub key_source_columns: Vec<String>,
}

impl BoundRoute {
    /// Whether the route's projection or filter reads the scan column
    /// `name` (a context column a source may spare producing otherwise).
    pub fn reads_column(&self, name: &str) -> bool {
        self.projection
            .iter()
            .chain(&self.filter)
            .any(|e| e.column_refs().iter().any(|c| c.name == name))
    }
}

/// Everything binding needs to know about the route's source.
pub struct SourceContext<'a> {
    pub def: &'a SourceKindDef,
    pub schema: SourceTableSchema,
}

/// The schema of the change batches a source delivers for a table.
pub fn scan_schema(table: &SourceTableSchema, transport: Transport) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = table
        .columns
        .iter()
        .map(|c| Arc::new(Field::new(&c.name.name, c.ty.arrow_type(), c.nullable)))
        .collect();
    fields.extend(context::context_fields(transport));
    Arc::new(Schema::new(fields))
}

/// Binds one route; errors go to `diags` and yield `None`.
pub fn bind_route(
    state: &SessionState,
    route: &RouteSpec,
    source: SourceContext<'_>,
    namespace: Option<&str>,
    diags: &mut Diagnostics,
) -> Option<BoundRoute> {
    let settings = route_settings(route);
    let mut parts = vec![route.source.name.clone()];
    parts.extend(route.source_table.parts.iter().cloned());
    let table_ref = match parts.as_slice() {
        [a, b] => TableReference::partial(a.as_str(), b.as_str()),
        [a, b, c] => TableReference::full(a.as_str(), b.as_str(), c.as_str()),
        _ => {
            diags.push(Diagnostic::error(
                route.source_table.span,
                format!(
                    "`{}.{}` names too many levels: write <source>.<table> or <source>.<schema>.<table>",
                    route.source, route.source_table
                ),
            ));
            return None;
        }
    };
    let scan = scan_schema(&source.schema, source.def.transport);
    let df_schema = match DFSchema::try_from_qualified_schema(table_ref.clone(), &scan) {
        Ok(s) => s,
        Err(e) => {
            diags.push(Diagnostic::error(route.span, e.strip_backtrace()));
            return None;
        }
    };
    let mut binder = Binder {
        state,
        route,
        source: &source,
        df_schema,
        placeholders: Vec::new(),
        diags: Diagnostics::default(),
        warnings: Diagnostics::default(),
    };
    let bound = binder.bind(settings, table_ref, scan, namespace);
    let had_errors = binder.diags.has_errors();
    diags.extend(binder.diags);
    let mut bound = bound?;
    if had_errors {
        return None;
    }
    bound.warnings = binder.warnings;
    Some(bound)
}

/// One `CAST` found in the route's SQL, waiting to be checked.
struct PendingCast {
    target: CanonicalType,
    span: Span,
}

struct Binder<'a> {
    state: &'a SessionState,
    route: &'a RouteSpec,
    source: &'a SourceContext<'a>,
    df_schema: DFSchema,
    placeholders: Vec<PendingCast>,
    diags: Diagnostics,
    warnings: Diagnostics,
}

/// One projection item after conversion.
struct BoundItem {
    name: String,
    expr: Expr,
    ty: CanonicalType,
    nullable: bool,
    metadata: Option<String>,
    /// The source column this item is (possibly cast), for key defaults.
    source_column: Option<String>,
    span: Span,
}

impl Binder<'_> {
    fn error(&mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic::error(span, message)
    }

    fn data_column(&self, name: &str) -> Option<&crate::spec::ColumnSpec> {
        self.source
            .schema
            .columns
            .iter()
            .find(|c| c.name.name == name)
    }

    fn bind(
        &mut self,
        settings: RouteSettings,
        table_ref: TableReference,
        scan: SchemaRef,
        namespace: Option<&str>,
    ) -> Option<BoundRoute> {
        let mut items: Vec<BoundItem> = Vec::new();
        for item in &self.route.projection {
            match item {
                ProjectionItem::Wildcard { replace, span } => {
                    for (name, _) in replace {
                        if self.data_column(&name.name).is_none() {
                            let d = self
                                .error(name.span, format!("REPLACE names `{name}`, which is not a column of the source table"));
                            self.diags.push(d);
                        }
                    }
                    let columns = self.source.schema.columns.clone();
                    for c in &columns {
                        let replaced = replace.iter().find(|(n, _)| n.name == c.name.name);
                        let bound = match replaced {
                            Some((alias, e)) => self.bind_item(e, Some(alias.name.clone())),
                            None => {
                                let expr = ast::Expr::Identifier(ast::Ident::with_quote(
                                    '"',
                                    &c.name.name,
                                ));
                                self.bind_item(&SpannedExpr { expr, span: *span }, None)
                            }
                        };
                        items.extend(bound);
                    }
                }
                ProjectionItem::Expr { expr, alias } => {
                    let bound = self.bind_item(expr, alias.as_ref().map(|a| a.name.clone()));
                    if let Some(b) = &bound {
                        self.refuse_dropped(&b.expr, b.span);
                    }
                    items.extend(bound);
                }
            }
        }

        // Data columns first, metadata columns at the end in selected order.
        let (mut ordered, meta): (Vec<BoundItem>, Vec<BoundItem>) =
            items.into_iter().partition(|i| i.metadata.is_none());
        ordered.extend(meta);

        let mut seen: HashMap<String, Span> = HashMap::new();
        for item in &ordered {
            if context::is_context_column(&item.name) {
                let d = self.error(
                    item.span,
                    format!(
                        "`{}`: target names starting with `__` are reserved",
                        item.name
                    ),
                );
                self.diags.push(d);
            }
            if seen.insert(item.name.clone(), item.span).is_some() {
                let d = self
                    .error(
                        item.span,
                        format!("the target has two columns named `{}`", item.name),
                    )
                    .with_help("rename one with AS");
                self.diags.push(d);
            }
        }
        if ordered.iter().all(|i| i.metadata.is_some()) && !ordered.is_empty() {
            let d = self.error(self.route.span, "the route selects no data column");
            self.diags.push(d);
        }

        let filter = self.route.filter.as_ref().and_then(|f| self.bind_filter(f));
        if let (Some(f), Some(written)) = (&filter, &self.route.filter) {
            self.refuse_dropped(f, written.span);
        }

        let key = self.resolve_key(&settings, &ordered);
        let mut key_source_columns: Vec<String> = Vec::new();
        for k in key.iter().flatten() {
            if let Some(item) = ordered.iter().find(|i| &i.name == k) {
                let _ = item.expr.apply(|e| {
                    if let Expr::Column(c) = e
                        && !context::is_context_column(&c.name)
                        && !key_source_columns.contains(&c.name)
                    {
                        key_source_columns.push(c.name.clone());
                    }
                    Ok(TreeNodeRecursion::Continue)
                });
            }
        }

        let columns: Vec<TargetColumn> = ordered
            .iter()
            .map(|i| TargetColumn {
                name: i.name.clone(),
                ty: i.ty.clone(),
                nullable: i.nullable,
                origin: match &i.metadata {
                    Some(m) => ColumnOrigin::Metadata(m.clone()),
                    None => ColumnOrigin::Data,
                },
            })
            .collect();

        self.check_coordinate(&settings, &ordered);

        for p in &settings.partition_by {
            let span = self
                .route
                .options
                .entry("partition_by")
                .map_or(self.route.span, |e| e.value_span);
            match columns.iter().find(|c| c.name == p.column) {
                None => {
                    let d = self.error(
                        span,
                        format!(
                            "partition_by uses `{}`, which is not a column of the target",
                            p.column
                        ),
                    );
                    self.diags.push(d);
                }
                Some(c) if !p.transform.accepts(c.ty.kind()) => {
                    let d = self.error(
                        span,
                        format!(
                            "partition_by {p}: the transform does not apply to a {} column",
                            c.ty.kind()
                        ),
                    );
                    self.diags.push(d);
                }
                Some(_) => {}
            }
        }

        let mut name = self.route.target.parts.clone();
        if name.len() == 1
            && let Some(ns) = namespace
        {
            name.insert(0, ns.to_string());
        }
        let target = TargetTable {
            name,
            columns,
            key: key.unwrap_or_default(),
            mode: settings.mode,
            partition_by: settings.partition_by.clone(),
            workers: settings.workers,
            schema_changes: settings.schema_changes,
        };

        let mut projection = vec![
            Expr::Column(Column::new(Some(table_ref.clone()), context::OP)).alias(context::OP),
            Expr::Column(Column::new(Some(table_ref.clone()), context::BEFORE))
                .alias(context::BEFORE),
        ];
        projection.extend(ordered.into_iter().map(|i| i.expr.alias(i.name)));

        Some(BoundRoute {
            name: self.route.display_name(),
            table_ref,
            scan_schema: scan,
            source_schema: self.source.schema.clone(),
            target,
            settings,
            filter,
            projection,
            warnings: Diagnostics::default(),
            key_source_columns,
        })
    }

    /// A route that names a column its source table no longer has (dropped
    /// or renamed at the source since the pipeline was planned) cannot go
    /// on: it would write NULL where the user asked for the column.
    fn refuse_dropped(&mut self, expr: &Expr, span: Span) {
        let dropped = &self.source.schema.dropped;
        if dropped.is_empty() {
            return;
        }
        let mut named: Vec<String> = Vec::new();
        let _ = expr.apply(|e| {
            if let Expr::Column(c) = e
                && dropped.contains(&c.name)
                && !named.contains(&c.name)
            {
                named.push(c.name.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        });
        for column in named {
            let d = self
                .error(
                    span,
                    format!(
                        "route {} names column `{column}`, which was dropped (or renamed) at the source {}",
                        self.route.display_name(),
                        self.route.source_table
                    ),
                )
                .with_rule("a route reads only columns its source table has; the target keeps the column, NULL from then on")
                .with_help(format!(
                    "remove `{column}` from the route, or name the column that replaced it"
                ));
            self.diags.push(d);
        }
    }

    /// An `append-idempotent` route must land the transport coordinate, as
    /// it is: it is what makes a duplicate provable (two rows with one
    /// coordinate) and removable, and what sinks order and replace by. A
    /// value computed from it (`_sequence % 10`) can repeat, so it does not
    /// count. Sources without a coordinate are refused by validation.
    fn check_coordinate(&mut self, settings: &RouteSettings, items: &[BoundItem]) {
        if settings.mode != WriteMode::AppendIdempotent
            || self.source.def.transport == Transport::None
        {
            return;
        }
        for item in items {
            let Some(m) = item.metadata.as_deref() else {
                continue;
            };
            let Some(column) = metadata::lookup(m)
                .filter(|_| metadata::COORDINATE.contains(&m))
                .map(|c| c.context_column)
            else {
                continue;
            };
            let as_is = matches!(strip_alias_cast(&item.expr), Expr::Column(c) if c.name == column);
            if !as_is {
                let d = self
                    .error(
                        item.span,
                        format!(
                            "`{}` is computed from `_{m}`: an append-idempotent route lands the coordinate as it is",
                            item.name
                        ),
                    )
                    .with_rule("a value computed from the coordinate can repeat, and the sink replaces rows that share one")
                    .with_help(format!("select `_{m}` itself (a cast is fine), and compute other columns beside it"));
                self.diags.push(d);
            }
        }
        let missing: Vec<&str> = metadata::COORDINATE
            .into_iter()
            .filter(|m| !items.iter().any(|i| i.metadata.as_deref() == Some(*m)))
            .collect();
        if missing.is_empty() {
            return;
        }
        let span = self
            .route
            .options
            .entry("write_mode")
            .map_or(self.route.span, |e| e.value_span);
        let sql: Vec<String> = missing.iter().map(|m| format!("_{m}")).collect();
        let yaml: Vec<String> = missing.iter().map(|m| format!("{{from: {m}}}")).collect();
        let d = self
            .error(
                span,
                format!(
                    "append-idempotent lands the transport coordinate, and the route does not select {}",
                    sql.join(", ")
                ),
            )
            .with_rule("a duplicate is provable only by the coordinate every row carries (_stream, _shard, _sequence)")
            .with_help(format!(
                "add {} to the SELECT (YAML: `metadata: [{}]`)",
                sql.join(", "),
                yaml.join(", ")
            ));
        self.diags.push(d);
    }

    /// The route key: `primary_key`, or the source key mapped through the
    /// projection. Checks the rules on keys.
    fn resolve_key(
        &mut self,
        settings: &RouteSettings,
        items: &[BoundItem],
    ) -> Option<Vec<String>> {
        let key_span = self
            .route
            .options
            .entry("primary_key")
            .map_or(self.route.span, |e| e.value_span);
        let key: Vec<String> = match &settings.key {
            Some(k) => {
                if k.is_empty() {
                    let d = self.error(key_span, "primary_key is empty");
                    self.diags.push(d);
                    return None;
                }
                k.clone()
            }
            None => {
                let source_key = self.source.schema.primary_key.clone();
                if source_key.is_empty() {
                    if settings.mode == WriteMode::Upsert {
                        let d = self
                            .error(
                                self.route.span,
                                format!("route {} is upsert but has no key", self.route.display_name()),
                            )
                            .with_rule("upsert reflects source state by primary key: it needs one")
                            .with_help("set primary_key = 'col[, col]' or declare the source table's PRIMARY KEY; or use write_mode = 'append'");
                        self.diags.push(d);
                    }
                    return None;
                }
                let mut mapped = Vec::new();
                for k in &source_key {
                    match items
                        .iter()
                        .find(|i| i.metadata.is_none() && i.source_column.as_deref() == Some(k))
                    {
                        Some(i) => mapped.push(i.name.clone()),
                        None => {
                            if settings.mode == WriteMode::Upsert {
                                let d = self
                                    .error(
                                        self.route.span,
                                        format!("the source key column `{k}` is not in the projection of route {}", self.route.display_name()),
                                    )
                                    .with_rule("an upsert route needs its key columns in the target")
                                    .with_help("select the key column, or set primary_key to target columns");
                                self.diags.push(d);
                            }
                            return None;
                        }
                    }
                }
                mapped
            }
        };
        let mut ok = true;
        for k in &key {
            match items.iter().find(|i| &i.name == k) {
                None => {
                    let d = self
                        .error(
                            key_span,
                            format!("key column `{k}` is not in the projection"),
                        )
                        .with_help_opt(
                            did_you_mean(k, items.iter().map(|i| i.name.as_str()))
                                .map(|s| format!("did you mean `{s}`?")),
                        );
                    self.diags.push(d);
                    ok = false;
                }
                Some(i) if i.metadata.is_some() => {
                    let d = self
                        .error(key_span, format!("key column `{k}` is a metadata column"))
                        .with_rule("metadata columns are nullable context, never part of a key");
                    self.diags.push(d);
                    ok = false;
                }
                Some(i) if i.nullable => {
                    let d = self
                        .error(key_span, format!("key column `{k}` is nullable"))
                        .with_rule("key columns must be NOT NULL: a NULL key cannot identify a row")
                        .with_help("declare the source column NOT NULL (or part of the PRIMARY KEY), or choose another key");
                    self.diags.push(d);
                    ok = false;
                }
                Some(i) if i.ty.kind().is_nested() || i.ty.kind() == Kind::Unknown => {
                    let d = self.error(
                        key_span,
                        format!("key column `{k}` is of type {}; keys must be scalar", i.ty),
                    );
                    self.diags.push(d);
                    ok = false;
                }
                Some(_) => {}
            }
        }
        ok.then_some(key)
    }

    /// Converts one projection item.
    fn bind_item(&mut self, item: &SpannedExpr, alias: Option<String>) -> Option<BoundItem> {
        let span = ast_span(&item.expr).unwrap_or(item.span);
        let written_name = match &item.expr {
            ast::Expr::Identifier(i) => Some(normalize_ident(i)),
            ast::Expr::CompoundIdentifier(parts) => parts.last().map(normalize_ident),
            ast::Expr::Cast { expr, .. } => match expr.as_ref() {
                ast::Expr::Identifier(i) => Some(normalize_ident(i)),
                ast::Expr::CompoundIdentifier(parts) => parts.last().map(normalize_ident),
                _ => None,
            },
            _ => None,
        };
        let expr = self.sql_to_logical(&item.expr, span)?;
        let (expr, ty) = self.check(expr, span)?;

        let mut refs = Vec::new();
        let _ = expr.apply(|e| {
            if let Expr::Column(c) = e {
                refs.push(c.name.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        });
        let metadata_refs: Vec<&String> = refs
            .iter()
            .filter(|r| context::is_context_column(r))
            .collect();
        let metadata = if !refs.is_empty() && metadata_refs.len() == refs.len() {
            metadata::catalog()
                .into_iter()
                .find(|m| m.context_column == metadata_refs[0].as_str())
                .map(|m| m.name.to_string())
        } else {
            None
        };
        let name = match alias.or(written_name) {
            Some(n) => n,
            None => {
                let d = self
                    .error(
                        span,
                        format!("name this expression: `{} AS <column>`", item.expr),
                    )
                    .with_rule("every target column needs a name");
                self.diags.push(d);
                return None;
            }
        };
        let source_column = match strip_alias_cast(&expr) {
            Expr::Column(c) if !context::is_context_column(&c.name) => Some(c.name.clone()),
            _ => None,
        };
        let nullable = metadata.is_some() || expr.nullable(&self.df_schema).unwrap_or(true);
        if let CanonicalType::Unknown(raw) = &ty {
            self.warnings.push(
                Diagnostic::warning(
                    span,
                    format!("column `{name}` has source type {raw}, which has no canonical mapping: it lands as its raw text"),
                )
                .with_help(format!("CAST({name} AS <type>) declares its type (bypass)")),
            );
        }
        // Representation: an expression may compute a non-canonical Arrow
        // type of its kind (Int16, Utf8View, nanosecond timestamps).
        let expr = match expr.get_type(&self.df_schema) {
            Ok(dt) if dt != ty.arrow_type() => {
                Expr::Cast(Cast::new(Box::new(expr), ty.arrow_type()))
            }
            _ => expr,
        };
        Some(BoundItem {
            name,
            expr,
            ty,
            nullable,
            metadata,
            source_column,
            span,
        })
    }

    fn bind_filter(&mut self, filter: &SpannedExpr) -> Option<Expr> {
        let span = ast_span(&filter.expr).unwrap_or(filter.span);
        let expr = self.sql_to_logical(&filter.expr, span)?;
        let (expr, _) = self.check(expr, span)?;
        match expr.get_type(&self.df_schema) {
            Ok(DataType::Boolean) => Some(expr),
            Ok(other) => {
                let d = self.error(
                    span,
                    format!("WHERE needs a boolean condition, found {other}"),
                );
                self.diags.push(d);
                None
            }
            Err(e) => {
                let d = self.error(span, e.strip_backtrace());
                self.diags.push(d);
                None
            }
        }
    }

    /// sqlparser AST -> DataFusion expression: pseudo-columns become context
    /// columns, casts become stand-ins that keep their canonical target.
    fn sql_to_logical(&mut self, sql: &ast::Expr, span: Span) -> Option<Expr> {
        let mut sql = sql.clone();
        let mut errors = Vec::new();
        let transport = self.source.def.transport;
        let source_kind = self.source.def.name;
        let data_names: Vec<String> = self
            .source
            .schema
            .columns
            .iter()
            .map(|c| c.name.name.clone())
            .collect();
        let placeholders = &mut self.placeholders;
        let _ = visit_expressions_mut(&mut sql, |e| {
            match e {
                ast::Expr::Identifier(ident) => {
                    rewrite_pseudo(ident, &data_names, transport, source_kind, &mut errors);
                }
                ast::Expr::CompoundIdentifier(parts) => {
                    if let Some(last) = parts.last_mut() {
                        rewrite_pseudo(last, &data_names, transport, source_kind, &mut errors);
                    }
                }
                ast::Expr::Cast {
                    kind,
                    expr,
                    data_type,
                    ..
                } => {
                    let at = ast_span(expr).unwrap_or(span);
                    match kind {
                        CastKind::TryCast | CastKind::SafeCast => errors.push(
                            Diagnostic::error(at, "TRY_CAST turns values that do not convert into NULL")
                                .with_rule("a lossy conversion is rejected at plan time; nothing is silently nulled")
                                .with_help("use CAST, which the closed cast matrix checks"),
                        ),
                        CastKind::Cast | CastKind::DoubleColon => {
                            match CanonicalType::parse(&data_type.to_string(), false) {
                                Ok(target) => {
                                    let index = placeholders.len();
                                    placeholders.push(PendingCast { target, span: at });
                                    let inner = std::mem::replace(expr.as_mut(), ast::Expr::value(ast::Value::Null));
                                    *e = call(&format!("{}{index}", CastPlaceholder::PREFIX), vec![inner]);
                                }
                                Err(err) => errors.push(Diagnostic::error(
                                    at,
                                    format!("CAST target `{data_type}`: {}", err.message),
                                )),
                            }
                        }
                    }
                }
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
        if !errors.is_empty() {
            self.diags.items.extend(errors);
            return None;
        }
        let provider = BindContextProvider {
            state: self.state,
            placeholders: &self.placeholders,
            options: self.state.config_options().as_ref().clone(),
        };
        let planner = SqlToRel::new(&provider);
        match planner.sql_to_expr(sql, &self.df_schema, &mut PlannerContext::new()) {
            Ok(expr) => {
                if let Some(kind) = forbidden(&expr) {
                    let d = self
                        .error(span, format!("{kind} are not allowed in a route"))
                        .with_rule("a route is a per-row map over a change stream: aggregates, window functions, joins and subqueries are rejected");
                    self.diags.push(d);
                    return None;
                }
                Some(expr)
            }
            Err(e) => {
                let at = e
                    .diagnostic()
                    .and_then(|d| d.span)
                    .filter(|s| s.start.line > 0)
                    .map(|s| Span::new(s.start.line as u32, s.start.column as u32))
                    .unwrap_or(span);
                let d = self.error(at, clean_error(&e));
                self.diags.push(d);
                None
            }
        }
    }

    /// Replaces cast stand-ins after checking them against the matrix, and
    /// computes the canonical type of the expression.
    fn check(&mut self, expr: Expr, span: Span) -> Option<(Expr, CanonicalType)> {
        let mut failure: Option<Diagnostic> = None;
        let result = self.rewrite(expr, span, &mut failure);
        if let Some(d) = failure {
            self.diags.push(d);
            return None;
        }
        match result {
            Ok(r) => Some(r),
            Err(e) => {
                let d = self.error(span, clean_error(&e));
                self.diags.push(d);
                None
            }
        }
    }

    fn column_type(&self, name: &str) -> Option<CanonicalType> {
        if let Some(c) = self.data_column(name) {
            return Some(c.ty.clone());
        }
        if name == context::BEFORE {
            return Some(CanonicalType::Bool);
        }
        metadata::catalog()
            .into_iter()
            .find(|m| m.context_column == name)
            .map(|m| m.ty)
    }

    fn rewrite(
        &self,
        expr: Expr,
        span: Span,
        failure: &mut Option<Diagnostic>,
    ) -> Result<(Expr, CanonicalType), DataFusionError> {
        let abort = || DataFusionError::Plan("cast rejected".into());
        match expr {
            Expr::Alias(Alias {
                expr,
                relation,
                name,
                metadata,
            }) => {
                let (inner, ty) = self.rewrite(*expr, span, failure)?;
                Ok((
                    Expr::Alias(Alias {
                        expr: Box::new(inner),
                        relation,
                        name,
                        metadata,
                    }),
                    ty,
                ))
            }
            Expr::Column(c) => {
                let ty = self
                    .column_type(&c.name)
                    .ok_or_else(|| DataFusionError::Plan(format!("unknown column {}", c.name)))?;
                Ok((Expr::Column(c), ty))
            }
            Expr::ScalarFunction(f) if CastPlaceholder::index_of(f.name()).is_some() => {
                let index = CastPlaceholder::index_of(f.name()).expect("checked");
                let pending = &self.placeholders[index];
                let arg = f.args.into_iter().next().expect("one argument");
                let shown = arg.to_string();
                let (inner, from) = self.rewrite(arg, pending.span, failure)?;
                let to = pending.target.clone();
                match check_cast(&from, &to) {
                    Ok(CastPlan::Identity) => Ok((inner, to)),
                    Ok(CastPlan::Arrow) => {
                        Ok((Expr::Cast(Cast::new(Box::new(inner), to.arrow_type())), to))
                    }
                    Ok(CastPlan::Bypass) => {
                        Ok((Expr::Cast(Cast::new(Box::new(inner), to.arrow_type())), to))
                    }
                    Ok(CastPlan::ToJsonText) => {
                        let udf = self
                            .state
                            .scalar_functions()
                            .get(ToJson::NAME)
                            .cloned()
                            .ok_or_else(|| {
                                DataFusionError::Internal("to_json not registered".into())
                            })?;
                        Ok((
                            Expr::ScalarFunction(ScalarFunction::new_udf(udf, vec![inner])),
                            to,
                        ))
                    }
                    Err(rejection) => {
                        *failure = Some(
                            Diagnostic::error(
                                pending.span,
                                format!(
                                    "cannot cast {} from {} to {}",
                                    unqualified(&shown),
                                    describe_type(&from),
                                    describe_type(&to)
                                ),
                            )
                            .with_rule(format!("{}: {}", rejection.rule, rejection.rule.explain()))
                            .with_help_opt(rejection.hint),
                        );
                        Err(abort())
                    }
                }
            }
            Expr::ScalarFunction(f) if f.name() == AssumeUtc::NAME => {
                let func = Arc::clone(&f.func);
                let arg =
                    f.args.into_iter().next().ok_or_else(|| {
                        DataFusionError::Plan("assume_utc takes one argument".into())
                    })?;
                let shown = arg.to_string();
                let (inner, from) = self.rewrite(arg, span, failure)?;
                if from != CanonicalType::Timestamp {
                    *failure = Some(
                        Diagnostic::error(
                            span,
                            format!("assume_utc({}) needs a TIMESTAMP, found {}", unqualified(&shown), describe_type(&from)),
                        )
                        .with_rule("assume_utc asserts that a zone-less timestamp is UTC; it applies to TIMESTAMP only"),
                    );
                    return Err(abort());
                }
                Ok((
                    Expr::ScalarFunction(ScalarFunction::new_udf(func, vec![inner])),
                    CanonicalType::TimestampTz,
                ))
            }
            other => {
                let rewritten = other
                    .map_children(|child| {
                        self.rewrite(child, span, failure)
                            .map(|(e, _)| Transformed::yes(e))
                    })?
                    .data;
                let dt = rewritten.get_type(&self.df_schema)?;
                match CanonicalType::from_arrow(&dt) {
                    Some(ty) => Ok((rewritten, ty)),
                    None => {
                        *failure = Some(Diagnostic::error(
                            span,
                            format!(
                                "`{}` computes {dt}, which has no canonical type; CAST it",
                                unqualified(&rewritten.to_string())
                            ),
                        ));
                        Err(abort())
                    }
                }
            }
        }
    }
}

/// Type names in messages: `int64`, `decimal(12,2)`, `unknown (point)`.
fn describe_type(t: &CanonicalType) -> String {
    match t {
        CanonicalType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
        CanonicalType::Fixed(n) => format!("fixed({n})"),
        CanonicalType::Unknown(raw) => format!("unknown ({raw})"),
        other if other.kind().is_nested() => other.to_string().to_lowercase(),
        other => other.kind().name().to_string(),
    }
}

/// `events.orders.amount` -> `amount` in messages.
fn unqualified(shown: &str) -> String {
    shown.rsplit('.').next().unwrap_or(shown).to_string()
}

fn strip_alias_cast(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => strip_alias_cast(&a.expr),
        Expr::Cast(c) => strip_alias_cast(&c.expr),
        other => other,
    }
}

/// The aggregate/window/subquery an expression contains, if any.
fn forbidden(expr: &Expr) -> Option<&'static str> {
    let mut found = None;
    let _ = expr.apply(|e| {
        found = match e {
            Expr::AggregateFunction(_) => Some("aggregate functions"),
            Expr::WindowFunction(_) => Some("window functions"),
            Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_) => Some("subqueries"),
            _ => None,
        };
        Ok(if found.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

fn clean_error(e: &DataFusionError) -> String {
    let text = e.strip_backtrace();
    for prefix in ["Error during planning: ", "Schema error: ", "SQL error: "] {
        if let Some(rest) = text.strip_prefix(prefix) {
            return rest.to_string();
        }
    }
    text
}

fn normalize_ident(i: &ast::Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_ascii_lowercase()
    }
}

/// `_commit_ts` -> the context column `__commit_ts`, unless the table has a
/// data column of that name.
fn rewrite_pseudo(
    ident: &mut ast::Ident,
    data_names: &[String],
    transport: Transport,
    source_kind: &str,
    errors: &mut Vec<Diagnostic>,
) {
    let name = normalize_ident(ident);
    if data_names.contains(&name) {
        return;
    }
    let Some(m) = metadata::lookup_pseudo(&name) else {
        if name.starts_with('_') && !name.starts_with("__") {
            let names: Vec<String> = metadata::names().iter().map(|n| format!("_{n}")).collect();
            if let Some(s) = did_you_mean(&name, names.iter().map(String::as_str)) {
                errors.push(
                    Diagnostic::error(
                        span_of(ident),
                        format!("`{name}` is neither a column nor a metadata column"),
                    )
                    .with_help(format!("did you mean `{s}`?")),
                );
            }
        }
        return;
    };
    if m.transport > transport {
        let (message, help) = match transport {
            Transport::None => (
                format!(
                    "metadata column `{name}` is transport metadata, and a {source_kind} source has none"
                ),
                "CDC metadata columns: _op, _commit_ts, _ingest_ts, _position, _source_table, _phase",
            ),
            _ => (
                format!(
                    "metadata column `{name}` is message metadata, and a {source_kind} source carries no messages"
                ),
                "a change file's transport metadata is its coordinate: _stream (the file), _shard (0), _sequence (the line's byte offset)",
            ),
        };
        errors.push(Diagnostic::error(span_of(ident), message).with_help(help));
        return;
    }
    ident.value = m.context_column.to_string();
    ident.quote_style = Some('"');
}

fn span_of(ident: &ast::Ident) -> Span {
    Span::new(ident.span.start.line as u32, ident.span.start.column as u32)
}

/// The start of an AST node, when sqlparser knows it.
fn ast_span(expr: &ast::Expr) -> Option<Span> {
    let s = expr.span();
    (s.start.line > 0).then(|| Span::new(s.start.line as u32, s.start.column as u32))
}

fn call(name: &str, args: Vec<ast::Expr>) -> ast::Expr {
    ast::Expr::Function(ast::Function {
        name: ObjectName::from(vec![ast::Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| FunctionArg::Unnamed(FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// What DataFusion's SQL-to-expression planner may look up while binding a
/// route: functions (ours and DataFusion's, plus the cast stand-ins); no
/// tables (a route reads one source table and nothing else).
struct BindContextProvider<'a> {
    state: &'a SessionState,
    placeholders: &'a [PendingCast],
    options: ConfigOptions,
}

impl ContextProvider for BindContextProvider<'_> {
    fn get_table_source(
        &self,
        name: TableReference,
    ) -> datafusion::common::Result<Arc<dyn TableSource>> {
        Err(DataFusionError::Plan(format!(
            "a route reads one source table; `{name}` cannot be queried here (subqueries and joins are rejected)"
        )))
    }

    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        self.state.expr_planners()
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        if let Some(i) = CastPlaceholder::index_of(name) {
            let target = self.placeholders.get(i)?.target.arrow_type();
            return Some(Arc::new(ScalarUDF::from(CastPlaceholder::new(i, target))));
        }
        self.state.scalar_functions().get(name).cloned()
    }

    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.state.aggregate_functions().get(name).cloned()
    }

    fn get_window_meta(&self, name: &str) -> Option<Arc<WindowUDF>> {
        self.state.window_functions().get(name).cloned()
    }

    fn get_variable_type(&self, _: &[String]) -> Option<DataType> {
        None
    }

    fn options(&self) -> &ConfigOptions {
        &self.options
    }

    fn udf_names(&self) -> Vec<String> {
        self.state.scalar_functions().keys().cloned().collect()
    }

    fn udaf_names(&self) -> Vec<String> {
        self.state.aggregate_functions().keys().cloned().collect()
    }

    fn udwf_names(&self) -> Vec<String> {
        self.state.window_functions().keys().cloned().collect()
    }
}
