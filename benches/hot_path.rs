//! The plan's hot path: 1M Debezium-style changes of a 7-column table from
//! the file source, through decode, the cast projection and the per-key
//! collapse, into the memory sink. Prints changes/s and peak memory.
//!
//! `cargo bench --bench hot_path` (all cores) or
//! `taskset -c 0 cargo bench --bench hot_path` (one core).
//! `HOT_PATH_CHANGES=200000` changes the size.

use std::io::Write;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use urutau_engine::{RunOptions, Shutdown};
use urutau_planner::plan::plan_pipeline;
use urutau_planner::registry::Registry;
use urutau_sinks::memory::MemoryStore;

fn registry() -> Registry {
    let mut r = Registry::new();
    urutau_engine::sources::register(&mut r);
    urutau_sinks::register(&mut r);
    r
}

fn row(id: u64, rng: &mut StdRng) -> String {
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
fn generate(path: &std::path::Path, changes: usize) -> (u64, usize) {
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
    (
        std::fs::metadata(path).unwrap().len(),
        live.iter().filter(|l| l.is_some()).count(),
    )
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

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
        let spec = urutau_sql::parse_pipeline_sql(&text, "bench", &|_| None).unwrap();
        let started = Instant::now();
        let report = runtime.block_on(async {
            let plan = plan_pipeline(spec, &registry()).await.unwrap();
            urutau_engine::run(
                &plan,
                RunOptions {
                    exit_when_caught_up: true,
                },
                Shutdown::new(),
            )
            .await
            .unwrap()
        });
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
