//! The Parquet file writer of the Iceberg sink.
//!
//! iceberg-rust's `ParquetWriter` writes an Iceberg `uuid` column as a
//! 16-byte fixed column without Parquet's UUID logical type, which the
//! Iceberg spec asks for. Readers that go by the annotation mis-read such
//! files: Iceberg's Java generic reader reads the values as `byte[]` and
//! does not apply equality deletes keyed by them; DuckDB fails on the
//! column. This writer gives the Parquet schema the annotation itself and
//! builds the data file's metrics (column sizes, value, null and NaN
//! counts, bounds, split offsets) from the file's footer on iceberg's
//! public API, as iceberg-rust's writer does.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type, SchemaRef as ArrowSchemaRef};
use bytes::Bytes;
use futures::future::BoxFuture;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::io::{FileWrite, OutputFile};
use iceberg::spec::{
    DataContentType, DataFileBuilder, DataFileFormat, Datum, NestedFieldRef, PrimitiveType, Schema,
    SchemaRef, Struct, Type,
};
use iceberg::writer::CurrentFileStatus;
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder};
use iceberg::{Error, ErrorKind};
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::arrow::async_writer::AsyncFileWriter;
use parquet::arrow::{ArrowSchemaConverter, AsyncArrowWriter};
use parquet::basic::{LogicalType, Type as PhysicalType};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::Statistics;
use parquet::schema::types::{SchemaDescriptor, Type as ParquetType, TypePtr};

/// Builds a [`ParquetFileWriter`] per file: the rolling writer's
/// `FileWriterBuilder` in place of iceberg-rust's `ParquetWriterBuilder`.
#[derive(Clone)]
pub struct ParquetFileWriterBuilder {
    props: WriterProperties,
    schema: SchemaRef,
    arrow: ArrowSchemaRef,
    /// The Parquet schema with uuid columns annotated, when the schema has
    /// any (otherwise the Arrow writer derives it, as for any file).
    parquet: Option<TypePtr>,
    /// A row group is flushed once its estimated size reaches this
    /// (`None`: at the properties' row count only).
    row_group_bytes: Option<usize>,
}

impl std::fmt::Debug for ParquetFileWriterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetFileWriterBuilder")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl ParquetFileWriterBuilder {
    /// Files of `schema` (an Iceberg schema; its field ids become the
    /// Parquet field ids) written with `props`.
    pub fn try_new(props: WriterProperties, schema: SchemaRef) -> iceberg::Result<Self> {
        let arrow = Arc::new(schema_to_arrow_schema(&schema)?);
        let converted = ArrowSchemaConverter::new()
            .convert(&arrow)
            .map_err(parquet_error("deriving the Parquet schema"))?;
        let root = converted.root_schema_ptr();
        let annotated = annotate_uuids(&root, &schema).map_err(parquet_error(
            "annotating the uuid columns of the Parquet schema",
        ))?;
        let parquet = (!Arc::ptr_eq(&annotated, &root)).then_some(annotated);
        Ok(ParquetFileWriterBuilder {
            props,
            schema,
            arrow,
            parquet,
            row_group_bytes: None,
        })
    }

    /// Row groups also end at about `bytes` (estimated, before the
    /// compression of the last page), so a file's flushed size, which is
    /// exact, trails its written rows by less than that: a writer that
    /// closes files at a target size can tell when the file has reached it.
    pub fn with_row_group_bytes(mut self, bytes: usize) -> Self {
        self.row_group_bytes = Some(bytes.max(1));
        self
    }
}

/// `t` with Parquet's UUID logical type on every 16-byte fixed column
/// whose field is an Iceberg `uuid`; `t` itself (the same pointer) when
/// nothing under it changes.
fn annotate_uuids(t: &TypePtr, schema: &Schema) -> Result<TypePtr, ParquetError> {
    let info = t.get_basic_info();
    if t.is_group() {
        let fields: Vec<TypePtr> = t
            .get_fields()
            .iter()
            .map(|f| annotate_uuids(f, schema))
            .collect::<Result<_, _>>()?;
        if fields
            .iter()
            .zip(t.get_fields())
            .all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return Ok(t.clone());
        }
        let mut group = ParquetType::group_type_builder(info.name())
            .with_fields(fields)
            .with_converted_type(info.converted_type())
            .with_logical_type(info.logical_type_ref().cloned());
        if info.has_repetition() {
            group = group.with_repetition(info.repetition());
        }
        if info.has_id() {
            group = group.with_id(Some(info.id()));
        }
        return Ok(Arc::new(group.build()?));
    }
    let is_uuid = info.has_id()
        && matches!(
            schema.field_by_id(info.id()).map(|f| f.field_type.as_ref()),
            Some(Type::Primitive(PrimitiveType::Uuid))
        );
    if !is_uuid || t.get_physical_type() != PhysicalType::FIXED_LEN_BYTE_ARRAY {
        return Ok(t.clone());
    }
    let column =
        ParquetType::primitive_type_builder(info.name(), PhysicalType::FIXED_LEN_BYTE_ARRAY)
            .with_repetition(info.repetition())
            .with_length(16)
            .with_id(Some(info.id()))
            .with_logical_type(Some(LogicalType::Uuid))
            .build()?;
    Ok(Arc::new(column))
}

/// An iceberg error for a Parquet failure while `doing` something.
fn parquet_error(doing: &'static str) -> impl Fn(ParquetError) -> Error {
    move |e| Error::new(ErrorKind::Unexpected, format!("{doing}: {e}")).with_source(e)
}

impl FileWriterBuilder for ParquetFileWriterBuilder {
    type R = ParquetFileWriter;

    async fn build(&self, output: OutputFile) -> iceberg::Result<ParquetFileWriter> {
        Ok(ParquetFileWriter {
            builder: self.clone(),
            output,
            inner: None,
            rows: 0,
            nan_counts: HashMap::new(),
        })
    }
}

/// One Parquet file being written; opened on the first non-empty batch.
pub struct ParquetFileWriter {
    builder: ParquetFileWriterBuilder,
    output: OutputFile,
    inner: Option<AsyncArrowWriter<Output>>,
    rows: usize,
    /// NaN values per float or double field (top level and in structs).
    nan_counts: HashMap<i32, u64>,
}

impl ParquetFileWriter {
    /// The open Arrow writer, opening the file on first use.
    async fn open(&mut self) -> iceberg::Result<&mut AsyncArrowWriter<Output>> {
        if self.inner.is_none() {
            let b = &self.builder;
            let mut options = ArrowWriterOptions::new().with_properties(b.props.clone());
            if let Some(root) = &b.parquet {
                options = options.with_parquet_schema(SchemaDescriptor::new(root.clone()));
            }
            let file = Output(self.output.writer().await?);
            let writer = AsyncArrowWriter::try_new_with_options(file, b.arrow.clone(), options)
                .map_err(parquet_error("opening a Parquet file"))?;
            self.inner = Some(writer);
        }
        Ok(self.inner.as_mut().expect("opened above"))
    }
}

impl FileWriter for ParquetFileWriter {
    async fn write(&mut self, batch: &RecordBatch) -> iceberg::Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let fields = self.builder.schema.as_struct().fields();
        count_nans(fields, batch.columns(), &mut self.nan_counts);
        self.rows += batch.num_rows();
        let limit = self.builder.row_group_bytes;
        let writer = self.open().await?;
        writer
            .write(batch)
            .await
            .map_err(parquet_error("writing a Parquet file"))?;
        if limit.is_some_and(|l| writer.in_progress_size() >= l) {
            writer
                .flush()
                .await
                .map_err(parquet_error("writing a Parquet file"))?;
        }
        Ok(())
    }

    async fn close(mut self) -> iceberg::Result<Vec<DataFileBuilder>> {
        let Some(mut writer) = self.inner.take() else {
            return Ok(vec![]);
        };
        let footer = writer
            .finish()
            .await
            .map_err(parquet_error("finishing a Parquet file"))?;
        Ok(vec![data_file(
            &self.builder.schema,
            &footer,
            writer.bytes_written(),
            self.output.location().to_string(),
            self.nan_counts,
        )])
    }
}

impl CurrentFileStatus for ParquetFileWriter {
    fn current_file_path(&self) -> String {
        self.output.location().to_string()
    }

    fn current_row_num(&self) -> usize {
        self.rows
    }

    fn current_written_size(&self) -> usize {
        self.inner
            .as_ref()
            .map_or(0, |w| w.bytes_written() + w.in_progress_size())
    }
}

/// Adds the NaN values of `columns` (of `fields`) to `counts`: float and
/// double columns, at the top level and in structs. Values in lists and
/// maps are not counted, so their fields get no count (unknown), never a
/// wrong one.
fn count_nans(fields: &[NestedFieldRef], columns: &[ArrayRef], counts: &mut HashMap<i32, u64>) {
    for (field, column) in fields.iter().zip(columns) {
        let nans = match (field.field_type.as_ref(), column.data_type()) {
            (Type::Primitive(PrimitiveType::Float), DataType::Float32) => column
                .as_primitive::<Float32Type>()
                .iter()
                .filter(|v| v.is_some_and(f32::is_nan))
                .count(),
            (Type::Primitive(PrimitiveType::Double), DataType::Float64) => column
                .as_primitive::<Float64Type>()
                .iter()
                .filter(|v| v.is_some_and(f64::is_nan))
                .count(),
            (Type::Struct(s), DataType::Struct(_)) => {
                count_nans(s.fields(), column.as_struct().columns(), counts);
                continue;
            }
            _ => continue,
        };
        *counts.entry(field.id).or_default() += nans as u64;
    }
}

/// The data file's description from the Parquet footer: sizes, counts
/// and bounds per field id (leaf columns carry their field's id).
fn data_file(
    schema: &Schema,
    footer: &ParquetMetaData,
    size: usize,
    path: String,
    nan_counts: HashMap<i32, u64>,
) -> DataFileBuilder {
    let mut sizes: HashMap<i32, u64> = HashMap::new();
    let mut values: HashMap<i32, u64> = HashMap::new();
    let mut nulls: HashMap<i32, u64> = HashMap::new();
    let mut lower: HashMap<i32, Datum> = HashMap::new();
    let mut upper: HashMap<i32, Datum> = HashMap::new();
    let mut unknown: HashSet<(i32, Stat)> = HashSet::new();
    for group in footer.row_groups() {
        for chunk in group.columns() {
            let info = chunk.column_descr().self_type().get_basic_info();
            if !info.has_id() {
                continue;
            }
            let id = info.id();
            let Some(Type::Primitive(ty)) = schema.field_by_id(id).map(|f| f.field_type.as_ref())
            else {
                continue;
            };
            *sizes.entry(id).or_default() += chunk.compressed_size() as u64;
            *values.entry(id).or_default() += chunk.num_values() as u64;
            // A row group without a count or an exact bound leaves the
            // file without one: the other groups' would be too narrow (a
            // reader would skip the file for values it holds).
            let Some(stats) = chunk.statistics() else {
                unknown.extend([(id, Stat::Nulls), (id, Stat::Lower), (id, Stat::Upper)]);
                continue;
            };
            match stats.null_count_opt() {
                Some(n) => *nulls.entry(id).or_default() += n,
                None => {
                    unknown.insert((id, Stat::Nulls));
                }
            }
            // All NULL: no value to bound.
            if stats.null_count_opt() == Some(chunk.num_values() as u64) {
                continue;
            }
            match bound(ty, stats, stats.min_bytes_opt()) {
                Some(min) if stats.min_is_exact() => keep(&mut lower, id, min, Ordering::Less),
                _ => {
                    unknown.insert((id, Stat::Lower));
                }
            }
            match bound(ty, stats, stats.max_bytes_opt()) {
                Some(max) if stats.max_is_exact() => keep(&mut upper, id, max, Ordering::Greater),
                _ => {
                    unknown.insert((id, Stat::Upper));
                }
            }
        }
    }
    for (id, stat) in unknown {
        match stat {
            Stat::Nulls => {
                nulls.remove(&id);
            }
            Stat::Lower => {
                lower.remove(&id);
            }
            Stat::Upper => {
                upper.remove(&id);
            }
        }
    }
    let mut b = DataFileBuilder::default();
    b.content(DataContentType::Data)
        .file_path(path)
        .file_format(DataFileFormat::Parquet)
        .partition(Struct::empty())
        .record_count(footer.file_metadata().num_rows() as u64)
        .file_size_in_bytes(size as u64)
        .column_sizes(sizes)
        .value_counts(values)
        .null_value_counts(nulls)
        .nan_value_counts(nan_counts)
        .lower_bounds(lower)
        .upper_bounds(upper)
        .split_offsets(Some(
            footer
                .row_groups()
                .iter()
                .filter_map(|g| g.file_offset())
                .collect(),
        ));
    b
}

/// A file-level statistic a row group may leave unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stat {
    Nulls,
    Lower,
    Upper,
}

/// Keeps in `bounds` for `id` whichever of the bound there and `value`
/// compares as `wins` to the other (`Less` for lower bounds).
fn keep(bounds: &mut HashMap<i32, Datum>, id: i32, value: Datum, wins: Ordering) {
    match bounds.entry(id) {
        Entry::Occupied(mut held) => {
            if value.partial_cmp(held.get()) == Some(wins) {
                held.insert(value);
            }
        }
        Entry::Vacant(slot) => {
            slot.insert(value);
        }
    }
}

/// A bound of a column of type `ty` from a Parquet statistic's plain
/// bytes. Plain encoding is Iceberg's single-value serialization for every
/// type but a decimal stored as an int32 or int64 (little- vs big-endian);
/// a statistic of another physical type than the one `ty` is written as
/// gives no bound (bounds are optional; a wrong one would prune rows).
///
/// A `uuid` gets no bound. Parquet orders UUIDs as unsigned bytes (as the
/// RFCs do), but Iceberg's Java library up to 1.10 compares them as Java's
/// signed longs (apache/iceberg#14216): given unsigned bounds it decides
/// that an equality-delete file cannot touch a data file whose range
/// crosses 0x80.. and skips it (a deleted row reads back), and a filter on
/// the column skips files that hold matches. Without bounds every reader
/// reads them.
fn bound(ty: &PrimitiveType, stats: &Statistics, bytes: Option<&[u8]>) -> Option<Datum> {
    use PrimitiveType as P;
    use Statistics as S;
    let bytes = bytes?;
    let widened: [u8; 16];
    let bytes: &[u8] = match (ty, stats) {
        (P::Decimal { .. }, S::Int32(_)) => {
            widened = i128::from(i32::from_le_bytes(bytes.try_into().ok()?)).to_be_bytes();
            &widened
        }
        (P::Decimal { .. }, S::Int64(_)) => {
            widened = i128::from(i64::from_le_bytes(bytes.try_into().ok()?)).to_be_bytes();
            &widened
        }
        (P::Boolean, S::Boolean(_))
        | (P::Int | P::Date, S::Int32(_))
        | (P::Long, S::Int32(_) | S::Int64(_))
        | (
            P::Time | P::Timestamp | P::Timestamptz | P::TimestampNs | P::TimestamptzNs,
            S::Int64(_),
        )
        | (P::Float, S::Float(_))
        | (P::Double, S::Float(_) | S::Double(_))
        | (P::String | P::Binary | P::Decimal { .. }, S::ByteArray(_))
        | (P::Fixed(_) | P::Decimal { .. }, S::FixedLenByteArray(_)) => bytes,
        _ => return None,
    };
    Datum::try_from_bytes(bytes, ty.clone()).ok()
}

/// iceberg's output file as the Arrow writer's sink.
struct Output(Box<dyn FileWrite>);

impl AsyncFileWriter for Output {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        Box::pin(async move {
            self.0
                .write(bs)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        Box::pin(async move {
            self.0
                .close()
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        BooleanArray, Date32Array, Decimal128Array, FixedSizeBinaryArray, Float32Array,
        Float64Array, Int32Array, Int64Array, LargeBinaryArray, ListArray, StringArray,
        StructArray, Time64MicrosecondArray, TimestampMicrosecondArray,
    };
    use arrow::datatypes::Int64Type;
    use iceberg::io::FileIO;
    use iceberg::spec::{DataFile, ListType, NestedField, StructType};
    use iceberg::writer::file_writer::ParquetWriterBuilder;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    /// A field of every primitive type the sink writes, a uuid and a
    /// double in a struct, and a list.
    fn schema() -> Schema {
        use PrimitiveType as P;
        let p = |id, name: &str, t| NestedField::optional(id, name, Type::Primitive(t)).into();
        Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(P::Uuid)).into(),
                p(2, "b", P::Boolean),
                p(3, "i", P::Int),
                p(4, "l", P::Long),
                p(5, "f", P::Float),
                p(6, "d", P::Double),
                p(
                    7,
                    "dec9",
                    P::Decimal {
                        precision: 9,
                        scale: 2,
                    },
                ),
                p(
                    8,
                    "dec18",
                    P::Decimal {
                        precision: 18,
                        scale: 2,
                    },
                ),
                p(
                    9,
                    "dec38",
                    P::Decimal {
                        precision: 38,
                        scale: 10,
                    },
                ),
                p(10, "day", P::Date),
                p(11, "time", P::Time),
                p(12, "ts", P::Timestamp),
                p(13, "tstz", P::Timestamptz),
                p(14, "s", P::String),
                p(15, "bin", P::Binary),
                p(16, "fx", P::Fixed(4)),
                NestedField::optional(
                    17,
                    "st",
                    Type::Struct(StructType::new(vec![
                        p(18, "x", P::Double),
                        p(19, "u", P::Uuid),
                    ])),
                )
                .into(),
                NestedField::optional(
                    20,
                    "ls",
                    Type::List(ListType::new(p(21, "element", P::Long))),
                )
                .into(),
            ])
            .with_identifier_field_ids([1])
            .build()
            .unwrap()
    }

    fn batch(schema: &Schema) -> RecordBatch {
        let arrow = Arc::new(schema_to_arrow_schema(schema).unwrap());
        let uuids = |v: [u128; 3]| {
            Arc::new(
                FixedSizeBinaryArray::try_from_iter(v.iter().map(|u| u.to_be_bytes())).unwrap(),
            ) as ArrayRef
        };
        let DataType::Struct(st) = arrow.field(16).data_type().clone() else {
            unreachable!()
        };
        let DataType::List(item) = arrow.field(17).data_type().clone() else {
            unreachable!()
        };
        let dec = |v: Vec<Option<i128>>, p, s| {
            Arc::new(
                Decimal128Array::from(v)
                    .with_precision_and_scale(p, s)
                    .unwrap(),
            ) as ArrayRef
        };
        let columns: Vec<ArrayRef> = vec![
            uuids([3 << 120, 1, u128::MAX]),
            Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
            Arc::new(Int32Array::from(vec![Some(-5), Some(7), None])),
            Arc::new(Int64Array::from(vec![Some(i64::MIN), Some(0), Some(42)])),
            Arc::new(Float32Array::from(vec![
                Some(f32::NAN),
                Some(-1.5),
                Some(2.5),
            ])),
            Arc::new(Float64Array::from(vec![None, Some(f64::NAN), Some(0.25)])),
            dec(vec![Some(-12345), Some(99), None], 9, 2),
            dec(vec![Some(10_i128.pow(17)), Some(-3), Some(0)], 18, 2),
            dec(vec![Some(-(10_i128.pow(37))), Some(5), None], 38, 10),
            Arc::new(Date32Array::from(vec![Some(-1), Some(20_000), None])),
            Arc::new(Time64MicrosecondArray::from(vec![
                Some(0),
                Some(86_399_999_999),
                None,
            ])),
            Arc::new(TimestampMicrosecondArray::from(vec![
                Some(-1),
                Some(1_700_000_000_000_000),
                None,
            ])),
            Arc::new(
                TimestampMicrosecondArray::from(vec![None, Some(5), Some(-5)])
                    .with_timezone("+00:00"),
            ),
            Arc::new(StringArray::from(vec![Some("é"), Some(""), Some("zz")])),
            Arc::new(LargeBinaryArray::from(vec![
                Some(&b"\x00\xff"[..]),
                None,
                Some(&b"a"[..]),
            ])),
            Arc::new(
                FixedSizeBinaryArray::try_from_iter(
                    [*b"abcd", *b"\x00\x00\x00\x01", *b"zzzz"].iter(),
                )
                .unwrap(),
            ),
            Arc::new(StructArray::new(
                st,
                vec![
                    Arc::new(Float64Array::from(vec![Some(f64::NAN), Some(1.0), None])),
                    uuids([7, 9, 8]),
                ],
                None,
            )),
            Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
                Some(vec![Some(1), Some(2)]),
                None,
                Some(vec![Some(-3)]),
            ]))
            .as_ref()
            .to_data()
            .into_builder()
            .data_type(DataType::List(item))
            .build()
            .map(arrow::array::make_array)
            .unwrap(),
        ];
        RecordBatch::try_new(arrow, columns).unwrap()
    }

    /// Writes `batch` through `builder` into `dir`/`name`.
    async fn write<B: FileWriterBuilder>(
        builder: B,
        dir: &std::path::Path,
        name: &str,
        batch: &RecordBatch,
    ) -> DataFile {
        let io = FileIO::new_with_fs();
        let path = dir.join(name).to_str().unwrap().to_string();
        let mut w = builder.build(io.new_output(&path).unwrap()).await.unwrap();
        w.write(batch).await.unwrap();
        w.write(&batch.slice(1, 2)).await.unwrap();
        let mut files = w.close().await.unwrap();
        assert_eq!(files.len(), 1);
        files.pop().unwrap().build().unwrap()
    }

    fn logical_types(path: &std::path::Path) -> HashMap<String, Option<LogicalType>> {
        let file = std::fs::File::open(path).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let descr = reader.parquet_schema();
        descr
            .columns()
            .iter()
            .map(|c| (c.path().string(), c.logical_type_ref().cloned()))
            .collect()
    }

    /// A file of two row groups whose second group's text is longer than
    /// Parquet's 64-byte statistics (truncated, not exact): the text
    /// column gets no bounds at all (the first group's alone would be too
    /// narrow, and readers would skip the file for the long value), while
    /// the integer column's span both groups.
    #[tokio::test]
    async fn a_row_group_without_exact_bounds_leaves_the_file_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                    NestedField::optional(2, "s", Type::Primitive(PrimitiveType::String)).into(),
                ])
                .build()
                .unwrap(),
        );
        let arrow = Arc::new(schema_to_arrow_schema(&schema).unwrap());
        let rows = |ids: Vec<i64>, s: Vec<String>| {
            RecordBatch::try_new(
                Arc::clone(&arrow),
                vec![
                    Arc::new(Int64Array::from(ids)) as ArrayRef,
                    Arc::new(StringArray::from(s)) as ArrayRef,
                ],
            )
            .unwrap()
        };
        let io = FileIO::new_with_fs();
        let path = dir.path().join("f.parquet").to_str().unwrap().to_string();
        let builder = ParquetFileWriterBuilder::try_new(WriterProperties::default(), schema)
            .unwrap()
            .with_row_group_bytes(1);
        let mut w = builder.build(io.new_output(&path).unwrap()).await.unwrap();
        w.write(&rows(vec![1, 2], vec!["b".into(), "c".into()]))
            .await
            .unwrap();
        w.write(&rows(vec![10, 20], vec!["a".repeat(100), "z".repeat(100)]))
            .await
            .unwrap();
        let file = w.close().await.unwrap().pop().unwrap().build().unwrap();
        assert_eq!(
            file.split_offsets().map(|o| o.len()),
            Some(2),
            "two row groups"
        );
        assert_eq!(file.lower_bounds().get(&1), Some(&Datum::long(1)));
        assert_eq!(file.upper_bounds().get(&1), Some(&Datum::long(20)));
        assert_eq!(file.lower_bounds().get(&2), None);
        assert_eq!(file.upper_bounds().get(&2), None);
        assert_eq!(file.null_value_counts().get(&2), Some(&0));
    }

    #[tokio::test]
    async fn uuid_columns_are_annotated_and_the_metrics_equal_iceberg_rusts() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(schema());
        let batch = batch(&schema);
        let props = WriterProperties::builder().build();
        let ours = write(
            ParquetFileWriterBuilder::try_new(props.clone(), schema.clone()).unwrap(),
            dir.path(),
            "ours.parquet",
            &batch,
        )
        .await;
        let theirs = write(
            ParquetWriterBuilder::new(props, schema.clone()),
            dir.path(),
            "theirs.parquet",
            &batch,
        )
        .await;

        // The annotation, on the top-level uuid and the one in a struct.
        let types = logical_types(&dir.path().join("ours.parquet"));
        assert_eq!(types["id"], Some(LogicalType::Uuid));
        assert_eq!(types["st.u"], Some(LogicalType::Uuid));
        assert_eq!(types["fx"], None, "a fixed(4) is not a uuid");
        assert_eq!(types["s"], Some(LogicalType::String));
        // iceberg-rust 0.10.1 leaves it off (why this writer exists); if
        // this fails, iceberg-rust annotates now and ours may go.
        let theirs_types = logical_types(&dir.path().join("theirs.parquet"));
        assert_eq!(theirs_types["id"], None);

        // Metrics equal iceberg-rust's, field by field, except that the
        // uuid fields (1 and 19) have no bounds (see `bound`).
        assert_eq!(ours.record_count(), 5);
        assert_eq!(ours.record_count(), theirs.record_count());
        assert_eq!(ours.column_sizes(), theirs.column_sizes());
        assert_eq!(ours.value_counts(), theirs.value_counts());
        assert_eq!(ours.null_value_counts(), theirs.null_value_counts());
        let but_uuids = |b: &HashMap<i32, Datum>| {
            let mut b = b.clone();
            assert!(b.remove(&1).is_some() && b.remove(&19).is_some());
            b
        };
        assert_eq!(ours.lower_bounds(), &but_uuids(theirs.lower_bounds()));
        assert_eq!(ours.upper_bounds(), &but_uuids(theirs.upper_bounds()));
        assert_eq!(ours.split_offsets(), theirs.split_offsets());
        assert_eq!(ours.content_type(), DataContentType::Data);
        let size = std::fs::metadata(dir.path().join("ours.parquet"))
            .unwrap()
            .len();
        assert_eq!(ours.file_size_in_bytes(), size);
        // Bounds of every primitive leaf but the uuids.
        let mut bounded: Vec<i32> = ours.lower_bounds().keys().copied().collect();
        bounded.sort();
        assert_eq!(
            bounded,
            vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 21]
        );
        assert_eq!(ours.upper_bounds()[&4], Datum::long(42));
        assert_eq!(ours.lower_bounds()[&7].to_string(), "-123.45");
        // NaNs: f has one in the first batch, d one in each, st.x one.
        assert_eq!(ours.nan_value_counts()[&5], 1);
        assert_eq!(ours.nan_value_counts()[&6], 2);
        assert_eq!(ours.nan_value_counts()[&18], 1);
        assert_eq!(ours.nan_value_counts(), theirs.nan_value_counts());

        // The values read back are the ones written.
        let file = std::fs::File::open(dir.path().join("ours.parquet")).unwrap();
        let read: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let read = arrow::compute::concat_batches(&read[0].schema(), &read).unwrap();
        let written =
            arrow::compute::concat_batches(&batch.schema(), &[batch.clone(), batch.slice(1, 2)])
                .unwrap();
        assert_eq!(read.num_rows(), 5);
        for (i, (a, b)) in read.columns().iter().zip(written.columns()).enumerate() {
            assert_eq!(a.to_data(), b.to_data(), "column {i}");
        }
    }

    #[tokio::test]
    async fn a_schema_without_uuids_keeps_the_derived_parquet_schema() {
        let schema = Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                ])
                .build()
                .unwrap(),
        );
        let b = ParquetFileWriterBuilder::try_new(WriterProperties::default(), schema).unwrap();
        assert!(b.parquet.is_none());
    }
}
