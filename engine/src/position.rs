//! Source positions: where a source has read up to, per source kind, with a
//! text form (what sinks store), a parse, and an order that may be partial.
//!
//! A committed position means "everything up to and including here is in
//! the sink". Folding several positions into the one to resume from
//! ([`min_safe`]) is defined or an error — never a guess.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

/// Which kind of position a source produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionKind {
    /// File source: byte offset of the next unread line (per file in a
    /// directory).
    File,
    /// Postgres: a WAL LSN (`X/Y`).
    Lsn,
    /// Kafka-like transports: an offset per topic partition.
    Offsets,
}

/// A file position: the byte offset of the next unread line, and for a
/// directory source the file it is in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FilePosition {
    pub file: Option<String>,
    pub offset: u64,
}

/// Kafka-like offsets: topic -> partition -> offset of the next message to
/// read. A partition absent from the map has not been read at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Offsets(pub BTreeMap<String, BTreeMap<i32, i64>>);

/// A source position.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Position {
    File(FilePosition),
    Lsn(u64),
    Offsets(Offsets),
}

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

impl PositionKind {
    /// The kind's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            PositionKind::File => "file",
            PositionKind::Lsn => "LSN",
            PositionKind::Offsets => "offsets",
        }
    }
}

impl Position {
    /// Parses the text form of a position of `kind`.
    pub fn parse(kind: PositionKind, text: &str) -> Result<Position, PositionError> {
        let err = |reason: &str| PositionError::Parse {
            kind: kind.name(),
            text: text.to_string(),
            reason: reason.to_string(),
        };
        match kind {
            PositionKind::File => {
                let (file, offset) = match text.rsplit_once(':') {
                    Some((f, o)) if !f.is_empty() => (Some(f.to_string()), o),
                    Some(_) => return Err(err("empty file name")),
                    None => (None, text),
                };
                let offset = offset
                    .parse::<u64>()
                    .map_err(|_| err("the offset is not a number"))?;
                Ok(Position::File(FilePosition { file, offset }))
            }
            PositionKind::Lsn => {
                let (hi, lo) = text.split_once('/').ok_or_else(|| err("expected X/Y"))?;
                let hi = u32::from_str_radix(hi, 16).map_err(|_| err("bad high half"))?;
                let lo = u32::from_str_radix(lo, 16).map_err(|_| err("bad low half"))?;
                Ok(Position::Lsn(((hi as u64) << 32) | lo as u64))
            }
            PositionKind::Offsets => {
                let mut topics = BTreeMap::new();
                for part in text.split(';').filter(|p| !p.is_empty()) {
                    let (topic, partitions) = part
                        .rsplit_once(':')
                        .ok_or_else(|| err("expected topic:p0=N,..."))?;
                    if topic.is_empty() {
                        return Err(err("empty topic"));
                    }
                    let mut map = BTreeMap::new();
                    for p in partitions.split(',').filter(|p| !p.is_empty()) {
                        let (id, off) =
                            p.split_once('=').ok_or_else(|| err("expected pN=offset"))?;
                        let id: i32 = id
                            .trim_start_matches('p')
                            .parse()
                            .map_err(|_| err("bad partition"))?;
                        let off: i64 = off.parse().map_err(|_| err("bad offset"))?;
                        if map.insert(id, off).is_some() {
                            return Err(err("a partition appears twice"));
                        }
                    }
                    if topics.insert(topic.to_string(), map).is_some() {
                        return Err(err("a topic appears twice"));
                    }
                }
                Ok(Position::Offsets(Offsets(topics)))
            }
        }
    }

    /// The least position at or after both (`None` when they cannot be
    /// ordered or joined): for offsets, the per-partition maximum. What a
    /// route holds once it has committed `other` on top of `self`.
    pub fn join(&self, other: &Position) -> Option<Position> {
        match (self, other) {
            (Position::Offsets(a), Position::Offsets(b)) => {
                let mut out = a.0.clone();
                for (t, ps) in &b.0 {
                    let e = out.entry(t.clone()).or_default();
                    for (p, o) in ps {
                        let v = e.entry(*p).or_insert(*o);
                        *v = (*v).max(*o);
                    }
                }
                Some(Position::Offsets(Offsets(out)))
            }
            _ => match self.partial_cmp(other)? {
                Ordering::Less => Some(other.clone()),
                _ => Some(self.clone()),
            },
        }
    }

    /// The kind of this position.
    pub fn kind(&self) -> PositionKind {
        match self {
            Position::File(_) => PositionKind::File,
            Position::Lsn(_) => PositionKind::Lsn,
            Position::Offsets(_) => PositionKind::Offsets,
        }
    }
}

/// Writes a file position's text: `name:offset` in a directory, `offset`
/// in a single file (the form [`Position`] displays, for a writer that
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

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::File(p) => write_file_position(f, p.file.as_deref(), p.offset),
            Position::Lsn(lsn) => write!(f, "{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF),
            Position::Offsets(o) => {
                let topics: Vec<String> =
                    o.0.iter()
                        .map(|(t, ps)| {
                            let parts: Vec<String> =
                                ps.iter().map(|(p, off)| format!("p{p}={off}")).collect();
                            format!("{t}:{}", parts.join(","))
                        })
                        .collect();
                f.write_str(&topics.join(";"))
            }
        }
    }
}

impl PartialOrd for Position {
    /// Total for files of one source (by file name, then offset) and LSNs;
    /// partial for offsets: one position is before another only when no
    /// partition is ahead (an absent partition is before any offset).
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match (self, other) {
            (Position::File(a), Position::File(b)) => {
                if a.file.is_some() != b.file.is_some() {
                    return None;
                }
                Some(a.file.cmp(&b.file).then(a.offset.cmp(&b.offset)))
            }
            (Position::Lsn(a), Position::Lsn(b)) => Some(a.cmp(b)),
            (Position::Offsets(a), Position::Offsets(b)) => {
                let mut ord = Ordering::Equal;
                let keys: std::collections::BTreeSet<(&String, &i32)> =
                    a.0.iter()
                        .flat_map(|(t, ps)| ps.keys().map(move |p| (t, p)))
                        .chain(
                            b.0.iter()
                                .flat_map(|(t, ps)| ps.keys().map(move |p| (t, p))),
                        )
                        .collect();
                for (t, p) in keys {
                    let x = a.0.get(t).and_then(|ps| ps.get(p));
                    let y = b.0.get(t).and_then(|ps| ps.get(p));
                    let c = x.cmp(&y); // None < Some(_)
                    match (ord, c) {
                        (_, Ordering::Equal) => {}
                        (Ordering::Equal, c) => ord = c,
                        (o, c) if o != c => return None,
                        _ => {}
                    }
                }
                Some(ord)
            }
            _ => None,
        }
    }
}

/// The position to resume from so that nothing any of `positions` has not
/// committed is skipped: the minimum for totally ordered kinds, the
/// per-partition minimum for offsets. Errors when the positions cannot be
/// compared (mixed kinds, a file position with and without a file name).
pub fn min_safe(positions: &[Position]) -> Result<Option<Position>, PositionError> {
    let Some(first) = positions.first() else {
        return Ok(None);
    };
    if let Some(other) = positions.iter().find(|p| p.kind() != first.kind()) {
        return Err(PositionError::Undefined(format!(
            "positions of different kinds ({first} is {}, {other} is {})",
            first.kind().name(),
            other.kind().name()
        )));
    }
    match first {
        Position::Offsets(_) => {
            // Per partition: the smallest offset; a partition some position
            // has not read at all is read from its start (left out).
            let mut result: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
            let all: Vec<&Offsets> = positions
                .iter()
                .map(|p| match p {
                    Position::Offsets(o) => o,
                    _ => unreachable!("kinds checked"),
                })
                .collect();
            for (topic, parts) in &all[0].0 {
                for p in parts.keys() {
                    let offs: Option<Vec<i64>> = all
                        .iter()
                        .map(|o| o.0.get(topic).and_then(|ps| ps.get(p)).copied())
                        .collect();
                    if let Some(offs) = offs {
                        let min = *offs.iter().min().expect("non-empty");
                        result.entry(topic.clone()).or_default().insert(*p, min);
                    }
                }
            }
            Ok(Some(Position::Offsets(Offsets(result))))
        }
        _ => {
            let mut min = first;
            for p in &positions[1..] {
                match p.partial_cmp(min) {
                    Some(Ordering::Less) => min = p,
                    Some(_) => {}
                    None => {
                        return Err(PositionError::Undefined(format!(
                            "{min} and {p} cannot be ordered"
                        )));
                    }
                }
            }
            Ok(Some(min.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kind: PositionKind, s: &str) -> Position {
        Position::parse(kind, s).unwrap()
    }

    #[test]
    fn text_forms_round_trip() {
        for (k, s) in [
            (PositionKind::File, "1234"),
            (PositionKind::File, "part-0001.jsonl:77"),
            (PositionKind::Lsn, "16/B374D848"),
            (PositionKind::Offsets, "orders:p0=10,p1=20;payments:p0=5"),
        ] {
            assert_eq!(p(k, s).to_string(), s);
        }
        assert!(Position::parse(PositionKind::Lsn, "16B374D848").is_err());
        assert!(Position::parse(PositionKind::File, "x").is_err());
        assert!(Position::parse(PositionKind::Offsets, "t:p0=1,p0=2").is_err());
    }

    #[test]
    fn lsn_and_file_orders_are_total() {
        assert!(p(PositionKind::Lsn, "1/0") > p(PositionKind::Lsn, "0/FFFFFFFF"));
        assert!(p(PositionKind::File, "a.jsonl:900") < p(PositionKind::File, "b.jsonl:1"));
        assert_eq!(
            p(PositionKind::File, "5").partial_cmp(&p(PositionKind::File, "a:5")),
            None
        );
    }

    #[test]
    fn offsets_are_partially_ordered() {
        let a = p(PositionKind::Offsets, "t:p0=10,p1=20");
        let b = p(PositionKind::Offsets, "t:p0=11,p1=20");
        let c = p(PositionKind::Offsets, "t:p0=9,p1=25");
        assert!(a < b);
        assert_eq!(a.partial_cmp(&c), None);
        // Topics are kept apart (the Go engine once keyed by partition only).
        let d = p(PositionKind::Offsets, "t:p0=10;u:p0=1");
        assert!(a.partial_cmp(&d).is_none());
        assert!(p(PositionKind::Offsets, "t:p0=10") < p(PositionKind::Offsets, "t:p0=10;u:p0=0"));
    }

    #[test]
    fn join_is_the_per_partition_maximum() {
        let a = p(PositionKind::Offsets, "t:p0=10,p1=20");
        let b = p(PositionKind::Offsets, "t:p0=15,p1=7;u:p0=3");
        assert_eq!(
            a.join(&b),
            Some(p(PositionKind::Offsets, "t:p0=15,p1=20;u:p0=3"))
        );
        assert_eq!(
            p(PositionKind::Lsn, "0/10").join(&p(PositionKind::Lsn, "0/20")),
            Some(p(PositionKind::Lsn, "0/20"))
        );
        assert_eq!(
            p(PositionKind::File, "1").join(&p(PositionKind::File, "a:1")),
            None
        );
    }

    #[test]
    fn min_safe_is_defined_or_an_error() {
        let got = min_safe(&[p(PositionKind::Lsn, "0/20"), p(PositionKind::Lsn, "0/10")]).unwrap();
        assert_eq!(got, Some(p(PositionKind::Lsn, "0/10")));
        let got = min_safe(&[
            p(PositionKind::Offsets, "t:p0=10,p1=20"),
            p(PositionKind::Offsets, "t:p0=9,p1=25;u:p0=3"),
        ])
        .unwrap();
        assert_eq!(got, Some(p(PositionKind::Offsets, "t:p0=9,p1=20")));
        assert!(min_safe(&[p(PositionKind::Lsn, "0/1"), p(PositionKind::File, "1")]).is_err());
        assert!(min_safe(&[p(PositionKind::File, "1"), p(PositionKind::File, "a:1")]).is_err());
        assert_eq!(min_safe(&[]).unwrap(), None);
    }
}
