//! The `urutau` command as a user runs it: plans, validation errors with
//! `file:line:col` and exit codes, runs, redaction of secrets.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn urutau(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(args)
        .current_dir(root())
        .env_remove("URUTAU_LOG")
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn plan_explain_shows_casts_metadata_collapse_and_sink_per_route() {
    let o = urutau(&["plan", "--explain", "examples/quickstart.sql"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    // Both routes, each with its logical and physical plan.
    assert_eq!(text.matches("logical plan:").count(), 2, "{text}");
    assert_eq!(text.matches("physical plan:").count(), 2, "{text}");
    let projections: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("ProjectionExec:"))
        .collect();
    assert_eq!(projections.len(), 2, "{text}");
    // Route 1: the cast is a CAST expression; metadata columns close the list.
    assert!(
        projections[0].contains("CAST(amount@2 AS Decimal128(20, 2)) as amount"),
        "{}",
        projections[0]
    );
    assert!(
        projections[0].ends_with("__commit_ts@8 as committed_at, __op@5 as change_op]"),
        "{}",
        projections[0]
    );
    assert!(
        projections[1].ends_with("__op@3 as change_op, __pos@5 as source_position]"),
        "{}",
        projections[1]
    );
    // The upsert route collapses; the append route does not.
    assert_eq!(text.matches("CollapseExec: key=[id]").count(), 1, "{text}");
    assert!(
        text.contains("IcebergSinkExec: table=bronze.orders, mode=upsert, key=[id]"),
        "{text}"
    );
    assert!(
        text.contains("IcebergSinkExec: table=bronze.customer_changes, mode=append, key=[id]"),
        "{text}"
    );
    assert!(
        text.contains("ChangeFilterExec: status@3 != test, on_miss=delete"),
        "{text}"
    );
    assert!(
        text.contains("FileSourceExec: source=events, table=orders, path=examples/data/shop.jsonl"),
        "{text}"
    );

    // The YAML twin prints the same plans.
    let yaml = urutau(&["plan", "--explain", "examples/quickstart.yaml"]);
    assert_eq!(yaml.status.code(), Some(0), "{}", stderr(&yaml));
    assert_eq!(stdout(&yaml), text);

    // So do the maintenance example's twins.
    let sql = urutau(&["plan", "--explain", "examples/iceberg-maintenance.sql"]);
    let yaml = urutau(&["plan", "--explain", "examples/iceberg-maintenance.yaml"]);
    assert_eq!(sql.status.code(), Some(0), "{}", stderr(&sql));
    assert_eq!(stdout(&yaml), stdout(&sql));
    // The file size and the maintenance that will run show in the plan.
    assert!(
        stdout(&sql).contains(
            "target_file_size=268435456 (snapshots gathered into files of it), maintenance=[compaction every 5m (>= 5 files, 536870912 bytes), snapshot expiry every 10m (keep 1, max age 7d), orphan cleanup every 1h (older than 3d)]"
        ),
        "{}",
        stdout(&sql)
    );

    // The experimenting example prints with the debug sink.
    let debug = urutau(&["plan", "--explain", "examples/debug.sql"]);
    assert!(
        stdout(&debug).contains("DebugSinkExec: table=orders, mode=upsert, key=[id]"),
        "{}",
        stdout(&debug)
    );
}

#[test]
fn plan_explain_tree_format() {
    let o = urutau(&[
        "plan",
        "--explain",
        "--format",
        "tree",
        "examples/quickstart.sql",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for node in [
        "IcebergSinkExec",
        "CollapseExec",
        "ProjectionExec",
        "ChangeFilterExec",
        "FileSourceExec",
    ] {
        assert!(text.contains(node), "{node} missing:\n{text}");
    }
    assert!(text.contains('┌'), "a tree drawing:\n{text}");
}

const SOURCE: &str = "CREATE SOURCE events FROM file WITH (path = 'examples/data/shop.jsonl');
CREATE TABLE events.orders (id BIGINT NOT NULL, amount DECIMAL(12,2), n BIGINT, note VARCHAR, PRIMARY KEY (id));
";

fn check_invalid(file: &str, location: &str, must_contain: &[&str]) {
    let o = urutau(&["validate", file]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{file}:{location}: error:")),
        "expected {file}:{location} in:\n{err}"
    );
    for m in must_contain {
        assert!(err.contains(m), "expected `{m}` in:\n{err}");
    }
}

#[test]
fn validate_rejects_with_location_and_rule() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sink = "CREATE SINK out INTO debug;\n";

    let f = write(
        d,
        "narrow.sql",
        &format!(
            "{SOURCE}{sink}CREATE TABLE out.o AS\nSELECT id,\n       CAST(n AS INT) AS n\nFROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "6:13",
        &["cannot cast n from int64 to int32", "rule: narrowing"],
    );

    let f = write(
        d,
        "parse.sql",
        &format!(
            "{SOURCE}{sink}CREATE TABLE out.o AS SELECT id, note::DATE AS d FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "4:34",
        &["cannot cast note from string to date", "rule: parsing"],
    );

    let f = write(
        d,
        "option.sql",
        &format!(
            "{SOURCE}CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://x.db', namespce = 'b');\nCREATE TABLE lake.o AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "3:60",
        &[
            "unknown option `namespce`",
            "did you mean `namespace`?",
            "rule: options are checked",
        ],
    );

    let f = write(
        d,
        "ch.sql",
        &format!(
            "{SOURCE}CREATE SINK ch INTO clickhouse WITH (\n  uri = 'http://127.0.0.1:8123',\n  maintenance_enabled = true\n);\nCREATE TABLE ch.o AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "5:3",
        &[
            "maintenance is Iceberg-only",
            "rule: sink.maintenance is Iceberg-only",
        ],
    );

    let f = write(
        d,
        "ch.yaml",
        "pipeline: p\nsource:\n  kind: file\n  path: x.jsonl\nsink:\n  type: clickhouse\n  uri: http://127.0.0.1:8123\n  namespace: db\n  maintenance:\n    enabled: true\n    compaction:\n      interval: 5m\ntables:\n  - source: orders\n    target: orders\n    primaryKey: [id]\n    columns: {id: bigint}\n",
    );
    check_invalid(&f, "10:5", &["maintenance is Iceberg-only"]);

    // Iceberg: maintenance that would run nothing, or that this build
    // cannot run, is an error, never a setting that silently does nothing.
    let f = write(
        d,
        "nothing.sql",
        &format!(
            "{SOURCE}CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://x.db', namespace = 'b',\n  maintenance_enabled = true);\nCREATE TABLE lake.o AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "3:13", &["no maintenance is configured"]);

    let f = write(
        d,
        "orphans.sql",
        &format!(
            "{SOURCE}CREATE SINK lake INTO iceberg WITH (catalog = 'rest', uri = 'http://127.0.0.1:1', warehouse = 's3://w/', namespace = 'b',\n  maintenance_enabled = true, maintenance_orphan_cleanup_older_than = '72h');\nCREATE TABLE lake.o AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "3:13", &["orphan cleanup needs a local warehouse"]);

    let f = write(
        d,
        "nokey.sql",
        &format!(
            "{SOURCE}{sink}CREATE TABLE out.o WITH (primary_key = 'note') AS SELECT id, note FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "4:40",
        &[
            "key column `note` is nullable",
            "rule: key columns must be NOT NULL",
        ],
    );

    let f = write(
        d,
        "metakey.sql",
        &format!(
            "{SOURCE}{sink}CREATE TABLE out.o WITH (primary_key = 'op') AS SELECT id, _op AS op FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "4:40", &["key column `op` is a metadata column"]);

    let f = write(
        d,
        "meta.sql",
        &format!(
            "{SOURCE}{sink}CREATE TABLE out.o AS SELECT id, _commit_time AS t FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "4:34", &["did you mean `_commit_ts`?"]);

    let f = write(
        d,
        "cb.sql",
        &format!(
            "{SOURCE}CREATE SINK cb INTO couchbase WITH (uri = 'couchbase://h', bucket = 'b');\nCREATE TABLE cb.o WITH (workers = 4) AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "4:35", &["commit_mode = 'atomic'"]);

    let cb = "CREATE SINK cb INTO couchbase WITH (uri = 'couchbase://h', bucket = 'b');\n";
    let f = write(
        d,
        "cb-reserved.sql",
        &format!(
            "{SOURCE}{cb}CREATE TABLE cb.o AS SELECT id, note AS _urutau FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "4:41",
        &[
            "writes a column named _urutau",
            "rule: Couchbase documents hold the route's metadata columns under the reserved `_urutau` object",
        ],
    );
    let f = write(
        d,
        "cb-maintenance.sql",
        &format!(
            "{SOURCE}CREATE SINK cb INTO couchbase WITH (uri = 'couchbase://h', bucket = 'b',\n  maintenance_enabled = true);\nCREATE TABLE cb.o AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "4:3", &["maintenance is Iceberg-only"]);
    let f = write(
        d,
        "cb-unknown.sql",
        &format!(
            "{SOURCE}CREATE SINK cb INTO couchbase WITH (uri = 'couchbase://h', bucket = 'b', durabilty = 'majority');\nCREATE TABLE cb.o AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "3:74", &["durabilty", "did you mean `durability`?"]);
    let f = write(
        d,
        "cb-durability.sql",
        &format!(
            "{SOURCE}CREATE SINK cb INTO couchbase WITH (uri = 'couchbase://h', bucket = 'b', durability = 'none');\nCREATE TABLE cb.o AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(&f, "3:87", &["durability"]);

    let f = write(
        d,
        "workers.sql",
        &format!(
            "{SOURCE}CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://x.db', namespace = 'b');\nCREATE TABLE lake.o WITH (primary_key = 'id', workers = 3) AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "4:57",
        &[
            "sink kind iceberg does not support partitioned tables (workers > 1) in this build",
            "rule: a setting that cannot take effect is a validation error",
        ],
    );

    let lake = "CREATE SINK out INTO iceberg WITH (uri = 'sqlite://x.db', namespace = 'b');\n";
    let f = write(
        d,
        "idem.sql",
        &format!(
            "{SOURCE}{lake}CREATE TABLE out.o WITH (write_mode = 'append-idempotent') AS SELECT id FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "4:39",
        &[
            "append-idempotent lands the transport coordinate, and the route does not select _stream, _shard, _sequence",
            "help: add _stream, _shard, _sequence to the SELECT",
        ],
    );
    let f = write(
        d,
        "idem-derived.sql",
        &format!(
            "{SOURCE}{lake}CREATE TABLE out.o WITH (write_mode = 'append-idempotent') AS SELECT id, _stream, _shard, _sequence % 10 AS sequence FROM events.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "4:91",
        &[
            "`sequence` is computed from `_sequence`: an append-idempotent route lands the coordinate as it is",
        ],
    );
    let f = write(
        d,
        "idem-pg.sql",
        &format!(
            "CREATE SOURCE db FROM postgres WITH (uri = 'postgres://u@127.0.0.1:1/x', slot = 's');\n{lake}CREATE TABLE out.o WITH (write_mode = 'append-idempotent') AS SELECT id FROM db.public.orders;\n"
        ),
    );
    check_invalid(
        &f,
        "3:39",
        &["append-idempotent needs a transport coordinate, and source `db` (postgres) has none"],
    );

    let f = write(
        d,
        "form.sql",
        &format!("{SOURCE}{sink}CREATE TABLE out.o SELECT id FROM events.orders;\n"),
    );
    check_invalid(&f, "4:20", &["expected `(` or WITH/AS"]);
}

#[test]
fn validate_accepts_valid_files_and_prints_warnings() {
    for f in [
        "examples/quickstart.sql",
        "examples/quickstart.yaml",
        "examples/debug.sql",
        "examples/debug.yaml",
        "examples/iceberg-maintenance.sql",
        "examples/iceberg-maintenance.yaml",
    ] {
        let o = urutau(&["validate", f]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", stderr(&o));
        assert!(stdout(&o).contains(": ok: pipeline"), "{}", stdout(&o));
    }
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "warn.sql",
        &format!(
            "{SOURCE}CREATE SINK ch INTO clickhouse WITH (uri = 'http://127.0.0.1:8123');\nCREATE TABLE ch.o WITH (partition_by = 'id') AS SELECT id FROM events.orders;\n"
        ),
    );
    let o = urutau(&["validate", &f]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "warning: partition_by on ClickHouse makes a batch atomic per partition only"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn run_the_quickstart_to_the_end() {
    let o = urutau(&["run", "examples/debug.sql", "--exit-when-caught-up"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("-- out.orders @ "), "{out}");
    // Order 4 became order 40 (a key change), order 2 left the filter.
    assert!(out.contains("| delete | 4 "), "{out}");
    assert!(out.contains("| upsert | 40 "), "{out}");
    assert!(out.contains("| delete | 2 "), "{out}");
}

#[test]
fn exit_codes() {
    assert_eq!(urutau(&["frobnicate"]).status.code(), Some(2), "usage");
    assert_eq!(
        urutau(&["run", "no/such/file.sql"]).status.code(),
        Some(2),
        "unreadable pipeline"
    );
    let v = urutau(&["version"]);
    assert_eq!(v.status.code(), Some(0));
    assert!(stdout(&v).starts_with("urutau "));

    let dir = tempfile::tempdir().unwrap();
    let data = write(
        dir.path(),
        "bad.jsonl",
        "{\"op\":\"c\",\"after\":{\"id\":\"x\"},\"source\":{\"table\":\"orders\"}}\n",
    );
    let f = write(
        dir.path(),
        "p.sql",
        &format!(
            "CREATE SOURCE s FROM file WITH (path = '{data}');\nCREATE SINK out INTO debug;\nCREATE TABLE s.orders (id BIGINT NOT NULL, PRIMARY KEY (id));\nCREATE TABLE out.o AS SELECT id FROM s.orders;\n"
        ),
    );
    let o = urutau(&["run", &f, "--exit-when-caught-up"]);
    assert_eq!(o.status.code(), Some(1), "runtime failure");
    assert!(
        stderr(&o).contains(&format!(
            "{data}:1: table orders, field `id`: value \"x\" does not fit BIGINT"
        )),
        "{}",
        stderr(&o)
    );
}

#[test]
fn secrets_never_reach_output() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "secret.sql",
        "CREATE SOURCE s FROM file WITH (path = 'examples/data/shop.jsonl');
CREATE SINK lake INTO iceberg WITH (
  catalog = 'rest', uri = 'https://admin:hunter22@catalog.example/api', namespace = 'b',
  client_id = 'me', client_secret = 'topsecret9', retry_timeout = '0s'
);
CREATE TABLE s.orders (id BIGINT NOT NULL, PRIMARY KEY (id));
CREATE TABLE lake.o AS SELECT id FROM s.orders;
",
    );
    for args in [
        vec!["plan", f.as_str()],
        vec!["plan", "--explain", f.as_str()],
        vec!["validate", f.as_str()],
        vec!["run", f.as_str(), "--exit-when-caught-up"],
    ] {
        let o = urutau(&args);
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert!(
            !all.contains("hunter22") && !all.contains("topsecret9"),
            "{args:?} leaked a secret:\n{all}"
        );
    }
    let o = urutau(&["plan", &f]);
    let out = stdout(&o);
    assert!(out.contains("client_secret=***"), "{out}");
    assert!(
        out.contains("uri=https://admin:***@catalog.example/api"),
        "{out}"
    );
    // An unreachable catalog fails at run time, loudly, exit 1, the
    // message naming what failed (and no secret); `retry_timeout = '0s'`
    // fails it at once instead of after 5 minutes of retries.
    let o = urutau(&["run", &f, "--exit-when-caught-up"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("REST catalog"), "{}", stderr(&o));
}

#[test]
fn sigterm_stops_gracefully_with_exit_0() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let data = write(
        dir.path(),
        "tail.jsonl",
        "{\"op\":\"c\",\"after\":{\"id\":1},\"source\":{\"table\":\"orders\"}}\n",
    );
    let f = write(
        dir.path(),
        "p.sql",
        &format!(
            "CREATE PIPELINE p WITH (max_batch_interval = '20ms');\nCREATE SOURCE s FROM file WITH (path = '{data}');\nCREATE SINK out INTO debug;\nCREATE TABLE s.orders (id BIGINT NOT NULL, PRIMARY KEY (id));\nCREATE TABLE out.o AS SELECT id FROM s.orders;\n"
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", &f])
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Tail mode: wait for the first commit, then ask it to stop.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first_commit = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("-- out.o @ "));
    assert!(first_commit.is_some(), "no commit printed");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("stop requested"), "{err}");
    assert!(err.contains("stopped"), "{err}");
}
