//! Querying what landed (`urutau query`, the library's `Pipeline::sql`):
//! DataFusion SQL over a pipeline's sink tables, checked against the
//! independent readers (DuckDB for Iceberg, the ClickHouse engine under
//! `FINAL`), and the library facade itself (errors with locations, two
//! pipelines one after the other in one process).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::workload::{COLUMNS, Row, workload, write_lines};
use common::{ClickHouse, run_to_end, urutau};
use serde_json::{Value, json};

/// `(id, name, qty)` of JSON rows, NULL for an absent field (Arrow's JSON
/// writer leaves NULLs out).
fn triples(rows: &[Value]) -> Vec<(i64, Value, Value)> {
    rows.iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap_or_else(|| panic!("no id in {r}")),
                r.get("name").cloned().unwrap_or(Value::Null),
                r.get("qty").cloned().unwrap_or(Value::Null),
            )
        })
        .collect()
}

/// What the oracle says `(id, name, qty)` of the live rows are.
fn expected(state: &BTreeMap<i64, Row>) -> Vec<(i64, Value, Value)> {
    state
        .iter()
        .map(|(id, r)| (*id, r.source["name"].clone(), r.source["qty"].clone()))
        .collect()
}

/// `urutau query ARGS`, which must succeed.
fn query_ok(args: &[&str]) -> String {
    let mut all = vec!["query"];
    all.extend_from_slice(args);
    let out = urutau(&all);
    assert!(
        out.status.success(),
        "urutau {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// JSON lines as values.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A file-into-Iceberg pipeline under `dir` (SQLite catalog), table
/// `lake.items` (`bronze.items` in the catalog).
fn iceberg_pipeline(dir: &Path, data: &Path) -> PathBuf {
    let text = format!(
        "CREATE PIPELINE q WITH (max_batch_rows = 250, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK lake INTO iceberg WITH (
  catalog = 'sql', uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/warehouse', namespace = 'bronze'
);
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE lake.items WITH (write_mode = 'upsert') AS SELECT * FROM src.items;
",
        data = data.display(),
        d = dir.display()
    );
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// Over an Iceberg table written in many snapshots with equality deletes,
/// `urutau query` returns what DuckDB reads, and what the source holds.
#[tokio::test]
async fn query_of_iceberg_with_equality_deletes_equals_duckdb() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(20261201, 3000, 300);
    write_lines(&data, &lines);
    let p = iceberg_pipeline(dir.path(), &data);
    run_to_end(&p);

    let location =
        common::catalog_metadata_location(&dir.path().join("catalog.db"), "bronze", "items")
            .await
            .expect("the catalog holds the table");
    let md: Value = serde_json::from_str(
        &std::fs::read_to_string(location.trim_start_matches("file://")).unwrap(),
    )
    .unwrap();
    let current = md["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["snapshot-id"] == md["current-snapshot-id"])
        .unwrap();
    let eq_deletes: u64 = current["summary"]["total-equality-deletes"]
        .as_str()
        .unwrap_or("0")
        .parse()
        .unwrap();
    assert!(
        eq_deletes > 0,
        "the table has equality deletes to apply: {}",
        current["summary"]
    );

    let out = query_ok(&[
        p.to_str().unwrap(),
        "SELECT id, name, qty FROM lake.items ORDER BY id",
        "--format",
        "json",
    ]);
    let ours = triples(&json_lines(&out));
    let duck_rows = common::duckdb_rows(&python, &location, "id");
    let duck = triples(&duck_rows);
    assert_eq!(ours.len(), duck.len(), "row counts: ours vs DuckDB");
    assert_eq!(ours, duck, "our read equals DuckDB's");
    assert_eq!(ours, expected(&state), "and the source's live rows");

    // A uuid column reads as its canonical text, as DuckDB prints it, and
    // filters by it as written.
    let uids = |rows: &[Value]| -> Vec<(i64, Value)> {
        rows.iter()
            .map(|r| {
                let uid = r.get("uid").cloned().unwrap_or(Value::Null);
                (r["id"].as_i64().unwrap(), uid)
            })
            .collect()
    };
    let out = query_ok(&[
        p.to_str().unwrap(),
        "SELECT id, uid FROM lake.items ORDER BY id",
        "--format",
        "json",
    ]);
    let ours_uids = uids(&json_lines(&out));
    assert_eq!(ours_uids, uids(&duck_rows), "uuids: ours vs DuckDB");
    let (id, uid) = ours_uids
        .iter()
        .find(|(_, u)| u.is_string())
        .expect("a row with a uuid");
    let one = query_ok(&[
        p.to_str().unwrap(),
        &format!(
            "SELECT id FROM lake.items WHERE uid = '{}'",
            uid.as_str().unwrap()
        ),
        "--format",
        "json",
    ]);
    let found: Vec<i64> = json_lines(&one)
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(found, vec![*id], "the row whose uuid was asked for");

    // Aggregates and the table format.
    let table = query_ok(&[p.to_str().unwrap(), "SELECT count(*) AS n FROM lake.items"]);
    assert!(
        table.contains(&format!("| {} ", state.len())) && table.contains("| n "),
        "a table with the count {}:\n{table}",
        state.len()
    );
    let csv = query_ok(&[
        p.to_str().unwrap(),
        "SELECT id, qty FROM lake.items ORDER BY id LIMIT 2",
        "--format",
        "csv",
    ]);
    assert_eq!(csv.lines().next(), Some("id,qty"), "{csv}");
    assert_eq!(csv.lines().count(), 3, "{csv}");
}

/// Querying creates nothing: before any run the table is reported absent
/// (exit 2) and no catalog file or warehouse appears; a query that names
/// no table of the pipeline lists its tables; DDL and DML are refused.
#[test]
fn query_is_read_only_and_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(7, 50, 20);
    write_lines(&data, &lines);
    let p = iceberg_pipeline(dir.path(), &data);
    let p = p.to_str().unwrap();

    let out = urutau(&["query", p, "SELECT * FROM lake.items"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lake.items is not in its sink yet") && err.contains("run the pipeline"),
        "{err}"
    );
    assert!(!dir.path().join("catalog.db").exists(), "no catalog file");
    assert!(!dir.path().join("warehouse").exists(), "no warehouse");

    let out = urutau(&["query", p, "SELECT * FROM lake.nope"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the pipeline's tables: lake.items"), "{err}");

    for statement in [
        "DROP TABLE lake.items",
        "CREATE TABLE t AS SELECT 1",
        "INSERT INTO lake.items SELECT * FROM lake.items",
    ] {
        let out = urutau(&["query", p, statement]);
        assert_eq!(out.status.code(), Some(2), "{statement} is refused");
    }
    assert!(!dir.path().join("catalog.db").exists(), "still no catalog");

    // After a run, the same query reads the rows.
    run_to_end(Path::new(p));
    let out = query_ok(&[p, "SELECT count(*) AS n FROM lake.items"]);
    assert!(out.contains("| n "), "{out}");
}

/// Over ClickHouse, the query equals the engine's own `FINAL` read (the
/// replaced versions and tombstones hidden), for projections, filters and
/// `count(*)`.
#[tokio::test]
async fn query_of_clickhouse_equals_final() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let ch = ClickHouse::start(&python, &dir.path().join("ch"));
    let db = "urutau_t_query";
    ch.fresh_database(db).await;
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(20261202, 3000, 300);
    write_lines(&data, &lines);
    let text = format!(
        "CREATE PIPELINE q WITH (max_batch_rows = 250, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK ch INTO clickhouse WITH ({options});
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE ch.items AS SELECT * FROM src.items;
",
        data = data.display(),
        options = ch.sink_options(db)
    );
    let p = dir.path().join("p.sql");
    std::fs::write(&p, &text).unwrap();
    run_to_end(&p);

    let all = ch
        .rows(&format!("SELECT count() AS n FROM {db}.items"))
        .await;
    assert!(
        all[0]["n"].as_u64().unwrap() > state.len() as u64,
        "the table holds replaced versions and tombstones for FINAL to hide"
    );
    let final_rows = triples(
        &ch.rows(&format!(
            "SELECT id, name, qty FROM {db}.items FINAL ORDER BY id"
        ))
        .await,
    );

    let pipeline = urutau::Pipeline::load(&p).await.unwrap();
    let result = pipeline
        .sql("SELECT id, name, qty FROM ch.items ORDER BY id")
        .await
        .unwrap();
    let text = urutau::output::render(&result, urutau::output::Format::Json).unwrap();
    let ours = triples(&json_lines(&text));
    assert_eq!(ours, final_rows, "our read equals FINAL");
    assert_eq!(ours, expected(&state), "and the source's live rows");

    let result = pipeline
        .sql("SELECT count(*) AS n FROM ch.items WHERE qty > 10")
        .await
        .unwrap();
    let n = json_lines(&urutau::output::render(&result, urutau::output::Format::Json).unwrap());
    let want = state
        .values()
        .filter(|r| r.source["qty"].as_i64().is_some_and(|q| q > 10))
        .count();
    assert_eq!(n, vec![json!({"n": want})]);

    // `read` is every row of one table.
    let read = pipeline.read("ch.items").await.unwrap();
    assert_eq!(read.num_rows(), state.len());
}

/// A memory-sink pipeline over `data`, store `store`.
fn memory_pipeline(name: &str, data: &Path, store: &str) -> String {
    format!(
        "CREATE PIPELINE {name} WITH (max_batch_rows = 5, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK mem INTO memory WITH (store = '{store}');
CREATE TABLE src.items (id BIGINT NOT NULL, name VARCHAR, qty INT, PRIMARY KEY (id));
CREATE TABLE mem.{name}_items AS SELECT id, name, qty, _op AS change_op FROM src.items;
",
        data = data.display()
    )
}

/// The facade in one process: an invalid pipeline is an error with its
/// line, column and rule; two pipelines run one after the other, each
/// reports only itself, and each reads back its own rows.
#[tokio::test]
async fn two_pipelines_in_one_process_do_not_interfere() {
    let err = urutau::Pipeline::from_sql(
        "CREATE PIPELINE bad;\nCREATE SOURCE s FROM file WITH (pathh = 'x.jsonl');\n",
        "bad",
    )
    .await
    .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let urutau::Error::Invalid {
        rendered,
        diagnostics,
    } = &err
    else {
        panic!("not an invalid pipeline: {err}");
    };
    assert!(rendered.contains("bad.sql:2:"), "{rendered}");
    assert!(rendered.contains("pathh"), "{rendered}");
    assert!(
        diagnostics
            .iter()
            .any(|d| d.span.line == 2 && d.span.col > 1),
        "{diagnostics:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let event = |op: &str, id: i64, qty: i64, pos: usize| {
        let row = json!({"id": id, "name": format!("n{id}"), "qty": qty});
        let (before, after) = match op {
            "d" => (row, Value::Null),
            _ => (Value::Null, row),
        };
        json!({"payload": {"op": op, "before": before, "after": after,
            "source": {"table": "items", "ts_ms": 1_700_000_000_000i64 + pos as i64}}})
        .to_string()
    };
    let first = dir.path().join("first.jsonl");
    let lines: Vec<String> = (1..=12)
        .map(|i| event("c", i, i * 10, i as usize))
        .chain([event("d", 3, 30, 13), event("u", 4, 41, 14)])
        .collect();
    write_lines(&first, &lines);
    let second = dir.path().join("second.jsonl");
    let lines: Vec<String> = (100..103).map(|i| event("c", i, 1, i as usize)).collect();
    write_lines(&second, &lines);

    let store = common::unique("facade");
    let a = urutau::Pipeline::from_sql(&memory_pipeline("a", &first, &store), "a")
        .await
        .unwrap();
    let b = urutau::Pipeline::from_sql(&memory_pipeline("b", &second, &store), "b")
        .await
        .unwrap();
    assert_eq!(a.routes(), ["mem.a_items"]);
    assert!(
        a.explain(urutau::ExplainFormat::Indent)
            .contains("MemorySinkExec")
    );

    let options = urutau::RunOptions {
        exit_when_caught_up: true,
        ..Default::default()
    };
    let handle = a.start(options.clone()).await.unwrap();
    let report = handle.wait().await.unwrap();
    assert_eq!(report.routes[0].rows, 14, "every row written: {report:?}");
    assert_eq!(report.routes[0].deletes, 1, "{report:?}");

    let handle = b.start(options.clone()).await.unwrap();
    let status_after = loop {
        if handle.is_finished() {
            break handle.status();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let report = handle.wait().await.unwrap();
    assert_eq!(report.routes[0].rows, 3, "{report:?}");
    let tables = status_after["tables"].as_object().unwrap();
    assert_eq!(
        tables.keys().collect::<Vec<_>>(),
        ["mem.b_items"],
        "the second run reports only itself: {status_after}"
    );
    assert_eq!(status_after["pipeline"], "b");

    let rows = a
        .sql("SELECT id, qty FROM mem.a_items WHERE id <= 5 ORDER BY id")
        .await
        .unwrap();
    let text = urutau::output::render(&rows, urutau::output::Format::Json).unwrap();
    assert_eq!(
        json_lines(&text),
        vec![
            json!({"id": 1, "qty": 10}),
            json!({"id": 2, "qty": 20}),
            json!({"id": 4, "qty": 41}),
            json!({"id": 5, "qty": 50}),
        ]
    );
    assert_eq!(b.read("mem.b_items").await.unwrap().num_rows(), 3);
    // A second run of the same pipeline resumes: nothing new to commit.
    let again = a.run(options.clone()).await.unwrap();
    assert_eq!(again.routes[0].rows, 0, "{again:?}");

    // Side by side: each pipeline's figures are its own.
    let (ha, hb) = (
        a.start(options.clone()).await.unwrap(),
        b.start(options).await.unwrap(),
    );
    ha.wait().await.unwrap();
    hb.wait().await.unwrap();
    for (p, table) in [(&a, "mem.a_items"), (&b, "mem.b_items")] {
        let status = p.metrics().status_json();
        assert_eq!(
            status["tables"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            [table],
            "{status}"
        );
    }
    urutau_sinks::memory::MemoryStore::drop_named(&store);
}
