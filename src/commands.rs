//! The subcommands, over the library facade ([`urutau::Pipeline`]). Exit
//! codes: 0 ok, 2 invalid pipeline, query or usage, 1 runtime failure.

use std::path::Path;

use urutau::output::{Format, render};
use urutau::{Error, ExplainFormat, Pipeline, RunOptions};

/// Exit code of an invalid pipeline (or bad usage).
const INVALID: u8 = 2;
/// Exit code of a runtime failure.
const FAILED: u8 = 1;

/// Loads and plans a file; prints its warnings, or its errors.
async fn load(file: &Path) -> Result<Pipeline, u8> {
    match Pipeline::load(file).await {
        Ok(p) => {
            if let Some(w) = p.warnings() {
                eprint!("{w}");
            }
            Ok(p)
        }
        Err(e) => Err(report(&e)),
    }
}

/// Prints an error; its exit code.
fn report(e: &Error) -> u8 {
    match e {
        Error::Invalid { rendered, .. } => eprint!("{rendered}"),
        Error::Unavailable(text) => eprintln!("{text}"),
        Error::Run(text) | Error::Query(text) => eprintln!("error: {text}"),
    }
    e.exit_code()
}

/// `urutau validate FILE`.
pub async fn validate(file: &Path) -> u8 {
    match load(file).await {
        Ok(p) => {
            let n = p.routes().len();
            println!(
                "{}: ok: pipeline {} with {n} route{}",
                p.source_name(),
                p.name(),
                if n == 1 { "" } else { "s" }
            );
            0
        }
        Err(code) => code,
    }
}

/// `urutau plan [--explain] FILE`.
pub async fn plan(file: &Path, explain: bool, format: ExplainFormat) -> u8 {
    match load(file).await {
        Ok(p) => {
            print!(
                "{}",
                if explain {
                    p.explain(format)
                } else {
                    p.describe()
                }
            );
            0
        }
        Err(code) => code,
    }
}

/// `urutau run FILE`.
pub async fn run(file: &Path, exit_when_caught_up: bool, metrics_addr: Option<&str>) -> u8 {
    let p = match load(file).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Some(addr) = metrics_addr {
        match urutau_engine::status_server::serve(addr, p.metrics().clone()).await {
            Ok(bound) => tracing::info!(addr = %bound, "serving /metrics, /statusz and /healthz"),
            Err(e) => {
                eprintln!("error: {e}");
                return FAILED;
            }
        }
    }
    let handle = match p
        .start(RunOptions {
            exit_when_caught_up,
            ..RunOptions::default()
        })
        .await
    {
        Ok(h) => h,
        Err(e) => return report(&e),
    };
    handle.stop_on_signals();
    match handle.wait().await {
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
        Err(e) => report(&e),
    }
}

/// `urutau preview FILE [--limit N]`.
pub async fn preview(file: &Path, limit: u64, format: Format) -> u8 {
    let p = match load(file).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    match p.preview(limit).await {
        Ok(tables) => {
            for (name, result) in &tables {
                if format == Format::Table {
                    println!("-- {name}: {} rows", result.num_rows());
                }
                match render(result, format) {
                    Ok(text) => print!("{text}"),
                    Err(e) => {
                        eprintln!("error: printing {name}: {e}");
                        return FAILED;
                    }
                }
            }
            0
        }
        Err(e) => report(&e),
    }
}

/// `urutau query FILE SQL`.
pub async fn query(file: &Path, sql: &str, format: Format) -> u8 {
    let p = match load(file).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    match p.sql(sql).await {
        Ok(result) => match render(&result, format) {
            Ok(text) => {
                print!("{text}");
                0
            }
            Err(e) => {
                eprintln!("error: printing the result: {e}");
                FAILED
            }
        },
        Err(e) => report(&e),
    }
}

/// `urutau clickhouse cleanup FILE [--table T]`.
pub async fn clickhouse_cleanup(file: &Path, only: Option<&str>) -> u8 {
    let p = match load(file).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let tables = match p.clickhouse_tables(only) {
        Ok(t) => t,
        Err(message) => {
            eprintln!("error: {}: {message}", p.source_name());
            return INVALID;
        }
    };
    let mut code = 0;
    for (sink, target) in tables {
        let name = target.display_name();
        match urutau_sinks::clickhouse::cleanup(&sink, &target).await {
            Ok(o) => match o.skipped {
                Some(why) => println!("{name}: skipped: {why}"),
                None => println!(
                    "{name}: cleaned: {} hidden rows (tombstones and replaced versions) before, {} after",
                    o.hidden_before, o.hidden_after
                ),
            },
            Err(e) => {
                eprintln!("error: {name}: {}", p.scrub(&e.to_string()));
                code = FAILED;
            }
        }
    }
    code
}
