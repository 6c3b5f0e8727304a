//! Schema changes at the source (issue 18): a real PostgreSQL server whose
//! routed table gains a column, has it widened, loses another and has a
//! third renamed, under a concurrent seeded writer and kill -9, replicated
//! into Iceberg (SQLite catalog; read back by DuckDB and by Iceberg's Java
//! reader) and ClickHouse (read back by the ClickHouse engine under
//! `FINAL`); plus the changes that must stop a run, with what they say.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg_cdc::{eventually, pool};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use sqlx::{Executor, Row};

const SCHEMA: &str = "
CREATE TABLE t (id bigint PRIMARY KEY, v text NOT NULL, n int, amount numeric(10,2), note text);
CREATE TABLE u (id bigint PRIMARY KEY, w text);
";

/// The changes of the acceptance sequence, in order: after change `k`
/// the writer writes the shape of phase `k + 1`.
const CHANGES: [&str; 4] = [
    "ALTER TABLE t ADD COLUMN extra int",
    "ALTER TABLE t ALTER COLUMN extra TYPE bigint",
    "ALTER TABLE t DROP COLUMN v",
    "ALTER TABLE t RENAME COLUMN n TO n2",
];

struct Setup {
    python: PathBuf,
    dir: tempfile::TempDir,
    _pg: common::Postgres,
    db: PgPool,
    uri: String,
}

async fn setup() -> Setup {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let pg = common::Postgres::start(&dir.path().join("pg"));
    let db = pool(&pg).await;
    db.execute(SCHEMA).await.unwrap();
    Setup {
        python,
        uri: pg.uri(),
        dir,
        _pg: pg,
        db,
    }
}

/// The pipeline: `t` into Iceberg and (with `ch`) ClickHouse, `u` into
/// Iceberg; `route_options` go into each route of `t`, `t_select` is what
/// the Iceberg route of `t` selects.
fn pipeline(
    s: &Setup,
    ch: Option<(&common::ClickHouse, &str)>,
    route_options: &str,
    t_select: &str,
) -> PathBuf {
    let d = s.dir.path().display();
    let mut text = format!(
        "CREATE PIPELINE p WITH (max_batch_rows = 500, max_batch_interval = '100ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot_chunk_rows = 400);
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');
CREATE TABLE lake.t WITH (primary_key = 'id'{route_options}) AS SELECT {t_select} FROM src.t;
CREATE TABLE lake.u WITH (primary_key = 'id') AS SELECT * FROM src.u;
",
        uri = s.uri
    );
    if let Some((ch, database)) = ch {
        text.push_str(&format!(
            "CREATE SINK wh INTO clickhouse WITH ({});
CREATE TABLE wh.t WITH (primary_key = 'id'{route_options}) AS SELECT * FROM src.t;
",
            ch.sink_options(database)
        ));
    }
    let p = s.dir.path().join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// The Iceberg table's current metadata (the SQLite catalog's pointer).
async fn metadata(dir: &Path, table: &str) -> Option<(String, Value)> {
    let loc = common::catalog_metadata_location(&dir.join("catalog.db"), "pg", table).await?;
    let md: Value =
        serde_json::from_str(&std::fs::read_to_string(loc.trim_start_matches("file://")).ok()?)
            .ok()?;
    Some((loc, md))
}

/// `urutau run FILE` (no exit when caught up), its log to `log`.
fn spawn_run(pipeline: &Path, log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", pipeline.to_str().unwrap(), "--log-level", "info"])
        .env("URUTAU_TEST_SNAPSHOT_WINDOW_MS", "20")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// The seeded writer: 1-3 statement transactions of inserts, updates,
/// deletes and re-inserts of `t`, with the columns `phase` says `t` has.
/// A transaction a concurrent DDL made fail (a column it named is gone)
/// is dropped. Each committed transaction's ids are recorded under the
/// phase it was written in.
async fn writer(
    db: PgPool,
    seed: u64,
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    touched: Arc<Mutex<Vec<HashSet<i64>>>>,
    first_new_id: i64,
) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_id = first_new_id;
    let mut deleted: Vec<i64> = Vec::new();
    let mut committed = 0;
    while !stop.load(Ordering::Relaxed) {
        let p = phase.load(Ordering::SeqCst);
        let mut tx = db.begin().await.unwrap();
        let mut ids = Vec::new();
        let mut failed = false;
        for _ in 0..rng.random_range(1..=3) {
            let op = rng.random_range(0..10);
            let id = match op {
                0..=3 => {
                    next_id += 1;
                    next_id
                }
                4 if !deleted.is_empty() => deleted.swap_remove(rng.random_range(0..deleted.len())),
                _ => rng.random_range(1..next_id.max(2)),
            };
            let n: Option<i32> = rng.random_bool(0.8).then(|| rng.random_range(-1000..1000));
            let amount: Option<String> = rng.random_bool(0.8).then(|| {
                format!(
                    "{}.{:02}",
                    rng.random_range(-9999..9999),
                    rng.random_range(0..100)
                )
            });
            let note: Option<String> = rng
                .random_bool(0.7)
                .then(|| format!("note {}", rng.random_range(0..1_000_000)));
            let extra: Option<i64> = rng.random_bool(0.7).then(|| match p {
                1 => rng.random_range(-100_000..100_000),
                _ => rng.random_range(-100_000..100_000) * 1_000_000,
            });
            let v = format!("v{}", rng.random_range(0..1_000_000));
            let n_col = if p >= 4 { "n2" } else { "n" };
            let result = if op == 9 {
                // Delete.
                deleted.push(id);
                sqlx::query("DELETE FROM t WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
            } else {
                // Upsert the row with the columns of this phase.
                let mut cols = vec!["id", n_col, "amount", "note"];
                if p < 3 {
                    cols.push("v");
                }
                if p >= 1 {
                    cols.push("extra");
                }
                let set: Vec<String> = cols[1..]
                    .iter()
                    .map(|c| format!("{c} = EXCLUDED.{c}"))
                    .collect();
                let params: Vec<String> = (1..=cols.len())
                    .map(|i| match cols[i - 1] {
                        "amount" => format!("${i}::numeric"),
                        _ => format!("${i}"),
                    })
                    .collect();
                let sql = format!(
                    "INSERT INTO t ({}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}",
                    cols.join(", "),
                    params.join(", "),
                    set.join(", ")
                );
                let mut q = sqlx::query(&sql).bind(id).bind(n).bind(amount).bind(note);
                if p < 3 {
                    q = q.bind(v);
                }
                if p >= 1 {
                    q = match p {
                        1 => q.bind(extra.map(|e| e as i32)),
                        _ => q.bind(extra),
                    };
                }
                q.execute(&mut *tx).await
            };
            if result.is_err() {
                failed = true;
                break;
            }
            ids.push(id);
        }
        if failed {
            let _ = tx.rollback().await;
            continue;
        }
        if tx.commit().await.is_ok() {
            committed += 1;
            touched.lock().unwrap()[p].extend(ids);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..4))).await;
    }
    committed
}

/// `t` as Postgres holds it now: `id -> {n2, amount, note, extra}`.
async fn source_rows(db: &PgPool) -> HashMap<i64, Value> {
    sqlx::query("SELECT id, n2, amount::text AS amount, note, extra FROM t")
        .fetch_all(db)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get::<i64, _>("id"),
                json!({
                    "n2": r.get::<Option<i32>, _>("n2"),
                    "amount": r.get::<Option<String>, _>("amount"),
                    "note": r.get::<Option<String>, _>("note"),
                    "extra": r.get::<Option<i64>, _>("extra"),
                }),
            )
        })
        .collect()
}

/// A column's values just before a change, read with the table locked in
/// the change's own transaction (so no write slips between).
async fn change_with_snapshot(db: &PgPool, ddl: &str, column: &str) -> HashMap<i64, Value> {
    let mut tx = db.begin().await.unwrap();
    tx.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let rows = sqlx::query(&format!("SELECT id, to_jsonb({column}) AS v FROM t"))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.execute(ddl).await.unwrap();
    tx.commit().await.unwrap();
    rows.iter()
        .map(|r| {
            (
                r.get::<i64, _>("id"),
                r.get::<Option<Value>, _>("v").unwrap_or(Value::Null),
            )
        })
        .collect()
}

/// What the target must hold for each row of `t`: Postgres' values of the
/// columns it still has, `v` as it was at its drop (NULL for rows written
/// after it), `n` as it was at the rename (NULL for rows written after it,
/// which carry `n2`; rows not written since have `n2` NULL: a rename is a
/// drop and an add).
fn expected_rows(
    source: &HashMap<i64, Value>,
    v_at_drop: &HashMap<i64, Value>,
    n_at_rename: &HashMap<i64, Value>,
    touched: &[HashSet<i64>],
) -> Vec<Value> {
    let after_drop: HashSet<i64> = touched[3].union(&touched[4]).copied().collect();
    let after_rename = &touched[4];
    let mut ids: Vec<&i64> = source.keys().collect();
    ids.sort();
    ids.into_iter()
        .map(|id| {
            let s = &source[id];
            let renamed = after_rename.contains(id);
            json!({
                "id": id,
                "v": if after_drop.contains(id) { Value::Null } else { v_at_drop.get(id).cloned().unwrap_or(Value::Null) },
                "n": if renamed { Value::Null } else { n_at_rename.get(id).cloned().unwrap_or(Value::Null) },
                "amount": s["amount"],
                "note": s["note"],
                "extra": s["extra"],
                "n2": if renamed { s["n2"].clone() } else { Value::Null },
            })
        })
        .collect()
}

/// Rows as a reader returned them, with only the compared columns.
fn comparable(rows: Vec<Value>) -> Vec<Value> {
    rows.into_iter()
        .map(|r| {
            json!({
                "id": r["id"], "v": r["v"], "n": r["n"], "amount": r["amount"],
                "note": r["note"], "extra": r["extra"], "n2": r["n2"],
            })
        })
        .collect()
}

/// Fails with the first row that differs, and how many do.
fn assert_rows_equal(reader: &str, got: &[Value], want: &[Value]) {
    let differing: Vec<(Option<&Value>, Option<&Value>)> = (0..got.len().max(want.len()))
        .map(|i| (got.get(i), want.get(i)))
        .filter(|(g, w)| g != w)
        .collect();
    assert!(
        differing.is_empty(),
        "{reader}: {} of {} rows differ (got {} rows); first: got {:?}, want {:?}",
        differing.len(),
        want.len(),
        got.len(),
        differing[0].0,
        differing[0].1
    );
}

/// The acceptance run: a snapshot of 3,000 rows, then the four changes
/// under a concurrent seeded writer, urutau killed with SIGKILL right after
/// each change and at random moments between; then run to the end. Both
/// targets end equal to Postgres on every column it still has, with the
/// dropped column as it was for rows not written since and NULL for rows
/// written after; the Iceberg table's schema history has one schema per
/// change with field ids kept.
#[tokio::test]
async fn added_widened_dropped_and_renamed_columns_land_through_kill_9() {
    let s = setup().await;
    let ch = common::ClickHouse::start(&s.python, &s.dir.path().join("ch"));
    let database = "urutau_t_schema_changes";
    ch.fresh_database(database).await;
    sqlx::query(
        "INSERT INTO t SELECT i, 'v' || i, (i * 7) % 1000, (i % 500)::numeric / 4, 'seed' FROM generate_series(1, 3000) i",
    )
    .execute(&s.db)
    .await
    .unwrap();
    let p = pipeline(&s, Some((&ch, database)), "", "*");

    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let touched = Arc::new(Mutex::new(vec![HashSet::new(); 5]));
    let writing = tokio::spawn(writer(
        s.db.clone(),
        18,
        Arc::clone(&phase),
        Arc::clone(&stop),
        Arc::clone(&touched),
        3000,
    ));

    // urutau runs in the background, killed at random moments and right
    // after each change; it is started again after each kill.
    let kill_now = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let runner = {
        let (p, dir) = (p.clone(), s.dir.path().to_path_buf());
        let (kill_now, done) = (Arc::clone(&kill_now), Arc::clone(&done));
        let kills = Arc::clone(&kills);
        tokio::task::spawn_blocking(move || {
            let mut rng = StdRng::seed_from_u64(1818);
            let mut runs = 0;
            while !done.load(Ordering::SeqCst) {
                runs += 1;
                let log = dir.join(format!("run{runs}.log"));
                let mut child = spawn_run(&p, &log);
                let until = Instant::now() + Duration::from_millis(rng.random_range(1500..4000));
                while Instant::now() < until
                    && !kill_now.swap(false, Ordering::SeqCst)
                    && !done.load(Ordering::SeqCst)
                {
                    if let Some(status) = child.try_wait().unwrap() {
                        panic!(
                            "a run exited by itself ({status}): {}",
                            std::fs::read_to_string(&log).unwrap_or_default()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills.fetch_add(1, Ordering::SeqCst);
            }
        })
    };

    // The snapshot first (its rows carry the shape before every change).
    let snapshotted = eventually(120, || async {
        metadata(s.dir.path(), "t")
            .await
            .is_some_and(|(_, md)| md["properties"]["cdc.snapshot.state"] == "complete")
    })
    .await;
    assert!(snapshotted, "the snapshot of t completed");
    // Two kills while only rows are streamed, then one right after each
    // change (and more between, as the pauses fall).
    let streamed = eventually(60, || async { kills.load(Ordering::SeqCst) >= 2 }).await;
    assert!(streamed, "two kills while streaming");

    let mut v_at_drop = HashMap::new();
    let mut n_at_rename = HashMap::new();
    for (k, ddl) in CHANGES.iter().enumerate() {
        match k {
            2 => v_at_drop = change_with_snapshot(&s.db, ddl, "v").await,
            3 => n_at_rename = change_with_snapshot(&s.db, ddl, "n").await,
            _ => {
                s.db.execute(*ddl).await.unwrap();
            }
        }
        phase.store(k + 1, Ordering::SeqCst);
        kill_now.store(true, Ordering::SeqCst);
        // The change is followed (one more schema in the Iceberg table)
        // before the next one, while the writer goes on.
        let followed = eventually(120, || async {
            metadata(s.dir.path(), "t")
                .await
                .is_some_and(|(_, md)| md["schemas"].as_array().unwrap().len() == k + 2)
        })
        .await;
        assert!(followed, "change {k} ({ddl}) reached the Iceberg table");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let committed = writing.await.unwrap();
    done.store(true, Ordering::SeqCst);
    runner.await.unwrap();
    let kills = kills.load(Ordering::SeqCst);
    assert!(kills >= 2 + CHANGES.len(), "killed {kills} times");
    assert!(
        committed > 200,
        "the writer committed {committed} transactions"
    );
    common::run_to_end(&p);

    let source = source_rows(&s.db).await;
    let touched = touched.lock().unwrap().clone();
    for (k, ids) in touched.iter().enumerate() {
        assert!(ids.len() > 20, "phase {k} wrote {} rows", ids.len());
    }
    let want = expected_rows(&source, &v_at_drop, &n_at_rename, &touched);

    // Iceberg: DuckDB and Iceberg's Java reader.
    let (loc, md) = metadata(s.dir.path(), "t").await.unwrap();
    let duck = comparable(common::duckdb_rows(&s.python, &loc, "id"));
    assert_rows_equal("DuckDB", &duck, &want);
    let java = comparable(common::iceberg_java_rows(&loc, "id"));
    assert_rows_equal("Iceberg's Java reader", &java, &want);

    // One schema per change, field ids kept, metadata at the end.
    let schemas = md["schemas"].as_array().unwrap();
    assert_eq!(schemas.len(), 5, "{:#}", md["schemas"]);
    let mut ids: HashMap<String, i64> = HashMap::new();
    for schema in schemas {
        for f in schema["fields"].as_array().unwrap() {
            let name = f["name"].as_str().unwrap().to_string();
            let id = f["id"].as_i64().unwrap();
            assert_eq!(
                *ids.entry(name.clone()).or_insert(id),
                id,
                "field {name} kept its id"
            );
        }
    }
    let current = schemas
        .iter()
        .find(|s| s["schema-id"] == md["current-schema-id"])
        .unwrap();
    assert_eq!(md["current-schema-id"], 4, "{:#}", md["schemas"]);
    let last: Vec<(&str, &str, bool)> = current["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap(),
                f["type"].as_str().unwrap_or("nested"),
                f["required"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        last,
        vec![
            ("id", "long", true),
            ("v", "string", false),
            ("n", "int", false),
            ("amount", "decimal(10, 2)", false),
            ("note", "string", false),
            ("extra", "long", false),
            ("n2", "int", false),
        ]
    );

    // ClickHouse, as its engine reads the table under FINAL.
    let clickhouse = comparable(
        ch.rows(&format!(
            "SELECT id, v, n, amount, note, extra, n2 FROM {database}.t FINAL ORDER BY id"
        ))
        .await,
    );
    assert_rows_equal("ClickHouse", &clickhouse, &want);
    let types: HashMap<String, String> = ch
        .rows(&format!(
            "SELECT name, type FROM system.columns WHERE database = '{database}' AND table = 't'"
        ))
        .await
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().into(),
                r["type"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(types["extra"], "Nullable(Int64)");
    assert_eq!(types["v"], "Nullable(String)");
    assert_eq!(types["n2"], "Nullable(Int32)");
}

/// Waits (at most `seconds`) for a background run to exit; its exit code
/// and log.
fn wait_exit(mut child: Child, log: &Path, seconds: u64) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code(), std::fs::read_to_string(log).unwrap());
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "the run did not stop within {seconds} s: {}",
                std::fs::read_to_string(log).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The ids of an Iceberg table, as DuckDB reads them.
async fn iceberg_ids(s: &Setup, table: &str) -> Vec<i64> {
    let (loc, _) = metadata(s.dir.path(), table).await.unwrap();
    common::duckdb_rows(&s.python, &loc, "id")
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

/// Waits until the Iceberg table holds `n` rows.
async fn wait_rows(s: &Setup, table: &str, n: usize) {
    let reached = eventually(60, || async {
        metadata(s.dir.path(), table).await.is_some() && iceberg_ids(s, table).await.len() == n
    })
    .await;
    assert!(reached, "{table} reached {n} rows");
}

/// Narrowing a column (bigint -> int) while a run streams stops it with
/// exit 1, naming the column, both types and the rule; the transaction
/// that brought it is not committed, what came before it (another
/// table's rows included) is. A restart stops too, before reading.
#[tokio::test]
async fn a_narrowed_column_stops_the_run_and_commits_nothing_of_it() {
    let s = setup().await;
    s.db.execute("ALTER TABLE t ADD COLUMN extra bigint; INSERT INTO t VALUES (1, 'a', 1, 1.5, 'x', 5000000000)")
        .await
        .unwrap();
    let p = pipeline(&s, None, "", "*");
    let log = s.dir.path().join("narrow.log");
    let run = spawn_run(&p, &log);
    wait_rows(&s, "t", 1).await;
    s.db.execute(
        "INSERT INTO u VALUES (1, 'before'); INSERT INTO t VALUES (2, 'b', 2, 2.5, 'y', 7)",
    )
    .await
    .unwrap();
    wait_rows(&s, "t", 2).await;
    wait_rows(&s, "u", 1).await;
    s.db.execute(
        "BEGIN; ALTER TABLE t ALTER COLUMN extra TYPE int USING (extra % 1000000)::int;
         INSERT INTO t VALUES (3, 'c', 3, 3.5, 'z', 9); INSERT INTO u VALUES (2, 'with it'); COMMIT",
    )
    .await
    .unwrap();
    let (code, err) = wait_exit(run, &log, 60);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("column extra changed type from BIGINT to INT"),
        "{err}"
    );
    assert!(err.contains("may only widen"), "{err}");
    assert_eq!(
        iceberg_ids(&s, "t").await,
        vec![1, 2],
        "nothing of the narrowed rows"
    );
    assert_eq!(
        iceberg_ids(&s, "u").await,
        vec![1],
        "nothing of its transaction"
    );

    let out = common::urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("column `extra` is long in the table"), "{err}");
    assert!(err.contains("may only widen"), "{err}");
    assert_eq!(iceberg_ids(&s, "t").await, vec![1, 2]);
}

/// `schema_changes = 'fail'` stops at the first change, saying what
/// changed; the target is not evolved, and a restart refuses the table
/// that no longer matches, naming the column.
#[tokio::test]
async fn schema_changes_fail_stops_at_the_first_change() {
    let s = setup().await;
    s.db.execute("INSERT INTO t VALUES (1, 'a', 1, 1.5, 'x')")
        .await
        .unwrap();
    let p = pipeline(&s, None, ", schema_changes = 'fail'", "*");
    let plan = common::urutau(&["plan", "--explain", p.to_str().unwrap()]);
    let explain = String::from_utf8_lossy(&plan.stdout);
    assert!(explain.contains("schema_changes=fail"), "{explain}");
    let log = s.dir.path().join("fail.log");
    let run = spawn_run(&p, &log);
    wait_rows(&s, "t", 1).await;
    s.db.execute(
        "ALTER TABLE t ADD COLUMN extra int; INSERT INTO t VALUES (2, 'b', 2, 2.5, 'y', 7)",
    )
    .await
    .unwrap();
    let (code, err) = wait_exit(run, &log, 60);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("column extra (INT) added"), "{err}");
    assert!(err.contains("schema_changes = 'fail'"), "{err}");
    let (_, md) = metadata(s.dir.path(), "t").await.unwrap();
    assert_eq!(md["schemas"].as_array().unwrap().len(), 1, "not evolved");
    assert_eq!(iceberg_ids(&s, "t").await, vec![1]);

    let out = common::urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("column `extra` (int) is missing from the table"),
        "{err}"
    );
}

/// A route whose SELECT names a column the source drops while the run
/// streams stops with the column named and what to do (the `*` route of
/// the acceptance run shows the other side: it keeps the column, NULL
/// from then on).
#[tokio::test]
async fn a_route_naming_a_dropped_column_stops_and_says_how_to_fix_it() {
    let s = setup().await;
    s.db.execute("INSERT INTO t VALUES (1, 'a', 1, 1.5, 'x')")
        .await
        .unwrap();
    let p = pipeline(&s, None, "", "id, v, note");
    let explain = common::urutau(&["plan", "--explain", p.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&explain.stdout);
    assert!(text.contains("schema_changes=evolve"), "{text}");
    let log = s.dir.path().join("drop.log");
    let run = spawn_run(&p, &log);
    wait_rows(&s, "t", 1).await;
    s.db.execute("ALTER TABLE t DROP COLUMN v; INSERT INTO t VALUES (2, 2, 2.5, 'y')")
        .await
        .unwrap();
    let (code, err) = wait_exit(run, &log, 60);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("`v`"), "{err}");
    assert!(err.contains("dropped (or renamed) at the source"), "{err}");
    assert!(err.contains("remove `v` from the route"), "{err}");
    assert_eq!(
        iceberg_ids(&s, "t").await,
        vec![1],
        "nothing after the drop"
    );
}

/// Debezium events with a schema part carry their table's shape: a column
/// added, then widened, at the source reaches the Iceberg table (one schema
/// per change) though the declaration never named it; a restart accepts
/// the evolved table; with `schema_changes = 'fail'` the first event of a
/// new shape stops the run, naming the file's line and what changed.
#[tokio::test]
async fn debezium_schema_parts_evolve_a_declared_table() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let field = |name: &str, ty: &str| json!({"type": ty, "optional": name != "id", "field": name});
    let event = |fields: Vec<Value>, op: &str, after: Value| {
        let row = json!({"type": "struct", "fields": fields, "optional": true, "field": "after"});
        json!({
            "schema": {"type": "struct", "fields": [row, {"type": "string", "field": "op"}]},
            "payload": {"before": null, "after": after, "op": op,
                        "source": {"table": "t", "schema": "public", "ts_ms": 1}},
        })
        .to_string()
    };
    let (id, v) = (field("id", "int64"), field("v", "string"));
    let lines = [
        event(vec![id.clone(), v.clone()], "c", json!({"id": 1, "v": "a"})),
        event(
            vec![id.clone(), v.clone(), field("qty", "int32")],
            "c",
            json!({"id": 2, "v": "b", "qty": 5}),
        ),
        event(
            vec![id, v, field("qty", "int64")],
            "u",
            json!({"id": 1, "v": "a2", "qty": 5_000_000_000i64}),
        ),
    ];
    let data = dir.path().join("events.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let write = |options: &str| {
        let p = dir.path().join("p.sql");
        std::fs::write(
            &p,
            format!(
                "CREATE PIPELINE p;
CREATE SOURCE f FROM file WITH (path = '{}');
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');
CREATE TABLE f.public.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
CREATE TABLE lake.t WITH (primary_key = 'id'{options}) AS SELECT * FROM f.public.t;
",
                data.display(),
                d = dir.path().display()
            ),
        )
        .unwrap();
        p
    };
    let strict = write(", schema_changes = 'fail'");
    let out = common::urutau(&["run", strict.to_str().unwrap(), "--exit-when-caught-up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("events.jsonl:2"), "{err}");
    assert!(err.contains("column qty (INT) added"), "{err}");
    std::fs::remove_file(dir.path().join("catalog.db")).unwrap();
    std::fs::remove_dir_all(dir.path().join("wh")).unwrap();

    let p = write("");
    common::run_to_end(&p);
    common::run_to_end(&p);
    let (loc, md) = metadata(dir.path(), "t").await.unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &loc, "id"),
        vec![
            json!({"id": 1, "v": "a2", "qty": 5_000_000_000i64}),
            json!({"id": 2, "v": "b", "qty": 5}),
        ]
    );
    assert_eq!(
        md["schemas"].as_array().unwrap().len(),
        3,
        "{:#}",
        md["schemas"]
    );
}

/// A preview plans nothing again: it plans the table from its current
/// shape, which reads the backlog's rows before and after a column was
/// added; a backlog the current shape cannot read (a row carrying a column
/// dropped since) is shown up to that point, and the preview says so. It
/// creates and commits nothing.
#[tokio::test]
async fn a_preview_follows_or_stops_at_a_change_of_shape() {
    let s = setup().await;
    s.db.execute("INSERT INTO t VALUES (1, 'a', 1, 1.5, 'x')")
        .await
        .unwrap();
    let p = pipeline(&s, None, "", "*");
    common::run_to_end(&p);
    let preview = || {
        let out = common::urutau(&["preview", p.to_str().unwrap(), "--limit", "10"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    s.db.execute(
        "INSERT INTO t VALUES (2, 'b', 2, 2.5, 'before the change');
         ALTER TABLE t ADD COLUMN extra int;
         INSERT INTO t VALUES (3, 'c', 3, 3.5, 'after the change', 7)",
    )
    .await
    .unwrap();
    let (stdout, _) = preview();
    assert!(stdout.contains("before the change"), "{stdout}");
    assert!(stdout.contains("after the change"), "{stdout}");
    assert!(stdout.contains("| extra |"), "{stdout}");

    s.db.execute(
        "ALTER TABLE t DROP COLUMN v; INSERT INTO t VALUES (4, 4, 4.5, 'after the drop', 8)",
    )
    .await
    .unwrap();
    let (stdout, stderr) = preview();
    assert!(!stdout.contains("after the drop"), "{stdout}");
    assert!(stderr.contains("stops where it changed shape"), "{stderr}");
    assert_eq!(iceberg_ids(&s, "t").await, vec![1], "nothing committed");
}
