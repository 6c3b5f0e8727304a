//! The file source: newline-delimited Debezium-style JSON change events,
//! from a file or a directory of files read in name order. The embedded
//! default source (no server) and the input for experiments.
//!
//! Its tables carry no schema: each routed table is declared with
//! `CREATE TABLE source.table (...)` (YAML: `columns:`). Position: the byte
//! offset of the next unread line (`name:offset` in a directory).

mod assemble;
mod chunk;
pub mod position;
pub mod reader;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;
use urutau_planner::context::Transport;
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SourceKindDef, SourceProvider};
use urutau_planner::spec::SourceSpec;

use super::debezium::{DecimalHandling, Encodings};
use super::{ChangeSource, OpenArgs, SourceBatch, SourceError, SourceKind};
use crate::position::{Position, PositionKind};
use reader::{ReaderConfig, TableConfig, run_reader};

/// Registers the `file` kind for planning.
pub struct FileSourceProvider {
    def: SourceKindDef,
}

impl FileSourceProvider {
    /// The `file` kind's definition.
    pub fn new() -> Self {
        FileSourceProvider {
            def: SourceKindDef {
                name: "file",
                exec_name: "FileSourceExec",
                doc: "newline-delimited Debezium-style JSON change events from a file or a directory",
                options: vec![
                    OptionDef::new(
                        "path",
                        OptionType::String,
                        "a file, or a directory of files read in name order",
                    )
                    .required(),
                    OptionDef::new(
                        "format",
                        OptionType::Enum(&["debezium-json"]),
                        "the event format",
                    )
                    .default("debezium-json"),
                    OptionDef::new(
                        "decimal_handling",
                        OptionType::Enum(&["string", "precise", "double"]),
                        "how events without a schema part encode DECIMAL columns (Debezium's decimal.handling.mode): string = decimal text, precise = base64 of the unscaled value (Debezium's default: set it for files exported from Debezium), double = JSON numbers; an event's schema part always decides",
                    )
                    .default("string"),
                    OptionDef::new(
                        "time_precision",
                        OptionType::Enum(&["adaptive", "adaptive_time_microseconds", "connect"]),
                        "the unit of integer TIME and TIMESTAMP values in events without a schema part (Debezium's time.precision.mode): adaptive = microseconds, connect = milliseconds",
                    )
                    .default("adaptive"),
                    OptionDef::new(
                        "on_schema_mismatch",
                        OptionType::Enum(&["ignore", "fail"]),
                        "when an event does not fit its table's declared columns: ignore = a field the declaration lacks is left out (the row is counted in /metrics) and a declared column the event lacks is NULL; fail = either stops the run naming the field",
                    )
                    .default("ignore"),
                ],
                declares_tables: true,
                table_options: vec![],
                // Each change has a coordinate: the file, one shard, the
                // line's byte offset.
                transport: Transport::Coordinate,
                rules: vec![],
            },
        }
    }
}

impl Default for FileSourceProvider {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl SourceProvider for FileSourceProvider {
    fn def(&self) -> &SourceKindDef {
        &self.def
    }

    fn describe(&self, source: &SourceSpec) -> String {
        format!("path={}", source.options.get("path").unwrap_or("?"))
    }
}

/// The file source, running: a reader thread feeding a channel.
struct FileSource {
    rx: mpsc::Receiver<Result<SourceBatch, SourceError>>,
}

/// The `file` kind: byte-offset positions, reads a file or a directory.
pub struct FileKind {
    provider: Arc<FileSourceProvider>,
}

impl FileKind {
    /// The kind.
    pub fn new() -> Self {
        FileKind {
            provider: Arc::new(FileSourceProvider::new()),
        }
    }
}

impl Default for FileKind {
    fn default() -> Self {
        Self::new()
    }
}

impl SourceKind for FileKind {
    fn provider(&self) -> Arc<dyn SourceProvider> {
        Arc::clone(&self.provider) as Arc<dyn SourceProvider>
    }

    fn position_kind(&self) -> &'static dyn PositionKind {
        &position::FILE_POSITIONS
    }

    fn open(&self, args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError> {
        open(args)
    }
}

/// Starts reading.
fn open(args: OpenArgs<'_>) -> Result<Box<dyn ChangeSource>, SourceError> {
    let path = PathBuf::from(args.plan.spec.options.get("path").unwrap_or_default());
    let start = match &args.start {
        None => None,
        Some(p) => Some(
            p.downcast_ref::<position::FilePosition>()
                .cloned()
                .ok_or_else(|| SourceError::new(format!("{p} is not a file position")))?,
        ),
    };
    let options = &args.plan.spec.options;
    let encodings = Encodings::from_options(
        options.get("decimal_handling"),
        options.get("time_precision"),
        DecimalHandling::String,
    );
    let strict = options.get("on_schema_mismatch") == Some("fail");
    let cfg = ReaderConfig {
        path,
        tables: args
            .plan
            .tables
            .iter()
            .map(|t| TableConfig::from_plan(t, &encodings, strict))
            .collect(),
        start,
        exit_when_caught_up: args.exit_when_caught_up,
        policy: args.policy,
        report: Some((args.metrics.clone(), args.plan.spec.name.name.clone())),
        source: args.plan.spec.name.name.clone(),
    };
    // Two batches in flight: decoding overlaps the commits.
    let (tx, rx) = mpsc::channel(2);
    let stop = Arc::clone(&args.stop);
    std::thread::Builder::new()
        .name(format!("file-source-{}", args.plan.spec.name))
        .spawn(move || run_reader(cfg, tx, stop))
        .map_err(|e| SourceError::new(format!("cannot start the file reader: {e}")))?;
    Ok(Box::new(FileSource { rx }))
}

#[async_trait]
impl ChangeSource for FileSource {
    async fn next_batch(&mut self) -> Result<Option<SourceBatch>, SourceError> {
        match self.rx.recv().await {
            Some(Ok(b)) => Ok(Some(b)),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    async fn acknowledge(&mut self, _position: &Position) -> Result<(), SourceError> {
        // A file keeps everything; nothing to release.
        Ok(())
    }
}
