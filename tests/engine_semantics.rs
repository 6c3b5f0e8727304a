//! The runner's semantics, end to end through the file source, the planned
//! routes and the memory sink: collapse per key in arrival order, key
//! changes, whole transactions, crash and restart, rejected batches, resume,
//! graceful stop, and bad input.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use urutau_engine::{RunError, RunOptions, Shutdown};
use urutau_sinks::memory::{Faults, MemoryStore, TableSnapshot};

/// One change event line.
fn event(op: &str, before: Option<Value>, after: Option<Value>, tx: Option<u64>) -> String {
    let mut source = json!({"table": "t", "schema": "public", "ts_ms": 1_700_000_000_000u64});
    if let Some(tx) = tx {
        source["txId"] = json!(tx);
    }
    json!({"op": op, "before": before, "after": after, "source": source}).to_string()
}

fn row(id: i64, v: Option<&str>) -> Value {
    json!({"id": id, "v": v})
}

fn ins(id: i64, v: &str) -> String {
    event("c", None, Some(row(id, Some(v))), None)
}
fn upd(from: (i64, &str), to: (i64, &str)) -> String {
    event(
        "u",
        Some(row(from.0, Some(from.1))),
        Some(row(to.0, Some(to.1))),
        None,
    )
}
fn del(id: i64, v: &str) -> String {
    event("d", Some(row(id, Some(v))), None, None)
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

/// Upsert route `m.t` and append route `m.log` over `s.t`.
fn pipeline(path: &Path, store: &str, max_rows: usize) -> String {
    format!(
        "CREATE PIPELINE p WITH (max_batch_rows = {max_rows}, max_batch_interval = '10s');
         CREATE SOURCE s FROM file WITH (path = '{}');
         CREATE SINK m INTO memory WITH (store = '{store}');
         CREATE TABLE s.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
         CREATE TABLE m.t WITH (write_mode = 'upsert') AS SELECT id, v FROM s.t;
         CREATE TABLE m.log WITH (write_mode = 'append') AS SELECT id, v, _op AS op FROM s.t;",
        path.display()
    )
}

async fn run(text: &str) -> Result<urutau_engine::RunReport, RunError> {
    let plan = common::plan_sql(text)
        .await
        .unwrap_or_else(|d| panic!("{}", common::show(&d)));
    urutau_engine::run(
        &plan,
        RunOptions {
            exit_when_caught_up: true,
            ..Default::default()
        },
        Shutdown::new(),
    )
    .await
}

fn table(store: &str, name: &str) -> TableSnapshot {
    MemoryStore::named(store).table(name).expect("table exists")
}

fn rows(store: &str, name: &str) -> Vec<Vec<String>> {
    table(store, name).rows
}

fn s(v: &[(&str, &str)]) -> Vec<Vec<String>> {
    v.iter()
        .map(|(a, b)| vec![a.to_string(), b.to_string()])
        .collect()
}

#[tokio::test]
async fn collapse_keeps_the_last_change_of_each_key_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl");
    write_lines(
        &path,
        &[
            ins(1, "a"),
            upd((1, "a"), (1, "b")),
            upd((1, "b"), (1, "c")),
            ins(2, "x"),
            del(2, "x"),
            ins(2, "y"),
            ins(3, "z"),
            del(3, "z"),
        ],
    );
    let store = common::unique("collapse");
    run(&pipeline(&path, &store, 10_000)).await.unwrap();
    assert_eq!(rows(&store, "t"), s(&[("1", "c"), ("2", "y")]));
    // One batch; the sink saw one row per key: 1 -> c, 2 -> y, 3 -> delete.
    let commits = table(&store, "t").commits;
    assert_eq!(commits.len(), 1, "{commits:?}");
    assert_eq!((commits[0].1, commits[0].2), (3, 1));
    // The append route saw every change (update before-images are not changes).
    assert_eq!(table(&store, "log").rows.len(), 8);
}

#[tokio::test]
async fn a_key_change_deletes_the_old_key() {
    for max_rows in [1, 10_000] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.jsonl");
        write_lines(
            &path,
            &[
                ins(1, "a"),
                ins(2, "b"),
                upd((1, "a"), (5, "a")),
                upd((2, "b"), (1, "b")),
            ],
        );
        let store = common::unique("keychange");
        run(&pipeline(&path, &store, max_rows)).await.unwrap();
        assert_eq!(
            rows(&store, "t"),
            s(&[("1", "b"), ("5", "a")]),
            "max_rows {max_rows}"
        );
        let log = rows(&store, "log");
        assert_eq!(log.len(), 4, "{log:?}");
    }
}

#[tokio::test]
async fn a_batch_never_splits_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tx.jsonl");
    let mut lines = vec![ins(1, "solo")];
    for id in 10..15 {
        lines.push(event("c", None, Some(row(id, Some("tx"))), Some(77)));
    }
    lines.push(ins(2, "after"));
    write_lines(&path, &lines);
    let store = common::unique("tx");
    run(&pipeline(&path, &store, 1)).await.unwrap();
    let log = table(&store, "log");
    // One row per batch, except the transaction, which stays whole.
    assert_eq!(
        log.commits.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![1, 5, 1],
        "{:?}",
        log.commits
    );
    // Rebuild each commit's rows from the append order.
    let mut at = 0;
    let offsets = line_end_offsets(&path);
    for (position, n, _) in &log.commits {
        let ids: Vec<i64> = log.rows[at..at + n]
            .iter()
            .map(|r| r[0].parse().unwrap())
            .collect();
        at += n;
        let in_tx = ids.iter().filter(|i| (10..15).contains(*i)).count();
        assert!(
            in_tx == 0 || in_tx == 5,
            "commit at {position} splits the transaction: {ids:?}"
        );
        // Every commit ends at the end of a line that closes a transaction.
        let p: u64 = position.parse().unwrap();
        assert!(
            [offsets[0], offsets[5], offsets[6]].contains(&p),
            "commit at {p} is not a transaction end"
        );
    }
    assert_eq!(at, 7);
}

fn line_end_offsets(path: &Path) -> Vec<u64> {
    let text = std::fs::read(path).unwrap();
    text.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i as u64 + 1)
        .collect()
}

/// A seeded random workload: inserts, updates (some changing the key),
/// deletes, re-inserts, NULLs, unicode, multi-row transactions. Returns the
/// lines and the final state.
fn workload(seed: u64, changes: usize, keys: i64) -> (Vec<String>, BTreeMap<i64, Option<String>>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state: BTreeMap<i64, Option<String>> = BTreeMap::new();
    let mut lines = Vec::new();
    let mut tx_left = 0;
    let mut tx_id = 1000u64;
    let value = |rng: &mut StdRng| -> Option<String> {
        match rng.random_range(0..10) {
            0 => None,
            1 => Some("ünïcødé ✓ 日本".to_string()),
            _ => Some(format!("v{}", rng.random_range(0..1_000_000))),
        }
    };
    while lines.len() < changes {
        if tx_left == 0 && rng.random_bool(0.2) {
            tx_left = rng.random_range(2..6);
            tx_id += 1;
        }
        let tx = if tx_left > 0 {
            tx_left -= 1;
            Some(tx_id)
        } else {
            None
        };
        let id = rng.random_range(1..=keys);
        let line = match state.get(&id).cloned() {
            None => {
                let v = value(&mut rng);
                state.insert(id, v.clone());
                event("c", None, Some(json!({"id": id, "v": v})), tx)
            }
            Some(old) => {
                let roll = rng.random_range(0..100);
                if roll < 25 {
                    state.remove(&id);
                    event("d", Some(json!({"id": id, "v": old})), None, tx)
                } else if roll < 32 {
                    let new_id = rng.random_range(1..=keys);
                    if state.contains_key(&new_id) {
                        continue;
                    }
                    let v = value(&mut rng);
                    state.remove(&id);
                    state.insert(new_id, v.clone());
                    event(
                        "u",
                        Some(json!({"id": id, "v": old})),
                        Some(json!({"id": new_id, "v": v})),
                        tx,
                    )
                } else {
                    let v = value(&mut rng);
                    state.insert(id, v.clone());
                    event(
                        "u",
                        Some(json!({"id": id, "v": old})),
                        Some(json!({"id": id, "v": v})),
                        tx,
                    )
                }
            }
        };
        lines.push(line);
    }
    (lines, state)
}

fn oracle_rows(state: &BTreeMap<i64, Option<String>>) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = state
        .iter()
        .map(|(k, v)| vec![k.to_string(), v.clone().unwrap_or_else(|| "NULL".into())])
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_crash_then_restart_ends_like_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.jsonl");
    let (lines, state) = workload(42, 3000, 60);
    write_lines(&path, &lines);

    let clean = common::unique("clean");
    run(&pipeline(&path, &clean, 97)).await.unwrap();
    assert_eq!(
        rows(&clean, "t"),
        oracle_rows(&state),
        "uninterrupted run vs oracle"
    );
    assert_eq!(
        rows(&clean, "log").len(),
        lines.len(),
        "append holds every change once"
    );
    let commits = table(&clean, "t").commits.len();
    assert!(commits > 20, "the workload spans many batches ({commits})");

    for crash_after in [0usize, 1, 5, 17, 40] {
        let store = common::unique("crash");
        MemoryStore::named(&store).set_faults(Faults {
            fail_after_commits: Some(crash_after),
            reject_value: None,
        });
        let err = run(&pipeline(&path, &store, 97)).await.unwrap_err();
        assert!(matches!(err, RunError::Commit { .. }), "{err}");
        assert!(err.to_string().contains("injected failure"), "{err}");
        // Restart: no fault now.
        run(&pipeline(&path, &store, 97)).await.unwrap();
        assert_eq!(
            rows(&store, "t"),
            rows(&clean, "t"),
            "upsert after a crash at commit {crash_after}"
        );
        assert_eq!(
            rows(&store, "log"),
            rows(&clean, "log"),
            "append after a crash at commit {crash_after}: no loss, no duplicate"
        );
        assert_eq!(table(&store, "t").position, table(&clean, "t").position);
    }
}

/// Lines for the reader's chunk tests: the seeded workload (multi-line
/// transactions, key changes), one 5,000-line transaction (more than a
/// chunk), and every 7th event wrapped as `{"payload": ...}`.
fn chunk_workload() -> (Vec<String>, BTreeMap<i64, Option<String>>) {
    let (mut lines, mut state) = workload(7, 20_000, 800);
    for l in workload(8, 5_000, 800).0 {
        let mut v: Value = serde_json::from_str(&l).unwrap();
        v["source"]["txId"] = json!(999_999);
        // Replayed on the state: the long transaction continues from it.
        if !v["before"].is_null() {
            state.remove(&v["before"]["id"].as_i64().unwrap());
        }
        if !v["after"].is_null() {
            let a = &v["after"];
            state.insert(a["id"].as_i64().unwrap(), a["v"].as_str().map(String::from));
        }
        lines.push(v.to_string());
    }
    for l in lines.iter_mut().skip(3).step_by(7) {
        *l = json!({"payload": serde_json::from_str::<Value>(l).unwrap()}).to_string();
    }
    (lines, state)
}

/// An event line's envelope (unwrapped from `payload`).
fn envelope(line: &str) -> Value {
    let v: Value = serde_json::from_str(line).unwrap();
    match v.get("payload") {
        Some(p) => p.clone(),
        None => v,
    }
}

/// The reader's chunk tests' pipeline: `pipeline` plus an append route of
/// each change's `_position`; batches close on rows only.
fn chunk_pipeline(path: &Path, store: &str) -> String {
    pipeline(path, store, 3001)
        .replace("max_batch_interval = '10s'", "max_batch_interval = '1h'")
        .replace(
            "AS SELECT id, v, _op AS op FROM s.t;",
            "AS SELECT id, v, _op AS op FROM s.t;
             CREATE TABLE m.pos WITH (write_mode = 'append') AS SELECT id, _position AS pos, _stream AS stream, _sequence AS seq FROM s.t;",
        )
}

/// The file reader frames lines on one thread and decodes rows on another,
/// handing over chunks of about 2,000 rows: transactions and batches that
/// span those chunks keep their rows, their order and their positions, and
/// the batches end exactly where one thread would end them.
#[tokio::test]
async fn transactions_spanning_the_readers_chunks_keep_their_positions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chunks.jsonl");
    let (lines, state) = chunk_workload();
    write_lines(&path, &lines);
    let store = common::unique("chunks");
    run(&chunk_pipeline(&path, &store)).await.unwrap();

    // Where each line's transaction ends: a line without a txId ends its
    // own; a run of lines sharing one ends at its last line.
    let offsets = line_end_offsets(&path);
    let tx_of = |l: &str| envelope(l)["source"]["txId"].clone();
    let ends_tx = |i: usize| {
        i + 1 == lines.len()
            || tx_of(&lines[i]).is_null()
            || tx_of(&lines[i]) != tx_of(&lines[i + 1])
    };
    let mut tx_end = vec![0u64; lines.len()];
    let mut end = 0;
    for i in (0..lines.len()).rev() {
        if ends_tx(i) {
            end = offsets[i];
        }
        tx_end[i] = end;
    }
    // Every change row carries its transaction's end, in input order (an
    // append route gets one row per event).
    let pos = rows(&store, "pos");
    assert_eq!(pos.len(), lines.len(), "every row once");
    for (i, row) in pos.iter().enumerate() {
        assert_eq!(row[1], tx_end[i].to_string(), "line {}", i + 1);
        // Its coordinate: the file, the offset its line starts at.
        let start = if i == 0 { 0 } else { offsets[i - 1] };
        assert_eq!(
            row[2..],
            ["chunks.jsonl".to_string(), start.to_string()],
            "line {}",
            i + 1
        );
    }
    // The batches: each closes at the first transaction end where it holds
    // 3,001 rows (a key change adds its before image for the upsert route).
    let mut expected = Vec::new();
    let mut held = 0;
    for (i, line) in lines.iter().enumerate() {
        let e = envelope(line);
        let key_change = e["op"] == "u" && e["before"]["id"] != e["after"]["id"];
        held += 1 + usize::from(key_change);
        if ends_tx(i) && (held >= 3001 || i + 1 == lines.len()) {
            expected.push(offsets[i].to_string());
            held = 0;
        }
    }
    let commits: Vec<String> = table(&store, "pos")
        .commits
        .iter()
        .map(|c| c.0.clone())
        .collect();
    assert_eq!(commits, expected, "batch ends");
    assert_eq!(rows(&store, "t"), oracle_rows(&state));
}

/// The same through a directory: a file's end ends the transaction open in
/// it, and each row's position names its own file.
#[tokio::test]
async fn a_directory_read_in_chunks_gives_each_row_its_files_position() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, state) = chunk_workload();
    // Three files, cut inside transactions (the long one among them).
    let cuts = [0, 9_001, 22_500, lines.len()];
    let mut expected_pos = Vec::new();
    let mut expected_coordinates = Vec::new();
    for (n, w) in cuts.windows(2).enumerate() {
        let name = format!("part-{n}.jsonl");
        let part = &lines[w[0]..w[1]];
        let path = dir.path().join(&name);
        write_lines(&path, part);
        let offsets = line_end_offsets(&path);
        let tx_of = |l: &str| envelope(l)["source"]["txId"].clone();
        let mut end = 0;
        let mut ends = vec![0u64; part.len()];
        for i in (0..part.len()).rev() {
            if i + 1 == part.len()
                || tx_of(&part[i]).is_null()
                || tx_of(&part[i]) != tx_of(&part[i + 1])
            {
                end = offsets[i];
            }
            ends[i] = end;
        }
        expected_pos.extend(ends.into_iter().map(|e| format!("{name}:{e}")));
        expected_coordinates.extend(
            std::iter::once(0)
                .chain(offsets[..part.len() - 1].iter().copied())
                .map(|start| [name.clone(), start.to_string()]),
        );
    }
    let store = common::unique("chunkdir");
    run(&chunk_pipeline(dir.path(), &store)).await.unwrap();
    let pos = rows(&store, "pos");
    assert_eq!(pos.len(), lines.len(), "every row once");
    for (i, row) in pos.iter().enumerate() {
        assert_eq!(row[1], expected_pos[i], "line {} of the input", i + 1);
        assert_eq!(
            row[2..],
            expected_coordinates[i],
            "line {} of the input",
            i + 1
        );
    }
    let ends: std::collections::BTreeSet<&String> = expected_pos.iter().collect();
    for (p, n, _) in &table(&store, "pos").commits {
        assert!(
            ends.contains(p),
            "commit at {p} ({n} rows) is not a transaction end"
        );
    }
    assert_eq!(rows(&store, "t"), oracle_rows(&state));
}

/// A batch that closes at the start of a bad line goes down with the line,
/// as with one thread: the run fails there and never commits past the
/// batch before.
#[tokio::test]
async fn a_batch_closed_by_a_bad_line_is_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.jsonl");
    let mut bad = json!({"op": "c", "after": {"id": 9, "v": "x"}, "source": {"txId": 78}});
    bad["source"]["schema"] = json!("public");
    write_lines(
        &path,
        &[
            ins(1, "a"),
            event("c", None, Some(row(2, Some("b"))), Some(77)),
            event("c", None, Some(row(3, Some("c"))), Some(77)),
            bad.to_string(),
        ],
    );
    let store = common::unique("late");
    let err = run(&pipeline(&path, &store, 1)).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&format!("{}:4:", path.display())), "{msg}");
    assert!(msg.contains("without `source.table`"), "{msg}");
    let first_line_end = line_end_offsets(&path)[0].to_string();
    for name in ["t", "log"] {
        let t = MemoryStore::named(&store).table(name);
        let position = t.as_ref().and_then(|t| t.position.clone());
        assert!(
            position.is_none() || position.as_deref() == Some(first_line_end.as_str()),
            "{name}: committed up to {position:?}, past the first line"
        );
        let ids: Vec<String> = t
            .map(|t| t.rows.iter().map(|r| r[0].clone()).collect())
            .unwrap_or_default();
        assert!(
            !ids.contains(&"2".to_string()),
            "{name}: the transaction before the bad line was committed: {ids:?}"
        );
    }
}

#[tokio::test]
async fn a_rejected_batch_stops_the_run_without_advancing_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    write_lines(&path, &[ins(1, "a"), ins(2, "b")]);
    write_lines(&path, &[ins(3, "poison"), ins(4, "d")]);
    let offsets = line_end_offsets(&path);
    let store = common::unique("reject");
    MemoryStore::named(&store).set_faults(Faults {
        fail_after_commits: None,
        reject_value: Some(("v".into(), "poison".into())),
    });
    let text = pipeline(&path, &store, 2);
    for attempt in 0..2 {
        let err = run(&text).await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, RunError::Commit { .. }), "{msg}");
        assert!(msg.contains("table "), "{msg}");
        assert!(msg.contains(&format!("position {}", offsets[3])), "{msg}");
        assert!(msg.contains("refuses"), "{msg}");
        // Nothing of the rejected batch, nothing after it; position unchanged.
        let t = table(&store, "t");
        assert_eq!(
            t.position.as_deref(),
            Some(offsets[1].to_string().as_str()),
            "attempt {attempt}"
        );
        assert_eq!(t.rows, s(&[("1", "a"), ("2", "b")]));
    }
}

#[tokio::test]
async fn a_restart_resumes_after_the_committed_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resume.jsonl");
    write_lines(&path, &[ins(1, "a"), ins(2, "b")]);
    let store = common::unique("resume");
    let text = pipeline(&path, &store, 1);
    run(&text).await.unwrap();
    write_lines(&path, &[upd((1, "a"), (1, "a2")), ins(3, "c")]);
    let report = run(&text).await.unwrap();
    assert_eq!(rows(&store, "t"), s(&[("1", "a2"), ("2", "b"), ("3", "c")]));
    let log = rows(&store, "log");
    assert_eq!(log.len(), 4, "every change once: {log:?}");
    // The second run read only the new lines.
    let t = report.routes.iter().find(|r| r.name == "m.t").unwrap();
    assert_eq!(t.rows, 2, "{report:?}");
    // Nothing new: a third run commits nothing.
    let report = run(&text).await.unwrap();
    assert!(report.routes.iter().all(|r| r.commits == 0), "{report:?}");
}

#[tokio::test]
async fn an_update_leaving_the_filter_deletes_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.jsonl");
    write_lines(
        &path,
        &[
            ins(1, "keep"),
            ins(2, "keep"),
            upd((1, "keep"), (1, "drop")),
            ins(3, "drop"),
        ],
    );
    let store = common::unique("filter");
    let text = format!(
        "CREATE SOURCE s FROM file WITH (path = '{}');
         CREATE SINK m INTO memory WITH (store = '{store}');
         CREATE TABLE s.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
         CREATE TABLE m.t AS SELECT id, v FROM s.t WHERE v = 'keep';
         CREATE TABLE m.log WITH (write_mode = 'append') AS SELECT id, v FROM s.t WHERE v = 'keep';",
        path.display()
    );
    run(&text).await.unwrap();
    assert_eq!(rows(&store, "t"), s(&[("2", "keep")]));
    assert_eq!(rows(&store, "log"), s(&[("1", "keep"), ("2", "keep")]));
}

#[tokio::test]
async fn a_stop_request_finishes_the_commit_in_flight_and_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tail.jsonl");
    write_lines(&path, &[ins(1, "a")]);
    let store = common::unique("stop");
    let text = format!(
        "CREATE PIPELINE p WITH (max_batch_interval = '20ms');
         CREATE SOURCE s FROM file WITH (path = '{}');
         CREATE SINK m INTO memory WITH (store = '{store}');
         CREATE TABLE s.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
         CREATE TABLE m.t AS SELECT id, v FROM s.t;",
        path.display()
    );
    let plan = common::plan_sql(&text).await.unwrap();
    let shutdown = Shutdown::new();
    let handle = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            urutau_engine::run(
                &plan,
                RunOptions {
                    exit_when_caught_up: false,
                    ..Default::default()
                },
                shutdown,
            )
            .await
        })
    };
    // Tailing: a line written while the pipeline runs arrives too.
    wait_for(|| {
        MemoryStore::named(&store)
            .table("t")
            .is_some_and(|t| t.rows.len() == 1)
    })
    .await;
    write_lines(&path, &[ins(2, "b")]);
    wait_for(|| {
        MemoryStore::named(&store)
            .table("t")
            .is_some_and(|t| t.rows.len() == 2)
    })
    .await;
    shutdown.trigger();
    let report = tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(report.stopped);
    assert_eq!(rows(&store, "t"), s(&[("1", "a"), ("2", "b")]));
}

/// The threads of this process named `name` (Linux truncates names to 15
/// bytes).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// A tailing file source dropped without a stop request (a consumer that
/// lets go of it; the runner itself always requests a stop first) ends its
/// reader threads, framing and decoding, without waiting for new input.
#[tokio::test]
async fn a_dropped_tailing_source_leaves_no_reader_thread() {
    use urutau_engine::batching::BatchPolicy;
    use urutau_engine::sources::{self, OpenArgs};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tail-drop.jsonl");
    write_lines(&path, &[ins(1, "a")]);
    // Source `drp`: its threads are `file-source-drp` and
    // `file-source-drp-decode`, both `file-source-drp` once truncated.
    let text = format!(
        "CREATE SOURCE drp FROM file WITH (path = '{}');
         CREATE SINK m INTO memory WITH (store = '{}');
         CREATE TABLE drp.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
         CREATE TABLE m.t AS SELECT id, v FROM drp.t;",
        path.display(),
        common::unique("tail-drop")
    );
    let plan = common::plan_sql(&text).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut source = sources::open(OpenArgs {
        plan: &plan.sources[0],
        start: None,
        snapshots: Default::default(),
        exit_when_caught_up: false,
        peek: None,
        policy: BatchPolicy {
            max_rows: 10,
            max_interval: Duration::from_millis(20),
        },
        stop: stop.clone(),
        metrics: Default::default(),
    })
    .unwrap();
    let batch = source.next_batch().await.unwrap().expect("the line");
    assert_eq!(batch.tables[0].batch.num_rows(), 1);
    assert_eq!(threads_named("file-source-drp"), 2, "framing and decoding");
    drop(source);
    wait_for(|| threads_named("file-source-drp") == 0).await;
    assert!(!stop.load(std::sync::atomic::Ordering::Relaxed));
}

async fn wait_for(mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached in 10 s");
}

#[tokio::test]
async fn a_malformed_line_is_a_terminal_error_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    write_lines(
        &path,
        &[
            ins(1, "a"),
            "{\"op\": \"c\", \"after\": {".to_string(),
            ins(2, "b"),
        ],
    );
    let store = common::unique("bad");
    let err = run(&pipeline(&path, &store, 10_000)).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&format!("{}:2:", path.display())), "{msg}");
    assert!(msg.contains("malformed change event"), "{msg}");
    // The batch holding the bad line is never committed, not even in part.
    assert!(
        MemoryStore::named(&store)
            .table("t")
            .is_none_or(|t| t.rows.is_empty() && t.position.is_none())
    );
}

#[tokio::test]
async fn a_value_that_does_not_fit_names_line_field_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("types.jsonl");
    write_lines(
        &path,
        &[
            event("c", None, Some(json!({"id": 1, "n": 5})), None),
            event("c", None, Some(json!({"id": 2, "n": "abc"})), None),
        ],
    );
    let store = common::unique("types");
    let text = format!(
        "CREATE SOURCE s FROM file WITH (path = '{}');
         CREATE SINK m INTO memory WITH (store = '{store}');
         CREATE TABLE s.t (id BIGINT NOT NULL, n INT, PRIMARY KEY (id));
         CREATE TABLE m.t AS SELECT id, n FROM s.t;",
        path.display()
    );
    let msg = run(&text).await.unwrap_err().to_string();
    assert!(msg.contains(&format!("{}:2:", path.display())), "{msg}");
    assert!(msg.contains("table t, field `n`"), "{msg}");
    assert!(msg.contains("\"abc\" does not fit INT"), "{msg}");

    // A NULL key is refused the same way.
    let path2 = dir.path().join("nullkey.jsonl");
    write_lines(
        &path2,
        &[event("c", None, Some(json!({"id": null, "n": 1})), None)],
    );
    let msg = run(&text.replace(&path.display().to_string(), &path2.display().to_string()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("field `id`") && msg.contains("NOT NULL"),
        "{msg}"
    );
}

/// The envelope and row images are read by a structural scan, each field's
/// text by its column's type: what is not JSON still stops the run, naming
/// the line and, inside a row image, the field.
#[tokio::test]
async fn text_that_is_not_json_names_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::unique("notjson");
    let good =
        r#"{"op":"c","after":{"id":1,"n":5,"j":{"a":[1]}},"source":{"table":"t","ts_ms":1}}"#;
    for (i, (bad, says)) in [
        (
            r#"{"op":"c","after":{"id":2,"n":05},"source":{"table":"t"}}"#,
            "field `n`: 05 is not a JSON value",
        ),
        (
            r#"{"op":"c","after":{"id":2,"j":{"a":1,}},"source":{"table":"t"}}"#,
            "field `j`: {\"a\":1,} is not JSON",
        ),
        (
            r#"{"op":"c","after":{"id":2 "n":1},"source":{"table":"t"}}"#,
            "the row image is not a JSON object: expected `,` or `}` at byte 8",
        ),
        (
            r#"{"op":"c","op":"u","after":{"id":2},"source":{"table":"t"}}"#,
            "malformed change event: duplicate field `op`",
        ),
        (
            r#"{"op":"c","after":{"id":2},"source":{"table":"t","ts_ms":"x"}}"#,
            "`source`: `ts_ms`: \"x\" is not an integer",
        ),
        (
            r#"{"op":"c","after":{"id":2},"source":{"table":"t"}} x"#,
            "text after the object",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("bad{i}.jsonl"));
        write_lines(&path, &[good.to_string(), bad.to_string()]);
        let text = format!(
            "CREATE SOURCE s FROM file WITH (path = '{}');
             CREATE SINK m INTO memory WITH (store = '{store}{i}');
             CREATE TABLE s.t (id BIGINT NOT NULL, n INT, j JSON, PRIMARY KEY (id));
             CREATE TABLE m.t AS SELECT id, n, j FROM s.t;",
            path.display()
        );
        let msg = run(&text).await.unwrap_err().to_string();
        assert!(msg.contains(&format!("{}:2:", path.display())), "{msg}");
        assert!(msg.contains(says), "{bad}: {msg}");
    }
}

#[tokio::test]
async fn a_directory_is_read_in_name_order_and_resumed_by_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("in");
    std::fs::create_dir(&data).unwrap();
    write_lines(&data.join("b.jsonl"), &[upd((1, "a"), (1, "b"))]);
    write_lines(&data.join("a.jsonl"), &[ins(1, "a")]);
    let store = common::unique("dir");
    let text = pipeline(&data, &store, 1);
    run(&text).await.unwrap();
    assert_eq!(rows(&store, "t"), s(&[("1", "b")]));
    let pos = table(&store, "t").position.unwrap();
    assert!(pos.starts_with("b.jsonl:"), "{pos}");
    write_lines(&data.join("c.jsonl"), &[ins(2, "c")]);
    run(&text).await.unwrap();
    assert_eq!(rows(&store, "t"), s(&[("1", "b"), ("2", "c")]));
    assert_eq!(rows(&store, "log").len(), 3);
}

/// A declared table is the contract of a schemaless source: a field the
/// declaration lacks is left out and its row counted (`/metrics`), a
/// declared column an event lacks is NULL; with `on_schema_mismatch =
/// 'fail'` either stops the run naming the table, the line and the field,
/// and nothing of the batch is committed.
#[tokio::test]
async fn a_declared_table_is_the_contract_of_a_schemaless_source() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    write_lines(
        &path,
        &[
            ins(1, "a"),
            event(
                "c",
                None,
                Some(json!({"id": 2, "v": "b", "extra": 7})),
                None,
            ),
            event("c", None, Some(json!({"id": 3})), None),
        ],
    );
    let store = common::unique("contract");
    let text = pipeline(&path, &store, 100);
    let plan = common::plan_sql(&text)
        .await
        .unwrap_or_else(|d| panic!("{}", common::show(&d)));
    let metrics = urutau_engine::metrics::Metrics::default();
    urutau_engine::run(
        &plan,
        RunOptions {
            exit_when_caught_up: true,
            metrics: metrics.clone(),
            ..Default::default()
        },
        Shutdown::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        rows(&store, "t"),
        vec![
            vec!["1".to_string(), "a".to_string()],
            vec!["2".to_string(), "b".to_string()],
            vec!["3".to_string(), "NULL".to_string()],
        ]
    );
    assert_eq!(metrics.status_json()["sources"]["s"]["mismatched_rows"], 1);
    assert!(
        metrics
            .prometheus()
            .contains("urutau_mismatched_rows_total{source=\"s\"} 1"),
        "{}",
        metrics.prometheus()
    );

    for (line, field) in [(2, "extra"), (3, "v")] {
        let strict = common::unique("strict");
        let text = pipeline(&path, &strict, 100).replace(
            &format!("FROM file WITH (path = '{}')", path.display()),
            &format!(
                "FROM file WITH (path = '{}', on_schema_mismatch = 'fail')",
                path.display()
            ),
        );
        let lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .enumerate()
            .filter(|(i, _)| *i == 0 || *i + 1 == line)
            .map(|(_, l)| l.to_string())
            .collect();
        let p2 = dir.path().join(format!("strict{line}.jsonl"));
        std::fs::write(&p2, lines.join("\n") + "\n").unwrap();
        let text = text.replace(&path.display().to_string(), &p2.display().to_string());
        let e = run(&text).await.unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
        assert!(e.contains("on_schema_mismatch = 'fail'"), "{e}");
        assert!(e.contains(":2:"), "the line: {e}");
        assert!(
            MemoryStore::named(&strict)
                .table("t")
                .is_none_or(|t| t.rows.is_empty()),
            "nothing committed"
        );
    }
}

/// A Kafka source parses its messages' headers only for a table whose
/// routes read the `headers` metadata column (librdkafka parses and
/// allocates them for every message it is asked about): the plan says
/// which tables do, from the routes' projections and filters. Planning
/// connects to no broker.
#[tokio::test]
async fn the_plan_says_which_tables_routes_read_message_headers() {
    let store = common::unique("reads-headers");
    let text = format!(
        "CREATE SOURCE k FROM kafka WITH (brokers = '127.0.0.1:1', format = 'raw');
         CREATE SINK m INTO memory WITH (store = '{store}');
         CREATE TABLE k.plain (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
         CREATE TABLE k.selected (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
         CREATE TABLE k.filtered (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
         CREATE TABLE m.plain AS SELECT id, v, _msg_key AS k FROM k.plain;
         CREATE TABLE m.plain2 AS SELECT id FROM k.plain;
         CREATE TABLE m.selected AS SELECT id, v FROM k.selected;
         CREATE TABLE m.selected2 AS SELECT id, _headers AS h FROM k.selected;
         CREATE TABLE m.filtered AS SELECT id, v FROM k.filtered WHERE _headers IS NOT NULL;"
    );
    let plan = common::plan_sql(&text).await.unwrap();
    let reads: BTreeMap<String, bool> = plan.sources[0]
        .tables
        .iter()
        .map(|t| (t.table.join("."), t.reads_headers))
        .collect();
    assert_eq!(
        reads,
        BTreeMap::from([
            ("filtered".to_string(), true),
            ("plain".to_string(), false),
            ("selected".to_string(), true),
        ])
    );
}
