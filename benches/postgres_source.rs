//! The Postgres source end to end: 1M updates in 10k-row transactions,
//! streamed from a real PostgreSQL (tests/harness/postgres.py) through the
//! pipeline into Iceberg (SQLite catalog, local warehouse), against the
//! ceiling `pg_recvlogical` reaches streaming the same WAL (pgoutput, the
//! same publication) to /dev/null. Prints changes/s, the ratio and peak
//! memory of this process; then DuckDB reads the table back and its digest
//! (count and sums of every column) must equal Postgres's.
//!
//! `cargo bench --bench postgres_source`; `POSTGRES_BENCH_UPDATES=200000`
//! changes the size, `POSTGRES_BENCH_TX_ROWS` the transactions' (one
//! transaction of them all measures a huge one). Under `cargo test` it runs a small smoke test (and
//! fails in CI when no PostgreSQL server package is installed).

mod support;

use std::process::Command;
use std::time::Instant;

use sqlx::Executor;
use support::peak_rss_mib;
use support::postgres::{self, Server};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("postgres_source: benchmark");
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let updates: usize = std::env::var("POSTGRES_BENCH_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1_000_000 } else { 20_000 });
    // `POSTGRES_BENCH_TX_ROWS=5000000` (with as many updates) measures one
    // huge transaction: the peak RSS beside the 10k-row default's.
    let tx_rows: usize = std::env::var("POSTGRES_BENCH_TX_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
        .min(updates);
    let rows = 100_000.max(tx_rows).min(updates);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("pg"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let text = format!(
        "CREATE PIPELINE bench WITH (max_batch_rows = 10000);
         CREATE SOURCE pg FROM postgres WITH (uri = '{uri}', slot = 'bench', snapshot = 'none');
         CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/warehouse', namespace = 'b');
         CREATE TABLE lake.t WITH (primary_key = 'id') AS SELECT * FROM pg.t;",
        uri = server.uri,
        d = dir.path().display()
    );
    let end_lsn: String = runtime.block_on(async {
        let db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&server.uri)
            .await
            .unwrap();
        db.execute(
            "CREATE TABLE t (id int PRIMARY KEY, v bigint NOT NULL, amount numeric(12,2), note text)",
        )
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO t SELECT g, 0, g / 100.0, 'row ' || g FROM generate_series(1, $1) g",
        )
        .bind(rows as i32)
        .execute(&db)
        .await
        .unwrap();
        // The pipeline's slot and publication (first run), then the
        // ceiling's slot on the same publication.
        support::run_to_end(&text).await;
        db.execute("SELECT pg_create_logical_replication_slot('ceiling', 'pgoutput')")
            .await
            .unwrap();
        let mut done = 0;
        let mut lo = 0;
        while done < updates {
            let n = tx_rows.min(updates - done);
            sqlx::query("UPDATE t SET v = v + 1, amount = amount + 1 WHERE id > $1 AND id <= $2")
                .bind(lo as i32)
                .bind((lo + n) as i32)
                .execute(&db)
                .await
                .unwrap();
            done += n;
            lo = (lo + n) % rows;
        }
        sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&db)
            .await
            .unwrap()
    });
    println!("postgres_source: {updates} updates in {tx_rows}-row transactions, WAL end {end_lsn}");

    // The ceiling: pg_recvlogical streaming the same changes to /dev/null.
    let started = Instant::now();
    let out = Command::new(postgres::bin("pg_recvlogical"))
        .args([
            "-d",
            &server.uri,
            "-S",
            "ceiling",
            "--start",
            "--no-loop",
            "-f",
            "/dev/null",
        ])
        .args([
            "-o",
            "proto_version=1",
            "-o",
            "publication_names=bench_pub",
            "-E",
            &end_lsn,
        ])
        .output()
        .unwrap();
    let ceiling_secs = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "pg_recvlogical: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ceiling = updates as f64 / ceiling_secs;

    let rss_before = peak_rss_mib();
    let started = Instant::now();
    let report = runtime.block_on(support::run_to_end(&text));
    let secs = started.elapsed().as_secs_f64();
    let rate = updates as f64 / secs;
    let route = &report.routes[0];
    assert_eq!(route.rows, updates as u64, "every update reached the table");
    println!(
        "postgres_source: {secs:.2} s, {rate:.0} changes/s, {} commits; pg_recvlogical ceiling {ceiling:.0} changes/s ({ceiling_secs:.2} s); \
         ratio {:.2}; peak RSS {:.0} MiB (before the run: {rss_before:.0} MiB)",
        route.commits,
        rate / ceiling,
        peak_rss_mib()
    );

    // Iceberg's Java reader and DuckDB read the table back: the same
    // digest as Postgres's. `POSTGRES_BENCH_READ_BACK=0` leaves DuckDB's
    // read out: of one huge transaction (500 staged snapshots of equality
    // deletes for 5M rows) it took over 50 minutes. The smoke run under
    // `cargo test` always reads back with both.
    let (want, loc) = runtime.block_on(async {
        let db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&server.uri)
            .await
            .unwrap();
        let (n, ids, v, amount, notes): (i64, i64, i64, String, i64) = sqlx::query_as(
            "SELECT count(*), sum(id)::bigint, sum(v)::bigint, sum(amount)::text, sum(length(note))::bigint FROM t",
        )
        .fetch_one(&db)
        .await
        .unwrap();
        let loc = support::metadata_location(&dir.path().join("catalog.db"), "b", "t").await;
        (
            serde_json::json!({"n": n, "ids": ids, "v": v, "amount": amount, "notes": notes}),
            loc,
        )
    });
    let started = Instant::now();
    let java = support::iceberg_java_digest(&loc);
    let java = serde_json::json!({
        "n": java["rows"], "ids": java["sum"]["id"], "v": java["sum"]["v"],
        "amount": java["sum"]["amount"], "notes": java["length"]["note"],
    });
    println!(
        "postgres_source: Iceberg's Java reader read the digest in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        java, want,
        "Iceberg's Java reader's read of the table equals Postgres"
    );
    if full && std::env::var("POSTGRES_BENCH_READ_BACK").as_deref() == Ok("0") {
        println!(
            "postgres_source: Iceberg's Java reader's read equals Postgres ({want}); no DuckDB read-back (POSTGRES_BENCH_READ_BACK=0)"
        );
        return;
    }
    let got = support::duckdb_select(
        &loc,
        "count(*) AS n, sum(id) AS ids, sum(v) AS v, CAST(sum(amount) AS VARCHAR) AS amount, sum(length(note)) AS notes",
    );
    assert_eq!(got, want, "DuckDB's read of the table equals Postgres");
    println!("postgres_source: DuckDB's and Iceberg's Java reader's reads equal Postgres ({want})");
}
