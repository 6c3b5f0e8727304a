//! The Postgres CDC tests' shared parts (tests/postgres.rs and the fault
//! suite in tests/faults.rs): the schema and a seeded workload, the
//! pipeline under test, and the checks that read the sink back with DuckDB
//! and hold the slot to what the sinks committed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Executor, Row};

pub async fn pool(pg: &super::Postgres) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect(&pg.uri())
        .await
        .unwrap()
}

pub const SCHEMA: &str = "
CREATE TABLE items (
  id bigint PRIMARY KEY, name text, amount numeric(12,2), qty int, active boolean,
  seen timestamptz, born date, uid uuid, note text, tags text[], doc jsonb
);
CREATE TABLE events (id bigint PRIMARY KEY, item bigint NOT NULL, kind varchar(20));
";

pub fn pipeline(dir: &Path, pg: &super::Postgres) -> PathBuf {
    let text = format!(
        "CREATE PIPELINE pg WITH (max_batch_rows = 200, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot = 'none');
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT * FROM src.public.items;
CREATE TABLE lake.events WITH (primary_key = 'id') AS SELECT * FROM src.events;
",
        uri = pg.uri(),
        d = dir.display()
    );
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// The snapshotting pipeline (`snap.sql`): both tables copied in chunks
/// of 1,000 rows, then streamed; `items_select` is what `lake.items`
/// selects from `src.public.items` (`*`, or with metadata columns).
/// Data files of 1 MiB: the sink gathers a snapshot's batches into
/// commits of that size, so a test's snapshot commits several times.
pub fn snapshot_pipeline(dir: &Path, pg: &super::Postgres, items_select: &str) -> PathBuf {
    snapshot_pipeline_with_files_of(dir, pg, items_select, "1MiB")
}

/// [`snapshot_pipeline`] with data files of `target_file_size`.
pub fn snapshot_pipeline_with_files_of(
    dir: &Path,
    pg: &super::Postgres,
    items_select: &str,
    target_file_size: &str,
) -> PathBuf {
    let text = format!(
        "CREATE PIPELINE pg WITH (max_batch_rows = 2000, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot_chunk_rows = 1000, snapshot_parallelism = 2);
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg', target_file_size = '{target_file_size}');
CREATE TABLE lake.items WITH (primary_key = 'id') AS
  SELECT {items_select} FROM src.public.items;
CREATE TABLE lake.events WITH (primary_key = 'id') AS SELECT * FROM src.events;
",
        uri = pg.uri(),
        d = dir.display()
    );
    let p = dir.join("snap.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// A long text (TOASTed: well over 2 kB).
pub fn long_text(rng: &mut StdRng) -> String {
    let word = ["alpha", "beta", "gamma", "δέλτα", "🦀"][rng.random_range(0..5)];
    (0..rng.random_range(600..1200))
        .map(|i| format!("{word}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn maybe<T>(rng: &mut StdRng, f: impl FnOnce(&mut StdRng) -> T) -> Option<T> {
    if rng.random_bool(0.15) {
        None
    } else {
        Some(f(rng))
    }
}

/// A seeded random workload: inserts, updates (some changing the key,
/// some leaving the TOASTed note unchanged), deletes, re-inserts, NULLs,
/// multi-statement transactions, both tables in one transaction.
///
/// Keys fall in 1..400; with a larger `key_space`, half of them anywhere
/// in 1..key_space (so live changes land in chunks a snapshot is reading).
/// Event ids start at `first_event`.
pub async fn workload(
    pool: &PgPool,
    seed: u64,
    transactions: usize,
    stop: &AtomicBool,
    key_space: i64,
    first_event: i64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_event = first_event;
    let pick = |rng: &mut StdRng| -> i64 {
        if key_space > 400 && rng.random_bool(0.5) {
            rng.random_range(1..key_space)
        } else {
            rng.random_range(1..400)
        }
    };
    for _ in 0..transactions {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let mut tx = pool.begin().await.unwrap();
        for _ in 0..rng.random_range(1..6) {
            let id: i64 = pick(&mut rng);
            match rng.random_range(0..100) {
                0..40 => {
                    let name = maybe(&mut rng, |rng| format!("n{} ünï", rng.random_range(0..99)));
                    let amount = maybe(&mut rng, |rng| {
                        format!(
                            "{}.{:02}",
                            rng.random_range(-99999..99999),
                            rng.random_range(0..100)
                        )
                    });
                    let qty = maybe(&mut rng, |rng| rng.random_range(i32::MIN..i32::MAX));
                    let active = maybe(&mut rng, |rng| rng.random_bool(0.5));
                    let seen = maybe(&mut rng, |rng| {
                        rng.random_range(-2_000_000_000i64..2_000_000_000)
                    });
                    let born = maybe(&mut rng, |rng| rng.random_range(-20_000i32..20_000));
                    let uid = maybe(&mut rng, |rng| {
                        uuid::Uuid::from_u128(rng.random()).to_string()
                    });
                    let note = maybe(&mut rng, long_text);
                    let tags = maybe(&mut rng, |_| {
                        vec![Some("a,b".to_string()), None, Some("\"q\"".to_string())]
                    });
                    let doc = maybe(&mut rng, |rng| {
                        json!({"k": rng.random_range(0..9), "s": "x"}).to_string()
                    });
                    sqlx::query(
                        "INSERT INTO items VALUES ($1, $2, $3::numeric, $4, $5, to_timestamp($6::float8 / 1000.0),
                           DATE '1970-01-01' + $7::int, $8::uuid, $9, $10, $11::jsonb)
                         ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, amount = EXCLUDED.amount,
                           qty = EXCLUDED.qty, active = EXCLUDED.active, seen = EXCLUDED.seen,
                           born = EXCLUDED.born, uid = EXCLUDED.uid, note = EXCLUDED.note,
                           tags = EXCLUDED.tags, doc = EXCLUDED.doc",
                    )
                    .bind(id)
                    .bind(name)
                    .bind(amount)
                    .bind(qty)
                    .bind(active)
                    .bind(seen)
                    .bind(born)
                    .bind(uid)
                    .bind(note)
                    .bind(tags)
                    .bind(doc)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                }
                40..60 => {
                    // Another column changes; the TOASTed note stays.
                    sqlx::query(
                        "UPDATE items SET qty = COALESCE(qty, 0) / 2 + 1, name = $2 WHERE id = $1",
                    )
                    .bind(id)
                    .bind(maybe(&mut rng, |_| "renamed".to_string()))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                }
                60..68 => {
                    let to: i64 = pick(&mut rng);
                    // A key change (skipped when the new key is taken).
                    sqlx::query("UPDATE items SET id = $2 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM items WHERE id = $2)")
                        .bind(id)
                        .bind(to)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
                68..85 => {
                    sqlx::query("DELETE FROM items WHERE id = $1")
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
                _ => {
                    sqlx::query("INSERT INTO events VALUES ($1, $2, $3)")
                        .bind(next_event)
                        .bind(id)
                        .bind(maybe(&mut rng, |_| "touch".to_string()))
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    if rng.random_bool(0.3) {
                        sqlx::query("DELETE FROM events WHERE id = $1")
                            .bind(next_event - 1)
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                    }
                    next_event += 1;
                }
            }
        }
        tx.commit().await.unwrap();
    }
}

/// `items` as Postgres holds it, rendered as DuckDB renders the Iceberg
/// table.
pub async fn source_items(pool: &PgPool) -> Vec<Value> {
    let rows = sqlx::query(
        "SELECT id, name, amount::text AS amount, qty, active,
                to_char(seen AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') AS seen,
                born::text AS born, uid::text AS uid, note, tags, doc::text AS doc
         FROM items ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.iter()
        .map(|r| {
            json!({
                "id": r.get::<i64, _>("id"),
                "name": r.get::<Option<String>, _>("name"),
                "amount": r.get::<Option<String>, _>("amount"),
                "qty": r.get::<Option<i32>, _>("qty"),
                "active": r.get::<Option<bool>, _>("active"),
                "seen": r.get::<Option<String>, _>("seen").map(|s| format!("{s}+00:00")),
                "born": r.get::<Option<String>, _>("born"),
                "uid": r.get::<Option<String>, _>("uid"),
                "note": r.get::<Option<String>, _>("note"),
                "tags": r.get::<Option<Vec<Option<String>>>, _>("tags"),
                "doc": r.get::<Option<String>, _>("doc"),
            })
        })
        .collect()
}

/// `id, name, qty` of every item, as Postgres holds them: what the
/// ClickHouse routes of the tests write.
pub async fn source_kv(db: &PgPool) -> Vec<Value> {
    let rows: Vec<(i64, Option<String>, Option<i32>)> =
        sqlx::query_as("SELECT id, name, qty FROM items ORDER BY id")
            .fetch_all(db)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(id, name, qty)| json!({"id": id, "name": name, "qty": qty}))
        .collect()
}

pub async fn source_events(pool: &PgPool) -> Vec<Value> {
    sqlx::query("SELECT id, item, kind FROM events ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            json!({
                "id": r.get::<i64, _>("id"),
                "item": r.get::<i64, _>("item"),
                "kind": r.get::<Option<String>, _>("kind"),
            })
        })
        .collect()
}

pub fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// The `cdc.position` of a table (None before its first commit).
pub async fn committed(dir: &Path, table: &str) -> Option<u64> {
    let loc = super::catalog_metadata_location(&dir.join("catalog.db"), "pg", table).await?;
    let md: Value =
        serde_json::from_str(&std::fs::read_to_string(loc.trim_start_matches("file://")).unwrap())
            .unwrap();
    md["properties"]["cdc.position"].as_str().map(lsn)
}

/// A table property (None before the table's first commit).
pub async fn property(dir: &Path, table: &str, key: &str) -> Option<String> {
    let loc = super::catalog_metadata_location(&dir.join("catalog.db"), "pg", table).await?;
    let md: Value =
        serde_json::from_str(&std::fs::read_to_string(loc.trim_start_matches("file://")).unwrap())
            .unwrap();
    md["properties"][key].as_str().map(str::to_string)
}

pub async fn confirmed_flush(pool: &PgPool) -> u64 {
    let text: String = sqlx::query_scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'urutau_test'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    lsn(&text)
}

/// Reads `items` back with DuckDB and compares it with Postgres row for
/// row: any missing, extra (or resurrected), stale or duplicated key is a
/// failure. Columns in `metadata` are set aside (returned, not compared).
pub async fn assert_items_equal(
    python: &Path,
    dir: &Path,
    db: &PgPool,
    metadata: &[&str],
) -> Vec<Value> {
    let loc = super::catalog_metadata_location(&dir.join("catalog.db"), "pg", "items")
        .await
        .unwrap();
    let read_full: Vec<Value> = super::duckdb_rows(python, &loc, "id");
    let read: Vec<Value> = read_full
        .iter()
        .map(|r| {
            let mut r = r.clone();
            for m in metadata {
                r.as_object_mut().unwrap().remove(*m);
            }
            r
        })
        .collect();
    let want = source_items(db).await;
    let by_id = |rows: &[Value]| -> BTreeMap<i64, Value> {
        rows.iter()
            .map(|r| (r["id"].as_i64().unwrap(), r.clone()))
            .collect()
    };
    let (got, exp) = (by_id(&read), by_id(&want));
    let mut problems = Vec::new();
    for (id, row) in &exp {
        match got.get(id) {
            None => problems.push(format!("missing key {id}")),
            Some(g) if g != row => {
                let short = |v: &Value| v.to_string().chars().take(300).collect::<String>();
                problems.push(format!(
                    "stale key {id}:\n  read {}\n  want {}",
                    short(g),
                    short(row)
                ))
            }
            _ => {}
        }
    }
    for id in got.keys() {
        if !exp.contains_key(id) {
            problems.push(format!("extra or resurrected key {id}"));
        }
    }
    assert_eq!(read.len(), got.len(), "duplicated keys");
    assert!(
        problems.is_empty(),
        "{} differences, first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    // Iceberg's own Java reader reads the same rows.
    assert_eq!(
        super::iceberg_java_rows(&loc, "id"),
        read_full,
        "Iceberg's Java reader (IcebergGenerics) reads what DuckDB reads"
    );
    eprintln!(
        "items: {} rows equal (DuckDB and Iceberg's Java reader)",
        want.len()
    );
    read_full
}

/// A local address nothing listens on (for `--metrics-addr`).
pub fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

/// The slot is never acknowledged past a change the sinks do not hold
/// (checked after every kill). It may be ahead of the tables' positions
/// (an idle stream follows the server's WAL end), but no transaction of a
/// routed table may commit between a table's position and the slot's
/// `confirmed_flush_lsn`: the server would skip it at the next start.
pub async fn assert_slot_not_ahead(db: &PgPool, dir: &Path) {
    let flushed = confirmed_flush(db).await;
    // A table with no position yet (its snapshot's first rows may wait in
    // the sink for a larger commit) is copied from the start by the next
    // run: no change of it can be skipped.
    let mut positions = Vec::new();
    for table in ["items", "events"] {
        if let Some(position) = committed(dir, table).await {
            positions.push((table, position));
        }
    }
    for (commit, tables) in routed_commits(db).await {
        for &(table, position) in &positions {
            assert!(
                !(tables.contains(&table) && commit > position && commit <= flushed),
                "a transaction of {table} committed at {commit:X}, after the sink's position {position:X}, lies before the slot's confirmed_flush_lsn {flushed:X}: it would be skipped"
            );
        }
    }
}

/// The witness slot the tests create before the pipeline's: never
/// advanced, it sees every transaction (test_decoding).
pub const WITNESS: &str = "witness";

/// Every transaction of `items` or `events` the witness slot holds: the
/// end LSN of its commit record (test_decoding's `lsn` of a COMMIT row:
/// the position a sink commits with the transaction), and the routed
/// tables it changed.
pub async fn routed_commits(db: &PgPool) -> Vec<(u64, Vec<&'static str>)> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT lsn::text, data FROM pg_logical_slot_peek_changes($1, NULL, NULL)")
            .bind(WITNESS)
            .fetch_all(db)
            .await
            .unwrap();
    let mut out = Vec::new();
    let mut tables: Vec<&'static str> = Vec::new();
    for (at, data) in rows {
        for t in ["items", "events"] {
            if data.starts_with(&format!("table public.{t}:")) && !tables.contains(&t) {
                tables.push(t);
            }
        }
        if data.starts_with("COMMIT") {
            if !tables.is_empty() {
                out.push((lsn(&at), std::mem::take(&mut tables)));
            }
            tables.clear();
        }
    }
    out
}

/// DuckDB's harness, a work directory, a started server and a pool on it
/// with the schema created.
pub async fn start() -> (PathBuf, tempfile::TempDir, super::Postgres, PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let pg = super::Postgres::start(&dir.path().join("pg"));
    prepared(dir, pg).await
}

/// [`start`] on a server that accepts only TLS ([`super::Postgres::start_tls`]);
/// the last item is the test CA's files ([`super::certs`]).
pub async fn start_tls() -> (
    PathBuf,
    tempfile::TempDir,
    super::Postgres,
    PgPool,
    serde_json::Value,
) {
    let dir = tempfile::tempdir().unwrap();
    let certs = super::certs(&dir.path().join("certs"));
    let pg = super::Postgres::start_tls(&dir.path().join("pg"), certs["dir"].as_str().unwrap());
    let (python, dir, pg, db) = prepared(dir, pg).await;
    (python, dir, pg, db, certs)
}

/// The test schema and the witness slot on `pg`.
async fn prepared(
    dir: tempfile::TempDir,
    pg: super::Postgres,
) -> (PathBuf, tempfile::TempDir, super::Postgres, PgPool) {
    let python = super::harness_python();
    let db = pool(&pg).await;
    db.execute(SCHEMA).await.unwrap();
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')")
        .bind(WITNESS)
        .execute(&db)
        .await
        .unwrap();
    (python, dir, pg, db)
}

/// After a run to the end, the slot is acknowledged at least up to what
/// both tables hold (no WAL retained for changes already committed) and
/// past no change they do not hold.
pub async fn assert_final_acknowledgement(db: &PgPool, dir: &Path) {
    let flushed = confirmed_flush(db).await;
    let items = committed(dir, "items").await.unwrap();
    let events = committed(dir, "events").await.unwrap();
    assert!(
        flushed >= items.min(events),
        "confirmed_flush_lsn {flushed:X}, items {items:X}, events {events:X}"
    );
    assert_slot_not_ahead(db, dir).await;
}

/// Polls `check` every 100 ms for up to `seconds`; true once it holds.
pub async fn eventually<F, Fut>(seconds: u64, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    while std::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Prefills `items` with `rows` rows (NULLs, unicode, a TOASTed note on
/// every 50th row) and `events` with 5,000, in one statement each.
pub async fn prefill(db: &PgPool, rows: i64) {
    sqlx::query(
        "INSERT INTO items
         SELECT i,
                CASE WHEN i % 7 = 0 THEN NULL ELSE 'pré ' || i END,
                CASE WHEN i % 11 = 0 THEN NULL ELSE ((i * 37) % 2000000 - 1000000)::numeric / 100 END,
                CASE WHEN i % 13 = 0 THEN NULL ELSE (i * 7919) % 100000 END,
                CASE WHEN i % 17 = 0 THEN NULL ELSE i % 2 = 0 END,
                CASE WHEN i % 19 = 0 THEN NULL ELSE to_timestamp(i * 3600.5) END,
                CASE WHEN i % 23 = 0 THEN NULL ELSE DATE '1950-01-01' + (i % 40000)::int END,
                CASE WHEN i % 29 = 0 THEN NULL ELSE md5(i::text)::uuid END,
                CASE WHEN i % 50 = 0
                     THEN (SELECT string_agg(md5(i::text || g::text), ' ') FROM generate_series(1, 200) g)
                     ELSE NULL END,
                CASE WHEN i % 31 = 0 THEN NULL ELSE ARRAY['t' || (i % 5), NULL] END,
                CASE WHEN i % 37 = 0 THEN NULL ELSE jsonb_build_object('i', i) END
         FROM generate_series(1, $1) i",
    )
    .bind(rows)
    .execute(db)
    .await
    .unwrap();
    sqlx::query("INSERT INTO events SELECT i, i * 3, 'seed' FROM generate_series(1, 5000) i")
        .execute(db)
        .await
        .unwrap();
    sqlx::query("ANALYZE items").execute(db).await.unwrap();
}

/// The end LSN of the newest transaction that changed `table` (`items`
/// or `events`), as the witness slot saw it.
pub async fn last_routed_commit(db: &PgPool, table: &str) -> Option<u64> {
    routed_commits(db)
        .await
        .into_iter()
        .filter(|(_, tables)| tables.contains(&table))
        .map(|(at, _)| at)
        .max()
}

/// Waits (at most `seconds`) until both tables hold every transaction
/// of theirs that Postgres committed: each table's position is at or past
/// the end of its newest transaction.
pub async fn wait_caught_up(db: &PgPool, dir: &Path, seconds: u64) -> bool {
    // The witness reads flushed WAL only (the harness runs with
    // synchronous_commit = off): wait for the newest commits to be flushed.
    let inserted: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(db)
        .await
        .unwrap();
    let inserted = lsn(&inserted);
    let flushed = eventually(10, || async {
        let at: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
            .fetch_one(db)
            .await
            .unwrap();
        lsn(&at) >= inserted
    })
    .await;
    assert!(flushed, "the server flushed its WAL");
    let items = last_routed_commit(db, "items").await.unwrap_or(0);
    let events = last_routed_commit(db, "events").await.unwrap_or(0);
    eventually(seconds, || async {
        committed(dir, "items").await.is_some_and(|p| p >= items)
            && committed(dir, "events").await.is_some_and(|p| p >= events)
    })
    .await
}
