//! The seeded random change stream the sink suites share: Debezium JSON
//! lines over one table of every column kind, and the oracle's final state.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

pub const COLUMNS: &str =
    "id BIGINT NOT NULL, name VARCHAR, amount DECIMAL(12,2), qty INT, ratio DOUBLE, active BOOLEAN,
  born DATE, seen TIMESTAMPTZ, uid UUID, raw BYTEA, attrs STRUCT<color VARCHAR, size INT>,
  tags LIST<VARCHAR>, props MAP<VARCHAR, BIGINT>, PRIMARY KEY (id)";

/// One row: the source JSON image and what DuckDB renders for it.
#[derive(Clone)]
pub struct Row {
    pub source: Value,
    /// What DuckDB renders for it.
    pub read: Value,
}

pub fn maybe<T>(rng: &mut StdRng, f: impl FnOnce(&mut StdRng) -> T) -> Option<T> {
    if rng.random_bool(0.12) {
        None
    } else {
        Some(f(rng))
    }
}

/// A random row for key `id`: every nullable column sometimes NULL,
/// decimals at their bounds, unicode, pre-1970 times, nested values.
pub fn random_row(rng: &mut StdRng, id: i64) -> Row {
    let name = maybe(rng, |r| {
        ["ünïcødé ✓ 日本", "plain", "quote \" and \\", "", "emoji 🦀"][r.random_range(0..5)]
            .to_string()
    });
    let amount = maybe(rng, |r| {
        let cents: i64 = match r.random_range(0..6) {
            0 => 999_999_999_999,
            1 => -999_999_999_999,
            2 => 0,
            _ => r.random_range(-1_000_000..1_000_000),
        };
        format!(
            "{}{}.{:02}",
            if cents < 0 { "-" } else { "" },
            cents.abs() / 100,
            cents.abs() % 100
        )
    });
    let qty = maybe(rng, |r| {
        [i32::MIN, i32::MAX, 0, r.random_range(-500..500)][r.random_range(0..4)]
    });
    let ratio = maybe(rng, |r| r.random_range(-1e6..1e6f64) + 0.5);
    let active = maybe(rng, |r| r.random_bool(0.5));
    let born = maybe(rng, |r| {
        chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()
            + chrono::Duration::days(r.random_range(-20_000..20_000i64))
    });
    let seen = maybe(rng, |r| {
        chrono::DateTime::from_timestamp_micros(
            r.random_range(-2_000_000_000_000_000i64..2_000_000_000_000_000),
        )
        .unwrap()
    });
    let uid = maybe(rng, |r| uuid::Uuid::from_u128(r.random()));
    let raw = maybe(rng, |r| {
        let n = r.random_range(0..8);
        (0..n).map(|_| r.random::<u8>()).collect::<Vec<u8>>()
    });
    let attrs = maybe(rng, |r| {
        let color = maybe(r, |r| format!("c{}", r.random_range(0..9)));
        let size = maybe(r, |r| r.random_range(0..99i32));
        (color, size)
    });
    let tags = maybe(rng, |r| {
        let n = r.random_range(0..4);
        (0..n)
            .map(|i| maybe(r, |_| format!("t{i}")))
            .collect::<Vec<_>>()
    });
    let props = maybe(rng, |r| {
        let n = r.random_range(0..3);
        (0..n)
            .map(|i| (format!("k{i}"), maybe(r, |r| r.random_range(-9..9i64))))
            .collect::<Vec<_>>()
    });
    let ts_text = |t: &chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string();
    let source = json!({
        "id": id,
        "name": name,
        "amount": amount,
        "qty": qty,
        "ratio": ratio,
        "active": active,
        "born": born.map(|d| d.to_string()),
        "seen": seen.map(|t| format!("{}Z", ts_text(&t))),
        "uid": uid.map(|u| u.to_string()),
        "raw": raw.as_ref().map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
        "attrs": attrs.as_ref().map(|(c, s)| json!({"color": c, "size": s})),
        "tags": tags,
        "props": props.as_ref().map(|p| p.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>()),
    });
    let read = json!({
        "id": id,
        "name": name,
        "amount": amount,
        "qty": qty,
        "ratio": ratio,
        "active": active,
        "born": born.map(|d| d.to_string()),
        "seen": seen.map(|t| format!("{}+00:00", ts_text(&t))),
        "uid": uid.map(|u| u.to_string()),
        "raw": raw.as_ref().map(hex::encode),
        "attrs": attrs.as_ref().map(|(c, s)| json!({"color": c, "size": s})),
        "tags": tags,
        "props": props.as_ref().map(|p| json!({
            "keys": p.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
            "values": p.iter().map(|(_, v)| json!(v)).collect::<Vec<_>>(),
        })),
    });
    Row { source, read }
}

pub fn event(
    op: &str,
    before: Option<&Row>,
    after: Option<&Row>,
    tx: Option<u64>,
    ts: i64,
) -> String {
    let mut source = json!({"table": "items", "ts_ms": ts});
    if let Some(tx) = tx {
        source["txId"] = json!(tx);
    }
    json!({"op": op, "before": before.map(|r| &r.source), "after": after.map(|r| &r.source), "source": source}).to_string()
}

/// A seeded change stream over `keys` keys: snapshot rows, inserts, updates
/// (some changing the key), deletes, re-inserts of deleted keys,
/// multi-row transactions. Returns the lines and the final state.
pub fn workload(seed: u64, changes: usize, keys: i64) -> (Vec<String>, BTreeMap<i64, Row>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state: BTreeMap<i64, Row> = BTreeMap::new();
    let mut lines = Vec::new();
    let mut ts = 1_700_000_000_000i64;
    // An initial snapshot of a third of the keys.
    for id in (1..=keys).step_by(3) {
        let r = random_row(&mut rng, id);
        lines.push(event("r", None, Some(&r), None, ts));
        state.insert(id, r);
    }
    let mut tx: Option<(u64, u32)> = None;
    let mut tx_id = 9000;
    while lines.len() < changes {
        ts += 1;
        if tx.is_none() && rng.random_bool(0.05) {
            tx_id += 1;
            tx = Some((tx_id, rng.random_range(2..20)));
        }
        let this_tx = tx.map(|(id, _)| id);
        if let Some((id, left)) = tx {
            tx = if left <= 1 {
                None
            } else {
                Some((id, left - 1))
            };
        }
        let id = rng.random_range(1..=keys);
        let line = match state.get(&id).cloned() {
            None => {
                let r = random_row(&mut rng, id);
                state.insert(id, r.clone());
                event("c", None, Some(&r), this_tx, ts)
            }
            Some(old) => match rng.random_range(0..100) {
                0..20 => {
                    state.remove(&id);
                    event("d", Some(&old), None, this_tx, ts)
                }
                20..26 => {
                    let new_id = rng.random_range(1..=keys);
                    if state.contains_key(&new_id) {
                        continue;
                    }
                    let r = random_row(&mut rng, new_id);
                    state.remove(&id);
                    state.insert(new_id, r.clone());
                    event("u", Some(&old), Some(&r), this_tx, ts)
                }
                _ => {
                    let r = random_row(&mut rng, id);
                    state.insert(id, r.clone());
                    event("u", Some(&old), Some(&r), this_tx, ts)
                }
            },
        };
        lines.push(line);
    }
    (lines, state)
}

pub fn write_lines(path: &Path, lines: &[String]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

/// Appends `lines` to the file a run reads (more input for a later run).
pub fn append_lines(path: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

/// Classifies the differences between what a reader read and the oracle
/// (rows keyed by `id`).
pub fn differences(read: &[Value], expected: &[Value]) -> Vec<String> {
    let by_id = |rows: &[Value]| -> BTreeMap<i64, Vec<Value>> {
        let mut m: BTreeMap<i64, Vec<Value>> = BTreeMap::new();
        for r in rows {
            m.entry(r["id"].as_i64().unwrap())
                .or_default()
                .push(r.clone());
        }
        m
    };
    let (got, want) = (by_id(read), by_id(expected));
    let mut out = Vec::new();
    for (id, rows) in &got {
        match want.get(id) {
            None => out.push(format!("extra or resurrected key {id}: {}", rows[0])),
            Some(_) if rows.len() > 1 => {
                out.push(format!("duplicated key {id} ({} rows)", rows.len()))
            }
            Some(w) if rows[0] != w[0] => out.push(format!(
                "stale or incorrect key {id}:\n  read {}\n  want {}",
                rows[0], w[0]
            )),
            Some(_) => {}
        }
    }
    for id in want.keys() {
        if !got.contains_key(id) {
            out.push(format!("missing key {id}"));
        }
    }
    out
}
