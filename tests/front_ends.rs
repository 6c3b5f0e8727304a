//! The two front ends: every example ships as `.sql` and `.yaml` and both
//! mean the same pipeline and plans; errors of either carry `line:col`.

mod common;

use std::path::Path;

use urutau_planner::diagnostic::Diagnostics;
use urutau_planner::plan::{ExplainFormat, PipelinePlan, plan_pipeline};
use urutau_sql::load_pipeline;

async fn plan_file(path: &Path) -> PipelinePlan {
    let loaded = load_pipeline(path, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    plan_pipeline(loaded.spec, &common::registry())
        .await
        .unwrap_or_else(|d| panic!("{}: {}", path.display(), common::show(&d)))
}

#[tokio::test]
async fn every_example_pair_means_the_same_pipeline() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut pairs = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let sql = entry.unwrap().path();
        if sql.extension().and_then(|e| e.to_str()) != Some("sql") {
            continue;
        }
        let yaml = sql.with_extension("yaml");
        assert!(yaml.exists(), "{} has no YAML twin", sql.display());
        let a = plan_file(&sql).await;
        let b = plan_file(&yaml).await;
        let registry = common::registry();
        assert_eq!(
            a.describe(&registry),
            b.describe(&registry),
            "{}: bound specs differ",
            sql.display()
        );
        assert_eq!(
            a.explain(ExplainFormat::Indent),
            b.explain(ExplainFormat::Indent),
            "{}: plans differ",
            sql.display()
        );
        assert_eq!(
            a.explain(ExplainFormat::Tree),
            b.explain(ExplainFormat::Tree)
        );
        pairs += 1;
    }
    assert!(pairs >= 2, "examples found: {pairs}");
}

fn yaml_errors(text: &str) -> Diagnostics {
    urutau_sql::parse_pipeline_yaml(text, "t", &|_| None).expect_err("the YAML must be refused")
}

fn located(d: &Diagnostics, line: u32, col: u32, needle: &str) -> bool {
    d.items
        .iter()
        .any(|i| i.span.line == line && i.span.col == col && i.message.contains(needle))
}

#[test]
fn yaml_errors_point_at_the_key_or_value() {
    let d = yaml_errors(
        "pipeline: p\nsource:\n  kind: file\n  path: x\nsink:\n  type: debug\ntables:\n  - source: t\n    target: t\n    primaryKeys: [id]\n",
    );
    assert!(
        located(&d, 10, 5, "unknown key `primaryKeys`"),
        "{}",
        common::show(&d)
    );
    assert!(
        d.items[0].help.as_deref() == Some("did you mean `primaryKey`?"),
        "{:?}",
        d.items[0]
    );

    let d = yaml_errors(
        "pipeline: p\nsource: {kind: file, path: x}\nsink: {type: debug}\ntables:\n  - source: t\n    target: t\n    cast:\n      amount: decimal(50,2)\n",
    );
    assert!(located(&d, 8, 22, "out of range"), "{}", common::show(&d));

    let d = yaml_errors(
        "pipeline: p\nsource: {kind: file, path: x}\nsink: {type: debug}\ntables:\n  - source: t\n    target: t\n    metadata:\n      - {from: commit_time, as: c}\n",
    );
    assert!(
        located(&d, 8, 16, "unknown metadata column `commit_time`"),
        "{}",
        common::show(&d)
    );

    let d = yaml_errors(
        "pipeline: p\nsource: {kind: file, path: x}\nsink: {type: debug}\ntables:\n  - source: t\n    target: t\n    filter: \"status <> \"\n",
    );
    assert!(
        d.items.iter().any(|i| i.span.line == 7),
        "{}",
        common::show(&d)
    );

    let d = yaml_errors("pipeline: p\nsource: [1]\n");
    assert!(
        located(&d, 2, 9, "source must be a mapping"),
        "{}",
        common::show(&d)
    );

    let d = yaml_errors("pipeline: p\n  bad: : indent\n");
    assert!(
        d.items[0].message.starts_with("invalid YAML"),
        "{}",
        common::show(&d)
    );
}

#[tokio::test]
async fn yaml_filter_tree_and_workers_compile_like_sql() {
    let yaml = "pipeline: p
source: {name: s, kind: file, path: x.jsonl}
sink: {name: m, type: memory, store: st}
tables:
  - source: t
    target: t
    primaryKey: [id]
    columns: {id: bigint, status: varchar, n: int}
    filter:
      all:
        - where: {col: status, op: in, value: [new, paid]}
        - not: {where: {col: n, op: is_null}}
    workers: {number: 1}
";
    let sql = "CREATE PIPELINE p;
CREATE SOURCE s FROM file WITH (path = 'x.jsonl');
CREATE SINK m INTO memory WITH (store = 'st');
CREATE TABLE s.t (id BIGINT NOT NULL, status VARCHAR, n INT, PRIMARY KEY (id));
CREATE TABLE m.t WITH (primary_key = 'id', workers = 1) AS
SELECT * FROM s.t WHERE (status IN ('new', 'paid') AND (NOT n IS NULL));
";
    let registry = common::registry();
    let a = plan_pipeline(
        urutau_sql::parse_pipeline_yaml(yaml, "p", &|_| None).unwrap(),
        &registry,
    )
    .await
    .unwrap_or_else(|d| panic!("{}", common::show(&d)));
    let b = plan_pipeline(
        urutau_sql::parse_pipeline_sql(sql, "p", &|_| None).unwrap(),
        &registry,
    )
    .await
    .unwrap_or_else(|d| panic!("{}", common::show(&d)));
    assert_eq!(a.describe(&registry), b.describe(&registry));
    assert!(
        a.explain(ExplainFormat::Indent)
            .contains("ChangeFilterExec")
    );
}

fn sql_errors(text: &str) -> Diagnostics {
    urutau_sql::parse_pipeline_sql(text, "t", &|_| None).expect_err("the SQL must be refused")
}

#[tokio::test]
async fn sql_routes_are_per_row_maps() {
    let head = "CREATE SOURCE s FROM file WITH (path = 'x');\nCREATE SINK m INTO memory;\nCREATE TABLE s.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id)); CREATE TABLE s.nokey (id BIGINT, n INT);\n";
    for (route, needle) in [
        (
            "CREATE TABLE m.t AS SELECT id, count(*) AS c FROM s.t;",
            "aggregate functions are not allowed",
        ),
        (
            "CREATE TABLE m.t AS SELECT id, row_number() OVER () AS r FROM s.t;",
            "window functions are not allowed",
        ),
        (
            "CREATE TABLE m.t AS SELECT id FROM s.t GROUP BY id;",
            "GROUP BY is not allowed",
        ),
        (
            "CREATE TABLE m.t AS SELECT t.id FROM s.t JOIN s.u ON true;",
            "JOIN is not allowed",
        ),
        (
            "CREATE TABLE m.t AS SELECT id, TRY_CAST(v AS BIGINT) AS n FROM s.t;",
            "TRY_CAST",
        ),
        (
            "CREATE TABLE m.t AS SELECT id, (SELECT 1) AS one FROM s.t;",
            "subqueries",
        ),
        ("CREATE TABLE m.t AS SELECT id, nope FROM s.t;", "nope"),
        (
            "CREATE TABLE m.t AS SELECT id, upper(v) FROM s.t;",
            "name this expression",
        ),
        (
            "CREATE TABLE m.t AS SELECT id, v AS id FROM s.t;",
            "two columns named `id`",
        ),
        ("CREATE TABLE m.t AS SELECT id FROM t;", "needs its source"),
        (
            "CREATE TABLE m.t AS SELECT v FROM s.t;",
            "the source key column `id` is not in the projection",
        ),
        (
            "CREATE TABLE m.t WITH (write_mode = 'upsert') AS SELECT id, _msg_key AS k FROM s.t;",
            "message metadata, and a file source carries no messages",
        ),
        (
            "CREATE TABLE m.t AS SELECT id FROM s.t WHERE v;",
            "boolean condition",
        ),
        (
            "CREATE TABLE m.t AS SELECT id, n FROM s.nokey;",
            "is upsert but has no key",
        ),
    ] {
        let text = format!("{head}{route}\n");
        let result = match urutau_sql::parse_pipeline_sql(&text, "t", &|_| None) {
            Err(d) => Err(d),
            Ok(spec) => plan_pipeline(spec, &common::registry()).await.map(|_| ()),
        };
        let Err(d) = result else {
            panic!("accepted: {route}")
        };
        assert!(
            d.errors()
                .any(|e| e.message.contains(needle) && e.span.line == 4),
            "{route}: expected `{needle}` on line 4, got:\n{}",
            common::show(&d)
        );
    }
}

#[test]
fn sql_statement_errors_are_located() {
    let d = sql_errors(
        "CREATE SOURCE s FROM file WITH (path = 'x');\nCREATE SINK m INTO memory WITH (store = 'a'\n",
    );
    assert!(
        d.items.iter().any(|i| i.span.line == 3 || i.span.line == 2),
        "{}",
        common::show(&d)
    );
    let d = sql_errors("CREATE SOURCE s FROM file WITH (path = x);\n");
    assert!(
        located(&d, 1, 40, "option values are literals: write 'x'"),
        "{}",
        common::show(&d)
    );
    let d = sql_errors("DROP TABLE x;\n");
    assert!(
        located(&d, 1, 1, "expected a CREATE statement"),
        "{}",
        common::show(&d)
    );
    let d =
        sql_errors("CREATE SOURCE s FROM file WITH (path = env('URUTAU_TEST_SURELY_UNSET'));\n");
    assert!(
        located(
            &d,
            1,
            44,
            "environment variable URUTAU_TEST_SURELY_UNSET is not set"
        ),
        "{}",
        common::show(&d)
    );
}

#[tokio::test]
async fn env_values_are_read_and_remembered() {
    let spec = urutau_sql::parse_pipeline_sql(
        "CREATE SOURCE s FROM file WITH (path = env('P'));",
        "t",
        &|name| (name == "P").then(|| "data.jsonl".to_string()),
    )
    .unwrap();
    let entry = spec.sources[0].options.entry("path").unwrap();
    assert_eq!(entry.value.text, "data.jsonl");
    assert_eq!(entry.value.env.as_deref(), Some("P"));
}

/// A source table's declaration takes the kind's table options
/// (`WITH (topic = ...)`, YAML `topic:`) and Postgres-style array types.
#[tokio::test]
async fn source_tables_take_options_and_array_types() {
    let sql = "CREATE PIPELINE p;
CREATE SOURCE k FROM kafka WITH (brokers = 'b:9092');
CREATE SINK out INTO debug;
CREATE TABLE k.t (id INT NOT NULL, tags TEXT[], m INT[][], PRIMARY KEY (id)) WITH (topic = 'dbz.public.t');
CREATE TABLE out.t AS SELECT * FROM k.t;
";
    let spec = urutau_sql::parse_pipeline_sql(sql, "p.sql", &|_| None).unwrap();
    let t = &spec.source_tables[0];
    assert_eq!(t.options.get("topic"), Some("dbz.public.t"));
    let types: Vec<String> = t.columns.iter().map(|c| c.ty.to_string()).collect();
    assert_eq!(types, ["INT", "LIST<VARCHAR>", "LIST<LIST<INT>>"]);
    let yaml = "pipeline: p
source: {name: k, kind: kafka, brokers: 'b:9092'}
sink: {name: out, type: debug}
tables:
  - source: t
    target: t
    topic: dbz.public.t
    primaryKey: [id]
    columns: {id: int, tags: 'text[]'}
";
    let spec = urutau_sql::parse_pipeline_yaml(yaml, "p.yaml", &|_| None).unwrap();
    assert_eq!(
        spec.source_tables[0].options.get("topic"),
        Some("dbz.public.t")
    );
    // A topic without a declared table has nowhere to go.
    let d = yaml_errors(
        "pipeline: p
source: {name: k, kind: kafka, brokers: 'b:9092'}
sink: {name: out, type: debug}
tables:
  - {source: t, target: t, topic: x}
",
    );
    assert!(
        located(&d, 5, 28, "belongs to a declared table"),
        "{}",
        common::show(&d)
    );
}

/// The Go engine's sink-level `evolveSchema` sets every table's
/// `schema_changes` (a table's own `schemaChanges` wins), as the SQL
/// route option does, for declared tables too.
#[tokio::test]
async fn evolve_schema_is_each_routes_schema_changes() {
    let yaml = "pipeline: p
source: {name: s, kind: postgres, uri: 'postgres://u@127.0.0.1:1/db', slotName: sl}
sink: {name: lake, type: iceberg+sql, uri: 'sqlite://c.db', warehouse: wh, namespace: n, evolveSchema: false}
tables:
  - {source: public.a, target: a, primaryKey: [id]}
  - {source: public.b, target: b, primaryKey: [id], schemaChanges: evolve}
";
    let spec = urutau_sql::parse_pipeline_yaml(yaml, "p", &|_| None).unwrap();
    let policies: Vec<Option<&str>> = spec
        .routes
        .iter()
        .map(|r| r.options.get("schema_changes"))
        .collect();
    assert_eq!(policies, vec![Some("fail"), Some("evolve")]);
    let bad = yaml_errors(&yaml.replace("evolveSchema: false", "evolveSchema: maybe"));
    let on_line = |d: &Diagnostics, line: u32, needle: &str| {
        d.items
            .iter()
            .any(|i| i.span.line == line && i.message.contains(needle))
    };
    assert!(
        on_line(&bad, 3, "evolveSchema is true or false"),
        "{}",
        common::show(&bad)
    );

    // A declared table follows a changed declaration the same way.
    let declared = "CREATE PIPELINE p;
CREATE SOURCE s FROM file WITH (path = 'x.jsonl');
CREATE SINK m INTO memory WITH (store = 'st');
CREATE TABLE s.t (id BIGINT NOT NULL, PRIMARY KEY (id));
CREATE TABLE m.t WITH (primary_key = 'id', schema_changes = 'fail') AS SELECT * FROM s.t;
";
    let plan = plan_pipeline(
        urutau_sql::parse_pipeline_sql(declared, "p", &|_| None).unwrap(),
        &common::registry(),
    )
    .await
    .unwrap_or_else(|d| panic!("{}", common::show(&d)));
    assert_eq!(
        plan.routes[0].target.schema_changes,
        urutau_planner::evolution::SchemaChanges::Fail
    );
    assert!(
        plan.explain(ExplainFormat::Indent)
            .contains("(upsert, schema_changes=fail)")
    );
}
