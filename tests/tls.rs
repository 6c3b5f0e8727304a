//! TLS and authentication on the Postgres connections (issue 20): a real
//! PostgreSQL that accepts TCP connections over TLS only (`ssl = on`,
//! `hostssl` lines only), its certificate signed by the harness's own CA
//! (tests/harness/certs.py, made with openssl at set-up). Both sessions —
//! the SQL one (catalog, snapshot) and the replication one — must
//! negotiate TLS, or the server refuses them. DuckDB reads the Iceberg
//! results back.

mod common;

use common::pg_cdc::*;
use common::{run_to_end, urutau};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A snapshotting pipeline from `uri` (extra source options after it)
/// into Iceberg under `sink_dir`, on slot `slot`.
fn pipeline(sink_dir: &Path, uri: &str, source_options: &str, slot: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(sink_dir).unwrap();
    let text = format!(
        "CREATE PIPELINE pg WITH (max_batch_rows = 500, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = '{slot}', snapshot_chunk_rows = 500{source_options});
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT * FROM src.public.items;
CREATE TABLE lake.events WITH (primary_key = 'id') AS SELECT * FROM src.events;
",
        d = sink_dir.display()
    );
    let p = sink_dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// `postgres://USER[:PASSWORD]@127.0.0.1:PORT/postgres?QUERY`.
fn uri(pg: &common::Postgres, user: &str, password: bool, query: &str) -> String {
    let secret = if password {
        format!(":{}", pg.info["password"].as_str().unwrap())
    } else {
        String::new()
    };
    format!(
        "postgres://{user}{secret}@127.0.0.1:{}/postgres?{query}",
        pg.info["port"]
    )
}

/// Whether the connection streaming from `slot` is encrypted, as the
/// server sees it (`pg_stat_ssl` of its walsender).
async fn replication_is_encrypted(db: &sqlx::PgPool, slot: &str) -> Option<bool> {
    sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_replication_slots r ON r.active_pid = s.pid WHERE r.slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(db)
    .await
    .unwrap()
}

/// `sslmode=verify-full` with the harness CA (SCRAM-SHA-256 password
/// authentication): the snapshot of 3,000 rows and a concurrent workload
/// land through three kill -9s, and DuckDB's read equals Postgres; the
/// walsender's connection is encrypted.
#[tokio::test]
async fn verify_full_snapshots_and_streams_through_kill_9() {
    let (python, dir, pg, db, certs) = start_tls().await;
    prefill(&db, 3_000).await;
    let sink = dir.path().join("full");
    let p = pipeline(
        &sink,
        &uri(
            &pg,
            "postgres",
            true,
            &format!(
                "sslmode=verify-full&sslrootcert={}",
                certs["ca"].as_str().unwrap()
            ),
        ),
        "",
        "tls_full",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let db = db.clone();
        let stop = Arc::clone(&stop);
        tokio::spawn(async move { workload(&db, 5, 1_500, &stop, 3_000, 50_000).await })
    };
    // The first run streams over TLS.
    let log = sink.join("first.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    assert!(
        eventually(60, || async {
            replication_is_encrypted(&db, "tls_full").await.is_some()
        })
        .await,
        "the run streams from its slot: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(replication_is_encrypted(&db, "tls_full").await, Some(true));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    common::kill_9_runs(&p, 20, 2, 150..700);
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    run_to_end(&p);
    assert_items_equal(&python, &sink, &db, &[]).await;
    let loc = common::catalog_metadata_location(&sink.join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &loc, "id"),
        source_events(&db).await
    );
}

/// `sslmode=require` with md5 password authentication, and a client
/// certificate (`cert` in pg_hba, no password) given as source options:
/// each snapshots and streams to the end equal to Postgres.
#[tokio::test]
async fn require_with_md5_and_a_client_certificate_land_equal() {
    let (python, dir, pg, db, certs) = start_tls().await;
    prefill(&db, 1_000).await;
    let md5 = dir.path().join("md5");
    let p_md5 = pipeline(
        &md5,
        &uri(&pg, "urutau_md5", true, "sslmode=require"),
        "",
        "tls_md5",
    );
    let cert = dir.path().join("cert");
    let p_cert = pipeline(
        &cert,
        &uri(&pg, certs["client_user"].as_str().unwrap(), false, ""),
        &format!(
            ", sslmode = 'verify-full', sslrootcert = '{}', sslcert = '{}', sslkey = '{}'",
            certs["ca"].as_str().unwrap(),
            certs["client_cert"].as_str().unwrap(),
            certs["client_key"].as_str().unwrap()
        ),
        "tls_cert",
    );
    run_to_end(&p_md5);
    run_to_end(&p_cert);
    let stop = AtomicBool::new(false);
    workload(&db, 9, 300, &stop, 1_000, 60_000).await;
    run_to_end(&p_md5);
    run_to_end(&p_cert);
    assert_items_equal(&python, &md5, &db, &[]).await;
    assert_items_equal(&python, &cert, &db, &[]).await;
    // The certificate's user really logged in by certificate.
    let auth: Vec<(String,)> = sqlx::query_as(
        "SELECT auth_method FROM pg_hba_file_rules WHERE 'urutau_cert' = ANY(user_name) ORDER BY line_number",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(auth.iter().all(|(m,)| m == "cert"), "{auth:?}");
}

/// What goes wrong says what to fix, exits 1 and shows no password: a
/// server certificate the given CA did not sign (`verify-full`), a
/// `sslmode=disable` connection the TLS-only server refuses, and a client
/// certificate without its key. `plan` shows the sslmode and no secret; a
/// server without TLS under the default `prefer` is said to be
/// unencrypted.
#[tokio::test]
async fn tls_problems_are_clear_errors_without_secrets() {
    let (_python, dir, pg, _db, certs) = start_tls().await;
    let password = pg.info["password"].as_str().unwrap().to_string();
    let other_ca = certs["other_ca"].as_str().unwrap();
    let run = |p: &Path| urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };

    let wrong_ca = pipeline(
        &dir.path().join("wrong"),
        &uri(
            &pg,
            "postgres",
            true,
            &format!("sslmode=verify-full&sslrootcert={other_ca}"),
        ),
        "",
        "tls_wrong",
    );
    let out = run(&wrong_ca);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "the server's certificate is not signed by the CA in sslrootcert `{other_ca}`"
        )),
        "{said}"
    );
    assert!(!said.contains(&password), "{said}");

    let plain = pipeline(
        &dir.path().join("plain"),
        &uri(&pg, "postgres", true, "sslmode=disable"),
        "",
        "tls_plain",
    );
    let out = run(&plain);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("no encryption"), "{said}");
    assert!(said.contains("sslmode"), "a hint names the setting: {said}");
    assert!(!said.contains(&password), "{said}");

    let half = pipeline(
        &dir.path().join("half"),
        &uri(&pg, "urutau_cert", false, ""),
        &format!(
            ", sslmode = 'require', sslcert = '{}'",
            certs["client_cert"].as_str().unwrap()
        ),
        "tls_half",
    );
    let out = run(&half);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("needs both sslcert and sslkey"), "{said}");

    let plan = urutau(&["plan", "--explain", wrong_ca.to_str().unwrap()]);
    let said = text(&plan);
    assert!(said.contains("sslmode=verify-full"), "{said}");
    assert!(!said.contains(&password), "{said}");

    // A server without TLS: `prefer` connects in the clear, and says so.
    let open_pg = common::Postgres::start(&dir.path().join("open"));
    let open_db = pool(&open_pg).await;
    sqlx::raw_sql(SCHEMA).execute(&open_db).await.unwrap();
    let open = pipeline(
        &dir.path().join("open-sink"),
        &open_pg.uri(),
        "",
        "tls_open",
    );
    let out = urutau(&["validate", open.to_str().unwrap()]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("the connection to Postgres is not encrypted"),
        "{said}"
    );
}

/// The Iceberg SQL catalog on a TLS-only Postgres (`verify-full` with the
/// test CA, in the catalog's URI): the source and the catalog both talk
/// TLS to it, and DuckDB's read of the table the catalog names equals
/// Postgres.
#[tokio::test]
async fn an_iceberg_sql_catalog_on_postgres_over_tls() {
    let (python, dir, pg, db, certs) = start_tls().await;
    prefill(&db, 500).await;
    sqlx::raw_sql("CREATE DATABASE lake")
        .execute(&db)
        .await
        .unwrap();
    let tls = format!(
        "sslmode=verify-full&sslrootcert={}",
        certs["ca"].as_str().unwrap()
    );
    let catalog = uri(&pg, "postgres", true, &tls).replace("/postgres?", "/lake?");
    let sink = dir.path().join("pg-catalog");
    std::fs::create_dir_all(&sink).unwrap();
    let p = sink.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE pg WITH (max_batch_rows = 500);
CREATE SOURCE src FROM postgres WITH (uri = '{source}', slot = 'tls_catalog');
CREATE SINK lake INTO iceberg WITH (uri = '{catalog}', warehouse = '{d}/wh', namespace = 'pg');
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT * FROM src.public.items;
",
            source = uri(&pg, "postgres", true, &tls),
            d = sink.display()
        ),
    )
    .unwrap();
    run_to_end(&p);
    let catalog_db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&catalog)
        .await
        .unwrap();
    let loc: String = sqlx::query_scalar(
        "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = 'pg' AND table_name = 'items'",
    )
    .fetch_one(&catalog_db)
    .await
    .unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &loc, "id"),
        source_items(&db).await
    );
}
