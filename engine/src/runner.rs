//! The runner: resumes every route from its sink's committed position,
//! feeds each route the changes after it, drives the route plans, and stops
//! — gracefully on a signal, or at the first batch a sink rejects.
//!
//! Per source: the source starts after the minimum committed position of
//! its routes ([`min_safe`]); a route whose sink is further ahead skips the
//! changes it already holds, so nothing is applied twice. A route that the
//! source has not touched for `progress_interval` gets an empty batch that
//! only advances its position. Acknowledgements to the source carry only
//! positions every route has committed.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use datafusion::execution::TaskContext;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use urutau_planner::context;
use urutau_planner::evolution::SchemaChange;
use urutau_planner::feed::RouteBatch;
use urutau_planner::physical::SinkCommitError;
use urutau_planner::plan::PipelinePlan;
use urutau_planner::progress::{CommitMark, SnapshotProgress};

use crate::batching::BatchPolicy;
use crate::metrics::Metrics;
use crate::position::{Position, PositionError, PositionKind, min_safe};
use crate::shutdown::Shutdown;
use crate::sources::{self, OpenArgs, SourceBatch, position_kind};

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Exit once everything the sources held at start is committed.
    pub exit_when_caught_up: bool,
    /// Preview: each route receives at most this many changes (after the
    /// position its sink holds), and the sources stop reading once every
    /// route has had its share. The batch that reaches a route's share is
    /// cut there, so the positions such a run reports are not transaction
    /// boundaries: only for runs whose sinks commit nothing.
    pub changes_per_route: Option<u64>,
    /// Preview: sources read without creating, consuming or acknowledging
    /// anything (a Postgres source reads its tables by `SELECT` and peeks
    /// at its slot instead of creating a slot and streaming from it).
    pub peek: bool,
    /// Where the run reports its figures (`/metrics`, `/statusz`, a
    /// notebook's progress).
    pub metrics: Metrics,
    /// This run continues an earlier attempt after a transient failure
    /// ([`crate::supervisor`]): the figures so far are kept.
    pub continues: bool,
}

/// What one route did during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteReport {
    pub name: String,
    pub commits: u64,
    pub rows: u64,
    pub deletes: u64,
    /// Microseconds the sink spent on its batches (preparing them, e.g.
    /// writing files, and committing them), summed: against the run's wall
    /// time, how busy the sink was. A batch is prepared while the one
    /// before commits, so the sum can exceed the wall time.
    pub commit_micros: u64,
    /// The position committed last (or found at start).
    pub position: Option<String>,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub routes: Vec<RouteReport>,
    /// The run ended on a stop request rather than by catching up.
    pub stopped: bool,
}

/// Why a run stopped without finishing. A `transient` error (a server or
/// the network briefly away) is retried by [`crate::supervisor`]; any
/// other ends the run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A commit failed or a sink rejected a batch: the route stopped there,
    /// its position unchanged.
    #[error("route {route}: {message}")]
    Commit {
        route: String,
        message: String,
        transient: bool,
    },
    #[error("route {route}: {message}")]
    Route {
        route: String,
        message: String,
        transient: bool,
    },
    #[error("source {source_name}: {message}")]
    Source {
        source_name: String,
        message: String,
        transient: bool,
    },
    /// Planning the pipeline again (before a retry) failed.
    #[error("reading the sources' schemas again: {message}")]
    Plan { message: String, transient: bool },
    /// Not a failure: a source table changed shape, and the pipeline must
    /// be planned again with the shape it grew to
    /// ([`crate::supervisor`] does, and goes on from the committed
    /// positions). Left alone, it ends the run with what changed.
    #[error("source {source_name}: {message}")]
    SchemaChanged {
        source_name: String,
        message: String,
        change: Arc<SchemaChange>,
        /// Always false: the change is followed at once, not retried.
        transient: bool,
    },
}

impl RunError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            RunError::Commit { transient, .. }
            | RunError::Route { transient, .. }
            | RunError::Source { transient, .. }
            | RunError::Plan { transient, .. }
            | RunError::SchemaChanged { transient, .. } => *transient,
        }
    }

    /// The part that failed, as `/statusz` and the retry log name it:
    /// `source <name>`, `route <table>` or `planner`.
    pub fn component(&self) -> String {
        match self {
            RunError::Commit { route, .. } | RunError::Route { route, .. } => {
                format!("route {route}")
            }
            RunError::Source { source_name, .. } | RunError::SchemaChanged { source_name, .. } => {
                format!("source {source_name}")
            }
            RunError::Plan { .. } => "planner".to_string(),
        }
    }

    /// What the failing part was doing, as `/statusz` says it:
    /// `opening` (a route's table and position), `committing`, `reading`
    /// (a source) or `planning`. A part that gets past it again is up.
    pub fn failed_while(&self) -> &'static str {
        match self {
            RunError::Commit { .. } => "committing",
            RunError::Route { .. } => "opening",
            RunError::Source { .. } | RunError::SchemaChanged { .. } => "reading",
            RunError::Plan { .. } => "planning",
        }
    }

    /// The message and the transient flag every variant has.
    fn message_and_flag(&mut self) -> (&mut String, &mut bool) {
        match self {
            RunError::Commit {
                message, transient, ..
            }
            | RunError::Route {
                message, transient, ..
            }
            | RunError::Source {
                message, transient, ..
            }
            | RunError::SchemaChanged {
                message, transient, ..
            }
            | RunError::Plan { message, transient } => (message, transient),
        }
    }

    /// The same failure, terminal, with `note` appended to its message
    /// (the retry budget it outlasted).
    pub fn terminal_with(mut self, note: &str) -> RunError {
        let (message, transient) = self.message_and_flag();
        message.push_str(note);
        *transient = false;
        self
    }

    /// The same failure with the message `text` (a later attempt's).
    pub fn with_message(mut self, text: String) -> RunError {
        *self.message_and_flag().0 = text;
        self
    }

    /// The source's error, for source `name`.
    fn source(name: &str, e: sources::SourceError) -> RunError {
        match e.schema_change {
            Some(change) => RunError::SchemaChanged {
                source_name: name.to_string(),
                message: e.message,
                change,
                transient: false,
            },
            None => RunError::Source {
                source_name: name.to_string(),
                message: e.message,
                transient: e.transient,
            },
        }
    }

    /// A terminal error of source `name`.
    fn source_terminal(name: &str, message: String) -> RunError {
        RunError::Source {
            source_name: name.to_string(),
            message,
            transient: false,
        }
    }
}

/// Runs a planned pipeline until it is caught up (with
/// `exit_when_caught_up`), stopped, or fails.
pub async fn run(
    plan: &PipelinePlan,
    options: RunOptions,
    shutdown: Shutdown,
) -> Result<RunReport, RunError> {
    let metrics = options.metrics.clone();
    if !options.continues {
        metrics.start_pipeline(&plan.name);
    }
    // Resume points, read from the sinks.
    let mut resume: Vec<Option<Position>> = Vec::with_capacity(plan.routes.len());
    let mut resume_snapshot: Vec<Option<SnapshotProgress>> = Vec::with_capacity(plan.routes.len());
    for route in &plan.routes {
        let source = plan.spec.source(&route.source).expect("planned");
        let kind = position_kind(&source.kind.name).ok_or_else(|| {
            RunError::source_terminal(
                &route.source,
                format!("source kind {} has no position kind", source.kind),
            )
        })?;
        let sink_err = |doing: String, e: urutau_planner::sink::SinkError| RunError::Route {
            route: route.name.clone(),
            message: format!("{doing}: {e}"),
            transient: e.is_transient(),
        };
        let err = |message: String| RunError::Route {
            route: route.name.clone(),
            message,
            transient: false,
        };
        route.sink.ensure_table(&route.target).await.map_err(|e| {
            sink_err(
                format!("preparing table {}", route.target.display_name()),
                e,
            )
        })?;
        let committed = route
            .sink
            .committed_position(&route.target)
            .await
            .map_err(|e| sink_err("reading the committed position".to_string(), e))?;
        let mark = committed.as_deref().map(CommitMark::parse);
        let parsed = match &mark {
            Some(CommitMark { position: text, .. }) => Some(kind.parse(text).map_err(|e| {
                err(format!(
                    "table {} holds position `{text}`, which source {} cannot resume from: {e}",
                    route.target.display_name(),
                    route.source
                ))
            })?),
            None => None,
        };
        tracing::info!(
            route = %route.name,
            position = %parsed.as_ref().map_or("(none: from the beginning)".to_string(), |p| p.to_string()),
            "resuming"
        );
        let snapshot = mark.and_then(|m| m.snapshot);
        let phase = match &snapshot {
            Some(s) if !s.is_complete() => "snapshot",
            _ => "stream",
        };
        metrics.table_started(&route.name, phase, parsed.as_ref().map(|p| p.to_string()));
        if let Some(version) = route.sink.schema_version(&route.target).await {
            metrics.target_schema(&route.name, version);
        }
        metrics.route_opened(&route.name);
        resume.push(parsed);
        resume_snapshot.push(snapshot);
    }

    let stop_reading = Arc::new(AtomicBool::new(false));
    let stopper = {
        let shutdown = shutdown.clone();
        let flag = Arc::clone(&stop_reading);
        tokio::spawn(async move {
            shutdown.wait().await;
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };

    // Committed positions (for acknowledgements) and which routes ended.
    let kinds: Vec<_> = plan
        .routes
        .iter()
        .map(|r| {
            position_kind(&plan.spec.source(&r.source).expect("planned").kind.name)
                .expect("checked")
        })
        .collect();
    let committed = Arc::new(Committed::new(resume.clone(), kinds));

    // One task per route drives its plan.
    let ctx = Arc::new(TaskContext::default());
    let mut route_tasks: JoinSet<(usize, Result<RouteReport, RunError>)> = JoinSet::new();
    let mut senders: Vec<Option<mpsc::Sender<RouteBatch>>> = Vec::new();
    for (i, route) in plan.routes.iter().enumerate() {
        senders.push(Some(route.feed.connect(2)));
        let physical = Arc::clone(&route.physical);
        let ctx = Arc::clone(&ctx);
        let name = route.name.clone();
        let committed = Arc::clone(&committed);
        let start = resume[i].as_ref().map(|p| p.to_string());
        let shutdown = shutdown.clone();
        let metrics = metrics.clone();
        route_tasks.spawn(async move {
            let result = drive_route(physical, ctx, name, i, start, &committed, &metrics).await;
            committed.route_ended(i);
            if result.is_err() {
                // A terminal error anywhere stops the whole run.
                shutdown.trigger();
            }
            (i, result)
        });
    }

    // One dispatcher per source.
    let mut source_result: Result<(), RunError> = Ok(());
    let mut dispatchers = JoinSet::new();
    for source in &plan.sources {
        let route_ids: Vec<usize> = source
            .tables
            .iter()
            .flat_map(|t| t.routes.iter().copied())
            .collect();
        let starts: Vec<Position> = route_ids
            .iter()
            .filter_map(|i| resume[*i].clone())
            .collect();
        let start = if starts.len() == route_ids.len() {
            min_safe(&starts).map_err(|e: PositionError| {
                RunError::source_terminal(&source.spec.name.name, e.to_string())
            })?
        } else {
            None
        };
        // A table's snapshot resumes only from progress all its routes
        // committed alike; otherwise it starts over (re-copying rows is
        // harmless: chunks are reconciled against the stream).
        let mut snapshots = HashMap::new();
        for t in &source.tables {
            let marks: Vec<&Option<SnapshotProgress>> =
                t.routes.iter().map(|i| &resume_snapshot[*i]).collect();
            if let Some(Some(first)) = marks.first()
                && marks.iter().all(|m| m.as_ref() == Some(first))
            {
                snapshots.insert(t.table.clone(), first.clone());
            } else if marks.iter().any(|m| m.is_some()) {
                tracing::warn!(table = %t.table.join("."), "the routes of this table committed different snapshot progress; its snapshot starts over");
            }
        }
        let opened = sources::open(OpenArgs {
            plan: source,
            start: start.clone(),
            snapshots,
            exit_when_caught_up: options.exit_when_caught_up,
            peek: options
                .peek
                .then(|| options.changes_per_route.unwrap_or(u64::MAX)),
            policy: BatchPolicy::from(plan.batch),
            stop: Arc::clone(&stop_reading),
            metrics: metrics.clone(),
        });
        let mut change_source = match opened {
            Ok(s) => s,
            Err(e) => {
                source_result = Err(RunError::source(&source.spec.name.name, e));
                shutdown.trigger();
                break;
            }
        };
        let mut outlets: Vec<Outlet> = Vec::new();
        for t in &source.tables {
            for &i in &t.routes {
                outlets.push(Outlet {
                    route: i,
                    name: plan.routes[i].name.clone(),
                    table: t.table.clone(),
                    sender: senders[i].take(),
                    resume: resume[i].clone(),
                    last_sent: Instant::now(),
                    last_end: resume[i].clone(),
                    snapshot: resume_snapshot[i].clone(),
                    sent_snapshot: resume_snapshot[i].clone(),
                    empty: RecordBatch::new_empty(Arc::clone(&t.scan_schema)),
                    left: options.changes_per_route,
                    stages: plan.routes[i]
                        .sink
                        .stages_transactions(&plan.routes[i].target),
                    staged: false,
                    held: Vec::new(),
                    snapshot_shown: false,
                });
            }
        }
        let progress_interval = plan.batch.progress_interval;
        let shutdown = shutdown.clone();
        let metrics = metrics.clone();
        let committed = Arc::clone(&committed);
        let name = source.spec.name.name.clone();
        let my_routes: Vec<usize> = outlets.iter().map(|o| o.route).collect();
        // Acknowledged as soon as every route has committed, not only when
        // the next batch comes (an idle stream would hold its last one).
        let acknowledger = change_source.acknowledger().map(|ack| {
            let committed = Arc::clone(&committed);
            let routes = my_routes.clone();
            tokio::spawn(async move { committed.acknowledge_each_change(&routes, ack).await })
        });
        dispatchers.spawn(async move {
            let mut acknowledged: Option<Position> = None;
            let mut source_end: Option<Position> = None;
            let result: Result<(), RunError> = async {
                loop {
                    let next = tokio::select! {
                        biased;
                        _ = shutdown.wait() => break,
                        next = change_source.next_batch() => next,
                    };
                    let batch = match next {
                        Ok(Some(b)) => b,
                        Ok(None) => {
                            // Caught up: bring every route's committed
                            // position to where the source ended.
                            if let Some(end) = &source_end {
                                finish_positions(&mut outlets, end).await;
                            }
                            break;
                        }
                        Err(e) => return Err(RunError::source(&name, e)),
                    };
                    source_end = Some(batch.end.clone());
                    let delivered = dispatch(&mut outlets, &batch, progress_interval, &metrics)
                        .await
                        .map_err(|message| RunError::source_terminal(&name, message))?;
                    if !delivered {
                        // A route stopped; its own error tells why.
                        break;
                    }
                    if outlets.iter().all(|o| o.left == Some(0)) {
                        // Every route had its share (preview).
                        break;
                    }
                    // Acknowledge what every route of this source committed.
                    if let Some(safe) = committed.safe(&my_routes)
                        && acknowledged
                            .as_ref()
                            .is_none_or(|a| safe.partial_cmp(a) == Some(Ordering::Greater))
                    {
                        change_source
                            .acknowledge(&safe)
                            .await
                            .map_err(|e| RunError::source(&name, e))?;
                        acknowledged = Some(safe);
                    }
                }
                Ok(())
            }
            .await;
            if result.is_err() {
                shutdown.trigger();
            }
            if let Some(task) = &acknowledger {
                task.abort();
            }
            // Dropping the senders ends the routes' scans: each route
            // finishes the commit in flight and stops.
            drop(outlets);
            // Then the last commits are acknowledged, so the source can
            // release what they cover (a slot's WAL) before the run ends.
            committed.wait_ended(&my_routes).await;
            if let Some(safe) = committed.safe(&my_routes)
                && acknowledged
                    .as_ref()
                    .is_none_or(|a| safe.partial_cmp(a) == Some(Ordering::Greater))
                && let Err(e) = change_source.acknowledge(&safe).await
            {
                tracing::warn!(source = %name, error = %e, "the final acknowledgement failed");
            }
            if let Err(e) = change_source.close().await {
                tracing::warn!(source = %name, error = %e, "closing the source");
            }
            result
        });
    }
    // Routes of sources that failed to open have no feed: close them.
    senders.clear();

    while let Some(joined) = dispatchers.join_next().await {
        match joined {
            Ok(Err(e)) if source_result.is_ok() => source_result = Err(e),
            Err(e) if source_result.is_ok() => {
                source_result = Err(RunError::source_terminal(
                    "?",
                    format!("the dispatcher failed: {e}"),
                ))
            }
            _ => {}
        }
    }
    let mut reports: Vec<Option<RouteReport>> = vec![None; plan.routes.len()];
    let mut route_error: Option<RunError> = None;
    while let Some(joined) = route_tasks.join_next().await {
        match joined {
            Ok((i, Ok(report))) => reports[i] = Some(report),
            Ok((_, Err(e))) => {
                if route_error.is_none() {
                    route_error = Some(e);
                }
            }
            Err(e) => {
                if route_error.is_none() {
                    route_error = Some(RunError::Route {
                        route: "?".into(),
                        message: format!("the route task failed: {e}"),
                        transient: false,
                    });
                }
            }
        }
    }
    stopper.abort();
    if let Some(e) = route_error {
        return Err(e);
    }
    source_result?;
    Ok(RunReport {
        routes: reports
            .into_iter()
            .zip(&plan.routes)
            .map(|(r, route)| {
                r.unwrap_or_else(|| RouteReport {
                    name: route.name.clone(),
                    ..Default::default()
                })
            })
            .collect(),
        stopped: shutdown.is_triggered(),
    })
}

/// What each route has committed, for acknowledgements, and which routes
/// have ended.
struct Committed {
    positions: std::sync::Mutex<Vec<Option<Position>>>,
    kinds: Vec<&'static dyn PositionKind>,
    ended: Vec<std::sync::atomic::AtomicBool>,
    changed: tokio::sync::Notify,
}

impl Committed {
    fn new(start: Vec<Option<Position>>, kinds: Vec<&'static dyn PositionKind>) -> Self {
        Committed {
            ended: start
                .iter()
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
            positions: std::sync::Mutex::new(start),
            kinds,
            changed: tokio::sync::Notify::new(),
        }
    }

    /// Route `i` committed `mark`.
    fn record(&self, i: usize, mark: &str) {
        if let Ok(p) = self.kinds[i].parse(&CommitMark::position_of(mark)) {
            self.positions.lock().expect("committed lock")[i] = Some(p);
            self.changed.notify_waiters();
        }
    }

    /// Hands `ack` the position every route in `routes` has committed each
    /// time a route commits, until they have all ended.
    async fn acknowledge_each_change(&self, routes: &[usize], ack: sources::Acknowledger) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(safe) = self.safe(routes) {
                ack(&safe);
            }
            if routes
                .iter()
                .all(|i| self.ended[*i].load(std::sync::atomic::Ordering::SeqCst))
            {
                return;
            }
            notified.await;
        }
    }

    /// Route `i` will commit nothing more.
    fn route_ended(&self, i: usize) {
        self.ended[i].store(true, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Waits until every route in `routes` has ended.
    async fn wait_ended(&self, routes: &[usize]) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if routes
                .iter()
                .all(|i| self.ended[*i].load(std::sync::atomic::Ordering::SeqCst))
            {
                return;
            }
            notified.await;
        }
    }

    /// The position every route in `routes` has committed (`None` while
    /// one has committed nothing, or when they cannot be folded).
    fn safe(&self, routes: &[usize]) -> Option<Position> {
        let c = self.positions.lock().expect("committed lock");
        let mine: Option<Vec<Position>> = routes.iter().map(|i| c[*i].clone()).collect();
        mine.and_then(|m| min_safe(&m).ok().flatten())
    }
}

/// Where one route's changes go.
struct Outlet {
    route: usize,
    /// The route's name (its target table), as metrics name it.
    name: String,
    table: Vec<String>,
    sender: Option<mpsc::Sender<RouteBatch>>,
    /// The route's sink already holds everything up to here.
    resume: Option<Position>,
    last_sent: Instant,
    last_end: Option<Position>,
    /// The table's snapshot progress as of the newest source batch, and as
    /// last sent to the route.
    snapshot: Option<SnapshotProgress>,
    sent_snapshot: Option<SnapshotProgress>,
    empty: RecordBatch,
    /// Changes the route may still receive ([`RunOptions::changes_per_route`]).
    left: Option<u64>,
    /// The route's sink stages parts of a transaction
    /// ([`urutau_planner::sink::Sink::stages_transactions`]).
    stages: bool,
    /// Parts of the open transaction sent to the sink to stage: the batch
    /// that closes it must reach the route even if empty.
    staged: bool,
    /// Parts of the open transaction held for a sink that cannot stage:
    /// sent with the batch that closes it, as one.
    held: Vec<RecordBatch>,
    /// The table's snapshot is shown running in the metrics (before its
    /// first commit: a sink may defer a snapshot's batches).
    snapshot_shown: bool,
}

impl Outlet {
    /// The mark a batch ending at `end` commits for this route.
    fn mark(&self, end: &Position) -> String {
        CommitMark {
            position: end.to_string(),
            snapshot: self.snapshot.clone(),
        }
        .to_string()
    }
}

/// Sends each route its share of `batch`. `Ok(false)` when a route is gone
/// (its own error says why); an error when positions cannot be compared.
async fn dispatch(
    outlets: &mut [Outlet],
    batch: &SourceBatch,
    progress_interval: std::time::Duration,
    metrics: &Metrics,
) -> Result<bool, String> {
    for o in outlets.iter_mut() {
        let Some(sender) = &o.sender else { continue };
        if !batch.open_transaction
            && let Some((_, progress)) = batch.snapshot.iter().find(|(t, _)| *t == o.table)
        {
            o.snapshot = Some(progress.clone());
            if !o.snapshot_shown && !progress.is_complete() {
                metrics.snapshot_running(&o.name, progress.state());
                o.snapshot_shown = true;
            }
        }
        // Changes the sink already holds are not sent again.
        let mut end = batch.end.clone();
        let mut still_behind = false;
        if let Some(r) = &o.resume {
            match batch.end.partial_cmp(r) {
                Some(Ordering::Less | Ordering::Equal) => continue,
                Some(Ordering::Greater) => {}
                None => match batch.end.join(r) {
                    // Positions that diverge (offsets: the source is behind
                    // the sink on one partition, ahead on another) but
                    // join: the rows the sink holds are dropped row by row
                    // below, and the route's mark keeps the sink's offsets
                    // where they are ahead.
                    Some(j) => {
                        end = j;
                        still_behind = true;
                    }
                    _ => {
                        // Sending could apply changes twice, skipping could
                        // lose them: neither is a guess to make.
                        return Err(format!(
                            "the source's position {} cannot be compared with the committed position {r}",
                            batch.end
                        ));
                    }
                },
            }
        }
        let rows = batch
            .tables
            .iter()
            .find(|t| t.table == o.table)
            .map(|t| &t.batch);
        let rows = match (rows, &o.resume) {
            (Some(b), Some(r)) => match skip_committed(b, r) {
                Ok(b) => Some(b),
                Err(e) => return Err(e.to_string()),
            },
            (Some(b), None) => Some(b.clone()),
            (None, _) => None,
        };
        let rows = match (rows, o.left.as_mut()) {
            (Some(b), Some(left)) => {
                let take = (b.num_rows() as u64).min(*left);
                *left -= take;
                Some(b.slice(0, take as usize))
            }
            (rows, None) => rows,
            (None, Some(_)) => None,
        };
        if !still_behind {
            o.resume = None;
        }
        if batch.open_transaction {
            // A part of a transaction that goes on: staged by a sink that
            // can, held here for one that cannot. No position moves (the
            // part's end is inside the transaction), so nothing else is
            // sent: an untouched route's progress waits for the end.
            if let Some(b) = rows.filter(|b| b.num_rows() > 0) {
                if o.stages {
                    let rb = RouteBatch {
                        batch: b,
                        end: end.to_string(),
                        open_transaction: true,
                        may_defer: false,
                    };
                    if sender.send(rb).await.is_err() {
                        return Ok(false);
                    }
                    o.staged = true;
                } else {
                    o.held.push(b);
                }
            }
            continue;
        }
        let rows = match (std::mem::take(&mut o.held), rows) {
            (held, rows) if held.is_empty() => rows,
            (held, rows) => {
                let parts: Vec<&RecordBatch> = held.iter().chain(rows.as_ref()).collect();
                Some(
                    arrow::compute::concat_batches(o.empty.schema_ref(), parts)
                        .map_err(|e| format!("joining the parts of a transaction: {e}"))?,
                )
            }
        };
        let send = match rows {
            Some(b) if b.num_rows() > 0 => Some(b),
            // The staged parts are committed by the transaction's end.
            _ if o.staged => Some(o.empty.clone()),
            // The snapshot progress moved: commit it promptly.
            _ if o.snapshot != o.sent_snapshot => Some(o.empty.clone()),
            // Untouched: advance the position now and then.
            _ if o.last_sent.elapsed() >= progress_interval => Some(o.empty.clone()),
            _ => None,
        };
        if let Some(b) = send {
            // While the table's snapshot runs, the sink may gather its
            // rows into larger commits; not when staged parts of a
            // transaction wait for this batch, which must commit them.
            let may_defer = !o.staged && o.snapshot.as_ref().is_some_and(|p| !p.is_complete());
            let rb = RouteBatch {
                batch: b,
                end: o.mark(&end),
                open_transaction: false,
                may_defer,
            };
            if sender.send(rb).await.is_err() {
                return Ok(false);
            }
            o.staged = false;
            o.sent_snapshot = o.snapshot.clone();
            o.last_sent = Instant::now();
            o.last_end = Some(end);
        }
    }
    Ok(true)
}

/// Sends an empty batch ending at `end` to every route whose position is
/// behind it, so a caught-up run leaves every table at the source's end.
async fn finish_positions(outlets: &mut [Outlet], end: &Position) {
    for o in outlets.iter_mut() {
        let Some(sender) = &o.sender else { continue };
        let target = match o.resume.as_ref().or(o.last_end.as_ref()) {
            None => Some(end.clone()),
            Some(held) => match end.partial_cmp(held) {
                Some(Ordering::Greater) => Some(end.clone()),
                Some(_) => None,
                // Diverging offsets: the route's offsets where they are
                // ahead, the source's elsewhere.
                None => end.join(held).filter(|j| j != held),
            },
        };
        if let Some(target) = target {
            let rb = RouteBatch {
                batch: o.empty.clone(),
                end: o.mark(&target),
                open_transaction: false,
                may_defer: false,
            };
            if sender.send(rb).await.is_ok() {
                o.last_end = Some(target);
            }
        }
    }
}

/// Drops the rows at or before `committed` (the first batch after a resume
/// may straddle a route's committed position).
fn skip_committed(batch: &RecordBatch, committed: &Position) -> Result<RecordBatch, PositionError> {
    let pos = batch
        .column_by_name(context::POS)
        .expect("change batches carry __pos")
        .as_string::<i32>();
    let mut keep = Vec::with_capacity(pos.len());
    let mut cache: HashMap<&str, bool> = HashMap::new();
    for i in 0..pos.len() {
        let text = pos.value(i);
        let k = match cache.get(text) {
            Some(k) => *k,
            None => {
                let p = committed.kind().parse(text)?;
                let k = p.partial_cmp(committed) != Some(Ordering::Less)
                    && p.partial_cmp(committed) != Some(Ordering::Equal);
                cache.insert(text, k);
                k
            }
        };
        keep.push(k);
    }
    let mask = BooleanArray::from(keep);
    if mask.true_count() == mask.len() {
        return Ok(batch.clone());
    }
    Ok(arrow::compute::filter_record_batch(batch, &mask).expect("mask has the batch's length"))
}

/// Executes a route's plan to its end, reporting each commit.
async fn drive_route(
    physical: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    ctx: Arc<TaskContext>,
    name: String,
    index: usize,
    start: Option<String>,
    committed: &Committed,
    metrics: &Metrics,
) -> Result<RouteReport, RunError> {
    let mut report = RouteReport {
        name: name.clone(),
        position: start,
        ..Default::default()
    };
    let mut stream = physical.execute(0, ctx).map_err(|e| RunError::Route {
        route: name.clone(),
        message: e.strip_backtrace(),
        transient: false,
    })?;
    while let Some(item) = stream.next().await {
        let stats = item.map_err(|e| {
            metrics.commit_failed(&name);
            commit_error(&name, e)
        })?;
        for row in 0..stats.num_rows() {
            let position = stats.column(1).as_string::<i32>().value(row).to_string();
            let figure = |c: usize| {
                stats
                    .column(c)
                    .as_primitive::<arrow::datatypes::UInt64Type>()
                    .value(row)
            };
            let (rows, deletes, micros) = (figure(2), figure(3), figure(4));
            report.commits += 1;
            report.rows += rows;
            report.deletes += deletes;
            report.commit_micros += micros;
            tracing::debug!(route = %name, position = %position, "committed");
            metrics.committed(&name, &position, rows, deletes, micros as f64 / 1e6);
            committed.record(index, &position);
            report.position = Some(position);
        }
    }
    Ok(report)
}

fn commit_error(route: &str, e: datafusion::error::DataFusionError) -> RunError {
    if let datafusion::error::DataFusionError::External(inner) = e.find_root()
        && let Some(c) = inner.downcast_ref::<SinkCommitError>()
    {
        return RunError::Commit {
            route: route.to_string(),
            message: c.to_string(),
            transient: c.cause.is_transient(),
        };
    }
    RunError::Route {
        route: route.to_string(),
        message: e.strip_backtrace(),
        transient: false,
    }
}
