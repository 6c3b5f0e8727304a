//! The plan's hot path: 1M Debezium-style changes of a 7-column table from
//! the file source, through decode, the cast projection and the per-key
//! collapse, into the memory sink. Prints changes/s and peak memory.
//!
//! `cargo bench --bench hot_path` (all cores) or
//! `taskset -c 0 cargo bench --bench hot_path` (one core).
//! `HOT_PATH_CHANGES=200000` changes the size.

mod support;

use std::time::Instant;

use support::{generate, peak_rss_mib};
use urutau_sinks::memory::MemoryStore;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("hot_path: benchmark");
        return;
    }
    // `cargo bench` passes --bench; `cargo test` runs a small smoke test.
    let full = std::env::args().any(|a| a == "--bench");
    let changes: usize = std::env::var("HOT_PATH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1_000_000 } else { 20_000 });
    let dir = tempfile::tempdir().unwrap();
    // HOT_PATH_FILE reuses a generated file (for profiling the run alone).
    let path = match std::env::var("HOT_PATH_FILE") {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => dir.path().join("changes.jsonl"),
    };
    let (bytes, expected_live) = if path.exists() {
        (std::fs::metadata(&path).unwrap().len(), None)
    } else {
        let (bytes, live) = generate(&path, changes);
        (bytes, Some(live))
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "hot_path: {changes} changes, {:.0} MiB of JSON, {cores} core(s) available",
        bytes as f64 / (1 << 20) as f64
    );
    let rss_before = peak_rss_mib();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    for batch_rows in [10_000usize, 65_536] {
        let store = format!("bench-{batch_rows}");
        let text = format!(
            "CREATE PIPELINE bench WITH (max_batch_rows = {batch_rows});
             CREATE SOURCE s FROM file WITH (path = '{}');
             CREATE SINK m INTO memory WITH (store = '{store}');
             CREATE TABLE s.t (id BIGINT NOT NULL, customer_id BIGINT, amount DECIMAL(12,2), status VARCHAR,
                               created_at TIMESTAMPTZ, qty INT, note VARCHAR, PRIMARY KEY (id));
             CREATE TABLE m.t AS
             SELECT id, customer_id, CAST(amount AS DECIMAL(20,2)) AS amount, status, created_at,
                    CAST(qty AS BIGINT) AS qty, note, _commit_ts AS committed_at
             FROM s.t;",
            path.display()
        );
        let started = Instant::now();
        let report = runtime.block_on(support::run_to_end(&text));
        let secs = started.elapsed().as_secs_f64();
        let live = MemoryStore::named(&store).row_count("t").unwrap();
        if let Some(expected) = expected_live {
            assert_eq!(
                live, expected,
                "the sink holds every live key, and only those"
            );
        }
        if let Some(expected) = expected_live {
            assert_eq!(
                live, expected,
                "the sink holds every live key, and only those"
            );
        }
        println!(
            "hot_path: batch {batch_rows:>6} rows: {:.2} s, {:.0} changes/s, {} commits, {} rows reached the sink after collapse, {} live keys, peak RSS {:.0} MiB (before: {:.0} MiB)",
            secs,
            changes as f64 / secs,
            report.routes[0].commits,
            report.routes[0].rows,
            live,
            peak_rss_mib(),
            rss_before
        );
        MemoryStore::drop_named(&store);
    }
}
