//! The Iceberg sink against a real SQL catalog (SQLite) and local
//! warehouse, read back by an independent engine (DuckDB's iceberg
//! extension, see tests/harness/iceberg_read.py).

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const COLUMNS: &str =
    "id BIGINT NOT NULL, name VARCHAR, amount DECIMAL(12,2), qty INT, ratio DOUBLE, active BOOLEAN,
  born DATE, seen TIMESTAMPTZ, uid UUID, raw BYTEA, attrs STRUCT<color VARCHAR, size INT>,
  tags LIST<VARCHAR>, props MAP<VARCHAR, BIGINT>, PRIMARY KEY (id)";

/// One row: the source JSON image and what DuckDB renders for it.
#[derive(Clone)]
struct Row {
    source: Value,
    read: Value,
}

fn maybe<T>(rng: &mut StdRng, f: impl FnOnce(&mut StdRng) -> T) -> Option<T> {
    if rng.random_bool(0.12) {
        None
    } else {
        Some(f(rng))
    }
}

/// A random row for key `id`: every nullable column sometimes NULL,
/// decimals at their bounds, unicode, pre-1970 times, nested values.
fn random_row(rng: &mut StdRng, id: i64) -> Row {
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

fn event(op: &str, before: Option<&Row>, after: Option<&Row>, tx: Option<u64>, ts: i64) -> String {
    let mut source = json!({"table": "items", "ts_ms": ts});
    if let Some(tx) = tx {
        source["txId"] = json!(tx);
    }
    json!({"op": op, "before": before.map(|r| &r.source), "after": after.map(|r| &r.source), "source": source}).to_string()
}

/// A seeded change stream over `keys` keys: snapshot rows, inserts, updates
/// (some changing the key), deletes, re-inserts of deleted keys,
/// multi-row transactions. Returns the lines and the final state.
fn workload(seed: u64, changes: usize, keys: i64) -> (Vec<String>, BTreeMap<i64, Row>) {
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

fn write_lines(path: &Path, lines: &[String]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

/// A pipeline: the file into Iceberg on SQLite, table `bronze.items`.
fn pipeline(dir: &Path, data: &Path, mode: &str, max_rows: usize) -> PathBuf {
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = {max_rows}, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK lake INTO iceberg WITH (
  catalog = 'sql', uri = 'sqlite://{dir}/catalog.db', warehouse = '{dir}/warehouse', namespace = 'bronze'
);
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE lake.items WITH (write_mode = '{mode}') AS SELECT * FROM src.items;
",
        data = data.display(),
        dir = dir.display()
    );
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

fn run_to_end(pipeline: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", pipeline.to_str().unwrap(), "--exit-when-caught-up"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn expected_rows(state: &BTreeMap<i64, Row>) -> Vec<Value> {
    state.values().map(|r| r.read.clone()).collect()
}

/// Classifies the differences between what DuckDB read and the oracle.
fn differences(read: &[Value], expected: &[Value]) -> Vec<String> {
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

fn metadata_json(location: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(location.trim_start_matches("file://")).unwrap())
        .unwrap()
}

#[tokio::test]
async fn quickstart_into_iceberg_is_read_back_by_duckdb() {
    let Some(python) = common::harness_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let shop = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/shop.jsonl");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lake.sql"))
            .unwrap()
            .replace(
                "CREATE PIPELINE lake;",
                "CREATE PIPELINE lake WITH (max_batch_rows = 1);",
            )
            .replace("examples/data/shop.jsonl", shop.to_str().unwrap())
            .replace(
                "sqlite://warehouse/catalog.db",
                &format!("sqlite://{}/catalog.db", dir.path().display()),
            )
            .replace(
                "warehouse = 'warehouse'",
                &format!("warehouse = '{}/wh'", dir.path().display()),
            );
    let p = dir.path().join("lake.sql");
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "bronze", "orders")
        .await
        .expect("the catalog holds the table");
    let rows = common::duckdb_rows(&python, &loc, "id");
    let summary: Vec<(i64, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["status"].as_str().unwrap().to_string(),
                r["amount"].to_string(),
            )
        })
        .collect();
    // Updated several times, deleted, re-inserted (1), key changed (4 -> 40),
    // filtered out after an update (2), never in (5: a test order).
    assert_eq!(
        summary,
        vec![
            (1, "new".into(), "\"7.50\"".into()),
            (3, "shipped".into(), "\"110.00\"".into()),
            (6, "new".into(), "null".into()),
            (40, "paid".into(), "\"42.42\"".into()),
        ]
    );
    let md = metadata_json(&loc);
    assert_eq!(md["properties"]["cdc.position"], "5173");
    // Partitioned by day, with global equality deletes (an unpartitioned spec).
    assert_eq!(md["partition-specs"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn random_changes_with_kill_9_end_equal_to_the_oracle() {
    let Some(python) = common::harness_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(20261130, 50_000, 5_000);
    write_lines(&data, &lines);
    let p = pipeline(dir.path(), &data, "upsert", 150);
    let db = dir.path().join("catalog.db");

    // Kill the pipeline at random moments at least five times.
    let mut rng = StdRng::seed_from_u64(99);
    let mut kills = 0;
    let mut runs = 0;
    while kills < 5 && runs < 40 {
        runs += 1;
        let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
            .args([
                "run",
                p.to_str().unwrap(),
                "--exit-when-caught-up",
                "--log-level",
                "warn",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(60..700)));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            kills += 1;
        } else {
            break;
        }
    }
    assert!(
        kills >= 5,
        "the pipeline finished before it could be killed five times ({kills})"
    );

    run_to_end(&p);
    let loc = common::catalog_metadata_location(&db, "bronze", "items")
        .await
        .unwrap();
    let read = common::duckdb_rows(&python, &loc, "id");
    let problems = differences(&read, &expected_rows(&state));
    assert!(
        problems.is_empty(),
        "{} differences, first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    assert_eq!(read.len(), state.len());

    // Every snapshot carries the position; the property is the newest one.
    let md = metadata_json(&loc);
    let snapshots = md["snapshots"].as_array().unwrap();
    assert!(snapshots.len() > 20);
    assert!(
        snapshots
            .iter()
            .all(|s| s["summary"]["cdc.position"].is_string())
    );
    let current = md["current-snapshot-id"].as_i64().unwrap();
    let newest = snapshots
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap();
    assert_eq!(
        md["properties"]["cdc.position"],
        newest["summary"]["cdc.position"]
    );

    // Running again over committed input creates nothing.
    run_to_end(&p);
    let again = common::catalog_metadata_location(&db, "bronze", "items")
        .await
        .unwrap();
    assert_eq!(again, loc, "a re-run over committed input must not commit");
}

#[tokio::test]
async fn append_records_every_change_once() {
    let Some(python) = common::harness_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(7, 2_000, 300);
    write_lines(&data, &lines);
    let p = pipeline(dir.path(), &data, "append", 150);
    run_to_end(&p);
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "bronze", "items")
        .await
        .unwrap();
    let read = common::duckdb_rows(&python, &loc, "id");
    assert_eq!(read.len(), lines.len(), "one row per change");
    run_to_end(&p);
    let again =
        common::catalog_metadata_location(&dir.path().join("catalog.db"), "bronze", "items")
            .await
            .unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &again, "id").len(),
        lines.len(),
        "a re-run adds nothing"
    );
}

#[tokio::test]
async fn an_existing_table_that_does_not_match_is_an_error_naming_columns() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(3, 50, 20);
    write_lines(&data, &lines);
    let p = pipeline(dir.path(), &data, "upsert", 100);
    run_to_end(&p);
    // The same table, now routed with another type for `qty`.
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("qty INT", "qty BIGINT");
    std::fs::write(&p, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--exit-when-caught-up"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("column `qty` is int in the table, and the route writes long"),
        "{err}"
    );
}
