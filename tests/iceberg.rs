//! The Iceberg sink against a real SQL catalog (SQLite) and local
//! warehouse, read back by an independent engine (DuckDB's iceberg
//! extension, see tests/harness/iceberg_read.py).

mod common;

use common::run_to_end;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::conformance::{self, SinkUnderTest};
use common::workload::{COLUMNS, Row, append_lines, differences, workload, write_lines};
use serde_json::{Value, json};

/// Where a test's Iceberg tables live.
enum Catalog<'a> {
    /// The SQL catalog on SQLite, warehouse on local disk, under this dir.
    Sql(&'a Path),
    /// The REST catalog of a SeaweedFS server, warehouse on its S3.
    Rest(&'a common::Seaweed),
    /// The SQL catalog on a PostgreSQL server, warehouse on local disk.
    Postgres(&'a common::Postgres, &'a Path),
    /// Apache Iceberg's reference REST server (its JDBC catalog on
    /// SQLite), warehouse on local disk (`file://`) or in a SeaweedFS S3
    /// bucket (the keys vended by the server with each table).
    Reference(&'a common::iceberg_rest::IcebergRest),
}

impl Catalog<'_> {
    fn sink_options(&self) -> String {
        match self {
            Catalog::Sql(dir) => format!(
                "catalog = 'sql', uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/warehouse'",
                d = dir.display()
            ),
            Catalog::Postgres(pg, dir) => format!(
                "catalog = 'sql', uri = '{}', warehouse = '{}/warehouse'",
                pg.uri(),
                dir.display()
            ),
            Catalog::Rest(server) => {
                let (id, secret) = server.credential();
                format!(
                    "catalog = 'rest', uri = '{}', warehouse = '{}', client_id = '{id}', client_secret = '{secret}',
  s3_endpoint = '{}', s3_region = 'us-east-1', s3_path_style = true, s3_access_key_id = '{id}',
  s3_secret_access_key = '{secret}'",
                    server.iceberg_uri(),
                    server.warehouse(),
                    server.s3_endpoint()
                )
            }
            Catalog::Reference(server) => {
                let mut options = format!(
                    "catalog = 'rest', uri = '{}', warehouse = '{}'",
                    server.uri(),
                    server.warehouse_uri()
                );
                if let Some(s3) = server.s3() {
                    // No keys: the server vends them.
                    options.push_str(&format!(
                        ", s3_endpoint = '{}', s3_region = 'us-east-1', s3_path_style = true",
                        s3.endpoint
                    ));
                }
                options
            }
        }
    }

    /// The table's current metadata location.
    async fn location(&self, table: &str) -> String {
        match self {
            Catalog::Sql(dir) => {
                let (ns, name) = table.split_once('.').unwrap();
                common::catalog_metadata_location(&dir.join("catalog.db"), ns, name)
                    .await
                    .expect("the catalog holds the table")
            }
            Catalog::Rest(server) => server.table_metadata(table)["metadata-location"]
                .as_str()
                .unwrap()
                .to_string(),
            Catalog::Postgres(pg, _) => {
                use sqlx::Row;
                let (ns, name) = table.split_once('.').unwrap();
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&pg.uri())
                    .await
                    .unwrap();
                let row = sqlx::query(
                    "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = $1 AND table_name = $2",
                )
                .bind(ns)
                .bind(name)
                .fetch_one(&pool)
                .await
                .expect("the catalog holds the table");
                pool.close().await;
                row.get::<String, _>(0)
            }
            Catalog::Reference(server) => server.load(table).await["metadata-location"]
                .as_str()
                .unwrap()
                .to_string(),
        }
    }

    /// The table's current metadata.
    async fn metadata(&self, table: &str) -> Value {
        match self {
            Catalog::Sql(_) | Catalog::Postgres(..) => metadata_json(&self.location(table).await),
            Catalog::Rest(server) => server.table_metadata(table)["metadata"].clone(),
            Catalog::Reference(server) => server.load(table).await["metadata"].clone(),
        }
    }

    /// The table's rows as DuckDB reads them.
    async fn rows(&self, python: &Path, table: &str, order_by: &str) -> Vec<Value> {
        match self {
            Catalog::Reference(server) if server.s3().is_some() => {
                let out = iceberg_read(
                    python,
                    &server
                        .s3_reader_args(table)
                        .iter()
                        .map(String::as_str)
                        .chain(["--order-by", order_by])
                        .collect::<Vec<_>>(),
                );
                out.lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect()
            }
            Catalog::Sql(_) | Catalog::Postgres(..) | Catalog::Reference(_) => {
                common::duckdb_rows(python, &self.location(table).await, order_by)
            }
            Catalog::Rest(server) => server.rows(table, order_by),
        }
    }
}

/// A pipeline: the file into Iceberg, table `bronze.items`.
fn pipeline(
    dir: &Path,
    data: &Path,
    mode: &str,
    max_rows: usize,
    catalog: &Catalog<'_>,
) -> PathBuf {
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = {max_rows}, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK lake INTO iceberg WITH (
  {options}, namespace = 'bronze'
);
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE lake.items WITH (write_mode = '{mode}') AS SELECT * FROM src.items;
",
        data = data.display(),
        options = catalog.sink_options()
    );
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// The current schema in a table's metadata JSON.
fn current_schema(md: &Value) -> &Value {
    md["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["schema-id"] == md["current-schema-id"])
        .unwrap()
}

fn expected_rows(state: &BTreeMap<i64, Row>) -> Vec<Value> {
    state.values().map(|r| r.read.clone()).collect()
}

fn metadata_json(location: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(location.trim_start_matches("file://")).unwrap())
        .unwrap()
}

/// `text` with `from` replaced by `to`; `from` must be there (a test edit
/// that silently matches nothing would test something else).
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "`{from}` is not in:\n{text}");
    text.replace(from, to)
}

/// The README's quickstart pipeline, one change per commit, into the SQLite
/// catalog `db` and a warehouse in `dir`.
fn quickstart_pipeline(dir: &Path, db: &Path) -> PathBuf {
    let shop = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/shop.jsonl");
    let mut text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart.sql"),
    )
    .unwrap();
    for (from, to) in [
        (
            "CREATE PIPELINE quickstart;",
            "CREATE PIPELINE quickstart WITH (max_batch_rows = 1);".to_string(),
        ),
        (
            "examples/data/shop.jsonl",
            shop.to_str().unwrap().to_string(),
        ),
        (
            "sqlite://warehouse/catalog.db",
            format!("sqlite://{}", db.display()),
        ),
        (
            "warehouse = 'warehouse'",
            format!("warehouse = '{}/wh'", dir.display()),
        ),
    ] {
        text = edit(&text, from, &to);
    }
    let p = dir.join("quickstart.sql");
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test]
async fn quickstart_into_iceberg_is_read_back_by_duckdb() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let md = quickstart_read_back(&python, dir.path(), "").await;
    // Partitioned by day, with global equality deletes (an unpartitioned spec).
    assert_eq!(md["partition-specs"].as_array().unwrap().len(), 2);
}

/// Runs the quickstart (one change per commit, `sink_options` added to the
/// sink), checks DuckDB's read of the result and the position; returns the
/// table's metadata.
async fn quickstart_read_back(python: &Path, dir: &Path, sink_options: &str) -> Value {
    let p = quickstart_pipeline(dir, &dir.join("catalog.db"));
    let text = edit(
        &std::fs::read_to_string(&p).unwrap(),
        "namespace = 'bronze'",
        &format!("namespace = 'bronze'{sink_options}"),
    );
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    let loc = common::catalog_metadata_location(&dir.join("catalog.db"), "bronze", "orders")
        .await
        .expect("the catalog holds the table");
    let rows = common::duckdb_rows(python, &loc, "id");
    let summary: Vec<(i64, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["status"].as_str().unwrap().to_string(),
                r["amount"].to_string(),
            )
        })
        .collect();
    // Updated several times, deleted, re-inserted (1), key changed (4 -> 40),
    // filtered out after an update (2), never in (5: a test order).
    assert_eq!(
        summary,
        vec![
            (1, "new".into(), "\"7.50\"".into()),
            (3, "shipped".into(), "\"110.00\"".into()),
            (6, "new".into(), "null".into()),
            (40, "paid".into(), "\"42.42\"".into()),
        ]
    );
    let md = metadata_json(&loc);
    assert_eq!(md["properties"]["cdc.position"], "5173");
    md
}

/// Compaction of a partitioned table (by day): rows land in their
/// partitions' files, the deletes (global) are gone, the read is unchanged.
#[tokio::test]
async fn compaction_of_a_partitioned_table_keeps_its_rows() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let md = quickstart_read_back(
        &python,
        dir.path(),
        ", maintenance_enabled = true, maintenance_compaction_interval = '0s',
  maintenance_compaction_min_input_files = 2",
    )
    .await;
    let snapshots = md["snapshots"].as_array().unwrap();
    let compactions = snapshots
        .iter()
        .filter(|s| s["summary"]["operation"] == "replace")
        .count();
    assert!(compactions >= 2, "{compactions} compactions");
    assert!(
        snapshots
            .iter()
            .all(|s| s["summary"]["cdc.position"].is_string())
    );
}

/// Compaction by partition group: once only one partition keeps changing,
/// its files are rewritten on their own (the others' files are carried as
/// they are, with their sequence numbers, and the global deletes that still
/// apply to them stay), and the read is unchanged throughout.
#[tokio::test]
async fn compaction_rewrites_only_the_partition_groups_that_need_it() {
    use common::workload::{event, random_row};
    use rand::SeedableRng;
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let mut state = BTreeMap::new();
    let mut lines = Vec::new();
    // Both partitions (ids below 1000, and from 1000), then only the first.
    for id in (1..=20).chain(1001..=1020) {
        let r = random_row(&mut rng, id);
        lines.push(event("c", None, Some(&r), None, 1_700_000_000_000));
        state.insert(id, r);
    }
    for n in 0..40 {
        let id = 1 + n % 20;
        let r = random_row(&mut rng, id);
        lines.push(event(
            "u",
            state.get(&id),
            Some(&r),
            None,
            1_700_000_000_000,
        ));
        state.insert(id, r);
    }
    write_lines(&data, &lines);
    let catalog = Catalog::Sql(dir.path());
    let p = pipeline(dir.path(), &data, "upsert", 2, &catalog);
    let text = edit(
        &edit(
            &std::fs::read_to_string(&p).unwrap(),
            "namespace = 'bronze'",
            "namespace = 'bronze', maintenance_enabled = true,
  maintenance_compaction_interval = '0s', maintenance_compaction_min_input_files = 6",
        ),
        "WITH (write_mode = 'upsert')",
        "WITH (write_mode = 'upsert', partition_by = 'truncate(1000, id)')",
    );
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);

    let md = catalog.metadata("bronze.items").await;
    let replaces: Vec<&Value> = md["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["summary"]["operation"] == "replace")
        .collect();
    // (A compaction that only drops deletes adds no data file.)
    let count =
        |s: &Value, k: &str| -> u64 { s["summary"][k].as_str().map_or(0, |v| v.parse().unwrap()) };
    let partial = replaces
        .iter()
        .filter(|s| {
            let added = count(s, "added-data-files");
            added > 0 && count(s, "total-data-files") > added
        })
        .count();
    assert!(
        partial > 0,
        "a compaction kept another partition's files ({} compactions)",
        replaces.len()
    );
    let read = catalog.rows(&python, "bronze.items", "id").await;
    let problems = differences(&read, &expected_rows(&state));
    assert!(problems.is_empty(), "{problems:#?}");
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "bronze", "items")
        .await
        .unwrap();
    iceberg_read(&python, &["--check-sequence-numbers", &loc]);
}

async fn journal_mode(db: &Path) -> String {
    use sqlx::Row;
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    pool.close().await;
    mode
}

/// A catalog file urutau creates syncs one write-ahead log per commit
/// (not the rollback journal's four syncs); a catalog file that already
/// exists keeps the journal mode its owner chose.
#[tokio::test]
async fn a_created_catalog_uses_wal_and_an_existing_one_keeps_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let created = dir.path().join("created.db");
    run_to_end(&quickstart_pipeline(dir.path(), &created));
    assert_eq!(journal_mode(&created).await, "wal");

    let existing = dir.path().join("existing.db");
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&format!("sqlite://{}?mode=rwc", existing.display()))
        .await
        .unwrap();
    sqlx::query("PRAGMA journal_mode = DELETE")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE kept (x INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let other = tempfile::tempdir().unwrap();
    run_to_end(&quickstart_pipeline(other.path(), &existing));
    assert_eq!(journal_mode(&existing).await, "delete");
    let loc = common::catalog_metadata_location(&existing, "bronze", "orders").await;
    assert!(loc.is_some(), "the existing catalog holds the new table");
}

/// The conformance suite's view of one catalog (tables in `bronze`), read
/// by DuckDB.
struct UnderTest<'a> {
    python: &'a Path,
    catalog: &'a Catalog<'a>,
    /// Sink options besides the catalog's (maintenance).
    extra: &'a str,
    /// Route options besides the write mode (`, partition_by = '...'`).
    route: &'a str,
}

impl SinkUnderTest for UnderTest<'_> {
    fn create_sink(&self) -> String {
        format!(
            "CREATE SINK s INTO iceberg WITH (\n  {}, namespace = 'bronze'{}\n);",
            self.catalog.sink_options(),
            self.extra
        )
    }
    async fn rows(&self, table: &str, _keys: i64) -> Vec<Value> {
        self.catalog
            .rows(self.python, &format!("bronze.{table}"), "id")
            .await
    }
    fn expected(&self, row: &Row, _op: &str) -> Value {
        row.read.clone()
    }
    fn route_options(&self) -> String {
        self.route.to_string()
    }
    async fn position(&self, table: &str) -> Option<String> {
        let md = self.catalog.metadata(&format!("bronze.{table}")).await;
        md["properties"]["cdc.position"]
            .as_str()
            .map(str::to_string)
    }
}

/// The acceptance suite: the conformance suite's seeded stream (50k
/// changes over 5k keys, killed with SIGKILL five times, then run to the
/// end, DuckDB's read equal to the oracle), and what Iceberg adds: every
/// snapshot carries the position, the property is the newest one, and a
/// re-run makes no metadata version.
async fn random_changes_with_kill_9(
    python: &Path,
    dir: &Path,
    catalog: &Catalog<'_>,
    sink_options: &str,
) -> conformance::OracleRun {
    random_changes_with_kill_9_routed(python, dir, catalog, sink_options, "").await
}

/// [`random_changes_with_kill_9`] with `route` options added to the route
/// (`, partition_by = 'bucket(8, id)'`).
async fn random_changes_with_kill_9_routed(
    python: &Path,
    dir: &Path,
    catalog: &Catalog<'_>,
    sink_options: &str,
    route: &str,
) -> conformance::OracleRun {
    let s = UnderTest {
        python,
        catalog,
        extra: sink_options,
        route,
    };
    // A server in a JVM of its own answers a restarted run's first
    // requests later than an in-process or Go catalog, and more so on a
    // busy machine: kills drawn later in the run still land mid-stream
    // (a whole run takes minutes) and after a first commit.
    let pause = match catalog {
        Catalog::Reference(_) => 300..1500,
        _ => 60..700,
    };
    let run = conformance::kill_9_oracle(&s, dir, 20261130, 50_000, 5_000, pause).await;
    let loc = catalog.location("bronze.items").await;

    // Every snapshot carries the position; the property is the newest one.
    let md = catalog.metadata("bronze.items").await;
    let snapshots = md["snapshots"].as_array().unwrap();
    assert!(snapshots.len() > 20);
    assert!(
        snapshots
            .iter()
            .all(|s| s["summary"]["cdc.position"].is_string())
    );
    let current = md["current-snapshot-id"].as_i64().unwrap();
    let newest = snapshots
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap();
    assert_eq!(
        md["properties"]["cdc.position"],
        newest["summary"]["cdc.position"]
    );

    // Iceberg's own Java reader agrees with DuckDB (it reads local
    // warehouses only: not the S3 ones behind REST catalogs).
    if !matches!(catalog, Catalog::Rest(_))
        && !matches!(catalog, Catalog::Reference(s) if s.s3().is_some())
    {
        assert_eq!(
            common::iceberg_java_rows(&loc, "id"),
            catalog.rows(python, "bronze.items", "id").await,
            "Iceberg's Java reader (IcebergGenerics) reads what DuckDB reads"
        );
    }

    // Running again over committed input creates nothing.
    run_to_end(&run.pipeline);
    let again = catalog.location("bronze.items").await;
    assert_eq!(again, loc, "a re-run over committed input must not commit");
    run
}

#[tokio::test]
async fn the_conformance_contract_holds() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::Sql(dir.path());
    let s = UnderTest {
        python: &python,
        catalog: &catalog,
        extra: "",
        route: "",
    };
    conformance::contract(&s).await;
}

#[tokio::test]
async fn random_changes_with_kill_9_end_equal_to_the_oracle() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::Sql(dir.path());
    random_changes_with_kill_9(&python, dir.path(), &catalog, "").await;

    // About 330 commits, each adding a data and a delete manifest: the
    // small ones were merged once 100 of a kind piled up, so the current
    // snapshot lists far fewer than the ~660 commits made (DuckDB's equal
    // read above went through the merged manifests).
    let md = catalog.metadata("bronze.items").await;
    let current = md["current-snapshot-id"].as_i64().unwrap();
    let snapshots = md["snapshots"].as_array().unwrap();
    assert!(snapshots.len() > 250, "{} snapshots", snapshots.len());
    let list = snapshots
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap()["manifest-list"]
        .as_str()
        .unwrap();
    let manifests: usize = iceberg_read(&python, &["--avro-rows", list])
        .trim()
        .parse()
        .unwrap();
    assert!(
        (2..=200).contains(&manifests),
        "the current snapshot lists {manifests} manifests"
    );
    // Merged manifests kept every entry's snapshot id and sequence numbers
    // (read with DuckDB's Avro reader, not ours).
    let location = catalog.location("bronze.items").await;
    iceberg_read(&python, &["--check-sequence-numbers", &location]);
}

/// What tests/harness/iceberg_read.py prints for `args` (it must succeed).
fn iceberg_read(python: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(python)
        .arg(common::harness_script("iceberg_read.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "iceberg_read.py {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The acceptance suite with maintenance after every commit: compaction of
/// a partition group (here the whole table) once 8 files are candidates, expiry keeping the newest
/// 25 snapshots, and (`orphans`, local warehouses) orphan cleanup of any
/// unreferenced file (`older_than = 0s` is safe only because this pipeline
/// is the table's one writer). Still equal to the oracle; the table keeps
/// few delete and data files.
async fn random_changes_with_kill_9_and_maintenance(
    python: &Path,
    dir: &Path,
    catalog: &Catalog<'_>,
    orphans: bool,
) {
    let mut options = ", maintenance_enabled = true,
  maintenance_compaction_interval = '0s', maintenance_compaction_min_input_files = 8,
  maintenance_snapshot_expiry_interval = '0s', maintenance_snapshot_expiry_retain_last = 25,
  maintenance_snapshot_expiry_max_age = '0s'"
        .to_string();
    if orphans {
        // A pass after every commit reads every kept snapshot's manifests
        // (~80% of this run's time on the SQL catalog); on the reference
        // REST server, whose commits cost more, every 2 s keeps the run
        // well within its time limit on a busy machine.
        let interval = match catalog {
            Catalog::Reference(_) => "2s",
            _ => "0s",
        };
        options.push_str(&format!(
            ",\n  maintenance_orphan_cleanup_interval = '{interval}', maintenance_orphan_cleanup_older_than = '0s'",
        ));
    }
    let run = random_changes_with_kill_9(python, dir, catalog, &options).await;
    if orphans {
        // The last pass ran up to an interval before the run's last
        // commit, and left what the commits after it made unreferenced
        // (a count of files that depends on the machine's speed). A run's
        // first commit always takes a turn: one more run, with one more
        // change that leaves the table's rows as they are (a row updated
        // to itself), ends with a pass after the last commit.
        let (_, row) = run.state.iter().next().expect("a live row");
        let same = common::workload::event("u", Some(row), Some(row), None, 1_800_000_000_000);
        append_lines(&run.data, &[same]);
        run_to_end(&run.pipeline);
        let end = std::fs::metadata(&run.data).unwrap().len().to_string();
        assert_eq!(
            catalog.metadata("bronze.items").await["properties"]["cdc.position"],
            end.as_str(),
            "the last run committed the change"
        );
        assert_eq!(
            catalog.rows(python, "bronze.items", "id").await,
            run.rows,
            "a row updated to itself leaves the table as the oracle has it"
        );
    }
    let md = catalog.metadata("bronze.items").await;
    let snapshots = md["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 25);
    assert!(
        snapshots
            .iter()
            .any(|s| s["summary"]["operation"] == "replace"),
        "compactions among the newest snapshots"
    );
    let current = md["current-snapshot-id"].as_i64().unwrap();
    let summary = &snapshots
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .unwrap()["summary"];
    let count = |k: &str| summary[k].as_str().unwrap().parse::<u64>().unwrap();
    assert!(count("total-delete-files") < 8, "{summary}");
    assert!(count("total-data-files") < 10, "{summary}");
    if orphans {
        let on_disk = std::fs::read_dir(dir.join("warehouse/bronze/items/data"))
            .unwrap()
            .count();
        assert!(
            on_disk < 100,
            "orphan cleanup keeps only what the kept snapshots read ({on_disk} files; ~700 written)"
        );
    }
}

#[tokio::test]
async fn random_changes_with_kill_9_and_maintenance_end_equal_to_the_oracle() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::Sql(dir.path());
    random_changes_with_kill_9_and_maintenance(&python, dir.path(), &catalog, true).await;
}

#[tokio::test]
async fn random_changes_with_kill_9_and_maintenance_through_a_rest_catalog_on_s3() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = common::Seaweed::start(&python, &dir.path().join("seaweed"));
    let catalog = Catalog::Rest(&server);
    random_changes_with_kill_9_and_maintenance(&python, dir.path(), &catalog, false).await;
}

#[tokio::test]
async fn random_changes_with_kill_9_through_a_rest_catalog_on_s3() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = common::Seaweed::start(&python, &dir.path().join("seaweed"));
    random_changes_with_kill_9(&python, dir.path(), &Catalog::Rest(&server), "").await;
}

/// Snapshot expiry: a run of many commits with expiry after every commit
/// (interval 0s, max age 0s, keep the newest 3) ends with exactly the 3
/// newest snapshots, the current one among them; DuckDB reads the oracle's
/// state; the position property is intact and a re-run resumes from it
/// (no new snapshot). On a local warehouse the expired snapshots' manifest
/// lists are gone from disk.
async fn snapshot_expiry(python: &Path, dir: &Path, catalog: &Catalog<'_>) {
    let data = dir.join("changes.jsonl");
    let (lines, state) = workload(31, 3_000, 500);
    write_lines(&data, &lines);
    let p = pipeline(dir, &data, "upsert", 100, catalog);
    let text = edit(
        &std::fs::read_to_string(&p).unwrap(),
        "namespace = 'bronze'",
        "namespace = 'bronze', maintenance_enabled = true,
  maintenance_snapshot_expiry_interval = '0s', maintenance_snapshot_expiry_retain_last = 3,
  maintenance_snapshot_expiry_max_age = '0s'",
    );
    std::fs::write(&p, text).unwrap();
    let out = run_to_end(&p);
    let log = String::from_utf8_lossy(&out.stderr);

    let md = catalog.metadata("bronze.items").await;
    let snapshots = md["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 3, "the newest 3 are kept\n{log}");
    let current = md["current-snapshot-id"].as_i64().unwrap();
    assert!(snapshots.iter().any(|s| s["snapshot-id"] == current));
    // The kept ones are a chain ending at the current snapshot.
    let mut id = Some(current);
    for _ in 0..3 {
        let s = snapshots
            .iter()
            .find(|s| s["snapshot-id"].as_i64() == id)
            .expect("the branch's newest snapshots are kept");
        assert!(s["summary"]["cdc.position"].is_string());
        id = s["parent-snapshot-id"].as_i64();
    }
    let history = md["snapshot-log"].as_array().unwrap();
    assert!(history.len() <= 3, "the history lists only kept snapshots");
    let end = std::fs::metadata(&data).unwrap().len().to_string();
    assert_eq!(md["properties"]["cdc.position"], end.as_str());

    let warehouse = match catalog {
        Catalog::Sql(d) => Some(d.join("warehouse")),
        Catalog::Reference(server) => Some(server.warehouse_dir().to_path_buf()),
        _ => None,
    };
    if let Some(warehouse) = warehouse {
        let lists = std::fs::read_dir(warehouse.join("bronze/items/metadata"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                let name = name.to_str().unwrap();
                name.starts_with("snap-") && name.ends_with(".avro")
            })
            .count();
        assert_eq!(lists, 3, "expired manifest lists are deleted");
    }

    let read = catalog.rows(python, "bronze.items", "id").await;
    let problems = differences(&read, &expected_rows(&state));
    assert!(problems.is_empty(), "{problems:#?}");

    // A re-run over committed input resumes from the property: nothing new.
    run_to_end(&p);
    let again = catalog.metadata("bronze.items").await;
    assert_eq!(again["current-snapshot-id"].as_i64(), Some(current));
    assert_eq!(again["snapshots"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn snapshot_expiry_keeps_the_newest_snapshots_and_the_position() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    snapshot_expiry(&python, dir.path(), &Catalog::Sql(dir.path())).await;
}

#[tokio::test]
async fn snapshot_expiry_through_a_rest_catalog_on_s3() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = common::Seaweed::start(&python, &dir.path().join("seaweed"));
    snapshot_expiry(&python, dir.path(), &Catalog::Rest(&server)).await;
}

/// Orphan cleanup (interval 0s, files older than 1h): after a second run,
/// old files nothing references are gone from `data/` and `metadata/`; a
/// young stray file and an old file the table references are kept; DuckDB
/// still reads the oracle's state.
#[tokio::test]
async fn orphan_cleanup_removes_old_unreferenced_files_only() {
    use std::time::{Duration, SystemTime};
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::Sql(dir.path());
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(41, 3_000, 500);
    write_lines(&data, &lines[..2_000]);
    let p = pipeline(dir.path(), &data, "upsert", 100, &catalog);
    let text = edit(
        &std::fs::read_to_string(&p).unwrap(),
        "namespace = 'bronze'",
        "namespace = 'bronze', maintenance_enabled = true,
  maintenance_orphan_cleanup_interval = '0s', maintenance_orphan_cleanup_older_than = '1h'",
    );
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);

    let table = dir.path().join("warehouse/bronze/items");
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    let age = |path: &Path| {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();
    };
    let old_strays = [
        table.join("data/stray-old.parquet"),
        table.join("metadata/stray-old.avro"),
        table.join("metadata/99999-stray.metadata.json"),
    ];
    // A metadata file of this table that fell out of the metadata log (a
    // copy of the current one: same table uuid).
    let current =
        common::catalog_metadata_location(&dir.path().join("catalog.db"), "bronze", "items")
            .await
            .unwrap();
    for f in &old_strays {
        if f.to_str().unwrap().ends_with(".metadata.json") {
            std::fs::copy(current.trim_start_matches("file://"), f).unwrap();
        } else {
            std::fs::write(f, "not referenced").unwrap();
        }
        age(f);
    }
    let young_stray = table.join("data/stray-young.parquet");
    std::fs::write(&young_stray, "not referenced, but maybe not committed yet").unwrap();
    // An old file the table references (every snapshot is kept: no expiry).
    let referenced = std::fs::read_dir(table.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("data-")
        })
        .expect("a data file");
    age(&referenced);

    append_lines(&data, &lines[2_000..]);
    run_to_end(&p);

    for f in &old_strays {
        assert!(!f.exists(), "{} is an old orphan", f.display());
    }
    assert!(
        young_stray.exists(),
        "a young file may belong to a commit in flight"
    );
    assert!(referenced.exists(), "a referenced file is never an orphan");
    let read = catalog.rows(&python, "bronze.items", "id").await;
    let problems = differences(&read, &expected_rows(&state));
    assert!(problems.is_empty(), "{problems:#?}");
}

async fn append_once(python: &Path, dir: &Path, catalog: &Catalog<'_>) {
    let data = dir.join("changes.jsonl");
    let (lines, _) = workload(7, 2_000, 300);
    write_lines(&data, &lines);
    let p = pipeline(dir, &data, "append", 150, catalog);
    run_to_end(&p);
    let read = catalog.rows(python, "bronze.items", "id").await;
    assert_eq!(read.len(), lines.len(), "one row per change");
    // Many rows per key: the key identifies no row.
    let md = catalog.metadata("bronze.items").await;
    let schema = current_schema(&md);
    assert!(
        schema["identifier-field-ids"]
            .as_array()
            .is_none_or(|ids| ids.is_empty()),
        "{schema}"
    );
    run_to_end(&p);
    assert_eq!(
        catalog.rows(python, "bronze.items", "id").await.len(),
        lines.len(),
        "a re-run adds nothing"
    );
}

/// The change files of [`append_idempotent_lands_each_change_once_by_its_coordinate`]
/// and every change's coordinate and meaning: `(file, line offset, id, op)`.
fn coordinated_changes(
    dir: &Path,
    lines: &[String],
    files: usize,
) -> Vec<(String, i64, i64, String)> {
    std::fs::create_dir_all(dir).unwrap();
    let per_file = lines.len().div_ceil(files);
    let mut expected = Vec::new();
    for (n, part) in lines.chunks(per_file).enumerate() {
        let name = format!("changes-{n}.jsonl");
        write_lines(&dir.join(&name), part);
        let mut offset = 0i64;
        for line in part {
            let event: Value = serde_json::from_str(line).unwrap();
            let (image, op) = match event["op"].as_str().unwrap() {
                "d" => ("before", "delete"),
                "u" => ("after", "update"),
                _ => ("after", "insert"),
            };
            let id = event[image]["id"].as_i64().unwrap();
            expected.push((name.clone(), offset, id, op.to_string()));
            offset += line.len() as i64 + 1;
        }
    }
    expected
}

/// `append-idempotent`: every change lands once, carrying its coordinate,
/// through kill -9s at any point and a replay forced through the source; a
/// duplicate would show as two rows with one coordinate in DuckDB's read.
#[tokio::test]
async fn append_idempotent_lands_each_change_once_by_its_coordinate() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes");
    let (lines, state) = workload(23, 20_000, 1_500);
    let expected = coordinated_changes(&data, &lines, 3);
    let catalog = Catalog::Sql(dir.path());
    // Two tables of one source commit apart: after a kill, the one ahead is
    // sent the other's replay, and must not land it twice.
    let text = format!(
        "CREATE PIPELINE it WITH (max_batch_rows = 100, progress_interval = '1h');
CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK lake INTO iceberg WITH ({options}, namespace = 'bronze');
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE lake.items AS SELECT * FROM src.items;
CREATE TABLE lake.log WITH (write_mode = 'append-idempotent') AS
  SELECT id, _op AS op, _stream AS stream, _shard AS shard, _sequence AS seq FROM src.items;
",
        data = data.display(),
        options = catalog.sink_options()
    );
    let p = dir.path().join("p.sql");
    std::fs::write(&p, text).unwrap();
    let plan = common::urutau(&["plan", "--explain", p.to_str().unwrap()]);
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(
        plan.contains("IcebergSinkExec: table=bronze.log, mode=append-idempotent, key=[id], coordinate=[stream, shard, seq]"),
        "{plan}"
    );
    common::kill_9_runs(&p, 23, 5, 100..600);
    run_to_end(&p);

    let log_rows = |python: &Path, loc: &str| -> Vec<(String, i64, i64, String)> {
        common::duckdb_rows(python, loc, "stream, seq")
            .iter()
            .map(|r| {
                assert_eq!(r["shard"], json!(0), "a change file is one shard: {r}");
                (
                    r["stream"].as_str().unwrap().to_string(),
                    r["seq"].as_i64().unwrap(),
                    r["id"].as_i64().unwrap(),
                    r["op"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let db = dir.path().join("catalog.db");
    let log_loc = common::catalog_metadata_location(&db, "bronze", "log")
        .await
        .unwrap();
    let read = log_rows(&python, &log_loc);
    let mut seen = std::collections::HashSet::new();
    let duplicates: Vec<_> = read
        .iter()
        .filter(|r| !seen.insert((r.0.clone(), r.1)))
        .collect();
    assert!(
        duplicates.is_empty(),
        "{} duplicated coordinates, first: {:?}",
        duplicates.len(),
        &duplicates[..duplicates.len().min(5)]
    );
    assert_eq!(read.len(), expected.len(), "one row per change");
    assert!(read == expected, "every change, by its coordinate");
    // The table is sorted by the coordinate (the order rows arrive in).
    let log_md = metadata_json(&log_loc);
    let schema = current_schema(&log_md);
    let order = log_md["sort-orders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["order-id"] == log_md["default-sort-order-id"])
        .unwrap();
    let sorted_by: Vec<&str> = order["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            schema["fields"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["id"] == f["source-id"])
                .unwrap()["name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(sorted_by, ["stream", "shard", "seq"]);
    let items_loc = common::catalog_metadata_location(&db, "bronze", "items")
        .await
        .unwrap();
    let problems = differences(
        &common::duckdb_rows(&python, &items_loc, "id"),
        &expected_rows(&state),
    );
    assert!(problems.is_empty(), "{problems:#?}");

    // Force a replay: roll `items` back to an older snapshot. The run
    // resumes from there, so `log` is sent changes it already holds.
    let items_md = metadata_json(&items_loc);
    let mut snapshots = items_md["snapshots"].as_array().unwrap().clone();
    snapshots.sort_by_key(|s| s["sequence-number"].as_i64());
    let older = snapshots[snapshots.len() / 3]["snapshot-id"]
        .as_i64()
        .unwrap();
    rewrite_metadata(&db, "bronze", "items", |md| {
        md["properties"]
            .as_object_mut()
            .unwrap()
            .remove("cdc.position");
        md["current-snapshot-id"] = json!(older);
        md["refs"]["main"]["snapshot-id"] = json!(older);
    })
    .await;
    let log_snapshots = metadata_json(&log_loc)["snapshots"]
        .as_array()
        .unwrap()
        .len();
    run_to_end(&p);
    let items_after = common::catalog_metadata_location(&db, "bronze", "items")
        .await
        .unwrap();
    assert!(
        metadata_json(&items_after)["snapshots"]
            .as_array()
            .unwrap()
            .len()
            > snapshots.len(),
        "the rolled-back table was replayed into"
    );
    let log_after = common::catalog_metadata_location(&db, "bronze", "log")
        .await
        .unwrap();
    assert_eq!(
        metadata_json(&log_after)["snapshots"]
            .as_array()
            .unwrap()
            .len(),
        log_snapshots,
        "the replay commits nothing to the table that holds it"
    );
    assert!(log_rows(&python, &log_after) == expected, "and adds no row");
}

#[tokio::test]
async fn append_records_every_change_once() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    append_once(&python, dir.path(), &Catalog::Sql(dir.path())).await;
}

#[tokio::test]
async fn random_changes_with_kill_9_through_a_sql_catalog_on_postgres() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let pg = common::Postgres::start(&dir.path().join("pg"));
    random_changes_with_kill_9(&python, dir.path(), &Catalog::Postgres(&pg, dir.path()), "").await;
}

#[tokio::test]
async fn append_records_every_change_once_through_a_rest_catalog_on_s3() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = common::Seaweed::start(&python, &dir.path().join("seaweed"));
    append_once(&python, dir.path(), &Catalog::Rest(&server)).await;
}

/// A declaration that changed between runs: with `schema_changes =
/// 'fail'` a table that no longer matches is an error naming the columns;
/// by default the table is evolved (`qty` promoted in place, its field id
/// kept) and keeps every row, as DuckDB reads it.
#[tokio::test]
async fn an_existing_table_that_does_not_match_is_refused_or_evolved() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(3, 50, 20);
    write_lines(&data, &lines);
    let p = pipeline(dir.path(), &data, "upsert", 100, &Catalog::Sql(dir.path()));
    run_to_end(&p);
    let loc = Catalog::Sql(dir.path()).location("bronze.items").await;
    let before = common::duckdb_rows(&python, &loc, "id");
    // The same table, now routed with another type for `qty`.
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("qty INT", "qty BIGINT");
    std::fs::write(
        &p,
        text.replace(
            "(write_mode = 'upsert')",
            "(write_mode = 'upsert', schema_changes = 'fail')",
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--exit-when-caught-up"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("column `qty` is int in the table, and the route writes long"),
        "{err}"
    );
    std::fs::write(&p, &text).unwrap();
    run_to_end(&p);
    let loc = Catalog::Sql(dir.path()).location("bronze.items").await;
    let md: Value =
        serde_json::from_str(&std::fs::read_to_string(loc.trim_start_matches("file://")).unwrap())
            .unwrap();
    let qty = |schema: &Value| {
        schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "qty")
            .cloned()
            .unwrap()
    };
    let now = qty(current_schema(&md));
    assert_eq!(now["type"], "long");
    assert_eq!(
        now["id"],
        qty(&md["schemas"][0])["id"],
        "the field id is kept"
    );
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), before);
}

#[tokio::test]
async fn every_canonical_kind_round_trips_through_duckdb() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("kinds.jsonl");
    let max = json!({
        "id": 1, "b": true, "i": i32::MIN, "u": u64::MAX, "r": 1.5, "d": -0.0,
        "n": "9999999999999999999999999999.9999999999", "s": "ünï \"q\"", "bin": "AP8=", "fx": "3q2+7w==",
        "dt": "1969-12-31", "tm": "23:59:59.999999", "ts": "1969-12-31T23:59:59.999999",
        "tz": "1900-01-01T00:00:00.000001+02:00", "uid": "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
        "j": "{\"a\":[1,2]}", "st": {"a": 7, "b": ["x", null]}, "l": [i64::MAX, null], "m": {"k": 0.25, "z": null}
    });
    let nulls = json!({"id": 2});
    write_lines(
        &data,
        &[
            json!({"op": "c", "after": max, "source": {"table": "kinds"}}).to_string(),
            json!({"op": "c", "after": nulls, "source": {"table": "kinds"}}).to_string(),
        ],
    );
    let text = format!(
        "CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{dir}/catalog.db', warehouse = '{dir}/wh', namespace = 'k');
CREATE TABLE src.kinds (id BIGINT NOT NULL, b BOOLEAN, i INT, u UBIGINT, r REAL, d DOUBLE, n DECIMAL(38,10),
  s VARCHAR, bin BYTEA, fx FIXED(4), dt DATE, tm TIME, ts TIMESTAMP, tz TIMESTAMPTZ, uid UUID, j JSON,
  st STRUCT<a INT, b LIST<VARCHAR>>, l LIST<BIGINT>, m MAP<VARCHAR, DOUBLE>, PRIMARY KEY (id));
CREATE TABLE lake.kinds AS SELECT * FROM src.kinds;
",
        data = data.display(),
        dir = dir.path().display()
    );
    let p = dir.path().join("k.sql");
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "k", "kinds")
        .await
        .unwrap();
    let rows = common::duckdb_rows(&python, &loc, "id");
    assert_eq!(
        rows[0],
        json!({
            "id": 1, "b": true, "i": i32::MIN, "u": "18446744073709551615", "r": 1.5, "d": -0.0,
            "n": "9999999999999999999999999999.9999999999", "s": "ünï \"q\"", "bin": "00ff", "fx": "deadbeef",
            "dt": "1969-12-31", "tm": "23:59:59.999999", "ts": "1969-12-31T23:59:59.999999",
            "tz": "1899-12-31T22:00:00.000001+00:00", "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "j": "{\"a\":[1,2]}", "st": {"a": 7, "b": ["x", null]}, "l": [i64::MAX, null],
            "m": {"keys": ["k", "z"], "values": [0.25, null]}
        })
    );
    let expected_nulls: serde_json::Map<String, Value> = rows[1]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, _)| (k.clone(), if k == "id" { json!(2) } else { Value::Null }))
        .collect();
    assert_eq!(rows[1], Value::Object(expected_nulls));
    // Iceberg's own Java reader reads every kind as DuckDB does.
    assert_eq!(
        common::iceberg_java_rows(&loc, "id"),
        rows,
        "Iceberg's Java reader (IcebergGenerics) reads what DuckDB reads"
    );
    // uint64 lands as decimal(20,0), uuid as uuid, fixed as fixed[4].
    let md = metadata_json(&loc);
    let fields = &md["schemas"][0]["fields"];
    let ty = |name: &str| {
        fields
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap()["type"]
            .clone()
    };
    assert_eq!(ty("u"), "decimal(20, 0)");
    assert_eq!(ty("uid"), "uuid");
    assert_eq!(ty("fx"), "fixed[4]");
    assert_eq!(ty("tz"), "timestamptz");
    assert_eq!(ty("m")["type"], "map");
}

/// Points the catalog at a metadata file edited by `edit` (what a rollback
/// or another engine's commit would leave behind).
async fn rewrite_metadata(
    db: &Path,
    namespace: &str,
    table: &str,
    edit: impl FnOnce(&mut Value),
) -> String {
    let old = common::catalog_metadata_location(db, namespace, table)
        .await
        .unwrap();
    let mut md = metadata_json(&old);
    edit(&mut md);
    let path = old.trim_start_matches("file://");
    let dir = Path::new(path).parent().unwrap();
    let version: u32 = Path::new(path).file_name().unwrap().to_str().unwrap()[..5]
        .parse()
        .unwrap();
    let new = dir.join(format!(
        "{:05}-{}.metadata.json",
        version + 1,
        uuid::Uuid::new_v4()
    ));
    std::fs::write(&new, serde_json::to_vec(&md).unwrap()).unwrap();
    let url = format!("sqlite://{}", db.display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect(&url)
        .await
        .unwrap();
    let done =
        sqlx::query("UPDATE iceberg_tables SET metadata_location = ? WHERE metadata_location = ?")
            .bind(new.display().to_string())
            .bind(&old)
            .execute(&pool)
            .await
            .unwrap();
    assert_eq!(done.rows_affected(), 1);
    pool.close().await;
    new.display().to_string()
}

fn resumed_from(pipeline: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args([
            "run",
            pipeline.to_str().unwrap(),
            "--exit-when-caught-up",
            "--log-format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "resuming")
        .map(|l| l["fields"]["position"].as_str().unwrap().to_string())
        .expect("a resuming line")
}

#[tokio::test]
async fn resume_reads_the_property_or_walks_the_branch_after_a_rollback() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, state) = workload(11, 3_000, 400);
    write_lines(&data, &lines);
    let p = pipeline(dir.path(), &data, "upsert", 200, &Catalog::Sql(dir.path()));
    let db = dir.path().join("catalog.db");
    run_to_end(&p);
    let loc = common::catalog_metadata_location(&db, "bronze", "items")
        .await
        .unwrap();
    let md = metadata_json(&loc);
    let end = md["properties"]["cdc.position"]
        .as_str()
        .unwrap()
        .to_string();

    // The property: O(1), no manifest read.
    assert_eq!(resumed_from(&p), end);

    // No property: the newest summary on the branch.
    rewrite_metadata(&db, "bronze", "items", |md| {
        md["properties"]
            .as_object_mut()
            .unwrap()
            .remove("cdc.position");
    })
    .await;
    assert_eq!(resumed_from(&p), end);

    // Roll the branch back to an older snapshot, without the property: the
    // walk follows the branch's ancestry, not the newest snapshot in the
    // list, and the run replays from there to the same final state.
    let mut snapshots = md["snapshots"].as_array().unwrap().clone();
    snapshots.sort_by_key(|s| s["sequence-number"].as_i64());
    let older = &snapshots[snapshots.len() / 2];
    let older_id = older["snapshot-id"].as_i64().unwrap();
    let older_position = older["summary"]["cdc.position"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(older_position, end);
    rewrite_metadata(&db, "bronze", "items", |md| {
        md["properties"]
            .as_object_mut()
            .unwrap()
            .remove("cdc.position");
        md["current-snapshot-id"] = json!(older_id);
        md["refs"]["main"]["snapshot-id"] = json!(older_id);
    })
    .await;
    assert_eq!(resumed_from(&p), older_position);
    let loc = common::catalog_metadata_location(&db, "bronze", "items")
        .await
        .unwrap();
    let read = common::duckdb_rows(&python, &loc, "id");
    let problems = differences(&read, &expected_rows(&state));
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A pipeline of one upsert table `lake.t (id, v)` into the SQLite catalog
/// under `dir`, namespace `ns`: for tests that drive the sink's API.
fn id_v_pipeline(dir: &Path, ns: &str) -> String {
    format!(
        "CREATE SOURCE src FROM file WITH (path = '/dev/null');
CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/wh', namespace = '{ns}');
CREATE TABLE src.t (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
CREATE TABLE lake.t AS SELECT id, v FROM src.t;",
        d = dir.display()
    )
}

/// A batch of `(id, v, deleted)` rows for [`id_v_pipeline`]'s table.
fn id_v_batch(
    schema: arrow::datatypes::SchemaRef,
    rows: &[(i64, &str, bool)],
) -> urutau_planner::sink::SinkBatch {
    use arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray};
    urutau_planner::sink::SinkBatch {
        rows: arrow::array::RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))) as ArrayRef,
            ],
        )
        .unwrap(),
        deletes: BooleanArray::from_iter(rows.iter().map(|r| Some(r.2))),
    }
}

/// Two plans of one pipeline writing one table (two writers), each with
/// the table prepared.
async fn two_writers(
    text: &str,
) -> (
    urutau_planner::plan::PipelinePlan,
    urutau_planner::plan::PipelinePlan,
) {
    let a = common::plan_sql(text).await.unwrap();
    let b = common::plan_sql(text).await.unwrap();
    for p in [&a, &b] {
        p.routes[0]
            .sink
            .ensure_table(&p.routes[0].target)
            .await
            .unwrap();
    }
    (a, b)
}

/// Stage one of the sink node for a batch: prepared (deferrable or not),
/// not committed yet.
async fn prepare(
    sink: &dyn urutau_planner::sink::Sink,
    target: &urutau_planner::target::TargetTable,
    batch: urutau_planner::sink::SinkBatch,
    may_defer: bool,
) -> urutau_planner::sink::PreparedBatch {
    sink.prepare(target, batch, may_defer).await.unwrap()
}

/// Stage two of the sink node: `prepared` committed at `position`; what
/// the sink did.
async fn commit_prepared(
    sink: &dyn urutau_planner::sink::Sink,
    target: &urutau_planner::target::TargetTable,
    prepared: urutau_planner::sink::PreparedBatch,
    position: &str,
) -> urutau_planner::sink::Committed {
    sink.commit_prepared(target, prepared, position)
        .await
        .unwrap()
}

/// What the sink node does with a batch: prepares it (deferrable or not)
/// and commits it at `position`; what the sink did.
async fn prepare_and_commit(
    sink: &dyn urutau_planner::sink::Sink,
    target: &urutau_planner::target::TargetTable,
    batch: urutau_planner::sink::SinkBatch,
    may_defer: bool,
    position: &str,
) -> urutau_planner::sink::Committed {
    let prepared = prepare(sink, target, batch, may_defer).await;
    commit_prepared(sink, target, prepared, position).await
}

/// Two sinks writing one table: the second's commit conflicts, reloads and
/// retries; a commit whose response is lost is found by its id, not
/// committed twice.
#[tokio::test]
async fn commit_conflicts_retry_and_lost_responses_do_not_duplicate() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_writers(&id_v_pipeline(dir.path(), "c")).await;
    let (ra, rb) = (&a.routes[0], &b.routes[0]);
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(ra.target.arrow_schema(), rows);
    ra.sink
        .commit(
            &ra.target,
            &batch(&[(1, "a", false), (2, "a", false)]),
            "10",
        )
        .await
        .unwrap();
    // b's view of the table is stale: its swap conflicts, it reloads, retries.
    rb.sink
        .commit(
            &rb.target,
            &batch(&[(2, "b", false), (3, "b", false)]),
            "20",
        )
        .await
        .unwrap();
    // A lost response: the swap succeeded, the sink was told it failed.
    urutau_sinks::iceberg::faults::lose_next_responses(1);
    rb.sink
        .commit(&rb.target, &batch(&[(1, "b", true)]), "30")
        .await
        .unwrap();

    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "c", "t")
        .await
        .unwrap();
    let rows = common::duckdb_rows(&python, &loc, "id");
    assert_eq!(
        rows,
        vec![json!({"id": 2, "v": "b"}), json!({"id": 3, "v": "b"})]
    );
    let md = metadata_json(&loc);
    assert_eq!(
        md["snapshots"].as_array().unwrap().len(),
        3,
        "one snapshot per commit, none twice"
    );
    assert_eq!(md["properties"]["cdc.position"], "30");
    assert_eq!(
        rb.sink
            .committed_position(&rb.target)
            .await
            .unwrap()
            .as_deref(),
        Some("30")
    );
}

/// Batches prepared ahead of their commits (as the sink node prepares the
/// next batch while committing one) while another writer commits: the
/// prepared batch that wrote key 7 as new learns at its commit that a
/// conflict since showed the other writer's key 7, and deletes it, so the
/// table holds one row per key. A commit of a batch with a key the other
/// writer holds in its files must never leave two rows of it.
#[tokio::test]
async fn a_batch_prepared_before_a_conflict_still_replaces_the_other_writers_key() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_writers(&id_v_pipeline(dir.path(), "p")).await;
    let (ra, rb) = (&a.routes[0], &b.routes[0]);
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(ra.target.arrow_schema(), rows);
    // a prepares two batches of keys it has never seen: both new to it.
    let first = prepare(&*ra.sink, &ra.target, batch(&[(1, "a", false)]), false).await;
    let second = prepare(&*ra.sink, &ra.target, batch(&[(7, "a", false)]), false).await;
    // Meanwhile b commits key 7.
    rb.sink
        .commit(&rb.target, &batch(&[(7, "b", false)]), "5")
        .await
        .unwrap();
    // a's first commit conflicts with b's and takes b's keys in; its own
    // key 1 is not among them.
    commit_prepared(&*ra.sink, &ra.target, first, "10").await;
    // a's second batch was written before that: its commit checks key 7.
    commit_prepared(&*ra.sink, &ra.target, second, "20").await;

    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "p", "t")
        .await
        .unwrap();
    let expected = vec![json!({"id": 1, "v": "a"}), json!({"id": 7, "v": "a"})];
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
    assert_eq!(common::iceberg_java_rows(&loc, "id"), expected);
    let md = metadata_json(&loc);
    assert_eq!(md["properties"]["cdc.position"], "20");
}

/// Orphan cleanup never takes a prepared batch's files: with cleanup after
/// every commit and no age limit, the batch the sink node prepared while
/// the one before it committed (and cleaned) keeps its files, and its
/// commit reads back whole.
#[tokio::test]
async fn orphan_cleanup_leaves_the_files_of_a_batch_prepared_ahead() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let text = id_v_pipeline(dir.path(), "o").replace(
        "namespace = 'o'",
        "namespace = 'o', maintenance_enabled = true, \
         maintenance_orphan_cleanup_interval = '0s', maintenance_orphan_cleanup_older_than = '0s'",
    );
    let plan = common::plan_sql(&text).await.unwrap();
    let r = &plan.routes[0];
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(r.target.arrow_schema(), rows);
    r.sink.ensure_table(&r.target).await.unwrap();
    let first = prepare(
        &*r.sink,
        &r.target,
        batch(&[(1, "a", false), (2, "a", false)]),
        false,
    )
    .await;
    let second = prepare(
        &*r.sink,
        &r.target,
        batch(&[(2, "b", false), (3, "b", false)]),
        false,
    )
    .await;
    // The first commit runs orphan cleanup: the second batch's files are on
    // disk and referenced by no snapshot yet.
    commit_prepared(&*r.sink, &r.target, first, "10").await;
    commit_prepared(&*r.sink, &r.target, second, "20").await;
    // And a commit after both cleans up again with nothing pending.
    r.sink
        .commit(&r.target, &batch(&[(4, "c", false)]), "30")
        .await
        .unwrap();

    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "o", "t")
        .await
        .unwrap();
    let expected = vec![
        json!({"id": 1, "v": "a"}),
        json!({"id": 2, "v": "b"}),
        json!({"id": 3, "v": "b"}),
        json!({"id": 4, "v": "c"}),
    ];
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
    assert_eq!(common::iceberg_java_rows(&loc, "id"), expected);
}

/// A snapshot's deferred batches (the sink node's `may_defer`): the plain
/// appends of several batches go into one data file, the changes to keys
/// the table holds wait beside it, and the batch that may not be deferred
/// commits the lot with its position, the appends first: a later change
/// (key 5 replaced twice, keys 7 and 8 deleted, key 20 replaced) applies
/// to a row appended in the group, and key 100, committed before the
/// group, is replaced. DuckDB and Iceberg's Java reader read exactly the
/// source's state; the manifests show one data file for the 11 appended
/// rows and one for all the held changes (keys 5, 20 and 100's last
/// images: those removed by position and the one removed by equality
/// delete share it). A group never committed leaves nothing: neither one
/// still open nor one staged without its commit.
#[tokio::test]
async fn a_snapshot_group_gathers_appends_into_one_file_and_applies_later_changes_to_them() {
    use urutau_planner::sink::Committed;
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let text = id_v_pipeline(dir.path(), "g");
    let plan = common::plan_sql(&text).await.unwrap();
    let r = &plan.routes[0];
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(r.target.arrow_schema(), rows);
    r.sink.ensure_table(&r.target).await.unwrap();
    r.sink
        .commit(&r.target, &batch(&[(100, "x", false)]), "5")
        .await
        .unwrap();
    let first: Vec<(i64, &str, bool)> = (1..=10).map(|i| (i, "a", false)).collect();
    let deferred = [
        batch(&first),
        batch(&[(5, "x", false), (7, "", true), (20, "a", false)]),
        batch(&[(5, "b", false), (8, "", true), (100, "y", false)]),
    ];
    for (b, position) in deferred.iter().zip(["10", "20", "25"]) {
        let done = prepare_and_commit(&*r.sink, &r.target, b.clone(), true, position).await;
        assert_eq!(done, Committed::Deferred);
    }
    assert_eq!(
        r.sink
            .committed_position(&r.target)
            .await
            .unwrap()
            .as_deref(),
        Some("5"),
        "a deferred batch's position is not committed"
    );
    let closing = batch(&[(20, "c", false)]);
    let done = prepare_and_commit(&*r.sink, &r.target, closing, false, "30").await;
    assert_eq!(done, Committed::Now);

    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "g", "t")
        .await
        .unwrap();
    let mut expected: Vec<Value> = (1..=10)
        .filter(|i| *i != 7 && *i != 8)
        .map(|i| json!({"id": i, "v": if i == 5 { "b" } else { "a" }}))
        .collect();
    expected.push(json!({"id": 20, "v": "c"}));
    expected.push(json!({"id": 100, "v": "y"}));
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
    assert_eq!(common::iceberg_java_rows(&loc, "id"), expected);
    let live_files = common::duckdb_live_files(&python, &loc);
    let mut data_rows: Vec<i64> = live_files
        .iter()
        .filter(|f| f["content"] == 0)
        .map(|f| f["records"].as_i64().unwrap())
        .collect();
    data_rows.sort();
    // Key 100's first image; the held changes with the closing batch's,
    // collapsed, in one file: the last images of keys 5, 20 and 100; the
    // group: keys 1-10 and 20.
    assert_eq!(data_rows, vec![1, 3, 11]);
    let mut delete_kinds: Vec<i64> = live_files
        .iter()
        .filter(|f| f["content"] != 0)
        .map(|f| f["content"].as_i64().unwrap())
        .collect();
    delete_kinds.sort();
    // Keys 5, 7, 8 and 20 of the group's file by position; key 100 by
    // equality.
    assert_eq!(delete_kinds, vec![1, 2]);
    assert_eq!(metadata_json(&loc)["properties"]["cdc.position"], "30");

    // A group staged without its commit, and one still open, then the run
    // ends: the next run's sink sees the table as committed.
    let round = [
        (batch(&[(200, "n", false), (201, "n", false)]), "40"),
        (batch(&[(5, "q", false), (202, "n", false)]), "45"),
    ];
    for (rows, position) in round {
        let done = prepare_and_commit(&*r.sink, &r.target, rows, true, position).await;
        assert_eq!(done, Committed::Deferred);
    }
    let staged = prepare(&*r.sink, &r.target, batch(&[(8, "z", false)]), false).await;
    r.sink.stage_prepared(&r.target, staged).await.unwrap();
    let open = batch(&[(300, "n", false)]);
    let done = prepare_and_commit(&*r.sink, &r.target, open, true, "50").await;
    assert_eq!(done, Committed::Deferred);
    drop(plan);
    let again = common::plan_sql(&text).await.unwrap();
    let r = &again.routes[0];
    r.sink.ensure_table(&r.target).await.unwrap();
    assert_eq!(
        r.sink
            .committed_position(&r.target)
            .await
            .unwrap()
            .as_deref(),
        Some("30")
    );
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "g", "t")
        .await
        .unwrap();
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
}

/// A snapshot group meets a delete of a key neither the table nor the
/// group holds, then that key inserted again (the source deleted a row
/// the snapshot had not copied yet, then inserted it anew): the delete
/// does nothing and the re-inserted row stays. (Held, the delete was
/// written after the group's appends and deleted the re-insert: a row
/// lost in CI by `added_widened_dropped_and_renamed_columns_land_through_kill_9`.)
/// A delete of a key the group appended still deletes it.
#[tokio::test]
async fn a_snapshot_group_keeps_a_key_inserted_after_a_delete_of_it_it_never_held() {
    use urutau_planner::sink::Committed;
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let text = id_v_pipeline(dir.path(), "d");
    let plan = common::plan_sql(&text).await.unwrap();
    let r = &plan.routes[0];
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(r.target.arrow_schema(), rows);
    r.sink.ensure_table(&r.target).await.unwrap();
    let deferred = [
        batch(&[(1, "a", false), (2, "a", false), (3, "a", false)]),
        batch(&[(50, "", true), (2, "", true)]),
        batch(&[(50, "r", false), (4, "a", false)]),
    ];
    for (b, position) in deferred.iter().zip(["10", "20", "30"]) {
        let done = prepare_and_commit(&*r.sink, &r.target, b.clone(), true, position).await;
        assert_eq!(done, Committed::Deferred);
    }
    let closing = batch(&[(3, "c", false)]);
    let done = prepare_and_commit(&*r.sink, &r.target, closing, false, "40").await;
    assert_eq!(done, Committed::Now);

    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "d", "t")
        .await
        .unwrap();
    let expected = vec![
        json!({"id": 1, "v": "a"}),
        json!({"id": 3, "v": "c"}),
        json!({"id": 4, "v": "a"}),
        json!({"id": 50, "v": "r"}),
    ];
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
    assert_eq!(common::iceberg_java_rows(&loc, "id"), expected);
}

/// The record counts of the live files of `content` (0 data, 1 position
/// deletes, 2 equality deletes) in the table at `loc`, as DuckDB lists
/// them.
fn live_file_records(python: &Path, loc: &str, content: i64) -> Vec<i64> {
    common::duckdb_live_files(python, loc)
        .iter()
        .filter(|f| f["content"] == content)
        .map(|f| f["records"].as_i64().unwrap())
        .collect()
}

/// `lake.t` of the [`id_v_pipeline`] at `p` as `urutau query` reads it
/// (our own reader), ordered by id.
fn query_id_v(p: &Path) -> Vec<Value> {
    let out = common::urutau(&[
        "query",
        p.to_str().unwrap(),
        "SELECT id, v FROM lake.t ORDER BY id",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `text` (an [`id_v_pipeline`]) written to `p` and planned, its table
/// prepared: the pipeline's sink, to commit batches to by hand.
async fn planned_at(p: &Path, text: &str) -> urutau_planner::plan::PipelinePlan {
    std::fs::write(p, text).unwrap();
    let plan = common::plan_sql(text).await.unwrap();
    let r = &plan.routes[0];
    r.sink.ensure_table(&r.target).await.unwrap();
    plan
}

/// DuckDB, Iceberg's Java reader and `urutau query` (our reader) read
/// `lake.t` (metadata at `loc`) of the [`id_v_pipeline`] at `p` as
/// `expected`, ordered by id.
fn assert_every_reader_reads(python: &Path, loc: &str, p: &Path, expected: &[Value], when: &str) {
    assert_eq!(
        common::duckdb_rows(python, loc, "id"),
        expected,
        "DuckDB {when}"
    );
    assert_eq!(
        common::iceberg_java_rows(loc, "id"),
        expected,
        "Java {when}"
    );
    assert_eq!(query_id_v(p), expected, "urutau query {when}");
}

/// Another engine's row-level delete: one position-delete file naming
/// three of the sink's data files (no single referenced data file, as
/// Spark's merge-on-read DELETE writes them), written and committed by
/// Iceberg's Java library through its JdbcCatalog on the same SQLite
/// catalog. `urutau query` applies it as DuckDB and the Java reader do; the
/// sink's next commit (re-inserting a deleted key, updating another) keeps
/// it; and compaction, which refused such a file before, applies it and
/// drops it.
#[tokio::test]
async fn another_engines_position_deletes_of_several_files_are_read_and_compacted() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let text = id_v_pipeline(dir.path(), "fp");
    let p = dir.path().join("p.sql");
    let plan = planned_at(&p, &text).await;
    let r = &plan.routes[0];
    // Three commits: three data files of keys 1-4, 5-8 and 9-12.
    for (first, position) in [(1, "10"), (5, "20"), (9, "30")] {
        let rows: Vec<(i64, &str, bool)> = (first..first + 4).map(|i| (i, "a", false)).collect();
        let batch = id_v_batch(r.target.arrow_schema(), &rows);
        r.sink.commit(&r.target, &batch, position).await.unwrap();
    }
    drop(plan);

    let deleted = common::iceberg_java_position_delete(
        &dir.path().join("catalog.db"),
        &dir.path().join("wh"),
        "lake",
        ("fp", "t"),
        "id",
        &[2, 6, 10],
    );
    assert_eq!(deleted["data_files"], 3, "{deleted}");
    assert_eq!(deleted["deleted"], 3, "{deleted}");
    assert_eq!(deleted["referenced_data_file"], Value::Null, "{deleted}");
    let db = dir.path().join("catalog.db");
    let location = || common::catalog_metadata_location(&db, "fp", "t");
    let loc = location().await.unwrap();
    assert_eq!(live_file_records(&python, &loc, 1), vec![3]);
    let mut expected: Vec<Value> = (1..=12)
        .filter(|i| ![2, 6, 10].contains(i))
        .map(|i| json!({"id": i, "v": "a"}))
        .collect();
    assert_every_reader_reads(&python, &loc, &p, &expected, "");

    // The sink's next commit, with compaction due after it.
    let text = edit(
        &text,
        "namespace = 'fp'",
        "namespace = 'fp', maintenance_enabled = true, maintenance_compaction_interval = '0s', maintenance_compaction_min_input_files = 2",
    );
    let plan = planned_at(&p, &text).await;
    let r = &plan.routes[0];
    let batch = id_v_batch(r.target.arrow_schema(), &[(6, "b", false), (3, "b", false)]);
    r.sink.commit(&r.target, &batch, "40").await.unwrap();
    let loc = location().await.unwrap();
    let md = metadata_json(&loc);
    assert!(
        md["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["summary"]["operation"] == "replace"),
        "compaction ran"
    );
    assert_eq!(md["properties"]["cdc.position"], "40");
    assert_eq!(
        live_file_records(&python, &loc, 1),
        Vec::<i64>::new(),
        "the other engine's position deletes applied and dropped"
    );
    expected = (1..=12)
        .filter(|i| ![2, 10].contains(i))
        .map(|i| json!({"id": i, "v": if i == 3 || i == 6 { "b" } else { "a" }}))
        .collect();
    assert_every_reader_reads(&python, &loc, &p, &expected, "after compaction");
}

/// Compaction converts instead of rewriting: a data file at or above the
/// target size (an initial snapshot's, here one commit of 20,000 rows)
/// that the stream's equality deletes apply to stays, and the rows they
/// remove from it become one position-delete file naming it, while the
/// small files are rewritten and the equality deletes go. DuckDB, Iceberg's
/// Java reader and `urutau query` read the same rows before and after.
#[tokio::test]
async fn compaction_turns_equality_deletes_on_a_large_file_into_its_position_deletes() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let text = id_v_pipeline(dir.path(), "cv");
    let p = dir.path().join("p.sql");
    let plan = planned_at(&p, &text).await;
    let r = &plan.routes[0];
    let values: Vec<String> = (1..=20_000).map(|i| format!("value {i}")).collect();
    let large: Vec<(i64, &str, bool)> = (1..=20_000)
        .map(|i| (i, values[i as usize - 1].as_str(), false))
        .collect();
    r.sink
        .commit(
            &r.target,
            &id_v_batch(r.target.arrow_schema(), &large),
            "10",
        )
        .await
        .unwrap();
    let db = dir.path().join("catalog.db");
    let loc = common::catalog_metadata_location(&db, "cv", "t")
        .await
        .unwrap();
    let large_file = common::duckdb_live_files(&python, &loc)[0]["path"].clone();
    // Updates and a delete of keys in the large file: equality deletes.
    for (rows, position) in [
        (vec![(10, "b", false), (20, "b", false)], "20"),
        (vec![(30, "", true), (10, "c", false)], "30"),
    ] {
        let batch = id_v_batch(r.target.arrow_schema(), &rows);
        r.sink.commit(&r.target, &batch, position).await.unwrap();
    }
    drop(plan);
    let loc = common::catalog_metadata_location(&db, "cv", "t")
        .await
        .unwrap();
    assert_eq!(live_file_records(&python, &loc, 2), vec![2, 2]);
    let expected = |last: &[(i64, &str)]| -> Vec<Value> {
        (1..=20_000i64)
            .filter(|i| *i != 30)
            .map(|i| {
                let v = last
                    .iter()
                    .find(|(k, _)| *k == i)
                    .map_or(format!("value {i}"), |(_, v)| v.to_string());
                json!({"id": i, "v": v})
            })
            .collect()
    };
    let before = expected(&[(10, "c"), (20, "b")]);
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), before);

    // The next commit, with compaction due after it; the target size is
    // below the large file's and above the small ones'.
    let text = edit(
        &text,
        "namespace = 'cv'",
        "namespace = 'cv', maintenance_enabled = true, maintenance_compaction_interval = '0s',
  maintenance_compaction_min_input_files = 3, maintenance_compaction_target_file_size = '16KiB'",
    );
    let plan = planned_at(&p, &text).await;
    let r = &plan.routes[0];
    let batch = id_v_batch(r.target.arrow_schema(), &[(40, "d", false)]);
    r.sink.commit(&r.target, &batch, "40").await.unwrap();
    let loc = common::catalog_metadata_location(&db, "cv", "t")
        .await
        .unwrap();
    let md = metadata_json(&loc);
    let replace = md["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["summary"]["operation"] == "replace")
        .expect("compaction ran");
    assert_eq!(
        replace["summary"]["added-position-deletes"], "4",
        "{replace}"
    );
    let live = common::duckdb_live_files(&python, &loc);
    let data: Vec<&Value> = live.iter().filter(|f| f["content"] == 0).collect();
    assert!(
        data.iter().any(|f| f["path"] == large_file),
        "the large file stays: {live:#?}"
    );
    assert!(
        data.iter()
            .all(|f| f["path"] == large_file || f["size"].as_u64().unwrap() < 16 << 10),
        "the small files were rewritten into one: {live:#?}"
    );
    assert_eq!(data.len(), 2, "{live:#?}");
    // Keys 10, 20, 30 and 40's rows in the large file, by position.
    assert_eq!(live_file_records(&python, &loc, 1), vec![4]);
    assert_eq!(
        live_file_records(&python, &loc, 2),
        Vec::<i64>::new(),
        "no equality delete left"
    );
    let after = expected(&[(10, "c"), (20, "b"), (40, "d")]);
    assert_every_reader_reads(&python, &loc, &p, &after, "after compaction");
}

/// A snapshot group's held changes to keys it appended itself remove the
/// appended rows by position (one position-delete file naming the group's
/// data file), and only keys committed before the group get an equality
/// delete: DuckDB, Iceberg's Java reader and `urutau query` read the same
/// rows. A compaction afterwards applies the position deletes and drops
/// their file.
#[tokio::test]
async fn held_changes_to_keys_a_snapshot_group_appended_are_position_deletes() {
    use urutau_planner::sink::Committed;
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let text = id_v_pipeline(dir.path(), "pd");
    let p = dir.path().join("p.sql");
    let plan = planned_at(&p, &text).await;
    let r = &plan.routes[0];
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(r.target.arrow_schema(), rows);
    r.sink
        .commit(&r.target, &batch(&[(100, "x", false)]), "5")
        .await
        .unwrap();
    let first: Vec<(i64, &str, bool)> = (1..=10).map(|i| (i, "a", false)).collect();
    let deferred = [
        batch(&first),
        batch(&[(5, "b", false), (7, "", true), (100, "y", false)]),
        batch(&[(5, "c", false), (8, "", true), (11, "a", false)]),
    ];
    for (b, position) in deferred.iter().zip(["10", "20", "25"]) {
        let done = prepare_and_commit(&*r.sink, &r.target, b.clone(), true, position).await;
        assert_eq!(done, Committed::Deferred);
    }
    let closing = batch(&[(12, "a", false)]);
    let done = prepare_and_commit(&*r.sink, &r.target, closing, false, "30").await;
    assert_eq!(done, Committed::Now);

    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pd", "t")
        .await
        .unwrap();
    let mut expected: Vec<Value> = (1..=12)
        .filter(|i| *i != 7 && *i != 8)
        .map(|i| json!({"id": i, "v": if i == 5 { "c" } else { "a" }}))
        .collect();
    expected.push(json!({"id": 100, "v": "y"}));
    let records = |loc: &str, content: i64| live_file_records(&python, loc, content);
    // Keys 5, 7 and 8 were appended by the group: by position; key 100
    // was committed before it: by equality.
    assert_eq!(records(&loc, 1), vec![3], "one position-delete file");
    assert_eq!(records(&loc, 2), vec![1], "one equality delete");
    assert_every_reader_reads(&python, &loc, &p, &expected, "");
    drop(plan);

    // Compaction applies them.
    let text = text.replace(
        "namespace = 'pd'",
        "namespace = 'pd', maintenance_enabled = true, maintenance_compaction_interval = '0s', maintenance_compaction_min_input_files = 2",
    );
    let plan = planned_at(&p, &text).await;
    let r = &plan.routes[0];
    let batch = id_v_batch(r.target.arrow_schema(), &[(13, "a", false)]);
    r.sink.commit(&r.target, &batch, "40").await.unwrap();
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "pd", "t")
        .await
        .unwrap();
    assert_eq!(
        records(&loc, 1),
        Vec::<i64>::new(),
        "position deletes applied"
    );
    expected.insert(10, json!({"id": 13, "v": "a"}));
    assert_every_reader_reads(&python, &loc, &p, &expected, "after compaction");
}

/// A transaction staged in parts while another writer commits to the
/// table: the closing commit fails as transient (the run would restart
/// and write the transaction again) instead of building on the staged
/// parts and dropping the other writer's commit from `main`; the other
/// writer's rows stay, nothing of the transaction is visible.
#[tokio::test]
async fn a_staged_transaction_never_publishes_over_another_writers_commit() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_writers(&id_v_pipeline(dir.path(), "s")).await;
    let (ra, rb) = (&a.routes[0], &b.routes[0]);
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(ra.target.arrow_schema(), rows);
    ra.sink
        .commit(&ra.target, &batch(&[(1, "a", false)]), "10")
        .await
        .unwrap();
    ra.sink
        .stage(&ra.target, &batch(&[(2, "a", false)]))
        .await
        .unwrap();
    rb.sink
        .commit(&rb.target, &batch(&[(3, "b", false)]), "20")
        .await
        .unwrap();
    let err = ra
        .sink
        .commit(&ra.target, &batch(&[(4, "a", false)]), "30")
        .await
        .expect_err("the transaction must not land over the other commit");
    assert!(err.is_transient(), "{err}");
    assert!(
        err.to_string().contains("another writer committed"),
        "{err}"
    );
    let loc = common::catalog_metadata_location(&dir.path().join("catalog.db"), "s", "t")
        .await
        .unwrap();
    let expected = vec![json!({"id": 1, "v": "a"}), json!({"id": 3, "v": "b"})];
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
    assert_eq!(metadata_json(&loc)["properties"]["cdc.position"], "20");
}

/// Writer A opens a snapshot group of keys 1-5 (position 10), writer B
/// commits key 3 meanwhile (position 5), then A's `closing` batch closes
/// and commits the group (position 20); the table's metadata location.
async fn group_of_keys_1_to_5_meets_key_3_of_another_writer(
    dir: &Path,
    closing: &[(i64, &str, bool)],
) -> String {
    use urutau_planner::sink::Committed;
    let (a, b) = two_writers(&id_v_pipeline(dir, "w")).await;
    let (ra, rb) = (&a.routes[0], &b.routes[0]);
    let batch = |rows: &[(i64, &str, bool)]| id_v_batch(ra.target.arrow_schema(), rows);
    let first: Vec<(i64, &str, bool)> = (1..=5).map(|i| (i, "a", false)).collect();
    let done = prepare_and_commit(&*ra.sink, &ra.target, batch(&first), true, "10").await;
    assert_eq!(done, Committed::Deferred);
    rb.sink
        .commit(&rb.target, &batch(&[(3, "b", false)]), "5")
        .await
        .unwrap();
    let done = prepare_and_commit(&*ra.sink, &ra.target, batch(closing), false, "20").await;
    assert_eq!(done, Committed::Now);
    common::catalog_metadata_location(&dir.join("catalog.db"), "w", "t")
        .await
        .unwrap()
}

/// A snapshot group whose keys another writer committed meanwhile: the
/// group's commit meets the other writer's (a conflict), reads the group's
/// keys back from its data file, and deletes the one the other writer
/// holds (key 3), so the table has one row per key, the group's.
#[tokio::test]
async fn a_snapshot_group_replaces_a_key_another_writer_committed_meanwhile() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let loc =
        group_of_keys_1_to_5_meets_key_3_of_another_writer(dir.path(), &[(9, "a", false)]).await;
    let expected: Vec<Value> = [1, 2, 3, 4, 5, 9]
        .iter()
        .map(|i| json!({"id": i, "v": "a"}))
        .collect();
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
    assert_eq!(common::iceberg_java_rows(&loc, "id"), expected);
    assert_eq!(metadata_json(&loc)["properties"]["cdc.position"], "20");
}

/// A change the closing batch makes to a key the group appended (removed
/// from the group's file by position) while another writer committed that
/// key meanwhile: the table ends with one row of the key, the change.
#[tokio::test]
async fn a_snapshot_groups_changed_key_another_writer_committed_meanwhile_is_held_once() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let closing = [(3, "c", false), (4, "", true), (9, "a", false)];
    let loc = group_of_keys_1_to_5_meets_key_3_of_another_writer(dir.path(), &closing).await;
    let expected: Vec<Value> = [(1, "a"), (2, "a"), (3, "c"), (5, "a"), (9, "a")]
        .iter()
        .map(|(i, v)| json!({"id": i, "v": v}))
        .collect();
    assert_eq!(common::duckdb_rows(&python, &loc, "id"), expected);
    assert_eq!(common::iceberg_java_rows(&loc, "id"), expected);
    let positional = common::duckdb_live_files(&python, &loc)
        .iter()
        .filter(|f| f["content"] == 1)
        .count();
    assert_eq!(
        positional, 1,
        "keys 3 and 4 are removed from the group's file by position"
    );
}

/// A table the source does not touch advances its position without data:
/// a properties-only commit, no snapshot, no empty files.
#[tokio::test]
async fn an_untouched_table_advances_its_position_without_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (lines, _) = workload(5, 500, 100);
    write_lines(&data, &lines);
    let text = format!(
        "CREATE SOURCE src FROM file WITH (path = '{data}');
CREATE SINK lake INTO iceberg WITH ({options}, namespace = 'bronze');
CREATE TABLE src.items ({COLUMNS});
CREATE TABLE src.quiet (id BIGINT NOT NULL, PRIMARY KEY (id));
CREATE TABLE lake.items AS SELECT * FROM src.items;
CREATE TABLE lake.quiet AS SELECT * FROM src.quiet;",
        data = data.display(),
        options = Catalog::Sql(dir.path()).sink_options()
    );
    let p = dir.path().join("p.sql");
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    let catalog = Catalog::Sql(dir.path());
    let items = catalog.metadata("bronze.items").await;
    let quiet = catalog.metadata("bronze.quiet").await;
    let end = std::fs::metadata(&data).unwrap().len().to_string();
    assert_eq!(items["properties"]["cdc.position"], end.as_str());
    assert_eq!(quiet["properties"]["cdc.position"], end.as_str());
    assert!(
        quiet["snapshots"].as_array().is_none_or(|s| s.is_empty()),
        "{quiet}"
    );
    let data_dir = dir.path().join("warehouse/bronze/quiet/data");
    assert!(!data_dir.exists() || std::fs::read_dir(&data_dir).unwrap().next().is_none());
}

/// The current snapshot's summary entry `key` as a number (absent: 0).
fn summary_number(md: &Value, key: &str) -> u64 {
    md["snapshots"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .find(|s| s["snapshot-id"] == md["current-snapshot-id"])
        })
        .and_then(|s| s["summary"][key].as_str())
        .map_or(0, |v| v.parse().unwrap())
}

/// Upserting, a row whose key no data file of the table (and no earlier
/// write of this run) can hold is appended without an equality delete; a
/// key the table may hold still gets one, also after a restart (the key
/// ranges are rebuilt from the data files' bounds), and a delete of a key
/// the table cannot hold writes nothing. DuckDB reads the rows the changes
/// leave.
#[tokio::test]
async fn new_keys_are_appended_without_equality_deletes() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let text = id_v_pipeline(dir.path(), "k");
    let batch = id_v_batch;
    let catalog_db = dir.path().join("catalog.db");
    async fn table_metadata(catalog_db: &Path) -> Value {
        metadata_json(
            &common::catalog_metadata_location(catalog_db, "k", "t")
                .await
                .unwrap(),
        )
    }
    let mut expected: BTreeMap<i64, String> = BTreeMap::new();

    let first = common::plan_sql(&text).await.unwrap();
    let r = &first.routes[0];
    r.sink.ensure_table(&r.target).await.unwrap();
    // Ascending new keys, two batches, and a delete of a key never written.
    for (n, range) in [(1, 1..=1000i64), (2, 1001..=2000)] {
        let mut rows: Vec<(i64, &str, bool)> = range.map(|id| (id, "new", false)).collect();
        if n == 2 {
            rows.push((5000, "", true));
        }
        for (id, v, deleted) in &rows {
            if !deleted {
                expected.insert(*id, v.to_string());
            }
        }
        r.sink
            .commit(
                &r.target,
                &batch(r.target.arrow_schema(), &rows),
                &n.to_string(),
            )
            .await
            .unwrap();
        let md = table_metadata(&catalog_db).await;
        assert_eq!(
            summary_number(&md, "total-equality-deletes"),
            0,
            "batch {n}: {md}"
        );
        assert_eq!(summary_number(&md, "total-delete-files"), 0, "batch {n}");
    }
    // An update of a key the table holds, and a new key: one delete.
    r.sink
        .commit(
            &r.target,
            &batch(
                r.target.arrow_schema(),
                &[(500, "updated", false), (3000, "new", false)],
            ),
            "3",
        )
        .await
        .unwrap();
    expected.insert(500, "updated".into());
    expected.insert(3000, "new".into());
    let md = table_metadata(&catalog_db).await;
    assert_eq!(summary_number(&md, "added-equality-deletes"), 1, "{md}");

    // A new run knows the table's keys from its data files alone.
    let second = common::plan_sql(&text).await.unwrap();
    let r = &second.routes[0];
    r.sink.ensure_table(&r.target).await.unwrap();
    r.sink
        .commit(
            &r.target,
            &batch(
                r.target.arrow_schema(),
                &[
                    (1500, "after restart", false),
                    (2000, "", true),
                    (10_000, "new", false),
                    (20_000, "", true),
                ],
            ),
            "4",
        )
        .await
        .unwrap();
    expected.insert(1500, "after restart".into());
    expected.remove(&2000);
    expected.insert(10_000, "new".into());
    let md = table_metadata(&catalog_db).await;
    assert_eq!(
        summary_number(&md, "added-equality-deletes"),
        2,
        "1500 and 2000 may be in the table, 10000 and 20000 cannot: {md}"
    );
    assert_eq!(md["properties"]["cdc.position"], "4");

    let location = common::catalog_metadata_location(&catalog_db, "k", "t")
        .await
        .unwrap();
    let rows = common::duckdb_rows(&python, &location, "id");
    let want: Vec<Value> = expected
        .iter()
        .map(|(id, v)| json!({"id": id, "v": v}))
        .collect();
    assert_eq!(rows.len(), want.len(), "row count as DuckDB reads it");
    assert_eq!(rows, want);
    assert_eq!(
        common::iceberg_java_rows(&location, "id"),
        want,
        "as Iceberg's Java reader reads it"
    );
}

/// A REST catalog served by Apache Iceberg's reference REST server (the
/// fixture of tests/common/iceberg_rest.rs) with a local `file://`
/// warehouse: the REST request types Polaris, Nessie and Gravitino share,
/// and storage that follows the table's location.
async fn reference_rest(dir: &Path) -> common::iceberg_rest::IcebergRest {
    common::iceberg_rest::IcebergRest::start(dir).await
}

#[tokio::test]
async fn the_conformance_contract_holds_on_the_reference_rest_catalog() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(dir.path()).await;
    let catalog = Catalog::Reference(&server);
    let s = UnderTest {
        python: &python,
        catalog: &catalog,
        extra: "",
        route: "",
    };
    conformance::contract(&s).await;
    // The table is where the server put it: under its local warehouse.
    let loaded = server.load("bronze.contract").await;
    let location = loaded["metadata"]["location"].as_str().unwrap();
    assert_eq!(
        location,
        format!("{}/bronze/contract", server.warehouse_uri())
    );
    assert_eq!(
        common::iceberg_java_rows(loaded["metadata-location"].as_str().unwrap(), "id"),
        catalog.rows(&python, "bronze.contract", "id").await,
        "Iceberg's Java reader reads what DuckDB reads"
    );
}

/// The acceptance suite (seeded changes, five kill -9s, DuckDB and
/// Iceberg's Java reader equal to the oracle, the position a table
/// property and in every snapshot) on the reference REST server, for an
/// unpartitioned upsert table.
#[tokio::test]
async fn random_changes_with_kill_9_on_the_reference_rest_catalog() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(dir.path()).await;
    let catalog = Catalog::Reference(&server);
    random_changes_with_kill_9(&python, dir.path(), &catalog, "").await;
    let md = catalog.metadata("bronze.items").await;
    assert_eq!(md["partition-specs"].as_array().unwrap().len(), 1);
    assert!(
        md["properties"]["cdc.position"].is_string(),
        "the position is a table property: {}",
        md["properties"]
    );
}

/// The acceptance suite on the reference REST server for a
/// `bucket(8, id)`-partitioned upsert table: its unpartitioned spec for
/// global equality deletes is added by an `add-spec` update the server
/// parses, and data files land in their buckets.
#[tokio::test]
async fn random_changes_with_kill_9_partitioned_by_bucket_on_the_reference_rest_catalog() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(dir.path()).await;
    let catalog = Catalog::Reference(&server);
    random_changes_with_kill_9_routed(
        &python,
        dir.path(),
        &catalog,
        "",
        ", partition_by = 'bucket(8, id)'",
    )
    .await;
    let md = catalog.metadata("bronze.items").await;
    let specs = md["partition-specs"].as_array().unwrap();
    assert_eq!(specs.len(), 2, "{specs:?}");
    let default = specs
        .iter()
        .find(|s| s["spec-id"] == md["default-spec-id"])
        .unwrap();
    assert_eq!(default["fields"][0]["transform"], "bucket[8]");
    assert!(
        specs
            .iter()
            .any(|s| s["fields"].as_array().unwrap().is_empty())
    );
    let buckets = std::fs::read_dir(server.warehouse_dir().join("bronze/items/data"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .starts_with("id_bucket=")
        })
        .count();
    assert_eq!(buckets, 8, "data files in their buckets");
    assert!(md["properties"]["cdc.position"].is_string());
}

/// The acceptance suite with maintenance (compaction, expiry, orphan
/// cleanup: the warehouse is local) on the reference REST server.
#[tokio::test]
async fn random_changes_with_kill_9_and_maintenance_on_the_reference_rest_catalog() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(dir.path()).await;
    let catalog = Catalog::Reference(&server);
    random_changes_with_kill_9_and_maintenance(&python, dir.path(), &catalog, true).await;
}

#[tokio::test]
async fn snapshot_expiry_on_the_reference_rest_catalog() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(dir.path()).await;
    snapshot_expiry(&python, dir.path(), &Catalog::Reference(&server)).await;
}

#[tokio::test]
async fn append_records_every_change_once_on_the_reference_rest_catalog() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(dir.path()).await;
    append_once(&python, dir.path(), &Catalog::Reference(&server)).await;
}

/// The README's quickstart, routed to the reference REST server with a
/// local warehouse, as a new user would (the issue this fixes: creating
/// the table failed on the partition spec's missing id, and no file could
/// be written to a `file://` location): the same rows as on the embedded
/// catalog, read by DuckDB and by Iceberg's Java reader.
#[tokio::test]
async fn the_quickstart_through_the_reference_rest_catalog() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(&dir.path().join("rest")).await;
    let p = quickstart_pipeline(dir.path(), &dir.path().join("unused.db"));
    let text = std::fs::read_to_string(&p).unwrap();
    let text = edit(
        &text,
        &format!(
            "uri       = 'sqlite://{}'",
            dir.path().join("unused.db").display()
        ),
        &format!("uri       = '{}'", server.uri()),
    );
    let text = edit(&text, "catalog   = 'sql'", "catalog   = 'rest'");
    let text = edit(
        &text,
        &format!("warehouse = '{}/wh'", dir.path().display()),
        &format!("warehouse = '{}'", server.warehouse_uri()),
    );
    std::fs::write(&p, text).unwrap();
    run_to_end(&p);
    assert!(
        !dir.path().join("unused.db").exists(),
        "the SQL catalog is not used"
    );
    let catalog = Catalog::Reference(&server);
    let rows = catalog.rows(&python, "bronze.orders", "id").await;
    let summary: Vec<(i64, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["status"].as_str().unwrap().to_string(),
                r["amount"].to_string(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, "new".into(), "\"7.50\"".into()),
            (3, "shipped".into(), "\"110.00\"".into()),
            (6, "new".into(), "null".into()),
            (40, "paid".into(), "\"42.42\"".into()),
        ]
    );
    let md = catalog.metadata("bronze.orders").await;
    assert_eq!(md["properties"]["cdc.position"], "5173");
    // Partitioned by day, with global equality deletes (an unpartitioned
    // spec the server added).
    assert_eq!(md["partition-specs"].as_array().unwrap().len(), 2);
    for (table, order) in [
        ("bronze.orders", "id"),
        ("bronze.customer_changes", "id,source_position"),
    ] {
        assert_eq!(
            common::iceberg_java_rows(&catalog.location(table).await, order),
            catalog.rows(&python, table, order).await,
            "{table}: Iceberg's Java reader reads what DuckDB reads"
        );
    }
}

/// A transaction larger than a batch on the reference REST server: its
/// parts go to the staging branch (a `set-snapshot-ref` of another branch
/// the server parses) and nothing shows on `main` until the batch that
/// closes it; parts a crash left are removed by the next start. Bucketed,
/// so the equality deletes go through the added unpartitioned spec.
#[tokio::test]
async fn staged_transactions_on_the_reference_rest_catalog() {
    use common::conformance::simple_batch;
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let server = reference_rest(dir.path()).await;
    let catalog = Catalog::Reference(&server);
    let text = format!(
        "CREATE PIPELINE c;
CREATE SOURCE src FROM file WITH (path = 'unused.jsonl');
CREATE SINK s INTO iceberg WITH ({}, namespace = 'bronze');
CREATE TABLE src.t (id BIGINT NOT NULL, name VARCHAR, PRIMARY KEY (id));
CREATE TABLE s.t WITH (primary_key = 'id', partition_by = 'bucket(4, id)') AS SELECT * FROM src.t;",
        catalog.sink_options()
    );
    let open = || async {
        let plan = common::plan_sql(&text).await.unwrap();
        let (sink, target) = (plan.routes[0].sink.clone(), plan.routes[0].target.clone());
        sink.ensure_table(&target).await.unwrap();
        (sink, target)
    };
    let (sink, target) = open().await;
    assert!(sink.stages_transactions(&target));
    let staging = |md: &Value| md["refs"].get("urutau-staging").is_some();
    sink.commit(
        &target,
        &simple_batch(&[(1, Some("a")), (2, Some("a"))]),
        "1",
    )
    .await
    .unwrap();
    sink.stage(&target, &simple_batch(&[(2, Some("b")), (3, Some("b"))]))
        .await
        .unwrap();
    sink.stage(&target, &simple_batch(&[(1, None), (4, Some("b"))]))
        .await
        .unwrap();
    let md = catalog.metadata("bronze.t").await;
    assert!(staging(&md), "{}", md["refs"]);
    let rows = catalog.rows(&python, "bronze.t", "id").await;
    assert_eq!(
        rows,
        vec![json!({"id": 1, "name": "a"}), json!({"id": 2, "name": "a"})],
        "main shows none of the open transaction"
    );
    sink.commit(&target, &simple_batch(&[(5, Some("c"))]), "2")
        .await
        .unwrap();
    let md = catalog.metadata("bronze.t").await;
    assert!(!staging(&md), "{}", md["refs"]);
    assert_eq!(md["properties"]["cdc.position"], "2");
    let want = vec![
        json!({"id": 2, "name": "b"}),
        json!({"id": 3, "name": "b"}),
        json!({"id": 4, "name": "b"}),
        json!({"id": 5, "name": "c"}),
    ];
    assert_eq!(catalog.rows(&python, "bronze.t", "id").await, want);

    // A part staged by a run that then crashed: the next start removes it.
    sink.stage(&target, &simple_batch(&[(2, None), (9, Some("z"))]))
        .await
        .unwrap();
    assert!(staging(&catalog.metadata("bronze.t").await));
    drop(sink);
    let (sink, target) = open().await;
    let md = catalog.metadata("bronze.t").await;
    assert!(!staging(&md), "{}", md["refs"]);
    assert_eq!(
        sink.committed_position(&target).await.unwrap().as_deref(),
        Some("2")
    );
    let location = catalog.location("bronze.t").await;
    assert_eq!(catalog.rows(&python, "bronze.t", "id").await, want);
    assert_eq!(
        common::iceberg_java_rows(&location, "id"),
        want,
        "as Iceberg's Java reader reads it"
    );
}

/// The reference REST server with its warehouse on SeaweedFS's S3 (a plain
/// bucket; Iceberg's S3FileIO on the server), the S3 keys given to the sink
/// by the server only (vended with each table): the acceptance suite,
/// read back by DuckDB from S3.
#[tokio::test]
async fn random_changes_with_kill_9_on_the_reference_rest_catalog_on_s3() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let seaweed = common::Seaweed::start(&python, &dir.path().join("seaweed"));
    let (key, secret) = seaweed.credential();
    let s3 = common::iceberg_rest::S3Warehouse {
        endpoint: seaweed.s3_endpoint(),
        access_key_id: key,
        secret_access_key: secret,
        bucket: "fixture".into(),
    };
    common::iceberg_rest::create_bucket(&python, &s3);
    let server = common::iceberg_rest::IcebergRest::start_on_s3(&dir.path().join("rest"), s3).await;
    let catalog = Catalog::Reference(&server);
    random_changes_with_kill_9(&python, dir.path(), &catalog, "").await;
    let loaded = server.load("bronze.items").await;
    assert!(
        loaded["metadata-location"]
            .as_str()
            .unwrap()
            .starts_with("s3://fixture/wh/bronze/items/"),
        "{}",
        loaded["metadata-location"]
    );
    assert!(
        loaded["config"]["s3.access-key-id"].is_string(),
        "the server vends the keys the sink wrote with: {}",
        loaded["config"]["s3.access-key-id"]
    );
}
