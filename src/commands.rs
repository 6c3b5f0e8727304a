//! The subcommands. Exit codes: 0 ok, 2 invalid pipeline or usage, 1
//! runtime failure.

use std::path::Path;

use urutau_planner::diagnostic::Diagnostics;
use urutau_planner::options::{is_secret_name, redact_text};
use urutau_planner::plan::{ExplainFormat, PipelinePlan, plan_pipeline};
use urutau_planner::registry::Registry;
use urutau_sql::{LoadedPipeline, load_pipeline, process_env};

/// Exit code of an invalid pipeline (or bad usage).
const INVALID: u8 = 2;
/// Exit code of a runtime failure.
const FAILED: u8 = 1;

/// Every source and sink kind of this build.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    urutau_engine::sources::register(&mut r);
    urutau_sinks::register(&mut r);
    r
}

/// Loads and plans a file; prints diagnostics (warnings too).
async fn load_and_plan(
    file: &Path,
    registry: &Registry,
) -> Result<(LoadedPipeline, PipelinePlan), u8> {
    let loaded = match load_pipeline(file, &process_env) {
        Ok(l) => l,
        Err(invalid) => {
            eprint!("{}", redact_text(&invalid.to_string()));
            return Err(INVALID);
        }
    };
    match plan_pipeline(loaded.spec.clone(), registry).await {
        Ok(plan) => {
            print_diagnostics(&loaded, &plan.warnings);
            Ok((loaded, plan))
        }
        Err(diags) => {
            print_diagnostics(&loaded, &diags);
            if diags.errors().all(|d| d.unavailable) {
                // Nothing wrong with the file: a server could not be asked.
                eprintln!(
                    "{}: cannot plan: a server the pipeline reads could not be asked (see above)",
                    loaded.path
                );
                return Err(FAILED);
            }
            let errors = diags.errors().count();
            eprintln!(
                "{}: invalid pipeline ({errors} error{})",
                loaded.path,
                if errors == 1 { "" } else { "s" }
            );
            Err(INVALID)
        }
    }
}

fn print_diagnostics(loaded: &LoadedPipeline, diags: &Diagnostics) {
    if !diags.items.is_empty() {
        // The quoted source lines may hold secrets (a password in a URI).
        let text = diags.render(&loaded.path, Some(&loaded.text));
        eprint!("{}", scrub(&text, &secrets(loaded)));
    }
}

/// Secret option values of a pipeline, to scrub from anything printed.
fn secrets(loaded: &LoadedPipeline) -> Vec<String> {
    let spec = &loaded.spec;
    spec.sources
        .iter()
        .map(|s| &s.options)
        .chain(spec.sinks.iter().map(|s| &s.options))
        .flat_map(|o| o.entries.iter())
        .filter(|e| is_secret_name(&e.name) && e.value.text.len() >= 3)
        .map(|e| e.value.text.clone())
        .collect()
}

fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = redact_text(text);
    for s in secrets {
        out = out.replace(s.as_str(), "***");
    }
    out
}

/// `urutau validate FILE`.
pub async fn validate(file: &Path) -> u8 {
    let registry = registry();
    match load_and_plan(file, &registry).await {
        Ok((loaded, plan)) => {
            println!(
                "{}: ok: pipeline {} with {} route{}",
                loaded.path,
                plan.name,
                plan.routes.len(),
                if plan.routes.len() == 1 { "" } else { "s" }
            );
            0
        }
        Err(code) => code,
    }
}

/// `urutau plan [--explain] FILE`.
pub async fn plan(file: &Path, explain: bool, format: ExplainFormat) -> u8 {
    let registry = registry();
    match load_and_plan(file, &registry).await {
        Ok((loaded, plan)) => {
            let text = if explain {
                plan.explain(format)
            } else {
                plan.describe(&registry)
            };
            print!("{}", scrub(&text, &secrets(&loaded)));
            0
        }
        Err(code) => code,
    }
}

/// `urutau run FILE`.
pub async fn run(file: &Path, exit_when_caught_up: bool, metrics_addr: Option<&str>) -> u8 {
    let registry = registry();
    let (loaded, plan) = match load_and_plan(file, &registry).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Some(addr) = metrics_addr {
        match urutau_engine::status_server::serve(addr).await {
            Ok(bound) => tracing::info!(addr = %bound, "serving /metrics, /statusz and /healthz"),
            Err(e) => {
                eprintln!("error: {e}");
                return FAILED;
            }
        }
    }
    let secrets = secrets(&loaded);
    let shutdown = urutau_engine::Shutdown::new();
    shutdown.listen_for_signals();
    let options = urutau_engine::RunOptions {
        exit_when_caught_up,
    };
    match urutau_engine::run(&plan, options, shutdown).await {
        Ok(report) => {
            for r in &report.routes {
                tracing::info!(
                    route = %r.name,
                    commits = r.commits,
                    rows = r.rows,
                    deletes = r.deletes,
                    position = %r.position.clone().unwrap_or_default(),
                    "{}", if report.stopped { "stopped" } else { "caught up" }
                );
            }
            0
        }
        Err(e) => {
            eprintln!("error: {}", scrub(&e.to_string(), &secrets));
            FAILED
        }
    }
}

/// `urutau clickhouse cleanup FILE [--table T]`.
pub async fn clickhouse_cleanup(file: &Path, only: Option<&str>) -> u8 {
    let registry = registry();
    let (loaded, plan) = match load_and_plan(file, &registry).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let secrets = secrets(&loaded);
    let mut tables = Vec::new();
    for route in &plan.routes {
        let Some(sink) = plan
            .spec
            .sinks
            .iter()
            .find(|s| s.name.name == route.sink_name && s.kind.name == "clickhouse")
        else {
            continue;
        };
        let name = route.target.display_name();
        let short = route.target.name.last().cloned().unwrap_or_default();
        if only.is_none_or(|t| t == name || t == short) {
            tables.push((sink, route.target.clone(), name));
        }
    }
    if tables.is_empty() {
        let known: Vec<String> = plan
            .routes
            .iter()
            .filter(|r| {
                plan.spec
                    .sinks
                    .iter()
                    .any(|s| s.name.name == r.sink_name && s.kind.name == "clickhouse")
            })
            .map(|r| r.target.display_name())
            .collect();
        eprintln!(
            "error: {}: {}",
            loaded.path,
            match only {
                Some(t) if !known.is_empty() => format!(
                    "no ClickHouse table `{t}` in the pipeline (its ClickHouse tables: {})",
                    known.join(", ")
                ),
                _ => "the pipeline writes no ClickHouse table".to_string(),
            }
        );
        return INVALID;
    }
    let mut code = 0;
    for (sink, target, name) in tables {
        match urutau_sinks::clickhouse::cleanup(sink, &target).await {
            Ok(o) => match o.skipped {
                Some(why) => println!("{name}: skipped: {why}"),
                None => println!(
                    "{name}: cleaned: {} hidden rows (tombstones and replaced versions) before, {} after",
                    o.hidden_before, o.hidden_after
                ),
            },
            Err(e) => {
                eprintln!("error: {name}: {}", scrub(&e.to_string(), &secrets));
                code = FAILED;
            }
        }
    }
    code
}
