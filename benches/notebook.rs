//! The notebook workflow on the 1M-change bench file (the generator the
//! other benches use: a 7-column table, about 50% updates): how long
//! `preview(1000)` takes on the whole file and what memory it adds (it
//! must read only the file's beginning), then, after a run into Iceberg
//! (SQL catalog on SQLite, 10k-row commits: 100 snapshots of equality
//! deletes), `sql("SELECT count(*) ...")` through the library facade
//! (the sink's reader, equality deletes hashed by key) against DuckDB's `count(*)` of
//! `iceberg_scan` on the same metadata file (timed inside its python, the
//! extension already loaded; tests/harness/iceberg_read.py's connection).
//! The two counts must be equal, and equal to the generator's live keys.
//!
//! `cargo bench --bench notebook`; `NOTEBOOK_BENCH_CHANGES=200000` changes
//! the size. Under `cargo test` it runs a small smoke test (it fails in CI
//! when the harness python is missing).

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use arrow::array::{Array, AsArray};
use support::{generate, peak_rss_mib};

/// DuckDB's count of an Iceberg table and the seconds it took (the
/// query alone).
const DUCKDB_COUNT_PY: &str = r#"
import json, sys, time
sys.path.insert(0, sys.argv[1])
from iceberg_read import connect
con = connect()
con.execute("SET enable_progress_bar = false")
started = time.perf_counter()
n = con.execute("SELECT count(*) FROM iceberg_scan(?)", [sys.argv[2]]).fetchone()[0]
print(json.dumps({"count": n, "seconds": time.perf_counter() - started}))
"#;

fn current_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("notebook: benchmark");
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let changes: usize = std::env::var("NOTEBOOK_BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1_000_000 } else { 20_000 });
    let python = support::harness_python();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("changes.jsonl");
    let (bytes, live) = generate(&data, changes);
    println!(
        "notebook: {changes} changes ({:.0} MiB of JSON), {live} live keys at the end",
        bytes as f64 / (1 << 20) as f64
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let d = dir.path();
    let text = format!(
        "CREATE PIPELINE bench WITH (max_batch_rows = 10000);
         CREATE SOURCE s FROM file WITH (path = '{data}');
         CREATE SINK lake INTO iceberg WITH (uri = 'sqlite://{d}/catalog.db', warehouse = '{d}/warehouse', namespace = 'b');
         CREATE TABLE s.t ({columns});
         CREATE TABLE lake.t AS SELECT * FROM s.t;",
        data = data.display(),
        d = d.display(),
        columns = support::COLUMNS
    );
    let pipeline = runtime
        .block_on(urutau::Pipeline::from_sql(&text, "bench"))
        .unwrap();

    // preview(1000) of the whole file: the best of three, and the memory
    // it took beyond what the process held before.
    let rss_before = current_rss_mib();
    let reset = support::reset_peak_rss();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        let preview = runtime.block_on(pipeline.preview(1000)).unwrap();
        best = best.min(started.elapsed().as_secs_f64());
        let rows = preview["lake.t"].num_rows();
        assert!(
            (1..=1000).contains(&rows),
            "a preview of 1000 changes holds 1..1000 rows after collapse: {rows}"
        );
    }
    println!(
        "notebook: preview(1000) of the {:.0} MiB file: best {:.1} ms of 3; peak RSS {:.0} MiB ({}RSS before: {rss_before:.0} MiB)",
        bytes as f64 / (1 << 20) as f64,
        best * 1000.0,
        peak_rss_mib(),
        if reset {
            "reset before; "
        } else {
            "of the process; "
        }
    );
    assert!(!d.join("catalog.db").exists(), "preview created no catalog");

    // The run, then count(*) through the facade and through DuckDB.
    let started = Instant::now();
    let report = runtime
        .block_on(pipeline.run(urutau::RunOptions {
            exit_when_caught_up: true,
            ..Default::default()
        }))
        .unwrap();
    println!(
        "notebook: the run: {:.1} s, {} commits",
        started.elapsed().as_secs_f64(),
        report.routes[0].commits
    );
    let mut ours = f64::MAX;
    let mut count = 0i64;
    let mut ours_tries = 0;
    // Up to three tries; one when a try takes over 10 s (the figure is
    // then far above the noise).
    while ours_tries < 3 && (ours_tries == 0 || ours < 10.0) {
        ours_tries += 1;
        let started = Instant::now();
        let result = runtime
            .block_on(pipeline.sql("SELECT count(*) AS n FROM lake.t"))
            .unwrap();
        ours = ours.min(started.elapsed().as_secs_f64());
        let column = result.batches[0].column(0);
        assert!(!column.is_null(0));
        count = column
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(0);
    }
    assert_eq!(count as usize, live, "count(*) is the live keys");
    let location = runtime.block_on(support::metadata_location(&d.join("catalog.db"), "b", "t"));
    let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness");
    let mut duck = f64::MAX;
    let mut duck_tries = 0;
    while duck_tries < if full { 2 } else { 1 } && (duck_tries == 0 || duck < 10.0) {
        duck_tries += 1;
        let out = Command::new(&python)
            .args(["-c", DUCKDB_COUNT_PY])
            .arg(&harness)
            .arg(&location)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "DuckDB: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["count"].as_i64(), Some(count), "DuckDB's count is ours");
        duck = duck.min(v["seconds"].as_f64().unwrap());
    }
    println!(
        "notebook: count(*) of {count} live rows ({} snapshots): ours best {:.3} s of {ours_tries}, DuckDB iceberg_scan best {:.3} s of {duck_tries}; DuckDB/ours {:.2}",
        report.routes[0].commits,
        ours,
        duck,
        duck / ours
    );
}
