//! The ClickHouse sink end to end: 1M changes (about 50% updates) of a
//! 7-column table from the file source into ClickHouse (upsert,
//! ReplacingMergeTree), against the ceiling of `INSERT ... FORMAT
//! ArrowStream` of the same number of rows straight into the engine (the
//! same client crate, compression and server, batches prepared in memory,
//! one INSERT per 10k rows like the sink). Prints changes/s, the ratio and
//! peak memory (of this process; the server is another).
//!
//! The server: `URUTAU_TEST_CLICKHOUSE_URL` (+ `_USER`, `_PASSWORD`) when
//! set, else the test harness's front over the chdb engine
//! (tests/harness/clickhouse_front.py, in the venv tests/harness/setup
//! makes). `cargo bench --bench clickhouse_sink`;
//! `CLICKHOUSE_BENCH_CHANGES=200000` changes the size. Under `cargo test`
//! it runs a small smoke test.

mod support;

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{RecordBatch, StringArray, UInt8Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use clickhouse::Client;
use clickhouse_ext_arrow::ArrowClientExt;
use support::clickhouse::{Server, server};
use support::{generate, peak_rss_mib, table_batches};

/// The ceiling: prepared batches (with the reserved columns) inserted with
/// `insert_arrow`, one INSERT per batch, rows/s.
async fn ceiling(server: &Server, rows: usize) -> f64 {
    let client = Client::default()
        .with_url(&server.url)
        .with_user(&server.user)
        .with_password(&server.password);
    client
        .query("CREATE DATABASE IF NOT EXISTS ceiling")
        .execute()
        .await
        .unwrap();
    client
        .query(
            "CREATE TABLE ceiling.t (id Int64, customer_id Nullable(Int64), amount Nullable(Decimal(12, 2)),
               status Nullable(String), created_at Nullable(DateTime64(6, 'UTC')), qty Nullable(Int32),
               note Nullable(String), position String, seq UInt64, is_deleted UInt8)
             ENGINE = ReplacingMergeTree(seq, is_deleted) ORDER BY (id)",
        )
        .execute()
        .await
        .unwrap();
    let client = client.with_database("ceiling");
    let batches: Vec<RecordBatch> = table_batches(rows, 10_000, "UTC")
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let n = b.num_rows();
            let mut fields: Vec<Field> = b
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(Field::new("position", DataType::Utf8, false));
            fields.push(Field::new("seq", DataType::UInt64, false));
            fields.push(Field::new("is_deleted", DataType::UInt8, false));
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(StringArray::from_iter_values(
                std::iter::repeat_n(i.to_string(), n),
            )));
            columns.push(Arc::new(UInt64Array::from_value(i as u64, n)));
            columns.push(Arc::new(UInt8Array::from_value(0, n)));
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
        })
        .collect();
    let started = Instant::now();
    for b in &batches {
        let mut insert = client.insert_arrow("t").unwrap();
        insert.write(b).await.unwrap();
        insert.end().await.unwrap();
    }
    rows as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("clickhouse_sink: benchmark");
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let changes: usize = std::env::var("CLICKHOUSE_BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1_000_000 } else { 20_000 });
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir.path().join("ch"));
    let data = dir.path().join("changes.jsonl");
    let (bytes, live) = generate(&data, changes);
    println!(
        "clickhouse_sink: {changes} changes ({:.0} MiB of JSON), {live} live keys at the end",
        bytes as f64 / (1 << 20) as f64
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let ceiling = runtime.block_on(ceiling(&server, changes));
    let rss_before = peak_rss_mib();

    let text = format!(
        "CREATE PIPELINE bench WITH (max_batch_rows = 10000);
         CREATE SOURCE s FROM file WITH (path = '{data}');
         CREATE SINK ch INTO clickhouse WITH (uri = '{url}', user = '{user}', password = '{password}', database = 'b');
         CREATE TABLE s.t ({columns});
         CREATE TABLE ch.t AS SELECT * FROM s.t;",
        data = data.display(),
        url = server.url,
        user = server.user,
        password = server.password,
        columns = support::COLUMNS
    );
    let (secs, _, report) = support::timed_run(&runtime, &text, bytes);
    let rate = changes as f64 / secs;
    let route = &report.routes[0];
    // The engine's own count of live rows equals the generator's.
    let live_read: u64 = runtime.block_on(async {
        let client = Client::default()
            .with_url(&server.url)
            .with_user(&server.user)
            .with_password(&server.password);
        let bytes = client
            .query("SELECT count() FROM b.t FINAL")
            .fetch_bytes("TSV")
            .unwrap()
            .collect()
            .await
            .unwrap();
        String::from_utf8_lossy(&bytes).trim().parse().unwrap()
    });
    assert_eq!(live_read, live as u64, "live rows under FINAL");
    println!(
        "clickhouse_sink: {secs:.2} s, {rate:.0} changes/s, {} inserts ({} rows, {} tombstones after collapse); \
         ArrowStream ceiling {ceiling:.0} rows/s; ratio {:.2}; peak RSS {:.0} MiB (before the run: {rss_before:.0} MiB)",
        route.commits,
        route.rows,
        route.deletes,
        rate / ceiling,
        peak_rss_mib()
    );
}
