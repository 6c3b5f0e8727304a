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
    // The walsender only: the slot is also active, briefly, for the
    // ordinary connection that creates it, and then inactive while the
    // snapshot is read.
    sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_replication_slots r ON r.active_pid = s.pid \
         JOIN pg_stat_activity a ON a.pid = s.pid \
         WHERE r.slot_name = $1 AND a.backend_type = 'walsender'",
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
            replication_is_encrypted(&db, "tls_full").await == Some(true)
        })
        .await,
        "the run streams from its slot over TLS: {}",
        std::fs::read_to_string(&log).unwrap()
    );
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
    assert!(
        said.contains(
            "the server presented a certificate with subject \"CN=localhost\", issued by \"CN=urutau test CA\", for localhost 127.0.0.1"
        ),
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
    // libpq's PGSSLMODE, when neither the uri nor an option says.
    let by_env = pipeline(
        &dir.path().join("env"),
        &uri(&pg, "postgres", true, ""),
        "",
        "tls_env",
    );
    let plan = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["plan", "--explain", by_env.to_str().unwrap()])
        .env("PGSSLMODE", "require")
        .output()
        .unwrap();
    let said = text(&plan);
    assert!(said.contains("sslmode=require"), "{said}");

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

/// A pipeline of the quickstart's change events (a file source) with
/// `sink` (`name INTO kind WITH (...)`) and one route of its orders,
/// `route` (`name WITH (...)`), selecting id, status and amount.
fn shop_pipeline(dir: &Path, sink: &str, route: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let shop = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/shop.jsonl");
    let text = format!(
        "CREATE PIPELINE shop;
CREATE SOURCE events FROM file WITH (path = '{shop}', format = 'debezium-json');
CREATE SINK {sink};
CREATE TABLE events.orders (id BIGINT NOT NULL, customer_id BIGINT, amount DECIMAL(12,2),
  status VARCHAR, created_at TIMESTAMPTZ, PRIMARY KEY (id));
CREATE TABLE events.customers (id BIGINT NOT NULL, name VARCHAR, email VARCHAR, PRIMARY KEY (id));
CREATE TABLE {route} AS
SELECT id, status, amount FROM events.orders WHERE status <> 'test';
",
        shop = shop.display()
    );
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// [`shop_pipeline`] into an Iceberg REST catalog at `catalog_options`,
/// table `bronze.<table>`.
fn rest_pipeline(dir: &Path, table: &str, catalog_options: &str) -> std::path::PathBuf {
    shop_pipeline(
        dir,
        &format!(
            "lake INTO iceberg WITH (catalog = 'rest', namespace = 'bronze', {catalog_options})"
        ),
        &format!("lake.{table} WITH (primary_key = 'id')"),
    )
}

/// What the quickstart's orders end as: (id, status).
const ORDERS: [(i64, &str); 4] = [(1, "new"), (3, "shipped"), (6, "new"), (40, "paid")];

/// (id, status) of `rows`.
fn id_status(rows: &[serde_json::Value]) -> Vec<(i64, String)> {
    rows.iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `urutau run P --exit-when-caught-up` with `SSL_CERT_FILE` set to
/// `ssl_cert_file`, or unset: its output, stdout then stderr.
fn run_with_ssl_cert_file(p: &Path, ssl_cert_file: Option<&str>) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"));
    command.args(["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    match ssl_cert_file {
        Some(f) => command.env("SSL_CERT_FILE", f),
        None => command.env_remove("SSL_CERT_FILE"),
    };
    let out = command.output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Runs `p` (with `SSL_CERT_FILE` as [`run_with_ssl_cert_file`]): it must
/// exit 1 at once, not retried, saying the server's certificate is not
/// signed by a CA it trusts and to set `ca_cert`. Returns what it said.
fn assert_refused_saying_set_ca_cert(p: &Path, ssl_cert_file: Option<&str>) -> String {
    let (code, said) = run_with_ssl_cert_file(p, ssl_cert_file);
    assert_eq!(code, Some(1), "{}: {said}", p.display());
    assert!(
        said.contains(
            "the server's certificate is not signed by a CA the sink trusts: set ca_cert"
        ),
        "{}: {said}",
        p.display()
    );
    assert!(
        !said.contains("retrying"),
        "{}: retried: {said}",
        p.display()
    );
    said
}

/// What a refusal names of the harness server's certificate (subject,
/// issuer, names), checked against `trusted`.
fn names_the_certificate(said: &str, trusted: &str) {
    assert!(
        said.contains(&format!(
            "presented a certificate with subject \"CN=localhost\", issued by \"CN=urutau test CA\", for localhost 127.0.0.1, checked against {trusted}"
        )),
        "{said}"
    );
}

/// Apache Iceberg's reference REST server behind https (a TLS front with
/// the harness CA's certificate, tests/harness/tls_front.py): the catalog
/// is trusted through `ca_cert`, or through `SSL_CERT_FILE`; DuckDB and
/// Iceberg's Java reader read what was written. Another CA, or the
/// built-in web CAs, refuse the server: exit 1 at once (not retried),
/// saying to set `ca_cert`.
#[tokio::test]
async fn an_iceberg_rest_catalog_over_https_is_trusted_through_ca_cert_or_ssl_cert_file() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let certs = common::certs(&dir.path().join("certs"));
    let (ca, other_ca) = (
        certs["ca"].as_str().unwrap(),
        certs["other_ca"].as_str().unwrap(),
    );
    let server = common::iceberg_rest::IcebergRest::start(&dir.path().join("rest")).await;
    let front = common::TlsFront::start(&certs, server.uri().trim_start_matches("http://"));
    let https = format!(
        "uri = 'https://{}', warehouse = '{}'",
        front.addr,
        server.warehouse_uri()
    );
    let read_back = |table: &str| {
        let (server, python) = (&server, &python);
        let table = format!("bronze.{table}");
        async move {
            let loaded = server.load(&table).await;
            let location = loaded["metadata-location"].as_str().unwrap().to_string();
            let rows = common::duckdb_rows(python, &location, "id");
            assert_eq!(
                common::iceberg_java_rows(&location, "id"),
                rows,
                "Iceberg's Java reader reads what DuckDB reads"
            );
            id_status(&rows)
        }
    };
    let want: Vec<(i64, String)> = ORDERS.iter().map(|(i, s)| (*i, s.to_string())).collect();

    // ca_cert (SSL_CERT_FILE unset).
    let p = rest_pipeline(
        &dir.path().join("ca_cert"),
        "by_ca_cert",
        &format!("{https}, ca_cert = '{ca}'"),
    );
    let (code, said) = run_with_ssl_cert_file(&p, None);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(read_back("by_ca_cert").await, want);

    // SSL_CERT_FILE, no ca_cert.
    let p = rest_pipeline(&dir.path().join("env"), "by_env", &https);
    let (code, said) = run_with_ssl_cert_file(&p, Some(ca));
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(read_back("by_env").await, want);

    // Another CA, or none (the built-in web CAs): refused, not retried.
    for (name, options, env) in [
        ("other", format!("{https}, ca_cert = '{other_ca}'"), None),
        ("web", https.clone(), None),
        ("other_env", https.clone(), Some(other_ca)),
    ] {
        let p = rest_pipeline(&dir.path().join(name), name, &options);
        let said = assert_refused_saying_set_ca_cert(&p, env);
        let trusted = match name {
            "web" => "the built-in web CAs (no ca_cert given)".to_string(),
            _ => format!("the CA file {other_ca}"),
        };
        names_the_certificate(&said, &trusted);
    }
    // Nothing was created by the refused runs.
    let tables = reqwest::get(format!("{}/v1/namespaces/bronze/tables", server.uri()))
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let mut names: Vec<&str> = tables["identifiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["by_ca_cert", "by_env"]);
}

/// SeaweedFS's REST catalog and S3 both behind https (TLS fronts with the
/// harness CA's certificate): both trusted through `ca_cert`, or through
/// `SSL_CERT_FILE`; DuckDB reads the table back. With the catalog on plain
/// http, an S3 client given another CA, or none (the system's CAs),
/// refuses the object store's certificate: exit 1 at once (not retried),
/// saying to set `ca_cert`. No key appears in any output.
#[tokio::test]
async fn iceberg_on_s3_over_https_trusts_ca_cert_or_ssl_cert_file() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let certs = common::certs(&dir.path().join("certs"));
    let (ca, other_ca) = (
        certs["ca"].as_str().unwrap(),
        certs["other_ca"].as_str().unwrap(),
    );
    let server = common::Seaweed::start(&python, &dir.path().join("seaweed"));
    let host_port = |url: String| {
        url.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string()
    };
    let catalog_front = common::TlsFront::start(&certs, &host_port(server.iceberg_uri()));
    let s3_front = common::TlsFront::start(&certs, &host_port(server.s3_endpoint()));
    let (id, secret) = server.credential();
    let options = |catalog: &str, ca_cert: Option<&str>| {
        let ca_cert = ca_cert
            .map(|f| format!(", ca_cert = '{f}'"))
            .unwrap_or_default();
        format!(
            "uri = '{catalog}', warehouse = '{}', client_id = '{id}', client_secret = '{secret}',
  s3_endpoint = 'https://{}', s3_region = 'us-east-1', s3_path_style = true,
  s3_access_key_id = '{id}', s3_secret_access_key = '{secret}', retry_timeout = '3s'{ca_cert}",
            server.warehouse(),
            s3_front.addr
        )
    };
    let https = format!("https://{}", catalog_front.addr);
    let want: Vec<(i64, String)> = ORDERS.iter().map(|(i, s)| (*i, s.to_string())).collect();

    // ca_cert alone (SSL_CERT_FILE unset), then SSL_CERT_FILE alone.
    for (table, ca_cert, env) in [("by_ca_cert", Some(ca), None), ("by_env", None, Some(ca))] {
        let p = rest_pipeline(&dir.path().join(table), table, &options(&https, ca_cert));
        let (code, said) = run_with_ssl_cert_file(&p, env);
        assert_eq!(code, Some(0), "{table}: {said}");
        assert!(!said.contains(&secret), "{said}");
        assert_eq!(
            id_status(&server.rows(&format!("bronze.{table}"), "id")),
            want,
            "{table}"
        );
    }

    // The catalog on plain http: only the object store's certificate is
    // checked, against another CA or the system's.
    let http = server.iceberg_uri();
    for (table, ca_cert) in [("other_ca", Some(other_ca)), ("no_ca", None)] {
        let p = rest_pipeline(&dir.path().join(table), table, &options(&http, ca_cert));
        let (code, said) = run_with_ssl_cert_file(&p, None);
        assert_eq!(code, Some(1), "{table}: {said}");
        assert!(
            said.contains("the object store refused: the server's certificate is not signed by a CA the sink trusts: set ca_cert"),
            "{table}: {said}"
        );
        assert!(
            !said.contains("transient failure: retrying"),
            "{table}: retried: {said}"
        );
        assert!(!said.contains(&secret), "{said}");
        // (The harness's S3 key is `urutau`, so the CA's name shows
        // redacted: the certificate is named up to there.)
        if let Some(other_ca) = ca_cert {
            assert!(
                said.contains(
                    "presented a certificate with subject \"CN=localhost\", issued by \"CN="
                ) && said.contains(&format!("checked against the CA file {other_ca}")),
                "{said}"
            );
        }
    }
}

/// [`shop_pipeline`] into Couchbase at `sink_options`, bucket `shop`,
/// collection `orders`.
fn couchbase_pipeline(dir: &Path, sink_options: &str) -> std::path::PathBuf {
    shop_pipeline(
        dir,
        &format!("cb INTO couchbase WITH (bucket = 'shop', {sink_options})"),
        "cb.orders WITH (primary_key = 'id')",
    )
}

/// Couchbase over TLS (`couchbases://`, the mock's TLS ports with the
/// harness CA's certificate): trusted through `ca_cert`, the documents are
/// what the Python SDK reads (over the mock's plain ports). Another CA
/// refuses the cluster: exit 1 at once with what to set.
/// `ca_cert` beside a plain `couchbase://` uri is an error, not ignored.
#[test]
fn couchbase_over_tls_is_trusted_through_ca_cert() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let certs = common::certs(&dir.path().join("certs"));
    let (ca, other_ca) = (
        certs["ca"].as_str().unwrap(),
        certs["other_ca"].as_str().unwrap(),
    );
    let cb = common::Couchbase::start_tls(&python, &dir.path().join("cb"), &certs);
    let tls = cb.tls_connstr.clone().unwrap();
    let login = format!("username = '{}', password = '{}'", cb.user, cb.password);

    let p = couchbase_pipeline(
        &dir.path().join("ok"),
        &format!("uri = '{tls}', {login}, ca_cert = '{ca}'"),
    );
    let (code, said) = run_with_ssl_cert_file(&p, None);
    assert_eq!(code, Some(0), "{said}");
    let keys: Vec<String> = (1..=50).map(|id| format!("[{id}]")).collect();
    let read: Vec<(i64, String)> = cb
        .get("shop", "_default", "orders", &keys)
        .into_values()
        .filter(|d| !d.is_null())
        .map(|d| {
            (
                d["id"].as_i64().unwrap(),
                d["status"].as_str().unwrap().to_string(),
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let want: Vec<(i64, String)> = ORDERS.iter().map(|(i, s)| (*i, s.to_string())).collect();
    assert_eq!(read, want, "as the Python SDK reads it");

    let p = couchbase_pipeline(
        &dir.path().join("other"),
        &format!(
            "uri = '{tls}', {login}, ca_cert = '{other_ca}', retry_for = '5s', retry_timeout = '0s'"
        ),
    );
    let said = assert_refused_saying_set_ca_cert(&p, None);
    names_the_certificate(&said, "the given CAs");

    // No CA given: the SDK's own roots (the web CAs) refuse the harness
    // CA's certificate, said at once instead of the SDK's silent retries.
    let p = couchbase_pipeline(
        &dir.path().join("none"),
        &format!("uri = '{tls}', {login}, retry_for = '5s', retry_timeout = '0s'"),
    );
    let said = assert_refused_saying_set_ca_cert(&p, None);
    names_the_certificate(&said, "the built-in web CAs (no ca_cert given)");

    let plain = couchbase_pipeline(
        &dir.path().join("plain"),
        &format!("uri = '{}', {login}, ca_cert = '{ca}'", cb.connstr),
    );
    let (code, said) = run_with_ssl_cert_file(&plain, None);
    assert_ne!(code, Some(0), "{said}");
    assert!(said.contains("ca_cert is for TLS connections"), "{said}");
}
