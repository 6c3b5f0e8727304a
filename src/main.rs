//! The `urutau` command: parse arguments, call the crates.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Change-data-capture into Iceberg, ClickHouse and Couchbase, planned with
/// Apache DataFusion.
#[derive(Parser, Debug)]
#[command(name = "urutau", version, about, disable_version_flag = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log level (error, warn, info, debug, trace) or a tracing filter.
    #[arg(long, global = true, default_value = "info", env = "URUTAU_LOG")]
    log_level: String,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a pipeline: resume every table from its sink and replicate.
    Run {
        /// The pipeline file (.sql or .yaml).
        file: PathBuf,
        /// Exit once everything the sources held at start is committed.
        #[arg(long)]
        exit_when_caught_up: bool,
        /// Serve /metrics (Prometheus), /statusz (JSON) and /healthz on
        /// this address (e.g. 127.0.0.1:9187).
        #[arg(long, value_name = "HOST:PORT")]
        metrics_addr: Option<String>,
    },
    /// Show what a pipeline means: its tables, or with --explain the
    /// DataFusion plans of every route.
    Plan {
        file: PathBuf,
        /// Print the logical and physical plan of every route.
        #[arg(long)]
        explain: bool,
        /// How physical plans are drawn.
        #[arg(long, value_enum, default_value_t = PlanFormat::Indent)]
        format: PlanFormat,
    },
    /// Check a pipeline without running it (exit 2 when it is invalid).
    Validate { file: PathBuf },
    /// Show what each table would receive from its next changes (after the
    /// position its sink holds), through the same plans a run executes.
    /// Commits and creates nothing.
    Preview {
        /// The pipeline file.
        file: PathBuf,
        /// Changes per table.
        #[arg(long, default_value_t = 10)]
        limit: u64,
        /// How rows are printed (json: one object per row).
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Query what landed: DataFusion SQL over the pipeline's sink tables,
    /// named as the pipeline writes them (`lake.orders`). Read-only.
    Query {
        /// The pipeline file whose tables to query.
        file: PathBuf,
        /// The query, e.g. "SELECT status, count(*) FROM lake.orders GROUP BY status".
        sql: String,
        /// How rows are printed (json: one object per row).
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Operator commands for a pipeline's ClickHouse tables.
    #[command(subcommand)]
    Clickhouse(ClickhouseCommand),
    /// Print the version.
    Version,
}

#[derive(Subcommand, Debug)]
enum ClickhouseCommand {
    /// Remove tombstones and replaced rows physically (`OPTIMIZE TABLE ..
    /// FINAL CLEANUP`). Reads under FINAL are correct whether or not it
    /// ran; this reclaims space.
    Cleanup {
        /// The pipeline file whose ClickHouse tables to clean.
        file: PathBuf,
        /// Only this table (`database.table` or `table`).
        #[arg(long)]
        table: Option<String>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum OutputFormat {
    Table,
    Csv,
    Json,
}

impl From<OutputFormat> for urutau::output::Format {
    fn from(f: OutputFormat) -> Self {
        match f {
            OutputFormat::Table => urutau::output::Format::Table,
            OutputFormat::Csv => urutau::output::Format::Csv,
            OutputFormat::Json => urutau::output::Format::Json,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PlanFormat {
    Indent,
    Tree,
}

/// The tracing filter of a `--log-level`: a plain level keeps the
/// Couchbase SDK's connection chatter (dozens of lines per connect at
/// info) at warn; a full filter is taken as it is.
fn log_filter(level: &str) -> String {
    if level.contains('=') || level.contains(',') {
        return level.to_string();
    }
    let quiet = match level {
        "debug" | "trace" | "error" => level,
        _ => "warn",
    };
    format!("{level},couchbase={quiet},couchbase_core={quiet}")
}

fn init_logging(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_level, cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run {
                file,
                exit_when_caught_up,
                metrics_addr,
            } => commands::run(&file, exit_when_caught_up, metrics_addr.as_deref()).await,
            Command::Plan {
                file,
                explain,
                format,
            } => {
                let format = match format {
                    PlanFormat::Indent => urutau::ExplainFormat::Indent,
                    PlanFormat::Tree => urutau::ExplainFormat::Tree,
                };
                commands::plan(&file, explain, format).await
            }
            Command::Validate { file } => commands::validate(&file).await,
            Command::Query { file, sql, format } => {
                commands::query(&file, &sql, format.into()).await
            }
            Command::Preview {
                file,
                limit,
                format,
            } => commands::preview(&file, limit, format.into()).await,
            Command::Clickhouse(ClickhouseCommand::Cleanup { file, table }) => {
                commands::clickhouse_cleanup(&file, table.as_deref()).await
            }
            Command::Version => {
                println!("urutau {}", env!("CARGO_PKG_VERSION"));
                0
            }
        }
    });
    ExitCode::from(code)
}
