//! What a long-running pipeline reports about itself: counters and gauges
//! the runner and sources update, rendered as Prometheus text (`/metrics`)
//! and as JSON status (`/statusz`) by [`crate::status_server`].
//!
//! One registry per pipeline session, shared by the run's parts (a cheap
//! clone): the CLI serves its run's, a notebook's pipelines each keep
//! their own, so two pipelines in one process never mix their figures.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// One table's (route's) figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TableStatus {
    /// `snapshot` or `stream`.
    pub phase: String,
    /// The position committed last (or found at start).
    pub position: Option<String>,
    pub commits: u64,
    /// Rows written that replace or add a key's image.
    pub upserts: u64,
    /// Rows written as deletes (tombstones, equality deletes, delete rows).
    pub deletes: u64,
    pub commit_failures: u64,
    /// Unix seconds of the last commit.
    pub last_commit_unix: Option<f64>,
    /// The committed snapshot state (`not_started`, `in_progress`,
    /// `complete`) for a source that snapshots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_state: Option<String>,
    /// The target table's schema version as the sink names it (Iceberg's
    /// current schema id), as the run found or evolved it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_schema: Option<String>,
    #[serde(skip)]
    commit_seconds_sum: f64,
}

/// One source's figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SourceStatus {
    /// Bytes of WAL (or the source's unit) received but not yet
    /// acknowledged by every route.
    pub lag_bytes: Option<u64>,
    /// Seconds between the newest acknowledged change's commit and now.
    pub lag_seconds: Option<f64>,
    /// TRUNCATEs of routed tables that were ignored (`on_truncate`).
    pub truncates_ignored: u64,
    /// Messages left out because they could not be decoded
    /// (`on_decode_error = 'skip'`).
    pub decode_skipped: u64,
    /// Rows read with a field their table's declaration lacks (the field
    /// was left out; `on_schema_mismatch = 'ignore'`).
    pub mismatched_rows: u64,
}

/// One source table's initial snapshot, as the source copies it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SnapshotStatus {
    /// Rows copied so far in this run (chunks whose window closed).
    pub rows_copied: u64,
    /// The table's estimated row count (the planner's statistics).
    pub rows_estimated: u64,
    /// Whether every chunk has been read.
    pub done: bool,
    /// Rows copied per second in this run (after its first quarter second).
    pub rows_per_second: Option<f64>,
    /// Seconds left at that rate, by the estimate (0 once done).
    pub eta_seconds: Option<f64>,
}

/// One source table's shape, as the run follows it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SchemaStatus {
    /// 1 for the shape the run was planned with, plus one per change of
    /// shape the run followed (its routes planned again).
    pub version: u64,
    /// The last change followed (`column extra (INT) added`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_change: Option<String>,
}

/// The registry (a handle: clones share the figures).
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    pipeline: String,
    tables: BTreeMap<String, TableStatus>,
    sources: BTreeMap<String, SourceStatus>,
    snapshots: BTreeMap<String, SnapshotStatus>,
    /// Set while the run waits to retry after a transient failure.
    retrying: Option<RetryStatus>,
    /// Retries so far, per failing part (`source pg`, `route lake.orders`).
    retries: BTreeMap<String, u64>,
    /// Source tables' shapes, by `source.table`.
    schemas: BTreeMap<String, SchemaStatus>,
}

/// Why the run is retrying (`/statusz`'s `health.retrying`; `/healthz`
/// answers 503 while it is set).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RetryStatus {
    /// The part that failed: `source <name>` or `route <table>`.
    pub component: String,
    /// What it was doing ([`crate::runner::RunError::failed_while`]).
    pub failed_while: &'static str,
    /// The failure, as the run would report it.
    pub error: String,
    /// Retries of this outage so far.
    pub attempt: u32,
    /// Unix seconds the outage began.
    pub since_unix: f64,
    /// Seconds of the retry budget (`retry_timeout`) left.
    pub budget_left_seconds: f64,
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Writes one metric family.
fn section(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    rows: impl IntoIterator<Item = String>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for r in rows {
        let _ = writeln!(out, "{r}");
    }
}

/// Prometheus label value escaping.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A run of pipeline `name` starts: the figures of an earlier run in
    /// this process (a notebook runs one pipeline after another) are
    /// dropped, so each run reports only itself.
    pub fn start_pipeline(&self, name: &str) {
        let mut g = self.lock();
        *g = Inner::default();
        g.pipeline = name.to_string();
    }

    /// The run failed with a transient error of `status.component` and
    /// retries: `/healthz` turns unhealthy until the run is back.
    pub fn retrying(&self, status: RetryStatus) {
        let mut g = self.lock();
        *g.retries.entry(status.component.clone()).or_default() += 1;
        g.retrying = Some(status);
    }

    /// Source `source` is connected and reading again: if it was the
    /// failing part (or planning, which read its schemas), the run is
    /// healthy again.
    pub fn source_up(&self, source: &str) {
        let component = format!("source {source}");
        self.recovered(|r| r.component == component || r.failed_while == "planning");
    }

    /// Route `route` opened its table and read its position: if that is
    /// what failed (or planning), the run is healthy again. A failed
    /// commit is healthy only once a commit lands.
    pub fn route_opened(&self, route: &str) {
        let component = format!("route {route}");
        self.recovered(|r| {
            (r.component == component && r.failed_while == "opening")
                || r.failed_while == "planning"
        });
    }

    /// Clears the retry status when `is_back` says its part works again;
    /// another part's failure keeps `/healthz` unhealthy.
    fn recovered(&self, is_back: impl Fn(&RetryStatus) -> bool) {
        let mut g = self.lock();
        if g.retrying.as_ref().is_some_and(is_back) {
            g.retrying = None;
        }
    }

    /// `None` when healthy, else why not (`/healthz`).
    pub fn unhealthy(&self) -> Option<String> {
        self.lock().retrying.as_ref().map(|r| {
            format!(
                "retrying {} (attempt {}, {:.0}s of the retry budget left): {}",
                r.component, r.attempt, r.budget_left_seconds, r.error
            )
        })
    }

    /// Commits landed so far, over every table (a retry whose run made
    /// progress starts a new retry budget).
    pub fn total_commits(&self) -> u64 {
        self.lock().tables.values().map(|t| t.commits).sum()
    }

    /// A route starts (at `position`, in `phase`).
    pub fn table_started(&self, table: &str, phase: &str, position: Option<String>) {
        let mut g = self.lock();
        let t = g.tables.entry(table.to_string()).or_default();
        t.phase = phase.to_string();
        t.position = position;
    }

    /// Route `table`'s snapshot runs (its state `state`): shown before its
    /// first commit too, which a sink may defer
    /// ([`urutau_planner::sink::Committed::Deferred`]).
    pub fn snapshot_running(&self, table: &str, state: &str) {
        let mut g = self.lock();
        let t = g.tables.entry(table.to_string()).or_default();
        t.phase = "snapshot".to_string();
        t.snapshot_state = Some(state.to_string());
    }

    /// Route `table`'s target is at schema version `version`.
    pub fn target_schema(&self, table: &str, version: String) {
        self.lock()
            .tables
            .entry(table.to_string())
            .or_default()
            .target_schema = Some(version);
    }

    /// A commit landed; `mark` is the committed position with the table's
    /// snapshot progress, if any (which sets the phase).
    pub fn committed(&self, table: &str, mark: &str, rows: u64, deletes: u64, seconds: f64) {
        let mark = urutau_planner::progress::CommitMark::parse(mark);
        self.recovered(|r| r.component == format!("route {table}"));
        let mut g = self.lock();
        let t = g.tables.entry(table.to_string()).or_default();
        t.commits += 1;
        t.upserts += rows.saturating_sub(deletes);
        t.deletes += deletes;
        if let Some(s) = &mark.snapshot {
            t.phase = if s.is_complete() {
                "stream"
            } else {
                "snapshot"
            }
            .to_string();
            t.snapshot_state = Some(s.state().to_string());
        }
        t.position = Some(mark.position);
        t.last_commit_unix = Some(now_unix());
        t.commit_seconds_sum += seconds;
    }

    /// A source table's snapshot progress (rows copied of the estimate,
    /// the rate and the time left).
    pub fn snapshot_progress(&self, source_table: &str, status: SnapshotStatus) {
        self.lock()
            .snapshots
            .insert(source_table.to_string(), status);
    }

    /// A commit failed.
    pub fn commit_failed(&self, table: &str) {
        self.lock()
            .tables
            .entry(table.to_string())
            .or_default()
            .commit_failures += 1;
    }

    /// A source's lag.
    pub fn source_lag(&self, source: &str, bytes: Option<u64>, seconds: Option<f64>) {
        let mut g = self.lock();
        let s = g.sources.entry(source.to_string()).or_default();
        if bytes.is_some() {
            s.lag_bytes = bytes;
        }
        if seconds.is_some() {
            s.lag_seconds = seconds;
        }
    }

    /// A TRUNCATE was ignored.
    pub fn truncate_ignored(&self, source: &str) {
        self.lock()
            .sources
            .entry(source.to_string())
            .or_default()
            .truncates_ignored += 1;
    }

    /// Table `table` of `source` changed shape and its routes were planned
    /// again (`change` says how).
    pub fn schema_changed(&self, source: &str, table: &[String], change: &str) {
        let mut g = self.lock();
        let s = g
            .schemas
            .entry(format!("{source}.{}", table.join(".")))
            .or_insert(SchemaStatus {
                version: 1,
                last_change: None,
            });
        s.version += 1;
        s.last_change = Some(change.to_string());
    }

    /// `rows` rows had a field their declaration lacks (left out).
    pub fn mismatched_rows(&self, source: &str, rows: u64) {
        if rows > 0 {
            self.lock()
                .sources
                .entry(source.to_string())
                .or_default()
                .mismatched_rows += rows;
        }
    }

    /// A message that could not be decoded was skipped.
    pub fn decode_skipped(&self, source: &str) {
        self.lock()
            .sources
            .entry(source.to_string())
            .or_default()
            .decode_skipped += 1;
    }

    /// `/statusz`: the pipeline, its tables and sources.
    pub fn status_json(&self) -> serde_json::Value {
        let g = self.lock();
        serde_json::json!({
            "pipeline": g.pipeline,
            "health": {
                "state": if g.retrying.is_some() { "retrying" } else { "ok" },
                "retrying": g.retrying,
                "retries": g.retries,
            },
            "tables": g.tables,
            "sources": g.sources,
            "snapshots": g.snapshots,
            "schemas": g.schemas,
        })
    }

    /// `/metrics`: Prometheus text exposition.
    pub fn prometheus(&self) -> String {
        let g = self.lock();
        let mut out = String::new();
        section(
            &mut out,
            "urutau_rows_written_total",
            "counter",
            "Rows committed to the sink, by table and op.",
            g.tables.iter().flat_map(|(t, s)| {
                let t = label(t);
                [
                    format!(
                        "urutau_rows_written_total{{table=\"{t}\",op=\"upsert\"}} {}",
                        s.upserts
                    ),
                    format!(
                        "urutau_rows_written_total{{table=\"{t}\",op=\"delete\"}} {}",
                        s.deletes
                    ),
                ]
            }),
        );
        section(
            &mut out,
            "urutau_commits_total",
            "counter",
            "Commits per table.",
            g.tables.iter().map(|(t, s)| {
                format!(
                    "urutau_commits_total{{table=\"{}\"}} {}",
                    label(t),
                    s.commits
                )
            }),
        );
        section(
            &mut out,
            "urutau_commit_duration_seconds",
            "summary",
            "Time spent committing batches, per table.",
            g.tables.iter().flat_map(|(t, s)| {
                let t = label(t);
                [
                    format!(
                        "urutau_commit_duration_seconds_sum{{table=\"{t}\"}} {}",
                        s.commit_seconds_sum
                    ),
                    format!(
                        "urutau_commit_duration_seconds_count{{table=\"{t}\"}} {}",
                        s.commits
                    ),
                ]
            }),
        );
        section(
            &mut out,
            "urutau_commit_failures_total",
            "counter",
            "Commits that failed, per table.",
            g.tables.iter().map(|(t, s)| {
                format!(
                    "urutau_commit_failures_total{{table=\"{}\"}} {}",
                    label(t),
                    s.commit_failures
                )
            }),
        );
        section(
            &mut out,
            "urutau_last_commit_timestamp_seconds",
            "gauge",
            "Unix time of each table's last commit.",
            g.tables.iter().filter_map(|(t, s)| {
                s.last_commit_unix.map(|u| {
                    format!(
                        "urutau_last_commit_timestamp_seconds{{table=\"{}\"}} {u}",
                        label(t)
                    )
                })
            }),
        );
        section(
            &mut out,
            "urutau_table_phase",
            "gauge",
            "1 for each table's current phase (snapshot or stream).",
            g.tables.iter().map(|(t, s)| {
                format!(
                    "urutau_table_phase{{table=\"{}\",phase=\"{}\"}} 1",
                    label(t),
                    label(&s.phase)
                )
            }),
        );
        section(
            &mut out,
            "urutau_schema_changes_total",
            "counter",
            "Changes of a source table's shape that the run followed (its routes planned again).",
            g.schemas.iter().map(|(t, s)| {
                format!(
                    "urutau_schema_changes_total{{table=\"{}\"}} {}",
                    label(t),
                    s.version - 1
                )
            }),
        );
        section(
            &mut out,
            "urutau_snapshot_rows_copied",
            "gauge",
            "Rows of each source table copied by the initial snapshot in this run.",
            g.snapshots.iter().map(|(t, s)| {
                format!(
                    "urutau_snapshot_rows_copied{{table=\"{}\"}} {}",
                    label(t),
                    s.rows_copied
                )
            }),
        );
        section(
            &mut out,
            "urutau_snapshot_rows_estimated",
            "gauge",
            "Each snapshotted source table's estimated row count.",
            g.snapshots.iter().map(|(t, s)| {
                format!(
                    "urutau_snapshot_rows_estimated{{table=\"{}\"}} {}",
                    label(t),
                    s.rows_estimated
                )
            }),
        );
        section(
            &mut out,
            "urutau_snapshot_rows_per_second",
            "gauge",
            "Rows of each source table copied per second by the initial snapshot in this run.",
            g.snapshots.iter().filter_map(|(t, s)| {
                s.rows_per_second.map(|r| {
                    format!(
                        "urutau_snapshot_rows_per_second{{table=\"{}\"}} {r:.1}",
                        label(t)
                    )
                })
            }),
        );
        section(
            &mut out,
            "urutau_snapshot_eta_seconds",
            "gauge",
            "Seconds left in each source table's initial snapshot at the current rate, by the row estimate.",
            g.snapshots.iter().filter_map(|(t, s)| {
                s.eta_seconds.map(|e| {
                    format!(
                        "urutau_snapshot_eta_seconds{{table=\"{}\"}} {e:.0}",
                        label(t)
                    )
                })
            }),
        );
        section(
            &mut out,
            "urutau_replication_lag_bytes",
            "gauge",
            "Bytes received from a source and not yet committed by every route.",
            g.sources.iter().filter_map(|(n, s)| {
                s.lag_bytes.map(|b| {
                    format!(
                        "urutau_replication_lag_bytes{{source=\"{}\"}} {b}",
                        label(n)
                    )
                })
            }),
        );
        section(
            &mut out,
            "urutau_replication_lag_seconds",
            "gauge",
            "Seconds between the newest committed change's source commit and now.",
            g.sources.iter().filter_map(|(n, s)| {
                s.lag_seconds.map(|b| {
                    format!(
                        "urutau_replication_lag_seconds{{source=\"{}\"}} {b}",
                        label(n)
                    )
                })
            }),
        );
        section(
            &mut out,
            "urutau_truncates_ignored_total",
            "counter",
            "TRUNCATEs of routed tables ignored (on_truncate = 'ignore').",
            g.sources.iter().map(|(n, s)| {
                format!(
                    "urutau_truncates_ignored_total{{source=\"{}\"}} {}",
                    label(n),
                    s.truncates_ignored
                )
            }),
        );
        section(
            &mut out,
            "urutau_retries_total",
            "counter",
            "Retries after a transient failure, by the part that failed.",
            g.retries
                .iter()
                .map(|(c, n)| format!("urutau_retries_total{{component=\"{}\"}} {n}", label(c))),
        );
        section(
            &mut out,
            "urutau_retrying",
            "gauge",
            "1 while the run waits to retry after a transient failure.",
            [format!(
                "urutau_retrying {}",
                u8::from(g.retrying.is_some())
            )],
        );
        section(
            &mut out,
            "urutau_decode_skipped_total",
            "counter",
            "Messages skipped because they could not be decoded (on_decode_error = 'skip').",
            g.sources.iter().map(|(n, s)| {
                format!(
                    "urutau_decode_skipped_total{{source=\"{}\"}} {}",
                    label(n),
                    s.decode_skipped
                )
            }),
        );
        section(
            &mut out,
            "urutau_mismatched_rows_total",
            "counter",
            "Rows read with a field their table's declaration lacks, which was left out (on_schema_mismatch = 'ignore').",
            g.sources.iter().map(|(n, s)| {
                format!(
                    "urutau_mismatched_rows_total{{source=\"{}\"}} {}",
                    label(n),
                    s.mismatched_rows
                )
            }),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_as_prometheus_text_and_json() {
        let m = Metrics::default();
        m.start_pipeline("p");
        m.table_started("lake.orders", "stream", None);
        m.committed("lake.orders", "0/16B3748", 10, 3, 0.5);
        m.commit_failed("lake.orders");
        m.source_lag("pg", Some(120), Some(1.5));
        m.truncate_ignored("pg");
        m.retrying(RetryStatus {
            component: "source pg".into(),
            failed_while: "reading",
            error: "connection refused".into(),
            attempt: 1,
            since_unix: 0.0,
            budget_left_seconds: 299.0,
        });
        assert!(m.unhealthy().unwrap().contains("retrying source pg"));
        assert_eq!(m.status_json()["health"]["state"], "retrying");
        let text = m.prometheus();
        assert!(text.contains("urutau_retries_total{component=\"source pg\"} 1"));
        assert!(text.contains("urutau_retrying 1"));
        m.source_up("pg");
        assert!(m.unhealthy().is_none());
        for line in [
            "urutau_rows_written_total{table=\"lake.orders\",op=\"upsert\"} 7",
            "urutau_rows_written_total{table=\"lake.orders\",op=\"delete\"} 3",
            "urutau_commit_duration_seconds_sum{table=\"lake.orders\"} 0.5",
            "urutau_commit_duration_seconds_count{table=\"lake.orders\"} 1",
            "urutau_commit_failures_total{table=\"lake.orders\"} 1",
            "urutau_replication_lag_bytes{source=\"pg\"} 120",
            "urutau_replication_lag_seconds{source=\"pg\"} 1.5",
            "urutau_truncates_ignored_total{source=\"pg\"} 1",
            "urutau_table_phase{table=\"lake.orders\",phase=\"stream\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        let j = m.status_json();
        assert_eq!(j["tables"]["lake.orders"]["position"], "0/16B3748");
        assert_eq!(j["tables"]["lake.orders"]["upserts"], 7);
        assert_eq!(j["sources"]["pg"]["lag_bytes"], 120);
    }

    #[test]
    fn only_the_failing_part_coming_back_ends_the_retry_status() {
        let m = Metrics::default();
        let failing = |component: &str, failed_while| RetryStatus {
            component: component.into(),
            failed_while,
            error: "connection refused".into(),
            attempt: 1,
            since_unix: 0.0,
            budget_left_seconds: 60.0,
        };
        m.retrying(failing("route ch.items", "committing"));
        m.source_up("pg");
        m.route_opened("ch.items");
        m.committed("lake.other", "0/10", 1, 0, 0.1);
        assert!(m.unhealthy().is_some(), "the failed commit has not landed");
        m.committed("ch.items", "0/20", 1, 0, 0.1);
        assert!(m.unhealthy().is_none());

        m.retrying(failing("route ch.items", "opening"));
        m.route_opened("ch.items");
        assert!(m.unhealthy().is_none(), "the table opened again");

        m.retrying(failing("source pg", "reading"));
        m.route_opened("ch.items");
        assert!(m.unhealthy().is_some());
        m.source_up("pg");
        assert!(m.unhealthy().is_none());
    }
}
