//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod conformance;
pub mod iceberg_rest;
pub mod pg_cdc;
pub mod proxy;
pub mod small_disk;
pub mod workload;

use std::sync::atomic::{AtomicUsize, Ordering};

use urutau_planner::diagnostic::Diagnostics;
use urutau_planner::plan::{PipelinePlan, plan_pipeline};
use urutau_planner::registry::Registry;

/// Runs the `urutau` binary with `args`.
pub fn urutau(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(args)
        .output()
        .unwrap()
}

/// Starts `urutau run PIPELINE --exit-when-caught-up` and SIGKILLs it after
/// a pause drawn from `pause_ms` (seeded), until it has been killed `kills`
/// times after committing something. A run that ends by itself must have
/// succeeded, and the next run starts (40 runs at most): the test fails
/// when the pipeline was not killed often enough by then. On a machine
/// slow enough that a run has committed nothing when its pause ends, the
/// kill waits for its first commit (the log says so), so every kill lands
/// mid-stream however loaded the machine is.
pub fn kill_9_runs(
    pipeline: &std::path::Path,
    seed: u64,
    kills: usize,
    pause_ms: std::ops::Range<u64>,
) {
    use rand::{Rng, SeedableRng};
    use std::time::{Duration, Instant};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut done, mut runs) = (0, 0);
    while done < kills && runs < 40 {
        runs += 1;
        // The run's log, for the message if it fails.
        let log_path = pipeline.with_extension(format!("run{runs}.log"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
            .args([
                "run",
                pipeline.to_str().unwrap(),
                "--exit-when-caught-up",
                "--log-level",
                // The runner's commits show in the log.
                "warn,urutau_engine::runner=debug",
            ])
            // A Postgres snapshot's windows widened (the test hook), so a
            // snapshot lasts long enough to be killed in.
            .env("URUTAU_TEST_SNAPSHOT_WINDOW_MS", "40")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        let pause = Duration::from_millis(rng.random_range(pause_ms.clone()));
        let started = Instant::now();
        let committed = || {
            std::fs::read_to_string(&log_path)
                .unwrap_or_default()
                .contains("urutau_engine::runner: committed")
        };
        let exited = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            let waited = started.elapsed();
            if waited >= pause && (committed() || waited > Duration::from_secs(120)) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        match exited {
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                if committed() {
                    done += 1;
                }
            }
            // A run that caught up before its kill is no failure: the
            // next one goes on with what the workload wrote since (a faster
            // sink caught up between a test's kills), and the count below
            // still says whether there were enough kills.
            Some(status) => {
                assert!(
                    status.success(),
                    "a run between kills failed: {status}: {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
        }
    }
    assert!(
        done >= kills,
        "the pipeline finished before it could be killed {kills} times ({done})"
    );
}

/// `urutau run PIPELINE --exit-when-caught-up`, which must succeed within
/// 10 minutes: a run that hangs fails the test (and is killed) instead of
/// holding CI until its time limit.
pub fn run_to_end(pipeline: &std::path::Path) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_urutau"))
        .args(["run", pipeline.to_str().unwrap(), "--exit-when-caught-up"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained while it runs: a full pipe would stop the child.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            r.read_to_end(&mut buf).unwrap();
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            let err = stderr.join().unwrap();
            let tail = &err[err.len().saturating_sub(4000)..];
            panic!(
                "`urutau run {}` did not end within 10 minutes; its log ends with:\n{}",
                pipeline.display(),
                String::from_utf8_lossy(tail)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The harness's own test CA and certificates (tests/harness/certs.py),
/// made in `dir`: the JSON with the files' paths (`ca`, `server_cert`, `server_key`,
/// `client_cert`, `client_key`, `client_user`, `other_ca`, `dir`).
pub fn certs(dir: &std::path::Path) -> serde_json::Value {
    let out = harness(
        "python3",
        "certs.py",
        &["make", "--dir", dir.to_str().unwrap()],
        "making the test CA (needs the openssl command)",
    );
    serde_json::from_slice(&out).unwrap()
}

/// A TLS front (tests/harness/tls_front.py) for a plain server at
/// `target` (`host:port`): https with the harness CA's server certificate
/// (for localhost and 127.0.0.1) on [`TlsFront::addr`], killed when
/// dropped.
pub struct TlsFront {
    child: std::process::Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl TlsFront {
    /// Starts a front for `target`, with the certificates `certs` made.
    pub fn start(certs: &serde_json::Value, target: &str) -> TlsFront {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .arg(harness_script("tls_front.py"))
            .args(["--cert", certs["server_cert"].as_str().unwrap()])
            .args(["--key", certs["server_key"].as_str().unwrap()])
            .args(["--to", target])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            panic!("the TLS front for {target} did not start: {line:?}");
        };
        TlsFront {
            addr: addr.to_string(),
            child,
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A script of the test harness (tests/harness/).
pub fn harness_script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/harness")
        .join(name)
}

/// Runs harness `script` with `args` under `python`; a failure fails the
/// test with `what` and the script's own message. Its standard output.
pub fn harness(
    python: impl AsRef<std::ffi::OsStr>,
    script: &str,
    args: &[&str],
    what: &str,
) -> Vec<u8> {
    let out = std::process::Command::new(python)
        .arg(harness_script(script))
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Every source and sink kind of the build (what the binary registers).
pub fn registry() -> Registry {
    urutau::registry()
}

/// Plans pipeline SQL text.
pub async fn plan_sql(text: &str) -> Result<PipelinePlan, Diagnostics> {
    let spec = urutau_sql::parse_pipeline_sql(text, "test", &|_| None)?;
    plan_pipeline(spec, &registry()).await
}

/// A memory-store name no other test uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Diagnostics as text (for assertion messages).
pub fn show(d: &Diagnostics) -> String {
    d.items.iter().map(|i| format!("{i}\n")).collect()
}

/// The Python of the test harness's virtualenv (DuckDB and its Iceberg
/// extension): `URUTAU_TEST_PYTHON`, or the default venv `tests/harness/setup`
/// creates. Missing, the test fails and says what to run (`scripts/test`
/// installs it).
pub fn harness_python() -> std::path::PathBuf {
    let candidate = std::env::var("URUTAU_TEST_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::PathBuf::from("/var/tmp/urutau-test-venv/bin/python"));
    assert!(
        candidate.exists(),
        "the test readers are not installed ({} is missing): run tests/harness/setup (scripts/test does)",
        candidate.display()
    );
    candidate
}

/// Rows of an Iceberg table as DuckDB reads them (`iceberg_scan` of the
/// metadata file), ordered by `order_by`.
pub fn duckdb_rows(
    python: &std::path::Path,
    metadata: &str,
    order_by: &str,
) -> Vec<serde_json::Value> {
    let script = harness_script("iceberg_read.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(metadata)
        .args(["--order-by", order_by])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "DuckDB could not read {metadata}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Where `tests/harness/iceberg-java-fetch` put Apache Iceberg's Java
/// library and the compiled `IcebergRead`: `URUTAU_TEST_ICEBERG_JAVA`, or
/// its default home. Missing, the test fails and says what to run
/// (`scripts/test` runs it).
pub fn iceberg_java_home() -> std::path::PathBuf {
    let home = std::env::var("URUTAU_TEST_ICEBERG_JAVA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::PathBuf::from("/var/tmp/urutau-iceberg-java"));
    assert!(
        home.join("classes/IcebergRead.class").exists()
            && home.join("classes/IcebergPositionDelete.class").exists(),
        "the Java Iceberg reader and writer are not installed under {}: run tests/harness/iceberg-java-fetch (needs a Java 17 JDK and Maven; scripts/test runs it)",
        home.display()
    );
    home
}

/// Runs the Java Iceberg reader (IcebergGenerics, Iceberg's reference
/// implementation) over the table at `metadata` with `args`; its stdout.
fn iceberg_java(metadata: &str, args: &[&str]) -> String {
    let home = iceberg_java_home();
    let out = std::process::Command::new("java")
        .arg("-Xmx1g")
        .arg("-cp")
        .arg(format!(
            "{}/lib/*:{}/classes",
            home.display(),
            home.display()
        ))
        .arg("IcebergRead")
        .arg(metadata)
        .args(args)
        .output()
        .expect("java runs (install a Java 17 JDK)");
    assert!(
        out.status.success(),
        "Iceberg's Java reader could not read {metadata}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Rows of an Iceberg table as Iceberg's Java library reads them
/// (`IcebergGenerics`, deletes applied by Iceberg itself), ordered by
/// `order_by`, rendered as [`duckdb_rows`] renders DuckDB's.
pub fn iceberg_java_rows(metadata: &str, order_by: &str) -> Vec<serde_json::Value> {
    iceberg_java(metadata, &["--order-by", order_by])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Another engine's row-level delete of `table` (`namespace.table` of the
/// SQLite catalog `catalog_db`, rows named `catalog`): Iceberg's Java
/// library deletes the rows whose integer `key_column` is among `keys` with
/// one position-delete file naming every data file that holds one, as
/// Spark's merge-on-read DELETE does (tests/harness/IcebergPositionDelete.java).
/// Returns what it printed: `data_files`, `deleted`, `delete_file`,
/// `referenced_data_file`.
pub fn iceberg_java_position_delete(
    catalog_db: &std::path::Path,
    warehouse: &std::path::Path,
    catalog: &str,
    table: (&str, &str),
    key_column: &str,
    keys: &[i64],
) -> serde_json::Value {
    let home = iceberg_java_home();
    let out = std::process::Command::new("java")
        .arg("-cp")
        .arg(format!(
            "{}/lib/*:{}/classes",
            home.display(),
            home.display()
        ))
        .arg("IcebergPositionDelete")
        .arg(catalog_db)
        .arg(warehouse)
        .args([catalog, table.0, table.1, key_column])
        .args(keys.iter().map(i64::to_string))
        .output()
        .expect("java runs (install a Java 17 JDK)");
    assert!(
        out.status.success(),
        "Iceberg's Java library could not delete from {}.{}: {}",
        table.0,
        table.1,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A digest of an Iceberg table by Iceberg's Java library: `rows`, `sum`
/// per integer or decimal column (decimals as strings) and `length` per
/// string column (characters), for a table too big to compare row by row.
pub fn iceberg_java_digest(metadata: &str) -> serde_json::Value {
    serde_json::from_str(iceberg_java(metadata, &["--digest"]).trim()).unwrap()
}

/// Every file a snapshot kept in `metadata` reads (manifest lists,
/// manifests, live data and delete files), as DuckDB reads the Avro.
pub fn duckdb_referenced_files(python: &std::path::Path, metadata: &str) -> Vec<String> {
    let out = harness(
        python,
        "iceberg_read.py",
        &[metadata, "--referenced-files"],
        &format!("DuckDB could not list the files of {metadata}"),
    );
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The current snapshot's live data and delete files of the table at
/// `metadata`, as DuckDB reads the manifests: `content` (0 data, 1
/// position deletes, 2 equality deletes), `size` (bytes), `records`.
pub fn duckdb_live_files(python: &std::path::Path, metadata: &str) -> Vec<serde_json::Value> {
    let out = harness(
        python,
        "iceberg_read.py",
        &[metadata, "--live-files"],
        &format!("DuckDB could not list the live files of {metadata}"),
    );
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The metadata location a SQL catalog (SQLite file) holds for a table.
pub async fn catalog_metadata_location(
    db: &std::path::Path,
    namespace: &str,
    table: &str,
) -> Option<String> {
    use sqlx::Row;
    let url = format!("sqlite://{}?mode=ro", db.display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .ok()?;
    let row = sqlx::query(
        "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
    )
    .bind(namespace)
    .bind(table)
    .fetch_optional(&pool)
    .await
    .ok()??;
    pool.close().await;
    row.try_get::<String, _>(0).ok()
}

/// A SeaweedFS `weed mini` (S3 + Iceberg REST catalog) started by
/// tests/harness/seaweed.py for one test, stopped when dropped.
pub struct Seaweed {
    pub info: serde_json::Value,
    python: std::path::PathBuf,
}

impl Seaweed {
    /// Starts a server with its data under `dir` and a table bucket.
    pub fn start(python: &std::path::Path, dir: &std::path::Path) -> Seaweed {
        Self::start_on(python, dir, &[])
    }

    fn start_on(python: &std::path::Path, dir: &std::path::Path, ports: &[String]) -> Seaweed {
        let script = harness_script("seaweed.py");
        let out = std::process::Command::new(python)
            .arg(script)
            .args(["start", "--dir"])
            .arg(dir)
            .args(["--bucket", "urutau"])
            .args(ports)
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "SeaweedFS did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let info: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("the harness prints JSON");
        Seaweed {
            info,
            python: python.to_path_buf(),
        }
    }

    fn get(&self, key: &str) -> String {
        self.info[key].as_str().unwrap_or_default().to_string()
    }

    /// Stops the server (S3 and the catalog refuse connections from now
    /// on); [`Self::start_again`] brings it back with its data.
    pub fn stop(&self) {
        let pid = self.info["pid"].to_string();
        harness(
            &self.python,
            "seaweed.py",
            &["stop", "--pid", &pid],
            "SeaweedFS did not stop",
        );
    }

    /// Starts the server again on its data directory and ports.
    pub fn start_again(&mut self) {
        let dir = std::path::PathBuf::from(self.get("dir"));
        let ports: Vec<String> = ["master", "volume", "filer", "s3", "iceberg", "admin"]
            .iter()
            .flat_map(|n| {
                [
                    format!("--{n}-port"),
                    self.info["ports"][n].as_u64().expect("a port").to_string(),
                ]
            })
            .collect();
        let again = Self::start_on(&self.python, &dir, &ports);
        self.info = again.info.clone();
        // (`again` must not stop the server when dropped.)
        std::mem::forget(again);
    }

    pub fn iceberg_uri(&self) -> String {
        self.get("iceberg_uri")
    }
    pub fn s3_endpoint(&self) -> String {
        self.get("s3_endpoint")
    }
    pub fn warehouse(&self) -> String {
        self.get("warehouse")
    }
    pub fn credential(&self) -> (String, String) {
        (self.get("access_key_id"), self.get("secret_access_key"))
    }

    /// Arguments of iceberg_read.py that look a table up in this catalog.
    pub fn reader_args(&self, table: &str) -> Vec<String> {
        let (id, secret) = self.credential();
        vec![
            "--rest".into(),
            self.iceberg_uri(),
            "--warehouse".into(),
            self.warehouse(),
            "--credential".into(),
            format!("{id}:{secret}"),
            "--table".into(),
            table.into(),
            "--s3-endpoint".into(),
            self.s3_endpoint(),
        ]
    }

    /// The table's metadata (and its location) as the catalog serves it.
    pub fn table_metadata(&self, table: &str) -> serde_json::Value {
        let script = harness_script("iceberg_read.py");
        let out = std::process::Command::new(&self.python)
            .arg(script)
            .args(self.reader_args(table))
            .arg("--metadata")
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The table's rows as DuckDB reads them from S3, or the reader's
    /// error (the table is not there yet, the server is away).
    pub fn read_rows(&self, table: &str, order_by: &str) -> Result<Vec<serde_json::Value>, String> {
        let out = std::process::Command::new(&self.python)
            .arg(harness_script("iceberg_read.py"))
            .args(self.reader_args(table))
            .args(["--order-by", order_by])
            .output()
            .expect("python runs");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect())
    }

    /// The table's rows as DuckDB reads them from S3; `None` while the
    /// table is not there yet.
    pub fn try_rows(&self, table: &str, order_by: &str) -> Option<Vec<serde_json::Value>> {
        self.read_rows(table, order_by).ok()
    }

    /// The table's rows as DuckDB reads them from S3.
    pub fn rows(&self, table: &str, order_by: &str) -> Vec<serde_json::Value> {
        self.read_rows(table, order_by)
            .unwrap_or_else(|e| panic!("DuckDB could not read {table}: {e}"))
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        let script = harness_script("seaweed.py");
        let _ = std::process::Command::new(&self.python)
            .arg(script)
            .args(["stop", "--pid", &self.info["pid"].to_string()])
            .output();
    }
}

/// A PostgreSQL server started by tests/harness/postgres.py for one test,
/// stopped when dropped. A server that does not start fails the test with
/// the harness's reason (`scripts/test` installs the packages).
pub struct Postgres {
    pub info: serde_json::Value,
}

impl Postgres {
    pub fn start(dir: &std::path::Path) -> Postgres {
        Postgres::start_with(dir, &[])
    }

    /// A server that accepts TCP connections over TLS only (hostssl), its
    /// certificate signed by the CA [`certs`] made in `certs_dir`; `postgres`
    /// logs in by SCRAM with `info["password"]`, `urutau_md5` by md5 with
    /// the same, `urutau_cert` by its client certificate.
    pub fn start_tls(dir: &std::path::Path, certs_dir: &str) -> Postgres {
        Postgres::start_with(dir, &["--tls", certs_dir])
    }

    fn start_with(dir: &std::path::Path, extra: &[&str]) -> Postgres {
        let script = harness_script("postgres.py");
        let out = std::process::Command::new("python3")
            .arg(script)
            .args(["start", "--dir"])
            .arg(dir)
            .args(extra)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "PostgreSQL did not start (apt-get install postgresql, or run scripts/test): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Postgres {
            info: serde_json::from_slice(&out.stdout).expect("the harness prints JSON"),
        }
    }

    pub fn uri(&self) -> String {
        self.info["uri"].as_str().unwrap().to_string()
    }

    /// Where the server listens (`127.0.0.1:<port>`).
    pub fn addr(&self) -> std::net::SocketAddr {
        format!("127.0.0.1:{}", self.info["port"]).parse().unwrap()
    }

    /// `pg_ctl stop -m MODE`, waiting at most `timeout_s` seconds: fails
    /// the test with pg_ctl's message when the server does not stop.
    pub fn stop(&self, mode: &str, timeout_s: u32) {
        let dir = self.info["dir"].as_str().unwrap();
        let timeout = timeout_s.to_string();
        let args = ["stop", "--dir", dir, "--mode", mode, "--timeout", &timeout];
        harness(
            "python3",
            "postgres.py",
            &args,
            &format!("PostgreSQL did not stop (-m {mode})"),
        );
    }

    /// Starts the server again on its directory and port (after
    /// [`Self::stop`]).
    pub fn start_again(&self) {
        let dir = self.info["dir"].as_str().unwrap();
        let port = self.info["port"].to_string();
        harness(
            "python3",
            "postgres.py",
            &["start", "--dir", dir, "--port", &port],
            "PostgreSQL did not start again",
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let script = harness_script("postgres.py");
        let _ = std::process::Command::new("python3")
            .arg(script)
            .args([
                "stop",
                "--dir",
                self.info["dir"].as_str().unwrap_or_default(),
            ])
            .output();
    }
}

/// A ClickHouse endpoint for one test: a real server when
/// `URUTAU_TEST_CLICKHOUSE_URL` is set (`URUTAU_TEST_CLICKHOUSE_USER`,
/// `URUTAU_TEST_CLICKHOUSE_PASSWORD`), otherwise the test harness's HTTP
/// front over the real ClickHouse engine (chdb), started for the test and
/// stopped when dropped. Each test works in its own database.
pub struct ClickHouse {
    pub url: String,
    pub user: String,
    pub password: String,
    python: std::path::PathBuf,
    pid: Option<u64>,
    /// The front's chdb data directory (the harness's, not a real server).
    dir: Option<std::path::PathBuf>,
    http: reqwest::Client,
    /// https: the certificate and key the front serves, and the CA file
    /// the sink is told to trust (`ca_cert`).
    tls: Option<(String, String, String)>,
}

impl ClickHouse {
    pub fn start(python: &std::path::Path, dir: &std::path::Path) -> ClickHouse {
        let http = reqwest::Client::new();
        if let Ok(url) = std::env::var("URUTAU_TEST_CLICKHOUSE_URL") {
            return ClickHouse {
                url,
                user: std::env::var("URUTAU_TEST_CLICKHOUSE_USER").unwrap_or("default".into()),
                password: std::env::var("URUTAU_TEST_CLICKHOUSE_PASSWORD").unwrap_or_default(),
                python: python.to_path_buf(),
                pid: None,
                dir: None,
                http,
                tls: None,
            };
        }
        Self::start_front_with(python, dir, None)
    }

    /// The harness's front over https, its certificate signed by the test
    /// CA of [`certs`]; the sink options name that CA as `ca_cert`.
    pub fn start_tls(
        python: &std::path::Path,
        dir: &std::path::Path,
        certs: &serde_json::Value,
    ) -> ClickHouse {
        let file = |k: &str| certs[k].as_str().unwrap().to_string();
        Self::start_front_with(
            python,
            dir,
            Some((file("server_cert"), file("server_key"), file("ca"))),
        )
    }

    fn start_front_with(
        python: &std::path::Path,
        dir: &std::path::Path,
        tls: Option<(String, String, String)>,
    ) -> ClickHouse {
        let (user, password) = ("urutau".to_string(), "ch-test-secret".to_string());
        let info = Self::start_front(python, dir, &user, &password, None, tls.as_ref());
        let mut http = reqwest::Client::builder();
        if let Some((_, _, ca)) = &tls {
            let pem = std::fs::read(ca).unwrap();
            http = http.add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
        }
        ClickHouse {
            url: info["url"].as_str().unwrap().to_string(),
            user,
            password,
            python: python.to_path_buf(),
            pid: info["pid"].as_u64(),
            dir: Some(dir.to_path_buf()),
            http: http.build().unwrap(),
            tls,
        }
    }

    /// Starts the harness's front on `dir` (and `port`, when given).
    fn start_front(
        python: &std::path::Path,
        dir: &std::path::Path,
        user: &str,
        password: &str,
        port: Option<u16>,
        tls: Option<&(String, String, String)>,
    ) -> serde_json::Value {
        let mut cmd = std::process::Command::new(python);
        cmd.arg(harness_script("clickhouse_front.py"))
            .args(["start", "--path"])
            .arg(dir)
            .args(["--user", user, "--password", password, "--watch-pid"])
            .arg(std::process::id().to_string())
            .args(["--port", &port.unwrap_or(0).to_string()])
            .env("TZ", "UTC");
        if let Some((cert, key, _)) = tls {
            cmd.args(["--tls-cert", cert, "--tls-key", key]);
        }
        let out = cmd.output().expect("python runs");
        assert!(
            out.status.success(),
            "the ClickHouse test front did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the harness prints JSON")
    }

    /// Stops the front (its connections are refused from now on), as a
    /// ClickHouse restart does; [`Self::start_again`] brings it back with
    /// its data. Only for the harness's front.
    pub fn stop(&mut self) {
        let pid = self.pid.take().expect("the harness's front is running");
        harness(
            &self.python,
            "clickhouse_front.py",
            &["stop", "--pid", &pid.to_string()],
            "the ClickHouse front did not stop",
        );
    }

    /// Starts the front again on its data directory and port.
    pub fn start_again(&mut self) {
        let dir = self.dir.clone().expect("the harness's front");
        let port: u16 = self
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .expect("the front's URL has a port");
        let info = Self::start_front(
            &self.python,
            &dir,
            &self.user,
            &self.password,
            Some(port),
            self.tls.as_ref(),
        );
        self.pid = info["pid"].as_u64();
    }

    /// Drops what an earlier run left of a test's database on a real
    /// server (the tests' databases are named `urutau_t_*`).
    pub async fn fresh_database(&self, name: &str) {
        assert!(name.starts_with("urutau_t_"));
        self.query(&format!("DROP DATABASE IF EXISTS {name}")).await;
    }

    /// The sink options that reach this server.
    pub fn sink_options(&self, database: &str) -> String {
        let ca = match &self.tls {
            Some((_, _, ca)) => format!(", ca_cert = '{ca}'"),
            None => String::new(),
        };
        format!(
            "uri = '{}', user = '{}', password = '{}', database = '{database}'{ca}",
            self.url, self.user, self.password
        )
    }

    /// Runs a statement; panics with the server's message on failure.
    pub async fn query(&self, sql: &str) -> String {
        self.try_query(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs a statement; the server's message on failure.
    pub async fn try_query(&self, sql: &str) -> Result<String, String> {
        let r = self
            .http
            .post(&self.url)
            .header("X-ClickHouse-User", &self.user)
            .header("X-ClickHouse-Key", &self.password)
            .body(sql.to_string())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let ok = r.status().is_success();
        let text = r.text().await.map_err(|e| e.to_string())?;
        if ok { Ok(text) } else { Err(text) }
    }

    /// A query's rows as JSON objects (64-bit integers as numbers,
    /// decimals as text with their scale).
    pub async fn rows(&self, sql: &str) -> Vec<serde_json::Value> {
        self.query(&format!(
            "{sql} SETTINGS output_format_json_quote_64bit_integers = 0, output_format_json_quote_decimals = 1, output_format_decimal_trailing_zeros = 1 FORMAT JSONEachRow"
        ))
        .await
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            let script = harness_script("clickhouse_front.py");
            let _ = std::process::Command::new(&self.python)
                .arg(script)
                .args(["stop", "--pid", &pid.to_string()])
                .output();
        }
    }
}

/// A Couchbase cluster for one test: a real one when
/// `URUTAU_TEST_COUCHBASE_URL` is set (`_USER`, `_PASSWORD`), otherwise
/// gocaves, Couchbase's own mock cluster for SDK testing (built by
/// tests/harness/gocaves-build from its Go module and our small patch),
/// started for the test and stopped when dropped. Documents are read back
/// by the official Python SDK (tests/harness/couchbase.py). gocaves
/// accepts durability levels without enforcing them, has no query service
/// and keeps everything in memory: crash tests kill urutau, not the mock.
pub struct Couchbase {
    pub connstr: String,
    pub user: String,
    pub password: String,
    /// The `couchbases://` seed list, when the mock also serves TLS
    /// ([`Couchbase::start_tls`]).
    pub tls_connstr: Option<String>,
    python: std::path::PathBuf,
    /// The mock's process (group), while this test runs one.
    mock: Option<u64>,
}

impl Couchbase {
    pub fn start(python: &std::path::Path, dir: &std::path::Path) -> Couchbase {
        if let Ok(url) = std::env::var("URUTAU_TEST_COUCHBASE_URL") {
            return Couchbase {
                connstr: url,
                user: std::env::var("URUTAU_TEST_COUCHBASE_USER").unwrap_or_default(),
                password: std::env::var("URUTAU_TEST_COUCHBASE_PASSWORD").unwrap_or_default(),
                tls_connstr: None,
                python: python.to_path_buf(),
                mock: None,
            };
        }
        Self::start_with(python, dir, &[])
    }

    /// Starts the mock with TLS too (gocaves.patch item 4): its nodes
    /// serve TLS with the harness CA's server certificate from `certs`
    /// (for 127.0.0.1), at [`Couchbase::tls_connstr`].
    pub fn start_tls(
        python: &std::path::Path,
        dir: &std::path::Path,
        certs: &serde_json::Value,
    ) -> Couchbase {
        let file = |k: &str| certs[k].as_str().unwrap().to_string();
        let cb = Self::start_with(
            python,
            dir,
            &[
                "--tls-cert".into(),
                file("server_cert"),
                "--tls-key".into(),
                file("server_key"),
            ],
        );
        assert!(cb.tls_connstr.is_some(), "the mock serves no TLS");
        cb
    }

    fn start_with(python: &std::path::Path, dir: &std::path::Path, extra: &[String]) -> Couchbase {
        let mut cmd = std::process::Command::new(python);
        cmd.arg(harness_script("couchbase.py"))
            .args(["start", "--dir"])
            .arg(dir)
            .args(extra);
        if let Ok(bin) = std::env::var("URUTAU_TEST_GOCAVES") {
            cmd.args(["--bin", &bin]);
        }
        let out = cmd.output().expect("python runs");
        assert!(
            out.status.success(),
            "the Couchbase mock (gocaves) did not start (it needs Go to build: tests/harness/gocaves-build): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let info: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("the harness prints JSON");
        Couchbase {
            connstr: info["connstr"].as_str().unwrap().to_string(),
            user: info["username"].as_str().unwrap().to_string(),
            password: info["password"].as_str().unwrap().to_string(),
            tls_connstr: info["tls_connstr"].as_str().map(str::to_string),
            python: python.to_path_buf(),
            mock: info["pid"].as_u64(),
        }
    }

    /// The sink options that reach this cluster, for `bucket`.
    pub fn sink_options(&self, bucket: &str) -> String {
        format!(
            "uri = '{}', bucket = '{bucket}', username = '{}', password = '{}'",
            self.connstr, self.user, self.password
        )
    }

    /// The documents of `keys` in `bucket`.`scope`.`collection`, as the
    /// Python SDK reads them (`null`: no such document).
    pub fn get(
        &self,
        bucket: &str,
        scope: &str,
        collection: &str,
        keys: &[String],
    ) -> std::collections::BTreeMap<String, serde_json::Value> {
        use std::io::Write;
        let mut child = std::process::Command::new(&self.python)
            .arg(harness_script("couchbase.py"))
            .args(["get", "--connstr", &self.connstr, "--username", &self.user])
            .args(["--password", &self.password, "--bucket", bucket])
            .args(["--scope", scope, "--collection", collection])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(serde_json::to_string(keys).unwrap().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the Python SDK could not read {bucket}.{scope}.{collection}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the reader prints JSON")
    }

    /// Every bucket with its scopes and their collections, as the Python
    /// SDK's management APIs list them (`{bucket: {scope: [collection]}}`).
    pub fn layout(&self) -> serde_json::Value {
        let out = std::process::Command::new(&self.python)
            .arg(harness_script("couchbase.py"))
            .args([
                "layout",
                "--connstr",
                &self.connstr,
                "--username",
                &self.user,
            ])
            .args(["--password", &self.password])
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "the Python SDK could not list the cluster's layout: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the reader prints JSON")
    }

    /// Freezes the mock's process group (SIGSTOP): a node that stops
    /// answering without closing a connection (a hung or overloaded
    /// server, a network stall), keeping its data, unlike [`Self::stop`].
    pub fn pause(&self) {
        self.signal_group("-STOP");
    }

    /// Lets a [`Self::pause`]d mock go on (SIGCONT).
    pub fn resume(&self) {
        self.signal_group("-CONT");
    }

    fn signal_group(&self, signal: &str) {
        let pid = self.mock.expect("the test started the mock");
        let out = std::process::Command::new("kill")
            .args([signal, "--", &format!("-{pid}")])
            .output()
            .expect("kill runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the mock (a server lost mid-run): its process group is
    /// killed (it keeps everything in memory). By pid, not through its
    /// directory, which a test may have removed already.
    pub fn stop(&mut self) {
        if self.mock.is_some() {
            self.signal_group("-KILL");
            self.mock = None;
        }
    }
}

impl Drop for Couchbase {
    fn drop(&mut self) {
        if let Some(pid) = self.mock.take() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .output();
        }
    }
}

/// A real Apache Kafka broker (one KRaft node, from Maven) started by
/// tests/harness/kafka.py for one test, stopped when dropped; and, on
/// request, a real Debezium (Kafka Connect standalone with the Debezium
/// PostgreSQL connector) capturing a test's Postgres into it. Needs Java
/// and the jars `tests/harness/kafka-fetch` gets (URUTAU_TEST_KAFKA_HOME).
pub struct Kafka {
    pub brokers: String,
    /// With [`Kafka::start_secure`]: the TLS listeners and their users
    /// (`sasl_ssl`, `ssl`, `scram_user`, `scram_password`, `plain_user`,
    /// `plain_password`, `ca`, `client_cert`, `client_key`, `other_ca`).
    pub secure: Option<serde_json::Value>,
    python: std::path::PathBuf,
    dir: std::path::PathBuf,
    connect: Option<std::path::PathBuf>,
}

impl Kafka {
    pub fn start(python: &std::path::Path, dir: &std::path::Path) -> Kafka {
        Self::start_with(python, dir, &[])
    }

    /// A broker with, besides its plaintext listener, a SASL_SSL listener
    /// (SCRAM and PLAIN users) and an SSL listener requiring a client
    /// certificate, both with a certificate of the harness's test CA
    /// ([`Kafka::secure`]).
    pub fn start_secure(python: &std::path::Path, dir: &std::path::Path) -> Kafka {
        Self::start_with(python, dir, &["--secure"])
    }

    fn start_with(python: &std::path::Path, dir: &std::path::Path, extra: &[&str]) -> Kafka {
        let dir = dir.join("kafka");
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new(python)
            .arg(harness_script("kafka.py"))
            .args(["start", "--dir"])
            .arg(&dir)
            .args(extra)
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "Kafka did not start (it needs Java 17 and the jars of tests/harness/kafka-fetch, which needs Maven): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let info: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("the harness prints JSON");
        Kafka {
            brokers: info["brokers"].as_str().unwrap().to_string(),
            secure: info.get("secure").cloned(),
            python: python.to_path_buf(),
            dir,
            connect: None,
        }
    }

    /// Kills the broker (SIGKILL, as a crash or a lost node);
    /// [`Self::start_again`] brings it back on its data and port.
    pub fn stop(&self) {
        let dir = self.dir.to_str().unwrap();
        harness(
            &self.python,
            "kafka.py",
            &["stop", "--dir", dir],
            "the Kafka broker did not stop",
        );
    }

    /// Starts the broker again on its data directory and port.
    pub fn start_again(&self) {
        let dir = self.dir.to_str().unwrap();
        let out = harness(
            &self.python,
            "kafka.py",
            &["start", "--dir", dir],
            "the Kafka broker did not start again",
        );
        let info: serde_json::Value =
            serde_json::from_slice(&out).expect("the harness prints JSON");
        assert_eq!(info["brokers"].as_str(), Some(self.brokers.as_str()));
    }

    /// Runs a harness command against the broker; its JSON output.
    pub fn command(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = std::process::Command::new(&self.python)
            .arg(harness_script("kafka.py"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python runs");
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kafka.py {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn create_topic(&self, topic: &str, partitions: usize) {
        self.command(
            &[
                "create-topic",
                "--brokers",
                &self.brokers,
                "--topic",
                topic,
                "--partitions",
                &partitions.to_string(),
            ],
            None,
        );
    }

    pub fn add_partitions(&self, topic: &str, total: usize) {
        self.command(
            &[
                "add-partitions",
                "--brokers",
                &self.brokers,
                "--topic",
                topic,
                "--total",
                &total.to_string(),
            ],
            None,
        );
    }

    /// Produces messages (`{"value", "key", "partition", "headers"}` each);
    /// their `(partition, offset)`s.
    pub fn produce(&self, topic: &str, messages: &[serde_json::Value]) -> Vec<(i32, i64)> {
        let text: String = messages.iter().map(|m| format!("{m}\n")).collect();
        let out = self.command(
            &["produce", "--brokers", &self.brokers, "--topic", topic],
            Some(&text),
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_i64().unwrap() as i32, p[1].as_i64().unwrap()))
            .collect()
    }

    /// Removes a partition's messages before `before`; the new low watermark.
    pub fn delete_records(&self, topic: &str, partition: i32, before: i64) -> i64 {
        let out = self.command(
            &[
                "delete-records",
                "--brokers",
                &self.brokers,
                "--topic",
                topic,
                "--partition",
                &partition.to_string(),
                "--before",
                &before.to_string(),
            ],
            None,
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["low_watermark"]
            .as_i64()
            .unwrap()
    }

    /// Every message value of `topic` (tombstones left out), once it holds
    /// at least `wait_count` messages.
    pub fn values(&self, topic: &str, wait_count: usize) -> Vec<String> {
        self.command(
            &[
                "consume",
                "--brokers",
                &self.brokers,
                "--topic",
                topic,
                "--values-only",
                "--wait-count",
                &wait_count.to_string(),
            ],
            None,
        )
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// Starts Debezium capturing `tables` (`public.x`) of `pg` into topics
    /// `prefix.public.x`, with `value.converter.schemas.enable` as given;
    /// returns once the snapshot is in Kafka and the stream is open.
    pub fn start_debezium(
        &mut self,
        pg: &Postgres,
        slot: &str,
        tables: &str,
        prefix: &str,
        schemas: bool,
    ) {
        let dir = self.dir.join(format!("connect-{slot}"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = pg.info["port"].to_string();
        self.command(
            &[
                "connect-start",
                "--dir",
                dir.to_str().unwrap(),
                "--brokers",
                &self.brokers,
                "--pg-host",
                "127.0.0.1",
                "--pg-port",
                &port,
                "--pg-user",
                "postgres",
                "--pg-db",
                "postgres",
                "--slot",
                slot,
                "--publication",
                &format!("{slot}_pub"),
                "--tables",
                tables,
                "--topic-prefix",
                prefix,
                "--schemas-enable",
                if schemas { "true" } else { "false" },
            ],
            None,
        );
        self.connect = Some(dir);
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        if let Some(dir) = self.connect.take() {
            let _ = std::process::Command::new(&self.python)
                .arg(harness_script("kafka.py"))
                .args(["connect-stop", "--dir"])
                .arg(&dir)
                .args(["--grace", "0"])
                .output();
        }
        let _ = std::process::Command::new(&self.python)
            .arg(harness_script("kafka.py"))
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .output();
    }
}
