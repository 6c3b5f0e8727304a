//! The Postgres source against a real PostgreSQL server (Debian's package,
//! started by tests/harness/postgres.py with wal_level = logical), into
//! Iceberg on a SQLite catalog, read back by DuckDB.

mod common;

use common::pg_cdc::*;
use common::{run_to_end, urutau};

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use sqlx::{Executor, Row};

/// The acceptance suite's streaming half: a concurrent seeded writer, the
/// pipeline killed with SIGKILL at random moments five times (the slot is
/// never acknowledged past what both tables committed), then run to the
/// end; DuckDB reads both tables equal to Postgres, row for row.
#[tokio::test]
async fn streamed_changes_survive_kill_9_and_end_equal_to_postgres() {
    let (python, dir, pg, db) = start().await;
    let p = pipeline(dir.path(), &pg);
    // The Go engine's YAML means the same pipeline (`kind: postgres`,
    // `slotName`): identical plans, schemas read from the catalog.
    let yaml = dir.path().join("p.yaml");
    std::fs::write(
        &yaml,
        format!(
            "pipeline: pg\nbatching: {{maxRows: 200, maxInterval: 200ms}}\nsource:\n  name: src\n  kind: postgres\n  uri: {uri}\n  slotName: urutau_test\n  snapshotMode: none\nsink:\n  name: lake\n  type: iceberg+sql\n  uri: sqlite://{d}/catalog.db\n  warehouse: {d}/wh\n  namespace: pg\ntables:\n  - source: public.items\n    target: items\n    primaryKey: [id]\n  - source: events\n    target: events\n    primaryKey: [id]\n",
            uri = pg.uri(),
            d = dir.path().display()
        ),
    )
    .unwrap();
    let sql_plan = urutau(&["plan", "--explain", p.to_str().unwrap()]);
    let yaml_plan = urutau(&["plan", "--explain", yaml.to_str().unwrap()]);
    assert!(
        sql_plan.status.success(),
        "{}",
        String::from_utf8_lossy(&sql_plan.stderr)
    );
    assert!(
        yaml_plan.status.success(),
        "{}",
        String::from_utf8_lossy(&yaml_plan.stderr)
    );
    let explain = String::from_utf8_lossy(&sql_plan.stdout).to_string();
    assert_eq!(explain, String::from_utf8_lossy(&yaml_plan.stdout));
    assert!(explain.contains("PostgresSourceExec"), "{explain}");
    assert!(
        !explain.contains("postgres://"),
        "the uri is a secret: {explain}"
    );
    // First run: sets REPLICA IDENTITY, the publication and the slot.
    run_to_end(&p);
    let identity: String =
        sqlx::query_scalar("SELECT relreplident::text FROM pg_class WHERE relname = 'items'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(identity, "f", "REPLICA IDENTITY FULL");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let db = db.clone();
        let stop = Arc::clone(&stop);
        tokio::spawn(async move { workload(&db, 2026, 3_000, &stop, 400, 1).await })
    };
    let mut rng = StdRng::seed_from_u64(5);
    let mut kills = 0;
    while kills < 5 {
        let addr = free_addr();
        let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
            .args([
                "run",
                p.to_str().unwrap(),
                "--log-level",
                "warn",
                "--metrics-addr",
                &addr,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(rng.random_range(400..2500))).await;
        if kills == 0 {
            // A long-running service reports itself while it runs.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let get = |path: &str| {
                let url = format!("http://{addr}{path}");
                async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
            };
            assert_eq!(get("/healthz").await, "ok\n");
            let metrics = get("/metrics").await;
            for needle in [
                "urutau_rows_written_total{table=\"lake.items\",op=\"upsert\"}",
                "urutau_commit_duration_seconds_count{table=\"lake.events\"}",
                "urutau_replication_lag_bytes{source=\"src\"}",
                "urutau_replication_lag_seconds{source=\"src\"}",
            ] {
                assert!(metrics.contains(needle), "{needle} in\n{metrics}");
            }
            let status: Value = serde_json::from_str(&get("/statusz").await).unwrap();
            assert_eq!(status["pipeline"], "pg");
            assert_eq!(status["tables"]["lake.items"]["phase"], "stream");
            assert!(
                status["tables"]["lake.items"]["commits"].as_u64().unwrap() > 0,
                "{status}"
            );
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pipeline stopped on its own"
        );
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
        // The slot never runs ahead of what the sink committed.
        assert_slot_not_ahead(&db, dir.path()).await;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    run_to_end(&p);

    assert_final_acknowledgement(&db, dir.path()).await;
    let read = assert_items_equal(&python, dir.path(), &db, &[]).await;
    assert!(read.len() > 100, "the workload left {} rows", read.len());
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    let read = common::duckdb_rows(&python, &loc, "id");
    assert_eq!(read, source_events(&db).await);
}

/// A bad setting is an invalid pipeline (exit 2) naming what is allowed;
/// an unreachable server is a runtime failure (exit 1); the URI's
/// password never appears.
#[tokio::test]
async fn validation_errors_name_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.sql");
    std::fs::write(
        &p,
        "CREATE SOURCE src FROM postgres WITH (uri = 'postgres://u:hunter22@127.0.0.1:1/db', slot = 's', snapshot = 'sometimes');
CREATE SINK out INTO debug;
CREATE TABLE out.items AS SELECT id FROM src.items;
",
    )
    .unwrap();
    let out = urutau(&["validate", p.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("sometimes") && err.contains("initial"),
        "{err}"
    );
    assert!(err.contains("s.sql:1:"), "{err}");
    assert!(!err.contains("hunter22"), "{err}");

    // A valid pipeline whose server cannot be reached is a runtime failure
    // (exit 1), not an invalid pipeline; the password stays out of it.
    std::fs::write(
        &p,
        "CREATE SOURCE src FROM postgres WITH (uri = 'postgres://u:hunter22@127.0.0.1:1/db', slot = 's');
CREATE SINK out INTO debug;
CREATE TABLE out.items AS SELECT id FROM src.items;
",
    )
    .unwrap();
    for command in ["validate", "plan"] {
        let out = urutau(&[command, p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {err}");
        assert!(err.contains("connecting to Postgres"), "{err}");
        assert!(err.contains("cannot plan"), "{err}");
        assert!(!err.contains("hunter22"), "{err}");
    }
}

/// The acceptance suite's snapshot half: 100,000 pre-filled rows copied
/// (DBLog chunks between watermarks) while a seeded writer changes the
/// table everywhere, including the chunks being read; the pipeline is
/// SIGKILLed five times (at least once mid-snapshot); the slot is never
/// acknowledged past what the sink committed; after the end DuckDB reads
/// both tables equal to Postgres, and the copied rows carry phase
/// `snapshot` with no commit time.
#[tokio::test]
async fn snapshot_of_100k_rows_with_a_concurrent_writer_survives_kill_9() {
    let (python, dir, pg, db) = start().await;
    const ROWS: i64 = 100_000;
    prefill(&db, ROWS).await;
    let p = snapshot_pipeline(
        dir.path(),
        &pg,
        "*, _phase AS cdc_phase, _commit_ts AS cdc_commit_ts",
    );

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let db = db.clone();
        let stop = Arc::clone(&stop);
        tokio::spawn(async move { workload(&db, 77, 4_000, &stop, ROWS, 10_001).await })
    };
    let mut rng = StdRng::seed_from_u64(11);
    let mut states = Vec::new();
    for kill in 0..5 {
        let addr = free_addr();
        let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
            .args(["run", p.to_str().unwrap(), "--log-level", "warn"])
            .args(["--metrics-addr", &addr])
            // Wider windows between each chunk's SELECT and its high
            // watermark: live changes land inside them.
            .env("URUTAU_TEST_SNAPSHOT_WINDOW_MS", "40")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let ms = if kill == 0 {
            rng.random_range(1500..2500)
        } else {
            rng.random_range(300..2500)
        };
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if kill == 0 {
            // Snapshot progress is reported while it runs.
            let get = |path: &str| {
                let url = format!("http://{addr}{path}");
                async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
            };
            let status: Value = serde_json::from_str(&get("/statusz").await).unwrap();
            let items = &status["snapshots"]["public.items"];
            assert!(
                items["rows_estimated"].as_u64().unwrap() > 90_000,
                "{status}"
            );
            assert!(items["rows_copied"].as_u64().unwrap() > 0, "{status}");
            assert_eq!(items["done"], false, "{status}");
            // The rate and the time left at it.
            assert!(items["rows_per_second"].as_f64().unwrap() > 0.0, "{status}");
            assert!(items["eta_seconds"].as_f64().unwrap() > 0.0, "{status}");
            assert_eq!(
                status["tables"]["lake.items"]["phase"], "snapshot",
                "{status}"
            );
            assert_eq!(
                status["tables"]["lake.items"]["snapshot_state"], "in_progress",
                "{status}"
            );
            let metrics = get("/metrics").await;
            for needle in [
                "urutau_snapshot_rows_copied{table=\"public.items\"}",
                "urutau_snapshot_rows_estimated{table=\"public.items\"}",
                "urutau_snapshot_rows_per_second{table=\"public.items\"}",
                "urutau_snapshot_eta_seconds{table=\"public.items\"}",
                "urutau_table_phase{table=\"lake.items\",phase=\"snapshot\"} 1",
            ] {
                assert!(metrics.contains(needle), "{needle} in\n{metrics}");
            }
            // The first kill lands once the copy has committed progress
            // (the sink gathers a snapshot's rows into files of 1 MiB
            // before it commits, so on a loaded machine that can take
            // longer than the random pause).
            assert!(
                eventually(120, || async {
                    property(dir.path(), "items", "cdc.snapshot.state")
                        .await
                        .as_deref()
                        == Some("in_progress")
                })
                .await,
                "items' snapshot never committed progress"
            );
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pipeline stopped on its own"
        );
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert_slot_not_ahead(&db, dir.path()).await;
        let state = property(dir.path(), "items", "cdc.snapshot.state").await;
        let bounds = property(dir.path(), "items", "cdc.snapshot.bounds").await;
        eprintln!("kill {kill}: items snapshot {state:?} after {bounds:?}");
        states.push(state);
    }
    assert!(
        states.iter().any(|s| s.as_deref() == Some("in_progress")),
        "no kill landed mid-snapshot: {states:?}"
    );
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    run_to_end(&p);
    assert_eq!(
        property(dir.path(), "items", "cdc.snapshot.state")
            .await
            .as_deref(),
        Some("complete")
    );
    assert_eq!(
        property(dir.path(), "items", "cdc.snapshot.bounds").await,
        None
    );

    let read = assert_items_equal(&python, dir.path(), &db, &["cdc_phase", "cdc_commit_ts"]).await;
    assert!(read.len() as i64 > ROWS / 2, "{} rows", read.len());
    let mut snapshot_rows = 0;
    for r in &read {
        match r["cdc_phase"].as_str() {
            Some("snapshot") => {
                snapshot_rows += 1;
                assert!(
                    r["cdc_commit_ts"].is_null(),
                    "a snapshot row has a commit time: {r}"
                );
            }
            Some("stream") => assert!(!r["cdc_commit_ts"].is_null(), "{r}"),
            other => panic!("phase {other:?}: {r}"),
        }
    }
    assert!(
        snapshot_rows as i64 > ROWS / 2,
        "{snapshot_rows} snapshot rows"
    );
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &loc, "id"),
        source_events(&db).await
    );
    assert_final_acknowledgement(&db, dir.path()).await;
}

/// Tables without a primary key: `items` (its `id` NOT NULL and unique)
/// is copied by that unique index, `events` (no unique index at all) by
/// ctid ranges, while a seeded writer changes both. Killed with SIGKILL
/// mid-snapshot, `events` is rewritten by VACUUM FULL while the pipeline
/// is down (its committed progress names the old file: the copy starts
/// over) and again while it copies (a chunk sees the new file: the run
/// restarts and starts over). DuckDB then reads both tables equal to
/// Postgres.
#[tokio::test]
async fn tables_without_a_primary_key_are_copied_by_unique_index_or_ctid() {
    let (python, dir, pg, db) = start().await;
    const ROWS: i64 = 20_000;
    prefill(&db, ROWS).await;
    db.execute(
        "ALTER TABLE items DROP CONSTRAINT items_pkey, ALTER COLUMN id SET NOT NULL, ADD UNIQUE (id);
         ALTER TABLE events DROP CONSTRAINT events_pkey, ALTER COLUMN id SET NOT NULL,
           ADD COLUMN pad text;
         INSERT INTO events SELECT i, i * 3, 'seed', md5(i::text) || md5((i + 1)::text)
           FROM generate_series(5001, 100000) i;
         ANALYZE events",
    )
    .await
    .unwrap();
    // Small files: the sink commits (and so records the copy's progress)
    // several times while `events` (padded) is copied.
    let p = snapshot_pipeline_with_files_of(dir.path(), &pg, "*", "128KiB");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let db = db.clone();
        let stop = Arc::clone(&stop);
        tokio::spawn(async move { workload(&db, 5, 3_000, &stop, ROWS, 100_001).await })
    };
    let spawn = |n: usize| {
        let log = std::fs::File::create(dir.path().join(format!("run{n}.log"))).unwrap();
        Command::new(env!("CARGO_BIN_EXE_urutau"))
            .args(["run", p.to_str().unwrap(), "--log-level", "info"])
            .env("URUTAU_TEST_SNAPSHOT_WINDOW_MS", "60")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let log = |n: usize| std::fs::read_to_string(dir.path().join(format!("run{n}.log"))).unwrap();
    let events_state = || async { property(dir.path(), "events", "cdc.snapshot.state").await };
    let events_in_progress = || async {
        eventually(120, || async {
            events_state().await.as_deref() == Some("in_progress")
        })
        .await
    };

    // Run 0: killed once the copy of events has committed progress.
    let mut child = spawn(0);
    assert!(
        events_in_progress().await,
        "events' snapshot never committed progress: {}",
        log(0)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let run0 = log(0);
    assert!(
        run0.contains("reads the table in ctid ranges") && run0.contains("public.events"),
        "{run0}"
    );
    assert!(
        run0.contains("in the order of a unique index") && run0.contains("items_id_key"),
        "{run0}"
    );
    assert_slot_not_ahead(&db, dir.path()).await;
    db.execute("VACUUM FULL events").await.unwrap();

    // Run 1: the rewrite while down restarts the copy; a rewrite while it
    // copies restarts the run.
    let mut child = spawn(1);
    assert!(
        eventually(60, || async {
            log(1).contains("rewritten (VACUUM FULL, CLUSTER or TRUNCATE) since")
        })
        .await,
        "{}",
        log(1)
    );
    db.execute("VACUUM FULL events").await.unwrap();
    assert!(
        eventually(60, || async {
            log(1).contains("while the snapshot read it by ctid")
        })
        .await,
        "{}",
        log(1)
    );
    let mut rng = StdRng::seed_from_u64(3);
    tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run stopped: {}",
        log(1)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_slot_not_ahead(&db, dir.path()).await;

    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let out = run_to_end(&p);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for table in ["items", "events"] {
        assert_eq!(
            property(dir.path(), table, "cdc.snapshot.state")
                .await
                .as_deref(),
            Some("complete"),
            "{table}"
        );
    }
    let read = assert_items_equal(&python, dir.path(), &db, &[]).await;
    assert!(read.len() as i64 > ROWS / 2, "{} rows", read.len());
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    let events: Vec<Value> = sqlx::query("SELECT id, item, kind, pad FROM events ORDER BY id")
        .fetch_all(&db)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            serde_json::json!({
                "id": r.get::<i64, _>("id"),
                "item": r.get::<i64, _>("item"),
                "kind": r.get::<Option<String>, _>("kind"),
                "pad": r.get::<Option<String>, _>("pad"),
            })
        })
        .collect();
    assert!(events.len() > 90_000, "{} events", events.len());
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), events);
}

/// Values that COPY's text format escapes (tab, newline, carriage return,
/// backslash, a text that reads `\N`, quotes in arrays and JSON) come
/// through the snapshot's COPY read unchanged, over several key ranges
/// read in parallel: DuckDB reads the table equal to Postgres.
#[tokio::test]
async fn snapshot_reads_escaped_values_back_exactly() {
    let (python, dir, pg, db) = start().await;
    prefill(&db, 5_000).await;
    db.execute(
        r#"UPDATE items SET
             name = CASE id % 3 WHEN 0 THEN E'tab\there\nnew line\r\\back\\slash'
                                WHEN 1 THEN '\N' ELSE E'\\N\t' END,
             note = E'line one\nline two\t\\x41',
             tags = ARRAY[E'a\tb', E'c\\d', 'e"f', NULL, '\N', E'g\nh'],
             doc = jsonb_build_object('k', E'a\tb\\c\n"q"', 'u', 'é🦀')
           WHERE id % 10 = 1"#,
    )
    .await
    .unwrap();
    let p = snapshot_pipeline(dir.path(), &pg, "*");
    run_to_end(&p);
    let read = assert_items_equal(&python, dir.path(), &db, &[]).await;
    assert_eq!(read.len(), 5_000);
    let escaped = read
        .iter()
        .filter(|r| r["name"].as_str() == Some("tab\there\nnew line\r\\back\\slash"))
        .count();
    assert!(escaped > 100, "{escaped} rows with escaped names");
}

/// Tables keyed by a uuid, by text and by a skewed bigint (two dense runs
/// 10^15 apart) are each split at sampled quantiles into ranges of about
/// the same size, read by two sessions while a writer changes every table:
/// about one chunk per range (an even split; an equal-width split of the
/// skewed key would leave one range with most rows), and after a kill -9
/// and a run to the end DuckDB reads the text- and bigint-keyed tables
/// equal to Postgres (the uuid-keyed one: see the comment at the end).
#[tokio::test]
async fn uuid_text_and_skewed_keys_are_split_evenly_and_end_equal() {
    let (python, dir, pg, db) = start().await;
    const ROWS: i64 = 10_000;
    db.execute(
        "CREATE TABLE keyed_uuid (id uuid PRIMARY KEY, v bigint);
         CREATE TABLE keyed_text (id text PRIMARY KEY, v bigint);
         CREATE TABLE keyed_skew (id bigint PRIMARY KEY, v bigint);
         INSERT INTO keyed_uuid SELECT md5(i::text)::uuid, i FROM generate_series(1, 10000) i;
         INSERT INTO keyed_text SELECT 'key ' || i || ' é', i FROM generate_series(1, 10000) i;
         INSERT INTO keyed_skew SELECT i, i FROM generate_series(1, 6000) i;
         INSERT INTO keyed_skew SELECT 1000000000000000 + i, i FROM generate_series(1, 4000) i;",
    )
    .await
    .unwrap();
    let tables = ["keyed_uuid", "keyed_text", "keyed_skew"];
    let mut text = format!(
        "CREATE PIPELINE pg WITH (max_batch_rows = 2000, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot_chunk_rows = 1000, snapshot_parallelism = 2);
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');
",
        uri = pg.uri(),
        d = dir.path().display()
    );
    for t in tables {
        text += &format!(
            "CREATE TABLE lake.{t} WITH (primary_key = 'id') AS SELECT * FROM src.public.{t};\n"
        );
    }
    let p = dir.path().join("keys.sql");
    std::fs::write(&p, text).unwrap();

    // A writer changes every table while it is copied: updates, deletes
    // and new keys, each in its own transaction.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(5);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let i = rng.random_range(1..=ROWS);
                let sql = match rng.random_range(0..9) {
                    0 => format!("UPDATE keyed_uuid SET v = -v WHERE id = md5('{i}')::uuid"),
                    1 => format!("DELETE FROM keyed_uuid WHERE id = md5('{i}')::uuid"),
                    2 => format!("INSERT INTO keyed_uuid VALUES (gen_random_uuid(), {i})"),
                    3 => format!("UPDATE keyed_text SET v = -v WHERE id = 'key {i} é'"),
                    4 => format!("DELETE FROM keyed_text WHERE id = 'key {i} é'"),
                    5 => format!("INSERT INTO keyed_text VALUES ('new {n} é', {i})"),
                    6 => format!(
                        "UPDATE keyed_skew SET v = -v WHERE id IN ({i}, 1000000000000000 + {i})"
                    ),
                    7 => format!("DELETE FROM keyed_skew WHERE id = 1000000000000000 + {i}"),
                    _ => format!("INSERT INTO keyed_skew VALUES (500000000000000 + {n}, {i})"),
                };
                db.execute(sql.as_str()).await.unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        })
    };
    let log_path = dir.path().join("run.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--log-level", "info"])
        .env("URUTAU_TEST_SNAPSHOT_WINDOW_MS", "20")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let done = eventually(180, || async {
        log().matches("initial snapshot complete").count() == tables.len()
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(done, "the snapshot did not complete:\n{}", log());
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run stopped:\n{}",
        log()
    );
    child.kill().unwrap(); // SIGKILL, after the copy
    child.wait().unwrap();
    let log = log();
    eprintln!("{writes} concurrent writes");

    // `field=value` of the log line with `message` about `table`.
    let figure = |message: &str, table: &str, field: &str| -> u64 {
        let line = log
            .lines()
            .find(|l| l.contains(message) && l.contains(&format!("table=public.{table} ")))
            .unwrap_or_else(|| panic!("no `{message}` line for {table}:\n{log}"));
        let at = line.find(&format!(" {field}=")).unwrap() + field.len() + 2;
        line[at..].split(' ').next().unwrap().parse().unwrap()
    };
    for t in tables {
        let ranges = figure("snapshot key ranges", t, "ranges");
        let chunks = figure("initial snapshot complete", t, "chunks");
        eprintln!("{t}: {ranges} ranges, {chunks} chunks");
        // 10,000 rows in chunks of 1,000 make 13 ranges of ~800 rows.
        assert!((10..=16).contains(&ranges), "{t}: {ranges} ranges");
        // Even ranges: a chunk each, bar a few the writer filled up.
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(t)).collect();
        assert!(
            chunks <= ranges + 3,
            "{t}: {chunks} chunks for {ranges} ranges:\n{}",
            lines.join("\n")
        );
    }

    run_to_end(&p);
    // The uuid-keyed table is read back too: its key column carries
    // Parquet's UUID annotation (`sinks/src/iceberg/parquet_file.rs`);
    // without it DuckDB failed on the table ("Expected vector of type
    // INT128, but found vector of type VARCHAR") and Iceberg's Java reader
    // applied no equality delete keyed by it.
    for t in tables {
        let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", t)
            .await
            .unwrap();
        let mut want: Vec<(String, i64)> = sqlx::query_as(&format!("SELECT id::text, v FROM {t}"))
            .fetch_all(&db)
            .await
            .unwrap();
        want.sort();
        assert!(want.len() as i64 > ROWS / 2, "{t}: {} rows", want.len());
        let readers = [
            ("DuckDB", common::duckdb_rows(&python, &loc, "id")),
            (
                "Iceberg's Java reader",
                common::iceberg_java_rows(&loc, "id"),
            ),
        ];
        for (reader, read) in readers {
            let mut got: Vec<(String, i64)> = read
                .iter()
                .map(|r| {
                    let id = match &r["id"] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (id, r["v"].as_i64().unwrap())
                })
                .collect();
            got.sort();
            assert_eq!(got.len(), want.len(), "{t}: rows {reader} read back");
            assert!(
                got == want,
                "{t}: the rows {reader} read back differ from Postgres's"
            );
        }
    }
}

/// While the routed tables are idle and the rest of the database is busy,
/// the slot follows the server's WAL (no WAL is retained for tables the
/// pipeline does not read), and `pg_ctl stop -m fast` completes while
/// urutau streams (the walsender waits for the client to confirm what it
/// sent). After a restart of the server, a run ends equal to Postgres and
/// the slot was never acknowledged past a routed change.
#[tokio::test]
async fn an_idle_stream_lets_the_slot_advance_and_postgres_stop_fast() {
    let (python, dir, pg, db) = start().await;
    db.execute("CREATE TABLE other (id bigint PRIMARY KEY, pad text);")
        .await
        .unwrap();
    let p = pipeline(dir.path(), &pg);
    let log = std::fs::File::create(dir.path().join("run.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    // The stream is up once the slot exists and is active.
    let active = eventually(60, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT count(*) = 1 FROM pg_replication_slots WHERE slot_name = 'urutau_test' AND active",
        )
        .fetch_one(&db)
        .await
        .unwrap()
    })
    .await;
    assert!(active, "the run streams from its slot");
    // (`snapshot = 'none'`: what the slot streams from its creation on.)
    db.execute(
        "INSERT INTO items (id, name, qty) SELECT i, 'n' || i, i FROM generate_series(1, 50) i;
         INSERT INTO events VALUES (1, 1, 'seed');
         UPDATE items SET qty = qty + 1 WHERE id <= 10; INSERT INTO events VALUES (2, 2, 'x');",
    )
    .await
    .unwrap();
    let held = eventually(60, || async {
        committed(dir.path(), "items").await.is_some()
            && committed(dir.path(), "events").await.is_some()
    })
    .await;
    assert!(held, "both tables committed");

    // Only the unrouted table changes: the slot moves over its WAL.
    db.execute("INSERT INTO other SELECT i, repeat('x', 200) FROM generate_series(1, 20000) i")
        .await
        .unwrap();
    let busy_end: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&db)
        .await
        .unwrap();
    let busy_end = lsn(&busy_end);
    let followed = eventually(30, || async { confirmed_flush(&db).await >= busy_end }).await;
    assert!(
        followed,
        "confirmed_flush_lsn {:X} did not follow the server to {busy_end:X}",
        confirmed_flush(&db).await
    );
    assert!(child.try_wait().unwrap().is_none(), "the run is streaming");

    // A fast shutdown completes while urutau streams (bounded: pg_ctl
    // gives up after 30 s and the harness fails the test).
    pg.stop("fast", 30);
    // The run retries while the server is away (tests/faults.rs follows
    // it through restarts); here it is ended, and a new run goes on.
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run waits to retry"
    );
    let _ = child.kill();
    child.wait().unwrap();

    pg.start_again();
    db.execute(
        "UPDATE items SET name = 'after restart' WHERE id = 3; DELETE FROM items WHERE id = 4;",
    )
    .await
    .unwrap();
    run_to_end(&p);
    assert_items_equal(&python, dir.path(), &db, &[]).await;
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &loc, "id"),
        source_events(&db).await
    );
    assert_final_acknowledgement(&db, dir.path()).await;
}

/// A 1M-row table of the shape users size CDC tools by (bigint key,
/// bigint, numeric, text, timestamptz, text), snapshotted into Iceberg
/// with compaction due after every commit (target 8 MiB, two candidates
/// enough): the snapshot's rows are gathered into data files of the
/// target size, every live data file but one is at least that size (as
/// DuckDB reads the manifests), no delete file is written, compaction
/// never rewrites anything, and DuckDB reads the table equal to Postgres
/// (count and sums).
#[tokio::test]
async fn a_1m_row_snapshot_leaves_data_files_of_the_target_size() {
    let (python, dir, pg, db) = start().await;
    const TARGET: u64 = 8 << 20;
    db.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer bigint NOT NULL,
           amount numeric(12,2), status text, placed timestamptz, note text);
         INSERT INTO orders SELECT i, i % 10007, (i % 100000) / 100.0,
           (ARRAY['new','paid','shipped','returned'])[1 + i % 4],
           TIMESTAMPTZ '2024-01-01' + i * INTERVAL '1 second', 'order note ' || md5(i::text)
         FROM generate_series(1, 1000000) i;
         ANALYZE orders;",
    )
    .await
    .unwrap();
    let text = format!(
        "CREATE PIPELINE pg WITH (max_batch_rows = 2000, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot_parallelism = 2);
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg',
  maintenance_enabled = true, maintenance_compaction_interval = '0s',
  maintenance_compaction_target_file_size = '8MiB', maintenance_compaction_min_input_files = 2);
CREATE TABLE lake.orders WITH (primary_key = 'id') AS SELECT * FROM src.public.orders;
",
        uri = pg.uri(),
        d = dir.path().display()
    );
    let p = dir.path().join("orders.sql");
    std::fs::write(&p, text).unwrap();
    let out = run_to_end(&p);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "orders")
        .await
        .unwrap();
    let files = common::duckdb_live_files(&python, &loc);
    assert!(
        files.iter().all(|f| f["content"] == 0),
        "a snapshot of keys nobody else wrote needs no delete file: {files:?}"
    );
    let mut sizes: Vec<u64> = files.iter().map(|f| f["size"].as_u64().unwrap()).collect();
    sizes.sort_unstable();
    eprintln!("data file sizes: {sizes:?}");
    assert!(sizes.len() >= 2, "the table fits one file: {sizes:?}");
    assert!(
        sizes[1..].iter().all(|s| *s >= TARGET),
        "data files below the target besides the last: {sizes:?}"
    );
    let md: Value =
        serde_json::from_str(&std::fs::read_to_string(loc.trim_start_matches("file://")).unwrap())
            .unwrap();
    let operations: Vec<&str> = md["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["summary"]["operation"].as_str().unwrap())
        .collect();
    assert!(
        !operations.contains(&"replace"),
        "compaction rewrote files: {operations:?}"
    );
    let read = common::harness(
        &python,
        "iceberg_read.py",
        &[
            &loc,
            "--select",
            "count(*) AS n, sum(id) AS ids, sum(customer) AS customers, sum(amount) AS amount, sum(length(note)) AS notes",
        ],
        "DuckDB could not read orders",
    );
    let read: Value = serde_json::from_slice(&read).unwrap();
    let want: (i64, i64, i64, String, i64) = sqlx::query_as(
        "SELECT count(*), sum(id)::bigint, sum(customer)::bigint, sum(amount)::text, sum(length(note))::bigint FROM orders",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(read["n"], want.0, "{read}");
    assert_eq!(read["ids"], want.1, "{read}");
    assert_eq!(read["customers"], want.2, "{read}");
    assert_eq!(read["amount"].as_str().unwrap(), want.3, "{read}");
    assert_eq!(read["notes"], want.4, "{read}");
}
