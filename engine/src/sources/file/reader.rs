//! Reading a file (or a directory of files, in name order) of Debezium-style
//! change events, one JSON object per line, into change batches.
//!
//! Lines that share a transaction id (`source.txId` or `transaction.id`) and
//! follow each other form one transaction; any other line is a transaction
//! of its own. A batch closes only between transactions. The position of a
//! transaction is the byte offset of the line after it.
//!
//! This module is the framing stage (lines, envelopes, transaction and
//! batch boundaries); the row images are decoded on a second thread by
//! [`super::assemble`], fed with [`Chunk`]s.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use urutau_planner::evolution::SchemaChanges;
use urutau_planner::plan::{BeforeImages, SourceTablePlan};
use urutau_planner::registry::SourceTableSchema;

use super::assemble::{Assembler, DecodedTable, run_assembler};
use super::chunk::{Chunk, RowImage, Step};
use super::position::FilePosition;
use crate::batching::BatchPolicy;
use crate::sources::debezium::{
    ConnectFields, Encodings, EventRows, SchemaCache, parse_event, row_images,
};
use crate::sources::decode::TableDecoder;
use crate::sources::panic_message;
use crate::sources::{SourceBatch, SourceError};

/// A chunk goes to the decoding stage once it holds this many steps or
/// bytes (or sooner: at a batch's end, when the input pauses, at a file's
/// end). Small enough to stay in cache, large enough that handing it over
/// costs nothing per line.
const CHUNK_STEPS: usize = 2048;
const CHUNK_BYTES: usize = 512 << 10;
/// Chunks in flight between the stages (memory: this many times
/// `CHUNK_BYTES`, plus the batches the decoding stage holds).
const CHUNKS_IN_FLIGHT: usize = 4;

/// What the reader needs to know: the tables as the source plans them
/// (`TableConfig`), or as the framing stage keeps them (`FramedTable`).
pub struct ReaderConfig<T = TableConfig> {
    pub path: PathBuf,
    pub tables: Vec<T>,
    pub start: Option<FilePosition>,
    pub exit_when_caught_up: bool,
    pub policy: BatchPolicy,
    /// Where rows that did not fit their declaration are counted: the
    /// run's metrics and the source's name.
    pub report: Option<(crate::metrics::Metrics, String)>,
    /// The source's name (a schema change names it).
    pub source: String,
}

/// A routed table: its name parts, its decoder, and which update
/// before-images its routes need.
pub struct TableConfig {
    pub table: Vec<String>,
    pub decoder: TableDecoder,
    pub before_images: BeforeImages,
    /// What a change of the table's shape (an event's schema part with
    /// more or wider columns) does.
    pub schema_changes: SchemaChanges,
}

/// What the framing stage knows of a routed table.
struct FramedTable {
    table: Vec<String>,
    before_images: BeforeImages,
    /// The table as planned, and what a change of its shape does.
    schema: SourceTableSchema,
    schema_changes: SchemaChanges,
    /// The schema part the plan was last found to read as it is.
    checked: Option<Arc<ConnectFields>>,
}

impl TableConfig {
    /// The reader's view of a planned table whose values are encoded as
    /// `encodings` says (unless an event's schema part says otherwise),
    /// its declaration a strict contract when `strict`
    /// (`on_schema_mismatch = 'fail'`).
    pub fn from_plan(plan: &SourceTablePlan, encodings: &Encodings, strict: bool) -> Self {
        TableConfig {
            table: plan.table.clone(),
            decoder: TableDecoder::with_encodings(
                &plan.schema,
                Arc::clone(&plan.scan_schema),
                plan.table.join("."),
                encodings.column_logicals(&plan.schema),
            )
            .with_strict_schema(strict),
            before_images: plan.before_images.clone(),
            schema_changes: plan.schema_changes,
        }
    }
}

/// One file to read and where to stop (for `--exit-when-caught-up`).
struct FileCursor {
    name: Option<String>,
    /// The transport stream of its changes: its name.
    stream: Arc<str>,
    path: PathBuf,
    reader: BufReader<File>,
    offset: u64,
    line: u64,
    stop_at: Option<u64>,
}

/// The framing stage's state while it runs.
struct Reader {
    cfg: ReaderConfig<FramedTable>,
    dir: bool,
    /// Files of a directory still to read after the current one.
    queue: Vec<(String, PathBuf, Option<u64>)>,
    current: Option<FileCursor>,
    /// The text of the chunk being filled: whole lines, the current one
    /// last, from `line_start`.
    text: Vec<u8>,
    line_start: usize,
    /// The steps of the chunk being filled.
    steps: Vec<Step>,
    /// Where chunks go, and spent buffers come back from.
    chunks: SyncSender<Chunk>,
    spare: Receiver<(Vec<u8>, Vec<Step>)>,
    /// Open transaction: its id.
    open_tx: Option<String>,
    /// Rows since the last transaction end (they need a position).
    open_rows: usize,
    /// Position after the last closed transaction.
    closed_at: Option<FilePosition>,
    batch_lines: usize,
    batch_rows: usize,
    batch_opened: Option<Instant>,
    /// The chunk being filled ends a batch (it goes at once).
    batch_closed: bool,
    /// Schema parts seen (events with `schemas.enable`).
    schemas: SchemaCache,
}

fn list_dir(path: &Path) -> Result<Vec<(String, PathBuf)>, SourceError> {
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(path)
        .map_err(|e| SourceError::new(format!("{}: {e}", path.display())))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| (e.file_name().to_string_lossy().to_string(), e.path()))
        .filter(|(n, _)| !n.starts_with('.'))
        .collect();
    files.sort();
    Ok(files)
}

fn open_at(
    name: Option<String>,
    path: &Path,
    offset: u64,
    stop_at: Option<u64>,
) -> Result<FileCursor, SourceError> {
    let file =
        File::open(path).map_err(|e| SourceError::new(format!("{}: {e}", path.display())))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if offset > len {
        return Err(SourceError::new(format!(
            "{}: the committed position {offset} is past the end of the file ({len} bytes): the file was truncated or replaced",
            path.display()
        )));
    }
    // Line numbers for messages: count the lines before the start.
    let mut line = 0u64;
    if offset > 0 {
        let mut r = BufReader::with_capacity(
            1 << 20,
            File::open(path).map_err(|e| SourceError::new(e.to_string()))?,
        );
        let mut left = offset;
        while left > 0 {
            let buf = r.fill_buf().map_err(|e| SourceError::new(e.to_string()))?;
            if buf.is_empty() {
                break;
            }
            let n = buf.len().min(left as usize);
            line += memchr::memchr_iter(b'\n', &buf[..n]).count() as u64;
            r.consume(n);
            left -= n as u64;
        }
    }
    let mut reader = BufReader::with_capacity(1 << 17, file);
    reader
        .seek(SeekFrom::Start(offset))
        .map_err(|e| SourceError::new(format!("{}: {e}", path.display())))?;
    Ok(FileCursor {
        stream: stream_name(name.as_deref(), path),
        name,
        path: path.to_path_buf(),
        reader,
        offset,
        line,
        stop_at,
    })
}

/// A change file's stream (its changes' `_stream`): its name in the
/// directory, or the file name of a one-file source.
fn stream_name(name: Option<&str>, path: &Path) -> Arc<str> {
    match name {
        Some(n) => Arc::from(n),
        None => Arc::from(
            path.file_name()
                .map_or_else(|| path.to_string_lossy(), |n| n.to_string_lossy())
                .as_ref(),
        ),
    }
}

enum LineRead {
    Line,
    /// Nothing more now (tail: wait and retry).
    Wait,
    /// Everything the source held at start is read.
    Done,
}

impl Reader {
    fn new(
        cfg: ReaderConfig<FramedTable>,
        chunks: SyncSender<Chunk>,
        spare: Receiver<(Vec<u8>, Vec<Step>)>,
    ) -> Result<Reader, SourceError> {
        let meta = std::fs::metadata(&cfg.path)
            .map_err(|e| SourceError::new(format!("{}: {e}", cfg.path.display())))?;
        let dir = meta.is_dir();
        let mut reader = Reader {
            dir,
            queue: vec![],
            current: None,
            text: Vec::with_capacity(CHUNK_BYTES + (64 << 10)),
            line_start: 0,
            steps: Vec::with_capacity(CHUNK_STEPS + 2),
            chunks,
            spare,
            open_tx: None,
            open_rows: 0,
            closed_at: None,
            batch_lines: 0,
            batch_rows: 0,
            batch_opened: None,
            batch_closed: false,
            schemas: SchemaCache::default(),
            cfg,
        };
        let exit = reader.cfg.exit_when_caught_up;
        if dir {
            let start = reader.cfg.start.clone();
            if let Some(FilePosition { file: None, .. }) = start {
                return Err(SourceError::new(format!(
                    "the committed position {} was written while reading one file, and {} is a directory",
                    start.unwrap().offset,
                    reader.cfg.path.display()
                )));
            }
            let files = list_dir(&reader.cfg.path)?;
            let mut queue = Vec::new();
            for (name, path) in files {
                let size = if exit {
                    Some(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0))
                } else {
                    None
                };
                match &start {
                    Some(FilePosition { file: Some(f), .. }) if &name < f => continue,
                    _ => queue.push((name, path, size)),
                }
            }
            if let Some(FilePosition {
                file: Some(f),
                offset,
            }) = &start
            {
                match queue.first() {
                    Some((name, path, size)) if name == f => {
                        let (name, path, size) = (name.clone(), path.clone(), *size);
                        queue.remove(0);
                        reader.current = Some(open_at(Some(name), &path, *offset, size)?);
                    }
                    _ => {
                        return Err(SourceError::new(format!(
                            "the committed position is in file {f}, which is no longer in {}",
                            reader.cfg.path.display()
                        )));
                    }
                }
            }
            reader.queue = queue;
            reader.closed_at = reader.cfg.start.clone();
        } else {
            if let Some(FilePosition { file: Some(f), .. }) = &reader.cfg.start {
                return Err(SourceError::new(format!(
                    "the committed position names file {f}: it was written while reading a directory, and {} is a file",
                    reader.cfg.path.display()
                )));
            }
            let offset = reader.cfg.start.as_ref().map_or(0, |p| p.offset);
            let stop_at = if exit { Some(meta.len()) } else { None };
            let path = reader.cfg.path.clone();
            reader.current = Some(open_at(None, &path, offset, stop_at)?);
            reader.closed_at = Some(FilePosition { file: None, offset });
        }
        Ok(reader)
    }

    fn position_here(&self) -> Option<FilePosition> {
        self.current.as_ref().map(|c| FilePosition {
            file: c.name.clone(),
            offset: c.offset,
        })
    }

    /// Hands the chunk filled so far to the decoding stage. False when that
    /// stage has ended (it sent an error, or nobody listens).
    fn flush(&mut self) -> bool {
        if self.text.is_empty() && self.steps.is_empty() {
            return true;
        }
        let (file, stream, path) = match &self.current {
            Some(c) => (c.name.clone(), c.stream.clone(), c.path.clone()),
            None => (
                None,
                stream_name(None, &self.cfg.path),
                self.cfg.path.clone(),
            ),
        };
        let mut next = Chunk::new(file, stream, path, self.spare.try_recv().ok());
        // A buffer that grew for a huge line is not kept at that size.
        if next.text.capacity() > 2 * CHUNK_BYTES {
            next.text = Vec::new();
        }
        if next.text.capacity() == 0 {
            next.text.reserve(CHUNK_BYTES + (64 << 10));
            next.steps.reserve(CHUNK_STEPS + 2);
        }
        std::mem::swap(&mut self.text, &mut next.text);
        std::mem::swap(&mut self.steps, &mut next.steps);
        self.line_start = 0;
        self.batch_closed = false;
        self.chunks.send(next).is_ok()
    }

    /// Reads the next complete line onto the end of `text`, from
    /// `line_start`.
    fn read_line(&mut self) -> Result<LineRead, SourceError> {
        loop {
            if self.current.is_none() {
                if self.queue.is_empty() && self.dir && !self.cfg.exit_when_caught_up {
                    // Tail a directory: pick up files added since.
                    let last = self.closed_at.as_ref().and_then(|p| p.file.clone());
                    for (name, path) in list_dir(&self.cfg.path)? {
                        if last.as_ref().is_none_or(|l| &name > l) {
                            self.queue.push((name, path, None));
                        }
                    }
                }
                if self.queue.is_empty() {
                    return Ok(if self.cfg.exit_when_caught_up {
                        LineRead::Done
                    } else {
                        LineRead::Wait
                    });
                }
                let (name, path, size) = self.queue.remove(0);
                self.current = Some(open_at(Some(name), &path, 0, size)?);
            }
            let cur = self.current.as_mut().expect("current file");
            if let Some(stop) = cur.stop_at
                && cur.offset >= stop
            {
                self.finish_file()?;
                continue;
            }
            self.line_start = self.text.len();
            let n = cur
                .reader
                .read_until(b'\n', &mut self.text)
                .map_err(|e| SourceError::new(format!("{}: {e}", cur.path.display())))?;
            let complete = n > 0 && self.text.last() == Some(&b'\n');
            let at_stop = cur.stop_at.is_some_and(|s| cur.offset + n as u64 >= s);
            if n > 0 && (complete || at_stop) {
                cur.offset += n as u64;
                cur.line += 1;
                return Ok(LineRead::Line);
            }
            // A partial line (the writer is mid-line) or the end of the file.
            self.text.truncate(self.line_start);
            if n > 0 {
                cur.reader
                    .seek(SeekFrom::Start(cur.offset))
                    .map_err(|e| SourceError::new(e.to_string()))?;
            }
            if self.dir && !self.queue.is_empty() && n == 0 {
                // A later file exists: this one is complete.
                self.finish_file()?;
                continue;
            }
            if self.dir && !self.cfg.exit_when_caught_up && n == 0 {
                let last = cur.name.clone();
                let newer = list_dir(&self.cfg.path)?
                    .into_iter()
                    .filter(|(name, _)| last.as_ref().is_none_or(|l| name > l))
                    .collect::<Vec<_>>();
                if !newer.is_empty() {
                    self.queue
                        .extend(newer.into_iter().map(|(n, p)| (n, p, None)));
                    self.finish_file()?;
                    continue;
                }
            }
            return Ok(
                if self.cfg.exit_when_caught_up && cur.stop_at.is_some_and(|s| cur.offset >= s) {
                    LineRead::Done
                } else {
                    LineRead::Wait
                },
            );
        }
    }

    /// The end of a file ends any transaction open in it; its chunk goes
    /// (a chunk holds lines of one file).
    fn finish_file(&mut self) -> Result<(), SourceError> {
        if self.open_tx.is_some() {
            self.close_transaction();
        }
        if !self.flush() {
            return Err(SourceError::new("the file reader's decoding stage ended"));
        }
        self.current = None;
        Ok(())
    }

    fn close_transaction(&mut self) {
        let Some(pos) = self.position_here() else {
            return;
        };
        self.close_at(pos);
    }

    /// The open transaction ends at `pos` (in the current file).
    fn close_at(&mut self, pos: FilePosition) {
        if self.open_rows > 0 {
            self.steps.push(Step::Close { offset: pos.offset });
            self.open_rows = 0;
        }
        self.open_tx = None;
        self.closed_at = Some(pos);
    }

    fn error_at(&self, message: impl std::fmt::Display) -> SourceError {
        match &self.current {
            Some(c) => SourceError::new(format!("{}:{}: {message}", c.path.display(), c.line)),
            None => SourceError::new(message.to_string()),
        }
    }

    /// Frames the line at the end of `text`.
    fn handle_line(&mut self) -> Result<(), SourceError> {
        let text = std::mem::take(&mut self.text);
        let result = self.handle_bytes(&text[self.line_start..], self.line_start);
        self.text = text;
        result
    }

    /// Frames one line, which starts at `base` in the chunk's text.
    fn handle_bytes(&mut self, line_bytes: &[u8], base: usize) -> Result<(), SourceError> {
        let text =
            std::str::from_utf8(line_bytes).map_err(|_| self.error_at("the line is not UTF-8"))?;
        let text = text.trim();
        self.batch_lines += 1;
        if self.batch_opened.is_none() {
            self.batch_opened = Some(Instant::now());
        }
        if text.is_empty() {
            if self.open_tx.is_none() {
                self.close_transaction();
            }
            return Ok(());
        }
        let event = parse_event(text).map_err(|e| self.error_at(e))?;
        let env = &event.envelope;
        let tx_id = env.transaction_id();
        // A line of another transaction closes the open one at this line.
        if self.open_tx.is_some() && self.open_tx != tx_id {
            let line_start = {
                let c = self.current.as_ref().expect("current");
                FilePosition {
                    file: c.name.clone(),
                    offset: c.offset - line_bytes.len() as u64,
                }
            };
            self.close_at(line_start);
            // The batch may close right at the end of that transaction,
            // before this line's rows.
            if self
                .cfg
                .policy
                .should_close(self.batch_rows, self.batch_opened)
            {
                self.take_batch();
                self.batch_lines = 1;
                self.batch_opened = Some(Instant::now());
            }
        }
        let Some(op) = env.op.as_deref() else {
            return Err(self.error_at("change event without `op`"));
        };
        let Some(source) = &env.source else {
            return Err(self.error_at("change event without `source`"));
        };
        let Some(table) = source.table.as_deref() else {
            return Err(self.error_at("change event without `source.table`"));
        };
        let schema = source.schema.as_deref();
        let commit_ts = env.commit_ts_micros();
        let (line, line_offset) = self
            .current
            .as_ref()
            .map_or((0, 0), |c| (c.line, c.offset - line_bytes.len() as u64));
        let idx = self
            .cfg
            .tables
            .iter()
            .position(|t| match t.table.as_slice() {
                [name] => name == table,
                [s, name] => name == table && Some(s.as_str()) == schema,
                _ => false,
            });
        if let Some(idx) = idx {
            let rows = row_images(
                op,
                env.before,
                env.after,
                &self.cfg.tables[idx].before_images,
            )
            .map_err(|e| self.error_at(e))?;
            let (images, snapshot) = match rows {
                EventRows::Rows { images, snapshot } => (images, snapshot),
                EventRows::Truncate => {
                    return Err(self.error_at(format!(
                        "op `t` (a TRUNCATE of {table}): the file source cannot replay a truncate; remove the event or the table's route"
                    )));
                }
            };
            let connect = match event.schema {
                Some(s) => Some(self.schemas.get(s).map_err(|e| self.error_at(e))?),
                None => None,
            };
            if let Some(c) = &connect {
                let t = &self.cfg.tables[idx];
                if !t.checked.as_ref().is_some_and(|k| Arc::ptr_eq(k, c)) {
                    let change = c
                        .shape_change(&self.cfg.source, &t.table, &t.schema, t.schema_changes)
                        .map_err(|e| self.error_at(e))?;
                    if let Some(change) = change {
                        // Nothing of this line on: the run plans the table
                        // again and reads on from what the sinks hold.
                        return Err(SourceError::schema_changed(change));
                    }
                    self.cfg.tables[idx].checked = Some(Arc::clone(c));
                }
            }
            for (kind, image) in images.into_iter().flatten() {
                // The image's place in the chunk's text.
                let start = base + (image.as_ptr() as usize - line_bytes.as_ptr() as usize);
                self.steps.push(Step::Row(RowImage {
                    table: idx,
                    kind,
                    start,
                    end: start + image.len(),
                    commit_ts: if snapshot { None } else { commit_ts },
                    snapshot,
                    line,
                    offset: line_offset,
                    connect: connect.clone(),
                }));
                self.open_rows += 1;
                self.batch_rows += 1;
            }
        }
        match tx_id {
            Some(id) => self.open_tx = Some(id),
            None => self.close_transaction(),
        }
        Ok(())
    }

    /// Closes the batch: the closed transactions form it.
    fn take_batch(&mut self) {
        let Some(end) = self.closed_at.clone() else {
            return;
        };
        self.steps.push(Step::Take { end });
        self.batch_closed = true;
        self.batch_lines = 0;
        self.batch_rows = 0;
        self.batch_opened = None;
    }

    fn pending(&self) -> bool {
        self.batch_lines > 0 && self.open_tx.is_none()
    }
}

/// Runs the reader until the input is caught up (exit mode), `stop` is
/// set, or the receiver is gone: the framing stage on the calling
/// (blocking) thread, the decoding stage on a thread it starts.
pub fn run_reader(
    cfg: ReaderConfig,
    tx: mpsc::Sender<Result<SourceBatch, SourceError>>,
    stop: Arc<AtomicBool>,
) {
    let mut framed = Vec::with_capacity(cfg.tables.len());
    let mut decoded = Vec::with_capacity(cfg.tables.len());
    for t in cfg.tables {
        framed.push(FramedTable {
            table: t.table.clone(),
            before_images: t.before_images,
            schema: t.decoder.schema().clone(),
            schema_changes: t.schema_changes,
            checked: None,
        });
        decoded.push(DecodedTable {
            table: t.table,
            decoder: t.decoder,
        });
    }
    let framing = ReaderConfig {
        path: cfg.path.clone(),
        tables: framed,
        start: cfg.start,
        exit_when_caught_up: cfg.exit_when_caught_up,
        policy: cfg.policy,
        report: None,
        source: cfg.source.clone(),
    };
    let (chunks_tx, chunks_rx) = std::sync::mpsc::sync_channel(CHUNKS_IN_FLIGHT);
    let (spare_tx, spare_rx) = std::sync::mpsc::channel();
    let assembler = Assembler::new(decoded, cfg.path, cfg.report);
    let out = tx.clone();
    let name = std::thread::current()
        .name()
        .map_or("file-decode".to_string(), |n| format!("{n}-decode"));
    let decoding = std::thread::Builder::new()
        .name(name)
        .spawn(move || run_assembler(assembler, chunks_rx, spare_tx, out));
    if let Err(e) = decoding {
        let _ = tx.blocking_send(Err(SourceError::new(format!(
            "cannot start the file reader's decoding thread: {e}"
        ))));
        return;
    }
    // Every batch and error now goes through the decoding stage, in order;
    // the framing stage only watches whether anyone still listens (the
    // decoding stage learns it only when it sends, and a tailing source
    // may send nothing for long).
    let listener_gone = move || tx.is_closed();
    let mut reader = match Reader::new(framing, chunks_tx.clone(), spare_rx) {
        Ok(r) => r,
        Err(e) => {
            let _ = chunks_tx.send(Chunk {
                file: None,
                stream: Arc::from(""),
                path: PathBuf::new(),
                text: Vec::new(),
                steps: vec![Step::Fail(e)],
            });
            return;
        }
    };
    drop(chunks_tx);
    // A panic here must not look like the end of the input.
    let framed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        frame(&mut reader, &stop, &listener_gone)
    }));
    if let Err(panic) = framed {
        let message = format!(
            "{}: the file reader failed: {}",
            reader.cfg.path.display(),
            panic_message(panic.as_ref())
        );
        reader.steps.push(Step::Fail(SourceError::new(message)));
        reader.flush();
    }
}

/// The framing loop. Returns when the input is caught up (exit mode),
/// `stop` is set, the input is bad (the error is queued after everything
/// before it), the decoding stage has ended, or (checked while waiting for
/// input) nobody listens any more.
fn frame(reader: &mut Reader, stop: &AtomicBool, listener_gone: &dyn Fn() -> bool) {
    let poll = reader
        .cfg
        .policy
        .max_interval
        .min(Duration::from_millis(50))
        .max(Duration::from_millis(5));
    // Queues an error after the steps before it.
    let fail = |reader: &mut Reader, e: SourceError| {
        reader.steps.push(Step::Fail(e));
        reader.flush();
    };
    while !stop.load(Ordering::Relaxed) {
        let read = match reader.read_line() {
            Ok(r) => r,
            Err(e) => return fail(reader, e),
        };
        match read {
            LineRead::Line => {
                if let Err(e) = reader.handle_line() {
                    return fail(reader, e);
                }
                let rows = reader.batch_lines.max(reader.batch_rows);
                // The clock is read every 64 lines only; an idle source
                // checks it while waiting.
                if reader.open_tx.is_none()
                    && (rows >= reader.cfg.policy.max_rows
                        || (rows.is_multiple_of(64)
                            && reader.cfg.policy.should_close(rows, reader.batch_opened)))
                {
                    reader.take_batch();
                }
                // A closed batch goes at once; otherwise the chunk fills.
                let full = reader.steps.len() >= CHUNK_STEPS || reader.text.len() >= CHUNK_BYTES;
                if (reader.batch_closed || full) && !reader.flush() {
                    return;
                }
            }
            LineRead::Wait => {
                // What was read goes to the decoder before waiting.
                if !reader.flush() || listener_gone() {
                    return;
                }
                if reader.pending()
                    && reader
                        .cfg
                        .policy
                        .should_close(reader.batch_lines, reader.batch_opened)
                {
                    reader.take_batch();
                    if !reader.flush() {
                        return;
                    }
                } else {
                    std::thread::sleep(poll);
                }
            }
            LineRead::Done => {
                if reader.open_tx.is_some() {
                    reader.close_transaction();
                }
                if reader.batch_lines > 0 {
                    reader.take_batch();
                }
                reader.flush();
                return;
            }
        }
    }
}
