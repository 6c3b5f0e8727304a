//! Preview (`Pipeline::preview`, `urutau preview`): what each table would
//! receive, through the same plans a run executes, committing and creating
//! nothing, starting after what the sink holds.

mod common;

use std::path::{Path, PathBuf};

use arrow::array::{Array, RecordBatch};
use arrow::compute::{SortColumn, cast, concat_batches, lexsort_to_indices, take_record_batch};
use arrow::util::display::array_value_to_string;
use common::workload::write_lines;
use serde_json::json;
use urutau::preview::CHANGE_COLUMN;
use urutau::{Pipeline, QueryResult, RunOptions};

/// The quickstart pipeline with its data, catalog and warehouse under
/// `dir` (the example itself, paths moved).
fn quickstart(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("examples/quickstart.sql")).unwrap();
    for from in [
        "'examples/data/shop.jsonl'",
        "'sqlite://warehouse/catalog.db'",
        "warehouse = 'warehouse'",
    ] {
        assert!(text.contains(from), "the quickstart has {from}");
    }
    let text = text
        .replace(
            "'examples/data/shop.jsonl'",
            &format!("'{}'", root.join("examples/data/shop.jsonl").display()),
        )
        .replace(
            "'sqlite://warehouse/catalog.db'",
            &format!("'sqlite://{}/warehouse/catalog.db'", dir.display()),
        )
        .replace(
            "warehouse = 'warehouse'",
            &format!("warehouse = '{}/warehouse'", dir.display()),
        );
    let p = dir.join("quickstart.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// One batch of a result, its rows sorted by `id` (then `then`).
fn sorted_by(result: &QueryResult, then: Option<&str>) -> RecordBatch {
    let all = concat_batches(&result.schema, &result.batches).unwrap();
    let columns: Vec<SortColumn> = std::iter::once("id")
        .chain(then)
        .map(|c| SortColumn {
            values: all.column_by_name(c).unwrap().clone(),
            options: None,
        })
        .collect();
    let idx = lexsort_to_indices(&columns, None).unwrap();
    take_record_batch(&all, &idx).unwrap()
}

fn sorted(result: &QueryResult) -> RecordBatch {
    sorted_by(result, None)
}

/// The rows of `batch` whose change kind is `kind`, without that column.
fn of_kind(batch: &RecordBatch, kind: &str) -> RecordBatch {
    let kinds = arrow::array::AsArray::as_string::<i32>(
        batch.column_by_name(CHANGE_COLUMN).unwrap().as_ref(),
    )
    .clone();
    let keep: arrow::array::BooleanArray = kinds.iter().map(|k| Some(k == Some(kind))).collect();
    let rows = arrow::compute::filter_record_batch(batch, &keep).unwrap();
    let last = rows.num_columns() - 1;
    rows.project(&(0..last).collect::<Vec<_>>()).unwrap()
}

/// Rows as text, each column of `a` cast to `b`'s type first (an Iceberg
/// read names its time zone `+00:00`, a route `UTC`).
fn same_rows(a: &RecordBatch, b: &RecordBatch) {
    assert_eq!(
        a.schema()
            .fields()
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>(),
        b.schema()
            .fields()
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>(),
        "the same columns"
    );
    assert_eq!(a.num_rows(), b.num_rows(), "the same row count");
    for (i, f) in b.schema().fields().iter().enumerate() {
        let left = cast(a.column(i), f.data_type()).unwrap();
        let right = b.column(i);
        for r in 0..b.num_rows() {
            let show = |c: &dyn Array| {
                if c.is_null(r) {
                    "NULL".to_string()
                } else {
                    array_value_to_string(c, r).unwrap()
                }
            };
            assert_eq!(
                show(left.as_ref()),
                show(right.as_ref()),
                "column {} row {r}",
                f.name()
            );
        }
    }
}

fn ids(batch: &RecordBatch) -> Vec<i64> {
    arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(
        batch.column_by_name("id").unwrap().as_ref(),
    )
    .values()
    .to_vec()
}

/// The quickstart's preview: the expected rows and change kinds per
/// table, the metadata columns at the end, nothing created on disk; the
/// run that follows commits exactly the previewed rows.
#[tokio::test]
async fn quickstart_preview_is_what_the_run_commits_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = Pipeline::load(&quickstart(dir.path())).await.unwrap();
    let preview = p.preview(1000).await.unwrap();
    assert_eq!(
        preview.keys().collect::<Vec<_>>(),
        ["lake.customer_changes", "lake.orders"]
    );
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(entries, ["quickstart.sql"], "preview created nothing");

    let orders = sorted(&preview["lake.orders"]);
    let names: Vec<String> = orders
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "id",
            "customer_id",
            "amount",
            "status",
            "created_at",
            "committed_at",
            "change_op",
            CHANGE_COLUMN
        ]
    );
    let upserts = of_kind(&orders, "upsert");
    assert_eq!(ids(&upserts), [1, 3, 6, 40]);
    let deletes = ids(&of_kind(&orders, "delete"));
    for gone in [2, 4] {
        assert!(deletes.contains(&gone), "{gone} is deleted: {deletes:?}");
    }
    let status = |b: &RecordBatch, row: usize| {
        array_value_to_string(b.column_by_name("status").unwrap(), row).unwrap()
    };
    assert_eq!(status(&upserts, 1), "shipped", "order 3's newest image");
    let change_op = |b: &RecordBatch, row: usize| {
        array_value_to_string(b.column_by_name("change_op").unwrap(), row).unwrap()
    };
    assert_eq!(change_op(&upserts, 0), "insert", "order 1 was re-created");

    let customers = sorted_by(&preview["lake.customer_changes"], Some("source_position"));
    assert_eq!(customers.num_rows(), 5, "every customer change is a row");
    let kinds = customers.column_by_name(CHANGE_COLUMN).unwrap();
    assert!((0..5).all(|i| array_value_to_string(kinds, i).unwrap() == "append"));

    // The run commits what the preview showed.
    let report = p
        .run(RunOptions {
            exit_when_caught_up: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(report.routes.iter().all(|r| r.commits > 0), "{report:?}");
    let landed = sorted(&p.sql("SELECT * FROM lake.orders").await.unwrap());
    same_rows(&upserts, &landed);
    let landed = sorted_by(
        &p.read("lake.customer_changes").await.unwrap(),
        Some("source_position"),
    );
    let last = customers.num_columns() - 1;
    let customers = customers.project(&(0..last).collect::<Vec<_>>()).unwrap();
    same_rows(&customers, &landed);
}

/// A preview starts after what the sink holds: after a run over the first
/// changes, the preview of the file grown since shows only the new ones,
/// `limit` of them, and leaves the table's metadata as it was.
#[tokio::test]
async fn preview_starts_after_the_committed_position_and_takes_limit_changes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("items.jsonl");
    let event = |op: &str, id: i64, qty: i64, ts: i64| {
        let row = json!({"id": id, "qty": qty});
        let (before, after) = if op == "d" {
            (row, serde_json::Value::Null)
        } else {
            (serde_json::Value::Null, row)
        };
        json!({"op": op, "before": before, "after": after,
            "source": {"table": "items", "ts_ms": ts}})
        .to_string()
    };
    let first: Vec<String> = (1..=10).map(|i| event("c", i, i, i)).collect();
    write_lines(&data, &first);
    let text = format!(
        "CREATE PIPELINE grow;
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK lake INTO iceberg WITH (
  catalog = 'sql', uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/warehouse', namespace = 'b'
);
CREATE TABLE src.items (id BIGINT NOT NULL, qty INT, PRIMARY KEY (id));
CREATE TABLE lake.items AS SELECT id, qty * 10 AS qty10 FROM src.items WHERE qty <> 13;
",
        data = data.display(),
        d = dir.path().display()
    );
    let p = Pipeline::from_sql(&text, "grow").await.unwrap();

    // From the beginning: the first 4 changes.
    let preview = p.preview(4).await.unwrap();
    let items = sorted(&preview["lake.items"]);
    assert_eq!(ids(&items), [1, 2, 3, 4]);
    assert!(!dir.path().join("catalog.db").exists());

    p.run(RunOptions {
        exit_when_caught_up: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let db = dir.path().join("catalog.db");
    let before = common::catalog_metadata_location(&db, "b", "items")
        .await
        .unwrap();

    let mut grown = first.clone();
    grown.extend([
        event("u", 2, 12, 11),
        event("c", 11, 13, 12),
        event("d", 3, 3, 13),
        event("c", 12, 1, 14),
        event("c", 13, 2, 15),
    ]);
    write_lines(&data, &grown);
    let preview = p.preview(3).await.unwrap();
    let items = sorted(&preview["lake.items"]);
    // Changes 11..13: order 2 updated, 11 filtered out, 3 deleted.
    assert_eq!(ids(&of_kind(&items, "upsert")), [2]);
    assert_eq!(
        array_value_to_string(of_kind(&items, "upsert").column(1), 0).unwrap(),
        "120",
        "the projection ran"
    );
    assert!(ids(&of_kind(&items, "delete")).contains(&3));
    assert!(!ids(&items).contains(&12), "beyond the limit");
    assert_eq!(
        common::catalog_metadata_location(&db, "b", "items").await,
        Some(before),
        "preview changed nothing in the catalog"
    );
    let landed = p.sql("SELECT count(*) AS n FROM lake.items").await.unwrap();
    assert_eq!(
        array_value_to_string(landed.batches[0].column(0), 0).unwrap(),
        "10",
        "nothing was committed"
    );
}

/// The slot's `confirmed_flush_lsn` and `restart_lsn` (`None`: no slot).
async fn slot_lsns(db: &sqlx::PgPool, slot: &str) -> Option<(String, String)> {
    sqlx::query_as(
        "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(db)
    .await
    .unwrap()
}

async fn count(db: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db).await.unwrap()
}

/// A text cell of `batch`.
fn cell(batch: &RecordBatch, column: &str, row: usize) -> String {
    array_value_to_string(batch.column_by_name(column).unwrap(), row).unwrap()
}

/// Postgres: a fresh pipeline's preview is the snapshot's first rows by a
/// plain SELECT (no slot, publication or replica identity made); after a
/// run, a preview is the slot's next changes, peeked (the slot's
/// `confirmed_flush_lsn` and `restart_lsn` do not move, nothing is
/// created); a table added to the pipeline previews its snapshot behind
/// the backlog; a slot a run streams from is refused; and each run then
/// commits the rows its preview showed.
#[tokio::test]
async fn postgres_preview_selects_the_snapshot_and_peeks_at_the_slot() {
    use sqlx::Executor;
    let dir = tempfile::tempdir().unwrap();
    let pg = common::Postgres::start(&dir.path().join("pg"));
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg.uri())
        .await
        .unwrap();
    db.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, status text, amount numeric(10,2));
         INSERT INTO orders SELECT i, 'new', i * 1.5 FROM generate_series(1, 5) i;
         CREATE TABLE refunds (id bigint PRIMARY KEY, order_id bigint);
         INSERT INTO refunds VALUES (1, 4), (2, 5);",
    )
    .await
    .unwrap();
    let d = dir.path().display();
    let sink = format!(
        "CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = 'pg');"
    );
    let orders = "CREATE TABLE lake.orders WITH (primary_key = 'id') AS
  SELECT id, upper(status) AS status, amount, _op AS change_op, _phase AS phase FROM src.public.orders WHERE id <> 4;";
    let source = format!(
        "CREATE SOURCE src FROM postgres WITH (uri = '{}', slot = 'preview_slot');",
        pg.uri()
    );
    let text = format!("CREATE PIPELINE pgp;\n{source}\n{sink}\n{orders}\n");
    let p = Pipeline::from_sql(&text, "pgp").await.unwrap();

    // Fresh: the snapshot's first rows, nothing made anywhere.
    let preview = p.preview(3).await.unwrap();
    let shown = sorted(&preview["lake.orders"]);
    assert_eq!(ids(&shown), [1, 2, 3]);
    assert_eq!(cell(&shown, "status", 0), "NEW", "the projection ran");
    assert_eq!(cell(&shown, "change_op", 0), "insert");
    assert_eq!(cell(&shown, "phase", 0), "snapshot");
    assert_eq!(cell(&shown, CHANGE_COLUMN, 0), "upsert");
    assert_eq!(slot_lsns(&db, "preview_slot").await, None, "no slot");
    assert_eq!(count(&db, "SELECT count(*) FROM pg_publication").await, 0);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pg_class WHERE relname = 'orders' AND relreplident = 'f'"
        )
        .await,
        0,
        "the replica identity is left alone"
    );
    assert!(!dir.path().join("catalog.db").exists() && !dir.path().join("wh").exists());

    // The run commits what the preview showed (and the rest of the table).
    p.run(RunOptions {
        exit_when_caught_up: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let landed = sorted(&p.sql("SELECT * FROM lake.orders").await.unwrap());
    assert_eq!(ids(&landed), [1, 2, 3, 5]);
    let first3 = landed.slice(0, 3);
    let last = shown.num_columns() - 1;
    same_rows(
        &shown.project(&(0..last).collect::<Vec<_>>()).unwrap(),
        &first3,
    );

    // The backlog: four changes in three transactions.
    db.execute("UPDATE orders SET status = 'paid', amount = 9.99 WHERE id = 2")
        .await
        .unwrap();
    db.execute(
        "BEGIN; DELETE FROM orders WHERE id = 3; INSERT INTO orders VALUES (6, 'new', 6); COMMIT;",
    )
    .await
    .unwrap();
    db.execute("INSERT INTO orders VALUES (7, 'new', 7)")
        .await
        .unwrap();
    let lsns = slot_lsns(&db, "preview_slot")
        .await
        .expect("the run made the slot");
    let preview = p.preview(3).await.unwrap();
    let shown = sorted(&preview["lake.orders"]);
    assert_eq!(ids(&of_kind(&shown, "upsert")), [2, 6]);
    assert_eq!(ids(&of_kind(&shown, "delete")), [3]);
    let paid = of_kind(&shown, "upsert");
    assert_eq!(cell(&paid, "status", 0), "PAID");
    assert_eq!(cell(&paid, "amount", 0), "9.99");
    assert_eq!(cell(&paid, "change_op", 0), "update");
    assert_eq!(cell(&paid, "phase", 0), "stream");
    assert_eq!(
        slot_lsns(&db, "preview_slot").await,
        Some(lsns.clone()),
        "the slot did not move"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pg_replication_slots").await,
        1
    );
    assert_eq!(count(&db, "SELECT count(*) FROM pg_publication").await, 1);

    // A table added to the pipeline: the backlog first, then its snapshot.
    let refunds =
        "CREATE TABLE lake.refunds WITH (primary_key = 'id') AS SELECT * FROM src.public.refunds;";
    let text2 = format!("CREATE PIPELINE pgp;\n{source}\n{sink}\n{orders}\n{refunds}\n");
    let p2 = Pipeline::from_sql(&text2, "pgp").await.unwrap();
    let preview2 = p2.preview(10).await.unwrap();
    assert_eq!(ids(&sorted(&preview2["lake.orders"])), [2, 3, 6, 7]);
    assert_eq!(ids(&sorted(&preview2["lake.refunds"])), [1, 2]);
    assert_eq!(slot_lsns(&db, "preview_slot").await, Some(lsns.clone()));

    // A slot a run streams from is not peeked at.
    let handle = p.start(RunOptions::default()).await.unwrap();
    let mut active = false;
    for _ in 0..200 {
        active = count(
            &db,
            "SELECT count(*) FROM pg_replication_slots WHERE active",
        )
        .await
            == 1;
        if active {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(active, "the run streams from the slot");
    let busy = p.preview(3).await.unwrap_err().to_string();
    assert!(busy.contains("preview_slot is in use"), "{busy}");
    assert!(!busy.contains("postgres://"), "no uri in errors: {busy}");
    // Until the run has committed the backlog.
    let mut n = 0;
    for _ in 0..300 {
        let r = p.sql("SELECT count(*) FROM lake.orders").await.unwrap();
        n = cell(&r.batches[0], r.schema.field(0).name(), 0)
            .parse()
            .unwrap();
        if n == 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(n, 5, "the run committed the backlog");
    handle.stop();
    let report = handle.wait().await.unwrap();
    assert!(report.routes[0].commits > 0, "{report:?}");

    // That run committed what the preview showed, and more.
    let landed = sorted(&p.sql("SELECT * FROM lake.orders").await.unwrap());
    assert_eq!(ids(&landed), [1, 2, 5, 6, 7]);
    let shown_upserts = of_kind(&shown, "upsert");
    let landed_2_6 = arrow::compute::filter_record_batch(
        &landed,
        &ids(&landed)
            .iter()
            .map(|i| Some(*i == 2 || *i == 6))
            .collect(),
    )
    .unwrap();
    same_rows(&shown_upserts, &landed_2_6);
}
