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
