//! The file source's positions: the byte offset of the next unread line,
//! and for a directory source the file it is in (`name:offset`; `offset`
//! for a single file). Totally ordered within one source: by file name,
//! then offset.

use std::cmp::Ordering;
use std::fmt;

use crate::position::{Position, PositionError, PositionKind, SourcePosition};

/// A file position: the byte offset of the next unread line, and for a
/// directory source the file it is in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FilePosition {
    pub file: Option<String>,
    pub offset: u64,
}

/// The file source's kind of position.
pub struct FilePositions;

/// The one [`FilePositions`].
pub static FILE_POSITIONS: FilePositions = FilePositions;

impl PositionKind for FilePositions {
    fn name(&self) -> &'static str {
        "file"
    }

    fn parse(&self, text: &str) -> Result<Position, PositionError> {
        let err = |reason: &str| PositionError::parse(self, text, reason);
        let (file, offset) = match text.rsplit_once(':') {
            Some((f, o)) if !f.is_empty() => (Some(f.to_string()), o),
            Some(_) => return Err(err("empty file name")),
            None => (None, text),
        };
        let offset = offset
            .parse::<u64>()
            .map_err(|_| err("the offset is not a number"))?;
        Ok(Position::new(FilePosition { file, offset }))
    }
}

/// Writes a file position's text: `name:offset` in a directory, `offset`
/// in a single file (the form [`FilePosition`] displays, for a writer that
/// reuses its buffer).
pub fn write_file_position(
    out: &mut impl fmt::Write,
    file: Option<&str>,
    offset: u64,
) -> fmt::Result {
    match file {
        Some(name) => write!(out, "{name}:{offset}"),
        None => write!(out, "{offset}"),
    }
}

impl fmt::Display for FilePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_file_position(f, self.file.as_deref(), self.offset)
    }
}

impl SourcePosition for FilePosition {
    fn kind(&self) -> &'static dyn PositionKind {
        &FILE_POSITIONS
    }

    /// By file name, then offset; a position with a file name and one
    /// without (a directory's and a single file's) are not ordered.
    fn partial_cmp(&self, other: &Position) -> Option<Ordering> {
        let other = other.downcast_ref::<FilePosition>()?;
        if self.file.is_some() != other.file.is_some() {
            return None;
        }
        Some(
            self.file
                .cmp(&other.file)
                .then(self.offset.cmp(&other.offset)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Position {
        FILE_POSITIONS.parse(s).unwrap()
    }

    #[test]
    fn text_forms_round_trip() {
        for s in ["1234", "part-0001.jsonl:77"] {
            assert_eq!(p(s).to_string(), s);
        }
        assert!(FILE_POSITIONS.parse("x").is_err());
        assert!(FILE_POSITIONS.parse(":5").is_err());
    }

    #[test]
    fn the_order_is_by_file_then_offset() {
        assert!(p("a.jsonl:900") < p("b.jsonl:1"));
        assert!(p("a.jsonl:1") < p("a.jsonl:2"));
        assert_eq!(p("5").partial_cmp(&p("a:5")), None);
        assert_eq!(p("1").join(&p("a:1")), None);
        assert_eq!(p("3").join(&p("7")), Some(p("7")));
    }
}
