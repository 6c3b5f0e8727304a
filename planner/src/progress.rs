//! The commit mark: what a sink stores as a table's committed position.
//!
//! For most routes it is just the source position's text. A source that
//! copies its tables first (an initial snapshot) adds the table's snapshot
//! progress, so the progress is committed atomically with the rows it
//! describes — a crash mid-snapshot resumes from the last committed chunk,
//! never trusts rows that were not committed. Sinks store the mark as one
//! text; a sink with richer metadata may split it (Iceberg writes
//! `cdc.position`, `cdc.snapshot.state` and `cdc.snapshot.bounds`).
//!
//! Text form: `<position>` or `<position>#snapshot=<state>` where state is
//! `not_started`, `complete`, or `in_progress` optionally followed by
//! `:<JSON array of the last copied key's values>`. A source position never
//! ends like a snapshot state (file positions end in an offset, LSNs and
//! offsets in digits), so the split is unambiguous.

use std::fmt;

/// The separator between the position and the snapshot progress.
const SNAPSHOT_TAG: &str = "#snapshot=";

/// How far a table's initial snapshot has come.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SnapshotProgress {
    /// Nothing copied yet (or a copy that must start over).
    NotStarted,
    /// Copied, in key order, up to and including `after` (the primary key
    /// values' text); `None` when no chunk has been committed yet.
    InProgress { after: Option<Vec<String>> },
    /// Every row was copied.
    Complete,
}

impl SnapshotProgress {
    /// The state's name, as `cdc.snapshot.state` holds it.
    pub fn state(&self) -> &'static str {
        match self {
            SnapshotProgress::NotStarted => "not_started",
            SnapshotProgress::InProgress { .. } => "in_progress",
            SnapshotProgress::Complete => "complete",
        }
    }

    /// The bounds as `cdc.snapshot.bounds` holds them: the JSON array of
    /// the last copied key, when there is one.
    pub fn bounds(&self) -> Option<String> {
        match self {
            SnapshotProgress::InProgress { after: Some(key) } => {
                Some(serde_json::to_string(key).expect("strings serialize"))
            }
            _ => None,
        }
    }

    /// The progress from its state name and bounds (`None`: not a state).
    pub fn from_parts(state: &str, bounds: Option<&str>) -> Option<SnapshotProgress> {
        match (state, bounds) {
            ("not_started", None) => Some(SnapshotProgress::NotStarted),
            ("complete", None) => Some(SnapshotProgress::Complete),
            ("in_progress", None) => Some(SnapshotProgress::InProgress { after: None }),
            ("in_progress", Some(b)) => serde_json::from_str::<Vec<String>>(b)
                .ok()
                .filter(|k| !k.is_empty())
                .map(|k| SnapshotProgress::InProgress { after: Some(k) }),
            _ => None,
        }
    }

    /// True once the table's rows have all been copied.
    pub fn is_complete(&self) -> bool {
        matches!(self, SnapshotProgress::Complete)
    }
}

/// A committed position with the table's snapshot progress, if the source
/// snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitMark {
    pub position: String,
    pub snapshot: Option<SnapshotProgress>,
}

impl CommitMark {
    /// Splits a mark's text (a plain position is a mark without progress).
    pub fn parse(text: &str) -> CommitMark {
        // The first tag whose remainder is a valid progress: a key value
        // may contain the tag, and so may a file name (then followed by
        // an offset, which is no progress).
        for (at, _) in text.match_indices(SNAPSHOT_TAG) {
            let rest = &text[at + SNAPSHOT_TAG.len()..];
            let (state, bounds) = match rest.split_once(':') {
                Some((s, b)) => (s, Some(b)),
                None => (rest, None),
            };
            if let Some(progress) = SnapshotProgress::from_parts(state, bounds) {
                return CommitMark {
                    position: text[..at].to_string(),
                    snapshot: Some(progress),
                };
            }
        }
        CommitMark {
            position: text.to_string(),
            snapshot: None,
        }
    }

    /// The position part of a mark's text.
    pub fn position_of(text: &str) -> String {
        CommitMark::parse(text).position
    }
}

impl fmt::Display for CommitMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.position)?;
        if let Some(s) = &self.snapshot {
            write!(f, "{SNAPSHOT_TAG}{}", s.state())?;
            if let Some(b) = s.bounds() {
                write!(f, ":{b}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip() {
        for mark in [
            CommitMark {
                position: "16/B374D848".into(),
                snapshot: None,
            },
            CommitMark {
                position: "0/1A".into(),
                snapshot: Some(SnapshotProgress::NotStarted),
            },
            CommitMark {
                position: "0/1A".into(),
                snapshot: Some(SnapshotProgress::InProgress { after: None }),
            },
            CommitMark {
                position: "0/1A".into(),
                snapshot: Some(SnapshotProgress::InProgress {
                    after: Some(vec!["42".into(), "a:b\"#snapshot=complete".into()]),
                }),
            },
            CommitMark {
                position: "0/1A".into(),
                snapshot: Some(SnapshotProgress::Complete),
            },
        ] {
            assert_eq!(CommitMark::parse(&mark.to_string()), mark, "{mark}");
        }
    }

    #[test]
    fn plain_positions_are_not_split() {
        // A file named like a mark still ends in its offset.
        for text in ["x#snapshot=complete:5", "orders:p0=10", "123"] {
            let m = CommitMark::parse(text);
            assert_eq!(m.position, text);
            assert_eq!(m.snapshot, None);
        }
        assert_eq!(
            CommitMark::position_of("0/5#snapshot=in_progress:[\"7\"]"),
            "0/5"
        );
    }
}
