//! Source positions: where a source has read up to. The contract every
//! source kind fulfils — its own position type (in its folder), with a text
//! form (what sinks store), a parse, and an order that may be partial — and
//! what the runner does with positions of any kind.
//!
//! A committed position means "everything up to and including here is in
//! the sink". Folding several positions into the one to resume from
//! ([`min_safe`]) is defined or an error — never a guess.

use std::any::Any;
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// A source kind's positions as text: their name in messages and their
/// parse. Each source kind has one ([`SourceKind::position_kind`]), which
/// the runner uses to read what the sinks hold.
///
/// [`SourceKind::position_kind`]: crate::sources::SourceKind::position_kind
pub trait PositionKind: Send + Sync + 'static {
    /// The kind's name in messages (`LSN`, `offsets`, `file`).
    fn name(&self) -> &'static str;
    /// Parses the text form of one of the kind's positions.
    fn parse(&self, text: &str) -> Result<Position, PositionError>;
}

/// One position of a source kind, the type its folder defines. Its
/// `Display` is its text form (what [`PositionKind::parse`] reads back) and
/// must be canonical: two equal positions print alike.
pub trait SourcePosition: fmt::Display + fmt::Debug + Send + Sync + Any {
    /// The kind it belongs to.
    fn kind(&self) -> &'static dyn PositionKind;
    /// The order against `other` (`None`: not ordered, or another kind —
    /// [`Position::downcast_ref`] finds out).
    fn partial_cmp(&self, other: &Position) -> Option<Ordering>;
    /// For a partially ordered kind, the least position at or after two
    /// unordered ones (what a route holds once it has committed both).
    /// `None` (the default): there is none.
    fn join_unordered(&self, _other: &Position) -> Option<Position> {
        None
    }
    /// For a partially ordered kind, the greatest position at or before two
    /// unordered ones (where to resume so that neither skips anything).
    /// `None` (the default): there is none.
    fn meet_unordered(&self, _other: &Position) -> Option<Position> {
        None
    }
}

/// A source position of any kind: what batches carry, sinks commit (as
/// text) and the runner compares and folds.
#[derive(Clone)]
pub struct Position(Arc<dyn SourcePosition>);

/// A position that cannot be parsed or folded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionError {
    #[error("`{text}` is not a {kind} position: {reason}")]
    Parse {
        kind: &'static str,
        text: String,
        reason: String,
    },
    #[error("no safe resume point: {0}")]
    Undefined(String),
}

impl PositionError {
    /// A parse error of `kind` for `text`.
    pub fn parse(kind: &dyn PositionKind, text: &str, reason: &str) -> PositionError {
        PositionError::Parse {
            kind: kind.name(),
            text: text.to_string(),
            reason: reason.to_string(),
        }
    }
}

impl Position {
    /// Wraps a kind's position.
    pub fn new(position: impl SourcePosition) -> Position {
        Position(Arc::new(position))
    }

    /// The kind's own position, when this is one of `T`.
    pub fn downcast_ref<T: SourcePosition>(&self) -> Option<&T> {
        let any: &dyn Any = self.0.as_ref();
        any.downcast_ref::<T>()
    }

    /// The kind of this position.
    pub fn kind(&self) -> &'static dyn PositionKind {
        self.0.kind()
    }

    fn same_kind(&self, other: &Position) -> bool {
        self.kind().name() == other.kind().name()
    }

    /// The least position at or after both (`None` when there is none):
    /// the greater of two ordered positions; for offsets, the
    /// per-partition maximum. What a route holds once it has committed
    /// `other` on top of `self`.
    pub fn join(&self, other: &Position) -> Option<Position> {
        match self.partial_cmp(other) {
            Some(Ordering::Less) => Some(other.clone()),
            Some(_) => Some(self.clone()),
            None if self.same_kind(other) => self.0.join_unordered(other),
            None => None,
        }
    }

    /// The greatest position at or before both (`None` when there is
    /// none): the lesser of two ordered positions; for offsets, the
    /// per-partition minimum over the partitions both have read.
    pub fn meet(&self, other: &Position) -> Option<Position> {
        match self.partial_cmp(other) {
            Some(Ordering::Greater) => Some(other.clone()),
            Some(_) => Some(self.clone()),
            None if self.same_kind(other) => self.0.meet_unordered(other),
            None => None,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl PartialEq for Position {
    fn eq(&self, other: &Position) -> bool {
        self.partial_cmp(other) == Some(Ordering::Equal)
    }
}

impl Eq for Position {}

impl PartialOrd for Position {
    /// The kind's order; positions of different kinds are not ordered.
    fn partial_cmp(&self, other: &Position) -> Option<Ordering> {
        if !self.same_kind(other) {
            return None;
        }
        self.0.partial_cmp(other)
    }
}

/// The position to resume from so that nothing any of `positions` has not
/// committed is skipped: the minimum for totally ordered kinds, the
/// per-partition minimum for offsets. Errors when the positions cannot be
/// folded (mixed kinds, a file position with and without a file name).
pub fn min_safe(positions: &[Position]) -> Result<Option<Position>, PositionError> {
    let Some(first) = positions.first() else {
        return Ok(None);
    };
    if let Some(other) = positions.iter().find(|p| !p.same_kind(first)) {
        return Err(PositionError::Undefined(format!(
            "positions of different kinds ({first} is {}, {other} is {})",
            first.kind().name(),
            other.kind().name()
        )));
    }
    let mut min = first.clone();
    for p in &positions[1..] {
        min = min
            .meet(p)
            .ok_or_else(|| PositionError::Undefined(format!("{min} and {p} cannot be ordered")))?;
    }
    Ok(Some(min))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::file::position::FILE_POSITIONS;
    use crate::sources::kafka::offsets::OFFSETS;
    use crate::sources::postgres::position::LSN_POSITIONS;

    fn p(kind: &dyn PositionKind, s: &str) -> Position {
        kind.parse(s).unwrap()
    }

    #[test]
    fn min_safe_is_defined_or_an_error() {
        let got = min_safe(&[p(&LSN_POSITIONS, "0/20"), p(&LSN_POSITIONS, "0/10")]).unwrap();
        assert_eq!(got, Some(p(&LSN_POSITIONS, "0/10")));
        let got = min_safe(&[
            p(&OFFSETS, "t:p0=10,p1=20"),
            p(&OFFSETS, "t:p0=9,p1=25;u:p0=3"),
        ])
        .unwrap();
        assert_eq!(got, Some(p(&OFFSETS, "t:p0=9,p1=20")));
        // Three routes: a partition one of them has not read is left out.
        let got = min_safe(&[
            p(&OFFSETS, "t:p0=10,p1=20;u:p0=4"),
            p(&OFFSETS, "t:p0=9,p1=25;u:p0=3"),
            p(&OFFSETS, "t:p0=12,p1=21"),
        ])
        .unwrap();
        assert_eq!(got, Some(p(&OFFSETS, "t:p0=9,p1=20")));
        let mixed = min_safe(&[p(&LSN_POSITIONS, "0/1"), p(&FILE_POSITIONS, "1")]);
        assert!(
            matches!(&mixed, Err(PositionError::Undefined(m)) if m.contains("LSN") && m.contains("file")),
            "{mixed:?}"
        );
        assert!(min_safe(&[p(&FILE_POSITIONS, "1"), p(&FILE_POSITIONS, "a:1")]).is_err());
        assert_eq!(min_safe(&[]).unwrap(), None);
    }

    #[test]
    fn kinds_are_kept_apart() {
        let lsn = p(&LSN_POSITIONS, "0/5");
        let file = p(&FILE_POSITIONS, "5");
        assert_eq!(lsn.partial_cmp(&file), None);
        assert_ne!(lsn, file);
        assert!(lsn.join(&file).is_none());
        assert!(
            lsn.downcast_ref::<crate::sources::file::position::FilePosition>()
                .is_none()
        );
        assert_eq!(
            lsn.downcast_ref::<crate::sources::postgres::position::LsnPosition>()
                .map(|l| l.0),
            Some(5)
        );
    }
}
