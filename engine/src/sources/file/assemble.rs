//! The decoding stage of the file reader: replays the steps of each chunk
//! (see [`super::chunk`]) — row images decoded into the tables' Arrow
//! builders, positions given at transaction ends, batches finished and sent
//! where the framing stage closed them, an error sent where it found one.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};

use tokio::sync::mpsc;

use super::chunk::{Chunk, RowImage, Step};
use super::position::{FilePosition, write_file_position};
use crate::position::Position;
use crate::sources::decode::TableDecoder;
use crate::sources::panic_message;
use crate::sources::{SourceBatch, SourceError, TableChanges};

/// A routed table's name parts and decoder.
pub struct DecodedTable {
    pub table: Vec<String>,
    pub decoder: TableDecoder,
}

/// The decoding stage's state.
pub struct Assembler {
    tables: Vec<DecodedTable>,
    /// The source's path (a file or a directory), for messages.
    source_path: PathBuf,
    /// Undeclared fields already warned about.
    warned: HashSet<String>,
    /// Reused for the text of positions.
    pos_text: String,
    /// Where rows with fields their declaration lacks are counted.
    report: Option<(crate::metrics::Metrics, String)>,
}

impl Assembler {
    /// A stage decoding into `tables`.
    pub fn new(
        tables: Vec<DecodedTable>,
        source_path: PathBuf,
        report: Option<(crate::metrics::Metrics, String)>,
    ) -> Self {
        Assembler {
            tables,
            source_path,
            warned: HashSet::new(),
            pos_text: String::new(),
            report,
        }
    }

    /// Replays a chunk's steps; a batch or an error goes to `out`. False
    /// when the run must end (an error was sent, or nobody listens).
    ///
    /// A batch is sent at the end of its chunk: the framing stage hands a
    /// chunk over right after the line that closed a batch, so what follows
    /// the batch in its chunk is the rest of that line. When that line is
    /// bad, the batch is dropped with it, as a one-thread reader that never
    /// got past the line would: the run fails at the line, and the batch's
    /// rows are read again on restart.
    fn replay(
        &mut self,
        chunk: &Chunk,
        out: &mpsc::Sender<Result<SourceBatch, SourceError>>,
    ) -> bool {
        // The chunk's text checked as UTF-8 once, not image by image (its
        // lines were checked one by one by the framing stage; only a chunk
        // ending at a line that failed that check is not valid as a whole).
        let text = std::str::from_utf8(&chunk.text).ok();
        let mut ready: Vec<SourceBatch> = Vec::new();
        for step in &chunk.steps {
            let result = match step {
                Step::Row(row) => self.decode_row(chunk, text, row),
                Step::Close { offset } => {
                    self.close_transaction(chunk.file.as_deref(), *offset);
                    Ok(())
                }
                Step::Take { end } => self.take_batch(end).map(|batch| ready.push(batch)),
                Step::Fail(e) => Err(e.clone()),
            };
            if let Err(e) = result {
                let _ = out.blocking_send(Err(e));
                return false;
            }
        }
        ready
            .into_iter()
            .all(|batch| out.blocking_send(Ok(batch)).is_ok())
    }

    fn decode_row(
        &mut self,
        chunk: &Chunk,
        text: Option<&str>,
        row: &RowImage,
    ) -> Result<(), SourceError> {
        let t = &mut self.tables[row.table];
        let line = row.line;
        let fail = |message: String| {
            SourceError::new(format!(
                "{}:{line}: table {}, {message}",
                chunk.path.display(),
                t.table.join(".")
            ))
        };
        let raw = match text {
            Some(text) => text.get(row.start..row.end),
            None => std::str::from_utf8(&chunk.text[row.start..row.end]).ok(),
        }
        .ok_or_else(|| fail("internal: a row image is not UTF-8".to_string()))?;
        t.decoder
            .append_row(raw, &row.meta(&chunk.stream))
            .map_err(|e| fail(e.to_string()))?;
        if !t.decoder.undeclared.is_empty() {
            let table_name = t.table.join(".");
            for u in std::mem::take(&mut t.decoder.undeclared) {
                if self.warned.insert(format!("{table_name}.{u}")) {
                    tracing::warn!(table = %table_name, field = %u, "the data has a field the table declaration lacks; it is not read (on_schema_mismatch = 'fail' stops instead)");
                }
            }
            let rows = t.decoder.take_mismatched_rows();
            if let Some((metrics, source)) = &self.report {
                metrics.mismatched_rows(source, rows);
            }
        }
        Ok(())
    }

    fn close_transaction(&mut self, file: Option<&str>, offset: u64) {
        self.pos_text.clear();
        let _ = write_file_position(&mut self.pos_text, file, offset);
        for t in &mut self.tables {
            if t.decoder.open_rows() > 0 {
                t.decoder.close_transaction(&self.pos_text);
            }
        }
    }

    fn take_batch(&mut self, end: &FilePosition) -> Result<SourceBatch, SourceError> {
        let ingest = chrono::Utc::now().timestamp_micros();
        let mut tables = Vec::new();
        for t in &mut self.tables {
            if t.decoder.rows() > 0 {
                let batch = t.decoder.finish(ingest).map_err(|e| {
                    SourceError::new(format!(
                        "{}: table {}, {e}",
                        self.source_path.display(),
                        t.table.join(".")
                    ))
                })?;
                tables.push(TableChanges {
                    table: t.table.clone(),
                    batch,
                });
            }
        }
        Ok(SourceBatch {
            tables,
            end: Position::new(end.clone()),
            snapshot: Vec::new(),
            open_transaction: false,
        })
    }
}

/// Runs the decoding stage until the framing stage ends (its sender is
/// dropped), an error is sent, or nobody listens. Spent chunks' buffers go
/// back through `spare` for reuse.
pub fn run_assembler(
    mut assembler: Assembler,
    chunks: Receiver<Chunk>,
    spare: Sender<(Vec<u8>, Vec<Step>)>,
    out: mpsc::Sender<Result<SourceBatch, SourceError>>,
) {
    while let Ok(chunk) = chunks.recv() {
        // A panic here must not look like the end of the input.
        let replayed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assembler.replay(&chunk, &out)
        }));
        match replayed {
            Ok(true) => {}
            Ok(false) => return,
            Err(panic) => {
                let _ = out.blocking_send(Err(SourceError::new(format!(
                    "{}: the file reader's decoding stage failed: {}",
                    chunk.path.display(),
                    panic_message(panic.as_ref())
                ))));
                return;
            }
        }
        let _ = spare.send((chunk.text, chunk.steps));
    }
}
