//! The maintenance turn: after each of a table's commits, under the same
//! per-table lock, the maintenance that is due runs in the spec's order —
//! compaction, snapshot expiry, orphan cleanup ([`super::compaction`],
//! [`super::expiry`], [`super::orphans`]; settings in [`super::maintenance`]). A pass that fails or meets another writer's
//! commit is logged and left to its next turn: maintenance never stops the
//! replication.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iceberg::spec::TableMetadataBuildResult;
use urutau_planner::sink::SinkError;

use super::catalog::Outcome;
use super::{IcebergSink, TableState, compaction, durable, expiry, orphans};

/// Whether a pass last run at `last` is due again after `interval`; if so
/// the turn is taken (a failing pass waits for its next turn too).
fn take_turn(last: &mut Option<Instant>, interval: Duration) -> bool {
    if last.is_some_and(|t| t.elapsed() < interval) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

impl IcebergSink {
    /// Table maintenance that is due, after one of the table's commits.
    pub(super) async fn maintain(&self, state: &mut TableState) {
        self.compact_when_due(state).await;
        self.expire_snapshots_when_due(state).await;
        self.clean_orphans_when_due(state).await;
    }

    /// Commits the metadata a `what` pass built (`added`: the data files it
    /// wrote); true when it landed. Otherwise says why and reloads the
    /// table: the pass may have landed though its answer was lost, and the
    /// next commit must start from what the catalog holds.
    async fn commit_pass(
        &self,
        state: &mut TableState,
        what: &str,
        built: Result<TableMetadataBuildResult, SinkError>,
        added: &[String],
    ) -> bool {
        let outcome = match built {
            Ok(result) => match self.conn().await {
                Ok(conn) => conn.commit(&state.table, result, added).await,
                Err(e) => Outcome::Unknown(e),
            },
            Err(e) => Outcome::Unknown(e),
        };
        match outcome {
            Outcome::Committed(t) => {
                state.table = t;
                return true;
            }
            Outcome::Conflict => {
                tracing::info!(table = %state.ident, "{what}: another writer committed first; next turn")
            }
            Outcome::Unknown(e) => {
                tracing::warn!(table = %state.ident, error = %e, "{what} failed; next turn")
            }
        }
        if let Ok(t) = self.reload(&state.ident).await {
            // The reload may show another writer's commits: their keys
            // join the ranges before a batch writes one as new.
            self.take_in_other_writers_or_anywhere(state, &t).await;
            state.table = t;
        }
        false
    }

    /// Compaction, when configured, due, and the table has enough
    /// candidate files.
    async fn compact_when_due(&self, state: &mut TableState) {
        let Some(policy) = &self.maintenance.compaction else {
            return;
        };
        if !take_turn(&mut state.last_compaction, policy.interval)
            || !compaction::may_compact(&state.table, policy.min_input_files)
        {
            return;
        }
        let live = match compaction::live_files(&state.table).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(table = %state.ident, error = %e, "compaction failed; next turn");
                return;
            }
        };
        let key_ids: Vec<i32> = state
            .table
            .metadata()
            .current_schema()
            .identifier_field_ids()
            .collect();
        // Format 3 tables take deletion vectors, not position-delete files.
        let position_deletes =
            state.table.metadata().format_version() < iceberg::spec::FormatVersion::V3;
        let Some(plan) = compaction::plan(
            &live.files,
            policy.target_file_size,
            policy.min_input_files,
            &key_ids,
            position_deletes,
        ) else {
            return;
        };
        let built = compaction::build_compaction(
            &state.table,
            &plan,
            &live.manifests,
            policy.target_file_size,
        )
        .await;
        let (built, added) = match built {
            Ok((result, files)) => (
                Ok(result),
                files.iter().map(|f| f.file_path().to_string()).collect(),
            ),
            Err(e) => (Err(e), vec![]),
        };
        if built.is_ok() {
            super::pause_point("compaction");
        }
        if self.commit_pass(state, "compaction", built, &added).await {
            tracing::info!(
                table = %state.ident,
                groups = plan.groups,
                rewritten = plan.with(compaction::Role::Rewrite).count(),
                converted = plan.with(compaction::Role::Convert).count(),
                deletes_dropped = plan.with(compaction::Role::Drop).count(),
                written = added.len(),
                "compaction: rewrote small files"
            );
        }
    }

    /// Snapshot expiry, when configured and due.
    async fn expire_snapshots_when_due(&self, state: &mut TableState) {
        let Some(policy) = &self.maintenance.expiry else {
            return;
        };
        if !take_turn(&mut state.last_expiry, policy.interval) {
            return;
        }
        let now_ms = chrono::Utc::now().timestamp_millis();
        let ids = match expiry::expired_snapshots(state.table.metadata(), policy, now_ms) {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(table = %state.ident, error = %e, "snapshot expiry failed; next turn");
                return;
            }
        };
        if ids.is_empty() {
            return;
        }
        let lists = expiry::manifest_lists(state.table.metadata(), &ids);
        let built = expiry::build_expiry(&state.table, &ids);
        if !self.commit_pass(state, "snapshot expiry", built, &[]).await {
            return;
        }
        super::pause_point("expiry");
        let io = state.table.file_io().clone();
        let mut deleted = 0;
        for list in &lists {
            match io.delete(list).await {
                Ok(()) => deleted += 1,
                Err(e) => {
                    tracing::warn!(table = %state.ident, file = %list, error = %e, "snapshot expiry: cannot delete a manifest list")
                }
            }
        }
        tracing::info!(table = %state.ident, snapshots = ids.len(), manifest_lists = deleted, "snapshot expiry: expired snapshots");
    }

    /// Orphan cleanup, when configured and due.
    async fn clean_orphans_when_due(&self, state: &mut TableState) {
        let Some(policy) = &self.maintenance.orphans else {
            return;
        };
        if !take_turn(&mut state.last_orphan_cleanup, policy.interval) {
            return;
        }
        let Some(table_dir) = durable::local_path(state.table.metadata().location()) else {
            tracing::warn!(table = %state.ident, "orphan cleanup: the table is not on a local warehouse; skipped");
            return;
        };
        // No batch's files are being written meanwhile; those written and
        // not committed yet are pending, and kept.
        let writing = Arc::clone(&state.writing);
        let _alone = writing.files_gate.write().await;
        let pending = writing.pending().clone();
        let referenced = match orphans::referenced_files(&state.table).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(table = %state.ident, error = %e, "orphan cleanup failed; next turn");
                return;
            }
        };
        let cutoff = std::time::SystemTime::now()
            .checked_sub(policy.older_than)
            .unwrap_or(std::time::UNIX_EPOCH);
        let ident = state.ident.clone();
        let uuid = state.table.metadata().uuid().to_string();
        let done = tokio::task::spawn_blocking(move || {
            let orphans = orphans::orphan_files(&table_dir, &uuid, &referenced, cutoff)?;
            let mut removed = 0;
            for f in orphans.iter().filter(|f| !pending.contains(*f)) {
                match std::fs::remove_file(f) {
                    Ok(()) => {
                        removed += 1;
                        super::pause_point("orphans");
                    }
                    Err(e) => {
                        tracing::warn!(table = %ident, file = %f.display(), error = %e, "orphan cleanup: cannot remove a file")
                    }
                }
            }
            Ok::<_, SinkError>(removed)
        })
        .await
        .map_err(|e| SinkError::Io(e.to_string()))
        .and_then(|r| r);
        match done {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(table = %state.ident, files = removed, "orphan cleanup: removed unreferenced files")
            }
            Err(e) => {
                tracing::warn!(table = %state.ident, error = %e, "orphan cleanup failed; next turn")
            }
        }
    }
}
