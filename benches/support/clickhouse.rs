//! The ClickHouse server of the benches that write to ClickHouse.

/// Where the server is, and the front process to stop when we started it.
pub struct Server {
    pub url: String,
    pub user: String,
    pub password: String,
    front: Option<(std::path::PathBuf, u64)>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some((python, pid)) = &self.front {
            let _ = std::process::Command::new(python)
                .arg(front_script())
                .args(["stop", "--pid", &pid.to_string()])
                .output();
        }
    }
}

fn front_script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness/clickhouse_front.py")
}

/// The ClickHouse server of a bench: `URUTAU_TEST_CLICKHOUSE_URL` (+
/// `_USER`, `_PASSWORD`) when set, else the harness's front over the chdb
/// engine, started in `dir` and stopped when dropped.
pub fn server(dir: &std::path::Path) -> Server {
    if let Ok(url) = std::env::var("URUTAU_TEST_CLICKHOUSE_URL") {
        return Server {
            url,
            user: std::env::var("URUTAU_TEST_CLICKHOUSE_USER").unwrap_or("default".into()),
            password: std::env::var("URUTAU_TEST_CLICKHOUSE_PASSWORD").unwrap_or_default(),
            front: None,
        };
    }
    let python = super::harness_python();
    let out = std::process::Command::new(&python)
        .arg(front_script())
        .args(["start", "--path"])
        .arg(dir)
        .args([
            "--user",
            "bench",
            "--password",
            "bench-secret",
            "--watch-pid",
        ])
        .arg(std::process::id().to_string())
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Server {
        url: info["url"].as_str().unwrap().into(),
        user: "bench".into(),
        password: "bench-secret".into(),
        front: Some((python, info["pid"].as_u64().unwrap())),
    }
}
