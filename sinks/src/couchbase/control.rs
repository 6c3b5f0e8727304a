//! The control document: one per collection, key [`CONTROL_KEY`], holding
//! the committed position (`{position, updated_at, properties}`), so resume
//! is one KV get, never a scan.
//!
//! `properties` holds the snapshot progress the other sinks keep
//! (`cdc.snapshot.state`, `cdc.snapshot.bounds`). An atomic sink adds its
//! commit record ([`Pending`]) and its batch counter; a partitioned table
//! (workers > 1) keeps one [`OwnerMark`] per owner under `owners` and
//! resumes from the owner furthest behind.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use urutau_planner::progress::{CommitMark, SnapshotProgress};

/// The control document's key. Data keys are JSON arrays (`[42]`), so no
/// data document can take it.
pub const CONTROL_KEY: &str = "_urutau::position";

/// A table's position, as one owner committed it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerMark {
    pub position: String,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Batches this owner committed (atomic mode); orders the owners.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub batch: u64,
    /// The newest committed batch, whose journal a restart applies again
    /// (atomic mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
}

/// The commit record of an atomic batch: its journal documents, which a
/// restart applies again (idempotent) before anything else happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub batch: u64,
    pub chunks: u32,
    pub documents: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The control document's body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    #[serde(flatten)]
    pub mark: OwnerMark,
    #[serde(default)]
    pub updated_at: String,
    /// Partitioned tables: owner number -> its mark (`mark` is then unused).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub owners: BTreeMap<String, OwnerMark>,
}

impl OwnerMark {
    /// The mark of a commit at `mark_text` (a position with the snapshot
    /// progress, if any).
    pub fn set(&mut self, mark_text: &str) {
        let mark = CommitMark::parse(mark_text);
        self.position = mark.position;
        self.properties.clear();
        if let Some(s) = mark.snapshot {
            self.properties
                .insert("cdc.snapshot.state".into(), s.state().into());
            if let Some(b) = s.bounds() {
                self.properties.insert("cdc.snapshot.bounds".into(), b);
            }
        }
    }

    /// The mark's text as the runner reads it back.
    pub fn text(&self) -> String {
        let snapshot = self.properties.get("cdc.snapshot.state").and_then(|s| {
            SnapshotProgress::from_parts(
                s,
                self.properties
                    .get("cdc.snapshot.bounds")
                    .map(String::as_str),
            )
        });
        CommitMark {
            position: self.position.clone(),
            snapshot,
        }
        .to_string()
    }
}

impl Control {
    /// The owner's mark of a partitioned table, or the table's own.
    pub fn owner(&self, owner: Option<u32>) -> Option<&OwnerMark> {
        match owner {
            None => Some(&self.mark),
            Some(o) => self.owners.get(&o.to_string()),
        }
    }

    /// The owner's mark, created when absent.
    pub fn owner_mut(&mut self, owner: Option<u32>) -> &mut OwnerMark {
        match owner {
            None => &mut self.mark,
            Some(o) => self.owners.entry(o.to_string()).or_default(),
        }
    }

    /// Where the table resumes: its mark, or for `workers` owners the mark
    /// of the owner furthest behind (fewest batches); `None` while any
    /// owner has committed nothing (it resumes from the start).
    pub fn resume(&self, workers: u32) -> Option<String> {
        if workers <= 1 {
            return (!self.mark.position.is_empty()).then(|| self.mark.text());
        }
        let mut behind: Option<&OwnerMark> = None;
        for o in 0..workers {
            let m = self.owners.get(&o.to_string())?;
            if behind.is_none_or(|b| m.batch < b.batch) {
                behind = Some(m);
            }
        }
        behind.map(OwnerMark::text)
    }

    /// The body as stored, stamped now.
    pub fn to_json(&mut self) -> Vec<u8> {
        self.updated_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        serde_json::to_vec(self).expect("the control document serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_keep_snapshot_progress_as_properties() {
        let mut m = OwnerMark::default();
        m.set("0/1A#snapshot=in_progress:[\"7\"]");
        assert_eq!(m.position, "0/1A");
        assert_eq!(m.properties["cdc.snapshot.state"], "in_progress");
        assert_eq!(m.properties["cdc.snapshot.bounds"], "[\"7\"]");
        assert_eq!(m.text(), "0/1A#snapshot=in_progress:[\"7\"]");
        m.set("0/1B");
        assert!(m.properties.is_empty());
        assert_eq!(m.text(), "0/1B");
    }

    #[test]
    fn control_documents_round_trip_and_resume_from_the_owner_behind() {
        let mut c = Control::default();
        assert_eq!(c.resume(1), None);
        c.mark.set("f.jsonl:100");
        let back: Control = serde_json::from_slice(&c.to_json()).unwrap();
        assert_eq!(back.mark, c.mark);
        assert_eq!(back.resume(1).as_deref(), Some("f.jsonl:100"));
        let v: serde_json::Value = serde_json::from_slice(&c.to_json()).unwrap();
        assert_eq!(v["position"], "f.jsonl:100");
        assert!(v["updated_at"].as_str().unwrap().ends_with('Z'));

        let mut p = Control::default();
        p.owner_mut(Some(0)).set("p:5");
        p.owner_mut(Some(0)).batch = 5;
        assert_eq!(p.resume(2), None, "owner 1 has committed nothing");
        p.owner_mut(Some(1)).set("p:4");
        p.owner_mut(Some(1)).batch = 4;
        assert_eq!(p.resume(2).as_deref(), Some("p:4"));
    }
}
