//! What the framing stage of the file reader hands to its decoding stage:
//! the text of consecutive lines of one file, and the steps found in them,
//! in input order.
//!
//! The reader runs in two stages on two threads so that a change file is
//! decoded on two cores: framing (read the lines, parse each envelope, keep
//! the transaction and batch boundaries) and decoding (row images into
//! Arrow columns, batches out). Every decision about where a transaction or
//! a batch ends is taken by the framing stage and recorded here as a step,
//! so the decoding stage only replays them: the batches are the same as
//! with one thread.

use std::path::PathBuf;
use std::sync::Arc;

use super::position::FilePosition;
use crate::change_batch::{MessageMeta, RowKind};
use crate::sources::SourceError;
use crate::sources::debezium::ConnectFields;
use crate::sources::decode::RowMeta;

/// Lines of one file and the steps they hold.
pub struct Chunk {
    /// The file's name in a directory (positions are `name:offset`), or
    /// `None` when the source is one file (positions are offsets).
    pub file: Option<String>,
    /// The file's transport stream (its changes' `_stream`).
    pub stream: Arc<str>,
    /// The file's path, for messages.
    pub path: PathBuf,
    /// The lines' bytes, as read (UTF-8, checked by the framing stage).
    pub text: Vec<u8>,
    /// What to do, in order.
    pub steps: Vec<Step>,
}

/// A row image to decode: `text[start..end]` into table `table`.
pub struct RowImage {
    pub table: usize,
    pub kind: RowKind,
    pub start: usize,
    pub end: usize,
    pub commit_ts: Option<i64>,
    pub snapshot: bool,
    /// The line it is on (for messages).
    pub line: u64,
    /// The byte offset in the file where that line starts: the change's
    /// transport sequence.
    pub offset: u64,
    /// The encodings of the event's schema part, if it has one.
    pub connect: Option<Arc<ConnectFields>>,
}

/// One thing the decoding stage does.
pub enum Step {
    /// Decode a row image.
    Row(RowImage),
    /// The open transaction ends: its rows take the position `offset` (in
    /// the chunk's file).
    Close { offset: u64 },
    /// The closed transactions form a batch ending at `end`. The chunk
    /// ends with the line that closed it (only that line's steps follow).
    Take { end: FilePosition },
    /// The input is bad here: report it after everything before it.
    Fail(SourceError),
}

impl RowImage {
    /// What the decoder needs beside the image's text: the change file's
    /// coordinate is (`stream`, shard 0, the line's byte offset).
    pub fn meta<'a>(&'a self, stream: &'a Arc<str>) -> RowMeta<'a> {
        RowMeta {
            kind: self.kind,
            commit_ts: self.commit_ts,
            snapshot: self.snapshot,
            line: self.line,
            stream,
            shard: 0,
            sequence: self.offset as i64,
            message: MessageMeta::default(),
            connect: self.connect.as_ref(),
        }
    }
}

impl Chunk {
    /// An empty chunk of `file`, reusing `spare` buffers when given.
    pub fn new(
        file: Option<String>,
        stream: Arc<str>,
        path: PathBuf,
        spare: Option<(Vec<u8>, Vec<Step>)>,
    ) -> Self {
        let (mut text, mut steps) = spare.unwrap_or_default();
        text.clear();
        steps.clear();
        Chunk {
            file,
            stream,
            path,
            text,
            steps,
        }
    }
}
