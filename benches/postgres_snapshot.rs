//! The initial snapshot of one Postgres table (bigint key, bigint,
//! numeric(12,2), text, timestamptz, text; 5M rows) into Iceberg (the
//! embedded default: SQLite catalog, local warehouse) and into ClickHouse,
//! against two ceilings measured in the same run on the same machine:
//! `COPY (SELECT * FROM orders) TO STDOUT` through psql to /dev/null, and
//! writing the same rows as Parquet (ZSTD) with arrow-rs. Prints rows/s,
//! the ratio to the lower ceiling, peak RSS and CPU (this process's, and
//! the machine's, which includes the server's) at each
//! `snapshot_parallelism`; then checks each result with a reader of its
//! own: DuckDB for Iceberg (count and sums of every column equal
//! Postgres's), the ClickHouse engine for ClickHouse.
//!
//! While each Iceberg snapshot runs, a writer updates a few thousand rows
//! spread over the table (`POSTGRES_SNAPSHOT_WRITES`, default 3,000; 300
//! in the smoke run), so the snapshot's windows meet live changes as in
//! production; DuckDB's `count(*)` over the table is timed against
//! counting its data files directly (the issue asks for at most 2x) right
//! after the snapshot's run, again after a second run has streamed
//! the writes that came after the snapshot, and after a third run that
//! streams 100 more with compaction on (at `POSTGRES_SNAPSHOT_TARGET_FILE_SIZE`
//! when set: files of that size get position deletes instead of a
//! rewrite); each count also lists the data files' sizes.
//!
//! `cargo bench --bench postgres_snapshot`; `POSTGRES_SNAPSHOT_ROWS`
//! changes the size, `POSTGRES_SNAPSHOT_PARALLELISM=1,2` the settings run,
//! `POSTGRES_SNAPSHOT_CHUNK_ROWS` the chunk size and
//! `POSTGRES_SNAPSHOT_BATCH_ROWS` the rows per commit (default: the
//! source's),
//! `POSTGRES_SNAPSHOT_READ_BACK=0` leaves DuckDB's read-back out;
//! `POSTGRES_SNAPSHOT_TARGET_FILE_SIZE` sets the Iceberg sink's
//! `target_file_size` (default 512 MiB).
//! Under `cargo test` it runs a small smoke test (and fails in CI when no
//! PostgreSQL server package is installed).

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sqlx::Executor;
use support::postgres::{self, Server};
use support::{cpu_seconds, machine_cpu_seconds, peak_rss_mib, reset_peak_rss};

/// `created_at` of row 0, in microseconds (2024-01-01 00:00:00 UTC).
const EPOCH_MICROS: i64 = 1_704_067_200_000_000;
const STATUSES: [&str; 4] = ["new", "paid", "shipped", "cancelled"];

/// The table, filled from `generate_series` by the formulas
/// [`parquet_ceiling`] repeats in Rust.
const CREATE: &str = "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL,
    amount numeric(12,2), status text, created_at timestamptz, note text)";
const FILL: &str = "INSERT INTO orders SELECT g, g % 50000, (g % 1000000) / 100.0,
    (ARRAY['new','paid','shipped','cancelled'])[g % 4 + 1],
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', 'note ' || (g % 1000)
    FROM generate_series($1::bigint, $2::bigint) g";

/// Count and sums of every column (amounts in cents, times in seconds
/// after the first row's): what each reader must agree on, in this order.
const DIGEST: [&str; 7] = [
    "n",
    "ids",
    "customers",
    "cents",
    "statuses",
    "seconds",
    "notes",
];

/// The digest's select list in DuckDB's SQL.
const DUCKDB_DIGEST: &str = "count(*) AS n, sum(id) AS ids, sum(customer_id) AS customers, \
    CAST(sum(amount) * 100 AS BIGINT) AS cents, sum(length(status)) AS statuses, \
    CAST(sum(epoch(created_at) - 1704067200) AS BIGINT) AS seconds, sum(length(note)) AS notes";

/// One measured run.
struct Measured {
    secs: f64,
    cpu: f64,
    machine_cpu: f64,
    rss: f64,
}

impl Measured {
    fn print(&self, what: &str, rows: usize, ceiling: f64) {
        let rate = rows as f64 / self.secs;
        println!(
            "postgres_snapshot: {what}: {:.2} s, {rate:.0} rows/s, {:.2} of the lower ceiling; peak RSS {:.0} MiB; \
             CPU {:.1} s here ({:.0}% of a core), {:.1} s on the machine ({:.0}% of {} cores)",
            self.secs,
            rate / ceiling,
            self.rss,
            self.cpu,
            self.cpu / self.secs * 100.0,
            self.machine_cpu,
            self.machine_cpu / self.secs / cores() as f64 * 100.0,
            cores(),
        );
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Times `f`, with this process's CPU, the machine's and the peak RSS.
fn measure<T>(f: impl FnOnce() -> T) -> (T, Measured) {
    reset_peak_rss();
    let (cpu, machine) = (cpu_seconds(), machine_cpu_seconds());
    let started = Instant::now();
    let out = f();
    let m = Measured {
        secs: started.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - cpu,
        machine_cpu: machine_cpu_seconds() - machine,
        rss: peak_rss_mib(),
    };
    (out, m)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("postgres_snapshot: benchmark");
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let rows: usize = env_or(
        "POSTGRES_SNAPSHOT_ROWS",
        if full { 5_000_000 } else { 20_000 },
    );
    let settings: Vec<usize> = std::env::var("POSTGRES_SNAPSHOT_PARALLELISM")
        .unwrap_or_else(|_| if full { "1,2".into() } else { "2".into() })
        .split(',')
        .map(|p| {
            p.trim()
                .parse()
                .expect("POSTGRES_SNAPSHOT_PARALLELISM: numbers")
        })
        .collect();
    let chunk = [
        ("POSTGRES_SNAPSHOT_CHUNK_ROWS", "snapshot_chunk_rows"),
        ("POSTGRES_SNAPSHOT_BATCH_ROWS", "snapshot_batch_rows"),
    ]
    .iter()
    .filter_map(|(var, option)| {
        let v = std::env::var(var).ok()?;
        Some(format!(", {option} = {v}"))
    })
    .collect::<String>();
    // The Iceberg sink's data file size (a snapshot is gathered into
    // files of it; default 512 MiB).
    let file_size = std::env::var("POSTGRES_SNAPSHOT_TARGET_FILE_SIZE")
        .map(|v| format!(", target_file_size = '{v}'"))
        .unwrap_or_default();
    // `POSTGRES_SNAPSHOT_READ_BACK=0` leaves DuckDB's read of the Iceberg
    // table out of a full run. The smoke run under `cargo test` always
    // reads back; ClickHouse's read-back always runs.
    let read_back = !full || std::env::var("POSTGRES_SNAPSHOT_READ_BACK").as_deref() != Ok("0");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("pg"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(fill(&server.uri, rows));
    let writes: usize = env_or("POSTGRES_SNAPSHOT_WRITES", if full { 3_000 } else { 300 });
    println!(
        "postgres_snapshot: {rows} rows of 6 columns, {cores} cores",
        cores = cores()
    );

    let (_, copy) = measure(|| copy_ceiling(&server.uri));
    let parquet = parquet_ceiling(&dir.path().join("ceiling.parquet"), rows);
    let (copy_rate, parquet_rate) = (rows as f64 / copy.secs, rows as f64 / parquet.secs);
    let lower = copy_rate.min(parquet_rate);
    copy.print("ceiling COPY TO STDOUT (psql to /dev/null)", rows, lower);
    parquet.print("ceiling Parquet write (arrow-rs, ZSTD)", rows, lower);

    let ch = support::clickhouse::server(&dir.path().join("ch"));
    for (run, p) in settings.iter().enumerate() {
        let lake = dir.path().join(format!("lake{run}"));
        std::fs::create_dir_all(&lake).unwrap();
        let text = format!(
            "CREATE PIPELINE bench;
             CREATE SOURCE pg FROM postgres WITH (uri = '{uri}', slot = 'lake{run}', snapshot_parallelism = {p}{chunk});
             CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/warehouse', namespace = 'b'{file_size});
             CREATE TABLE lake.orders AS SELECT * FROM pg.orders;",
            uri = server.uri,
            d = lake.display()
        );
        // The table's current metadata, and DuckDB's count(*) over the
        // table as it is now, printed after `moment`.
        let location = || {
            runtime.block_on(support::metadata_location(
                &lake.join("catalog.db"),
                "b",
                "orders",
            ))
        };
        let time_count = |moment: &str| {
            let count = support::duckdb_time_count(&location());
            println!("postgres_snapshot: {moment}, {}", count.describe());
            count
        };
        let writer = runtime.spawn(update_rows(server.uri.clone(), rows, writes, run as u64));
        let (report, m) = measure(|| runtime.block_on(support::run_to_end(&text)));
        m.print(&format!("Iceberg, snapshot_parallelism {p}"), rows, lower);
        let route = &report.routes[0];
        assert!(
            route.rows >= rows as u64,
            "every row reached the table ({} of {rows})",
            route.rows
        );
        if read_back {
            // What the issue times: a reader right after the snapshot,
            // whose deletes are the writer's changes during it.
            time_count("right after the snapshot run");
        }
        // The run ends once caught up with the WAL as it was when it
        // started streaming: a second run (not timed) takes the writes
        // after that, so the table ends equal to Postgres.
        runtime.block_on(writer).unwrap();
        runtime.block_on(support::run_to_end(&text));
        println!("postgres_snapshot: {writes} updates by a concurrent writer during the snapshot");
        let files = data_files(&lake.join("warehouse"));
        println!(
            "postgres_snapshot: Iceberg: {} commits by the timed run; {} data files, {} delete files in the end (snapshot rows are plain appends; deletes are for the keys the writer touched)",
            route.commits, files.0, files.1
        );
        if read_back {
            let count =
                time_count("after the second run (the writes streamed after the snapshot too)");
            assert_eq!(count.table_rows, rows as u64, "DuckDB counts every row");
            // A third run (not timed) streams a few more writes with
            // compaction on, at the sink's file size: a file of that size
            // keeps its rows, the equality deletes on it become position
            // deletes; smaller ones are rewritten.
            let compaction = format!(
                ", maintenance_enabled = true, maintenance_compaction_interval = '0s', maintenance_compaction_min_input_files = 2{}",
                std::env::var("POSTGRES_SNAPSHOT_TARGET_FILE_SIZE")
                    .map(|v| format!(", maintenance_compaction_target_file_size = '{v}'"))
                    .unwrap_or_default()
            );
            runtime.block_on(update_rows(
                server.uri.clone(),
                rows,
                100,
                1000 + run as u64,
            ));
            let compacting =
                text.replace("namespace = 'b'", &format!("namespace = 'b'{compaction}"));
            runtime.block_on(support::run_to_end(&compacting));
            let count = time_count("after a third run with compaction (100 more writes)");
            assert_eq!(count.table_rows, rows as u64, "DuckDB counts every row");
            let want = runtime.block_on(digest(&server.uri));
            let started = Instant::now();
            let got = support::duckdb_select(&location(), DUCKDB_DIGEST);
            let got: Vec<i64> = DIGEST.iter().map(|k| got[k].as_i64().unwrap()).collect();
            println!(
                "postgres_snapshot: DuckDB read the digest in {:.2} s",
                started.elapsed().as_secs_f64()
            );
            assert_eq!(
                got, want,
                "DuckDB's read of the Iceberg table equals Postgres"
            );
        } else {
            println!("postgres_snapshot: no DuckDB read-back (POSTGRES_SNAPSHOT_READ_BACK=0)");
        }

        let database = format!("b{run}");
        let text = format!(
            "CREATE PIPELINE bench;
             CREATE SOURCE pg FROM postgres WITH (uri = '{uri}', slot = 'ch{run}', snapshot_parallelism = {p}{chunk});
             CREATE SINK ch INTO clickhouse WITH (uri = '{url}', user = '{user}', password = '{password}', database = '{database}');
             CREATE TABLE ch.orders AS SELECT * FROM pg.orders;",
            uri = server.uri,
            url = ch.url,
            user = ch.user,
            password = ch.password,
        );
        let (report, m) = measure(|| runtime.block_on(support::run_to_end(&text)));
        m.print(
            &format!("ClickHouse, snapshot_parallelism {p}"),
            rows,
            lower,
        );
        assert_eq!(
            report.routes[0].rows, rows as u64,
            "every row reached the table"
        );
        let want = runtime.block_on(digest(&server.uri));
        let got = runtime.block_on(clickhouse_digest(&ch, &database));
        assert_eq!(got, want, "ClickHouse's read of the table equals Postgres");
    }
    println!("postgres_snapshot: DuckDB's and ClickHouse's reads equal Postgres");
}

/// Creates and fills the table (not timed).
async fn fill(uri: &str, rows: usize) {
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(uri)
        .await
        .unwrap();
    db.execute(CREATE).await.unwrap();
    let step = 1_000_000;
    for lo in (1..=rows).step_by(step) {
        sqlx::query(FILL)
            .bind(lo as i64)
            .bind((lo + step - 1).min(rows) as i64)
            .execute(&db)
            .await
            .unwrap();
    }
    // Hint bits set and statistics fresh, so no reader pays for them.
    db.execute("VACUUM ANALYZE orders").await.unwrap();
    db.close().await;
}

/// The concurrent writer: `n` updates of rows spread over the table
/// (ids from a seeded generator, `seed` per run), about 2 ms apart, so
/// they fall inside the snapshot's windows.
async fn update_rows(uri: String, rows: usize, n: usize, seed: u64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&uri)
        .await
        .unwrap();
    for _ in 0..n {
        let id = rng.random_range(1..=rows as i64);
        sqlx::query("UPDATE orders SET amount = amount + 1, note = note || '+' WHERE id = $1")
            .bind(id)
            .execute(&mut conn)
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// The table's digest, by Postgres.
async fn digest(uri: &str) -> Vec<i64> {
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(uri)
        .await
        .unwrap();
    let digest: Vec<i64> = sqlx::query_scalar(
        "SELECT ARRAY[count(*), sum(id), sum(customer_id), sum(amount * 100),
                sum(length(status)), sum(extract(epoch FROM created_at) - 1704067200),
                sum(length(note))]::bigint[] FROM orders",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    digest
}

/// `COPY (SELECT * FROM orders) TO STDOUT` through psql into /dev/null.
fn copy_ceiling(uri: &str) {
    let status = Command::new(postgres::bin("psql"))
        .args([
            "-X",
            "-q",
            "-d",
            uri,
            "-c",
            "COPY (SELECT * FROM orders) TO STDOUT",
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "psql COPY failed");
}

/// The same rows as Arrow batches (built first, not timed) written as one
/// Parquet file with ZSTD, as the Iceberg sink writes its data files: the
/// write's figures.
fn parquet_ceiling(path: &Path, rows: usize) -> Measured {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("customer_id", DataType::Int64, false),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new("status", DataType::Utf8, true),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("note", DataType::Utf8, true),
    ]));
    let batch_rows = 10_000;
    let batches: Vec<RecordBatch> = (1..=rows as i64)
        .step_by(batch_rows)
        .map(|lo| {
            let g: Vec<i64> = (lo..=(lo + batch_rows as i64 - 1).min(rows as i64)).collect();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(g.clone())),
                Arc::new(Int64Array::from_iter_values(g.iter().map(|g| g % 50_000))),
                Arc::new(
                    Decimal128Array::from_iter_values(g.iter().map(|g| (g % 1_000_000) as i128))
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                ),
                Arc::new(StringArray::from_iter_values(
                    g.iter().map(|g| STATUSES[(g % 4) as usize]),
                )),
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values(
                        g.iter().map(|g| EPOCH_MICROS + g * 1_000_000),
                    )
                    .with_timezone("UTC"),
                ),
                Arc::new(StringArray::from_iter_values(
                    g.iter().map(|g| format!("note {}", g % 1000)),
                )),
            ];
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        })
        .collect();
    let ((), m) = measure(|| {
        let file = std::fs::File::create(path).unwrap();
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.close().unwrap();
    });
    m
}

/// Data and delete files under an Iceberg warehouse.
fn data_files(warehouse: &Path) -> (usize, usize) {
    let mut counts = (0, 0);
    let mut stack = vec![warehouse.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                stack.push(p);
            } else if name.ends_with(".parquet") {
                if name.starts_with("data-") {
                    counts.0 += 1;
                } else {
                    counts.1 += 1;
                }
            }
        }
    }
    counts
}

/// The digest by the ClickHouse engine (`FINAL`: one row per key).
async fn clickhouse_digest(ch: &support::clickhouse::Server, database: &str) -> Vec<i64> {
    let client = clickhouse::Client::default()
        .with_url(&ch.url)
        .with_user(&ch.user)
        .with_password(&ch.password);
    let text = client
        .query(&format!(
            "SELECT count(), sum(id), sum(customer_id), toInt64(sum(amount) * 100),
                    sum(length(status)), sum(toUnixTimestamp(created_at) - 1704067200),
                    sum(length(note))
             FROM {database}.orders FINAL"
        ))
        .fetch_bytes("TSV")
        .unwrap()
        .collect()
        .await
        .unwrap();
    String::from_utf8_lossy(&text)
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}
