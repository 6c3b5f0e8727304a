//! Transactions larger than a batch, staged in a side table and attached
//! to the real one at once.
//!
//! Each part of an open transaction is one insert (its own `seq`, so a
//! later part's change of a key supersedes an earlier one's) into
//! `<table>_urutau_staging`, a table created `AS` the real one (same
//! columns, engine and ORDER BY), which no reader and no resume looks at.
//! The commit that closes the transaction inserts its own rows there too,
//! then `ALTER TABLE <table> ATTACH PARTITION tuple() FROM <staging>` moves
//! every part into the real table in one step: ClickHouse makes that
//! atomic for the single partition of an unpartitioned table, so readers
//! see all of the transaction or none of it, and the position rides in
//! the attached rows as in every commit. Memory stays bounded by the
//! batch size, whatever the size of the transaction.
//!
//! Only unpartitioned tables written by one worker stage (see
//! [`stages`]); others receive such a transaction whole. A staging table
//! left by a crash is dropped when the table is next prepared: nothing in
//! it was visible, and the source sends the transaction again.

use urutau_planner::sink::{SinkBatch, SinkError};
use urutau_planner::target::TargetTable;

use super::ddl::{self, ident};
use super::{TableState, as_u64, execute, insert, query_rows};

/// The staging table of `table`.
pub fn name(table: &str) -> String {
    format!("{table}_urutau_staging")
}

/// Whether `target` stages the parts of a large transaction: one writer
/// (owners of a partitioned table commit separately) and no
/// `partition_by` (ATTACH is atomic per partition only).
pub fn stages(target: &TargetTable) -> bool {
    target.workers <= 1 && target.partition_by.is_empty()
}

/// What the current transaction has staged.
#[derive(Debug, Clone, Copy)]
pub struct Staged {
    /// The `seq` of the first staged part: attached rows are those at or
    /// above it.
    pub first_seq: u64,
}

/// Drops a staging table left by a crash or a failed commit.
pub async fn discard(s: &TableState) -> Result<(), SinkError> {
    execute(
        &s.client,
        &format!(
            "DROP TABLE IF EXISTS {}.{}",
            ident(&s.database),
            ident(&name(&s.table))
        ),
    )
    .await
}

/// Inserts one part of an open transaction into the staging table
/// (created by the transaction's first part).
pub async fn stage_part(s: &mut TableState, batch: &SinkBatch) -> Result<(), SinkError> {
    if batch.rows.num_rows() == 0 {
        return Ok(());
    }
    if s.staged.is_none() {
        discard(s).await?;
        execute(
            &s.client,
            &format!(
                "CREATE TABLE {db}.{staging} AS {db}.{table}",
                db = ident(&s.database),
                staging = ident(&name(&s.table)),
                table = ident(&s.table)
            ),
        )
        .await?;
        s.staged = Some(Staged {
            first_seq: s.next_seq,
        });
    }
    // The position before the transaction: no resume reads staged rows,
    // and once attached the closing commit's rows (a higher `seq`) carry
    // the transaction's own.
    let before = s
        .progress
        .clone()
        .or_else(|| s.committed.clone())
        .unwrap_or_default();
    insert_into_staging(s, batch, &before).await
}

/// Closes a staged transaction: inserts `batch` (its last rows) into the
/// staging table, attaches everything to the table at once, and drops the
/// staging table.
pub async fn commit(
    s: &mut TableState,
    staged: Staged,
    batch: &SinkBatch,
    position: &str,
) -> Result<(), SinkError> {
    if batch.rows.num_rows() > 0 {
        insert_into_staging(s, batch, position).await?;
    }
    let full = format!("{}.{}", ident(&s.database), ident(&s.table));
    let attach = format!(
        "ALTER TABLE {full} ATTACH PARTITION tuple() FROM {}.{}",
        ident(&s.database),
        ident(&name(&s.table))
    );
    if let Err(e) = execute(&s.client, &attach).await {
        // A lost response: the staged rows are the only ones at or above
        // `first_seq`, and merges keep the highest `seq` of a key, so any
        // such row in the table means the attach happened.
        let found = query_rows(
            &s.client,
            &format!(
                "SELECT count() AS n FROM {full} WHERE {} >= {}",
                ident(ddl::SEQ),
                staged.first_seq
            ),
        )
        .await;
        match found {
            Ok(r) if as_u64(r.first().and_then(|r| r.get("n"))) > 0 => {
                tracing::warn!(table = %format!("{}.{}", s.database, s.table), error = %e,
                    "attaching the staged transaction reported a failure but it landed; not repeating it");
            }
            _ => return Err(e),
        }
    }
    discard(s).await?;
    s.staged = None;
    s.committed = Some(position.to_string());
    s.progress = None;
    Ok(())
}

/// One insert into the staging table, with the next `seq`.
async fn insert_into_staging(
    s: &mut TableState,
    batch: &SinkBatch,
    position: &str,
) -> Result<(), SinkError> {
    let seq = s.next_seq;
    let rows = insert::with_reserved(&batch.rows, &batch.deletes, position, seq)?;
    insert::insert_once(&s.client, &s.database, &name(&s.table), &rows, seq).await?;
    s.next_seq = seq + 1;
    Ok(())
}
