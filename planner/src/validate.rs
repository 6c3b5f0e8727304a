//! Validation of a [`PipelineSpec`] against the registry: names, kinds,
//! options and the rules that must be errors rather than silently ignored
//! settings. Checks that need table schemas (keys, casts, partition columns)
//! run when routes are bound ([`crate::bind`]).

use std::collections::HashSet;
use std::time::Duration;

use crate::context::Transport;
use crate::diagnostic::{Diagnostic, Diagnostics, Span, did_you_mean};
use crate::evolution::SchemaChanges;
use crate::options::{OptionDef, OptionMap, OptionType, check_options, parse_duration};
use crate::partition::{PartitionField, parse_partition_by};
use crate::registry::Registry;
use crate::spec::{PipelineSpec, RouteSpec, WriteMode};

/// Options of `CREATE PIPELINE name WITH (...)`.
pub fn pipeline_options() -> Vec<OptionDef> {
    vec![
        OptionDef::new(
            "max_batch_rows",
            OptionType::Int {
                min: 1,
                max: 10_000_000,
            },
            "close a batch once it holds this many rows (a transaction is never split, so a batch may hold more)",
        )
        .default("10000")
        .aliases(&["maxRows"]),
        OptionDef::new(
            "max_batch_interval",
            OptionType::Duration,
            "close a batch this long after its first change arrived",
        )
        .default("1s")
        .aliases(&["maxInterval"]),
        OptionDef::new(
            "progress_interval",
            OptionType::Duration,
            "advance the committed position of a table the source has not touched at most this often",
        )
        .default("10s")
        .aliases(&["progressInterval"]),
    ]
}

/// Options of a route (`CREATE TABLE sink.t WITH (...) AS SELECT ...`).
pub fn route_options() -> Vec<OptionDef> {
    vec![
        OptionDef::new(
            "primary_key",
            OptionType::String,
            "target key columns, comma-separated; default: the source table's key",
        )
        .aliases(&["primaryKey"]),
        OptionDef::new(
            "write_mode",
            OptionType::Enum(&["upsert", "append", "append-idempotent"]),
            "upsert reflects source state by key; append writes every change as a row",
        )
        .default("upsert")
        .aliases(&["writeMode"]),
        OptionDef::new(
            "partition_by",
            OptionType::String,
            "day|month|year|hour|identity(c), bucket(N,c), truncate(N,c), comma-separated",
        )
        .aliases(&["partitionBy"]),
        OptionDef::new(
            "workers",
            OptionType::Int { min: 1, max: 1024 },
            "workers splitting the table's key space (1 = collapsed)",
        )
        .default("1"),
        OptionDef::new(
            "schema_changes",
            OptionType::Enum(&["evolve", "fail"]),
            "when the source table changes shape (or a declared table's declaration changes between runs): evolve the target (add columns, promote types, keep dropped columns; the default) or stop",
        )
        .aliases(&["schemaChanges"]),
        OptionDef::new(
            "on_delete",
            OptionType::Enum(&["record", "skip"]),
            "append modes: record a delete as a row (default) or skip it",
        )
        .aliases(&["onDelete"]),
    ]
}

/// Batching settings of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    pub max_rows: usize,
    pub max_interval: Duration,
    pub progress_interval: Duration,
}

/// The pipeline-level settings, with defaults (call after validation).
pub fn batch_options(options: &OptionMap) -> BatchOptions {
    let get = |name: &str, default: &str| options.get(name).unwrap_or(default).to_string();
    BatchOptions {
        max_rows: get("max_batch_rows", "10000").parse().unwrap_or(10_000),
        max_interval: parse_duration(&get("max_batch_interval", "1s"))
            .unwrap_or(Duration::from_secs(1)),
        progress_interval: parse_duration(&get("progress_interval", "10s"))
            .unwrap_or(Duration::from_secs(10)),
    }
}

/// A route's settings, parsed, with defaults (call after validation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSettings {
    pub mode: WriteMode,
    /// Explicit key columns, when `primary_key` is given.
    pub key: Option<Vec<String>>,
    pub partition_by: Vec<PartitionField>,
    pub workers: u32,
    /// Append modes: skip deletes instead of recording them.
    pub skip_deletes: bool,
    /// What a change of the source table's shape does.
    pub schema_changes: SchemaChanges,
}

/// Parses a route's options (call after validation).
pub fn route_settings(route: &RouteSpec) -> RouteSettings {
    let o = &route.options;
    RouteSettings {
        mode: o
            .get("write_mode")
            .and_then(WriteMode::parse)
            .unwrap_or(WriteMode::Upsert),
        key: o.get("primary_key").map(split_key),
        partition_by: o
            .get("partition_by")
            .and_then(|p| parse_partition_by(p).ok())
            .unwrap_or_default(),
        workers: o.get("workers").and_then(|w| w.parse().ok()).unwrap_or(1),
        skip_deletes: o.get("on_delete") == Some("skip"),
        schema_changes: o
            .get("schema_changes")
            .and_then(SchemaChanges::parse)
            .unwrap_or_default(),
    }
}

/// `'a, b'` -> `[a, b]` (double quotes keep case).
pub fn split_key(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.len() > 1 && s.starts_with('"') && s.ends_with('"') {
                s[1..s.len() - 1].to_string()
            } else {
                s.to_ascii_lowercase()
            }
        })
        .collect()
}

/// Checks the spec; entries written under an alias are renamed to the
/// canonical option name and implied `NOT NULL` on declared key columns is
/// applied.
pub fn validate(spec: &mut PipelineSpec, registry: &Registry) -> Diagnostics {
    let mut d = Diagnostics::default();
    check_options(
        &mut spec.options,
        &pipeline_options(),
        &format!("pipeline `{}`", spec.name.name),
        spec.name.span,
        &mut d,
    );

    let mut names = HashSet::new();
    for source in &mut spec.sources {
        if !names.insert(source.name.name.clone()) {
            d.push(Diagnostic::error(
                source.name.span,
                format!("source `{}` is declared twice", source.name),
            ));
        }
        match registry.source(&source.kind.name) {
            Some(provider) => {
                let before = d.errors().count();
                check_options(
                    &mut source.options,
                    &provider.def().options,
                    &format!("source `{}` ({})", source.name, source.kind),
                    source.name.span,
                    &mut d,
                );
                // The kind's own rules read checked options only.
                if d.errors().count() == before {
                    for rule in &provider.def().rules {
                        rule(source, &mut d);
                    }
                }
            }
            None => d.push(unknown_kind(
                "source",
                &source.kind.name,
                source.kind.span,
                registry.source_kinds(),
            )),
        }
    }

    let mut sink_names = HashSet::new();
    for sink in &mut spec.sinks {
        if !sink_names.insert(sink.name.name.clone()) || names.contains(&sink.name.name) {
            d.push(Diagnostic::error(
                sink.name.span,
                format!("the name `{}` is declared twice", sink.name),
            ));
        }
        let Some(provider) = registry.sink(&sink.kind.name) else {
            d.push(unknown_kind(
                "sink",
                &sink.kind.name,
                sink.kind.span,
                registry.sink_kinds(),
            ));
            continue;
        };
        let def = provider.def();
        if !def.maintenance {
            // Checked before the generic unknown-option check so the user
            // reads the rule, not just "unknown option".
            let (maintenance, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut sink.options.entries)
                .into_iter()
                .partition(|e| e.name.starts_with("maintenance"));
            sink.options.entries = rest;
            for e in maintenance {
                d.push(
                    Diagnostic::error(
                        e.name_span,
                        format!(
                            "`{}` on sink `{}`: maintenance is Iceberg-only, and this sink is {}",
                            e.name, sink.name, def.name
                        ),
                    )
                    .with_rule("sink.maintenance is Iceberg-only: a maintenance block on any other sink type is a validation error, not a silently ignored setting, so a pipeline cannot look like it is compacting when nothing will run")
                    .with_help(match def.name {
                        "clickhouse" => "tombstone cleanup on ClickHouse is an operator command (OPTIMIZE TABLE ... FINAL CLEANUP); remove the maintenance settings",
                        _ => "remove the maintenance settings",
                    }),
                );
            }
        }
        check_options(
            &mut sink.options,
            &def.options,
            &format!("sink `{}` ({})", sink.name, sink.kind),
            sink.name.span,
            &mut d,
        );
    }

    let mut declared = HashSet::new();
    for table in &mut spec.source_tables {
        let Some(source) = spec
            .sources
            .iter()
            .find(|s| s.name.name == table.source.name)
        else {
            d.push(
                Diagnostic::error(
                    table.source.span,
                    format!("`{}` is not a declared source", table.source),
                )
                .with_help_opt(
                    did_you_mean(
                        &table.source.name,
                        spec.sources.iter().map(|s| s.name.name.as_str()),
                    )
                    .map(|s| format!("did you mean `{s}`?")),
                ),
            );
            continue;
        };
        if let Some(p) = registry.source(&source.kind.name)
            && !p.def().declares_tables
        {
            d.push(
                Diagnostic::error(
                    table.table.span,
                    format!(
                        "source `{}` is {}, which reads table schemas from the source itself",
                        source.name, source.kind
                    ),
                )
                .with_help("remove the CREATE TABLE declaration, or CAST columns in the route"),
            );
        }
        if let Some(p) = registry.source(&source.kind.name) {
            check_options(
                &mut table.options,
                &p.def().table_options,
                &format!(
                    "table {}.{} of source `{}` ({})",
                    table.source, table.table, source.name, source.kind
                ),
                table.table.span,
                &mut d,
            );
        }
        if !declared.insert((table.source.name.clone(), table.table.parts.clone())) {
            d.push(Diagnostic::error(
                table.table.span,
                format!("table {}.{} is declared twice", table.source, table.table),
            ));
        }
        let mut cols = HashSet::new();
        for c in &table.columns {
            if !cols.insert(c.name.name.clone()) {
                d.push(Diagnostic::error(
                    c.name.span,
                    format!("column `{}` is declared twice", c.name),
                ));
            }
            if c.name.name.starts_with("__") {
                d.push(Diagnostic::error(
                    c.name.span,
                    format!("column `{}`: names starting with `__` are reserved for change context columns", c.name),
                ));
            }
        }
        for k in &table.primary_key {
            match table.columns.iter_mut().find(|c| c.name.name == k.name) {
                Some(c) => c.nullable = false,
                None => d.push(Diagnostic::error(
                    k.span,
                    format!(
                        "primary key column `{}` is not a column of {}.{}",
                        k, table.source, table.table
                    ),
                )),
            }
        }
    }

    let route_defs = route_options();
    let mut targets = HashSet::new();
    for route in &mut spec.routes {
        let owner = format!("route {}", route.display_name());
        check_options(&mut route.options, &route_defs, &owner, route.span, &mut d);
        let source = spec
            .sources
            .iter()
            .find(|s| s.name.name == route.source.name);
        if source.is_none() {
            d.push(
                Diagnostic::error(
                    route.source.span,
                    format!("`{}` is not a declared source", route.source),
                )
                .with_help_opt(
                    did_you_mean(
                        &route.source.name,
                        spec.sources.iter().map(|s| s.name.name.as_str()),
                    )
                    .map(|s| format!("did you mean `{s}`?")),
                ),
            );
        }
        let Some(sink) = spec.sinks.iter().find(|s| s.name.name == route.sink.name) else {
            d.push(
                Diagnostic::error(
                    route.sink.span,
                    format!("`{}` is not a declared sink", route.sink),
                )
                .with_rule("CREATE TABLE x.y (...) with a column list declares a SOURCE table (x is a source); CREATE TABLE x.y WITH (...) AS SELECT declares a ROUTE (x is a sink)")
                .with_help_opt(
                    did_you_mean(
                        &route.sink.name,
                        spec.sinks.iter().map(|s| s.name.name.as_str()),
                    )
                    .map(|s| format!("did you mean `{s}`?")),
                ),
            );
            continue;
        };
        if !targets.insert((route.sink.name.clone(), route.target.parts.clone())) {
            d.push(Diagnostic::error(
                route.target.span,
                format!(
                    "two routes write {}: commits of one table must come from one route",
                    route.display_name()
                ),
            ));
        }
        let settings = route_settings(route);
        let sink_def = registry.sink(&sink.kind.name).map(|p| p.def().clone());
        let source_def = source
            .and_then(|s| registry.source(&s.kind.name))
            .map(|p| p.def().clone());

        if let Some(entry) = route.options.entry("write_mode").cloned()
            && let Some(def) = &sink_def
            && let Some(mode) = WriteMode::parse(&entry.value.text)
            && !def.write_modes.contains(&mode)
        {
            d.push(Diagnostic::error(
                entry.value_span,
                format!("sink kind {} does not support write_mode {mode}", def.name),
            ));
        }
        if settings.mode == WriteMode::AppendIdempotent
            && let Some(src) = &source_def
            && src.transport == Transport::None
        {
            let span = route
                .options
                .entry("write_mode")
                .map_or(route.span, |e| e.value_span);
            d.push(
                Diagnostic::error(
                    span,
                    format!(
                        "append-idempotent needs a transport coordinate, and source `{}` ({}) has none",
                        route.source, src.name
                    ),
                )
                .with_rule("append-idempotent relies on the transport's own monotonic coordinate (partition + offset) to make duplicates provably absent")
                .with_help("use write_mode = 'upsert' (idempotent by key) or 'append' (at-least-once)"),
            );
        }
        if let Some(e) = route.options.entry("on_delete")
            && settings.mode == WriteMode::Upsert
        {
            d.push(
                Diagnostic::error(
                    e.name_span,
                    "on_delete applies to append modes only; an upsert route always deletes the key",
                )
                .with_rule("a setting that cannot take effect is a validation error"),
            );
        }
        if let Some(e) = route.options.entry("partition_by").cloned() {
            match parse_partition_by(&e.value.text) {
                Ok(_) => {
                    if let Some(def) = &sink_def {
                        if !def.partitioning {
                            d.push(Diagnostic::error(
                                e.name_span,
                                format!("sink kind {} does not partition tables; remove partition_by", def.name),
                            ));
                        } else if let Some(w) = def.partitioning_warning {
                            d.push(Diagnostic::warning(e.name_span, w));
                        }
                    }
                }
                Err(err) => d.push(
                    Diagnostic::error(
                        value_span_at(e.value_span, err.offset),
                        format!("partition_by: {}", err.message),
                    )
                    .with_rule("partition_by grammar: day|month|year|hour|identity(c), bucket(N,c), truncate(N,c), comma-separated"),
                ),
            }
        }
        if settings.workers > 1
            && let Some(def) = &sink_def
            && !def.partitioned_tables
        {
            let span = route
                .options
                .entry("workers")
                .map_or(route.span, |e| e.value_span);
            d.push(
                Diagnostic::error(
                    span,
                    format!(
                        "sink kind {} does not support partitioned tables (workers > 1) in this build",
                        def.name
                    ),
                )
                .with_rule("a setting that cannot take effect is a validation error")
                .with_help("use workers = 1"),
            );
        }
        if let Some(def) = &sink_def {
            for rule in &def.route_rules {
                rule(sink, route, settings.workers, &mut d);
            }
        }
    }
    if spec.routes.is_empty() {
        d.push(
            Diagnostic::error(spec.name.span, "the pipeline has no routes").with_help(
                "add CREATE TABLE <sink>.<table> WITH (...) AS SELECT ... FROM <source>.<table>",
            ),
        );
    }
    d
}

/// The span of a character inside a quoted option value.
fn value_span_at(value_span: Span, offset: usize) -> Span {
    value_span.shifted(offset + 1)
}

fn unknown_kind(what: &str, kind: &str, span: Span, known: Vec<&'static str>) -> Diagnostic {
    let d = Diagnostic::error(span, format!("unknown {what} kind `{kind}`"));
    match did_you_mean(kind, known.iter().copied()) {
        Some(s) => d.with_help(format!("did you mean `{s}`?")),
        None => d.with_help(format!("{what} kinds: {}", known.join(", "))),
    }
}
