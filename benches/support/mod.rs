//! What the benchmarks share: the registry, the change generator, memory
//! readings.
#![allow(dead_code)]

use std::io::Write;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Decimal128Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use urutau_planner::registry::Registry;

pub mod clickhouse;
pub mod postgres;

/// Every source and sink kind.
pub fn registry() -> Registry {
    urutau::registry()
}

/// Plans a pipeline's SQL and runs it until it has caught up: the run
/// every bench times.
pub async fn run_to_end(text: &str) -> urutau::RunReport {
    let pipeline = urutau::Pipeline::from_sql(text, "bench").await.unwrap();
    pipeline
        .run(urutau::RunOptions {
            exit_when_caught_up: true,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// The declared columns of the benchmark table (7 columns).
pub const COLUMNS: &str =
    "id BIGINT NOT NULL, customer_id BIGINT, amount DECIMAL(12,2), status VARCHAR,
    created_at TIMESTAMPTZ, qty INT, note VARCHAR, PRIMARY KEY (id)";

pub fn row(id: u64, rng: &mut StdRng) -> String {
    format!(
        r#"{{"id":{id},"customer_id":{},"amount":"{}.{:02}","status":"{}","created_at":"2024-0{}-1{}T10:{:02}:00Z","qty":{},"note":{}}}"#,
        rng.random_range(1..50_000),
        rng.random_range(0..100_000),
        rng.random_range(0..100),
        ["new", "paid", "shipped", "cancelled"][rng.random_range(0..4)],
        rng.random_range(1..10),
        rng.random_range(0..10),
        rng.random_range(0..60),
        rng.random_range(1..20),
        if rng.random_bool(0.2) {
            "null".to_string()
        } else {
            format!("\"note {}\"", rng.random_range(0..1000))
        }
    )
}

/// Changes over 100k keys: about 50% updates, 35% inserts, 15% deletes.
/// Returns the file's size and the number of keys live at the end.
pub fn generate(path: &std::path::Path, changes: usize) -> (u64, usize) {
    let mut rng = StdRng::seed_from_u64(7);
    let mut live: Vec<Option<String>> = vec![None; 100_000];
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut n = 0;
    let mut ts = 1_700_000_000_000u64;
    while n < changes {
        let id = rng.random_range(0..live.len());
        let roll = rng.random_range(0..100);
        ts += 1;
        let line = match &live[id] {
            None => {
                let after = row(id as u64, &mut rng);
                live[id] = Some(after.clone());
                format!(
                    r#"{{"op":"c","before":null,"after":{after},"source":{{"table":"t","ts_ms":{ts}}}}}"#
                )
            }
            Some(before) if roll < 77 => {
                let after = row(id as u64, &mut rng);
                let l = format!(
                    r#"{{"op":"u","before":{before},"after":{after},"source":{{"table":"t","ts_ms":{ts}}}}}"#
                );
                live[id] = Some(after);
                l
            }
            Some(before) => {
                let l = format!(
                    r#"{{"op":"d","before":{before},"after":null,"source":{{"table":"t","ts_ms":{ts}}}}}"#
                );
                live[id] = None;
                l
            }
        };
        writeln!(out, "{line}").unwrap();
        n += 1;
    }
    out.flush().unwrap();
    // On disk before anything is timed: otherwise the write-back of the
    // input competes with the run's own writes and syncs.
    out.get_ref().sync_all().unwrap();
    (
        std::fs::metadata(path).unwrap().len(),
        live.iter().filter(|l| l.is_some()).count(),
    )
}

/// Starts the peak RSS (VmHWM) over, so each run's peak is its own; false
/// when the kernel does not allow it (the peak is then of the process).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The metadata location the SQL catalog (SQLite file `db`) holds for
/// `namespace.table`.
pub async fn metadata_location(db: &std::path::Path, namespace: &str, table: &str) -> String {
    use sqlx::Row;
    let url = format!("sqlite://{}?mode=ro", db.display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let row = sqlx::query(
        "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
    )
    .bind(namespace)
    .bind(table)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    row.get::<String, _>(0)
}

/// A script of the test harness (`tests/harness/NAME`).
pub fn harness_script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/harness")
        .join(name)
}

/// The python with the harness's readers (`URUTAU_TEST_PYTHON`, else the
/// venv tests/harness/setup makes); a bench without it fails and says so.
pub fn harness_python() -> std::path::PathBuf {
    let python = std::env::var("URUTAU_TEST_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| "/var/tmp/urutau-test-venv/bin/python".into());
    assert!(
        python.exists(),
        "{} is missing: run tests/harness/setup (scripts/test does)",
        python.display()
    );
    python
}

/// A digest of the Iceberg table at `metadata` by Apache Iceberg's own
/// Java library (`tests/harness/IcebergRead.java --digest`: rows, `sum`
/// per integer/decimal column, `length` per string column): the second
/// independent reader, quick where DuckDB's iceberg extension is slow
/// (many snapshots of equality deletes). Needs
/// `tests/harness/iceberg-java-fetch` (`URUTAU_TEST_ICEBERG_JAVA`).
pub fn iceberg_java_digest(metadata: &str) -> serde_json::Value {
    let home = std::env::var("URUTAU_TEST_ICEBERG_JAVA")
        .unwrap_or_else(|_| "/var/tmp/urutau-iceberg-java".into());
    assert!(
        std::path::Path::new(&home)
            .join("classes/IcebergRead.class")
            .exists(),
        "the Java Iceberg reader is missing under {home}: run tests/harness/iceberg-java-fetch (scripts/test does)"
    );
    let out = std::process::Command::new("java")
        .arg("-Xmx2g")
        .arg("-cp")
        .arg(format!("{home}/lib/*:{home}/classes"))
        .args(["IcebergRead", metadata, "--digest"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "Iceberg's Java reader could not read {metadata}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// DuckDB's one-row answer to `select` (SQL expressions, e.g. aggregates)
/// over the Iceberg table whose metadata is at `metadata`: a digest of a
/// table too big to print, read by an independent reader.
pub fn duckdb_select(metadata: &str, select: &str) -> serde_json::Value {
    iceberg_read(metadata, &["--select", select])
}

/// `tests/harness/iceberg_read.py METADATA ARGS`'s one JSON answer.
fn iceberg_read(metadata: &str, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(harness_python())
        .arg(harness_script("iceberg_read.py"))
        .arg(metadata)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "DuckDB could not read {metadata}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// DuckDB's `count(*)` over an Iceberg table and over its data files.
pub struct TimedCount {
    /// Rows `iceberg_scan` counts (deletes applied).
    pub table_rows: u64,
    /// Seconds that count took.
    pub table_seconds: f64,
    /// Live data files of the current snapshot.
    pub data_files: usize,
    /// Their sizes in bytes, largest first.
    pub data_file_sizes: Vec<u64>,
    /// Seconds counting those files directly as Parquet took.
    pub files_seconds: f64,
    /// Live position delete files.
    pub position_deletes: usize,
    /// Live equality delete files.
    pub equality_deletes: usize,
}

impl TimedCount {
    /// One line saying what the count cost against the files' and why.
    pub fn describe(&self) -> String {
        format!(
            "DuckDB count(*): {:.3} s over the table, {:.3} s over its {} data files read directly ({:.2}x; MiB: {}); {} position and {} equality delete files",
            self.table_seconds,
            self.files_seconds,
            self.data_files,
            self.table_seconds / self.files_seconds.max(1e-6),
            self.data_file_sizes
                .iter()
                .map(|b| format!("{:.1}", *b as f64 / f64::from(1 << 20)))
                .collect::<Vec<_>>()
                .join(", "),
            self.position_deletes,
            self.equality_deletes
        )
    }
}

/// Times DuckDB's `count(*)` over the table at `metadata` and over its
/// data files read directly (`iceberg_read.py --time-count`).
pub fn duckdb_time_count(metadata: &str) -> TimedCount {
    let v = iceberg_read(metadata, &["--time-count"]);
    TimedCount {
        table_rows: v["table_rows"].as_u64().unwrap(),
        table_seconds: v["table_seconds"].as_f64().unwrap(),
        data_files: v["data_files"].as_u64().unwrap() as usize,
        data_file_sizes: v["data_file_sizes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_u64().unwrap())
            .collect(),
        files_seconds: v["files_seconds"].as_f64().unwrap(),
        position_deletes: v["position_delete_files"].as_u64().unwrap() as usize,
        equality_deletes: v["equality_delete_files"].as_u64().unwrap() as usize,
    }
}

/// Peak resident memory of this process so far (VmHWM).
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Rows of the benchmark table, built in memory (not timed).
pub fn table_batches(rows: usize, batch_rows: usize, tz: &str) -> Vec<RecordBatch> {
    let mut rng = StdRng::seed_from_u64(3);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("customer_id", DataType::Int64, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new("status", DataType::Utf8, true),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some(tz.into())),
            true,
        ),
        Field::new("qty", DataType::Int32, true),
        Field::new("note", DataType::Utf8, true),
    ]));
    (0..rows.div_ceil(batch_rows))
        .map(|b| {
            let n = batch_rows.min(rows - b * batch_rows);
            let columns: Vec<ArrayRef> =
                vec![
                    Arc::new(Int64Array::from_iter_values(
                        (0..n).map(|_| rng.random_range(0..100_000)),
                    )),
                    Arc::new(Int64Array::from_iter_values(
                        (0..n).map(|_| rng.random_range(1..50_000)),
                    )),
                    Arc::new(
                        Decimal128Array::from_iter_values(
                            (0..n).map(|_| rng.random_range(0..10_000_000i128)),
                        )
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                    ),
                    Arc::new(StringArray::from_iter_values((0..n).map(|_| {
                        ["new", "paid", "shipped", "cancelled"][rng.random_range(0..4)]
                    }))),
                    Arc::new(
                        TimestampMicrosecondArray::from_iter_values((0..n).map(|_| {
                            1_700_000_000_000_000 + rng.random_range(0..10_000_000_000i64)
                        }))
                        .with_timezone(tz),
                    ),
                    Arc::new(Int32Array::from_iter_values(
                        (0..n).map(|_| rng.random_range(1..20)),
                    )),
                    Arc::new(StringArray::from_iter((0..n).map(|_| {
                        rng.random_bool(0.8)
                            .then(|| format!("note {}", rng.random_range(0..1000)))
                    }))),
                ];
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        })
        .collect()
}

/// CPU time (user + system, every thread) this process has used so far, in
/// seconds: how much of the two cores a run took, beside its wall time.
pub fn cpu_seconds() -> f64 {
    process_cpu_seconds("self")
}

/// CPU seconds every process of the machine has used so far (user, nice,
/// system, interrupts): with [`cpu_seconds`], what the server beside this
/// process took.
pub fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle, iowait.
    [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum::<f64>()
        / 100.0
}

/// CPU seconds (user + system) process `pid` (`self`, or a number) has
/// used so far; 0 when it cannot be read.
pub fn process_cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces, in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 12 and 13 here.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// A timed run of a file-source pipeline to its end: wall seconds, CPU
/// seconds, and the report, after checking that its first route's position
/// is the end of the input (`bytes` long).
pub fn timed_run(
    runtime: &tokio::runtime::Runtime,
    text: &str,
    bytes: u64,
) -> (f64, f64, urutau_engine::RunReport) {
    let started = std::time::Instant::now();
    let cpu_before = cpu_seconds();
    let report = runtime.block_on(run_to_end(text));
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    assert_eq!(
        report.routes[0].position.as_deref(),
        Some(bytes.to_string().as_str()),
        "the table's position is the end of the input"
    );
    (secs, cpu, report)
}
