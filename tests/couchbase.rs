//! The Couchbase sink against gocaves, Couchbase's own mock cluster (or a
//! real cluster when `URUTAU_TEST_COUCHBASE_URL` is set). Every document
//! the sink wrote is read back by the official Python SDK
//! (tests/harness/couchbase.py), not by our code.
//!
//! gocaves accepts durability levels without enforcing them, has no query
//! service and keeps its data in memory, so crash tests kill urutau, never
//! the mock; the mapping of `DurabilityImpossible` to a terminal error is
//! unit-tested in the sink.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use common::Couchbase;
use common::workload::{COLUMNS, Row, workload, write_lines};
use serde_json::{Value, json};
use urutau_planner::sink::{Sink, SinkBatch};
use urutau_sinks::couchbase::{CouchbaseSink, FaultPoint};

const KEYS: i64 = 2_000;
const CONTROL: &str = "_urutau::position";

fn python() -> PathBuf {
    common::harness_python().expect("the test readers are needed: run tests/harness/setup")
}

/// The file into Couchbase collection `items` of `bucket`, selecting every
/// column and the change's op as metadata.
fn pipeline(
    dir: &Path,
    data: &Path,
    cb: &Couchbase,
    bucket: &str,
    sink: &str,
    route: &str,
) -> PathBuf {
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = 100, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK cb INTO couchbase WITH ({options}{sink});
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE cb.items WITH (primary_key = 'id'{route}) AS SELECT *, _op AS op FROM src.items;
",
        data = data.display(),
        options = cb.sink_options(bucket),
    );
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// The op of the change that produced each key's final image.
fn last_ops(lines: &[String]) -> BTreeMap<i64, &'static str> {
    let mut ops = BTreeMap::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        if let Some(id) = v["after"]["id"].as_i64() {
            let op = if v["op"] == "u" { "update" } else { "insert" };
            ops.insert(id, op);
        }
    }
    ops
}

fn all_keys() -> Vec<String> {
    (1..=KEYS).map(|id| format!("[{id}]")).collect()
}

/// Every key's document equals the oracle (live keys present and equal,
/// deleted keys absent), `_urutau` holding the change's op.
fn assert_equals_oracle(
    docs: &BTreeMap<String, Value>,
    state: &BTreeMap<i64, Row>,
    ops: &BTreeMap<i64, &str>,
) {
    let mut problems = Vec::new();
    for id in 1..=KEYS {
        let got = &docs[&format!("[{id}]")];
        match state.get(&id) {
            None if !got.is_null() => problems.push(format!("key {id} should be gone: {got}")),
            None => {}
            Some(row) => {
                let mut want = row.source.clone();
                want["_urutau"] = json!({"op": ops[&id]});
                if *got != want {
                    problems.push(format!("key {id}:\n  read {got}\n  want {want}"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} differences, first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
}

/// The seeded stream, killed with SIGKILL five times, then run to the
/// end; then a re-run, which must write nothing.
fn oracle_run(seed: u64, sink: &str, route: &str) -> (Couchbase, tempfile::TempDir, Value) {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(seed, 30_000, KEYS);
    write_lines(&data, &lines);
    let bucket = format!("t{seed}");
    let p = pipeline(dir.path(), &data, &cb, &bucket, sink, route);
    common::kill_9_runs(&p, seed, 5, 1200..2200);
    // The kills landed mid-stream: something was committed, not all.
    let end = std::fs::metadata(&data).unwrap().len().to_string();
    let killed = cb.get(&bucket, "_default", "items", &[CONTROL.to_string()]);
    let at = killed[CONTROL]["position"].as_str().map(str::to_string);
    let at = at.or_else(|| {
        killed[CONTROL]["owners"]["0"]["position"]
            .as_str()
            .map(str::to_string)
    });
    eprintln!("after the kills: {at:?} of {end}");
    assert!(
        at.as_ref().is_some_and(|p| *p != end),
        "after the kills: {at:?} of {end}"
    );
    common::run_to_end(&p);

    let mut keys = all_keys();
    keys.push(CONTROL.into());
    let docs = cb.get(&bucket, "_default", "items", &keys);
    assert_equals_oracle(&docs, &state, &last_ops(&lines));
    let control = docs[CONTROL].clone();

    // A re-run commits nothing: the control document is not rewritten.
    common::run_to_end(&p);
    let again = cb.get(&bucket, "_default", "items", &[CONTROL.to_string()]);
    assert_eq!(
        again[CONTROL], control,
        "a re-run rewrote the control document"
    );
    (
        cb,
        dir,
        json!({"control": control, "end": end, "bucket": bucket}),
    )
}

#[test]
fn fast_commits_through_kill_9_end_equal_to_the_oracle() {
    let (_cb, _dir, r) = oracle_run(1301, "", "");
    assert_eq!(r["control"]["position"], r["end"], "{r}");
    assert!(r["control"]["updated_at"].as_str().unwrap().ends_with('Z'));
}

#[test]
fn atomic_commits_through_kill_9_end_equal_to_the_oracle() {
    let (cb, _dir, r) = oracle_run(1302, ", commit_mode = 'atomic'", "");
    let c = &r["control"];
    assert_eq!(c["position"], r["end"], "{r}");
    let batch = c["batch"].as_u64().unwrap();
    assert!(batch > 10, "{c}");
    assert_eq!(c["pending"]["batch"], batch, "{c}");
    // Only the newest batch's journal is kept; older and uncommitted ones
    // are gone.
    let journal = |b: u64| format!("_urutau::journal::t::{b}::0");
    let docs = cb.get(
        r["bucket"].as_str().unwrap(),
        "_default",
        "items",
        &[journal(batch - 1), journal(batch), journal(batch + 1)],
    );
    assert!(docs[&journal(batch - 1)].is_null(), "{docs:?}");
    assert!(docs[&journal(batch)]["entries"].is_array(), "{docs:?}");
    assert!(docs[&journal(batch + 1)].is_null(), "{docs:?}");
}

#[test]
fn two_atomic_writers_of_one_table_keep_both_positions() {
    let (_cb, _dir, r) = oracle_run(1303, ", commit_mode = 'atomic'", ", workers = 2");
    let owners = &r["control"]["owners"];
    for o in ["0", "1"] {
        assert_eq!(owners[o]["position"], r["end"], "owner {o}: {r}");
    }
    assert_eq!(owners["0"]["batch"], owners["1"]["batch"], "{r}");
}

/// The keys whose documents differ (for assertion messages).
fn diff(read: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>) -> Vec<String> {
    want.iter()
        .filter(|(k, v)| read.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: read {:?}, want {v}", read.get(k)))
        .collect()
}

/// A target of two columns and a batch of its rows (`None`: a delete).
fn batch(rows: &[(i64, Option<&str>)]) -> SinkBatch {
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
        arrow::datatypes::Field::new("name", arrow::datatypes::DataType::Utf8, true),
    ]));
    let ids: ArrayRef = std::sync::Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0)));
    let names: ArrayRef = std::sync::Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1)));
    SinkBatch {
        rows: RecordBatch::try_new(schema, vec![ids, names]).unwrap(),
        deletes: BooleanArray::from_iter(rows.iter().map(|r| Some(r.1.is_none()))),
    }
}

/// Each step of the atomic protocol interrupted (as a crash there would
/// leave the cluster), then a restart: the sink ends equal to the oracle,
/// and after recovery its control document never names a position whose
/// data is not all in place.
#[tokio::test]
async fn an_atomic_commit_interrupted_at_each_step_recovers() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let first: Vec<(i64, Option<&str>)> = (1..=100).map(|i| (i, Some("a"))).collect();
    let mut second: Vec<(i64, Option<&str>)> = (1..=50).map(|i| (i, Some("b"))).collect();
    second.extend((51..=60).map(|i| (i, None)));
    second.extend((101..=120).map(|i| (i, Some("b"))));
    let state = |after_second: bool| -> BTreeMap<String, Value> {
        (1..=120)
            .map(|i| {
                let name = match (after_second, i) {
                    (false, 1..=100) => Some("a"),
                    (false, _) => None,
                    (true, 1..=50) | (true, 101..) => Some("b"),
                    (true, 51..=60) => None,
                    (true, _) => Some("a"),
                };
                let doc = name.map_or(Value::Null, |n| json!({"id": i, "name": n}));
                (format!("[{i}]"), doc)
            })
            .collect()
    };
    let keys: Vec<String> = (1..=120).map(|i| format!("[{i}]")).collect();
    for (n, point) in [
        FaultPoint::AfterStaging,
        FaultPoint::AfterCommitRecord,
        FaultPoint::MidApply,
    ]
    .into_iter()
    .enumerate()
    {
        let bucket = format!("faults{n}");
        let text = format!(
            "CREATE PIPELINE f;
CREATE SOURCE src FROM file WITH (path = 'x.jsonl');
CREATE SINK cb INTO couchbase WITH ({}, commit_mode = 'atomic', concurrency = 4);
CREATE TABLE src.items (id BIGINT NOT NULL, name VARCHAR, PRIMARY KEY (id));
CREATE TABLE cb.items WITH (primary_key = 'id') AS SELECT * FROM src.items;",
            cb.sink_options(&bucket)
        );
        let plan = common::plan_sql(&text)
            .await
            .unwrap_or_else(|d| panic!("{}", common::show(&d)));
        let spec = plan.spec.sinks[0].clone();
        let target = plan.routes[0].target.clone();

        let sink = CouchbaseSink::new(&spec).unwrap();
        sink.ensure_table(&target).await.unwrap();
        sink.commit(&target, &batch(&first), "p1").await.unwrap();
        sink.inject_fault(point);
        let err = sink
            .commit(&target, &batch(&second), "p2")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("injected fault"), "{err}");
        drop(sink);

        // The restart.
        let sink = CouchbaseSink::new(&spec).unwrap();
        let resumed = sink.committed_position(&target).await.unwrap();
        let mut read = cb.get(&bucket, "_default", "items", &keys);
        read.retain(|k, _| k != CONTROL);
        match point {
            // Not committed: nothing of the batch is visible.
            FaultPoint::AfterStaging => {
                assert_eq!(resumed.as_deref(), Some("p1"), "{point:?}");
                let d = diff(&read, &state(false));
                assert!(d.is_empty(), "{point:?}: {d:#?}");
                let staged = cb.get(
                    &bucket,
                    "_default",
                    "items",
                    &["_urutau::journal::t::2::0".into()],
                );
                assert!(
                    staged.values().all(Value::is_null),
                    "an uncommitted journal was left: {staged:?}"
                );
                // The runner replays the batch.
                sink.commit(&target, &batch(&second), "p2").await.unwrap();
            }
            // Committed: recovery rolled it forward before resuming.
            _ => assert_eq!(resumed.as_deref(), Some("p2"), "{point:?}"),
        }
        let mut read = cb.get(&bucket, "_default", "items", &keys);
        read.retain(|k, _| k != CONTROL);
        let d = diff(&read, &state(true));
        assert!(d.is_empty(), "{point:?}: {d:#?}");
        let control = cb.get(&bucket, "_default", "items", &[CONTROL.into()]);
        assert_eq!(control[CONTROL]["position"], "p2", "{point:?}");
    }
}

/// The cluster lost during a run: urutau exits 1 within the timeout plus
/// the retry budget, naming Couchbase, the operation and the table, and
/// never the password.
#[test]
fn a_lost_cluster_stops_the_run_with_a_clear_error() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let mut cb = Couchbase::start(&python, &dir.path().join("cb"));
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(1305, 2_000, KEYS);
    write_lines(&data, &lines[..1000]);
    let p = pipeline(
        dir.path(),
        &data,
        &cb,
        "lost",
        ", timeout = '1s', retry_for = '3s'",
        "",
    );
    // Tailing the file: it runs until it fails.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        let c = cb.get("lost", "_default", "items", &[CONTROL.into()]);
        if !c[CONTROL].is_null() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "nothing was committed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    cb.stop();
    let lost = Instant::now();
    // More changes arrive while the cluster is gone.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&data)
        .unwrap();
    for l in &lines[1000..] {
        use std::io::Write;
        writeln!(f, "{l}").unwrap();
    }
    drop(f);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if lost.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("urutau kept running 60 s after the cluster was lost");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let waited = lost.elapsed();
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    // timeout 1 s + retry_for 3 s, plus one backoff and the time to notice.
    assert!(
        waited < Duration::from_secs(12),
        "exited {waited:?} after the loss: {stderr}"
    );
    assert!(stderr.contains("couchbase: "), "{stderr}");
    assert!(
        stderr.contains("on table _default.items at couchbase://127.0.0.1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("upsert") || stderr.contains("write the control document"),
        "{stderr}"
    );
    assert!(!stderr.contains(&format!("'{}'", cb.password)), "{stderr}");
    assert!(
        !stderr.contains("password"),
        "the password was printed: {stderr}"
    );
}
