//! The Couchbase sink end to end: 1M changes (about 50% updates) of a
//! 7-column table from the file source into a Couchbase collection
//! (upsert: one document per key, a removal per delete), in `fast` and in
//! `atomic` commit mode, against the ceiling of the same Rust SDK
//! upserting as many prepared JSON documents (of the same shape and about
//! the same size, over the same 100k keys) as the sink writes, 64 in
//! flight (`buffer_unordered`, like the sink's default concurrency) at the
//! same durability (majority). Prints changes/s, peak memory (of this
//! process; the server is another) and both ratios.
//!
//! Every run writes its own bucket (created with 0 replicas, like the
//! sink's), so no run sees another's documents. The cluster:
//! `URUTAU_TEST_COUCHBASE_URL` (+ `_USER`, `_PASSWORD`) when set, else
//! gocaves, Couchbase's mock cluster, started by the test harness
//! (tests/harness/couchbase.py; `URUTAU_TEST_GOCAVES` names its binary,
//! `URUTAU_TEST_PYTHON` the python). `cargo bench --bench couchbase_sink`;
//! `COUCHBASE_BENCH_CHANGES=200000` changes the size,
//! `COUCHBASE_BENCH_TRIES=3` the tries of every figure. Under `cargo test`
//! it runs a small smoke test.

mod support;

use std::time::{Duration, Instant};

use couchbase::authenticator::PasswordAuthenticator;
use couchbase::cluster::Cluster;
use couchbase::collection::Collection;
use couchbase::durability_level::DurabilityLevel;
use couchbase::error::ErrorKind;
use couchbase::management::buckets::bucket_settings::BucketSettings;
use couchbase::options::cluster_options::ClusterOptions;
use couchbase::options::kv_options::UpsertOptions;
use futures::{StreamExt, TryStreamExt, stream};
use rand::SeedableRng;
use rand::rngs::StdRng;
use support::{cpu_seconds, generate, peak_rss_mib};

/// The sink's default concurrency, and the ceiling's.
const CONCURRENCY: usize = 64;
/// The limit of one SDK call (the SDK 1.1 can wait forever).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The flags of a JSON document (what the sink writes).
const JSON_FLAGS: u32 = 0x0200_0000;
/// The keys of the generator.
const KEYS: usize = 100_000;

/// The cluster, and the mock's directory to stop when we started it.
struct Server {
    connstr: String,
    user: String,
    password: String,
    mock: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The mock's pid, to read its CPU time.
    pid: Option<u32>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some((python, dir)) = &self.mock {
            let _ = std::process::Command::new(python)
                .arg(harness_script())
                .args(["stop", "--dir"])
                .arg(dir)
                .output();
        }
    }
}

fn harness_script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness/couchbase.py")
}

fn server(dir: &std::path::Path) -> Option<Server> {
    if let Ok(connstr) = std::env::var("URUTAU_TEST_COUCHBASE_URL") {
        return Some(Server {
            connstr,
            user: std::env::var("URUTAU_TEST_COUCHBASE_USER").unwrap_or_default(),
            password: std::env::var("URUTAU_TEST_COUCHBASE_PASSWORD").unwrap_or_default(),
            mock: None,
            pid: None,
        });
    }
    let python = support::harness_python();
    let mut cmd = std::process::Command::new(&python);
    cmd.arg(harness_script()).args(["start", "--dir"]).arg(dir);
    if let Ok(bin) = std::env::var("URUTAU_TEST_GOCAVES") {
        cmd.args(["--bin", &bin]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "the Couchbase mock (gocaves) did not start (it needs Go to build: tests/harness/gocaves-build): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Some(Server {
        connstr: info["connstr"].as_str().unwrap().into(),
        user: info["username"].as_str().unwrap().into(),
        password: info["password"].as_str().unwrap().into(),
        mock: Some((python, dir.to_path_buf())),
        pid: info["pid"].as_u64().map(|p| p as u32),
    })
}

/// CPU seconds the mock has used so far (0 for a real cluster).
fn server_cpu_seconds(server: &Server) -> f64 {
    let Some(pid) = server.pid else {
        return 0.0;
    };
    support::process_cpu_seconds(&pid.to_string())
}

/// An SDK call bounded by [`CALL_TIMEOUT`]; `what` names it in a failure.
async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = couchbase::error::Result<T>>,
) -> couchbase::error::Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => panic!("couchbase: {what}: no answer within {CALL_TIMEOUT:?}"),
    }
}

async fn connect(server: &Server) -> Cluster {
    let auth = PasswordAuthenticator::new(&server.user, &server.password);
    bounded(
        "connect",
        Cluster::connect(&server.connstr, ClusterOptions::new(auth.into())),
    )
    .await
    .unwrap()
}

/// A new bucket (0 replicas, like the sink's) with collection
/// `_default.t`, once it takes writes.
async fn new_collection(cluster: &Cluster, bucket: &str) -> Collection {
    let settings = BucketSettings::new(bucket)
        .ram_quota_mb(100)
        .num_replicas(0);
    bounded(
        "create bucket",
        cluster.buckets().create_bucket(settings, None),
    )
    .await
    .unwrap();
    let b = cluster.bucket(bucket);
    let started = Instant::now();
    loop {
        // A bucket just created may not answer yet.
        let r = tokio::time::timeout(
            CALL_TIMEOUT,
            b.collections()
                .create_collection("_default", "t", None, None),
        )
        .await;
        match r {
            Ok(Ok(())) => break,
            Ok(Err(e)) if *e.kind() == ErrorKind::CollectionExists => break,
            other if started.elapsed() > Duration::from_secs(60) => {
                panic!("couchbase: create collection {bucket}._default.t: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let coll = b.scope("_default").collection("t");
    // The SDK retries a write to a collection it does not know yet without
    // end: probe with short limits until one lands.
    let started = Instant::now();
    loop {
        let probe = tokio::time::timeout(
            Duration::from_secs(2),
            coll.upsert_raw("probe", b"{}", JSON_FLAGS, None),
        )
        .await;
        if let Ok(Ok(_)) = probe {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "couchbase: {bucket}._default.t takes no writes: {probe:?}"
        );
    }
    bounded("remove the probe", coll.remove("probe", None))
        .await
        .unwrap();
    coll
}

/// The ceiling: `docs` upserted with the SDK, [`CONCURRENCY`] in flight,
/// durability majority; docs/s.
async fn ceiling(server: &Server, bucket: &str, docs: &[(String, Vec<u8>)]) -> (f64, f64, f64) {
    let cluster = connect(server).await;
    let coll = new_collection(&cluster, bucket).await;
    let started = Instant::now();
    let cpu_before = cpu_seconds();
    let server_before = server_cpu_seconds(server);
    let coll = &coll;
    stream::iter(docs.iter().map(|(key, body)| async move {
        bounded(
            "upsert",
            coll.upsert_raw(
                key,
                body,
                JSON_FLAGS,
                UpsertOptions::new().durability_level(DurabilityLevel::MAJORITY),
            ),
        )
        .await
        .map(drop)
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<()>()
    .await
    .unwrap();
    (
        docs.len() as f64 / started.elapsed().as_secs_f64(),
        cpu_seconds() - cpu_before,
        server_cpu_seconds(server) - server_before,
    )
}

/// The documents present of the generator's keys in `bucket`._default.t.
async fn live_documents(server: &Server, bucket: &str) -> usize {
    let cluster = connect(server).await;
    let coll = cluster.bucket(bucket).scope("_default").collection("t");
    let coll = &coll;
    stream::iter((0..KEYS).map(|id| async move {
        match bounded("get", coll.get(format!("[{id}]"), None)).await {
            Ok(_) => 1,
            Err(e) if *e.kind() == ErrorKind::DocumentNotFound => 0,
            Err(e) => panic!("couchbase: get [{id}] in {bucket}: {e}"),
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .fold(0, |n, one| async move { n + one })
    .await
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("couchbase_sink: benchmark");
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let changes: usize = std::env::var("COUCHBASE_BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1_000_000 } else { 20_000 });
    let tries: usize = std::env::var("COUCHBASE_BENCH_TRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let dir = tempfile::tempdir().unwrap();
    // Every run gets a mock of its own (started before the run, not timed),
    // and a bucket of its own (on a real cluster too).
    let mut runs = 0;
    let mut fresh_server = || {
        runs += 1;
        server(&dir.path().join(format!("cb{runs}")))
    };
    let Some(mut cluster) = fresh_server() else {
        return;
    };
    let data = dir.path().join("changes.jsonl");
    let (bytes, live) = generate(&data, changes);
    println!(
        "couchbase_sink: {changes} changes ({:.0} MiB of JSON), {live} live keys at the end",
        bytes as f64 / (1 << 20) as f64
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rss_before = peak_rss_mib();
    // Buckets of this process: a real cluster may hold older ones.
    let run_id = std::process::id();

    let mut rates: [Vec<f64>; 3] = Default::default();
    // The ceiling's documents, prepared after the first sink runs (their
    // memory is not the sink's).
    let mut docs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut sink_peak = 0.0;
    // Each try runs fast, atomic and the ceiling in turn, so the machine's
    // neighbours weigh on all three alike.
    for attempt in 0..tries {
        for (m, mode) in ["fast", "atomic"].into_iter().enumerate() {
            if attempt + m > 0 {
                drop(cluster);
                cluster = fresh_server().expect("the cluster started before");
            }
            let bucket = format!("bench-{run_id}-{mode}-{attempt}");
            let text = format!(
                "CREATE PIPELINE bench WITH (max_batch_rows = 10000);
                 CREATE SOURCE s FROM file WITH (path = '{data}');
                 CREATE SINK cb INTO couchbase WITH (uri = '{uri}', bucket = '{bucket}', username = '{user}', password = '{password}', commit_mode = '{mode}', durability = 'majority', concurrency = {CONCURRENCY});
                 CREATE TABLE s.t ({columns});
                 CREATE TABLE cb.t AS SELECT * FROM s.t;",
                data = data.display(),
                uri = cluster.connstr,
                user = cluster.user,
                password = cluster.password,
                columns = support::COLUMNS
            );
            let server_before = server_cpu_seconds(&cluster);
            let (secs, cpu, report) = support::timed_run(&runtime, &text, bytes);
            let server_cpu = server_cpu_seconds(&cluster) - server_before;
            let rate = changes as f64 / secs;
            let route = &report.routes[0];
            // The cluster's own count of live documents equals the
            // generator's (not timed).
            let found = runtime.block_on(live_documents(&cluster, &bucket));
            assert_eq!(found, live, "{mode}: live documents");
            let peak = if docs.is_empty() {
                format!(
                    "peak RSS {:.0} MiB (before the runs: {rss_before:.0} MiB)",
                    peak_rss_mib()
                )
            } else {
                "peak RSS: see the first try".to_string()
            };
            println!(
                "couchbase_sink: {mode}: {secs:.2} s ({cpu:.2} s of CPU here, {server_cpu:.2} s in the server), {rate:.0} changes/s, \
                 {} commits ({} documents, {} of them removals, after collapse); {peak}",
                route.commits, route.rows, route.deletes,
            );
            rates[m].push(rate);
            if docs.is_empty() && m == 1 {
                sink_peak = peak_rss_mib();
                // The ceiling: as many documents as the sink wrote, of the
                // same shape, over the generator's keys (not timed).
                let mut rng = StdRng::seed_from_u64(11);
                docs = (0..route.rows as usize)
                    .map(|i| {
                        let id = (i * 7919) % KEYS;
                        (
                            format!("[{id}]"),
                            support::row(id as u64, &mut rng).into_bytes(),
                        )
                    })
                    .collect();
            }
        }
        drop(cluster);
        cluster = fresh_server().expect("the cluster started before");
        let bucket = format!("bench-{run_id}-ceiling-{attempt}");
        let (rate, cpu, server_cpu) = runtime.block_on(ceiling(&cluster, &bucket, &docs));
        let avg = docs.iter().map(|(_, b)| b.len()).sum::<usize>() as f64 / docs.len() as f64;
        println!(
            "couchbase_sink: SDK ceiling: {} upserts of {avg:.0}-byte documents, {CONCURRENCY} in flight, durability majority: \
             {rate:.0} docs/s ({cpu:.2} s of CPU here, {server_cpu:.2} s in the server)",
            docs.len()
        );
        rates[2].push(rate);
    }

    let [fast, atomic, ceiling] = rates.map(|mut r| {
        r.sort_by(f64::total_cmp);
        (r[r.len() - 1], r[r.len() / 2])
    });
    println!(
        "couchbase_sink: best of {tries}: fast {:.0} changes/s, atomic {:.0} changes/s, SDK ceiling {:.0} docs/s; \
         ratio fast/ceiling {:.2} (target >= 0.7), atomic/ceiling {:.2} (target >= 0.35); \
         medians {:.0} / {:.0} / {:.0}; peak RSS of the sink runs {sink_peak:.0} MiB",
        fast.0,
        atomic.0,
        ceiling.0,
        fast.0 / ceiling.0,
        atomic.0 / ceiling.0,
        fast.1,
        atomic.1,
        ceiling.1,
    );
}
