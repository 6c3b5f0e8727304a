//! A PostgreSQL server for the Postgres benches (tests/harness/postgres.py),
//! and the server's own client tools.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A server for a bench, stopped when dropped.
pub struct Server {
    dir: PathBuf,
    pub uri: String,
}

fn harness() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness/postgres.py")
}

impl Server {
    /// Starts a cluster in `dir`; panics, saying what to install, when the
    /// server package is missing (a bench without its server fails).
    pub fn start(dir: &Path) -> Server {
        let out = Command::new("python3")
            .arg(harness())
            .args(["start", "--dir"])
            .arg(dir)
            .output()
            .unwrap();
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).to_string();
            panic!(
                "PostgreSQL did not start (apt-get install postgresql, or run scripts/test): {why}"
            );
        }
        let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        Server {
            dir: dir.to_path_buf(),
            uri: info["uri"].as_str().unwrap().to_string(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("python3")
            .arg(harness())
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .output();
    }
}

/// A client program of the newest installed server (`pg_recvlogical`,
/// `psql`).
pub fn bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin").join(name))
                .filter(|p| p.exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| PathBuf::from(name))
}
