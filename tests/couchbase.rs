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

use arrow::array::BooleanArray;
use common::Couchbase;
use common::conformance::{self, SinkUnderTest, simple_batch};
use common::workload::{COLUMNS, Row, append_lines, workload, write_lines};
use serde_json::{Value, json};
use urutau_planner::sink::Sink;
use urutau_sinks::couchbase::{CouchbaseSink, FaultPoint};

const KEYS: i64 = 2_000;
const CONTROL: &str = "_urutau::position";

fn python() -> PathBuf {
    common::harness_python()
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

/// The conformance suite's view of one bucket of the cluster.
struct UnderTest<'a> {
    cb: &'a Couchbase,
    bucket: String,
    /// Sink options besides the connection (`, commit_mode = 'atomic'`).
    sink: &'static str,
    route: &'static str,
}

impl UnderTest<'_> {
    fn control(&self, collection: &str) -> Value {
        let mut c = self
            .cb
            .get(&self.bucket, "_default", collection, &[CONTROL.into()]);
        c.remove(CONTROL).unwrap()
    }
}

impl SinkUnderTest for UnderTest<'_> {
    fn create_sink(&self) -> String {
        format!(
            "CREATE SINK s INTO couchbase WITH ({}{});",
            self.cb.sink_options(&self.bucket),
            self.sink
        )
    }
    fn route_options(&self) -> String {
        self.route.into()
    }
    fn selected_metadata(&self) -> &'static str {
        ", _op AS op"
    }
    async fn rows(&self, table: &str, keys: i64) -> Vec<Value> {
        let ids: Vec<String> = (1..=keys).map(|id| format!("[{id}]")).collect();
        let docs = self.cb.get(&self.bucket, "_default", table, &ids);
        let mut rows: Vec<Value> = docs.into_values().filter(|d| !d.is_null()).collect();
        rows.sort_by_key(|r| r["id"].as_i64());
        rows
    }
    fn expected(&self, row: &Row, op: &str) -> Value {
        let mut want = row.source.clone();
        want["_urutau"] = json!({ "op": op });
        want
    }
    async fn position(&self, table: &str) -> Option<String> {
        let c = self.control(table);
        let owner = &c["owners"]["0"]["position"];
        c["position"]
            .as_str()
            .filter(|p| !p.is_empty())
            .or(owner.as_str())
            .map(str::to_string)
    }
    fn checks_schema(&self) -> bool {
        false
    }
}

/// The seeded stream, killed with SIGKILL five times, then run to the
/// end and again (the conformance suite's oracle run).
async fn oracle_run(
    seed: u64,
    sink: &'static str,
    route: &'static str,
) -> (Couchbase, tempfile::TempDir, Value) {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let s = UnderTest {
        cb: &cb,
        bucket: format!("t{seed}"),
        sink,
        route,
    };
    // Enough changes that five kills land before the end on a fast
    // machine too (a run spends about a second connecting).
    let run = conformance::kill_9_oracle(&s, dir.path(), seed, 100_000, KEYS, 1200..2800).await;
    // The re-run did not even rewrite the control document.
    let control = s.control("items");
    common::run_to_end(&run.pipeline);
    assert_eq!(
        s.control("items"),
        control,
        "a re-run rewrote the control document"
    );
    let r = json!({"control": control, "end": run.end, "bucket": s.bucket});
    (cb, dir, r)
}

#[tokio::test]
async fn the_conformance_contract_holds_in_both_modes() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    for (bucket, sink) in [("cfast", ""), ("catomic", ", commit_mode = 'atomic'")] {
        let s = UnderTest {
            cb: &cb,
            bucket: bucket.into(),
            sink,
            route: "",
        };
        conformance::contract(&s).await;
        let c = s.control("contract");
        assert_eq!(c["position"], "300", "{c}");
    }
}

#[tokio::test]
async fn fast_commits_through_kill_9_end_equal_to_the_oracle() {
    let (_cb, _dir, r) = oracle_run(1301, "", "").await;
    assert_eq!(r["control"]["position"], r["end"], "{r}");
    assert!(r["control"]["updated_at"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn atomic_commits_through_kill_9_end_equal_to_the_oracle() {
    let (cb, _dir, r) = oracle_run(1302, ", commit_mode = 'atomic'", "").await;
    let c = &r["control"];
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

#[tokio::test]
async fn two_atomic_writers_of_one_table_keep_both_positions() {
    let (_cb, _dir, r) = oracle_run(1303, ", commit_mode = 'atomic'", ", workers = 2").await;
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
        sink.commit(&target, &simple_batch(&first), "p1")
            .await
            .unwrap();
        sink.inject_fault(point);
        let err = sink
            .commit(&target, &simple_batch(&second), "p2")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("injected fault"), "{err}");
        drop(sink);

        // The restart; after the last fault in fast mode, which must finish
        // the atomic commit too (and clear its record).
        let restart_spec = if point == FaultPoint::MidApply {
            let fast = text.replace("commit_mode = 'atomic'", "commit_mode = 'fast'");
            common::plan_sql(&fast).await.unwrap().spec.sinks[0].clone()
        } else {
            spec.clone()
        };
        let sink = CouchbaseSink::new(&restart_spec).unwrap();
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
                sink.commit(&target, &simple_batch(&second), "p2")
                    .await
                    .unwrap();
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
        if point == FaultPoint::MidApply {
            let c = &control[CONTROL];
            assert!(
                c["pending"].is_null(),
                "a fast restart left the commit record: {c}"
            );
            let j = cb.get(
                &bucket,
                "_default",
                "items",
                &["_urutau::journal::t::2::0".into()],
            );
            assert!(j.values().all(Value::is_null), "{j:?}");
        }
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
        // (`retry_timeout = '0s'`: the run does not retry the outage, so
        // it ends after the sink's own `retry_for`. A `timeout` of 2 s,
        // not 1 s: more room for the first contact with the mock on a
        // loaded machine, where a timeout before the first commit would
        // end the run as the outage does.)
        ", timeout = '2s', retry_for = '3s', retry_timeout = '0s'",
        "",
    );
    let log_path = dir.path().join("run.log");
    // Tailing the file: it runs until it fails.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_committed(&cb, "lost", &mut child, log);
    cb.stop();
    let lost = Instant::now();
    // More changes arrive while the cluster is gone.
    append_lines(&data, &lines[1000..]);
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
    let stderr = log();
    assert_eq!(status.code(), Some(1), "{stderr}");
    // timeout 2 s + retry_for 3 s, plus one backoff and the time to notice.
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

/// Waits (at most 60 s) for the first commit of the run `child` into
/// `bucket`'s `items` (its control document); `log` says why not, also
/// when the run ends first (CI once saw no first commit in 60 s, and
/// nothing said why).
fn wait_committed(
    cb: &Couchbase,
    bucket: &str,
    child: &mut std::process::Child,
    log: impl Fn() -> String,
) {
    let started = Instant::now();
    while cb.get(bucket, "_default", "items", &[CONTROL.into()])[CONTROL].is_null() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the run ended ({status}) before its first commit:\n{}",
                log()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "nothing was committed:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A cluster that stops answering for 6 s mid-run (the mock's processes
/// frozen with SIGSTOP: every connection stays open and silent, the data
/// is kept) is waited out: the sink's timeouts are transient, the run
/// retries them with backoff (`/statusz` says why, `/metrics` counts them)
/// instead of exiting, and once the cluster answers again it carries on;
/// the Python SDK reads every document equal to the source's final state.
#[test]
fn a_cluster_that_stops_answering_is_waited_out_and_ends_equal() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(1307, 3_000, KEYS);
    write_lines(&data, &lines[..1000]);
    // The sink gives a silent cluster 1 s per operation and retries it
    // itself for 2 s; then the run retries the batch (retry_timeout: the
    // default, minutes).
    let p = pipeline(
        dir.path(),
        &data,
        &cb,
        "paused",
        ", timeout = '1s', retry_for = '2s'",
        "",
    );
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let log_path = dir.path().join("run.log");
    // Tailing the file: it runs until it is stopped.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--metrics-addr", &addr])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let get = |path: &str| -> String {
        let url = format!("http://{addr}{path}");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            match reqwest::get(url).await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => format!("no answer: {e}"),
            }
        })
    };
    wait_committed(&cb, "paused", &mut child, log);

    cb.pause();
    let paused = Instant::now();
    // More changes arrive while the cluster is silent.
    append_lines(&data, &lines[1000..]);
    let mut why = String::new();
    while paused.elapsed() < Duration::from_secs(6) {
        let health = get("/healthz");
        if health.contains("retrying") {
            why = health;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run exited while the cluster was silent:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    cb.resume();
    eprintln!("while silent: {why}");
    assert!(
        why.contains("retrying route cb.items") && why.contains("couchbase"),
        "/healthz did not say the run was retrying the Couchbase route: {why}\n{}",
        log()
    );
    let metrics = get("/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("urutau_retries_total") && !l.ends_with(" 0")),
        "no retry counted:\n{metrics}"
    );

    // The run carries on: every document reaches the source's final state.
    let mut want: BTreeMap<String, Value> = (1..=KEYS)
        .map(|id| (format!("[{id}]"), Value::Null))
        .collect();
    for (id, row) in &state {
        want.insert(format!("[{id}]"), row.source.clone());
    }
    let keys: Vec<String> = want.keys().cloned().collect();
    let equal = |read: &BTreeMap<String, Value>| -> Vec<String> {
        want.iter()
            .filter(|(k, w)| {
                // The row, without the metadata (`_urutau.op` is the key's
                // last change, which the oracle does not keep).
                let mut r = read.get(*k).cloned().unwrap_or(Value::Null);
                if let Some(o) = r.as_object_mut() {
                    o.remove("_urutau");
                }
                r != **w
            })
            .map(|(k, w)| format!("{k}: read {:?}, want {w}", read.get(k)))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let d = equal(&cb.get("paused", "_default", "items", &keys));
        if d.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} documents differ after the cluster came back: {:#?}\n{}",
            d.len(),
            &d[..d.len().min(5)],
            log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(child.try_wait().unwrap().is_none(), "the run is up");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !log().contains(&format!("'{}'", cb.password)),
        "the password was logged"
    );
}

/// append-idempotent: one document per change, keyed by its coordinate
/// (file, 0, the line's byte offset), so the replay that follows a forced
/// rollback of the position overwrites instead of duplicating.
#[test]
fn append_idempotent_keys_each_change_by_its_coordinate() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(1306, 3_000, 300);
    write_lines(&data, &lines);
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = 100, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{}');
CREATE SINK cb INTO couchbase WITH ({});
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE cb.log WITH (write_mode = 'append-idempotent') AS
  SELECT id, name, _stream, _shard, _sequence, _op AS op FROM src.items;
",
        data.display(),
        cb.sink_options("idem")
    );
    let p = dir.path().join("p.sql");
    std::fs::write(&p, text).unwrap();
    common::run_to_end(&p);

    let mut offset = 0u64;
    let mut middle = 0u64;
    let mut expected = BTreeMap::new();
    for (i, l) in lines.iter().enumerate() {
        if i == lines.len() / 2 {
            middle = offset;
        }
        let v: Value = serde_json::from_str(l).unwrap();
        let image = if v["op"] == "d" {
            &v["before"]
        } else {
            &v["after"]
        };
        let op = match v["op"].as_str().unwrap() {
            "u" => "update",
            "d" => "delete",
            _ => "insert",
        };
        expected.insert(
            format!("[\"changes.jsonl\",0,{offset}]"),
            json!({"id": image["id"], "name": image["name"],
                   "_urutau": {"_stream": "changes.jsonl", "_shard": 0, "_sequence": offset, "op": op}}),
        );
        offset += l.len() as u64 + 1;
    }
    let keys: Vec<String> = expected.keys().cloned().collect();
    let check = || {
        let read = cb.get("idem", "_default", "log", &keys);
        let d = diff(&read, &expected);
        assert!(
            d.is_empty(),
            "{} of {} differ: {:#?}",
            d.len(),
            keys.len(),
            &d[..d.len().min(5)]
        );
    };
    check();
    let end = offset.to_string();
    let control = cb.get("idem", "_default", "log", &[CONTROL.into()]);
    assert_eq!(control[CONTROL]["position"], end.as_str());

    // Roll the position back to the middle: the replay lands on the same keys.
    set_control(&cb, "idem", "log", json!({"position": middle.to_string()}));
    let out = common::run_to_end(&p);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains(&format!("resuming route=cb.log position={middle}")),
        "{log}"
    );
    check();
    let control = cb.get("idem", "_default", "log", &[CONTROL.into()]);
    assert_eq!(control[CONTROL]["position"], end.as_str());
}

/// Overwrites a collection's control document (a forced rollback).
fn set_control(cb: &Couchbase, bucket: &str, collection: &str, doc: Value) {
    use std::io::Write;
    let mut child = std::process::Command::new(python())
        .arg(common::harness_script("couchbase.py"))
        .args(["upsert", "--connstr", &cb.connstr, "--username", &cb.user])
        .args([
            "--password",
            &cb.password,
            "--bucket",
            bucket,
            "--collection",
            collection,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json!({ CONTROL: doc }).to_string().as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// append: one document per change, keyed by the position the batch
/// follows and the change's index in the batch; deletes are appended too.
#[tokio::test]
async fn append_keys_changes_by_the_position_they_follow() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let text = format!(
        "CREATE PIPELINE a;
CREATE SOURCE src FROM file WITH (path = 'x.jsonl');
CREATE SINK cb INTO couchbase WITH ({});
CREATE TABLE src.items (id BIGINT NOT NULL, name VARCHAR, PRIMARY KEY (id));
CREATE TABLE cb.items WITH (write_mode = 'append') AS SELECT * FROM src.items;",
        cb.sink_options("append")
    );
    let plan = common::plan_sql(&text)
        .await
        .unwrap_or_else(|d| panic!("{}", common::show(&d)));
    let sink = CouchbaseSink::new(&plan.spec.sinks[0]).unwrap();
    let target = plan.routes[0].target.clone();
    sink.ensure_table(&target).await.unwrap();
    sink.commit(
        &target,
        &simple_batch(&[(1, Some("a")), (1, Some("b"))]),
        "p1",
    )
    .await
    .unwrap();
    // A delete of an append route carries its before image.
    let mut del = simple_batch(&[(1, Some("b"))]);
    del.deletes = BooleanArray::from(vec![true]);
    sink.commit(&target, &del, "p2").await.unwrap();
    let keys: Vec<String> = ["[\"\",0]", "[\"\",1]", "[\"p1\",0]", "[\"p1\",1]"]
        .map(String::from)
        .to_vec();
    let read = cb.get("append", "_default", "items", &keys);
    assert_eq!(read[&keys[0]], json!({"id": 1, "name": "a"}));
    assert_eq!(read[&keys[1]], json!({"id": 1, "name": "b"}));
    assert_eq!(read[&keys[2]], json!({"id": 1, "name": "b"}));
    assert!(read[&keys[3]].is_null(), "{read:?}");
}

/// The keys the changes of `lines` touch (a key-changing update both),
/// sorted, once each.
fn touched_ids(lines: &[String]) -> Vec<i64> {
    let mut ids = Vec::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        for image in [&v["before"], &v["after"]] {
            if let Some(id) = image["id"].as_i64()
                && !ids.contains(&id)
            {
                ids.push(id);
            }
        }
    }
    ids.sort();
    ids
}

/// The ids of a preview's rows, sorted.
fn preview_ids(result: &urutau::QueryResult) -> Vec<i64> {
    let mut ids: Vec<i64> = result
        .batches
        .iter()
        .flat_map(|b| {
            let id = arrow::compute::cast(
                b.column_by_name("id").unwrap(),
                &arrow::datatypes::DataType::Int64,
            )
            .unwrap();
            arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(&id)
                .values()
                .to_vec()
        })
        .collect();
    ids.sort();
    ids
}

/// A preview into Couchbase reads the control document without preparing
/// anything: before the first run no bucket, scope or collection is made
/// (the cluster's layout, listed by the Python SDK, is unchanged); after a
/// run it shows only the changes after the committed position, `limit` of
/// them, and the control document stays as it was.
#[tokio::test]
async fn preview_reads_the_position_and_creates_no_layout() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(4242, 40, 15);
    write_lines(&data, &lines[..20]);
    let p = pipeline(dir.path(), &data, &cb, "pv", "", "");
    let layout = cb.layout();
    assert!(layout.get("pv").is_none(), "{layout}");

    let pipeline = urutau::Pipeline::load(&p).await.unwrap();
    let preview = pipeline.preview(5).await.unwrap();
    assert_eq!(preview_ids(&preview["cb.items"]), touched_ids(&lines[..5]));
    assert_eq!(cb.layout(), layout, "preview created nothing");

    common::run_to_end(&p);
    let control = cb.get("pv", "_default", "items", &[CONTROL.into()]);
    assert!(control[CONTROL]["position"].is_string(), "{control:?}");
    let layout = cb.layout();

    write_lines(&data, &lines);
    let preview = pipeline.preview(5).await.unwrap();
    assert_eq!(
        preview_ids(&preview["cb.items"]),
        touched_ids(&lines[20..25]),
        "the 5 changes after the committed position"
    );
    assert_eq!(
        cb.get("pv", "_default", "items", &[CONTROL.into()]),
        control,
        "the control document is untouched"
    );
    assert_eq!(cb.layout(), layout);
}

/// The Couchbase tables of a two-column pipeline into `bucket`, with
/// `sink` options and route `options`.
async fn parts_sink(
    cb: &Couchbase,
    bucket: &str,
    sink: &str,
    route: &str,
) -> (
    CouchbaseSink,
    std::sync::Arc<urutau_planner::target::TargetTable>,
) {
    let text = format!(
        "CREATE PIPELINE a;
CREATE SOURCE src FROM file WITH (path = 'x.jsonl');
CREATE SINK cb INTO couchbase WITH ({}{sink});
CREATE TABLE src.items (id BIGINT NOT NULL, name VARCHAR, PRIMARY KEY (id));
CREATE TABLE cb.items WITH ({route}) AS SELECT * FROM src.items;",
        cb.sink_options(bucket)
    );
    let plan = common::plan_sql(&text)
        .await
        .unwrap_or_else(|d| panic!("{}", common::show(&d)));
    let sink = CouchbaseSink::new(&plan.spec.sinks[0]).unwrap();
    let target = plan.routes[0].target.clone();
    sink.ensure_table(&target).await.unwrap();
    (sink, target)
}

/// A transaction larger than a batch, in atomic mode: its parts go into
/// the next batch's journal and touch no document (the Python SDK reads
/// none of them, nor a moved position) until the batch that closes it,
/// which applies every part in order — a later part's change of a key
/// wins. Parts a crash left uncommitted are removed by the next start,
/// which leaves the documents and the position as they were.
#[tokio::test]
async fn atomic_parts_of_a_transaction_land_only_with_its_last_batch() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let (sink, target) = parts_sink(
        &cb,
        "parts",
        ", commit_mode = 'atomic'",
        "primary_key = 'id'",
    )
    .await;
    assert!(sink.stages_transactions(&target));
    let keys: Vec<String> = (1..=5).map(|i| format!("[{i}]")).collect();
    let journal = |c: u32| format!("_urutau::journal::t::1::{c}");
    sink.stage(
        &target,
        &simple_batch(&[(1, Some("a")), (2, Some("a")), (3, Some("a"))]),
    )
    .await
    .unwrap();
    sink.stage(&target, &simple_batch(&[(2, Some("b")), (3, None)]))
        .await
        .unwrap();
    let staged = cb.get("parts", "_default", "items", &[journal(0), journal(1)]);
    assert!(staged[&journal(0)]["entries"].is_array(), "{staged:?}");
    assert!(staged[&journal(1)]["entries"].is_array(), "{staged:?}");
    let read = cb.get("parts", "_default", "items", &keys);
    assert!(
        read.values().all(Value::is_null),
        "nothing applied: {read:?}"
    );
    let control = cb.get("parts", "_default", "items", &[CONTROL.into()]);
    assert!(control[CONTROL].is_null(), "no position yet: {control:?}");

    sink.commit(&target, &simple_batch(&[(4, Some("c"))]), "p1")
        .await
        .unwrap();
    let read = cb.get("parts", "_default", "items", &keys);
    assert_eq!(read["[1]"], json!({"id": 1, "name": "a"}));
    assert_eq!(read["[2]"], json!({"id": 2, "name": "b"}));
    assert!(read["[3]"].is_null(), "deleted by the later part: {read:?}");
    assert_eq!(read["[4]"], json!({"id": 4, "name": "c"}));
    let control = cb.get("parts", "_default", "items", &[CONTROL.into()]);
    assert_eq!(control[CONTROL]["position"], json!("p1"), "{control:?}");
    assert_eq!(
        control[CONTROL]["pending"]["chunks"],
        json!(3),
        "{control:?}"
    );

    // A run that staged a part and crashed: the next start discards it.
    sink.stage(&target, &simple_batch(&[(1, Some("z")), (5, Some("z"))]))
        .await
        .unwrap();
    let left = cb.get(
        "parts",
        "_default",
        "items",
        &["_urutau::journal::t::2::0".into()],
    );
    assert!(!left["_urutau::journal::t::2::0"].is_null(), "{left:?}");
    drop(sink);
    let (sink, target) = parts_sink(
        &cb,
        "parts",
        ", commit_mode = 'atomic'",
        "primary_key = 'id'",
    )
    .await;
    let left = cb.get(
        "parts",
        "_default",
        "items",
        &["_urutau::journal::t::2::0".into()],
    );
    assert!(left["_urutau::journal::t::2::0"].is_null(), "{left:?}");
    assert_eq!(
        sink.committed_position(&target).await.unwrap().as_deref(),
        Some("p1")
    );
    let again = cb.get("parts", "_default", "items", &keys);
    assert_eq!(
        again, read,
        "the documents are as the last commit left them"
    );
}

/// In fast mode a part's documents are written at once (a replay writes
/// them again), the position moves only with the transaction's last
/// batch, and an append route's keys count on across the parts, as if
/// the transaction had come whole.
#[tokio::test]
async fn fast_parts_write_their_documents_and_append_keys_count_on() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let cb = Couchbase::start(&python, &dir.path().join("cb"));
    let (sink, target) = parts_sink(&cb, "fastparts", "", "write_mode = 'append'").await;
    assert!(sink.stages_transactions(&target));
    sink.commit(&target, &simple_batch(&[(9, Some("first"))]), "p1")
        .await
        .unwrap();
    sink.stage(&target, &simple_batch(&[(1, Some("a")), (2, Some("b"))]))
        .await
        .unwrap();
    assert_eq!(
        sink.committed_position(&target).await.unwrap().as_deref(),
        Some("p1"),
        "a part moves no position"
    );
    sink.stage(&target, &simple_batch(&[(1, Some("c"))]))
        .await
        .unwrap();
    sink.commit(&target, &simple_batch(&[(3, Some("d"))]), "p2")
        .await
        .unwrap();
    let keys: Vec<String> = (0..5).map(|i| format!("[\"p1\",{i}]")).collect();
    let read = cb.get("fastparts", "_default", "items", &keys);
    assert_eq!(read[&keys[0]], json!({"id": 1, "name": "a"}));
    assert_eq!(read[&keys[1]], json!({"id": 2, "name": "b"}));
    assert_eq!(read[&keys[2]], json!({"id": 1, "name": "c"}));
    assert_eq!(read[&keys[3]], json!({"id": 3, "name": "d"}));
    assert!(read[&keys[4]].is_null(), "{read:?}");
    let control = cb.get("fastparts", "_default", "items", &[CONTROL.into()]);
    assert_eq!(control[CONTROL]["position"], json!("p2"), "{control:?}");
}
