//! The ClickHouse sink against the real ClickHouse engine: the test
//! harness's HTTP front over chdb (tests/harness/clickhouse_front.py), or a
//! real server when `URUTAU_TEST_CLICKHOUSE_URL` is set. Everything the
//! sink wrote is read back by the engine itself (`SELECT ... FINAL`).

mod common;

use common::{run_to_end, urutau};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::ClickHouse;
use common::conformance::{self, SinkUnderTest};
use common::workload::{COLUMNS, Row, differences, workload, write_lines};
use serde_json::{Value, json};

/// The position the run resumed its only route from (`None`: from the
/// beginning).
fn resumed_from(pipeline: &Path) -> Option<String> {
    let out = urutau(&[
        "run",
        pipeline.to_str().unwrap(),
        "--exit-when-caught-up",
        "--log-format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "resuming")
        .and_then(|l| l["fields"]["position"].as_str().map(str::to_string))
}

/// A pipeline: the file into ClickHouse table `<db>.items`.
fn pipeline(
    dir: &Path,
    data: &Path,
    ch: &ClickHouse,
    db: &str,
    table_options: &str,
    max_rows: usize,
) -> PathBuf {
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = {max_rows}, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK ch INTO clickhouse WITH ({options});
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE ch.items WITH ({table_options}) AS SELECT * FROM src.items;
",
        data = data.display(),
        options = ch.sink_options(db)
    );
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// The columns of `items` as the engine renders them (see [`expected`]).
const READ: &str = "SELECT id, name, amount, qty, ratio, active, toString(born) AS born,
  toString(seen) AS seen, toString(uid) AS uid, lower(hex(raw)) AS raw, attrs, tags, props";

/// What the engine renders for an oracle row: ClickHouse has no NULL Array
/// or Map, so a NULL list or map reads back empty.
fn expected(row: &Row) -> Value {
    let s = &row.source;
    let r = &row.read;
    let tags = if s["tags"].is_null() {
        json!([])
    } else {
        s["tags"].clone()
    };
    let props = if s["props"].is_null() {
        json!({})
    } else {
        s["props"].clone()
    };
    json!({
        "id": s["id"], "name": s["name"], "amount": s["amount"], "qty": s["qty"],
        "ratio": s["ratio"], "active": s["active"], "born": s["born"],
        "seen": r["seen"].as_str().map(|t| t.replace('T', " ").replace("+00:00", "")),
        "uid": s["uid"], "raw": r["raw"], "attrs": s["attrs"], "tags": tags, "props": props,
    })
}

fn expected_rows(state: &BTreeMap<i64, Row>) -> Vec<Value> {
    state.values().map(expected).collect()
}

fn count(rows: &[Value]) -> u64 {
    rows[0]["n"].as_u64().unwrap()
}

/// The conformance suite's view of one database, read by the engine
/// itself under `FINAL`.
struct UnderTest<'a> {
    ch: &'a ClickHouse,
    db: &'a str,
}

impl SinkUnderTest for UnderTest<'_> {
    fn create_sink(&self) -> String {
        format!(
            "CREATE SINK s INTO clickhouse WITH ({});",
            self.ch.sink_options(self.db)
        )
    }
    async fn rows(&self, table: &str, _keys: i64) -> Vec<Value> {
        let columns = if table == "items" {
            READ
        } else {
            "SELECT id, name"
        };
        self.ch
            .rows(&format!(
                "{columns} FROM {}.{table} FINAL ORDER BY id",
                self.db
            ))
            .await
    }
    fn expected(&self, row: &Row, _op: &str) -> Value {
        expected(row)
    }
    async fn position(&self, table: &str) -> Option<String> {
        let r = self
            .ch
            .rows(&format!(
                "SELECT argMax(position, seq) AS p, count() AS n FROM {}.{table}",
                self.db
            ))
            .await;
        (count(&r) > 0).then(|| r[0]["p"].as_str().unwrap().to_string())
    }
}

#[tokio::test]
async fn the_conformance_contract_holds() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_contract").await;
    conformance::contract(&UnderTest {
        ch: &ch,
        db: "urutau_t_contract",
    })
    .await;
}

/// The acceptance suite: the conformance suite's seeded stream (50k
/// changes over 5k keys, killed with SIGKILL five times, then run to the
/// end; `SELECT ... FINAL` equals the oracle), and what ClickHouse adds:
/// `seq` grows with the position across the restarts; cleanup keeps the
/// read.
#[tokio::test]
async fn random_upserts_with_kill_9_end_equal_to_the_oracle_under_final() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    upserts_through_kill_9_equal_the_oracle(&ch, dir.path()).await;
}

/// The same suite over https (issue 20): the front serves a certificate of
/// the harness's test CA and the sink trusts it by `ca_cert`. A sink told
/// to trust another CA stops at once (exit 1) saying what to set, with no
/// password in its words.
#[tokio::test]
async fn random_upserts_over_https_with_the_test_ca_end_equal_under_final() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let certs = common::certs(&dir.path().join("certs"));
    let ch = ClickHouse::start_tls(&python, &dir.path().join("ch"), &certs);
    assert!(ch.url.starts_with("https://"), "{}", ch.url);
    upserts_through_kill_9_equal_the_oracle(&ch, dir.path()).await;

    let other = certs["other_ca"].as_str().unwrap();
    let data = dir.path().join("other.jsonl");
    std::fs::write(&data, "").unwrap();
    let p = pipeline(
        dir.path(),
        &data,
        &ch,
        "urutau_t_up_other",
        "primary_key = 'id'",
        100,
    );
    let text = std::fs::read_to_string(&p).unwrap();
    let ca = certs["ca"].as_str().unwrap();
    std::fs::write(&p, text.replace(ca, other)).unwrap();
    let out = urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("not signed by a CA the sink trusts: set ca_cert"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "presented a certificate with subject \"CN=localhost\", issued by \"CN=urutau test CA\", for localhost 127.0.0.1, checked against the CA file {other}"
        )),
        "{said}"
    );
    assert!(!said.contains(&ch.password), "{said}");
}

/// The kill -9 oracle on `ch`, database `urutau_t_up`, and what ClickHouse
/// adds to it.
async fn upserts_through_kill_9_equal_the_oracle(ch: &ClickHouse, dir: &Path) {
    ch.fresh_database("urutau_t_up").await;
    let s = UnderTest {
        ch,
        db: "urutau_t_up",
    };
    let run = conformance::kill_9_oracle(&s, dir, 20261130, 50_000, 5_000, 40..400).await;
    let (p, state, read) = (&run.pipeline, &run.state, &run.rows);

    // One position per seq, and positions grow with seq across restarts.
    let seqs = ch
        .rows("SELECT seq, min(position) AS lo, max(position) AS hi FROM urutau_t_up.items GROUP BY seq ORDER BY seq")
        .await;
    assert!(seqs.len() > 50, "{} batches", seqs.len());
    let mut last = -1i64;
    for s in &seqs {
        assert_eq!(s["lo"], s["hi"], "one position per seq: {s}");
        let pos: i64 = s["lo"].as_str().unwrap().parse().unwrap();
        assert!(pos > last, "seq order is position order: {s}");
        last = pos;
    }
    // Cleanup removes tombstones physically; the FINAL read is unchanged.
    let out = urutau(&["clickhouse", "cleanup", p.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("urutau_t_up.items: cleaned:"), "{said}");
    let tombstones = count(
        &ch.rows("SELECT count() AS n FROM urutau_t_up.items WHERE is_deleted = 1")
            .await,
    );
    assert_eq!(tombstones, 0, "cleanup leaves no tombstone");
    assert_eq!(
        count(&ch.rows("SELECT count() AS n FROM urutau_t_up.items").await),
        state.len() as u64,
        "cleanup leaves one row per live key"
    );
    let again = ch
        .rows(&format!("{READ} FROM urutau_t_up.items FINAL ORDER BY id"))
        .await;
    assert_eq!(&again, read);
}

/// Append: every change is a row, exactly once, across kill -9 restarts;
/// deletes are rows flagged `is_deleted`.
#[tokio::test]
async fn append_records_every_change_exactly_once_across_kill_9() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_ap").await;
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(7, 20_000, 2_000);
    write_lines(&data, &lines);
    let p = pipeline(
        dir.path(),
        &data,
        &ch,
        "urutau_t_ap",
        "write_mode = 'append'",
        150,
    );
    common::kill_9_runs(&p, 5, 3, 40..400);
    run_to_end(&p);
    let deletes = lines.iter().filter(|l| l.contains("\"op\":\"d\"")).count();
    let got = ch
        .rows("SELECT count() AS n, countIf(is_deleted = 1) AS d, uniqExact(seq) AS batches FROM urutau_t_ap.items")
        .await;
    assert_eq!(
        got[0]["n"].as_u64().unwrap(),
        lines.len() as u64,
        "one row per change"
    );
    assert_eq!(got[0]["d"].as_u64().unwrap(), deletes as u64);
    run_to_end(&p);
    assert_eq!(
        count(&ch.rows("SELECT count() AS n FROM urutau_t_ap.items").await),
        lines.len() as u64,
        "a re-run adds nothing"
    );
    let engine = ch
        .rows("SELECT engine FROM system.tables WHERE database = 'urutau_t_ap' AND name = 'items'")
        .await;
    assert_eq!(engine[0]["engine"], "MergeTree");
}

/// The coordinate (position, seq) owner `owner` of `db.items` recorded last.
async fn owner_coordinate(ch: &ClickHouse, db: &str, owner: u32) -> (String, u64) {
    let r = ch
        .rows(&format!(
            "SELECT argMax(position, seq) AS p, max(seq) AS s FROM {db}.items_urutau_position WHERE owner = {owner}"
        ))
        .await;
    (
        r[0]["p"].as_str().unwrap().to_string(),
        r[0]["s"].as_u64().unwrap(),
    )
}

/// Sets owner `owner`'s coordinate back to `(position, seq)`, as if it had
/// died after writing its rows and before recording where it was.
async fn set_owner_coordinate(ch: &ClickHouse, db: &str, owner: u32, (position, seq): (&str, u64)) {
    ch.query(&format!(
        "ALTER TABLE {db}.items_urutau_position DELETE WHERE owner = {owner} SETTINGS mutations_sync = 2"
    ))
    .await;
    ch.query(&format!(
        "INSERT INTO {db}.items_urutau_position (owner, position, seq) VALUES ({owner}, '{position}', {seq})"
    ))
    .await;
}

/// workers = 4: each owner records its coordinate; a lagging owner (a crash
/// between owners) is where the table resumes from, not the newest; an
/// incomplete owner set is an error.
#[tokio::test]
async fn a_lagging_owner_is_where_a_partitioned_table_resumes() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_pt").await;
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(11, 3_000, 400);
    // First half, then all: owner 2's coordinate after the first half is
    // what it will fall back to.
    write_lines(&data, &lines[..1_500]);
    let p = pipeline(
        dir.path(),
        &data,
        &ch,
        "urutau_t_pt",
        "write_mode = 'upsert', workers = 4",
        100,
    );
    run_to_end(&p);
    let (lag_position, lag_seq) = owner_coordinate(&ch, "urutau_t_pt", 2).await;
    write_lines(&data, &lines);
    run_to_end(&p);
    let file_len = std::fs::metadata(&data).unwrap().len().to_string();
    let owners = ch
        .rows("SELECT owner, argMax(position, seq) AS p FROM urutau_t_pt.items_urutau_position GROUP BY owner ORDER BY owner")
        .await;
    assert_eq!(owners.len(), 4, "{owners:?}");
    assert!(
        owners.iter().all(|o| o["p"] == file_len.as_str()),
        "{owners:?}"
    );

    // Owner 2 falls behind: its newer coordinates are gone, as if it had
    // written its rows and died before recording where it was.
    set_owner_coordinate(&ch, "urutau_t_pt", 2, (&lag_position, lag_seq)).await;
    let from = resumed_from(&p);
    assert_eq!(
        from.as_deref(),
        Some(lag_position.as_str()),
        "resumes from the lagging owner"
    );
    assert_ne!(lag_position, file_len);
    let read = ch
        .rows(&format!("{READ} FROM urutau_t_pt.items FINAL ORDER BY id"))
        .await;
    let problems = differences(&read, &expected_rows(&state));
    assert!(
        problems.is_empty(),
        "{:#?}",
        &problems[..problems.len().min(10)]
    );

    // An owner with no coordinate at all: an error, not a guess.
    ch.query(
        "ALTER TABLE urutau_t_pt.items_urutau_position DELETE WHERE owner = 3 SETTINGS mutations_sync = 2",
    )
    .await;
    let out = urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("incomplete owner set"), "{err}");
}

/// append-idempotent on a partitioned table: a lagging owner's replay lands
/// its rows a second time (partitioned append is at-least-once), and the
/// table, a `ReplacingMergeTree` ordered by the transport coordinate, reads
/// every change exactly once under `FINAL`.
#[tokio::test]
async fn append_idempotent_reads_a_replayed_change_once() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_ai").await;
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(13, 3_000, 400);
    write_lines(&data, &lines[..1_500]);
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = 100, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK ch INTO clickhouse WITH ({options});
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE ch.items WITH (write_mode = 'append-idempotent', workers = 4) AS
  SELECT id, name, _op AS op, _stream AS stream, _shard AS shard, _sequence AS sequence FROM src.items;
",
        data = data.display(),
        options = ch.sink_options("urutau_t_ai")
    );
    let p = dir.path().join("p.sql");
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    let (lag_position, lag_seq) = owner_coordinate(&ch, "urutau_t_ai", 2).await;
    write_lines(&data, &lines);
    run_to_end(&p);
    // Owner 2 falls behind, as if it had died after writing its rows and
    // before recording where it was: the next run replays its share. (No
    // background merge may remove the copies before they are counted.)
    ch.query("SYSTEM STOP MERGES urutau_t_ai.items").await;
    set_owner_coordinate(&ch, "urutau_t_ai", 2, (&lag_position, lag_seq)).await;
    assert_eq!(resumed_from(&p).as_deref(), Some(lag_position.as_str()));

    let n = lines.len() as u64;
    let raw = count(&ch.rows("SELECT count() AS n FROM urutau_t_ai.items").await);
    assert!(
        raw > n,
        "the replay landed rows again ({raw} rows for {n} changes)"
    );
    let once = ch
        .rows("SELECT count() AS n, uniqExact(stream, shard, sequence) AS u, countIf(stream = 'changes.jsonl' AND shard = 0) AS here FROM urutau_t_ai.items FINAL")
        .await;
    assert_eq!(
        once[0]["n"].as_u64().unwrap(),
        n,
        "one row per change under FINAL"
    );
    assert_eq!(
        once[0]["u"].as_u64().unwrap(),
        n,
        "each with its own coordinate"
    );
    assert_eq!(once[0]["here"].as_u64().unwrap(), n);
    // The coordinates are exactly the lines' offsets.
    let mut offsets = Vec::new();
    let mut at = 0u64;
    for l in &lines {
        offsets.push(at);
        at += l.len() as u64 + 1;
    }
    let read: Vec<u64> = ch
        .rows("SELECT sequence FROM urutau_t_ai.items FINAL ORDER BY sequence")
        .await
        .iter()
        .map(|r| r["sequence"].as_u64().unwrap())
        .collect();
    assert!(read == offsets, "every line's offset, once");
    let engine = ch
        .rows("SELECT engine, sorting_key FROM system.tables WHERE database = 'urutau_t_ai' AND name = 'items'")
        .await;
    assert_eq!(engine[0]["engine"], "ReplacingMergeTree");
    assert_eq!(engine[0]["sorting_key"], "stream, shard, sequence");

    // The copies are cheap to remove: cleanup merges them away.
    ch.query("SYSTEM START MERGES urutau_t_ai.items").await;
    let out = urutau(&["clickhouse", "cleanup", p.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("urutau_t_ai.items: cleaned:"), "{said}");
    assert_eq!(
        count(&ch.rows("SELECT count() AS n FROM urutau_t_ai.items").await),
        n,
        "one row per change after cleanup, even without FINAL"
    );
}

/// Every canonical kind lands in its native ClickHouse type and reads back.
#[tokio::test]
async fn every_canonical_kind_round_trips_natively() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_k").await;
    let data = dir.path().join("kinds.jsonl");
    let max = json!({
        "id": 1, "b": true, "i": i32::MIN, "u": u64::MAX, "r": 1.5, "d": -0.0,
        "n": "9999999999999999999999999999.9999999999", "s": "ünï \"q\"", "bin": "AP8=", "fx": "3q2+7w==",
        "dt": "1969-12-31", "tm": "23:59:59.999999", "ts": "1969-12-31T23:59:59.999999",
        "tz": "1900-01-01T00:00:00.000001+02:00", "uid": "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
        "j": "{\"a\":[1,2]}", "st": {"a": 7, "b": ["x", null]}, "l": [i64::MAX, null], "m": {"k": 0.25, "z": null},
        "order": "kw", "a b": 5
    });
    let nulls = json!({"id": 2});
    write_lines(
        &data,
        &[
            json!({"op": "c", "after": max, "source": {"table": "kinds"}}).to_string(),
            json!({"op": "c", "after": nulls, "source": {"table": "kinds"}}).to_string(),
        ],
    );
    let text = format!(
        "CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK ch INTO clickhouse WITH ({options});
CREATE TABLE src.kinds (id BIGINT NOT NULL, b BOOLEAN, i INT, u UBIGINT, r REAL, d DOUBLE, n DECIMAL(38,10),
  s VARCHAR, bin BYTEA, fx FIXED(4), dt DATE, tm TIME, ts TIMESTAMP, tz TIMESTAMPTZ, uid UUID, j JSON,
  st STRUCT<a INT, b LIST<VARCHAR>>, l LIST<BIGINT>, m MAP<VARCHAR, DOUBLE>, \"order\" VARCHAR, \"a b\" INT,
  PRIMARY KEY (id));
CREATE TABLE ch.kinds AS SELECT * FROM src.kinds;
",
        data = data.display(),
        options = ch.sink_options("urutau_t_k")
    );
    let p = dir.path().join("k.sql");
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    let rows = ch
        .rows(
            "SELECT id, b, i, u, r, d, n, s, lower(hex(bin)) AS bin, lower(hex(fx)) AS fx, toString(dt) AS dt,
               toString(tm) AS tm, toString(ts) AS ts, toString(tz) AS tz, toString(uid) AS uid, j, st, l, m,
               `order`, `a b` FROM urutau_t_k.kinds FINAL ORDER BY id",
        )
        .await;
    assert_eq!(
        rows[0],
        json!({
            "id": 1, "b": true, "i": i32::MIN, "u": u64::MAX, "r": 1.5, "d": -0.0,
            "n": "9999999999999999999999999999.9999999999", "s": "ünï \"q\"", "bin": "00ff", "fx": "deadbeef",
            "dt": "1969-12-31", "tm": "23:59:59.999999", "ts": "1969-12-31 23:59:59.999999",
            "tz": "1899-12-31 22:00:00.000001", "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "j": "{\"a\":[1,2]}", "st": {"a": 7, "b": ["x", null]}, "l": [i64::MAX, null],
            "m": {"k": 0.25, "z": null}, "order": "kw", "a b": 5
        })
    );
    assert_eq!(
        rows[1],
        json!({
            "id": 2, "b": null, "i": null, "u": null, "r": null, "d": null, "n": null, "s": null,
            "bin": null, "fx": null, "dt": null, "tm": null, "ts": null, "tz": null, "uid": null,
            "j": null, "st": null, "l": [], "m": {}, "order": null, "a b": null
        })
    );
    let types: BTreeMap<String, String> = ch
        .rows("SELECT name, type FROM system.columns WHERE database = 'urutau_t_k' AND table = 'kinds'")
        .await
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (name, ty) in [
        ("id", "Int64"),
        ("u", "Nullable(UInt64)"),
        ("n", "Nullable(Decimal(38, 10))"),
        ("fx", "Nullable(FixedString(4))"),
        ("dt", "Nullable(Date32)"),
        ("tm", "Nullable(Time64(6))"),
        ("ts", "Nullable(DateTime64(6))"),
        ("tz", "Nullable(DateTime64(6, 'UTC'))"),
        ("uid", "Nullable(UUID)"),
        ("j", "Nullable(String)"),
        (
            "st",
            "Nullable(Tuple(a Nullable(Int32), b Array(Nullable(String))))",
        ),
        ("l", "Array(Nullable(Int64))"),
        ("m", "Map(String, Nullable(Float64))"),
        ("position", "String"),
        ("seq", "UInt64"),
        ("is_deleted", "UInt8"),
    ] {
        assert_eq!(types.get(name).map(String::as_str), Some(ty), "{name}");
    }
    let engine = ch
        .rows("SELECT engine_full FROM system.tables WHERE database = 'urutau_t_k' AND name = 'kinds'")
        .await;
    let engine = engine[0]["engine_full"].as_str().unwrap();
    assert!(
        engine.starts_with("ReplacingMergeTree(seq, is_deleted) ORDER BY (id)"),
        "{engine}"
    );
    assert!(!engine.contains("PARTITION BY"), "{engine}");
}

/// An existing table that does not match the route is an error naming the
/// columns under `schema_changes = 'fail'`; under the default (`evolve`) a
/// difference ClickHouse cannot apply (the type of a sorting key column) is
/// refused before any ALTER. Either way nothing is written or altered.
#[tokio::test]
async fn an_existing_table_that_does_not_match_is_an_error_naming_columns() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_mm").await;
    ch.query("CREATE DATABASE urutau_t_mm").await;
    ch.query("CREATE TABLE urutau_t_mm.items (id Int32, name String, position String, seq UInt64, is_deleted UInt8) ENGINE = ReplacingMergeTree(seq, is_deleted) ORDER BY id")
        .await;
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(3, 50, 20);
    write_lines(&data, &lines);
    let columns = "SELECT name FROM system.columns WHERE database = 'urutau_t_mm' AND table = 'items' ORDER BY position";
    let before = ch.rows(columns).await;
    for (options, expected) in [
        (
            "write_mode = 'upsert', schema_changes = 'fail'",
            vec![
                "column `id` is Int32, the route needs Int64",
                "column `amount` (Nullable(Decimal(12, 2))) is missing",
            ],
        ),
        (
            "write_mode = 'upsert'",
            vec![
                "key column `id` is Int32 in the table and the route writes Int64: ClickHouse cannot change the type of a sorting key column",
            ],
        ),
    ] {
        let p = pipeline(dir.path(), &data, &ch, "urutau_t_mm", options, 150);
        let out = urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
        assert_eq!(out.status.code(), Some(1), "{options}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("urutau_t_mm.items exists and does not match"),
            "{options}: {err}"
        );
        for part in expected {
            assert!(err.contains(part), "{options}: {err}");
        }
        assert!(
            !err.contains("ch-test-secret"),
            "the password never appears: {err}"
        );
        assert_eq!(
            count(&ch.rows("SELECT count() AS n FROM urutau_t_mm.items").await),
            0,
            "{options}"
        );
        assert_eq!(ch.rows(columns).await, before, "{options}: no ALTER ran");
    }
}
