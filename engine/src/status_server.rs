//! `--metrics-addr`: a small HTTP endpoint for a long-running pipeline —
//! `/metrics` (Prometheus text), `/statusz` (JSON), `/healthz` (200 `ok`, or 503 with the reason while the run retries).
//! Plain HTTP/1.1 on a tokio listener: read-only, no request bodies.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Binds `addr` and serves `metrics` until the process ends; returns the
/// bound address (port 0 picks one).
pub async fn serve(addr: &str, metrics: Metrics) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut read = 0;
                // The request line and headers (no bodies are expected).
                while read < buf.len() {
                    match socket.read(&mut buf[read..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read += n,
                    }
                    if buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let request = String::from_utf8_lossy(&buf[..read]);
                let path = request
                    .lines()
                    .next()
                    .and_then(|l| l.split_whitespace().nth(1))
                    .unwrap_or("/");
                let path = path.split('?').next().unwrap_or(path);
                let (status, kind, body) = match path {
                    "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics.prometheus()),
                    "/statusz" => (
                        "200 OK",
                        "application/json",
                        metrics.status_json().to_string(),
                    ),
                    "/healthz" => match metrics.unhealthy() {
                        None => ("200 OK", "text/plain", "ok\n".to_string()),
                        Some(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
                    },
                    _ => (
                        "404 Not Found",
                        "text/plain",
                        "try /metrics, /statusz or /healthz\n".to_string(),
                    ),
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(reply.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    Ok(bound)
}
