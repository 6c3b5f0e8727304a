//! The Kafka source against a real Apache Kafka broker (tests/harness/kafka.py)
//! and real Debezium events: a Postgres workload captured by the Debezium
//! PostgreSQL connector (Kafka Connect), read by urutau into Iceberg and
//! read back by DuckDB; partitions added and offsets deleted under a run;
//! append-idempotent by the messages' coordinates.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, Row};

use common::{Kafka, Postgres, run_to_end};

/// Iceberg sink options: a SQLite catalog and a warehouse in `dir`.
fn lake(dir: &Path) -> String {
    format!(
        "catalog = 'sql', uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/warehouse', namespace = 'bronze'",
        d = dir.display()
    )
}

/// Writes pipeline `text` as `dir/p.sql` (the directory made first).
fn write_pipeline(dir: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("p.sql");
    std::fs::write(&p, text).unwrap();
    p
}

/// DuckDB's read of `bronze.<table>` in `dir`'s catalog.
async fn lake_rows(python: &Path, dir: &Path, table: &str, order_by: &str) -> Vec<Value> {
    let loc = common::catalog_metadata_location(&dir.join("catalog.db"), "bronze", table)
        .await
        .unwrap_or_else(|| panic!("the catalog holds bronze.{table}"));
    common::duckdb_rows(python, &loc, order_by)
}

const ACCT_COLUMNS: &str = "id INT NOT NULL, balance DECIMAL(10,2), ts TIMESTAMPTZ, d DATE, \
     u UUID, j JSON, tags TEXT[], PRIMARY KEY (id)";

/// The Postgres table's rows as DuckDB renders the Iceberg table's.
async fn postgres_rows(pool: &sqlx::PgPool) -> Vec<Value> {
    sqlx::query(
        "SELECT json_build_object('id', id, 'balance', balance::text,
            'ts', to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') || '+00:00',
            'd', to_char(d, 'YYYY-MM-DD'), 'u', u::text, 'j', j::text, 'tags', to_json(tags))::text
         FROM acct ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| serde_json::from_str(&r.get::<String, _>(0)).unwrap())
    .collect()
}

/// A random row's values (a fifth of them NULL) as SQL literals.
fn random_values(rng: &mut rand::rngs::StdRng) -> [String; 6] {
    let maybe = |rng: &mut rand::rngs::StdRng, v: String| {
        if rng.random_range(0..5) == 0 {
            "NULL".to_string()
        } else {
            v
        }
    };
    let cents: i64 = rng.random_range(-9_999_999_999i64..=9_999_999_999);
    let balance = format!(
        "{}{}.{:02}",
        if cents < 0 { "-" } else { "" },
        cents.abs() / 100,
        cents.abs() % 100
    );
    let micros: i64 = rng.random_range(-2_208_988_800_000_000i64..4_102_444_800_000_000);
    let ts = format!("(timestamptz 'epoch' + {micros} * interval '1 microsecond')");
    let days: i64 = rng.random_range(-25_567..47_482);
    let d = format!("(date '1970-01-01' + {days})");
    let u = format!("'{}'::uuid", uuid::Uuid::from_u128(rng.random()));
    let words = ["a", "b c", "d\"e", "ç", "{x}", ""];
    let j = format!(
        "'{}'::jsonb",
        json!({"n": rng.random_range(0..1000), "w": words[rng.random_range(0..words.len())], "l": [1, null]})
            .to_string()
            .replace('\'', "''")
    );
    let n = rng.random_range(0..4);
    let tags: Vec<String> = (0..n)
        .map(|_| {
            if rng.random_range(0..6) == 0 {
                "NULL".to_string()
            } else {
                format!(
                    "'{}'",
                    words[rng.random_range(0..words.len())].replace('\'', "''")
                )
            }
        })
        .collect();
    let tags = format!("ARRAY[{}]::text[]", tags.join(","));
    [
        maybe(rng, balance),
        maybe(rng, ts),
        maybe(rng, d),
        maybe(rng, u),
        maybe(rng, j),
        maybe(rng, tags),
    ]
}

/// A seeded workload on `acct`: inserts, updates, primary-key changes,
/// deletes and re-inserts, in transactions of 1-4 statements. Returns how
/// many Kafka messages Debezium emits for it (a key change is a delete, a
/// tombstone and a create; a delete is a delete and a tombstone).
async fn workload(pool: &sqlx::PgPool, seed: u64, ops: usize, present: &mut Vec<i32>) -> usize {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut messages = 0;
    let mut done = 0;
    while done < ops {
        let mut tx = pool.begin().await.unwrap();
        for _ in 0..rng.random_range(1..=4) {
            done += 1;
            let roll = rng.random_range(0..100);
            if present.is_empty() || roll < 30 {
                // Insert (or re-insert) an id that is not there.
                let id = loop {
                    let id = rng.random_range(1..600);
                    if !present.contains(&id) {
                        break id;
                    }
                };
                let v = random_values(&mut rng);
                tx.execute(format!("INSERT INTO acct VALUES ({id}, {})", v.join(", ")).as_str())
                    .await
                    .unwrap();
                present.push(id);
                messages += 1;
            } else if roll < 75 {
                let id = present[rng.random_range(0..present.len())];
                let v = random_values(&mut rng);
                tx.execute(
                    format!(
                        "UPDATE acct SET balance = {}, ts = {}, d = {}, u = {}, j = {}, tags = {} WHERE id = {id}",
                        v[0], v[1], v[2], v[3], v[4], v[5]
                    )
                    .as_str(),
                )
                .await
                .unwrap();
                messages += 1;
            } else if roll < 85 {
                let i = rng.random_range(0..present.len());
                let to = loop {
                    let id = rng.random_range(1..600);
                    if !present.contains(&id) {
                        break id;
                    }
                };
                tx.execute(format!("UPDATE acct SET id = {to} WHERE id = {}", present[i]).as_str())
                    .await
                    .unwrap();
                present[i] = to;
                messages += 3;
            } else {
                let i = rng.random_range(0..present.len());
                tx.execute(format!("DELETE FROM acct WHERE id = {}", present[i]).as_str())
                    .await
                    .unwrap();
                present.swap_remove(i);
                messages += 2;
            }
        }
        tx.commit().await.unwrap();
    }
    messages
}

/// Real Debezium end to end: a Postgres workload captured by Debezium
/// (default settings: precise decimals, adaptive time; the schema part on
/// or off) through Kafka into Iceberg, urutau killed with kill -9 five
/// times; DuckDB's read equals Postgres row for row. The same messages,
/// exported to a change file, read by the file source, land equal too.
async fn debezium_into_iceberg(schemas: bool, seed: u64) {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let pg = Postgres::start(&dir.path().join("pg"));
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg.uri())
        .await
        .unwrap();
    pool.execute(
        "CREATE TABLE acct (id int PRIMARY KEY, balance numeric(10,2), ts timestamptz, d date,
           u uuid, j jsonb, tags text[])",
    )
    .await
    .unwrap();
    let mut present = Vec::new();
    // Rows there before Debezium starts arrive as its snapshot (op r).
    workload(&pool, seed, 300, &mut present).await;
    let mut messages = present.len();
    let mut kafka = Kafka::start(&python, dir.path());
    kafka.start_debezium(&pg, "dbz_slot", "public.acct", "dbz", schemas);
    messages += workload(&pool, seed + 1, 2500, &mut present).await;
    let expected = postgres_rows(&pool).await;
    // Every event is in Kafka (Debezium emits asynchronously).
    let values = kafka.values("dbz.public.acct", messages);
    assert!(
        values.iter().any(|v| v.contains("\"op\":\"r\""))
            && values.iter().any(|v| v.contains("\"op\":\"d\"")),
        "Debezium emitted snapshot rows and deletes"
    );
    assert_eq!(
        values.iter().any(|v| v.starts_with("{\"schema\":")),
        schemas,
        "the schema part is there exactly when enabled"
    );

    let lake_dir = dir.path().join("lake");
    std::fs::create_dir_all(&lake_dir).unwrap();
    let p = lake_dir.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE kt WITH (max_batch_rows = 20, progress_interval = '1h');
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.acct ({ACCT_COLUMNS}) WITH (topic = 'dbz.public.acct');
CREATE TABLE lake.acct AS SELECT * FROM k.acct;
",
            brokers = kafka.brokers,
            lake = lake(&lake_dir)
        ),
    )
    .unwrap();
    common::kill_9_runs(&p, seed, 5, 150..700);
    run_to_end(&p);
    let got = lake_rows(&python, &lake_dir, "acct", "id").await;
    assert_eq!(got.len(), expected.len(), "row count");
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g, e, "DuckDB's row differs from Postgres'");
    }

    // The file source reads the same real Debezium messages.
    let file_dir = dir.path().join("file");
    std::fs::create_dir_all(&file_dir).unwrap();
    let events = file_dir.join("dbz.jsonl");
    std::fs::write(&events, values.join("\n") + "\n").unwrap();
    // Without a schema part, the file says how decimals are encoded;
    // with one, the schema part decides.
    let decimals = if schemas {
        String::new()
    } else {
        ", decimal_handling = 'precise'".to_string()
    };
    let p = file_dir.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE ft;
CREATE SOURCE f FROM file WITH (path = '{events}'{decimals});
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE f.acct ({ACCT_COLUMNS});
CREATE TABLE lake.acct AS SELECT * FROM f.acct;
",
            events = events.display(),
            lake = lake(&file_dir)
        ),
    )
    .unwrap();
    run_to_end(&p);
    let got = lake_rows(&python, &file_dir, "acct", "id").await;
    assert!(
        got == expected,
        "the file source's read of the exported messages differs"
    );
}

#[tokio::test]
async fn debezium_events_without_schemas_land_equal_to_postgres_through_kill_9() {
    debezium_into_iceberg(false, 41).await;
}

#[tokio::test]
async fn debezium_events_with_schemas_land_equal_to_postgres_through_kill_9() {
    debezium_into_iceberg(true, 43).await;
}

/// A file of real Debezium messages (base64 decimals) without the option
/// that says so is refused, with a hint; nothing is committed.
#[tokio::test]
async fn base64_decimals_without_decimal_handling_are_an_error_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("e.jsonl");
    std::fs::write(
        &events,
        r#"{"before":null,"after":{"id":1,"balance":"BBo="},"source":{"table":"acct","schema":"public","ts_ms":1},"op":"c"}
"#,
    )
    .unwrap();
    let p = dir.path().join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE ft;
CREATE SOURCE f FROM file WITH (path = '{}');
CREATE SINK out INTO debug;
CREATE TABLE f.acct (id INT NOT NULL, balance DECIMAL(10,2), PRIMARY KEY (id));
CREATE TABLE out.acct AS SELECT * FROM f.acct;
",
            events.display()
        ),
    )
    .unwrap();
    let out = common::urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("e.jsonl:1") && err.contains("\"BBo=\""),
        "{err}"
    );
    assert!(err.contains("decimal_handling = 'precise'"), "{err}");
}

/// Raw JSON messages `{"id": i, "v": "v<i>"}` keyed by id, for `ids`, into
/// `partition` when given (else by the key's hash).
fn raw_items(ids: std::ops::Range<i64>, partition: Option<i32>) -> Vec<Value> {
    ids.map(|i| {
        let mut m = json!({"key": i.to_string(), "value": json!({"id": i, "v": format!("v{i}")}).to_string()});
        if let Some(p) = partition {
            m["partition"] = json!(p);
        }
        m
    })
    .collect()
}

/// Raw JSON rows in a partitioned topic: a partition added between runs is
/// read from its beginning, one added while a run tails the topic is found
/// by the metadata refresh; offsets deleted before the sink committed them
/// stop the run, naming topic, partition and offset.
#[tokio::test]
async fn new_partitions_are_read_and_deleted_offsets_stop_the_run() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start(&python, dir.path());
    kafka.create_topic("items", 3);
    let rows = raw_items;
    kafka.produce("items", &rows(0..300, None));
    let lake_dir = dir.path().join("lake");
    std::fs::create_dir_all(&lake_dir).unwrap();
    let p = lake_dir.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE kt WITH (max_batch_rows = 50, max_batch_interval = '200ms');
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}', format = 'raw', metadata_refresh = '1s');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.items (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
CREATE TABLE lake.items WITH (primary_key = 'id') AS
  SELECT id, v, _shard AS part, _sequence AS off FROM k.items;
",
            brokers = kafka.brokers,
            lake = lake(&lake_dir)
        ),
    )
    .unwrap();
    run_to_end(&p);
    let ids = |rows: &[Value]| -> HashSet<i64> {
        rows.iter().map(|r| r["id"].as_i64().unwrap()).collect()
    };
    let got = lake_rows(&python, &lake_dir, "items", "id").await;
    assert_eq!(ids(&got), (0..300).collect());
    let parts: HashSet<i64> = got.iter().map(|r| r["part"].as_i64().unwrap()).collect();
    assert_eq!(
        parts,
        HashSet::from([0, 1, 2]),
        "keys spread over the partitions"
    );

    // A fourth partition, present at the next start: read from its beginning.
    kafka.add_partitions("items", 4);
    kafka.produce("items", &rows(300..350, Some(3)));
    run_to_end(&p);
    let got = lake_rows(&python, &lake_dir, "items", "id").await;
    assert_eq!(ids(&got), (0..350).collect());

    // A fifth, added while a run tails the topic.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--log-level", "warn"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    kafka.add_partitions("items", 5);
    kafka.produce("items", &rows(350..400, Some(4)));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let got = lake_rows(&python, &lake_dir, "items", "id").await;
        if ids(&got) == (0..400).collect() {
            assert!(got.iter().filter(|r| r["part"] == json!(4)).count() == 50);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new partition's messages did not arrive: {} rows",
            got.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    // Retention removes offsets of partition 0 that no sink committed.
    let offsets = kafka.produce("items", &rows(400..420, Some(0)));
    let (_, last) = offsets.last().copied().unwrap();
    let first_new = offsets[0].1;
    let low = kafka.delete_records("items", 0, last + 1);
    assert_eq!(low, last + 1);
    let out = common::urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "topic items partition 0: offset {first_new} is no longer on the broker"
        )),
        "{err}"
    );
    // Nothing was skipped: the table is as before.
    let got = lake_rows(&python, &lake_dir, "items", "id").await;
    assert_eq!(ids(&got), (0..400).collect());
}

/// Append-idempotent on Kafka: every message lands once with its
/// coordinate (topic, partition, offset) and message fields, through kill
/// -9s and a replay forced by a new route that reads from the beginning.
#[tokio::test]
async fn append_idempotent_lands_each_message_once_by_its_coordinate() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start(&python, dir.path());
    kafka.create_topic("events", 3);
    let n = 6000i64;
    let messages: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "key": format!("k{}", i % 500),
                "value": json!({"id": i % 500, "n": i}).to_string(),
                "headers": {"h": format!("x{i}")},
            })
        })
        .collect();
    let produced_from = chrono::Utc::now() - chrono::Duration::seconds(1);
    let offsets = kafka.produce("events", &messages);
    let produced_to = chrono::Utc::now() + chrono::Duration::seconds(1);
    let expected: HashSet<(i32, i64, i64)> = offsets
        .iter()
        .zip(0..n)
        .map(|((p, o), i)| (*p, *o, i))
        .collect();
    let lake_dir = dir.path().join("lake");
    std::fs::create_dir_all(&lake_dir).unwrap();
    let p = lake_dir.join("p.sql");
    let pipeline = |extra: &str| {
        format!(
            "CREATE PIPELINE kt WITH (max_batch_rows = 100, progress_interval = '1h');
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}', format = 'raw');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.events (id BIGINT NOT NULL, n BIGINT, PRIMARY KEY (id));
CREATE TABLE lake.log WITH (write_mode = 'append-idempotent') AS
  SELECT n, _stream AS stream, _shard AS shard, _sequence AS seq,
         _msg_key AS msg_key, _headers AS headers, _msg_ts AS msg_ts FROM k.events;
{extra}",
            brokers = kafka.brokers,
            lake = lake(&lake_dir)
        )
    };
    std::fs::write(&p, pipeline("")).unwrap();
    common::kill_9_runs(&p, 7, 5, 150..600);
    run_to_end(&p);
    // A new route: the source starts over from the beginning, and `log`,
    // which holds it all, is sent it again.
    std::fs::write(
        &p,
        pipeline(
            "CREATE TABLE lake.latest WITH (primary_key = 'id') AS SELECT id, n FROM k.events;\n",
        ),
    )
    .unwrap();
    run_to_end(&p);
    let rows = lake_rows(&python, &lake_dir, "log", "shard, seq").await;
    let mut seen = HashSet::new();
    for r in &rows {
        assert_eq!(r["stream"], json!("events"));
        let c = (
            r["shard"].as_i64().unwrap() as i32,
            r["seq"].as_i64().unwrap(),
        );
        assert!(seen.insert(c), "coordinate {c:?} twice");
        let i = r["n"].as_i64().unwrap();
        // Binary, which DuckDB renders as hex.
        assert_eq!(r["msg_key"], json!(hex::encode(format!("k{}", i % 500))));
        assert_eq!(
            serde_json::from_str::<Value>(r["headers"].as_str().unwrap()).unwrap(),
            json!({"h": format!("x{i}")})
        );
        // The producer's create time, in milliseconds: read as such, it
        // lies within the produce.
        let ts = chrono::DateTime::parse_from_rfc3339(r["msg_ts"].as_str().unwrap()).unwrap();
        assert!(
            (produced_from..produced_to).contains(&ts.to_utc()),
            "message {i}: _msg_ts {ts} outside the produce ({produced_from} to {produced_to})"
        );
    }
    let got: HashSet<(i32, i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["shard"].as_i64().unwrap() as i32,
                r["seq"].as_i64().unwrap(),
                r["n"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got.len(), n as usize, "one row per message");
    assert!(got == expected, "every message at its coordinate");
    let latest = lake_rows(&python, &lake_dir, "latest", "id").await;
    assert_eq!(latest.len(), 500);
}

/// Pipelines that cannot work are refused before anything runs.
#[test]
fn kafka_pipelines_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| -> (Option<i32>, String) {
        let p: PathBuf = dir.path().join("p.sql");
        std::fs::write(&p, text).unwrap();
        let out = common::urutau(&["plan", p.to_str().unwrap()]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = check(
        "CREATE PIPELINE p;
CREATE SOURCE k FROM kafka WITH (brokers = 'b:9092', format = 'avro2');
CREATE SINK out INTO debug;
CREATE TABLE k.t (id INT NOT NULL, PRIMARY KEY (id)) WITH (topik = 'x');
CREATE TABLE out.t AS SELECT * FROM k.t;
",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("format"), "{err}");
    assert!(
        err.contains("unknown option `topik`") && err.contains("did you mean `topic`"),
        "{err}"
    );
    assert!(err.contains("p.sql:4:"), "{err}");
    let (code, err) = check(
        "CREATE PIPELINE p;
CREATE SOURCE k FROM kafka WITH (brokers = 'b:9092', format = 'avro', decimal_handling = 'string');
CREATE SINK out INTO debug;
CREATE TABLE k.t (id INT NOT NULL, PRIMARY KEY (id));
CREATE TABLE out.t AS SELECT * FROM k.t;
",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("format = 'avro' needs schema_registry"),
        "{err}"
    );
    assert!(
        err.contains("p.sql:2:71") && err.contains("Avro schemas carry their types"),
        "{err}"
    );
    let (code, err) = check(
        "CREATE PIPELINE p;
CREATE SOURCE k FROM kafka WITH (brokers = 'b:9092', schema_registry = 'http://u:secret@r:8081');
CREATE SINK out INTO debug;
CREATE TABLE k.t (id INT NOT NULL, PRIMARY KEY (id));
CREATE TABLE out.t AS SELECT * FROM k.t;
",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("schema_registry is for format = 'avro'"),
        "{err}"
    );
    assert!(!err.contains("secret"), "a secret in an error: {err}");
}

/// The test harness's stand-in for a Confluent schema registry
/// (tests/harness/schema_registry.py: no real registry can be installed
/// here), stopped when dropped.
struct SchemaRegistry {
    url: String,
    /// With [`SchemaRegistry::start_tls`]: the same registry over HTTPS.
    https_url: Option<String>,
    dir: PathBuf,
}

impl SchemaRegistry {
    fn start(dir: &Path) -> SchemaRegistry {
        Self::start_with(dir, &[])
    }

    /// Also answering HTTPS with the certificate `cert` and its `key`.
    fn start_tls(dir: &Path, cert: &Path, key: &Path) -> SchemaRegistry {
        Self::start_with(
            dir,
            &[
                "--tls-cert",
                cert.to_str().unwrap(),
                "--tls-key",
                key.to_str().unwrap(),
            ],
        )
    }

    fn start_with(dir: &Path, extra: &[&str]) -> SchemaRegistry {
        let dir = dir.join("registry");
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("python3")
            .arg(common::harness_script("schema_registry.py"))
            .args(["start", "--dir"])
            .arg(&dir)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        SchemaRegistry {
            url: info["url"].as_str().unwrap().to_string(),
            https_url: info["https_url"].as_str().map(str::to_string),
            dir,
        }
    }

    /// How often each schema id was fetched.
    fn fetches(&self) -> Value {
        let out = std::process::Command::new("curl")
            .args(["-s", &format!("{}/_stats", self.url)])
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["schema_fetches"].clone()
    }
}

impl Drop for SchemaRegistry {
    fn drop(&mut self) {
        let _ = std::process::Command::new("python3")
            .arg(common::harness_script("schema_registry.py"))
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .output();
    }
}

fn micros_text(micros: i64, zone: &str) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .unwrap()
        .format(&format!("%Y-%m-%dT%H:%M:%S%.6f{zone}"))
        .to_string()
}

fn days_text(days: i64) -> String {
    (chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap() + chrono::Duration::days(days))
        .format("%Y-%m-%d")
        .to_string()
}

/// Avro in Confluent's wire format through the registry: plain records and
/// Debezium envelopes (Connect's logical types: Decimal, ZonedTimestamp,
/// MicroTimestamp, Date, Uuid), each schema fetched once.
/// 60 rows of `plain.avsc` for produce-avro, and DuckDB's read of them.
fn plain_avro_rows() -> (Vec<Value>, Vec<Value>) {
    let mut plain = Vec::new();
    let mut expected_plain = Vec::new();
    for i in 0..60i64 {
        let ts = 1_700_000_000_000_000 + i * 1_234_567;
        let v = json!({"id": i, "name": format!("n{i}"), "amount": format!("{}.{:02}", i * 7 - 100, i % 100),
            "ts": ts, "d": 19_000 + i, "u": format!("00000000-0000-4000-8000-{:012}", i),
            "opt": if i % 3 == 0 { Value::Null } else { json!(format!("o{i}")) }});
        expected_plain.push(json!({"id": i, "name": format!("n{i}"),
            "amount": format!("{}.{:02}", i * 7 - 100, i % 100), "ts": micros_text(ts, "+00:00"),
            "d": days_text(19_000 + i), "u": format!("00000000-0000-4000-8000-{:012}", i),
            "opt": v["opt"].clone()}));
        plain.push(json!({"key": i.to_string(), "value": v}));
    }
    (plain, expected_plain)
}

#[tokio::test]
async fn avro_through_the_schema_registry_lands_correctly() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start(&python, dir.path());
    let registry = SchemaRegistry::start(dir.path());
    kafka.create_topic("plain", 2);
    kafka.create_topic("dbz.public.acct", 1);
    let avro = |topic: &str, schema: &str, lines: &[Value]| {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let schema = common::harness_script("avro").join(schema);
        kafka.command(
            &[
                "produce-avro",
                "--brokers",
                &kafka.brokers,
                "--topic",
                topic,
                "--registry",
                &registry.url,
                "--schema-file",
                schema.to_str().unwrap(),
            ],
            Some(&text),
        )
    };
    let (plain, expected_plain) = plain_avro_rows();
    avro("plain", "plain.avsc", &plain);

    // Debezium envelopes: a snapshot, creates, updates, deletes + tombstones.
    let source = |snapshot: &str| {
        json!({"version": "3.6.1.Final", "connector": "postgresql", "name": "dbz", "ts_ms": 1_700_000_000_000i64,
            "snapshot": snapshot, "db": "postgres", "schema": "public", "table": "acct", "txId": 7, "lsn": 100})
    };
    let image = |id: i64, version: i64| {
        json!({"id": id, "name": format!("a{id}-{version}"), "balance": format!("{}.5{}", id - 10, version % 10),
            "opened_at": "2024-01-02T03:04:05.123456Z", "updated_at": 1_700_000_000_000_000i64 + id * 1000 + version,
            "birthday": -365 + id, "ref": format!("10000000-0000-4000-8000-{:012}", id)})
    };
    let mut events = Vec::new();
    let mut state = std::collections::BTreeMap::new();
    for id in 0..20 {
        events.push(json!({"value": {"before": null, "after": image(id, 0), "source": source("true"), "op": "r", "ts_ms": 1}}));
        state.insert(id, image(id, 0));
    }
    for id in 20..30 {
        events.push(json!({"value": {"before": null, "after": image(id, 0), "source": source("false"), "op": "c", "ts_ms": 1}}));
        state.insert(id, image(id, 0));
    }
    for id in (0..30).step_by(3) {
        events.push(json!({"value": {"before": null, "after": image(id, 1), "source": source("false"), "op": "u", "ts_ms": 1}}));
        state.insert(id, image(id, 1));
    }
    for id in (0..30).step_by(5) {
        let key_only = json!({"id": id, "name": null, "balance": null, "opened_at": null, "updated_at": null, "birthday": null, "ref": null});
        events.push(json!({"value": {"before": key_only, "after": null, "source": source("false"), "op": "d", "ts_ms": 1}}));
        events.push(json!({"key": id.to_string(), "value": null}));
        state.remove(&id);
    }
    avro("dbz.public.acct", "debezium_acct.avsc", &events);

    let lake_dir = dir.path().join("lake");
    std::fs::create_dir_all(&lake_dir).unwrap();
    let p = lake_dir.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE av WITH (max_batch_rows = 25);
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}', format = 'avro', schema_registry = '{url}');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.plain (id INT NOT NULL, name VARCHAR, amount DECIMAL(10,2), ts TIMESTAMPTZ, d DATE, u UUID, opt VARCHAR, PRIMARY KEY (id));
CREATE TABLE k.acct (id INT NOT NULL, name VARCHAR, balance DECIMAL(10,2), opened_at TIMESTAMPTZ,
  updated_at TIMESTAMP, birthday DATE, ref UUID, PRIMARY KEY (id)) WITH (topic = 'dbz.public.acct');
CREATE TABLE lake.plain AS SELECT * FROM k.plain;
CREATE TABLE lake.acct AS SELECT * FROM k.acct;
",
            brokers = kafka.brokers,
            url = registry.url,
            lake = lake(&lake_dir)
        ),
    )
    .unwrap();
    run_to_end(&p);
    assert_eq!(
        lake_rows(&python, &lake_dir, "plain", "id").await,
        expected_plain
    );
    let expected_acct: Vec<Value> = state
        .values()
        .map(|v| {
            let mut v = v.clone();
            v["opened_at"] = json!("2024-01-02T03:04:05.123456+00:00");
            v["updated_at"] = json!(micros_text(v["updated_at"].as_i64().unwrap(), ""));
            v["birthday"] = json!(days_text(v["birthday"].as_i64().unwrap()));
            v
        })
        .collect();
    assert_eq!(
        lake_rows(&python, &lake_dir, "acct", "id").await,
        expected_acct
    );
    // Each schema was fetched once, not per message.
    let fetches = registry.fetches();
    assert!(
        fetches
            .as_object()
            .unwrap()
            .values()
            .all(|n| n == &json!(1))
            && fetches.as_object().unwrap().len() == 2,
        "{fetches}"
    );
}

/// Append-idempotent on Kafka into ClickHouse, partitioned (4 workers,
/// whose replays after a kill are at-least-once): through kill -9s, every
/// message reads once under `FINAL`, at its coordinate.
#[tokio::test]
async fn append_idempotent_into_clickhouse_reads_each_message_once_under_final() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start(&python, dir.path());
    let ch = common::ClickHouse::start(&python, &dir.path().join("ch"));
    ch.fresh_database("urutau_t_kafka").await;
    kafka.create_topic("events", 3);
    let n = 4000i64;
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"key": format!("k{}", i % 300), "value": json!({"id": i % 300, "n": i}).to_string()}))
        .collect();
    let offsets = kafka.produce("events", &messages);
    let p = dir.path().join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE kt WITH (max_batch_rows = 100, progress_interval = '1h');
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}', format = 'raw');
CREATE SINK ch INTO clickhouse WITH ({options});
CREATE TABLE k.events (id BIGINT NOT NULL, n BIGINT, PRIMARY KEY (id));
CREATE TABLE ch.log WITH (write_mode = 'append-idempotent', workers = 4) AS
  SELECT n, _stream AS stream, _shard AS shard, _sequence AS sequence FROM k.events;
",
            brokers = kafka.brokers,
            options = ch.sink_options("urutau_t_kafka")
        ),
    )
    .unwrap();
    common::kill_9_runs(&p, 11, 5, 150..600);
    run_to_end(&p);
    let once = ch
        .rows("SELECT count() AS n, uniqExact(stream, shard, sequence) AS u FROM urutau_t_kafka.log FINAL")
        .await;
    assert_eq!(
        once[0]["n"].as_u64().unwrap(),
        n as u64,
        "one row per message under FINAL"
    );
    assert_eq!(
        once[0]["u"].as_u64().unwrap(),
        n as u64,
        "each at its own coordinate"
    );
    let read: HashSet<(i32, i64, i64)> = ch
        .rows("SELECT shard, sequence, n FROM urutau_t_kafka.log FINAL")
        .await
        .iter()
        .map(|r| {
            let num = |k: &str| match &r[k] {
                Value::String(s) => s.parse::<i64>().unwrap(),
                v => v.as_i64().unwrap(),
            };
            (num("shard") as i32, num("sequence"), num("n"))
        })
        .collect();
    let expected: HashSet<(i32, i64, i64)> = offsets
        .iter()
        .zip(0..n)
        .map(|((p, o), i)| (*p, *o, i))
        .collect();
    assert!(read == expected, "every message at its coordinate");
}

/// The broker goes away under a run: killed mid-run (SIGKILL) and started
/// again on its data and port, the run carries on and reads what is
/// produced after; down when a run starts, the run waits for it and reads
/// once it is back. Every message lands once (DuckDB's read).
#[tokio::test]
async fn a_broker_killed_mid_run_or_down_at_start_is_ridden_out() {
    use common::pg_cdc::eventually;
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start(&python, dir.path());
    kafka.create_topic("items", 2);
    let rows = |ids| raw_items(ids, None);
    kafka.produce("items", &rows(0..200));
    let lake_dir = dir.path().join("lake");
    std::fs::create_dir_all(&lake_dir).unwrap();
    let p = lake_dir.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE kt WITH (max_batch_rows = 50, max_batch_interval = '200ms');
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}', format = 'raw');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.items (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT id, v FROM k.items;
",
            brokers = kafka.brokers,
            lake = lake(&lake_dir)
        ),
    )
    .unwrap();
    let ids =
        |rows: &[Value]| -> Vec<i64> { rows.iter().map(|r| r["id"].as_i64().unwrap()).collect() };
    let holds = |n: i64| {
        let (python, lake_dir) = (&python, &lake_dir);
        async move {
            match common::catalog_metadata_location(&lake_dir.join("catalog.db"), "bronze", "items")
                .await
            {
                Some(loc) => {
                    ids(&common::duckdb_rows(python, &loc, "id")) == (0..n).collect::<Vec<_>>()
                }
                None => false,
            }
        }
    };
    let log = dir.path().join("run.log");
    let spawn = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
            .args(["run", p.to_str().unwrap()])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap()
    };

    let mut child = spawn(&[]);
    assert!(
        eventually(120, || holds(200)).await,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    kafka.stop();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");
    kafka.start_again();
    kafka.produce("items", &rows(200..400));
    assert!(
        eventually(120, || holds(400)).await,
        "the run read what was produced after the restart: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(child.try_wait().unwrap().is_none(), "the run is still up");
    child.kill().unwrap();
    child.wait().unwrap();

    kafka.stop();
    let mut child = spawn(&["--exit-when-caught-up"]);
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run waits for the broker: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    kafka.start_again();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    kafka.produce("items", &rows(400..500));
    run_to_end(&p);
    assert!(holds(500).await, "every message once");
}

/// A Kafka table's declaration is its contract: a message with a field the
/// declaration lacks lands without it (counted), one without a declared
/// column lands NULL there, and the undeclared field is warned about once
/// (small batches, so the decoding lanes each meet it); with
/// `on_schema_mismatch = 'fail'` the first such message stops the run,
/// naming topic, partition, offset and field, and nothing of its batch
/// lands.
#[tokio::test]
async fn messages_that_do_not_fit_the_declaration_are_counted_or_stop_the_run() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start(&python, dir.path());
    kafka.create_topic("items", 1);
    let more = (4..=40).map(|i| json!({"id": i, "v": format!("v{i}"), "extra": i}));
    let messages: Vec<Value> = [
        json!({"id": 1, "v": "a"}),
        json!({"id": 2, "v": "b", "extra": true}),
        json!({"id": 3}),
    ]
    .into_iter()
    .chain(more)
    .map(|v| json!({"key": v["id"].to_string(), "value": v.to_string(), "partition": 0}))
    .collect();
    kafka.produce("items", &messages);
    for policy in ["ignore", "fail"] {
        let lake_dir = dir.path().join(policy);
        let p = write_pipeline(
            &lake_dir,
            &format!(
                "CREATE PIPELINE kt WITH (max_batch_rows = 4);
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}', format = 'raw', on_schema_mismatch = '{policy}');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.items (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT id, v FROM k.items;
",
                brokers = kafka.brokers,
                lake = lake(&lake_dir)
            ),
        );
        if policy == "ignore" {
            let out = run_to_end(&p);
            let got = lake_rows(&python, &lake_dir, "items", "id").await;
            let mut want = vec![
                json!({"id": 1, "v": "a"}),
                json!({"id": 2, "v": "b"}),
                json!({"id": 3, "v": null}),
            ];
            want.extend((4..=40).map(|i| json!({"id": i, "v": format!("v{i}")})));
            assert_eq!(got, want);
            let log = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                log.matches("a field the table declaration lacks").count(),
                1,
                "the undeclared field is warned about once: {log}"
            );
        } else {
            let out = common::urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(err.contains("items"), "{err}");
            assert!(err.contains("offset 1"), "{err}");
            assert!(err.contains("extra"), "{err}");
            assert!(err.contains("on_schema_mismatch = 'fail'"), "{err}");
            let landed =
                common::catalog_metadata_location(&lake_dir.join("catalog.db"), "bronze", "items")
                    .await;
            if let Some(loc) = landed {
                assert!(
                    common::duckdb_rows(&python, &loc, "id").is_empty(),
                    "nothing of the batch"
                );
            }
        }
    }
}

/// Real Debezium (`schemas.enable = true`) carries a column added at the
/// source in its events' schema part: the declared table (which never
/// names it) is planned again with it, and the Iceberg table gains the
/// column with its values, as DuckDB reads them.
#[tokio::test]
async fn a_column_added_at_the_source_reaches_iceberg_through_debezium() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let pg = Postgres::start(&dir.path().join("pg"));
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg.uri())
        .await
        .unwrap();
    pool.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a'), (2, 'b')",
    )
    .await
    .unwrap();
    let mut kafka = Kafka::start(&python, dir.path());
    kafka.start_debezium(&pg, "dbz_slot", "public.t", "dbz", true);
    let lake_dir = dir.path().join("lake");
    std::fs::create_dir_all(&lake_dir).unwrap();
    let p = lake_dir.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE kt;
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.t (id INT NOT NULL, v VARCHAR, PRIMARY KEY (id)) WITH (topic = 'dbz.public.t');
CREATE TABLE lake.t AS SELECT * FROM k.t;
",
            brokers = kafka.brokers,
            lake = lake(&lake_dir)
        ),
    )
    .unwrap();
    kafka.values("dbz.public.t", 2);
    run_to_end(&p);
    assert_eq!(lake_rows(&python, &lake_dir, "t", "id").await.len(), 2);

    pool.execute(
        "ALTER TABLE t ADD COLUMN qty bigint;
         INSERT INTO t VALUES (3, 'c', 30);
         UPDATE t SET qty = 5000000000 WHERE id = 1",
    )
    .await
    .unwrap();
    kafka.values("dbz.public.t", 4);
    run_to_end(&p);
    assert_eq!(
        lake_rows(&python, &lake_dir, "t", "id").await,
        vec![
            json!({"id": 1, "v": "a", "qty": 5_000_000_000i64}),
            json!({"id": 2, "v": "b", "qty": null}),
            json!({"id": 3, "v": "c", "qty": 30}),
        ]
    );
}

/// `CREATE SOURCE` options reaching the secure listeners of
/// [`Kafka::start_secure`] at `listener` (`sasl_ssl` or `ssl`), then `extra`.
fn secure_source(kafka: &Kafka, listener: &str, extra: &str) -> String {
    let s = kafka.secure.as_ref().expect("a broker with TLS listeners");
    format!(
        "brokers = '{}', format = 'raw'{extra}",
        s[listener].as_str().unwrap()
    )
}

/// A pipeline reading raw rows of `items` from the source options given
/// into Iceberg under `dir`.
fn items_pipeline(dir: &Path, source: &str) -> PathBuf {
    write_pipeline(
        dir,
        &format!(
            "CREATE PIPELINE kt WITH (max_batch_rows = 50, max_batch_interval = '200ms');
CREATE SOURCE k FROM kafka WITH ({source});
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.items (id BIGINT NOT NULL, v VARCHAR, PRIMARY KEY (id));
CREATE TABLE lake.items WITH (primary_key = 'id') AS
  SELECT id, v, _shard AS part, _sequence AS off FROM k.items;
",
            lake = lake(dir)
        ),
    )
}

/// Authenticated and encrypted brokers (issues 14 and 20), against a real
/// broker whose TLS listeners carry a certificate of the harness's test
/// CA: SCRAM-SHA-256 and PLAIN over SASL_SSL, and mutual TLS (a client
/// certificate) over an SSL listener that requires one. Each run reads
/// every message, and DuckDB's read of the Iceberg table equals what was
/// produced, message by message (partition and offset included).
#[tokio::test]
async fn sasl_scram_plain_and_mutual_tls_read_every_message() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start_secure(&python, dir.path());
    let s = kafka.secure.clone().unwrap();
    let text = |k: &str| s[k].as_str().unwrap().to_string();
    kafka.create_topic("items", 2);
    let offsets = kafka.produce("items", &raw_items(0..300, None));
    let expected: Vec<Value> = offsets
        .iter()
        .zip(0i64..)
        .map(|((p, o), i)| json!({"id": i, "v": format!("v{i}"), "part": p, "off": o}))
        .collect();
    let cases = [
        (
            "scram",
            secure_source(
                &kafka,
                "sasl_ssl",
                &format!(
                    ", sasl_mechanism = 'SCRAM-SHA-256', sasl_username = '{}', sasl_password = '{}', tls_ca = '{}'",
                    text("scram_user"),
                    text("scram_password"),
                    text("ca")
                ),
            ),
        ),
        (
            "plain",
            secure_source(
                &kafka,
                "sasl_ssl",
                &format!(
                    ", sasl_mechanism = 'PLAIN', sasl_username = '{}', sasl_password = '{}', tls_ca = '{}'",
                    text("plain_user"),
                    text("plain_password"),
                    text("ca")
                ),
            ),
        ),
        (
            "mtls",
            secure_source(
                &kafka,
                "ssl",
                &format!(
                    ", tls_ca = '{}', tls_cert = '{}', tls_key = '{}'",
                    text("ca"),
                    text("client_cert"),
                    text("client_key")
                ),
            ),
        ),
    ];
    for (name, source) in &cases {
        let lake_dir = dir.path().join(name);
        let p = items_pipeline(&lake_dir, source);
        let out = run_to_end(&p);
        let log = String::from_utf8_lossy(&out.stderr);
        for secret in [text("scram_password"), text("plain_password")] {
            assert!(
                !log.contains(&secret),
                "{name}: a password in the log: {log}"
            );
        }
        let got = lake_rows(&python, &lake_dir, "items", "id").await;
        assert_eq!(got.len(), expected.len(), "{name}");
        assert!(
            got == expected,
            "{name}: the lake differs from what was produced"
        );
    }
}

/// Runs `p` to its end or for at most `limit`: its exit code, its output
/// and log, and how long it ran (a run still going at `limit` fails the
/// test).
fn run_bounded(p: &Path, limit: std::time::Duration) -> (Option<i32>, String, std::time::Duration) {
    let t0 = std::time::Instant::now();
    let dir = p.parent().unwrap();
    let (out, err) = (dir.join("run.out"), dir.join("run.err"));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", p.to_str().unwrap(), "--exit-when-caught-up"])
        .args(["--log-level", "debug"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "the run did not end within {limit:?}: {}",
                std::fs::read_to_string(&err).unwrap()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out).unwrap() + &std::fs::read_to_string(&err).unwrap();
    (status.code(), text, t0.elapsed())
}

/// A broker refusing the client ends the run at once (exit 1, not retried
/// as an outage) with the broker, the problem and the option to set: a
/// wrong password, a CA that did not sign the broker's certificate, no
/// client certificate where the broker requires one. No password appears
/// in the output or the log (at debug level), and nothing lands.
#[tokio::test]
async fn refused_credentials_and_certificates_stop_the_run_naming_the_cause() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start_secure(&python, dir.path());
    let s = kafka.secure.clone().unwrap();
    let text = |k: &str| s[k].as_str().unwrap().to_string();
    kafka.create_topic("items", 1);
    kafka.produce("items", &raw_items(0..10, None));
    let broker = text("sasl_ssl");
    let wrong = format!("wrong{}", uuid::Uuid::new_v4().simple());
    let scram = |password: &str, ca: &str| {
        format!(
            ", sasl_mechanism = 'SCRAM-SHA-256', sasl_username = '{}', sasl_password = '{password}', tls_ca = '{}'",
            text("scram_user"),
            text(ca)
        )
    };
    let cases = [
        (
            "password",
            secure_source(&kafka, "sasl_ssl", &scram(&wrong, "ca")),
            format!(
                "Kafka broker {broker} refused the SASL authentication of user `urutau_scram` with SCRAM-SHA-256: check sasl_username and sasl_password"
            ),
        ),
        (
            "ca",
            secure_source(
                &kafka,
                "sasl_ssl",
                &scram(&text("scram_password"), "other_ca"),
            ),
            format!(
                "the TLS certificate of Kafka broker {broker} was refused: it is not signed by the CA in tls_ca `{}`",
                text("other_ca")
            ),
        ),
        (
            "client-cert",
            secure_source(&kafka, "ssl", &format!(", tls_ca = '{}'", text("ca"))),
            format!(
                "Kafka broker {} requires a client certificate (mutual TLS): set tls_cert and tls_key",
                text("ssl")
            ),
        ),
    ];
    for (name, source, expected) in &cases {
        let lake_dir = dir.path().join(name);
        let p = items_pipeline(&lake_dir, source);
        let (code, output, took) = run_bounded(&p, std::time::Duration::from_secs(90));
        assert_eq!(code, Some(1), "{name}: {output}");
        assert!(output.contains(expected.as_str()), "{name}: {output}");
        if *name == "ca" {
            // The certificate is named, read by a handshake of our own.
            assert!(
                output.contains("the broker presented a certificate with subject \"CN=localhost\", issued by \"CN=urutau test CA\""),
                "{name}: {output}"
            );
        }
        assert!(
            took < std::time::Duration::from_secs(20),
            "{name}: the refusal took {took:?} to end the run"
        );
        for secret in [&wrong, &text("scram_password")] {
            assert!(
                !output.contains(secret.as_str()),
                "{name}: a password in the output: {output}"
            );
        }
        // The table may have been made before the source connected.
        if let Some(loc) =
            common::catalog_metadata_location(&lake_dir.join("catalog.db"), "bronze", "items").await
        {
            assert_eq!(
                common::duckdb_rows(&python, &loc, "id"),
                Vec::<Value>::new(),
                "{name}"
            );
        }
    }
}

/// Security options are checked before anything runs (exit 2, at the
/// option, in the file), and `plan` shows the protocol and the mechanism
/// but never the password.
#[test]
fn kafka_security_options_are_validated_and_plan_hides_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let certs = common::certs(&dir.path().join("certs"));
    let ca = certs["ca"].as_str().unwrap();
    let p: PathBuf = dir.path().join("p.sql");
    let plan = |options: &str, args: &[&str]| -> (Option<i32>, String) {
        std::fs::write(
            &p,
            format!(
                "CREATE PIPELINE p;
CREATE SOURCE k FROM kafka WITH (brokers = 'b:9093', format = 'raw', {options});
CREATE SINK out INTO debug;
CREATE TABLE k.t (id INT NOT NULL, PRIMARY KEY (id));
CREATE TABLE out.t AS SELECT * FROM k.t;
"
            ),
        )
        .unwrap();
        let out = common::urutau(&[&["plan", p.to_str().unwrap()], args].concat());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let password = "Sup3r-secret-pw";
    let good = format!(
        "sasl_mechanism = 'SCRAM-SHA-256', sasl_username = 'alice', sasl_password = '{password}', tls_ca = '{ca}'"
    );
    let (code, out) = plan(&good, &["--explain"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("brokers=b:9093, format=raw, security=sasl_ssl, sasl_mechanism=SCRAM-SHA-256"),
        "{out}"
    );
    assert!(
        !out.contains(password),
        "the password in plan --explain: {out}"
    );
    let (code, out) = plan(&good, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("sasl_mechanism=SCRAM-SHA-256") && out.contains("sasl_password=***"),
        "{out}"
    );
    assert!(!out.contains(password), "the password in plan: {out}");
    let (_, out) = plan(&format!("tls_ca = '{ca}'"), &["--explain"]);
    assert!(out.contains("format=raw, security=ssl"), "{out}");

    // The YAML front end's camelCase keys are the same options.
    let y = dir.path().join("p.yaml");
    std::fs::write(
        &y,
        format!(
            "pipeline: p
source: {{name: k, kind: kafka, brokers: 'b:9093', format: raw, saslMechanism: PLAIN,
  saslUsername: alice, saslPassword: {password}, tlsCa: '{ca}'}}
sink: {{name: out, type: debug}}
tables:
  - source: t
    target: t
    primaryKey: [id]
    columns: {{id: int}}
"
        ),
    )
    .unwrap();
    let out = common::urutau(&["plan", "--explain", y.to_str().unwrap()]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("security=sasl_ssl, sasl_mechanism=PLAIN"),
        "{text}"
    );
    assert!(!text.contains(password), "the password in plan: {text}");

    // Bad combinations and missing files: exit 2, pointing at the option.
    let cases = [
        (
            "sasl_mechanism = 'PLAIN', sasl_username = 'alice'".to_string(),
            "p.sql:2:70",
            "sasl_mechanism = 'PLAIN' needs sasl_password",
        ),
        (
            format!("sasl_password = '{password}'"),
            "p.sql:2:70",
            "sasl_password is for SASL authentication, and no sasl_mechanism is set",
        ),
        (
            format!("tls_cert = '{}'", certs["client_cert"].as_str().unwrap()),
            "p.sql:2:70",
            "a client certificate needs both tls_cert and tls_key; tls_key is missing",
        ),
        (
            "tls_ca = '/no/such/ca.pem'".to_string(),
            "p.sql:2:79",
            "tls_ca `/no/such/ca.pem` cannot be read",
        ),
        (
            format!("tls = false, tls_ca = '{ca}'"),
            "p.sql:2:70",
            "tls = false, but tls_ca is set",
        ),
        (
            "sasl_mechanism = 'GSSAPI'".to_string(),
            "p.sql:2:",
            "expected one of PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512",
        ),
    ];
    for (options, at, message) in &cases {
        let (code, out) = plan(options, &[]);
        assert_eq!(code, Some(2), "{options}: {out}");
        assert!(
            out.contains(at) && out.contains(message),
            "{options}: {out}"
        );
        assert!(!out.contains(password), "the password in an error: {out}");
    }
}

/// Avro through SASL_SSL with the schema registry over HTTPS: the
/// registry's certificate is the harness CA's, which the source trusts
/// through `tls_ca` (the built-in roots do not hold it). The rows land as
/// produced, each schema fetched once.
#[tokio::test]
async fn avro_over_sasl_ssl_reads_an_https_registry_trusting_tls_ca() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start_secure(&python, dir.path());
    let s = kafka.secure.clone().unwrap();
    let text = |k: &str| s[k].as_str().unwrap().to_string();
    let certs = Path::new(s["ca"].as_str().unwrap()).parent().unwrap();
    let registry = SchemaRegistry::start_tls(
        dir.path(),
        &certs.join("server.crt"),
        &certs.join("server.key"),
    );
    let https = registry.https_url.clone().unwrap();
    kafka.create_topic("plain", 2);
    let (plain, expected) = plain_avro_rows();
    let lines: String = plain.iter().map(|l| format!("{l}\n")).collect();
    let schema = common::harness_script("avro").join("plain.avsc");
    kafka.command(
        &[
            "produce-avro",
            "--brokers",
            &kafka.brokers,
            "--topic",
            "plain",
            "--registry",
            &registry.url,
            "--schema-file",
            schema.to_str().unwrap(),
        ],
        Some(&lines),
    );
    let lake_dir = dir.path().join("lake");
    std::fs::create_dir_all(&lake_dir).unwrap();
    let p = lake_dir.join("p.sql");
    std::fs::write(
        &p,
        format!(
            "CREATE PIPELINE av WITH (max_batch_rows = 25);
CREATE SOURCE k FROM kafka WITH (brokers = '{brokers}', format = 'avro', schema_registry = '{https}',
  sasl_mechanism = 'SCRAM-SHA-512', sasl_username = '{user}', sasl_password = '{password}', tls_ca = '{ca}');
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE k.plain (id INT NOT NULL, name VARCHAR, amount DECIMAL(10,2), ts TIMESTAMPTZ, d DATE, u UUID, opt VARCHAR, PRIMARY KEY (id));
CREATE TABLE lake.plain AS SELECT * FROM k.plain;
",
            brokers = text("sasl_ssl"),
            user = text("scram_user"),
            password = text("scram_password"),
            ca = text("ca"),
            lake = lake(&lake_dir)
        ),
    )
    .unwrap();
    run_to_end(&p);
    assert_eq!(lake_rows(&python, &lake_dir, "plain", "id").await, expected);
    assert_eq!(
        registry.fetches(),
        json!({"1": 1}),
        "fetched over https, once"
    );
}

/// Debezium events in any field order and of odd shapes (the schema part
/// before or after the payload, `after` on a delete or a truncate, an
/// `after` beside the payload) land from Kafka as the file source lands
/// the same events, with the schema part's encodings; a value that does
/// not fit stops the run naming topic, partition, offset and field, or is
/// skipped with `on_decode_error = 'skip'`.
#[tokio::test]
async fn debezium_events_of_every_field_order_land_as_from_a_file() {
    let python = common::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let kafka = Kafka::start(&python, dir.path());
    // `ts` in milliseconds by the schema part (`io.debezium.time.Timestamp`),
    // in microseconds without one (Debezium's adaptive default): a row read
    // with the wrong encoding lands a different time.
    let row = r#"{"type":"struct","optional":true,"fields":[{"type":"int64","optional":false,"field":"id"},{"type":"int64","optional":true,"name":"io.debezium.time.Timestamp","version":1,"field":"ts"},{"type":"string","optional":true,"field":"v"}]"#;
    let schema = format!(
        r#"{{"type":"struct","optional":false,"name":"dbz.items.Envelope","fields":[{row},"field":"before"}},{row},"field":"after"}},{{"type":"string","optional":false,"field":"op"}}]}}"#
    );
    let src = r#""source":{"table":"items","ts_ms":1700000000000}"#;
    let truncate =
        format!(r#"{{"before":null,"after":{{"id":9,"ts":null,"v":"t"}},{src},"op":"t"}}"#);
    let events = [
        // Debezium's own order: images before `op` and `source`.
        format!(
            r#"{{"before":null,"after":{{"id":1,"ts":1700000000123456,"v":"a"}},{src},"op":"c"}}"#
        ),
        format!(r#"{{"op":"c","after":{{"id":2,"ts":null,"v":"b"}},{src}}}"#),
        // Wrapped, the schema part first (as Kafka Connect writes it).
        format!(
            r#"{{"schema":{schema},"payload":{{"before":{{"id":1,"ts":1700000000123,"v":"a"}},"after":{{"id":1,"ts":1700000000999,"v":"a2"}},{src},"op":"u"}}}}"#
        ),
        // Wrapped, the schema part last: its encodings still apply.
        format!(
            r#"{{"payload":{{"before":null,"after":{{"id":3,"ts":1700000000500,"v":"c"}},{src},"op":"c"}},"schema":{schema}}}"#
        ),
        format!(
            r#"{{"before":{{"id":2,"ts":null,"v":"b"}},"after":{{"id":2,"ts":null,"v":"zzz"}},{src},"op":"d"}}"#
        ),
        truncate.clone(),
        format!(
            r#"{{"after":{{"id":8,"ts":null,"v":"no"}},"payload":{{"before":null,"after":{{"id":4,"ts":null,"v":"d"}},{src},"op":"c"}}}}"#
        ),
        format!(r#"{{"before":null,"after":{{"id":5,"ts":0,"v":"e"}},{src},"op":"r"}}"#),
    ];
    // Each event a message of partition 0 of `topic`.
    let produce = |topic: &str, events: &[String]| {
        kafka.create_topic(topic, 1);
        let messages: Vec<Value> = events
            .iter()
            .map(|e| json!({"key": "k", "value": e, "partition": 0}))
            .collect();
        kafka.produce(topic, &messages);
    };
    produce("items", &events);
    // The file source cannot replay a truncate: the same events without it.
    let file = dir.path().join("items.jsonl");
    let lines: Vec<&str> = events
        .iter()
        .filter(|e| **e != truncate)
        .map(String::as_str)
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let pipeline = |name: &str, source: &str, topic: Option<&str>, batch_rows: usize| {
        let lake_dir = dir.path().join(name);
        let p = write_pipeline(
            &lake_dir,
            &format!(
                "CREATE PIPELINE {name} WITH (max_batch_rows = {batch_rows});
{source}
CREATE SINK lake INTO iceberg WITH ({lake});
CREATE TABLE s.items (id BIGINT NOT NULL, ts TIMESTAMP, v VARCHAR, PRIMARY KEY (id)){with};
CREATE TABLE lake.items WITH (primary_key = 'id') AS SELECT id, ts, v FROM s.items;
",
                lake = lake(&lake_dir),
                with = topic.map_or(String::new(), |t| format!(" WITH (topic = '{t}')"))
            ),
        );
        (lake_dir, p)
    };
    let (file_dir, p) = pipeline(
        "f",
        &format!(
            "CREATE SOURCE s FROM file WITH (path = '{}');",
            file.display()
        ),
        None,
        100,
    );
    run_to_end(&p);
    let from_file = lake_rows(&python, &file_dir, "items", "id").await;
    // Each event a batch of its own, and all in one batch.
    let mut from_kafka = Vec::new();
    for batch_rows in [1, 100] {
        let (kafka_dir, p) = pipeline(
            &format!("k{batch_rows}"),
            &format!(
                "CREATE SOURCE s FROM kafka WITH (brokers = '{}', format = 'debezium-json', on_truncate = 'ignore');",
                kafka.brokers
            ),
            Some("items"),
            batch_rows,
        );
        run_to_end(&p);
        from_kafka = lake_rows(&python, &kafka_dir, "items", "id").await;
        assert_eq!(from_kafka, from_file, "{batch_rows} rows a batch");
    }
    let ids: Vec<(i64, &str)> = from_kafka
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r["v"].as_str().unwrap()))
        .collect();
    assert_eq!(ids, [(1, "a2"), (3, "c"), (4, "d"), (5, "e")]);
    for (i, when) in [(0, "2023-11-14"), (1, "2023-11-14"), (3, "1970-01-01")] {
        let ts = from_kafka[i]["ts"].to_string();
        assert!(ts.contains(when), "{ts}: {:?}", from_kafka[i]);
    }
    assert!(
        from_kafka[0]["ts"].to_string().contains("20.999"),
        "{from_kafka:?}"
    );
    assert!(
        from_kafka[1]["ts"].to_string().contains("20.5"),
        "{from_kafka:?}"
    );

    // A value that does not fit.
    let bad = [
        format!(r#"{{"before":null,"after":{{"id":6,"ts":null,"v":"f"}},{src},"op":"c"}}"#),
        format!(r#"{{"before":null,"after":{{"id":"seven","ts":null,"v":"g"}},{src},"op":"c"}}"#),
        format!(r#"{{"before":null,"after":{{"id":8,"ts":null,"v":"h"}},{src},"op":"c"}}"#),
    ];
    produce("bad", &bad);
    for policy in ["fail", "skip"] {
        let (lake_dir, p) = pipeline(
            &format!("bad_{policy}"),
            &format!(
                "CREATE SOURCE s FROM kafka WITH (brokers = '{}', format = 'debezium-json', on_decode_error = '{policy}');",
                kafka.brokers
            ),
            Some("bad"),
            100,
        );
        // Not `run_to_end`: the failing policy must end in an error.
        let out = common::urutau(&["run", p.to_str().unwrap(), "--exit-when-caught-up"]);
        let err = String::from_utf8_lossy(&out.stderr);
        if policy == "fail" {
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(
                err.contains("topic bad partition 0 offset 1")
                    && err.contains("field `id`")
                    && err.contains("\"seven\""),
                "{err}"
            );
        } else {
            assert!(out.status.success(), "{err}");
            let got = lake_rows(&python, &lake_dir, "items", "id").await;
            let ids: Vec<i64> = got.iter().map(|r| r["id"].as_i64().unwrap()).collect();
            assert_eq!(ids, [6, 8], "{got:?}");
        }
    }
}
