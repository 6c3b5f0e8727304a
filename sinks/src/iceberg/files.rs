//! Writing a batch's Parquet files: data files (split by partition) and
//! equality-delete files (key columns only).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::Field;
use futures::TryStreamExt;
use iceberg::arrow::{ArrowFileReader, RecordBatchPartitionSplitter};
use iceberg::spec::{DataContentType, DataFile, DataFileFormat, PartitionKey, Struct};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{CurrentFileStatus, IcebergWriter, IcebergWriterBuilder};
use parquet::arrow::{PARQUET_FIELD_ID_META_KEY, ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use urutau_planner::sink::SinkError;

use super::parquet_file::ParquetFileWriterBuilder;
use super::{dictionary, io_error};

/// Parquet settings: ZSTD, and no dictionary for the `plain` columns.
fn properties(plain: impl IntoIterator<Item = String>) -> WriterProperties {
    plain
        .into_iter()
        .fold(
            WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())),
            |b, column| b.set_column_dictionary_enabled(ColumnPath::new(vec![column]), false),
        )
        .build()
}

/// The column of a one-column key, when the file holds each key once (an
/// upsert's data files, collapsed per key, and every equality-delete
/// file): a dictionary of unique values costs time and space for nothing.
/// A column of a composite key (say a tenant id) repeats, and so do the
/// keys of an append table: they keep their dictionary.
fn unique_key_column(names: Vec<String>, unique: bool) -> Option<String> {
    match <[String; 1]>::try_from(names) {
        Ok([name]) if unique => Some(name),
        _ => None,
    }
}

/// The names of `schema`'s key (identifier) columns.
fn key_names(schema: &iceberg::spec::Schema) -> Vec<String> {
    schema
        .identifier_field_ids()
        .filter_map(|id| schema.name_by_field_id(id).map(str::to_string))
        .collect()
}

/// File names unique across commits and processes.
fn names(kind: &str) -> DefaultFileNameGenerator {
    DefaultFileNameGenerator::new(
        format!("{kind}-{}", uuid::Uuid::now_v7()),
        None,
        DataFileFormat::Parquet,
    )
}

/// Writes `batch` (the table's Arrow form) as data files, one set per
/// partition, rolling over at `target_size` bytes; `unique_keys` when it
/// holds each key once.
pub async fn write_data(
    table: &Table,
    batch: RecordBatch,
    unique_keys: bool,
    target_size: usize,
) -> Result<Vec<DataFile>, SinkError> {
    // Each file holds this batch alone: its sample speaks for the file.
    let mut w = DataWriter::new(table, target_size, unique_keys).with_sampled_dictionaries();
    w.write(batch).await?;
    w.close().await
}

/// Open partition writers at most: one more closes the least recently
/// used (its partition gets a new file if it comes back), so memory stays
/// bounded however many partitions a rewrite meets.
const MAX_OPEN_WRITERS: usize = 16;

/// A data file writer that can tell its open file's size.
trait OpenFileWriter: IcebergWriter + CurrentFileStatus {}

impl<W: IcebergWriter + CurrentFileStatus> OpenFileWriter for W {}

/// Data files written batch by batch (compaction rewrites partition groups
/// through it): one rolling writer per partition, each rolling over at
/// `target_size` bytes, at most [`MAX_OPEN_WRITERS`] open, so memory holds
/// one batch and the open files' buffers, not the table.
pub struct DataWriter {
    table: Table,
    target_size: usize,
    /// Open writers by partition value (`None` unpartitioned), least
    /// recently used first. Keyed by the value, not its path text: a NULL
    /// and the string "null" are different partitions.
    writers: Vec<(Option<Struct>, Box<dyn OpenFileWriter>)>,
    /// Files of writers already closed.
    closed: Vec<DataFile>,
    /// Whether the rows hold each key once.
    unique_keys: bool,
    /// Row groups end at about this many bytes too
    /// ([`ParquetFileWriterBuilder::with_row_group_bytes`]).
    row_group_bytes: Option<usize>,
    /// Whether a file's columns get a dictionary as the first batch
    /// written to it suggests ([`dictionary::plain_columns`]): only when
    /// that batch is the whole file. A file gathered over many batches
    /// (a snapshot group, a compaction) leaves it to Parquet, which drops
    /// a dictionary only once it outgrows its page.
    sampled_dictionaries: bool,
}

impl DataWriter {
    /// A writer for `table`'s default spec and schema; `unique_keys` when
    /// the rows hold each key once.
    pub fn new(table: &Table, target_size: usize, unique_keys: bool) -> Self {
        DataWriter {
            table: table.clone(),
            target_size,
            writers: Vec::new(),
            closed: Vec::new(),
            unique_keys,
            row_group_bytes: None,
            sampled_dictionaries: false,
        }
    }

    /// Row groups also end at about `bytes`, so the size
    /// [`Self::largest_open_size`] estimates is off by less than that.
    pub fn with_row_group_bytes(mut self, bytes: usize) -> Self {
        self.row_group_bytes = Some(bytes);
        self
    }

    /// Each file's dictionaries as the first batch written to it suggests
    /// ([`dictionary::plain_columns`]): for a writer given one batch.
    pub fn with_sampled_dictionaries(mut self) -> Self {
        self.sampled_dictionaries = true;
        self
    }

    /// Writes `batch` (the table's Arrow form).
    pub async fn write(&mut self, batch: RecordBatch) -> Result<(), SinkError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let err = io_error("writing data files");
        // A clone (cheap): nothing borrowed from `self` across the awaits.
        let table = self.table.clone();
        let md = table.metadata();
        let schema = md.current_schema().clone();
        let spec = md.default_partition_spec().clone();
        let parts: Vec<(Option<PartitionKey>, RecordBatch)> = if spec.is_unpartitioned() {
            vec![(None, batch)]
        } else {
            RecordBatchPartitionSplitter::try_new_with_computed_values(schema.clone(), spec)
                .and_then(|s| s.split(&batch))
                .map_err(&err)?
                .into_iter()
                .map(|(k, b)| (Some(k), b))
                .collect()
        };
        for (key, part) in parts {
            let value = key.as_ref().map(|k| k.data().clone());
            let open = self.writers.iter().position(|(v, _)| *v == value);
            let i = match open {
                Some(i) => {
                    let w = self.writers.remove(i);
                    self.writers.push(w);
                    self.writers.len() - 1
                }
                None => {
                    if self.writers.len() >= MAX_OPEN_WRITERS {
                        let (_, mut oldest) = self.writers.remove(0);
                        self.closed.extend(oldest.close().await.map_err(&err)?);
                    }
                    let mut plain: Vec<String> =
                        unique_key_column(key_names(&schema), self.unique_keys)
                            .into_iter()
                            .collect();
                    if self.sampled_dictionaries {
                        for c in dictionary::plain_columns(&part) {
                            if !plain.contains(&c) {
                                plain.push(c);
                            }
                        }
                    }
                    let mut parquet =
                        ParquetFileWriterBuilder::try_new(properties(plain), schema.clone())
                            .map_err(&err)?;
                    if let Some(bytes) = self.row_group_bytes {
                        parquet = parquet.with_row_group_bytes(bytes);
                    }
                    let rolling = RollingFileWriterBuilder::new(
                        parquet,
                        self.target_size,
                        table.file_io().clone(),
                        DefaultLocationGenerator::new(md).map_err(&err)?,
                        names("data"),
                    );
                    let w = DataFileWriterBuilder::new(rolling)
                        .build(key)
                        .await
                        .map_err(&err)?;
                    self.writers.push((value, Box::new(w)));
                    self.writers.len() - 1
                }
            };
            self.writers[i].1.write(part).await.map_err(&err)?;
        }
        Ok(())
    }

    /// The bytes the largest open file holds so far (written and
    /// buffered): what a caller gathering rows into files of a target
    /// size watches.
    pub fn largest_open_size(&self) -> usize {
        self.writers
            .iter()
            .map(|(_, w)| w.current_written_size())
            .max()
            .unwrap_or(0)
    }

    /// The paths of the files open now (each has had rows written).
    pub fn open_paths(&self) -> Vec<String> {
        self.writers
            .iter()
            .map(|(_, w)| w.current_file_path())
            .collect()
    }

    /// The data files closed so far (a partition's writer closed to make
    /// room, or a file rolled over): they are on storage already.
    pub fn closed(&self) -> &[DataFile] {
        &self.closed
    }

    /// Closes every file; the data files written.
    pub async fn close(mut self) -> Result<Vec<DataFile>, SinkError> {
        let err = io_error("writing data files");
        let mut files = std::mem::take(&mut self.closed);
        for (_, w) in &mut self.writers {
            files.extend(w.close().await.map_err(&err)?);
        }
        Ok(files)
    }
}

/// Hands the values of the table's top-level column `field` (found in
/// the data file `file` by its field id, else by its exact name) to
/// `each`, a Parquet batch at a time, in file order (so a caller counting
/// rows knows each value's position): the column of a file of any size in
/// bounded memory.
pub async fn each_column_batch(
    table: &Table,
    file: &DataFile,
    field: &Field,
    mut each: impl FnMut(&ArrayRef) -> Result<(), SinkError>,
) -> Result<(), SinkError> {
    let err = io_error("reading back a column of a data file");
    let parquet_err = |e: parquet::errors::ParquetError| {
        SinkError::Io(format!("reading back a column of a data file: {e}"))
    };
    let input = table.file_io().new_input(file.file_path()).map_err(&err)?;
    let reader = ArrowFileReader::new(
        input.metadata().await.map_err(&err)?,
        input.reader().await.map_err(&err)?,
    );
    let builder = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(parquet_err)?;
    let root = root_of(builder.schema(), field).ok_or_else(|| {
        SinkError::Io(format!(
            "{} has no column {}",
            file.file_path(),
            field.name()
        ))
    })?;
    // By root index: a name with a dot in it is not a path.
    let mask = ProjectionMask::roots(builder.parquet_schema(), [root]);
    let mut batches = builder.with_projection(mask).build().map_err(parquet_err)?;
    while let Some(b) = batches.try_next().await.map_err(parquet_err)? {
        each(b.column(0))?;
    }
    Ok(())
}

/// The index of the file's top-level column that holds the table's
/// `field`: the one of its field id, else (a file without ids) the one of
/// its exact name.
fn root_of(file: &arrow::datatypes::Schema, field: &Field) -> Option<usize> {
    let id = |f: &Field| f.metadata().get(PARQUET_FIELD_ID_META_KEY).cloned();
    match id(field) {
        Some(want) if file.fields().iter().any(|f| id(f).is_some()) => file
            .fields()
            .iter()
            .position(|f| id(f).as_ref() == Some(&want)),
        _ => file.fields().iter().position(|f| f.name() == field.name()),
    }
}

/// The values of the table's top-level column `field` in the data files
/// `files`, in file order, read column by column through the table's
/// storage (a large file is never read whole): what a commit reads back
/// when it must check the keys it wrote against another writer's.
pub async fn read_column(
    table: &Table,
    files: &[DataFile],
    field: &Field,
) -> Result<ArrayRef, SinkError> {
    let mut parts: Vec<ArrayRef> = Vec::new();
    for f in files {
        each_column_batch(table, f, field, |column| {
            parts.push(Arc::clone(column));
            Ok(())
        })
        .await?;
    }
    let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    match parts.as_slice() {
        [] => Err(SinkError::Io(format!(
            "no data file to read {} from",
            field.name()
        ))),
        parts => arrow::compute::concat(parts).map_err(io_error("joining the column's parts")),
    }
}

/// Writes `keys` (key columns with their field ids) as equality-delete
/// files on `key_ids`, under the partition spec `spec_id` (unpartitioned:
/// the deletes apply to every partition, so a key whose row moved between
/// partitions is still deleted).
pub async fn write_equality_deletes(
    table: &Table,
    keys: RecordBatch,
    key_ids: &[i32],
    spec_id: i32,
) -> Result<Vec<DataFile>, SinkError> {
    if keys.num_rows() == 0 {
        return Ok(vec![]);
    }
    let err = io_error("writing equality-delete files");
    // The key fields as the table has them (a uuid stays a uuid, not the
    // 16-byte fixed its Arrow form would give, so the file annotates it).
    let table_schema = table.metadata().current_schema();
    let key_fields = keys
        .schema()
        .fields()
        .iter()
        .map(|f| {
            table_schema
                .field_by_name(f.name())
                .cloned()
                .ok_or_else(|| {
                    SinkError::Io(format!(
                        "writing equality-delete files: the table has no key column {}",
                        f.name()
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let key_schema = Arc::new(
        iceberg::spec::Schema::builder()
            .with_fields(key_fields)
            .build()
            .map_err(&err)?,
    );
    let mut w = RollingFileWriterBuilder::new_with_default_file_size(
        ParquetFileWriterBuilder::try_new(
            properties(unique_key_column(
                keys.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect(),
                true,
            )),
            key_schema,
        )
        .map_err(&err)?,
        table.file_io().clone(),
        DefaultLocationGenerator::new(table.metadata()).map_err(&err)?,
        names("eq-deletes"),
    )
    .build();
    w.write(&None, &keys).await.map_err(&err)?;
    w.close()
        .await
        .map_err(&err)?
        .into_iter()
        .map(|mut b| {
            b.content(DataContentType::EqualityDeletes)
                .equality_ids(Some(key_ids.to_vec()))
                .partition_spec_id(spec_id);
            b.build()
                .map_err(|e| SinkError::Io(format!("writing equality-delete files: {e}")))
        })
        .collect()
}

/// Field ids of a position-delete file's columns (the spec's reserved
/// `file_path` and `pos`).
const POSITION_DELETE_FILE_PATH: i32 = 2147483546;
const POSITION_DELETE_POS: i32 = 2147483545;

/// Writes a position-delete file removing the rows at `positions`
/// (ascending) of `data_file`, under the data file's partition and
/// `spec_id`, naming it as the one file it references: readers (DuckDB,
/// Java's) skip rows by position, where every equality-deleted key costs
/// them a predicate over every row.
pub async fn write_position_deletes(
    table: &Table,
    data_file: &DataFile,
    positions: Vec<i64>,
    spec_id: i32,
) -> Result<DataFile, SinkError> {
    use iceberg::spec::{NestedField, PrimitiveType, Type};
    let err = io_error("writing a position-delete file");
    let schema = Arc::new(
        iceberg::spec::Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::required(
                    POSITION_DELETE_FILE_PATH,
                    "file_path",
                    Type::Primitive(PrimitiveType::String),
                )),
                Arc::new(NestedField::required(
                    POSITION_DELETE_POS,
                    "pos",
                    Type::Primitive(PrimitiveType::Long),
                )),
            ])
            .build()
            .map_err(&err)?,
    );
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).map_err(&err)?);
    let rows = positions.len();
    let batch = RecordBatch::try_new(
        arrow,
        vec![
            Arc::new(arrow::array::StringArray::from_iter_values(
                std::iter::repeat_n(data_file.file_path(), rows),
            )),
            Arc::new(arrow::array::Int64Array::from(positions)),
        ],
    )
    .map_err(io_error("building a position-delete file"))?;
    let mut w = RollingFileWriterBuilder::new_with_default_file_size(
        ParquetFileWriterBuilder::try_new(properties(["pos".to_string()]), schema).map_err(&err)?,
        table.file_io().clone(),
        DefaultLocationGenerator::new(table.metadata()).map_err(&err)?,
        names("pos-deletes"),
    )
    .build();
    w.write(&None, &batch).await.map_err(&err)?;
    let mut files = w.close().await.map_err(&err)?;
    let [mut b] = <[_; 1]>::try_from(std::mem::take(&mut files)).map_err(|f: Vec<_>| {
        SinkError::Io(format!(
            "writing a position-delete file: {} files written, one expected",
            f.len()
        ))
    })?;
    b.content(DataContentType::PositionDeletes)
        .partition(data_file.partition().clone())
        .partition_spec_id(spec_id)
        .referenced_data_file(Some(data_file.file_path().to_string()));
    b.build()
        .map_err(|e| SinkError::Io(format!("writing a position-delete file: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unique_one_column_key_is_written_without_a_dictionary() {
        let names = |v: &[&str]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            unique_key_column(names(&["id"]), true),
            Some("id".to_string())
        );
        // Keys that repeat in the file keep their dictionary.
        assert_eq!(unique_key_column(names(&["id"]), false), None);
        assert_eq!(unique_key_column(names(&["tenant", "id"]), true), None);
        let props = properties(["id".to_string()]);
        let column = |n: &str| ColumnPath::new(vec![n.to_string()]);
        assert!(!props.dictionary_enabled(&column("id")));
        assert!(props.dictionary_enabled(&column("status")));
        assert_eq!(
            props.compression(&column("id")),
            Compression::ZSTD(ZstdLevel::default())
        );
    }

    #[test]
    fn a_column_read_back_is_found_by_field_id_else_by_its_whole_name() {
        use arrow::datatypes::{DataType, Schema};
        let field = |name: &str, id: Option<i32>| {
            let f = Field::new(name, DataType::Int64, false);
            match id {
                Some(id) => f.with_metadata(
                    [(PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())].into(),
                ),
                None => f,
            }
        };
        // Renamed since the file was written: its id finds it.
        let file = Schema::new(vec![field("v", Some(2)), field("old_id", Some(1))]);
        assert_eq!(root_of(&file, &field("order.id", Some(1))), Some(1));
        assert_eq!(root_of(&file, &field("v", Some(3))), None);
        // A file without ids: the exact name, dots and all (not a path).
        let file = Schema::new(vec![field("order", None), field("order.id", None)]);
        assert_eq!(root_of(&file, &field("order.id", Some(1))), Some(1));
        assert_eq!(root_of(&file, &field("id", Some(1))), None);
    }
}
