//! Compaction: the table's live rows rewritten into few large data files,
//! every delete file dropped, in one `replace` snapshot.
//!
//! Upsert by equality delete adds a delete file per batch, and every reader
//! applies every delete file to every older data file: left alone, a table
//! gets slower to read with each commit. A compaction pass reads the
//! current snapshot with its deletes applied (iceberg-rust's scan applies
//! an equality delete only to data files of a lower sequence number, as
//! the spec says), writes the rows as data files of about
//! `target_file_size`, and commits ONE snapshot that adds them and marks
//! every live data and delete file deleted. The rewritten files get the new
//! snapshot's sequence number, so no delete they already reflect applies
//! to them again, and every later batch's deletes do.
//!
//! In this build a pass rewrites the whole table (every partition) once it
//! holds at least `min_input_files` candidates (data files below the target
//! size, and delete files): the deletes of a table can only be dropped
//! when every data file older than them has been rewritten. It runs in the
//! sink's maintenance turn, under the table's lock, so none of this
//! pipeline's commits interleave; another writer's commit makes the swap
//! fail and the pass is abandoned until its next turn (its files become
//! orphans). The snapshot carries the table's current `cdc.position` mark,
//! so every snapshot keeps one.

use futures::TryStreamExt;
use iceberg::spec::{DataContentType, DataFile, ManifestEntryRef, TableMetadataBuildResult};
use iceberg::table::Table;
use urutau_planner::sink::SinkError;

use super::files::DataWriter;
use super::{commit, conform_by_name, io_error};
use std::sync::Arc;

use arrow::datatypes::SchemaRef as ArrowSchemaRef;
use iceberg::arrow::schema_to_arrow_schema;

/// A live file of the current snapshot, with the partition spec of the
/// manifest that lists it.
pub struct LiveFile {
    pub entry: ManifestEntryRef,
    pub spec_id: i32,
}

/// The live entries (data and delete files) of the table's current
/// snapshot.
pub async fn live_files(table: &Table) -> Result<Vec<LiveFile>, SinkError> {
    let err = io_error("reading the table's manifests");
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(vec![]);
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(&err)?;
    let mut live = Vec::new();
    for m in list.entries() {
        let manifest = m.load_manifest(table.file_io()).await.map_err(&err)?;
        live.extend(
            manifest
                .entries()
                .iter()
                .filter(|e| e.is_alive())
                .map(|e| LiveFile {
                    entry: e.clone(),
                    spec_id: m.partition_spec_id,
                }),
        );
    }
    Ok(live)
}

/// How many of `live` a compaction would merge away: data files smaller
/// than `target_size`, and every delete file.
pub fn candidates(live: &[LiveFile], target_size: u64) -> usize {
    live.iter()
        .filter(|f| {
            f.entry.content_type() != DataContentType::Data
                || f.entry.file_size_in_bytes() < target_size
        })
        .count()
}

/// Rewrites the table's current snapshot (`live` are its files) and builds
/// the `replace` snapshot; also returns the data files written.
pub async fn build_compaction(
    table: &Table,
    live: &[LiveFile],
    target_size: u64,
) -> Result<(TableMetadataBuildResult, Vec<DataFile>), SinkError> {
    let err = io_error("compacting");
    // The rows are rewritten in the table's current schema (the one the
    // data writer writes), whatever schema this sink loaded at start.
    let arrow: ArrowSchemaRef =
        Arc::new(schema_to_arrow_schema(table.metadata().current_schema()).map_err(&err)?);
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Err(SinkError::Io(
            "compacting: the table has no snapshot".into(),
        ));
    };
    let mut rows = table
        .scan()
        .snapshot_id(snapshot.snapshot_id())
        .select_all()
        .build()
        .map_err(&err)?
        .to_arrow()
        .await
        .map_err(&err)?;
    let mut writer = DataWriter::new(table, usize::try_from(target_size).unwrap_or(usize::MAX));
    while let Some(batch) = rows.try_next().await.map_err(&err)? {
        let batch = conform_by_name(&batch, &arrow)
            .map_err(|e| SinkError::Io(format!("compacting: {e}")))?;
        writer.write(batch).await?;
    }
    let added = writer.close().await?;
    let result = commit::build_replace(table, &added, live).await?;
    Ok((result, added))
}
