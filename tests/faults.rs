//! The fault-injection suite (issue 16): real faults made by real means —
//! the PostgreSQL server restarted (fast and immediate) under a streaming
//! and a snapshotting run, and kept away for longer than the retry budget;
//! the network to it cut through a TCP proxy (tests/common/proxy.rs);
//! ClickHouse and the Iceberg REST catalog with its S3 stopped mid-run; a
//! slot the server invalidated; a 5M-row transaction killed while staged.
//! Every case ends with the sink read back by its independent reader
//! (DuckDB, the ClickHouse engine; for the 5M rows, a digest by Iceberg's
//! Java reader) equal to Postgres, and
//! the slot never acknowledged past what the sinks hold.

mod common;

use common::pg_cdc::*;
use common::run_to_end;

use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::Executor;
use sqlx::postgres::PgPool;

/// `urutau run FILE --metrics-addr ADDR`, its log in `log`.
fn spawn_run(pipeline: &std::path::Path, addr: &str, log: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", pipeline.to_str().unwrap(), "--metrics-addr", addr])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// GET `path` on the run's status server: (HTTP status, body).
async fn get(addr: &str, path: &str) -> (u16, String) {
    match reqwest::get(format!("http://{addr}{path}")).await {
        Ok(reply) => {
            let status = reply.status().as_u16();
            (status, reply.text().await.unwrap_or_default())
        }
        // The run is gone (a failing test says so by the status).
        Err(e) => (0, format!("the status server does not answer: {e}")),
    }
}

/// Runs the seeded workload to its end (phase `n`: its own seed and event
/// ids), then one transaction that changes both tables, so each table has
/// a commit after everything before it.
async fn write(db: &PgPool, n: u64, transactions: usize) {
    let stop = AtomicBool::new(false);
    workload(db, 100 + n, transactions, &stop, 400, n as i64 * 1_000_000).await;
    sqlx::query(
        "WITH e AS (INSERT INTO events VALUES ($1, 1, 'phase end') RETURNING 1)
         UPDATE items SET qty = coalesce(qty, 0) + 1 WHERE id = (SELECT min(id) FROM items)",
    )
    .bind(n as i64 * 1_000_000 + 999_999)
    .execute(db)
    .await
    .unwrap();
}

/// Waits until the slot is streamed from (the run is up).
async fn wait_streaming(db: &PgPool) -> bool {
    eventually(60, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT count(*) = 1 FROM pg_replication_slots WHERE slot_name = 'urutau_test' AND active",
        )
        .fetch_one(db)
        .await
        .unwrap_or(false)
    })
    .await
}

/// What the sinks hold and what the run logged, for a failed wait.
async fn diagnose(db: &PgPool, dir: &std::path::Path, log: &std::path::Path) -> String {
    let mut out = String::new();
    for t in ["items", "events"] {
        out += &format!(
            "{t}: committed {:X?}, last routed commit {:X?}\n",
            committed(dir, t).await,
            last_routed_commit(db, t).await
        );
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    out + &lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Prints the first retries a run logged (what the failing server said).
fn show_retries(log: &str) {
    for line in log.lines().filter(|l| l.contains("retrying")).take(3) {
        eprintln!("{line}");
    }
}

/// Asks the run to stop (SIGTERM) and waits for its exit status.
fn stop_run(child: &mut Child) -> std::process::ExitStatus {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not stop within 60 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the run's `/healthz` answers 503 naming `component`
/// (`route ch.items`) as the part it retries, and checks the run is
/// still up: a server it commits into is away.
async fn assert_retrying(child: &mut Child, addr: &str, log: &std::path::Path, component: &str) {
    let failing = eventually(60, || async { get(addr, "/healthz").await.0 == 503 }).await;
    let (_, why) = get(addr, "/healthz").await;
    assert!(
        failing,
        "the commits of {component} fail while its server is away: {why}\n{}",
        std::fs::read_to_string(log).unwrap()
    );
    assert!(why.contains(&format!("retrying {component}")), "{why}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");
}

/// Waits (at most 90 s) for the run to give up: it exits 1, and its last
/// logged error is returned (what the operator reads).
async fn exit_error(child: &mut Child, log: &std::path::Path) -> String {
    let began = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "the run did not give up: {}",
            std::fs::read_to_string(log).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = std::fs::read_to_string(log).unwrap();
    assert_eq!(status.code(), Some(1), "{text}");
    let last = text
        .lines()
        .rev()
        .find(|l| l.contains("error"))
        .unwrap_or_default()
        .to_string();
    eprintln!("the run ended with: {last}");
    last
}

/// [`exit_error`] of a run whose source `src` outlasted `retry_timeout =
/// '4s'`: the message names the source, what failed and the budget.
async fn exit_error_of_source(child: &mut Child, log: &std::path::Path) -> String {
    let last = exit_error(child, log).await;
    assert!(last.contains("source src"), "{last}");
    assert!(
        last.contains("Postgres") || last.contains("replication"),
        "names what failed: {last}"
    );
    assert!(last.contains("retry_timeout = 4s"), "{last}");
    last
}

/// Both tables read back by DuckDB equal Postgres; the slot is
/// acknowledged past no change the sinks do not hold.
async fn assert_equal(python: &std::path::Path, dir: &std::path::Path, db: &PgPool) {
    assert_items_equal(python, dir, db, &[]).await;
    let loc = common::catalog_metadata_location(&dir.join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    assert_eq!(
        common::duckdb_rows(python, &loc, "id"),
        source_events(db).await
    );
    assert_slot_not_ahead(db, dir).await;
}

/// One run rides out `pg_ctl restart -m fast` (which completes within its
/// 10 s bound while urutau streams) and then a crash (`-m immediate`):
/// it stays up, `/healthz` answers 503 while the server is away and `ok`
/// again after, the retries are counted in `/metrics`, and the same
/// process applies the changes made after each restart. The end state
/// equals Postgres.
#[tokio::test]
async fn a_streaming_run_rides_out_fast_and_immediate_restarts_of_postgres() {
    let (python, dir, pg, db) = start().await;
    let p = pipeline(dir.path(), &pg);
    let addr = free_addr();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &addr, &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");

    // Changes streamed while the run is busy, then a fast restart.
    write(&db, 1, 150).await;
    let began = Instant::now();
    pg.stop("fast", 10);
    eprintln!("pg_ctl stop -m fast took {:?}", began.elapsed());
    pg.start_again();
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");

    write(&db, 2, 150).await;
    assert!(
        wait_caught_up(&db, dir.path(), 120).await,
        "the run applied the changes made after the fast restart: {}",
        diagnose(&db, dir.path(), &log).await
    );

    // A crash: the server is gone at once, and stays away a while.
    pg.stop("immediate", 10);
    let unhealthy = eventually(30, || async { get(&addr, "/healthz").await.0 == 503 }).await;
    let (_, why) = get(&addr, "/healthz").await;
    assert!(unhealthy, "/healthz turns unhealthy while Postgres is away");
    assert!(why.contains("retrying source src"), "{why}");
    let status: Value = serde_json::from_str(&get(&addr, "/statusz").await.1).unwrap();
    assert_eq!(status["health"]["state"], "retrying", "{status}");
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");
    pg.start_again();

    write(&db, 3, 150).await;
    assert!(
        wait_caught_up(&db, dir.path(), 120).await,
        "the run applied the changes made after the crash"
    );
    let healthy = eventually(30, || async { get(&addr, "/healthz").await.0 == 200 }).await;
    assert!(healthy, "/healthz is ok again once the run is back");
    let (_, metrics) = get(&addr, "/metrics").await;
    let retries: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("urutau_retries_total{component=\"source src\"} "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(retries >= 2, "one retry per restart at least:\n{metrics}");
    assert!(
        stop_run(&mut child).success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    for line in text.lines().filter(|l| l.contains("WARN")) {
        eprintln!("{line}");
    }
    assert!(
        text.contains("retrying from the committed positions"),
        "{text}"
    );
    assert!(!text.contains(&pg.uri()), "the source URI is never logged");

    assert_equal(&python, dir.path(), &db).await;
    assert_final_acknowledgement(&db, dir.path()).await;
}

/// An outage longer than `retry_timeout` ends the run with exit 1 and a
/// message that names the source, the failing operation and the budget;
/// once the server is back, a run ends equal to Postgres.
#[tokio::test]
async fn an_outage_longer_than_retry_timeout_exits_1_with_the_cause() {
    let (python, dir, pg, db) = start().await;
    let p = pipeline(dir.path(), &pg);
    let text = std::fs::read_to_string(&p).unwrap().replace(
        "snapshot = 'none'",
        "snapshot = 'none', retry_timeout = '4s'",
    );
    std::fs::write(&p, text).unwrap();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &free_addr(), &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    write(&db, 1, 100).await;
    assert!(wait_caught_up(&db, dir.path(), 120).await);

    pg.stop("immediate", 10);
    exit_error_of_source(&mut child, &log).await;

    pg.start_again();
    write(&db, 2, 100).await;
    run_to_end(&p);
    assert_equal(&python, dir.path(), &db).await;
    assert_final_acknowledgement(&db, dir.path()).await;
}

/// A crash of Postgres in the middle of the initial snapshot: the run
/// retries, the snapshot goes on from the committed chunk progress, and the
/// end state (rows copied while a writer changed the table) equals Postgres.
#[tokio::test]
async fn a_crash_of_postgres_mid_snapshot_resumes_the_snapshot_and_ends_equal() {
    let (python, dir, pg, db) = start().await;
    const ROWS: i64 = 60_000;
    prefill(&db, ROWS).await;
    let p = snapshot_pipeline(dir.path(), &pg, "*");
    let addr = free_addr();
    let log = dir.path().join("run.log");
    let stop = Arc::new(AtomicBool::new(false));
    let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--metrics-addr", &addr])
        .env("URUTAU_TEST_SNAPSHOT_WINDOW_MS", "40")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Some chunks committed, the snapshot not complete: crash the server.
    let mid = eventually(120, || async {
        property(dir.path(), "items", "cdc.snapshot.state")
            .await
            .as_deref()
            == Some("in_progress")
    })
    .await;
    assert!(mid, "the snapshot committed a chunk");
    pg.stop("immediate", 10);
    assert_eq!(
        property(dir.path(), "items", "cdc.snapshot.state")
            .await
            .as_deref(),
        Some("in_progress"),
        "the crash landed mid-snapshot"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");
    pg.start_again();
    // Changes everywhere in the table, also in the chunks not read yet.
    workload(&db, 5, 300, &stop, ROWS, 10_001).await;
    write(&db, 2, 100).await;

    // Both tables: `events` may be copied after `items`.
    let complete = eventually(300, || async {
        for table in ["items", "events"] {
            if property(dir.path(), table, "cdc.snapshot.state")
                .await
                .as_deref()
                != Some("complete")
            {
                return false;
            }
        }
        true
    })
    .await;
    assert!(
        complete,
        "the snapshot of both tables completed after the crash: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(wait_caught_up(&db, dir.path(), 120).await);
    assert!(stop_run(&mut child).success());
    let read = assert_items_equal(&python, dir.path(), &db, &[]).await;
    assert!(read.len() as i64 > ROWS / 2, "{} rows", read.len());
    assert_equal(&python, dir.path(), &db).await;
}

/// `id, name, qty` of every item, as ClickHouse holds them (`FINAL`).
async fn read_items(ch: &common::ClickHouse) -> Result<Vec<Value>, String> {
    let text = ch
        .try_query(
            "SELECT id, name, qty FROM urutau_t_faults.items FINAL ORDER BY id \
             SETTINGS output_format_json_quote_64bit_integers = 0 FORMAT JSONEachRow",
        )
        .await?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect())
}

/// The ClickHouse server (the harness's front over the real engine) is
/// stopped while a Postgres run commits into it, and started again: the
/// commits that fail meanwhile are retried from the committed positions,
/// `/metrics` counts the route's retries, and ClickHouse (read by the
/// engine, `FINAL`) ends equal to Postgres.
#[tokio::test]
async fn clickhouse_stopped_and_started_again_mid_run_is_retried_and_ends_equal() {
    let (python, dir, pg, db) = start().await;
    let mut ch = common::ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_faults").await;
    let p = dir.path().join("ch.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE pg WITH (max_batch_rows = 200, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot = 'none');
CREATE SINK ch INTO clickhouse WITH ({options});
CREATE TABLE ch.items WITH (primary_key = 'id') AS SELECT id, name, qty FROM src.public.items;
",
            uri = pg.uri(),
            options = ch.sink_options("urutau_t_faults")
        ),
    )
    .unwrap();
    let addr = free_addr();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &addr, &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    write(&db, 1, 150).await;
    let want = source_kv(&db).await;
    let equal = eventually(120, || async {
        read_items(&ch).await.ok().as_ref() == Some(&want)
    })
    .await;
    assert!(
        equal,
        "ClickHouse holds phase 1: {}",
        diagnose(&db, dir.path(), &log).await
    );

    ch.stop();
    write(&db, 2, 150).await;
    assert_retrying(&mut child, &addr, &log, "route ch.items").await;
    ch.start_again();

    write(&db, 3, 150).await;
    let want = source_kv(&db).await;
    let equal = eventually(120, || async {
        read_items(&ch).await.ok().as_ref() == Some(&want)
    })
    .await;
    assert!(
        equal,
        "ClickHouse ends equal to Postgres: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    let (_, metrics) = get(&addr, "/metrics").await;
    assert!(
        metrics.contains("urutau_retries_total{component=\"route ch.items\"}"),
        "{metrics}"
    );
    assert!(
        stop_run(&mut child).success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    show_retries(&text);
    assert!(
        !text.contains("ch-test-secret"),
        "the sink's password is never logged"
    );
    assert_eq!(read_items(&ch).await.unwrap(), source_kv(&db).await);
}

/// A slot the server invalidated (`max_slot_wal_keep_size` exceeded while
/// the pipeline was down) is a terminal error that says the changes are
/// gone and how to start over, never a silent restart; following it (drop
/// the slot and the tables, run again) ends equal to Postgres.
#[tokio::test]
async fn an_invalidated_slot_stops_the_run_and_says_how_to_start_over() {
    let (python, dir, pg, db) = start().await;
    prefill(&db, 2_000).await;
    let p = pipeline(dir.path(), &pg);
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("snapshot = 'none'", "snapshot = 'initial'");
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    write(&db, 1, 50).await;

    // The pipeline is down while the server writes far more WAL than the
    // slot may hold back.
    // (One statement each: ALTER SYSTEM and CHECKPOINT refuse the
    // implicit transaction of a multi-statement query.)
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
    ] {
        db.execute(sql).await.unwrap();
    }
    db.execute("CREATE TABLE scratch (id bigint, pad text)")
        .await
        .unwrap();
    let mut lost = false;
    for _ in 0..10 {
        for sql in [
            "INSERT INTO scratch SELECT i, repeat('x', 500) FROM generate_series(1, 20000) i",
            "SELECT pg_switch_wal()",
            "CHECKPOINT",
        ] {
            db.execute(sql).await.unwrap();
        }
        let status: Option<String> = sqlx::query_scalar(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'urutau_test'",
        )
        .fetch_one(&db)
        .await
        .unwrap();
        if status.as_deref() == Some("lost") {
            lost = true;
            break;
        }
    }
    assert!(lost, "the server invalidated the slot");

    let out = common::urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("replication slot urutau_test was invalidated"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the changes after the sinks' positions are gone"),
        "{stderr}"
    );
    assert!(
        stderr.contains("SELECT pg_drop_replication_slot('urutau_test')"),
        "{stderr}"
    );
    assert!(!stderr.contains("retrying"), "not retried: {stderr}");

    // Start over as the message says: drop the slot and the tables.
    for sql in [
        "SELECT pg_drop_replication_slot('urutau_test')",
        "ALTER SYSTEM RESET max_slot_wal_keep_size",
        "SELECT pg_reload_conf()",
    ] {
        db.execute(sql).await.unwrap();
    }
    std::fs::remove_file(dir.path().join("catalog.db")).unwrap();
    std::fs::remove_dir_all(dir.path().join("wh")).unwrap();
    run_to_end(&p);
    assert_items_equal(&python, dir.path(), &db, &[]).await;
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &loc, "id"),
        source_events(&db).await
    );
}

/// Waits (at most 2 minutes) until DuckDB reads `pg.items` from the REST
/// catalog equal to `want`.
async fn read_back_equal(server: &common::Seaweed, want: Vec<Value>) -> bool {
    eventually(120, || async {
        server.try_rows("pg.items", "id").as_ref() == Some(&want)
    })
    .await
}

/// SeaweedFS (the Iceberg REST catalog and its S3 object store) is stopped
/// while a Postgres run commits into it, and started again: the failed
/// commits are retried from the committed position, and DuckDB reads the
/// table from S3 equal to Postgres.
#[tokio::test]
async fn the_rest_catalog_and_s3_stopped_and_started_again_mid_run_end_equal() {
    let (python, dir, pg, db) = start().await;
    let mut server = common::Seaweed::start(&python, &dir.path().join("seaweed"));
    let (id, secret) = server.credential();
    let p = dir.path().join("rest.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE pg WITH (max_batch_rows = 200, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot = 'none');
CREATE SINK lake INTO iceberg WITH (catalog = 'rest', uri = '{rest}', warehouse = '{wh}',
  client_id = '{id}', client_secret = '{secret}', s3_endpoint = '{s3}', s3_region = 'us-east-1',
  s3_path_style = true, s3_access_key_id = '{id}', s3_secret_access_key = '{secret}',
  namespace = 'pg');
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT id, name, qty FROM src.public.items;
",
            uri = pg.uri(),
            rest = server.iceberg_uri(),
            wh = server.warehouse(),
            s3 = server.s3_endpoint()
        ),
    )
    .unwrap();
    let addr = free_addr();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &addr, &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    write(&db, 1, 100).await;
    assert!(
        read_back_equal(&server, source_kv(&db).await).await,
        "the catalog holds phase 1: {}",
        std::fs::read_to_string(&log).unwrap()
    );

    server.stop();
    write(&db, 2, 100).await;
    assert_retrying(&mut child, &addr, &log, "route lake.items").await;
    server.start_again();

    write(&db, 3, 100).await;
    let want = source_kv(&db).await;
    assert!(
        read_back_equal(&server, want).await,
        "DuckDB reads the table equal to Postgres: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(
        stop_run(&mut child).success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(&secret), "the S3 secret is never logged");
    show_retries(&text);
}

/// The pipeline of `pipeline()`, its source reaching Postgres through
/// `proxy`, with `source_options` added to the source.
fn through_proxy(
    dir: &std::path::Path,
    pg: &common::Postgres,
    proxy: &common::proxy::TcpProxy,
    source_options: &str,
) -> std::path::PathBuf {
    let p = pipeline(dir, pg);
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace(&pg.uri(), &proxy.uri_through(&pg.uri(), pg.addr()))
        .replace(
            "snapshot = 'none'",
            &format!("snapshot = 'none'{source_options}"),
        );
    std::fs::write(&p, text).unwrap();
    p
}

/// Waits until `/healthz` answers 503 retrying `source src` (the
/// network to Postgres is away); the reason it gives.
async fn source_retrying(addr: &str, log: &std::path::Path) -> String {
    let unhealthy = eventually(30, || async { get(addr, "/healthz").await.0 == 503 }).await;
    let (_, why) = get(addr, "/healthz").await;
    assert!(
        unhealthy,
        "/healthz turns unhealthy while the network is away: {why}\n{}",
        std::fs::read_to_string(log).unwrap()
    );
    assert!(why.contains("retrying source src"), "{why}");
    why
}

/// The network to Postgres is back: the run applies what was written
/// during and after the fault, turns healthy, stops on SIGTERM, and both
/// tables equal Postgres with the slot acknowledged up to the sinks.
async fn after_the_network_returns(
    child: &mut Child,
    addr: &str,
    log: &std::path::Path,
    python: &std::path::Path,
    dir: &std::path::Path,
    db: &PgPool,
) {
    write(db, 3, 150).await;
    assert!(
        wait_caught_up(db, dir, 120).await,
        "the run applied the changes made during and after the fault: {}",
        diagnose(db, dir, log).await
    );
    let healthy = eventually(30, || async { get(addr, "/healthz").await.0 == 200 }).await;
    assert!(healthy, "/healthz is ok again once the network is back");
    assert!(
        stop_run(child).success(),
        "{}",
        std::fs::read_to_string(log).unwrap()
    );
    show_retries(&std::fs::read_to_string(log).unwrap());
    assert_equal(python, dir, db).await;
    assert_final_acknowledgement(db, dir).await;
}

/// The network to Postgres is cut for 5 s under a streaming run (every
/// connection reset, new ones refused, the server itself up): the run
/// stays up, says it is retrying the source, reconnects when the path is
/// back and applies the changes made during and after the cut.
#[tokio::test]
async fn a_5s_network_cut_to_postgres_is_ridden_out() {
    let (python, dir, pg, db) = start().await;
    let proxy = common::proxy::TcpProxy::start(pg.addr());
    let p = through_proxy(dir.path(), &pg, &proxy, "");
    let addr = free_addr();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &addr, &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    write(&db, 1, 150).await;
    assert!(wait_caught_up(&db, dir.path(), 120).await);

    proxy.cut();
    let cut_at = Instant::now();
    // The server sees its walsender's client go, and frees the slot.
    let released = eventually(30, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'urutau_test'",
        )
        .fetch_one(&db)
        .await
        .unwrap_or(false)
    })
    .await;
    assert!(released, "the cut ended the replication connection");
    write(&db, 2, 150).await;
    source_retrying(&addr, &log).await;
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(cut_at.elapsed())).await;
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");
    proxy.restore();

    after_the_network_returns(&mut child, &addr, &log, &python, dir.path(), &db).await;
}

/// The network to Postgres stays cut for longer than `retry_timeout`: the
/// run exits 1 with a message naming the source, what failed and the
/// budget; once the path is back, a run ends equal to Postgres.
#[tokio::test]
async fn a_network_cut_longer_than_retry_timeout_exits_1_and_a_restart_ends_equal() {
    let (python, dir, pg, db) = start().await;
    let proxy = common::proxy::TcpProxy::start(pg.addr());
    let p = through_proxy(dir.path(), &pg, &proxy, ", retry_timeout = '4s'");
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &free_addr(), &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    write(&db, 1, 100).await;
    assert!(wait_caught_up(&db, dir.path(), 120).await);

    proxy.cut();
    write(&db, 2, 100).await;
    let last = exit_error_of_source(&mut child, &log).await;
    assert!(
        last.to_ascii_lowercase().contains("reset"),
        "says the connection was reset: {last}"
    );

    proxy.restore();
    write(&db, 3, 100).await;
    run_to_end(&p);
    assert_equal(&python, dir.path(), &db).await;
    assert_final_acknowledgement(&db, dir.path()).await;
}

/// A pipeline's Iceberg sink with every maintenance pass after every
/// commit: compaction once 4 files are candidates, expiry keeping the
/// newest 5 snapshots, orphan cleanup of any unreferenced file (`0s` is
/// safe: the pipeline is the table's one writer).
fn with_maintenance(p: &std::path::Path) {
    let text = std::fs::read_to_string(p).unwrap().replace(
        "namespace = 'pg')",
        "namespace = 'pg', maintenance_enabled = true,
  maintenance_compaction_interval = '0s', maintenance_compaction_min_input_files = 4,
  maintenance_snapshot_expiry_interval = '0s', maintenance_snapshot_expiry_retain_last = 5,
  maintenance_snapshot_expiry_max_age = '0s',
  maintenance_orphan_cleanup_interval = '0s', maintenance_orphan_cleanup_older_than = '0s')",
    );
    assert!(text.contains("maintenance_enabled"));
    std::fs::write(p, text).unwrap();
}

/// kill -9 in the middle of each maintenance pass — compaction with its
/// files written and not committed, expiry committed with its manifest
/// lists not deleted, orphan cleanup after its first removal (a test hook
/// pauses the run there; the kill is a real SIGKILL) — and a run after
/// each: the table ends equal to Postgres, maintenance goes on, and the
/// files the killed compaction wrote are cleaned up as orphans.
#[tokio::test]
async fn kill_9_in_the_middle_of_each_maintenance_pass_ends_equal() {
    let (python, dir, pg, db) = start().await;
    let p = pipeline(dir.path(), &pg);
    with_maintenance(&p);
    let data = dir.path().join("wh/pg/items/data");
    for (n, point) in ["compaction", "expiry", "orphans"].into_iter().enumerate() {
        let mark = dir.path().join(format!("paused-at-{point}"));
        let log = dir.path().join(format!("run-{point}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
            .args(["run", p.to_str().unwrap()])
            .env("URUTAU_TEST_PAUSE_AT", point)
            .env("URUTAU_TEST_PAUSE_MARK", &mark)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        assert!(wait_streaming(&db).await, "the run streams from its slot");
        let began = Instant::now();
        let mut phase = 10 * n as u64;
        while !mark.exists() {
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "the run reached the {point} pass: {}",
                std::fs::read_to_string(&log).unwrap()
            );
            assert!(
                child.try_wait().unwrap().is_none(),
                "{}",
                std::fs::read_to_string(&log).unwrap()
            );
            phase += 1;
            write(&db, phase, 10).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        child.kill().unwrap(); // SIGKILL, paused mid-pass
        child.wait().unwrap();
        assert_slot_not_ahead(&db, dir.path()).await;
        if point == "compaction" {
            assert!(
                std::fs::read_dir(&data).unwrap().count() > 0,
                "the killed compaction left its files"
            );
        }
    }
    write(&db, 99, 100).await;
    run_to_end(&p);
    assert_equal(&python, dir.path(), &db).await;
    assert_final_acknowledgement(&db, dir.path()).await;

    // Maintenance went on after the kills: the newest snapshots include
    // a compaction, and every data file left is one a kept snapshot reads.
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "items")
        .await
        .unwrap();
    let md: Value = serde_json::from_str(&std::fs::read_to_string(&loc).unwrap()).unwrap();
    let snapshots = md["snapshots"].as_array().unwrap();
    assert!(
        snapshots.len() <= 6,
        "expiry keeps the newest 5 (and one new)"
    );
    let referenced = common::duckdb_referenced_files(&python, &loc);
    let on_disk: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let orphans: Vec<&String> = on_disk
        .iter()
        .filter(|f| !referenced.iter().any(|r| r.ends_with(f.as_str())))
        .collect();
    assert!(
        orphans.is_empty(),
        "unreferenced files left: {orphans:?} (referenced: {referenced:?})"
    );
}

/// `pg.items` as DuckDB reads it from the local catalog, by id.
async fn lake_items(python: &std::path::Path, dir: &std::path::Path) -> Vec<Value> {
    let loc = common::catalog_metadata_location(&dir.join("catalog.db"), "pg", "items")
        .await
        .unwrap();
    common::duckdb_rows(python, &loc, "id")
}

/// The warehouse's disk fills up under a streaming run (a 64 MiB tmpfs,
/// filled by a file): the commits fail with `No space left on device`,
/// which is retried; no partial snapshot lands (DuckDB reads the table
/// as it was before the disk filled), and once the space is back the run
/// carries on and ends equal to Postgres.
#[tokio::test]
async fn a_full_warehouse_disk_commits_nothing_partial_and_resumes_when_space_returns() {
    let (python, dir, pg, db) = start().await;
    let disk = common::small_disk::SmallDisk::mount(&dir.path().join("wh"), 64);
    let p = pipeline(dir.path(), &pg);
    let addr = free_addr();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &addr, &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    write(&db, 1, 150).await;
    assert!(wait_caught_up(&db, dir.path(), 120).await);
    let before = source_items(&db).await;
    assert_eq!(lake_items(&python, dir.path()).await, before);

    disk.fill();
    write(&db, 2, 150).await;
    assert_retrying(&mut child, &addr, &log, "route lake.").await;
    let (_, why) = get(&addr, "/healthz").await;
    assert!(
        why.to_ascii_lowercase().contains("no space left on device"),
        "says the disk is full: {why}"
    );
    assert_eq!(
        lake_items(&python, dir.path()).await,
        before,
        "nothing of the failed commits is visible"
    );
    disk.free();

    write(&db, 3, 150).await;
    assert!(
        wait_caught_up(&db, dir.path(), 120).await,
        "the run carried on once the space was back: {}",
        diagnose(&db, dir.path(), &log).await
    );
    assert!(
        stop_run(&mut child).success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    show_retries(&std::fs::read_to_string(&log).unwrap());
    assert_equal(&python, dir.path(), &db).await;
    assert_final_acknowledgement(&db, dir.path()).await;
}

/// The network to Postgres goes silent for 5 s under a streaming run:
/// packets are dropped without a reset (the proxy holds every byte and
/// every connection), which TCP alone would not report for many minutes.
/// The run notices the silence (its check of the slot on a new session
/// gets no answer), retries, and once the network is back carries on; the
/// end state equals Postgres.
#[tokio::test]
async fn a_silent_network_to_postgres_is_noticed_and_ridden_out() {
    let (python, dir, pg, db) = start().await;
    let proxy = common::proxy::TcpProxy::start(pg.addr());
    let p = through_proxy(dir.path(), &pg, &proxy, "");
    let addr = free_addr();
    let log = dir.path().join("run.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--metrics-addr", &addr])
        .env("URUTAU_TEST_SILENCE_MS", "1500")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    write(&db, 1, 150).await;
    assert!(wait_caught_up(&db, dir.path(), 120).await);

    proxy.stall();
    let stalled_at = Instant::now();
    write(&db, 2, 150).await;
    let why = source_retrying(&addr, &log).await;
    assert!(why.contains("no message from the server"), "{why}");
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(stalled_at.elapsed())).await;
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");
    proxy.restore();

    after_the_network_returns(&mut child, &addr, &log, &python, dir.path(), &db).await;
}

/// The peak resident memory (VmHWM) of process `pid` so far, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Waits for `child` to exit, reading its peak memory every 20 ms (VmHWM
/// only grows; the last reading before the exit is the figure).
fn wait_with_peak(child: &mut Child, limit: Duration) -> (std::process::ExitStatus, u64) {
    let deadline = Instant::now() + limit;
    let mut peak = 0;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, peak);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the run did not end within {limit:?}");
        }
        peak = peak.max(peak_rss_kib(child.id()).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A digest of `big` by Postgres in the shape of Iceberg's Java reader's.
async fn big_digest(db: &PgPool) -> Value {
    let (rows, id, v, h, amount, note): (i64, String, String, String, String, i64) =
        sqlx::query_as(
            "SELECT count(*), sum(id)::text, sum(v)::text, sum(h)::text, sum(amount)::text,
                    sum(char_length(note))::int8 FROM big",
        )
        .fetch_one(db)
        .await
        .unwrap();
    let number = |s: &str| -> Value { serde_json::from_str(s).unwrap() };
    serde_json::json!({
        "rows": rows,
        "sum": {"id": number(&id), "v": number(&v), "h": number(&h), "amount": amount},
        "length": {"note": note},
    })
}

/// The largest case of the suite: one UPDATE of 5,000,000 rows in a single
/// transaction. The run streams it in parts (staged on the Iceberg table's
/// branch, memory bounded by `max_batch_rows`), is killed with SIGKILL while
/// parts are staged, and the restart lands the transaction at once. Its
/// peak memory stays within a small multiple of a 10,000-row transaction's
/// in the same run, and Iceberg's Java reader (which applies the equality
/// deletes as Iceberg defines them) reads a table whose row count and sums
/// (key, each value column, text lengths) equal Postgres's.
#[tokio::test]
async fn a_5m_row_transaction_is_staged_in_bounded_memory_through_kill_9() {
    const ROWS: i64 = 5_000_000;
    let (_python, dir, pg, db) = start().await;
    db.execute(
        format!(
            "CREATE TABLE big (id bigint PRIMARY KEY, v bigint NOT NULL, h bigint NOT NULL,
                               amount numeric(14,2), note text);
             INSERT INTO big SELECT i, 0, 0, i * 0.01, 'row ' || i FROM generate_series(1, {ROWS}) i;"
        )
        .as_str(),
    )
    .await
    .unwrap();
    let p = dir.path().join("big.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE pg WITH (max_batch_rows = 20000, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot = 'none');
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');
CREATE TABLE lake.big WITH (primary_key = 'id') AS SELECT * FROM src.public.big;
",
            uri = pg.uri(),
            d = dir.path().display()
        ),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &free_addr(), &log);
    assert!(wait_streaming(&db).await, "the run streams from its slot");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The small case: 10,000 rows in one transaction, one commit.
    db.execute("UPDATE big SET v = v + 1, h = (id * 7919) % 100003 WHERE id <= 10000")
        .await
        .unwrap();
    let landed = eventually(120, || async {
        committed(dir.path(), "big").await.is_some()
    })
    .await;
    assert!(landed, "the 10k-row transaction lands:\n{}", log_text());
    let peak_small = peak_rss_kib(child.id()).unwrap();
    // `main`'s history so far (each commit a reader can see adds one).
    let main_history = |md: &Value| md["snapshot-log"].as_array().map_or(0, Vec::len);
    let history_before = main_history(&metadata(dir.path()).await);

    // The large case: every row, one transaction.
    db.execute("UPDATE big SET v = v + 2, h = (id * 104729) % 1000003, note = note || ' updated'")
        .await
        .unwrap();
    let staged = eventually(600, || async {
        metadata(dir.path()).await["refs"]
            .get("urutau-staging")
            .is_some()
    })
    .await;
    assert!(
        staged,
        "parts of the transaction are staged:\n{}",
        log_text()
    );
    // Some more parts, then SIGKILL.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run is up:\n{}",
        log_text()
    );
    let peak_killed = peak_rss_kib(child.id()).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let before = common::iceberg_java_digest(
        &common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "big")
            .await
            .unwrap(),
    );
    assert_eq!(
        before["rows"], 10_000,
        "nothing of the killed transaction is visible: {before}"
    );

    // The restart lands it, in one commit, in bounded memory.
    let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--exit-when-caught-up"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let (status, peak_large) = wait_with_peak(&mut child, Duration::from_secs(1800));
    assert!(
        status.success(),
        "the restart ends: {status}\n{}",
        log_text()
    );
    eprintln!(
        "peak RSS: 10k-row transaction {} MiB, 5M-row transaction {} MiB (the killed run had {} MiB)",
        peak_small / 1024,
        peak_large / 1024,
        peak_killed / 1024
    );
    assert!(
        peak_large <= 4 * peak_small,
        "the 5M-row transaction took {peak_large} KiB, more than 4 x the 10k-row one's {peak_small} KiB"
    );
    let md = metadata(dir.path()).await;
    assert!(
        md["refs"].get("urutau-staging").is_none(),
        "the branch is gone"
    );
    assert_eq!(
        main_history(&md),
        history_before + 1,
        "the transaction reached readers in one commit: {}",
        md["snapshot-log"]
    );
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "big")
        .await
        .unwrap();
    assert_eq!(common::iceberg_java_digest(&loc), big_digest(&db).await);
}

/// The current metadata of `pg.big` in the SQLite catalog under `dir`.
async fn metadata(dir: &std::path::Path) -> Value {
    let loc = common::catalog_metadata_location(&dir.join("catalog.db"), "pg", "big")
        .await
        .unwrap();
    serde_json::from_str(&std::fs::read_to_string(loc.trim_start_matches("file://")).unwrap())
        .unwrap()
}
