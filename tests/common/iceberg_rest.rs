//! Test harness: Apache Iceberg's REST catalog fixture (1.10.0, the
//! reference REST server: Iceberg Java's own REST request parsing, as in
//! Polaris, Nessie and Gravitino), fetched from Maven by
//! tests/harness/iceberg-rest-fetch and started here for one test, bound to
//! 127.0.0.1 on a port the system picks (tests/harness/LoopbackRESTCatalogServer.java),
//! with a JDBC catalog on SQLite and a `file://` warehouse under the test's
//! directory, or (with Iceberg's S3FileIO) a warehouse in a bucket of a
//! SeaweedFS S3, whose keys the fixture then vends with every table
//! (`include-credentials`). Stopped (killed by its pid) when dropped.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where tests/harness/iceberg-rest-fetch put the fixture's jars and our
/// wrapper: `URUTAU_TEST_ICEBERG_REST`, or its default home. Missing, the
/// test fails and says what to run (`scripts/test` runs it).
pub fn home() -> PathBuf {
    let home = std::env::var("URUTAU_TEST_ICEBERG_REST")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/var/tmp/urutau-iceberg-rest"));
    assert!(
        home.join("classes/org/apache/iceberg/rest/LoopbackRESTCatalogServer.class")
            .exists(),
        "Iceberg's REST catalog fixture is not installed under {}: run tests/harness/iceberg-rest-fetch (needs a Java 17 JDK and Maven; scripts/test runs it)",
        home.display()
    );
    home
}

/// A running fixture.
pub struct IcebergRest {
    child: Child,
    uri: String,
    warehouse: PathBuf,
    log: PathBuf,
    /// The warehouse's S3 (`s3://<bucket>/wh`), when it is on S3.
    s3: Option<S3Warehouse>,
}

/// A warehouse in an S3 bucket.
#[derive(Clone)]
pub struct S3Warehouse {
    pub endpoint: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub bucket: String,
}

impl S3Warehouse {
    /// The warehouse location.
    pub fn location(&self) -> String {
        format!("s3://{}/wh", self.bucket)
    }
}

impl IcebergRest {
    /// Starts a fixture whose catalog (SQLite) and warehouse live in `dir`.
    pub async fn start(dir: &Path) -> IcebergRest {
        Self::start_with(dir, None).warmed_up().await
    }

    /// Starts a fixture whose catalog (SQLite) lives in `dir` and whose
    /// warehouse is `s3`'s bucket (S3FileIO; path-style; the keys vended
    /// with each table).
    pub async fn start_on_s3(dir: &Path, s3: S3Warehouse) -> IcebergRest {
        Self::start_with(dir, Some(s3)).warmed_up().await
    }

    /// The server after a first table's creation, commit and load (table
    /// `warmup.t`): a fresh JVM answers its first requests slowly (and,
    /// on S3, its first write starts the AWS SDK, which takes seconds), so
    /// that a test's runs, killed a few hundred milliseconds after their
    /// start, get as far as they would against a server already running.
    async fn warmed_up(self) -> IcebergRest {
        let http = reqwest::Client::new();
        for (path, body) in [
            ("/v1/namespaces", r#"{"namespace": ["warmup"]}"#),
            (
                "/v1/namespaces/warmup/tables",
                r#"{"name": "t", "schema": {"type": "struct", "schema-id": 0,
                    "fields": [{"id": 1, "name": "id", "required": true, "type": "long"}]},
                    "partition-spec": {"spec-id": 0, "fields": [
                        {"source-id": 1, "transform": "bucket[4]", "name": "id_bucket"}]}}"#,
            ),
            (
                "/v1/namespaces/warmup/tables/t",
                r#"{"requirements": [], "updates": [
                    {"action": "set-properties", "updates": {"warm": "yes"}}]}"#,
            ),
        ] {
            let response = http
                .post(format!("{}{path}", self.uri))
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .expect("the fixture answers");
            let status = response.status();
            assert!(
                status.is_success(),
                "POST {path}: {status}: {}",
                response.text().await.unwrap_or_default()
            );
        }
        let loaded = self.load("warmup.t").await;
        assert_eq!(loaded["metadata"]["properties"]["warm"], "yes");
        self
    }

    fn start_with(dir: &Path, s3: Option<S3Warehouse>) -> IcebergRest {
        let home = home();
        std::fs::create_dir_all(dir).unwrap();
        let dir = std::path::absolute(dir).unwrap();
        let warehouse = dir.join("warehouse");
        std::fs::create_dir_all(&warehouse).unwrap();
        let log = dir.join("iceberg-rest.log");
        let mut class_path = format!("{}/lib/*:{}/classes", home.display(), home.display());
        if s3.is_some() {
            class_path.push_str(&format!(":{}/aws/*", home.display()));
        }
        let mut command = Command::new("java");
        command
            .args([
                "-Xms64m",
                "-Xmx512m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(class_path)
            .arg("org.apache.iceberg.rest.LoopbackRESTCatalogServer");
        // Only the settings given here configure it.
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CATALOG_")) {
            command.env_remove(k);
        }
        match &s3 {
            None => command
                .env(
                    "CATALOG_WAREHOUSE",
                    format!("file://{}", warehouse.display()),
                )
                .env("CATALOG_IO__IMPL", "org.apache.iceberg.hadoop.HadoopFileIO"),
            Some(s3) => command
                .env("CATALOG_WAREHOUSE", s3.location())
                .env("CATALOG_IO__IMPL", "org.apache.iceberg.aws.s3.S3FileIO")
                .env("CATALOG_S3_ENDPOINT", &s3.endpoint)
                .env("CATALOG_S3_PATH__STYLE__ACCESS", "true")
                .env("CATALOG_S3_ACCESS__KEY__ID", &s3.access_key_id)
                .env("CATALOG_S3_SECRET__ACCESS__KEY", &s3.secret_access_key)
                .env("CATALOG_CLIENT_REGION", "us-east-1")
                .env("CATALOG_INCLUDE__CREDENTIALS", "true"),
        };
        let mut child = command
            .env(
                "CATALOG_URI",
                format!("jdbc:sqlite:{}", dir.join("catalog.db").display()),
            )
            .env(
                "CATALOG_CATALOG__IMPL",
                "org.apache.iceberg.jdbc.JdbcCatalog",
            )
            .env("CATALOG_REST_PORT", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("java runs (install a Java 17 JDK)");
        // The wrapper prints `listening on 127.0.0.1:<port>` once it is up.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            let first = lines.next().and_then(Result::ok);
            let _ = tx.send(first);
            // Keep reading so that the server never blocks on a full pipe.
            for _ in lines {}
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).ok().flatten();
        let Some(addr) = line
            .as_deref()
            .and_then(|l| l.strip_prefix("listening on "))
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "Iceberg's REST catalog fixture did not start ({line:?}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        IcebergRest {
            uri: format!("http://{addr}"),
            child,
            warehouse,
            log,
            s3,
        }
    }

    /// The catalog's URI.
    pub fn uri(&self) -> String {
        self.uri.clone()
    }

    /// The warehouse, as the server knows it (`file:///...`, or
    /// `s3://<bucket>/wh`).
    pub fn warehouse_uri(&self) -> String {
        match &self.s3 {
            Some(s3) => s3.location(),
            None => format!("file://{}", self.warehouse.display()),
        }
    }

    /// Arguments of iceberg_read.py that read `table` from the S3
    /// warehouse (DuckDB with the bucket's keys; the fixture hands a token
    /// to any client credentials).
    pub fn s3_reader_args(&self, table: &str) -> Vec<String> {
        let s3 = self.s3.as_ref().expect("a warehouse on S3");
        vec![
            "--rest".into(),
            self.uri(),
            "--warehouse".into(),
            s3.location(),
            "--credential".into(),
            format!("{}:{}", s3.access_key_id, s3.secret_access_key),
            "--table".into(),
            table.into(),
            "--s3-endpoint".into(),
            s3.endpoint.clone(),
        ]
    }

    /// The warehouse's S3, when it is on S3.
    pub fn s3(&self) -> Option<&S3Warehouse> {
        self.s3.as_ref()
    }

    /// The warehouse directory (when it is local).
    pub fn warehouse_dir(&self) -> &Path {
        &self.warehouse
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The load-table response for `table` (`ns.name`): `metadata-location`,
    /// `metadata`, `config`.
    pub async fn load(&self, table: &str) -> serde_json::Value {
        let (ns, name) = table.split_once('.').expect("ns.name");
        let url = format!("{}/v1/namespaces/{ns}/tables/{name}", self.uri);
        let response = reqwest::get(&url).await.expect("the fixture answers");
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(status.is_success(), "GET {url}: {status}: {body}");
        serde_json::from_str(&body).unwrap()
    }
}

impl Drop for IcebergRest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates the S3 bucket `bucket` (a plain one, for the fixture's
/// warehouse) with boto3 from the harness's Python.
pub fn create_bucket(python: &Path, s3: &S3Warehouse) {
    let out = Command::new(python)
        .args([
            "-c",
            "import boto3, sys\n\
             c = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                 aws_access_key_id=sys.argv[2], aws_secret_access_key=sys.argv[3])\n\
             c.create_bucket(Bucket=sys.argv[4])\n",
        ])
        .args([
            &s3.endpoint,
            &s3.access_key_id,
            &s3.secret_access_key,
            &s3.bucket,
        ])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "creating the bucket {}: {}",
        s3.bucket,
        String::from_utf8_lossy(&out.stderr)
    );
}
