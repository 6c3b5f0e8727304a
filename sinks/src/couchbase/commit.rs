//! The two commit modes.
//!
//! **fast**: the batch's documents (bounded concurrency, every write at the
//! configured durability), then the control document. A crash between the
//! two leaves the position behind; the restart replays the batch, and the
//! replay is idempotent: every document is keyed (by key, coordinate, or
//! position and index) and a removal of a document already gone succeeds.
//!
//! **atomic**: a journal, with the control document as the commit record.
//! 1. Stage: the batch's new bodies (and removals) are written into journal
//!    documents `_urutau::journal::<owner>::<batch>::<chunk>` — never into
//!    the data documents, so an uncommitted batch leaves no trace a reader
//!    or a restart could take for data.
//! 2. Commit: one CAS-guarded write of the control document sets the
//!    position, the batch number and `pending` (the journal's batch and
//!    chunk count). This write is the commit point.
//! 3. Apply: the documents are written as in fast mode.
//! 4. The previous batch's journal is removed (it is superseded).
//!
//! A restart ([`recover`]) applies the journal `pending` names again
//! (idempotent, so it does not matter how far step 3 got) and removes what
//! a crash left of other batches' journals, before the position is read.
//! So after recovery the control document never names a position whose
//! data is not all in place, and a batch that never reached step 2 has
//! changed nothing. Plain readers see the old bodies until step 3 reaches
//! their document, as with Couchbase's own transactions for
//! non-transactional reads. This is the sink's own protocol on KV
//! operations (the Rust SDK 1.1 has no transactions); it does not
//! interoperate with SDK transactions.
//!
//! Why a journal rather than staging in each document's extended
//! attributes: staging a new document in an xattr creates the document
//! (an empty body plain readers would see) — the SDK 1.1 cannot create it
//! as a tombstone — and a restart would have to find every staged document
//! without a query service. The journal touches no data document before
//! the commit point, costs one write per chunk rather than one per
//! document, and is found from the control document alone.
//!
//! The CAS on the control document serializes every writer of the table:
//! a partitioned table's owners (workers > 1) each keep their own mark
//! under `owners` and rewrite only it, re-reading on a CAS mismatch, so no
//! owner loses another's position. The owners of a batch commit side by
//! side.

use std::hash::BuildHasher;

use couchbase::collection::Collection;
use couchbase::error::ErrorKind;
use couchbase::options::kv_options::{InsertOptions, RemoveOptions, ReplaceOptions, UpsertOptions};
use futures::{StreamExt, TryStreamExt, stream};
use serde::Deserialize;
use serde_json::value::RawValue;
use urutau_planner::sink::{SinkBatch, SinkError};
use urutau_planner::spec::WriteMode;
use urutau_planner::target::{ColumnOrigin, TargetTable};

use super::control::{CONTROL_KEY, Control, Pending};
use super::document::{self, Column};
use super::{CommitMode, Config, TableState};

/// Couchbase's longest document key, in bytes.
const MAX_KEY_BYTES: usize = 250;
/// Couchbase's largest document, in bytes.
const MAX_DOCUMENT_BYTES: usize = 20 << 20;
/// A journal chunk holds at most this many documents ...
const CHUNK_DOCS: usize = 1000;
/// ... and at most about this many bytes of bodies.
const CHUNK_BYTES: usize = 4 << 20;

/// A step of the atomic protocol at which a test stops a commit, leaving
/// the cluster as a crash there would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// After some of the journal's chunks are written, before the commit
    /// record.
    AfterStaging,
    /// After the commit record, before any document is applied.
    AfterCommitRecord,
    /// After about half of the documents are applied.
    MidApply,
}

/// What a run has staged of an open transaction (a transaction larger than
/// a batch, handed over in parts): in memory only, since a crash discards
/// the parts (recovery removes the uncommitted journal; fast mode's
/// documents are written again by the replay).
#[derive(Debug, Default, Clone)]
pub struct Staged {
    /// Rows of the transaction's earlier parts: an append route's document
    /// keys count on from them, so they do not depend on where the parts
    /// were cut.
    pub rows: usize,
    /// Journal chunks staged for the next batch (atomic mode).
    pub chunks: u32,
    /// Documents in them.
    pub documents: u64,
}

/// One document write: a body to put under `key`, or its removal.
#[derive(Debug, Clone)]
pub struct Doc {
    pub key: String,
    pub body: Option<Vec<u8>>,
}

/// The batch's documents, in the batch's order.
pub fn documents(
    target: &TargetTable,
    batch: &SinkBatch,
    state: &TableState,
) -> Result<Vec<Doc>, SinkError> {
    let rows = batch.rows.num_rows();
    if rows == 0 {
        return Ok(Vec::new());
    }
    let columns: Vec<Column<'_>> = target
        .columns
        .iter()
        .zip(batch.rows.columns())
        .map(|(c, array)| Column {
            name: &c.name,
            array,
            ty: &c.ty,
        })
        .collect();
    let pick = |names: &[&str]| -> Vec<Column<'_>> {
        names
            .iter()
            .filter_map(|n| columns.iter().find(|c| c.name == *n))
            .map(|c| Column { ..*c })
            .collect()
    };
    let keys = match target.mode {
        WriteMode::Upsert | WriteMode::AppendIdempotent => {
            let by = pick(&target.order_columns());
            document::key_texts(&by, rows).map_err(|e| {
                SinkError::Rejected(format!(
                    "table {}: row {} of the batch: key column {}: {}",
                    state.name, e.row, e.column, e.cause
                ))
            })?
        }
        WriteMode::Append => {
            // The position this batch follows, and the change's index
            // (counting on over the parts of a transaction).
            let after =
                append_key_prefix(&state.control.resume(target.workers).unwrap_or_default());
            let first = state.staged.rows;
            (first..first + rows)
                .map(|i| format!("[{after},{i}]"))
                .collect()
        }
    };
    if let Some(k) = keys.iter().find(|k| k.len() > MAX_KEY_BYTES) {
        return Err(SinkError::Rejected(format!(
            "table {}: document key {k} is {} bytes; Couchbase keys are at most {MAX_KEY_BYTES}",
            state.name,
            k.len()
        )));
    }
    let (data, metadata): (Vec<_>, Vec<_>) = target
        .columns
        .iter()
        .zip(columns.iter())
        .partition(|(t, _)| t.origin == ColumnOrigin::Data);
    let data: Vec<Column<'_>> = data.into_iter().map(|(_, c)| Column { ..*c }).collect();
    let metadata: Vec<Column<'_>> = metadata.into_iter().map(|(_, c)| Column { ..*c }).collect();
    let removes = target.mode == WriteMode::Upsert;
    let bodies = document::bodies(&data, &metadata, rows, |r| {
        !(removes && batch.deletes.value(r))
    })
    .map_err(|e| {
        SinkError::Rejected(format!(
            "table {}: document {}: column {}: {}",
            state.name, keys[e.row], e.column, e.cause
        ))
    })?;
    if let Some((k, b)) = keys.iter().zip(&bodies).find_map(|(k, b)| {
        b.as_ref()
            .filter(|b| b.len() > MAX_DOCUMENT_BYTES)
            .map(|b| (k, b))
    }) {
        return Err(SinkError::Rejected(format!(
            "table {}: document {k} is {} bytes; Couchbase documents are at most {MAX_DOCUMENT_BYTES}",
            state.name,
            b.len()
        )));
    }
    Ok(keys
        .into_iter()
        .zip(bodies)
        .map(|(key, body)| Doc { key, body })
        .collect())
}

/// The first element of an append route's document keys: the position
/// the batch follows as a JSON string, or — when that would make keys
/// longer than Couchbase allows (many Kafka partitions, a snapshot's key)
/// — `"h:"` and its name-based UUID (SHA-1), which is as deterministic.
fn append_key_prefix(mark: &str) -> String {
    let text = serde_json::to_string(mark).expect("a string serializes");
    if text.len() + 24 <= MAX_KEY_BYTES {
        return text;
    }
    let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, mark.as_bytes());
    format!("\"h:{}\"", id.simple())
}

/// Reads the control document (and its CAS); a table that has none has
/// committed nothing. Also the probe that the collection takes requests.
pub async fn read_control(
    config: &Config,
    coll: &Collection,
    table: &str,
) -> Result<(Control, Option<u64>), SinkError> {
    let got = config
        .calls
        .run("read the control document", table, || async {
            match coll.get(CONTROL_KEY, None).await {
                Ok(r) => Ok(Some((r.content_as_raw().0.to_vec(), r.cas()))),
                Err(e) if *e.kind() == ErrorKind::DocumentNotFound => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
    match got {
        None => Ok((Control::default(), None)),
        Some((body, cas)) => serde_json::from_slice(&body)
            .map(|c| (c, Some(cas)))
            .map_err(|e| {
                SinkError::Io(format!(
                    "couchbase: table {table}: the control document {CONTROL_KEY} is not urutau's ({e}); remove it or use another collection"
                ))
            }),
    }
}

/// Writes (or removes) every document, `concurrency` at a time.
async fn write_all(
    config: &Config,
    coll: &Collection,
    table: &str,
    docs: &[Doc],
) -> Result<(), SinkError> {
    // Collected first: a stream over a borrowing closure is not Send.
    let writes: Vec<_> = docs
        .iter()
        .map(|d| write_one(config, coll, table, d))
        .collect();
    stream::iter(writes)
        .buffer_unordered(config.concurrency)
        .try_collect::<()>()
        .await
}

async fn write_one(
    config: &Config,
    coll: &Collection,
    table: &str,
    doc: &Doc,
) -> Result<(), SinkError> {
    match &doc.body {
        Some(body) => config
            .calls
            .run("upsert", table, || {
                coll.upsert_raw(
                    &doc.key,
                    body,
                    JSON_FLAGS,
                    UpsertOptions::new().durability_level(config.durability.clone()),
                )
            })
            .await
            .map(drop),
        None => {
            config
                .calls
                .run("remove", table, || async {
                    match coll
                        .remove(
                            &doc.key,
                            RemoveOptions::new().durability_level(config.durability.clone()),
                        )
                        .await
                    {
                        // A replay removes what is already gone.
                        Err(e) if *e.kind() == ErrorKind::DocumentNotFound => Ok(()),
                        r => r.map(drop),
                    }
                })
                .await
        }
    }
    .map_err(|e| with_key(e, &doc.key))
}

fn with_key(e: SinkError, key: &str) -> SinkError {
    match e {
        SinkError::Io(m) => SinkError::Io(format!("{m} (document {key})")),
        other => other,
    }
}

/// The common flags of a JSON document.
const JSON_FLAGS: u32 = 0x0200_0000;

/// fast: the documents, then the control document.
pub async fn fast(
    config: &Config,
    s: &mut TableState,
    docs: Vec<Doc>,
    position: &str,
) -> Result<(), SinkError> {
    write_all(config, &s.collection, &s.name, &docs).await?;
    let before = s.control.mark.text();
    s.control.mark.set(position);
    if docs.is_empty() && s.control.mark.text() == before {
        return Ok(());
    }
    let body = s.control.to_json();
    let r = config
        .calls
        .run("write the control document", &s.name, || {
            s.collection.upsert_raw(
                CONTROL_KEY,
                &body,
                JSON_FLAGS,
                UpsertOptions::new().durability_level(config.durability.clone()),
            )
        })
        .await?;
    s.cas = Some(r.cas());
    Ok(())
}

/// fast, a part of an open transaction: its documents only (the control
/// document moves with the transaction's last batch).
pub async fn fast_part(config: &Config, s: &TableState, docs: &[Doc]) -> Result<(), SinkError> {
    write_all(config, &s.collection, &s.name, docs).await
}

/// atomic, a part of an open transaction: its documents go into the next
/// batch's journal, after the chunks staged before it. The batch that
/// closes the transaction adds its own chunks and commits them all.
pub async fn stage_part(
    config: &Config,
    s: &mut TableState,
    docs: &[Doc],
) -> Result<(), SinkError> {
    let batch = s.control.mark.batch + 1;
    for body in journal_chunks(docs) {
        let key = journal_key(None, batch, s.staged.chunks);
        stage_chunk(config, &s.collection, &s.name, &key, &body).await?;
        s.staged.chunks += 1;
    }
    s.staged.documents += docs.len() as u64;
    Ok(())
}

/// Writes one journal chunk.
async fn stage_chunk(
    config: &Config,
    coll: &Collection,
    table: &str,
    key: &str,
    body: &[u8],
) -> Result<(), SinkError> {
    config
        .calls
        .run("stage a journal chunk", table, || {
            coll.upsert_raw(
                key,
                body,
                JSON_FLAGS,
                UpsertOptions::new().durability_level(config.durability.clone()),
            )
        })
        .await
        .map(drop)
}

/// The owner of a key in a partitioned table.
fn owner_of(key: &str, workers: u32) -> u32 {
    let h = foldhash::fast::FixedState::with_seed(0x75727574).hash_one(key);
    (h % workers as u64) as u32
}

fn journal_key(owner: Option<u32>, batch: u64, chunk: u32) -> String {
    let o = owner.map_or_else(|| "t".to_string(), |o| o.to_string());
    format!("_urutau::journal::{o}::{batch}::{chunk}")
}

/// atomic: stage, commit record, apply, drop the superseded journal; the
/// owners of a partitioned table side by side.
pub async fn atomic(
    config: &Config,
    s: &mut TableState,
    target: &TargetTable,
    docs: Vec<Doc>,
    position: &str,
    mut fault: Option<FaultPoint>,
) -> Result<(), SinkError> {
    if docs.is_empty() {
        let mut probe = s.control.clone();
        let owners: Vec<Option<u32>> = match target.workers {
            0 | 1 => vec![None],
            n => (0..n).map(Some).collect(),
        };
        let unchanged = owners.iter().all(|o| {
            let m = probe.owner_mut(*o);
            let before = m.text();
            m.set(position);
            m.text() == before
        });
        if unchanged {
            return Ok(());
        }
    }
    if target.workers <= 1 {
        let batch = s.control.mark.batch + 1;
        let staged = std::mem::take(&mut s.staged);
        let (control, cas) = commit_owner(
            config,
            &s.collection,
            &s.name,
            None,
            batch,
            docs,
            position,
            fault,
            (s.control.clone(), s.cas),
            &staged,
        )
        .await?;
        s.control = control;
        s.cas = Some(cas);
        return Ok(());
    }
    let batch = s
        .control
        .owners
        .values()
        .map(|m| m.batch)
        .max()
        .unwrap_or(0)
        + 1;
    let mut parts: Vec<Vec<Doc>> = (0..target.workers).map(|_| Vec::new()).collect();
    for d in docs {
        parts[owner_of(&d.key, target.workers) as usize].push(d);
    }
    let known = (s.control.clone(), s.cas);
    let nothing_staged = Staged::default();
    let commits = parts.into_iter().enumerate().map(|(o, part)| {
        commit_owner(
            config,
            &s.collection,
            &s.name,
            Some(o as u32),
            batch,
            part,
            position,
            fault.take(),
            known.clone(),
            &nothing_staged,
        )
    });
    let results = futures::future::join_all(commits).await;
    // The newest control document any owner saw last.
    let mut newest: Option<(Control, u64)> = None;
    for r in results {
        let (c, cas) = r?;
        let seen = c.owners.values().map(|m| m.batch).sum::<u64>();
        if newest
            .as_ref()
            .is_none_or(|(n, _)| n.owners.values().map(|m| m.batch).sum::<u64>() <= seen)
        {
            newest = Some((c, cas));
        }
    }
    if let Some((c, cas)) = newest {
        s.control = c;
        s.cas = Some(cas);
    }
    Ok(())
}

/// One owner's (or an unpartitioned table's) atomic commit. Returns the
/// control document as written, with its CAS.
#[allow(clippy::too_many_arguments)]
async fn commit_owner(
    config: &Config,
    coll: &Collection,
    table: &str,
    owner: Option<u32>,
    batch: u64,
    docs: Vec<Doc>,
    position: &str,
    fault: Option<FaultPoint>,
    known: (Control, Option<u64>),
    earlier: &Staged,
) -> Result<(Control, u64), SinkError> {
    let injected = |p: FaultPoint| SinkError::Io(format!("injected fault {p:?} (a test)"));
    // 1. Stage (after the chunks of the transaction's earlier parts).
    let chunks = journal_chunks(&docs);
    let staged = if fault == Some(FaultPoint::AfterStaging) {
        chunks.len().div_ceil(2).max(1).min(chunks.len())
    } else {
        chunks.len()
    };
    // In chunk order, one at a time: what a crash leaves of a journal is
    // always a prefix 0..k, so a probe from chunk 0 finds all of it.
    for (c, body) in chunks[..staged].iter().enumerate() {
        let key = journal_key(owner, batch, earlier.chunks + c as u32);
        stage_chunk(config, coll, table, &key, body).await?;
    }
    if fault == Some(FaultPoint::AfterStaging) {
        return Err(injected(FaultPoint::AfterStaging));
    }
    // 2. The commit record.
    let mut superseded = None;
    let (control, cas) = update_control(config, coll, table, known, |c| {
        let m = c.owner_mut(owner);
        if m.batch != batch {
            superseded = m.pending.clone();
        }
        m.set(position);
        m.batch = batch;
        m.pending = Some(Pending {
            batch,
            chunks: earlier.chunks + chunks.len() as u32,
            documents: earlier.documents + docs.len() as u64,
        });
    })
    .await?;
    if fault == Some(FaultPoint::AfterCommitRecord) {
        return Err(injected(FaultPoint::AfterCommitRecord));
    }
    // 3. Apply.
    if fault == Some(FaultPoint::MidApply) {
        write_all(config, coll, table, &docs[..docs.len() / 2]).await?;
        return Err(injected(FaultPoint::MidApply));
    }
    // The earlier parts' documents are read back from the journal, a
    // chunk at a time and in order (a later part's document of a key
    // supersedes an earlier one's).
    for c in 0..earlier.chunks {
        let key = journal_key(owner, batch, c);
        let docs = read_chunk(config, coll, table, &key, batch).await?;
        write_all(config, coll, table, &docs).await?;
    }
    write_all(config, coll, table, &docs).await?;
    // 4. The superseded journal.
    if let Some(p) = superseded {
        remove_journal(config, coll, table, owner, p.batch, Some(p.chunks)).await?;
    }
    Ok((control, cas))
}

/// The journal's chunk bodies: `{"entries": [[key, body|null], ...]}`, each
/// at most [`CHUNK_BYTES`] unless one document alone is larger (documents
/// are at most [`MAX_DOCUMENT_BYTES`]).
fn journal_chunks(docs: &[Doc]) -> Vec<Vec<u8>> {
    let mut chunks = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    let mut n = 0;
    let close = |cur: &mut Vec<u8>, chunks: &mut Vec<Vec<u8>>| {
        cur.extend_from_slice(b"]}");
        chunks.push(std::mem::take(cur));
    };
    for d in docs {
        let size = d.key.len() + d.body.as_ref().map_or(4, Vec::len) + 8;
        if n == CHUNK_DOCS || (n > 0 && cur.len() + size > CHUNK_BYTES) {
            close(&mut cur, &mut chunks);
            n = 0;
        }
        if n == 0 {
            cur.extend_from_slice(b"{\"entries\":[");
        } else {
            cur.push(b',');
        }
        cur.push(b'[');
        serde_json::to_writer(&mut cur, &d.key).expect("a string serializes");
        cur.push(b',');
        match &d.body {
            Some(b) => cur.extend_from_slice(b),
            None => cur.extend_from_slice(b"null"),
        }
        cur.push(b']');
        n += 1;
    }
    if n > 0 {
        close(&mut cur, &mut chunks);
    }
    chunks
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow)]
    entries: Vec<(String, Option<&'a RawValue>)>,
}

/// Reads back the journal chunk `key` of committed batch `batch`.
async fn read_chunk(
    config: &Config,
    coll: &Collection,
    table: &str,
    key: &str,
    batch: u64,
) -> Result<Vec<Doc>, SinkError> {
    let body = config
        .calls
        .run("read a journal chunk", table, || async {
            match coll.get(key, None).await {
                Ok(r) => Ok(Some(r.content_as_raw().0.to_vec())),
                Err(e) if *e.kind() == ErrorKind::DocumentNotFound => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?
        .ok_or_else(|| {
            SinkError::Io(format!(
                "couchbase: table {table}: journal chunk {key} of committed batch {batch} is missing; the collection was changed by someone else"
            ))
        })?;
    let chunk: Chunk<'_> = serde_json::from_slice(&body).map_err(|e| {
        SinkError::Io(format!(
            "couchbase: table {table}: journal chunk {key} is not urutau's: {e}"
        ))
    })?;
    Ok(chunk
        .entries
        .into_iter()
        .map(|(key, body)| Doc {
            key,
            body: body.map(|b| b.get().as_bytes().to_vec()),
        })
        .collect())
}

/// Rewrites the control document with `change` applied, guarded by CAS:
/// on a mismatch (another writer of the table) it is read again and the
/// change applied to what is there.
async fn update_control(
    config: &Config,
    coll: &Collection,
    table: &str,
    known: (Control, Option<u64>),
    mut change: impl FnMut(&mut Control),
) -> Result<(Control, u64), SinkError> {
    let (mut current, mut cas) = known;
    for _ in 0..1000 {
        let mut next = current.clone();
        change(&mut next);
        let body = next.to_json();
        let written = config
            .calls
            .run("write the commit record", table, || async {
                let r = match cas {
                    Some(cas) => {
                        coll.replace_raw(
                            CONTROL_KEY,
                            &body,
                            JSON_FLAGS,
                            ReplaceOptions::new()
                                .cas(cas)
                                .durability_level(config.durability.clone()),
                        )
                        .await
                    }
                    None => {
                        coll.insert_raw(
                            CONTROL_KEY,
                            &body,
                            JSON_FLAGS,
                            InsertOptions::new().durability_level(config.durability.clone()),
                        )
                        .await
                    }
                };
                match r {
                    Ok(r) => Ok(Some(r.cas())),
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::CasMismatch
                                | ErrorKind::DocumentExists
                                | ErrorKind::DocumentNotFound
                        ) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        match written {
            Some(new_cas) => return Ok((next, new_cas)),
            None => {
                (current, cas) = read_control(config, coll, table).await?;
            }
        }
    }
    Err(SinkError::Io(format!(
        "couchbase: table {table}: the control document kept changing under the commit (1000 CAS mismatches)"
    )))
}

/// Removes a batch's journal chunks, the last first (so what a crash
/// leaves is still a prefix): `chunks` of them, or when unknown every chunk
/// of the prefix that exists.
async fn remove_journal(
    config: &Config,
    coll: &Collection,
    table: &str,
    owner: Option<u32>,
    batch: u64,
    chunks: Option<u32>,
) -> Result<(), SinkError> {
    let exists = |c: u32| {
        let key = journal_key(owner, batch, c);
        async move {
            config
                .calls
                .run("look for a journal chunk", table, || async {
                    match coll.get(&key, None).await {
                        Ok(_) => Ok(true),
                        Err(e) if *e.kind() == ErrorKind::DocumentNotFound => Ok(false),
                        Err(e) => Err(e),
                    }
                })
                .await
        }
    };
    let count = match chunks {
        Some(n) => n,
        None => {
            let mut n = 0;
            while exists(n).await? {
                n += 1;
            }
            n
        }
    };
    for c in (0..count).rev() {
        let key = journal_key(owner, batch, c);
        config
            .calls
            .run("remove a journal chunk", table, || async {
                match coll.remove(&key, None).await {
                    Err(e) if *e.kind() == ErrorKind::DocumentNotFound => Ok(()),
                    r => r.map(drop),
                }
            })
            .await?;
    }
    Ok(())
}

/// A restart, in either mode: checks that the table's owners are the
/// route's, applies the committed batch of every owner again and removes
/// what a crash left of other journals. A fast sink then clears the
/// commit records (an atomic run of the table before it left them), so a
/// later atomic run never applies an old journal over newer data.
pub async fn recover(
    config: &Config,
    s: &mut TableState,
    workers: u32,
    mode: CommitMode,
) -> Result<(), SinkError> {
    check_owners(&s.control, workers, &s.name)?;
    let owners: Vec<Option<u32>> = if workers <= 1 {
        vec![None]
    } else {
        (0..workers).map(Some).collect()
    };
    let mut applied = Vec::new();
    for owner in owners {
        let mark = s.control.owner(owner).cloned().unwrap_or_default();
        if let Some(p) = &mark.pending {
            // A chunk at a time, in order: a batch may be a huge
            // transaction's, and a later chunk supersedes an earlier one.
            let mut documents = 0;
            for c in 0..p.chunks {
                let key = journal_key(owner, p.batch, c);
                let docs = read_chunk(config, &s.collection, &s.name, &key, p.batch).await?;
                write_all(config, &s.collection, &s.name, &docs).await?;
                documents += docs.len();
            }
            tracing::info!(table = %s.name, batch = p.batch, documents, "applied the committed batch's journal again (recovery)");
            // A crash may have left the superseded journal ...
            if p.batch > 1 {
                remove_journal(config, &s.collection, &s.name, owner, p.batch - 1, None).await?;
            }
            applied.push((owner, p.clone()));
        }
        // ... and a batch staged but never committed.
        remove_journal(config, &s.collection, &s.name, owner, mark.batch + 1, None).await?;
    }
    if mode == CommitMode::Fast && !applied.is_empty() {
        let known = (s.control.clone(), s.cas);
        let (control, cas) = update_control(config, &s.collection, &s.name, known, |c| {
            for (owner, _) in &applied {
                c.owner_mut(*owner).pending = None;
            }
        })
        .await?;
        s.control = control;
        s.cas = Some(cas);
        for (owner, p) in &applied {
            remove_journal(
                config,
                &s.collection,
                &s.name,
                *owner,
                p.batch,
                Some(p.chunks),
            )
            .await?;
        }
    }
    Ok(())
}

/// A table written with another number of workers cannot resume safely:
/// an owner the route no longer has could be behind, and its changes would
/// be skipped.
pub fn check_owners(c: &Control, workers: u32, table: &str) -> Result<(), SinkError> {
    let found: Vec<&str> = c.owners.keys().map(String::as_str).collect();
    let same = if workers > 1 {
        // Owners may be added (a new owner resumes from the start); none
        // may be dropped, and no unpartitioned mark may be left behind.
        let unpartitioned = !c.mark.position.is_empty() || c.mark.pending.is_some();
        !unpartitioned
            && found
                .iter()
                .all(|o| o.parse::<u32>().is_ok_and(|o| o < workers))
    } else {
        found.is_empty()
    };
    if same {
        return Ok(());
    }
    let had = if found.is_empty() {
        "1 worker".to_string()
    } else {
        format!("owners {}", found.join(", "))
    };
    Err(SinkError::TableMismatch(format!(
        "{table}: the control document {CONTROL_KEY} holds the positions of {had}, and the route has workers = {workers}; changing the number of workers of a table needs a fresh collection (or the earlier workers setting)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_chunks_parse_back_into_their_documents() {
        let docs: Vec<Doc> = (0..2500)
            .map(|i| Doc {
                key: format!("[{i}]"),
                body: (i % 3 != 0).then(|| format!("{{\"id\":{i},\"s\":\"é\\\"\"}}").into_bytes()),
            })
            .collect();
        let chunks = journal_chunks(&docs);
        assert_eq!(chunks.len(), 3);
        let mut back = Vec::new();
        for c in &chunks {
            let chunk: Chunk<'_> = serde_json::from_slice(c).unwrap();
            back.extend(
                chunk
                    .entries
                    .into_iter()
                    .map(|(k, b)| (k, b.map(|b| b.get().to_string()))),
            );
        }
        assert_eq!(back.len(), docs.len());
        for (d, (k, b)) in docs.iter().zip(back) {
            assert_eq!(d.key, k);
            assert_eq!(
                d.body.as_deref().map(|b| std::str::from_utf8(b).unwrap()),
                b.as_deref()
            );
        }
        assert!(journal_chunks(&[]).is_empty());
    }

    #[test]
    fn a_changed_number_of_workers_is_refused() {
        let mut two = Control::default();
        two.owner_mut(Some(0)).set("5");
        two.owner_mut(Some(1)).set("4");
        assert!(check_owners(&two, 2, "t").is_ok());
        assert!(check_owners(&two, 3, "t").is_ok(), "an owner may be added");
        let e = check_owners(&two, 1, "t").unwrap_err().to_string();
        assert!(
            e.contains("owners 0, 1") && e.contains("workers = 1"),
            "{e}"
        );
        assert!(check_owners(&two, 1, "t").is_err());
        let mut one = Control::default();
        one.mark.set("5");
        assert!(check_owners(&one, 1, "t").is_ok());
        let e = check_owners(&one, 2, "t").unwrap_err().to_string();
        assert!(e.contains("1 worker"), "{e}");
        let mut three = two.clone();
        three.owner_mut(Some(2)).set("3");
        assert!(
            check_owners(&three, 2, "t").is_err(),
            "owner 2 would be dropped"
        );
        assert!(check_owners(&Control::default(), 4, "t").is_ok());
    }

    #[test]
    fn long_marks_make_short_deterministic_append_keys() {
        assert_eq!(append_key_prefix("4096"), "\"4096\"");
        let long = format!(
            "orders:{}",
            (0..60)
                .map(|p| format!("p{p}=123456"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let k = append_key_prefix(&long);
        assert_eq!(k, append_key_prefix(&long));
        assert!(k.starts_with("\"h:") && k.len() < 40, "{k}");
        assert_ne!(k, append_key_prefix(&format!("{long}0")));
    }

    #[test]
    fn owners_split_keys_stably() {
        let a: Vec<u32> = (0..100).map(|i| owner_of(&format!("[{i}]"), 2)).collect();
        let b: Vec<u32> = (0..100).map(|i| owner_of(&format!("[{i}]"), 2)).collect();
        assert_eq!(a, b);
        assert!(a.contains(&0) && a.contains(&1));
    }
}
