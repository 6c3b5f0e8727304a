//! The Go engine's YAML (`pipeline`, `source`, `sink`, `tables[]`) into the
//! same [`PipelineSpec`] the SQL front end produces.
//!
//! Field names follow the Go engine (`primaryKey`, `writeMode`,
//! `partitionBy`, `cast`, `metadata[{from, as}]`, `columns`,
//! `workers.number`, `sink.maintenance`); option keys in camelCase become the
//! snake_case options of the SQL form. Additions of ours: `source.name` and
//! `sink.name` (default `source` / `sink`), `sink.type: debug | memory`,
//! `source.kind: file`, and `batching: {maxRows, maxInterval}`.

use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use urutau_planner::diagnostic::{Diagnostic, Diagnostics, Span, did_you_mean};
use urutau_planner::metadata;
use urutau_planner::options::{LiteralKind, OptionMap, OptionValue};
use urutau_planner::spec::{
    ColumnSpec, Ident, PipelineSpec, ProjectionItem, QualifiedName, RouteSpec, SinkSpec,
    SourceSpec, SourceTableSpec, SpannedExpr,
};
use urutau_planner::types::{CanonicalType, StructField};
use yaml_rust2::scanner::TScalarStyle;

use crate::pipeline_sql::parser_error;
use crate::tokens::EnvLookup;
use crate::yaml_tree::{self, Node, Value};

/// Parses a pipeline YAML file.
pub fn parse_pipeline_yaml(
    text: &str,
    default_name: &str,
    env: EnvLookup<'_>,
) -> Result<PipelineSpec, Diagnostics> {
    let mut diags = Diagnostics::default();
    let root = match yaml_tree::parse(text) {
        Ok(r) => r,
        Err(d) => {
            diags.push(d);
            return Err(diags);
        }
    };
    let mut front = YamlFront {
        env,
        diags: &mut diags,
        evolve_schema: None,
    };
    let spec = front.pipeline(&root, default_name);
    match spec {
        Some(s) if !diags.has_errors() => Ok(s),
        _ => Err(diags),
    }
}

struct YamlFront<'a, 'e> {
    env: EnvLookup<'e>,
    diags: &'a mut Diagnostics,
    /// The sink's `evolveSchema`, as every table's `schema_changes`
    /// (`evolve` or `fail`) with where it was written.
    evolve_schema: Option<(OptionValue, Span, Span)>,
}

/// `slotName` -> `slot_name`.
fn snake_case(key: &str) -> String {
    let mut out = String::new();
    for (i, c) in key.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn literal_of(node: &Node) -> LiteralKind {
    match &node.value {
        Value::Scalar(s, TScalarStyle::Plain) => {
            if s == "true" || s == "false" {
                LiteralKind::Bool
            } else if s.parse::<f64>().is_ok() {
                LiteralKind::Number
            } else {
                LiteralKind::String
            }
        }
        _ => LiteralKind::String,
    }
}

/// SQL text for an identifier, always quoted (YAML names keep their case).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl YamlFront<'_, '_> {
    fn error(&mut self, span: Span, msg: impl Into<String>) {
        self.diags.push(Diagnostic::error(span, msg));
    }

    fn unknown_key(&mut self, key: &Node, known: &[&str], within: &str) {
        let name = key.as_str().unwrap_or("?");
        let d = Diagnostic::error(key.span, format!("unknown key `{name}` in {within}"));
        let d = match did_you_mean(name, known.iter().copied()) {
            Some(s) => d.with_help(format!("did you mean `{s}`?")),
            None => d.with_help(format!("keys: {}", known.join(", "))),
        };
        self.diags.push(d);
    }

    fn pipeline(&mut self, root: &Node, default_name: &str) -> Option<PipelineSpec> {
        let entries = match root.as_map("a pipeline file") {
            Ok(e) => e,
            Err(d) => {
                self.diags.push(d);
                return None;
            }
        };
        let known = ["pipeline", "source", "sink", "tables", "batching"];
        let mut spec = PipelineSpec {
            name: Ident::new(default_name, Span::new(1, 1)),
            options: OptionMap::default(),
            sources: vec![],
            sinks: vec![],
            source_tables: vec![],
            routes: vec![],
        };
        let mut source_node = None;
        let mut sink_node = None;
        let mut tables_node = None;
        for (k, v) in entries {
            match k.as_str().unwrap_or("") {
                "pipeline" => match v.as_str() {
                    Some(n) => spec.name = Ident::new(n, v.span),
                    None => self.error(v.span, "pipeline must be the pipeline's name"),
                },
                "source" => source_node = Some((k, v)),
                "sink" => sink_node = Some((k, v)),
                "tables" => tables_node = Some(v),
                "batching" => {
                    let Ok(m) = v.as_map("batching").map_err(|d| self.diags.push(d)) else {
                        continue;
                    };
                    for (bk, bv) in m {
                        let name = match bk.as_str().unwrap_or("") {
                            "maxRows" => "max_batch_rows",
                            "maxInterval" => "max_batch_interval",
                            "progressInterval" => "progress_interval",
                            _ => {
                                self.unknown_key(
                                    bk,
                                    &["maxRows", "maxInterval", "progressInterval"],
                                    "batching",
                                );
                                continue;
                            }
                        };
                        if let Some(value) = self.option_value(bv) {
                            spec.options.push(name, value, bk.span, bv.text_span());
                        }
                    }
                }
                _ => self.unknown_key(k, &known, "the pipeline"),
            }
        }
        let source_name = match source_node {
            Some((_, v)) => self.source(v, &mut spec),
            None => {
                self.error(root.span, "the pipeline needs a `source:`");
                None
            }
        };
        let sink_name = match sink_node {
            Some((_, v)) => self.sink(v, &mut spec),
            None => {
                self.error(root.span, "the pipeline needs a `sink:`");
                None
            }
        };
        match tables_node {
            Some(t) => {
                if let (Some(src), Some(sink)) = (source_name, sink_name) {
                    match t.as_seq("tables") {
                        Ok(items) => {
                            for item in items {
                                self.table(item, &src, &sink, &mut spec);
                            }
                        }
                        Err(d) => self.diags.push(d),
                    }
                }
            }
            None => self.error(root.span, "the pipeline needs `tables:`"),
        }
        Some(spec)
    }

    fn option_value(&mut self, v: &Node) -> Option<OptionValue> {
        match v.as_str() {
            Some(text) => Some(OptionValue {
                text: text.to_string(),
                literal: literal_of(v),
                env: None,
            }),
            None => {
                self.error(v.span, "expected a single value");
                None
            }
        }
    }

    fn env_option(&mut self, options: &mut OptionMap, name: &str, var: &str, span: Span) {
        if options.entry(name).is_none()
            && let Some(text) = (self.env)(var)
        {
            options.push(
                name,
                OptionValue {
                    text,
                    literal: LiteralKind::String,
                    env: Some(var.to_string()),
                },
                span,
                span,
            );
        }
    }

    fn source(&mut self, node: &Node, spec: &mut PipelineSpec) -> Option<Ident> {
        let entries = node.as_map("source").map_err(|d| self.diags.push(d)).ok()?;
        let mut name = Ident::new("source", node.span);
        let mut kind = None;
        let mut options = OptionMap::default();
        for (k, v) in entries {
            let key = k.as_str().unwrap_or("");
            match key {
                "name" => name = Ident::new(v.as_str().unwrap_or(""), v.span),
                "kind" => kind = Some(Ident::new(v.as_str().unwrap_or(""), v.text_span())),
                _ => {
                    if let Some(value) = self.option_value(v) {
                        options.push(snake_case(key), value, k.span, v.text_span());
                    }
                }
            }
        }
        self.env_option(&mut options, "uri", "URUTAU_SOURCE_URI", node.span);
        let Some(kind) = kind else {
            self.error(
                node.span,
                "source needs `kind:` (file | postgres | mysql | kafka)",
            );
            return None;
        };
        spec.sources.push(SourceSpec {
            name: name.clone(),
            kind,
            options,
        });
        Some(name)
    }

    fn sink(&mut self, node: &Node, spec: &mut PipelineSpec) -> Option<Ident> {
        let entries = node.as_map("sink").map_err(|d| self.diags.push(d)).ok()?;
        let mut name = Ident::new("sink", node.span);
        // The Go engine's default sink type.
        let mut kind = Ident::new("iceberg", node.span);
        let mut catalog = Some(("rest".to_string(), node.span));
        let mut options = OptionMap::default();
        for (k, v) in entries {
            let key = k.as_str().unwrap_or("");
            match key {
                "name" => name = Ident::new(v.as_str().unwrap_or(""), v.span),
                "type" => {
                    let t = v.as_str().unwrap_or("");
                    let span = v.text_span();
                    match t.split_once('+') {
                        Some(("iceberg", cat)) => {
                            kind = Ident::new("iceberg", span);
                            catalog = Some((cat.to_string(), span.shifted(8)));
                        }
                        _ => {
                            kind = Ident::new(t, span);
                            catalog = None;
                        }
                    }
                }
                "maintenance" => self.maintenance(v, "maintenance", &mut options),
                // The Go engine's sink-level switch: every table's
                // `schema_changes`.
                "evolveSchema" => match v.as_str() {
                    Some("true") => {
                        self.evolve_schema =
                            Some((OptionValue::string("evolve"), k.span, v.text_span()))
                    }
                    Some("false") => {
                        self.evolve_schema =
                            Some((OptionValue::string("fail"), k.span, v.text_span()))
                    }
                    _ => self.error(v.span, "evolveSchema is true or false"),
                },
                _ => {
                    if let Some(value) = self.option_value(v) {
                        options.push(snake_case(key), value, k.span, v.text_span());
                    }
                }
            }
        }
        if let Some((cat, span)) = catalog
            && options.entry("catalog").is_none()
        {
            options.push("catalog", OptionValue::string(cat), span, span);
        }
        self.env_option(&mut options, "uri", "URUTAU_SINK_URI", node.span);
        spec.sinks.push(SinkSpec {
            name: name.clone(),
            kind,
            options,
        });
        Some(name)
    }

    /// `maintenance: {enabled, compaction: {...}, ...}` -> `maintenance_*`
    /// options, so the sink kind's option schema checks them like any other.
    fn maintenance(&mut self, node: &Node, prefix: &str, options: &mut OptionMap) {
        let Ok(entries) = node.as_map(prefix).map_err(|d| self.diags.push(d)) else {
            return;
        };
        for (k, v) in entries {
            let name = format!("{prefix}_{}", snake_case(k.as_str().unwrap_or("")));
            match &v.value {
                Value::Map(_) => self.maintenance(v, &name, options),
                _ => {
                    if let Some(value) = self.option_value(v) {
                        options.push(name, value, k.span, v.text_span());
                    }
                }
            }
        }
    }

    fn table(&mut self, node: &Node, source: &Ident, sink: &Ident, spec: &mut PipelineSpec) {
        let Ok(entries) = node.as_map("a table").map_err(|d| self.diags.push(d)) else {
            return;
        };
        let known = [
            "source",
            "target",
            "primaryKey",
            "writeMode",
            "partitionBy",
            "filter",
            "cast",
            "metadata",
            "columns",
            "workers",
            "onDelete",
            "schemaChanges",
            "createIfNotExists",
            "topic",
        ];
        let mut source_table: Option<QualifiedName> = None;
        let mut target: Option<QualifiedName> = None;
        let mut options = OptionMap::default();
        let mut key_columns: Vec<Ident> = Vec::new();
        let mut casts: Vec<(Ident, SpannedExpr)> = Vec::new();
        let mut meta: Vec<ProjectionItem> = Vec::new();
        let mut filter = None;
        let mut columns_node = None;
        // Options of the source table's declaration (a Kafka table's topic).
        let mut table_options = OptionMap::default();
        for (k, v) in entries {
            let key = k.as_str().unwrap_or("");
            match key {
                "source" => source_table = self.qualified(v),
                "target" => target = self.qualified(v),
                "primaryKey" => {
                    let names: Vec<Ident> = match &v.value {
                        Value::Seq(items) => items
                            .iter()
                            .filter_map(|i| i.as_str().map(|s| Ident::new(s, i.span)))
                            .collect(),
                        Value::Scalar(s, _) => s
                            .split(',')
                            .map(|p| Ident::new(p.trim(), v.span))
                            .filter(|i| !i.name.is_empty())
                            .collect(),
                        Value::Map(_) => {
                            self.error(v.span, "primaryKey is a list of columns");
                            vec![]
                        }
                    };
                    let text = names
                        .iter()
                        .map(|n| quote_ident(&n.name))
                        .collect::<Vec<_>>()
                        .join(", ");
                    options.push(
                        "primary_key",
                        OptionValue::string(text),
                        k.span,
                        v.text_span(),
                    );
                    key_columns = names;
                }
                "writeMode" | "onDelete" | "schemaChanges" => {
                    if let Some(value) = self.option_value(v) {
                        options.push(snake_case(key), value, k.span, v.text_span());
                    }
                }
                "partitionBy" => {
                    let text = match &v.value {
                        Value::Seq(items) => items
                            .iter()
                            .filter_map(|i| i.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        Value::Scalar(s, _) => s.clone(),
                        Value::Map(_) => {
                            self.error(v.span, "partitionBy is a list of transforms");
                            continue;
                        }
                    };
                    options.push(
                        "partition_by",
                        OptionValue::string(text),
                        k.span,
                        v.text_span(),
                    );
                }
                "workers" => {
                    let n = match &v.value {
                        Value::Map(m) => m
                            .iter()
                            .find(|(wk, _)| wk.as_str() == Some("number"))
                            .map(|(_, wv)| wv),
                        Value::Scalar(..) => Some(v),
                        Value::Seq(_) => None,
                    };
                    if let Value::Map(m) = &v.value {
                        for (wk, _) in m {
                            if wk.as_str() != Some("number") {
                                self.unknown_key(wk, &["number"], "workers");
                            }
                        }
                    }
                    match n.and_then(|n| self.option_value(n).map(|val| (n, val))) {
                        Some((n, value)) => options.push("workers", value, k.span, n.text_span()),
                        None => self.error(v.span, "workers: {number: N}"),
                    }
                }
                "filter" => filter = self.filter(v),
                "cast" => {
                    let Ok(m) = v.as_map("cast").map_err(|d| self.diags.push(d)) else {
                        continue;
                    };
                    for (ck, cv) in m {
                        let column = ck.as_str().unwrap_or("").to_string();
                        let Some(type_text) = cv.as_str() else {
                            self.error(cv.span, "a cast is `column: type`");
                            continue;
                        };
                        let sql = if type_text
                            .trim()
                            .eq_ignore_ascii_case("timestamptz(assume_utc)")
                        {
                            format!("assume_utc({})", quote_ident(&column))
                        } else {
                            match CanonicalType::parse(type_text, false) {
                                Ok(t) => format!("CAST({} AS {t})", quote_ident(&column)),
                                Err(e) => {
                                    self.error(
                                        cv.text_span().shifted(e.offset),
                                        format!("cast of `{column}`: {}", e.message),
                                    );
                                    continue;
                                }
                            }
                        };
                        if let Some(expr) = self.sql_expr(&sql, cv.text_span()) {
                            casts.push((Ident::new(column, ck.span), expr));
                        }
                    }
                }
                "metadata" => {
                    let Ok(items) = v.as_seq("metadata").map_err(|d| self.diags.push(d)) else {
                        continue;
                    };
                    for item in items {
                        if let Some(p) = self.metadata_item(item) {
                            meta.push(p);
                        }
                    }
                }
                "columns" => columns_node = Some(v),
                "topic" => {
                    if let Some(value) = self.option_value(v) {
                        table_options.push("topic", value, k.span, v.text_span());
                    }
                }
                "createIfNotExists" => {
                    // urutau always creates an absent target; refusing to
                    // would be a setting of its own, so `false` is an error.
                    if v.as_str() != Some("true") {
                        self.error(v.span, "createIfNotExists: urutau always creates an absent target table; only `true` is accepted");
                    }
                }
                _ => self.unknown_key(k, &known, "a table"),
            }
        }
        let Some(source_table) = source_table else {
            self.error(node.span, "a table needs `source:` (the source table)");
            return;
        };
        let Some(target) = target else {
            self.error(node.span, "a table needs `target:` (the target table)");
            return;
        };
        if columns_node.is_none()
            && let Some(e) = table_options.entries.first()
        {
            self.error(
                e.name_span,
                format!(
                    "`{}` belongs to a declared table: give the table's `columns:` too",
                    e.name
                ),
            );
        }
        if let Some(columns) = columns_node {
            let cols = self.columns(columns, &key_columns);
            let primary_key = key_columns.clone();
            if let Some(existing) = spec
                .source_tables
                .iter()
                .find(|t| t.source.name == source.name && t.table.parts == source_table.parts)
            {
                if existing.columns != cols {
                    self.error(
                        columns.span,
                        format!("table {source_table} is declared twice with different columns"),
                    );
                }
                if existing.options != table_options
                    && let Some(e) = table_options
                        .entries
                        .first()
                        .or(existing.options.entries.first())
                {
                    self.error(
                        e.name_span,
                        format!(
                            "table {source_table} is declared twice with different `{}`",
                            e.name
                        ),
                    );
                }
            } else {
                spec.source_tables.push(SourceTableSpec {
                    source: source.clone(),
                    table: source_table.clone(),
                    columns: cols,
                    primary_key,
                    options: table_options,
                });
            }
        }
        let mut projection = vec![ProjectionItem::Wildcard {
            replace: casts,
            span: node.span,
        }];
        projection.extend(meta);
        if options.entry("schema_changes").is_none()
            && let Some((value, name_span, value_span)) = &self.evolve_schema
        {
            options.push("schema_changes", value.clone(), *name_span, *value_span);
        }
        spec.routes.push(RouteSpec {
            sink: sink.clone(),
            target,
            source: source.clone(),
            source_table,
            options,
            projection,
            filter,
            span: node.span,
        });
    }

    fn qualified(&mut self, v: &Node) -> Option<QualifiedName> {
        match v.as_str() {
            Some(s) if !s.is_empty() => Some(QualifiedName::new(
                s.split('.').map(str::to_string).collect(),
                v.text_span(),
            )),
            _ => {
                self.error(v.span, "expected a table name");
                None
            }
        }
    }

    /// Parses SQL written (or generated) at `at`: the text is padded so
    /// sqlparser's locations are the file's.
    fn sql_expr(&mut self, sql: &str, at: Span) -> Option<SpannedExpr> {
        let padded = format!(
            "{}{}{}",
            "\n".repeat(at.line.saturating_sub(1) as usize),
            " ".repeat(at.col.saturating_sub(1) as usize),
            sql
        );
        let dialect = GenericDialect {};
        let result = Parser::new(&dialect)
            .try_with_sql(&padded)
            .and_then(|mut p| {
                let e = p.parse_expr()?;
                p.expect_token(&sqlparser::tokenizer::Token::EOF)?;
                Ok(e)
            });
        match result {
            Ok(expr) => Some(SpannedExpr { expr, span: at }),
            Err(e) => {
                self.diags.push(parser_error(e, at));
                None
            }
        }
    }

    fn metadata_item(&mut self, item: &Node) -> Option<ProjectionItem> {
        let entries = item
            .as_map("a metadata entry")
            .map_err(|d| self.diags.push(d))
            .ok()?;
        let mut from = None;
        let mut alias = None;
        for (k, v) in entries {
            match k.as_str().unwrap_or("") {
                "from" => from = v.as_str().map(|s| Ident::new(s, v.text_span())),
                "as" => alias = v.as_str().map(|s| Ident::new(s, v.text_span())),
                _ => self.unknown_key(k, &["from", "as"], "a metadata entry"),
            }
        }
        let from = from.or_else(|| {
            self.error(
                item.span,
                "a metadata entry needs `from:` (a metadata column name)",
            );
            None
        })?;
        if metadata::lookup(&from.name).is_none() {
            let names = metadata::names();
            let d = Diagnostic::error(
                from.span,
                format!("unknown metadata column `{}`", from.name),
            )
            .with_rule("metadata columns form a closed catalog");
            let d = match did_you_mean(&from.name, names.iter().copied()) {
                Some(s) => d.with_help(format!("did you mean `{s}`?")),
                None => d.with_help(format!("metadata columns: {}", names.join(", "))),
            };
            self.diags.push(d);
            return None;
        }
        let expr =
            sqlparser::ast::Expr::Identifier(sqlparser::ast::Ident::new(format!("_{}", from.name)));
        Some(ProjectionItem::Expr {
            expr: Box::new(SpannedExpr {
                expr,
                span: from.span,
            }),
            alias: Some(alias.unwrap_or(from)),
        })
    }

    /// `columns:` as `{name: type}` (type text, or `{struct: ...}`,
    /// `{list: ...}`, `{map: {key, value}}`, `{type, nullable}`) or as a
    /// list of `{name, type, nullable}`.
    fn columns(&mut self, node: &Node, key: &[Ident]) -> Vec<ColumnSpec> {
        let mut out = Vec::new();
        let mut push = |this: &mut Self, name: Ident, spec: &Node, nullable: Option<bool>| {
            let explicit = match &spec.value {
                Value::Map(m) => m
                    .iter()
                    .find(|(k, _)| k.as_str() == Some("nullable"))
                    .and_then(|(_, v)| v.as_str())
                    .map(|s| s == "true"),
                _ => None,
            };
            if let Some(ty) = this.column_type(spec) {
                let is_key = key.iter().any(|k| k.name == name.name);
                out.push(ColumnSpec {
                    nullable: !is_key && nullable.or(explicit).unwrap_or(true),
                    name,
                    ty,
                });
            }
        };
        match &node.value {
            Value::Map(m) => {
                for (k, v) in m {
                    let name = Ident::new(k.as_str().unwrap_or(""), k.span);
                    push(self, name, v, None);
                }
            }
            Value::Seq(items) => {
                for item in items {
                    let Ok(m) = item.as_map("a column").map_err(|d| self.diags.push(d)) else {
                        continue;
                    };
                    let Some((_, n)) = m.iter().find(|(k, _)| k.as_str() == Some("name")) else {
                        self.error(item.span, "a column needs `name:`");
                        continue;
                    };
                    let name = Ident::new(n.as_str().unwrap_or(""), n.span);
                    push(self, name, item, None);
                }
            }
            Value::Scalar(..) => self.error(node.span, "columns: {name: type, ...}"),
        }
        out
    }

    fn column_type(&mut self, spec: &Node) -> Option<CanonicalType> {
        match &spec.value {
            Value::Scalar(text, _) => match CanonicalType::parse(text, true) {
                Ok(t) => Some(t),
                Err(e) => {
                    self.error(spec.text_span().shifted(e.offset), e.message);
                    None
                }
            },
            Value::Map(m) => {
                let mut found = None;
                for (k, v) in m {
                    match k.as_str().unwrap_or("") {
                        "type" => found = self.column_type(v),
                        "struct" => {
                            let Ok(fields) = v.as_map("struct").map_err(|d| self.diags.push(d))
                            else {
                                return None;
                            };
                            let mut out = Vec::new();
                            for (fk, fv) in fields {
                                out.push(StructField {
                                    name: fk.as_str().unwrap_or("").to_string(),
                                    ty: self.column_type(fv)?,
                                });
                            }
                            found = Some(CanonicalType::Struct(out));
                        }
                        "list" => found = Some(CanonicalType::List(Box::new(self.column_type(v)?))),
                        "map" => {
                            let Ok(kv) = v.as_map("map").map_err(|d| self.diags.push(d)) else {
                                return None;
                            };
                            let key = kv.iter().find(|(k, _)| k.as_str() == Some("key"));
                            let value = kv.iter().find(|(k, _)| k.as_str() == Some("value"));
                            match (key, value) {
                                (Some((_, kn)), Some((_, vn))) => {
                                    found = Some(CanonicalType::Map(
                                        Box::new(self.column_type(kn)?),
                                        Box::new(self.column_type(vn)?),
                                    ))
                                }
                                _ => {
                                    self.error(v.span, "map needs `key:` and `value:` types");
                                    return None;
                                }
                            }
                        }
                        "nullable" | "name" => {}
                        _ => self.unknown_key(
                            k,
                            &["type", "struct", "list", "map", "nullable"],
                            "a column type",
                        ),
                    }
                }
                if found.is_none() {
                    self.error(spec.span, "a column needs a type");
                }
                found
            }
            Value::Seq(_) => {
                self.error(
                    spec.span,
                    "a column type is a type name or {struct|list|map: ...}",
                );
                None
            }
        }
    }

    /// `filter:` as SQL text, or the Go engine's tree
    /// (`all` / `any` / `not` / `where: {col, op, value}`).
    fn filter(&mut self, v: &Node) -> Option<SpannedExpr> {
        match &v.value {
            Value::Scalar(text, _) => self.sql_expr(text, v.text_span()),
            Value::Map(_) => {
                let sql = self.filter_tree(v)?;
                let mut e = self.sql_expr(&sql, Span::new(0, 0))?;
                e.span = v.span;
                Some(e)
            }
            Value::Seq(_) => {
                self.error(
                    v.span,
                    "filter is a SQL condition or {all|any|not|where: ...}",
                );
                None
            }
        }
    }

    fn filter_tree(&mut self, v: &Node) -> Option<String> {
        let entries = v.as_map("a filter").map_err(|d| self.diags.push(d)).ok()?;
        let mut parts = Vec::new();
        for (k, val) in entries {
            match k.as_str().unwrap_or("") {
                "all" | "any" => {
                    let items = val.as_seq("all/any").map_err(|d| self.diags.push(d)).ok()?;
                    let sub: Option<Vec<String>> =
                        items.iter().map(|i| self.filter_tree(i)).collect();
                    let joiner = if k.as_str() == Some("all") {
                        " AND "
                    } else {
                        " OR "
                    };
                    parts.push(format!("({})", sub?.join(joiner)));
                }
                "not" => parts.push(format!("(NOT {})", self.filter_tree(val)?)),
                "where" => parts.push(self.predicate(val)?),
                _ => self.unknown_key(k, &["all", "any", "not", "where"], "a filter"),
            }
        }
        if parts.is_empty() {
            self.error(v.span, "an empty filter");
            return None;
        }
        Some(parts.join(" AND "))
    }

    fn predicate(&mut self, v: &Node) -> Option<String> {
        let entries = v.as_map("where").map_err(|d| self.diags.push(d)).ok()?;
        let get = |name: &str| {
            entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v)
        };
        let Some(col) = get("col").and_then(|c| c.as_str()) else {
            self.error(v.span, "where needs `col:`");
            return None;
        };
        let Some(op) = get("op").and_then(|o| o.as_str()) else {
            self.error(
                v.span,
                "where needs `op:` (eq, neq, lt, lte, gt, gte, in, not_in, is_null, is_not_null)",
            );
            return None;
        };
        let col = quote_ident(col);
        let literal = |n: &Node| -> Option<String> {
            match &n.value {
                Value::Scalar(s, TScalarStyle::Plain)
                    if s.parse::<f64>().is_ok() || s == "true" || s == "false" =>
                {
                    Some(s.clone())
                }
                Value::Scalar(s, TScalarStyle::Plain) if s == "null" || s == "~" => {
                    Some("NULL".into())
                }
                Value::Scalar(s, _) => Some(quote_literal(s)),
                _ => None,
            }
        };
        let value = get("value");
        let scalar = |this: &mut Self| -> Option<String> {
            match value.and_then(literal) {
                Some(l) => Some(l),
                None => {
                    this.error(v.span, format!("op {op} needs a single `value:`"));
                    None
                }
            }
        };
        Some(match op {
            "eq" => format!("{col} = {}", scalar(self)?),
            "neq" => format!("{col} <> {}", scalar(self)?),
            "lt" => format!("{col} < {}", scalar(self)?),
            "lte" => format!("{col} <= {}", scalar(self)?),
            "gt" => format!("{col} > {}", scalar(self)?),
            "gte" => format!("{col} >= {}", scalar(self)?),
            "is_null" => format!("{col} IS NULL"),
            "is_not_null" => format!("{col} IS NOT NULL"),
            "in" | "not_in" => {
                let Some(list) = value.and_then(|n| match &n.value {
                    Value::Seq(items) => items.iter().map(literal).collect::<Option<Vec<_>>>(),
                    _ => None,
                }) else {
                    self.error(v.span, format!("op {op} needs `value:` as a list"));
                    return None;
                };
                let neg = if op == "not_in" { "NOT " } else { "" };
                format!("{col} {neg}IN ({})", list.join(", "))
            }
            other => {
                self.error(v.span, format!("unknown filter op `{other}`"));
                return None;
            }
        })
    }
}
