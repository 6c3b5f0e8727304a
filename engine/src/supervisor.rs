//! Keeps a long-running pipeline going through transient failures, the way
//! Debezium's retriable errors restart a task: a run that fails because a
//! server or the network is briefly away (see [`RunError::is_transient`])
//! is run again from the positions its sinks committed, after an
//! exponential backoff with jitter, without restarting the process.
//!
//! Each failing part has a budget, its `retry_timeout` option (default
//! [`DEFAULT_RETRY_TIMEOUT`]): an outage that lasts longer ends the run
//! with the cause. An attempt that committed something ends the outage, so
//! the budget is per outage, not per process. Nothing is lost or applied
//! twice by a retry: every attempt resumes from what the sinks hold, as a
//! restarted process would.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use urutau_planner::evolution::SchemaChange;
use urutau_planner::plan::{PipelinePlan, SchemaOverrides};

use crate::metrics::RetryStatus;
use crate::runner::{self, RouteReport, RunError, RunOptions, RunReport};
use crate::shutdown::Shutdown;

/// How long one outage is retried when `retry_timeout` is not set.
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(300);
/// The first retry's delay; each next one doubles it, up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_millis(500);
/// The longest wait between two attempts.
const MAX_DELAY: Duration = Duration::from_secs(30);

/// The retry budget of each source and route of a plan.
#[derive(Debug, Clone, Default)]
pub struct RetryBudgets {
    sources: HashMap<String, Duration>,
    routes: HashMap<String, Duration>,
}

impl RetryBudgets {
    /// The budgets `plan`'s sources and sinks set (`retry_timeout`).
    pub fn of(plan: &PipelinePlan) -> RetryBudgets {
        let timeout = |options: &urutau_planner::options::OptionMap| {
            options
                .get("retry_timeout")
                .and_then(|t| urutau_planner::options::parse_duration(t).ok())
        };
        let sources = plan
            .spec
            .sources
            .iter()
            .filter_map(|s| Some((s.name.name.clone(), timeout(&s.options)?)))
            .collect();
        let routes = plan
            .routes
            .iter()
            .filter_map(|r| {
                let sink = plan
                    .spec
                    .sinks
                    .iter()
                    .find(|s| s.name.name == r.sink_name)?;
                Some((r.name.clone(), timeout(&sink.options)?))
            })
            .collect();
        RetryBudgets { sources, routes }
    }

    /// How long an outage that fails with `e` is retried.
    pub fn budget(&self, e: &RunError) -> Duration {
        let set = match e {
            RunError::Source { source_name, .. } => self.sources.get(source_name),
            RunError::Route { route, .. } | RunError::Commit { route, .. } => {
                self.routes.get(route)
            }
            RunError::Plan { .. } | RunError::SchemaChanged { .. } => None,
        };
        set.copied().unwrap_or(DEFAULT_RETRY_TIMEOUT)
    }
}

/// The wait before retry `attempt` (1, 2, ...): doubling from
/// [`FIRST_DELAY`] up to [`MAX_DELAY`], then a random half of it added or
/// not ("equal jitter"), so pipelines that lost the same server do not
/// all come back in the same instant.
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let doubled = FIRST_DELAY.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let ceiling = doubled.min(MAX_DELAY);
    ceiling.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// A number in [0, 1) that differs between calls and processes (no
/// cryptographic quality needed).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Adds `more`'s counts to `into` (one report over every attempt).
fn merge(into: &mut Vec<RouteReport>, more: Vec<RouteReport>) {
    for r in more {
        match into.iter_mut().find(|x| x.name == r.name) {
            Some(x) => {
                x.commits += r.commits;
                x.rows += r.rows;
                x.deletes += r.deletes;
                if r.position.is_some() {
                    x.position = r.position;
                }
            }
            None => into.push(r),
        }
    }
}

/// Runs `plan` like [`runner::run`], retrying transient failures: before
/// each retry the pipeline is planned again with `replan` (a plan executes
/// once; planning again also reads the source's schemas afresh). The
/// report adds up every attempt. `shutdown` stops the run, also while it
/// waits to retry.
///
/// A source table that changes shape ([`RunError::SchemaChanged`]) is not
/// a failure: the pipeline is planned again at once with the shape the
/// table grew to (kept for every later plan of this run, in the overrides
/// `replan` receives), and the run goes on from the committed positions.
pub async fn run_with_retries<F, Fut>(
    plan: PipelinePlan,
    mut replan: F,
    options: RunOptions,
    shutdown: Shutdown,
) -> Result<RunReport, RunError>
where
    F: FnMut(&SchemaOverrides) -> Fut,
    Fut: Future<Output = Result<PipelinePlan, RunError>>,
{
    let metrics = options.metrics.clone();
    let mut plan = plan;
    let mut budgets = RetryBudgets::of(&plan);
    let mut routes: Vec<RouteReport> = Vec::new();
    // The outage in progress: when it began and how often it was retried.
    let mut outage: Option<(Instant, f64, u32)> = None;
    let mut continues = false;
    let mut overrides = SchemaOverrides::new();
    loop {
        // Each attempt has its own stop: a run's terminal error stops that
        // attempt's parts, not the caller's handle.
        let attempt_stop = Shutdown::new();
        let forward = {
            let (outer, inner) = (shutdown.clone(), attempt_stop.clone());
            tokio::spawn(async move {
                outer.wait().await;
                inner.trigger();
            })
        };
        let commits_before = metrics.total_commits();
        let result = runner::run(
            &plan,
            RunOptions {
                continues,
                ..options.clone()
            },
            attempt_stop,
        )
        .await;
        forward.abort();
        continues = true;
        let error = match result {
            Ok(report) => {
                merge(&mut routes, report.routes);
                return Ok(RunReport {
                    routes,
                    stopped: report.stopped,
                });
            }
            Err(RunError::SchemaChanged { .. }) if shutdown.is_triggered() => {
                return Ok(RunReport {
                    routes,
                    stopped: true,
                });
            }
            Err(RunError::SchemaChanged { change, .. }) => {
                tracing::info!(
                    source = %change.source,
                    table = %change.table.join("."),
                    change = %change.description,
                    "the table changed at the source: planning its routes again with its new shape, from the committed positions"
                );
                let key = (change.source.clone(), change.table.clone());
                if overrides.get(&key) == Some(&change.schema) {
                    // Planning again with the shape it was planned with
                    // cannot help: stop rather than loop.
                    return Err(RunError::SchemaChanged {
                        source_name: change.source.clone(),
                        message: format!(
                            "table {} changed at the source ({}), and planning its routes again with the grown shape did not settle it (the same change was found again); stopping rather than looping",
                            change.table.join("."),
                            change.description
                        ),
                        change,
                        transient: false,
                    });
                }
                metrics.schema_changed(&change.source, &change.table, &change.description);
                overrides.insert(key, change.schema.clone());
                match replan(&overrides).await {
                    Ok(p) => {
                        plan = p;
                        budgets = RetryBudgets::of(&plan);
                        note_ignored_columns(&plan, &change);
                        continue;
                    }
                    // The source went away meanwhile: an outage like any.
                    Err(e) if e.is_transient() => e,
                    Err(e) => return Err(e),
                }
            }
            Err(e) if shutdown.is_triggered() || !e.is_transient() => return Err(e),
            Err(e) => e,
        };
        if metrics.total_commits() > commits_before {
            // The attempt made progress: this is a new outage.
            outage = None;
        }
        let mut failure = error;
        loop {
            let (since, since_unix, attempt) =
                outage.get_or_insert_with(|| (Instant::now(), now_unix(), 0));
            *attempt += 1;
            let budget = budgets.budget(&failure);
            if budget.is_zero() {
                // `retry_timeout = '0s'`: retries are off for this part.
                return Err(failure);
            }
            let spent = since.elapsed();
            if spent >= budget {
                return Err(gave_up(failure, spent, *attempt - 1, budget));
            }
            let wait = backoff(*attempt, jitter()).min(budget - spent);
            tracing::warn!(
                component = %failure.component(),
                attempt = *attempt,
                retry_in_ms = wait.as_millis() as u64,
                budget_left_s = (budget - spent).as_secs(),
                error = %failure,
                "transient failure: retrying from the committed positions"
            );
            metrics.retrying(RetryStatus {
                component: failure.component(),
                failed_while: failure.failed_while(),
                error: failure.to_string(),
                attempt: *attempt,
                since_unix: *since_unix,
                budget_left_seconds: (budget - spent).as_secs_f64(),
            });
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait() => {
                    return Ok(RunReport { routes, stopped: true });
                }
            }
            match replan(&overrides).await {
                Ok(p) => {
                    plan = p;
                    budgets = RetryBudgets::of(&plan);
                    break;
                }
                Err(e) if e.is_transient() => {
                    // The source is still away (its schemas cannot be
                    // read): the same outage, retried on the source's
                    // budget.
                    failure = match failure {
                        RunError::Source { .. } => failure.with_message(e.to_string()),
                        _ => e,
                    };
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Logs the columns `change` added that a route of its table does not
/// write (its SELECT names its columns): they do not reach that target.
fn note_ignored_columns(plan: &PipelinePlan, change: &SchemaChange) {
    for route in plan
        .routes
        .iter()
        .filter(|r| r.source == change.source && r.source_table == change.table)
    {
        for column in &change.added {
            if !route.target.columns.iter().any(|c| &c.name == column) {
                tracing::info!(route = %route.name, column = %column, "the route does not write the column added at the source: its SELECT names its columns");
            }
        }
    }
}

/// The error that ends a run whose outage outlasted its budget.
fn gave_up(e: RunError, spent: Duration, retries: u32, budget: Duration) -> RunError {
    let note = format!(
        " (still failing after {retries} retries over {:.0}s; retry_timeout = {}s)",
        spent.as_secs_f64(),
        budget.as_secs()
    );
    e.terminal_with(&note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_ceiling_with_equal_jitter() {
        assert_eq!(backoff(1, 1.0), Duration::from_millis(500));
        assert_eq!(backoff(1, 0.0), Duration::from_millis(250));
        assert_eq!(backoff(2, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(4, 1.0), Duration::from_secs(4));
        assert_eq!(backoff(7, 1.0), MAX_DELAY);
        assert_eq!(backoff(40, 0.0), MAX_DELAY / 2);
        let j = jitter();
        assert!((0.0..1.0).contains(&j));
    }

    #[test]
    fn giving_up_names_the_budget_and_is_terminal() {
        let e = RunError::Source {
            source_name: "pg".into(),
            message: "connecting to Postgres: connection refused".into(),
            transient: true,
        };
        let e = gave_up(e, Duration::from_secs(31), 6, Duration::from_secs(30));
        assert!(!e.is_transient());
        let text = e.to_string();
        assert!(
            text.starts_with("source pg: connecting to Postgres"),
            "{text}"
        );
        assert!(
            text.contains("6 retries over 31s; retry_timeout = 30s"),
            "{text}"
        );
    }
}
