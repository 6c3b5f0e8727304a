//! The sink conformance suite: the behaviour every sink shares, written
//! once and run by each sink's test file (tests/iceberg.rs,
//! tests/clickhouse.rs, tests/couchbase.rs) through [`SinkUnderTest`],
//! which says how to reach that sink and how its independent reader
//! renders rows.
//!
//! - [`contract`]: ensure a table (and validate it when it exists), commit,
//!   resume from what a new sink instance reads, a replayed batch adds
//!   nothing, deletes remove, a mismatching route is refused.
//! - [`kill_9_oracle`]: the seeded change stream of every column kind
//!   (inserts, updates, deletes, re-inserts, key changes, NULLs, unicode,
//!   decimals at their bounds, nested values) through the file source,
//!   killed with SIGKILL five times mid-stream, then run to the end: the
//!   independent reader's rows equal the oracle, the position equals the
//!   end of the input, and a re-run commits nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use serde_json::{Value, json};
use urutau_planner::sink::SinkBatch;

use super::workload::{COLUMNS, Row, differences, workload, write_lines};

/// How the suite reaches one sink.
#[allow(async_fn_in_trait)]
pub trait SinkUnderTest {
    /// `CREATE SINK s INTO ... WITH (...);` — the sink named `s`.
    fn create_sink(&self) -> String;
    /// The route target of table `table` (`s.table`, or with a namespace).
    fn target(&self, table: &str) -> String {
        format!("s.{table}")
    }
    /// Route options added to every route (`, workers = 2`).
    fn route_options(&self) -> String {
        String::new()
    }
    /// Rows of `table` as the independent reader renders them, ordered by
    /// `id` (keys 1..=`keys`): every column of `items`, `id` and `name` of
    /// the contract's table.
    async fn rows(&self, table: &str, keys: i64) -> Vec<Value>;
    /// Metadata columns the oracle route selects besides `*`
    /// (`, _op AS op`).
    fn selected_metadata(&self) -> &'static str {
        ""
    }
    /// An oracle row of `items` as this reader renders it; `op` is the
    /// `_op` of the change that produced it.
    fn expected(&self, row: &Row, op: &str) -> Value;
    /// The committed position, read from the sink's storage by the test
    /// (not by the sink).
    async fn position(&self, table: &str) -> Option<String>;
    /// Whether the sink checks an existing table against the route (a
    /// schemaless store has nothing to check).
    fn checks_schema(&self) -> bool {
        true
    }
}

/// A batch of the contract's table (`id`, `name`): `None` is a delete
/// (its before image named `x`).
pub fn simple_batch(rows: &[(i64, Option<&str>)]) -> SinkBatch {
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
        arrow::datatypes::Field::new("name", arrow::datatypes::DataType::Utf8, true),
    ]));
    let ids: ArrayRef = std::sync::Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0)));
    let names: ArrayRef = std::sync::Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.1.unwrap_or("x")),
    ));
    SinkBatch {
        rows: RecordBatch::try_new(schema, vec![ids, names]).unwrap(),
        deletes: BooleanArray::from_iter(rows.iter().map(|r| Some(r.1.is_none()))),
    }
}

fn contract_text(s: &impl SinkUnderTest, columns: &str) -> String {
    format!(
        "CREATE PIPELINE c;
CREATE SOURCE src FROM file WITH (path = 'unused.jsonl');
{}
CREATE TABLE src.contract ({columns}, PRIMARY KEY (id));
CREATE TABLE {} WITH (primary_key = 'id'{}) AS SELECT * FROM src.contract;",
        s.create_sink(),
        s.target("contract"),
        s.route_options()
    )
}

/// The sink contract through the library: ensure, commit, replay, resume,
/// validate.
pub async fn contract(s: &impl SinkUnderTest) {
    let text = contract_text(s, "id BIGINT NOT NULL, name VARCHAR");
    let plan = super::plan_sql(&text)
        .await
        .unwrap_or_else(|d| panic!("{}", super::show(&d)));
    let (sink, target) = (plan.routes[0].sink.clone(), plan.routes[0].target.clone());
    sink.ensure_table(&target).await.unwrap();
    assert_eq!(sink.committed_position(&target).await.unwrap(), None);
    let first: Vec<(i64, Option<&str>)> = (1..=50).map(|i| (i, Some("a"))).collect();
    let mut second: Vec<(i64, Option<&str>)> = (1..=10).map(|i| (i, Some("b"))).collect();
    second.extend((11..=20).map(|i| (i, None)));
    let want: Vec<Value> = (1..=50)
        .filter(|i| !(11..=20).contains(i))
        .map(|i| json!({"id": i, "name": if i <= 10 { "b" } else { "a" }}))
        .collect();
    sink.commit(&target, &simple_batch(&first), "100")
        .await
        .unwrap();
    assert_eq!(
        sink.committed_position(&target).await.unwrap().as_deref(),
        Some("100")
    );
    sink.commit(&target, &simple_batch(&second), "200")
        .await
        .unwrap();
    // A replay of the committed batch (as after a crash before its
    // position reached the runner) adds nothing.
    sink.commit(&target, &simple_batch(&second), "200")
        .await
        .unwrap();
    assert_eq!(s.rows("contract", 60).await, want);
    // Progress without rows advances the position only.
    sink.commit(&target, &simple_batch(&[]), "300")
        .await
        .unwrap();
    assert_eq!(s.rows("contract", 60).await, want);
    drop(plan);

    // A new sink instance (a restart) resumes from what the sink holds and
    // accepts the existing table.
    let plan = super::plan_sql(&text).await.unwrap();
    let (sink, target) = (plan.routes[0].sink.clone(), plan.routes[0].target.clone());
    sink.ensure_table(&target).await.unwrap();
    let resumed = sink.committed_position(&target).await.unwrap();
    assert!(
        matches!(resumed.as_deref(), Some("300") | Some("200")),
        "resumed from {resumed:?}"
    );
    assert_eq!(s.position("contract").await.as_deref(), resumed.as_deref());

    if s.checks_schema() {
        // A route that no longer matches the table: refused with
        // `schema_changes = 'fail'`, naming the column.
        let other = contract_text(s, "id BIGINT NOT NULL, name VARCHAR, extra BIGINT");
        let strict = other.replace(
            "(primary_key = 'id'",
            "(primary_key = 'id', schema_changes = 'fail'",
        );
        let plan = super::plan_sql(&strict).await.unwrap();
        let err = plan.routes[0]
            .sink
            .ensure_table(&plan.routes[0].target)
            .await
            .expect_err("a route that does not match the existing table is refused");
        assert!(err.to_string().contains("extra"), "{err}");
        // Evolved by default: the column is added, the position and the
        // rows are kept.
        let plan = super::plan_sql(&other).await.unwrap();
        plan.routes[0]
            .sink
            .ensure_table(&plan.routes[0].target)
            .await
            .unwrap();
        assert_eq!(s.position("contract").await.as_deref(), resumed.as_deref());
        let id_name = |rows: Vec<Value>| -> Vec<Value> {
            rows.iter()
                .map(|r| json!({"id": r["id"], "name": r["name"]}))
                .collect()
        };
        assert_eq!(id_name(s.rows("contract", 60).await), want);
        // The table, evolved from the route, still takes the route's rows
        // (the column it does not write is NULL).
        let plan = super::plan_sql(&text).await.unwrap();
        let (sink, target) = (plan.routes[0].sink.clone(), plan.routes[0].target.clone());
        sink.ensure_table(&target).await.unwrap();
        sink.commit(&target, &simple_batch(&[(1, Some("c"))]), "400")
            .await
            .unwrap();
        assert_eq!(s.position("contract").await.as_deref(), Some("400"));
        let mut now = want.clone();
        now[0]["name"] = json!("c");
        assert_eq!(id_name(s.rows("contract", 60).await), now);
    }
}

/// The `_op` of the change that produced each key's final image.
fn last_ops(lines: &[String]) -> BTreeMap<i64, &'static str> {
    let mut ops = BTreeMap::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        if let Some(id) = v["after"]["id"].as_i64() {
            ops.insert(id, if v["op"] == "u" { "update" } else { "insert" });
        }
    }
    ops
}

/// What [`kill_9_oracle`] leaves for a sink's own further checks.
pub struct OracleRun {
    pub pipeline: PathBuf,
    pub data: PathBuf,
    pub lines: Vec<String>,
    pub state: BTreeMap<i64, Row>,
    pub rows: Vec<Value>,
    /// The byte length of the input: the position at its end.
    pub end: String,
}

/// The seeded change stream through the file source into table `items`,
/// five SIGKILLs mid-stream, then run to the end and run again.
pub async fn kill_9_oracle(
    s: &impl SinkUnderTest,
    dir: &Path,
    seed: u64,
    changes: usize,
    keys: i64,
    pause_ms: std::ops::Range<u64>,
) -> OracleRun {
    let data = dir.join("changes.jsonl");
    let (lines, state) = workload(seed, changes, keys);
    write_lines(&data, &lines);
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = 150, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{}');
{}
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE {} WITH (write_mode = 'upsert'{}) AS SELECT *{} FROM src.items;
",
        data.display(),
        s.create_sink(),
        s.target("items"),
        s.route_options(),
        s.selected_metadata()
    );
    let pipeline = dir.join("p.sql");
    std::fs::write(&pipeline, text).unwrap();
    let end = std::fs::metadata(&data).unwrap().len().to_string();

    super::kill_9_runs(&pipeline, seed, 5, pause_ms);
    let at = s.position("items").await;
    assert!(
        at.as_ref().is_some_and(|p| *p != end),
        "the kills did not land mid-stream: position {at:?} of {end}"
    );

    super::run_to_end(&pipeline);
    let rows = s.rows("items", keys).await;
    let ops = last_ops(&lines);
    let want: Vec<Value> = state.iter().map(|(id, r)| s.expected(r, ops[id])).collect();
    let problems = differences(&rows, &want);
    assert!(
        problems.is_empty(),
        "{} differences, first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    assert_eq!(rows.len(), state.len());
    assert_eq!(s.position("items").await.as_deref(), Some(end.as_str()));

    // A re-run over committed input commits nothing.
    let out = super::run_to_end(&pipeline);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains(&format!(
            "resuming route={} position={end}",
            s.target("items")
        )) && log.contains("commits=0"),
        "a re-run over committed input: {log}"
    );
    assert_eq!(s.position("items").await.as_deref(), Some(end.as_str()));
    OracleRun {
        pipeline,
        data,
        lines,
        state,
        rows,
        end,
    }
}
