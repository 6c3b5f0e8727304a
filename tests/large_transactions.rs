//! Transactions larger than a batch (issue 16, item 3): the Postgres source
//! hands one over in parts as its rows arrive, so memory stays bounded by
//! `max_batch_rows`, and the transaction still lands in one sink commit.
//! Iceberg stages the parts on a branch that readers do not see, ClickHouse
//! in a staging table it attaches at the end; a table that cannot stage
//! (ClickHouse written by several workers) receives the transaction whole.
//! A kill -9 while parts are staged leaves every table untouched by the
//! transaction, and the restart ends equal to Postgres (DuckDB and the
//! ClickHouse engine read the results back).

mod common;

use common::pg_cdc::*;
use common::run_to_end;

use std::process::{Child, Command};
use std::sync::atomic::AtomicBool;

use serde_json::Value;

/// The table's current metadata (the SQLite catalog's pointer), parsed.
async fn metadata(dir: &std::path::Path, table: &str) -> Option<Value> {
    let loc = common::catalog_metadata_location(&dir.join("catalog.db"), "pg", table).await?;
    let path = loc.strip_prefix("file://").unwrap_or(&loc);
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Whether the table's metadata has the staging branch (parts of an open
/// transaction).
async fn staging(dir: &std::path::Path, table: &str) -> bool {
    metadata(dir, table)
        .await
        .is_some_and(|m| m["refs"].get("urutau-staging").is_some())
}

/// `id, name, qty` of every item, as ClickHouse holds them in `table`
/// (`FINAL`).
async fn clickhouse_items(ch: &common::ClickHouse, table: &str) -> Vec<Value> {
    ch.rows(&format!(
        "SELECT id, name, qty FROM urutau_t_large.{table} FINAL ORDER BY id"
    ))
    .await
}

/// The rows of the ClickHouse table's staging table (parts of an open
/// transaction), or `None` when there is none.
async fn clickhouse_staged(ch: &common::ClickHouse, table: &str) -> Option<u64> {
    let exists = ch
        .rows(&format!(
            "SELECT count() AS n FROM system.tables WHERE database = 'urutau_t_large' AND name = '{table}_urutau_staging'"
        ))
        .await;
    if exists.first()?["n"].as_u64() != Some(1) {
        return None;
    }
    ch.rows(&format!(
        "SELECT count() AS n FROM urutau_t_large.{table}_urutau_staging"
    ))
    .await
    .first()?["n"]
        .as_u64()
}

/// One transaction of about 67k changes over both tables: 40k inserts,
/// then updates of a third of them and deletes of a tenth (changes of keys
/// an earlier part of the same transaction wrote), updates of rows from
/// before it, and 10k events.
const HUGE: &str = "
INSERT INTO items (id, name, amount, qty, active)
  SELECT i, 'big ' || i, i * 0.01, i % 100, i % 2 = 0 FROM generate_series(10000000, 10039999) i;
UPDATE items SET qty = qty + 1000, name = name || ' updated'
  WHERE id BETWEEN 10000000 AND 10039999 AND id % 3 = 0;
DELETE FROM items WHERE id BETWEEN 10000000 AND 10039999 AND id % 10 = 0;
UPDATE items SET qty = -7 WHERE id < 10000000 AND id % 2 = 0;
INSERT INTO events SELECT i, i, 'big' FROM generate_series(20000000, 20009999) i;
";

fn spawn_run(pipeline: &std::path::Path, log: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", pipeline.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// The transaction is staged part by part on the Iceberg tables' branch
/// and in ClickHouse's staging table, while the ClickHouse route written by
/// two workers holds it; kill -9 then leaves every table as it was before
/// it (DuckDB reads `main`, the ClickHouse engine reads its tables), and
/// the restart lands it once: all end equal to Postgres, the branch and
/// the staging table are gone, and the slot is not acknowledged past the
/// sinks.
#[tokio::test]
async fn a_transaction_larger_than_a_batch_is_staged_and_lands_at_once_through_kill_9() {
    let (python, dir, pg, db) = start().await;
    let ch = common::ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_large").await;
    let p = dir.path().join("large.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE pg WITH (max_batch_rows = 1000, max_batch_interval = '200ms');
CREATE SOURCE src FROM postgres WITH (uri = '{uri}', slot = 'urutau_test', snapshot = 'none');
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');
CREATE SINK ch INTO clickhouse WITH ({options});
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT * FROM src.public.items;
CREATE TABLE lake.events WITH (primary_key = 'id') AS SELECT * FROM src.events;
CREATE TABLE ch.items WITH (primary_key = 'id') AS SELECT id, name, qty FROM src.public.items;
CREATE TABLE ch.items_by_2 WITH (primary_key = 'id', workers = 2) AS SELECT id, name, qty FROM src.public.items;
",
            uri = pg.uri(),
            d = dir.path().display(),
            options = ch.sink_options("urutau_t_large")
        ),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let mut child = spawn_run(&p, &log);
    assert!(
        eventually(60, || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT count(*) = 1 FROM pg_replication_slots WHERE slot_name = 'urutau_test' AND active",
            )
            .fetch_one(&db)
            .await
            .unwrap_or(false)
        })
        .await,
        "the run streams from its slot"
    );
    // Small transactions first, landed everywhere.
    let stop = AtomicBool::new(false);
    workload(&db, 41, 100, &stop, 400, 0).await;
    let before_items = source_items(&db).await;
    let before_kv = source_kv(&db).await;
    assert!(
        wait_caught_up(&db, dir.path(), 120).await,
        "the small transactions land in Iceberg: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(
        eventually(60, || async {
            clickhouse_items(&ch, "items").await == before_kv
                && clickhouse_items(&ch, "items_by_2").await == before_kv
        })
        .await,
        "and in ClickHouse"
    );

    let mut tx = db.begin().await.unwrap();
    sqlx::raw_sql(HUGE).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let staged = eventually(120, || async {
        staging(dir.path(), "items").await
            && clickhouse_staged(&ch, "items").await.unwrap_or(0) >= 2000
    })
    .await;
    assert!(
        staged,
        "parts of the transaction are staged on the branch and in ClickHouse's staging table: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        staging(dir.path(), "items").await,
        "killed while parts were staged"
    );
    assert!(clickhouse_staged(&ch, "items").await.is_some());
    assert_eq!(
        clickhouse_staged(&ch, "items_by_2").await,
        None,
        "two workers hold the transaction, they do not stage it"
    );

    // Nothing of the transaction is visible: `main` and ClickHouse hold
    // what they held before it.
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "items")
        .await
        .unwrap();
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), before_items);
    assert_eq!(clickhouse_items(&ch, "items").await, before_kv);
    assert_eq!(clickhouse_items(&ch, "items_by_2").await, before_kv);

    // The restart discards the staged parts and lands the transaction.
    run_to_end(&p);
    assert!(!staging(dir.path(), "items").await, "the branch is gone");
    assert!(!staging(dir.path(), "events").await, "the branch is gone");
    let items = assert_items_equal(&python, dir.path(), &db, &[]).await;
    assert_eq!(items.len(), before_items.len() + 36_000);
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pg", "events")
        .await
        .unwrap();
    assert_eq!(
        common::duckdb_rows(&python, &loc, "id"),
        source_events(&db).await
    );
    let want = source_kv(&db).await;
    assert_eq!(clickhouse_items(&ch, "items").await, want);
    assert_eq!(clickhouse_items(&ch, "items_by_2").await, want);
    assert_eq!(
        clickhouse_staged(&ch, "items").await,
        None,
        "the staging table is gone"
    );
    // ClickHouse got the transaction's keys in parts (one `seq` each),
    // attached at once.
    let seqs = |table: &'static str| {
        let ch = &ch;
        async move {
            ch.rows(&format!(
                "SELECT uniqExact(seq) AS n FROM urutau_t_large.{table} FINAL WHERE id >= 10000000"
            ))
            .await[0]["n"]
                .as_u64()
                .unwrap()
        }
    };
    let parts = seqs("items").await;
    assert!(parts >= 10, "{parts} parts attached");
    assert_slot_not_ahead(&db, dir.path()).await;

    // One snapshot of `main` holds the whole transaction: its parent is
    // the last staged part, and the snapshot before the parts held none
    // of it (the parts are on `main`'s history only from that commit on).
    let md = metadata(dir.path(), "items").await.unwrap();
    let main = md["current-snapshot-id"].as_i64().unwrap();
    let snapshots = md["snapshots"].as_array().unwrap();
    let by_id = |id: i64| {
        snapshots
            .iter()
            .find(|s| s["snapshot-id"].as_i64() == Some(id))
            .cloned()
    };
    let head = by_id(main).unwrap();
    assert!(
        head["summary"].get("cdc.position").is_some(),
        "the last commit carries the position: {head}"
    );
    let mut staged_parts = 0;
    let mut at = head["parent-snapshot-id"].as_i64();
    while let Some(s) = at.and_then(by_id) {
        if s["summary"].get("cdc.position").is_some() {
            break;
        }
        staged_parts += 1;
        at = s["parent-snapshot-id"].as_i64();
    }
    assert!(
        staged_parts >= 10,
        "the transaction came in parts of at most 1,000 rows ({staged_parts} staged before its last)"
    );
}
