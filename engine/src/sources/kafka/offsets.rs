//! The Kafka source's positions: an offset per topic partition, written
//! `topic:p0=10,p1=20;topic2:p0=5` (the offset of the next message to
//! read). Partially ordered: one position is before another only when no
//! partition is ahead; unordered ones join (a route that committed both)
//! and meet (where to resume so that neither skips anything) partition by
//! partition.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use crate::position::{Position, PositionError, PositionKind, SourcePosition};

/// Kafka offsets: topic -> partition -> offset of the next message to
/// read. A partition absent from the map has not been read at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Offsets(pub BTreeMap<String, BTreeMap<i32, i64>>);

/// The Kafka source's kind of position.
pub struct OffsetPositions;

/// The one [`OffsetPositions`].
pub static OFFSETS: OffsetPositions = OffsetPositions;

impl PositionKind for OffsetPositions {
    fn name(&self) -> &'static str {
        "offsets"
    }

    fn parse(&self, text: &str) -> Result<Position, PositionError> {
        let err = |reason: &str| PositionError::parse(self, text, reason);
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
                let (id, off) = p.split_once('=').ok_or_else(|| err("expected pN=offset"))?;
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
        // A topic with no partition read is one not read at all: dropped,
        // so that equal positions print alike.
        topics.retain(|_, parts: &mut BTreeMap<i32, i64>| !parts.is_empty());
        Ok(Position::new(Offsets(topics)))
    }
}

impl fmt::Display for Offsets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (topic, parts)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{topic}:")?;
            for (j, (p, off)) in parts.iter().enumerate() {
                if j > 0 {
                    f.write_str(",")?;
                }
                write!(f, "p{p}={off}")?;
            }
        }
        Ok(())
    }
}

impl Offsets {
    fn get(&self, topic: &str, partition: i32) -> Option<i64> {
        self.0.get(topic).and_then(|ps| ps.get(&partition)).copied()
    }
}

impl SourcePosition for Offsets {
    fn kind(&self) -> &'static dyn PositionKind {
        &OFFSETS
    }

    /// Before another only when no partition is ahead (an absent partition
    /// is before any offset); topics are kept apart (the Go engine once
    /// keyed by partition only).
    fn partial_cmp(&self, other: &Position) -> Option<Ordering> {
        let other = other.downcast_ref::<Offsets>()?;
        let keys: std::collections::BTreeSet<(&String, &i32)> = self
            .0
            .iter()
            .chain(other.0.iter())
            .flat_map(|(t, ps)| ps.keys().map(move |p| (t, p)))
            .collect();
        let mut ord = Ordering::Equal;
        for (t, p) in keys {
            let c = self.get(t, *p).cmp(&other.get(t, *p)); // None < Some(_)
            match (ord, c) {
                (_, Ordering::Equal) => {}
                (Ordering::Equal, c) => ord = c,
                (o, c) if o != c => return None,
                _ => {}
            }
        }
        Some(ord)
    }

    /// The per-partition maximum.
    fn join_unordered(&self, other: &Position) -> Option<Position> {
        let other = other.downcast_ref::<Offsets>()?;
        let mut out = self.0.clone();
        for (t, ps) in &other.0 {
            let e = out.entry(t.clone()).or_default();
            for (p, o) in ps {
                let v = e.entry(*p).or_insert(*o);
                *v = (*v).max(*o);
            }
        }
        Some(Position::new(Offsets(out)))
    }

    /// The per-partition minimum over the partitions both have read; a
    /// partition one of them has not read at all is read from its start
    /// (left out).
    fn meet_unordered(&self, other: &Position) -> Option<Position> {
        let other = other.downcast_ref::<Offsets>()?;
        let mut out: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for (t, ps) in &self.0 {
            for (p, o) in ps {
                if let Some(theirs) = other.get(t, *p) {
                    out.entry(t.clone())
                        .or_default()
                        .insert(*p, (*o).min(theirs));
                }
            }
        }
        Some(Position::new(Offsets(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Position {
        OFFSETS.parse(s).unwrap()
    }

    #[test]
    fn text_forms_round_trip() {
        for s in ["orders:p0=10,p1=20;payments:p0=5", "t:p3=0", ""] {
            assert_eq!(p(s).to_string(), s);
        }
        assert!(OFFSETS.parse("t:p0=1,p0=2").is_err());
        assert!(OFFSETS.parse("t:p0=1;t:p1=2").is_err());
        assert!(OFFSETS.parse(":p0=1").is_err());
        assert!(OFFSETS.parse("t:p0=x").is_err());
        assert_eq!(p("t:;u:p1=2").to_string(), "u:p1=2");
    }

    #[test]
    fn offsets_are_partially_ordered() {
        let a = p("t:p0=10,p1=20");
        let b = p("t:p0=11,p1=20");
        let c = p("t:p0=9,p1=25");
        assert!(a < b);
        assert_eq!(a.partial_cmp(&c), None);
        // Topics are kept apart (the Go engine once keyed by partition only).
        let d = p("t:p0=10;u:p0=1");
        assert!(a.partial_cmp(&d).is_none());
        assert!(p("t:p0=10") < p("t:p0=10;u:p0=0"));
    }

    #[test]
    fn join_is_the_per_partition_maximum_and_meet_the_minimum() {
        let a = p("t:p0=10,p1=20");
        let b = p("t:p0=15,p1=7;u:p0=3");
        assert_eq!(a.join(&b), Some(p("t:p0=15,p1=20;u:p0=3")));
        assert_eq!(a.meet(&b), Some(p("t:p0=10,p1=7")));
        // Ordered ones: the greater and the lesser.
        let c = p("t:p0=10,p1=20;u:p0=0");
        assert_eq!(a.join(&c), Some(c.clone()));
        assert_eq!(a.meet(&c), Some(a.clone()));
    }
}
