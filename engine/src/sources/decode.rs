//! Typed decoding of JSON row images (Debezium's `before` / `after`, a raw
//! record) straight into Arrow builders, one builder per declared column:
//! the value builders and text parsers every JSON-carrying source shares.
//!
//! A value is read as its encoding says ([`Logical`]: Kafka Connect's
//! logical types, from an event's schema part or the source's settings).
//! A value that does not fit its declared type is an error naming the field
//! and the value (the source adds where it was read); it is never coerced or
//! dropped.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    FixedSizeBinaryBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder,
    RecordBatch, StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
    UInt64Builder, new_null_array,
};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use serde::de;
use urutau_planner::context;
use urutau_planner::registry::SourceTableSchema;
use urutau_planner::types::{CanonicalType, UTC};

use super::datetime_text;
use super::debezium::ConnectFields;
use super::json_text::{self, shorten};
use crate::change_batch::{
    ContextBuilder, CoordinateBuilder, MessageBuilder, MessageMeta, RowKind,
};

/// The unit of an integer temporal value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnitOf {
    Days,
    Millis,
    Micros,
    Nanos,
}

/// How a column's JSON value is encoded (Kafka Connect's logical types, as
/// Debezium emits them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logical {
    /// The value as it reads: numbers, text forms, base64 for binary.
    Plain,
    /// `org.apache.kafka.connect.data.Decimal`: base64 of the big-endian
    /// two's-complement unscaled value at `scale` (a JSON number or decimal
    /// text is read as is).
    DecimalBytes { scale: i32 },
    /// `io.debezium.data.VariableScaleDecimal`: `{"scale": s, "value": base64}`.
    VariableDecimal,
    /// An integer count of `TimeUnitOf` since the epoch (or midnight, for
    /// a TIME column).
    Epoch(TimeUnitOf),
    /// `io.debezium.time.ZonedTime`: `HH:MM:SS[.f]Z` text.
    ZonedTime,
}

/// What a row image is, beside its text: the change's kind, context and
/// transport coordinate.
pub struct RowMeta<'a> {
    pub kind: RowKind,
    pub commit_ts: Option<i64>,
    pub snapshot: bool,
    /// Where it was read, for messages (a change file's line; a message's
    /// offset).
    pub line: u64,
    pub stream: &'a Arc<str>,
    pub shard: i32,
    pub sequence: i64,
    /// The message's fields, for a source of messages.
    pub message: MessageMeta<'a>,
    /// The encodings an event's schema part gives its fields, if it has one.
    pub connect: Option<&'a Arc<ConnectFields>>,
}

/// A row value that does not fit (carried as a serde error message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "field `{field}`: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

const EPOCH_DAYS_FROM_CE: i32 = 719_163;
const MICROS_PER_DAY: i64 = 86_400_000_000;

enum Builder {
    Bool(BooleanBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    UInt64(UInt64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Decimal(Decimal128Builder, u8, u8),
    Text(StringBuilder),
    Uuid(StringBuilder),
    Json(StringBuilder),
    Binary(BinaryBuilder),
    Fixed(FixedSizeBinaryBuilder, i32),
    Date(Date32Builder),
    Time(Time64MicrosecondBuilder),
    Timestamp(TimestampMicrosecondBuilder),
    TimestampTz(TimestampMicrosecondBuilder),
    /// Struct, list, map: raw JSON per row, decoded with arrow-json when the
    /// batch closes. `(line, raw)`; `None` is NULL.
    Nested(FieldRef, Vec<(u64, Option<String>)>),
}

struct Column {
    name: String,
    ty: CanonicalType,
    nullable: bool,
    builder: Builder,
    /// The encoding of its values in the row being decoded.
    logical: Logical,
    /// How its field starts in compact JSON (`"name":`); `None` when the
    /// name would need escapes there.
    field_start: Option<Box<[u8]>>,
}

/// `"name":`, the start of field `name` in compact JSON; `None` when the
/// name holds a character JSON escapes.
fn field_start(name: &str) -> Option<Box<[u8]>> {
    if name.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
        return None;
    }
    Some(format!("\"{name}\":").into_bytes().into_boxed_slice())
}

/// How much a new builder holds before it grows. After a batch, the next
/// one's columns get the room of the batch before: batches are about the
/// same size, and growing each column from empty again (a reallocation and
/// copy per doubling) was a tenth of a decoding lane's time.
#[derive(Debug, Clone, Copy)]
struct Room {
    rows: usize,
    /// Bytes of variable-width values (text, binary).
    bytes: usize,
}

impl Room {
    /// Before the first batch: Arrow's default (1,024 values).
    const FIRST: Room = Room {
        rows: 1024,
        bytes: 1024,
    };

    /// The room `array` took.
    fn of(array: &dyn Array) -> Room {
        let bytes = match array.data_type() {
            DataType::Utf8 => array.as_string::<i32>().value_data().len(),
            DataType::Binary => array.as_binary::<i32>().value_data().len(),
            _ => 0,
        };
        Room {
            rows: array.len(),
            bytes,
        }
    }
}

fn new_builder(ty: &CanonicalType, name: &str, room: Room) -> Builder {
    let Room { rows, bytes } = room;
    match ty {
        CanonicalType::Bool => Builder::Bool(BooleanBuilder::with_capacity(rows)),
        CanonicalType::Int32 => Builder::Int32(Int32Builder::with_capacity(rows)),
        CanonicalType::Int64 => Builder::Int64(Int64Builder::with_capacity(rows)),
        CanonicalType::UInt64 => Builder::UInt64(UInt64Builder::with_capacity(rows)),
        CanonicalType::Float32 => Builder::Float32(Float32Builder::with_capacity(rows)),
        CanonicalType::Float64 => Builder::Float64(Float64Builder::with_capacity(rows)),
        CanonicalType::Decimal { precision, scale } => Builder::Decimal(
            Decimal128Builder::with_capacity(rows)
                .with_precision_and_scale(*precision, *scale as i8)
                .expect("validated precision"),
            *precision,
            *scale,
        ),
        CanonicalType::String | CanonicalType::Unknown(_) => {
            Builder::Text(StringBuilder::with_capacity(rows, bytes))
        }
        CanonicalType::Uuid => Builder::Uuid(StringBuilder::with_capacity(rows, bytes)),
        CanonicalType::Json => Builder::Json(StringBuilder::with_capacity(rows, bytes)),
        CanonicalType::Binary => Builder::Binary(BinaryBuilder::with_capacity(rows, bytes)),
        CanonicalType::Fixed(n) => {
            Builder::Fixed(FixedSizeBinaryBuilder::with_capacity(rows, *n), *n)
        }
        CanonicalType::Date => Builder::Date(Date32Builder::with_capacity(rows)),
        CanonicalType::Time => Builder::Time(Time64MicrosecondBuilder::with_capacity(rows)),
        CanonicalType::Timestamp => {
            Builder::Timestamp(TimestampMicrosecondBuilder::with_capacity(rows))
        }
        CanonicalType::TimestampTz => {
            Builder::TimestampTz(TimestampMicrosecondBuilder::with_capacity(rows))
        }
        CanonicalType::Struct(_) | CanonicalType::List(_) | CanonicalType::Map(_, _) => {
            Builder::Nested(
                Arc::new(Field::new(name, ty.arrow_type(), true)),
                Vec::with_capacity(rows),
            )
        }
    }
}

/// Decodes the rows of one declared table.
pub struct TableDecoder {
    spec: SourceTableSchema,
    columns: Vec<Column>,
    /// Each column's encoding when an event carries no schema part.
    defaults: Vec<Logical>,
    /// The schema part the columns' encodings were last taken from.
    connect: Option<Arc<ConnectFields>>,
    index: foldhash::HashMap<String, usize>,
    set: Vec<bool>,
    context: ContextBuilder,
    /// The rows' coordinates, when the scan schema has the columns.
    coordinate: Option<CoordinateBuilder>,
    /// The rows' message fields, when the scan schema has the columns.
    message: Option<MessageBuilder>,
    schema: SchemaRef,
    source_table: String,
    /// Fields seen in the data that the declaration lacks (warned once).
    pub undeclared: Vec<String>,
    /// The declaration is a strict contract (`on_schema_mismatch =
    /// 'fail'`): a field it lacks, or a column a row image lacks, is an
    /// error rather than ignored or NULL.
    strict: bool,
    /// Rows decoded with a field the declaration lacks, since the last
    /// [`TableDecoder::take_mismatched_rows`].
    mismatched_rows: u64,
    /// The row being decoded has a field the declaration lacks.
    row_mismatched: bool,
    /// Row images are read by [`TableDecoder::read_compact_fields`] first
    /// (off only to test it against the general scan).
    compact_reads: bool,
}

impl TableDecoder {
    /// A decoder producing batches of `scan_schema` (data columns as
    /// declared, then the context columns).
    pub fn new(table: &SourceTableSchema, scan_schema: SchemaRef, source_table: String) -> Self {
        Self::with_encodings(
            table,
            scan_schema,
            source_table,
            vec![Logical::Plain; table.columns.len()],
        )
    }

    /// A decoder whose columns' values are encoded as `defaults` says (one
    /// per declared column) unless an event's schema part says otherwise.
    pub fn with_encodings(
        table: &SourceTableSchema,
        scan_schema: SchemaRef,
        source_table: String,
        defaults: Vec<Logical>,
    ) -> Self {
        assert_eq!(
            defaults.len(),
            table.columns.len(),
            "one encoding per column"
        );
        let columns: Vec<Column> = table
            .columns
            .iter()
            .zip(&defaults)
            .map(|(c, l)| Column {
                name: c.name.name.clone(),
                ty: c.ty.clone(),
                nullable: c.nullable,
                builder: new_builder(&c.ty, &c.name.name, Room::FIRST),
                logical: *l,
                field_start: field_start(&c.name.name),
            })
            .collect();
        let index = columns
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        TableDecoder {
            spec: table.clone(),
            set: vec![false; columns.len()],
            defaults,
            connect: None,
            columns,
            index,
            context: ContextBuilder::new(),
            coordinate: scan_schema
                .index_of(context::STREAM)
                .is_ok()
                .then(CoordinateBuilder::default),
            message: scan_schema
                .index_of(context::MSG_TS)
                .is_ok()
                .then(MessageBuilder::default),
            schema: scan_schema,
            source_table,
            undeclared: Vec::new(),
            strict: false,
            mismatched_rows: 0,
            row_mismatched: false,
            compact_reads: true,
        }
    }

    /// Makes the declaration a strict contract (`on_schema_mismatch =
    /// 'fail'`): a row with a field the declaration lacks, or without one
    /// of its columns, is a decode error naming the field.
    pub fn with_strict_schema(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The table's columns as planned (the declaration, grown by schema
    /// changes the run followed).
    pub fn schema(&self) -> &SourceTableSchema {
        &self.spec
    }

    /// How many rows had a field the declaration lacks (it was not read)
    /// since the last call.
    pub fn take_mismatched_rows(&mut self) -> u64 {
        std::mem::take(&mut self.mismatched_rows)
    }

    /// Rows decoded since the last batch.
    pub fn rows(&self) -> usize {
        self.context.len()
    }

    /// Gives the rows of the just-closed transaction their position.
    pub fn close_transaction(&mut self, position: &str) {
        self.context.close_transaction(position);
    }

    /// Rows of the transaction still open.
    pub fn open_rows(&self) -> usize {
        self.context.open_rows()
    }

    /// Drops every row decoded since the last batch (after a row failed
    /// half-way, the columns disagree on their length).
    pub fn reset(&mut self) {
        let defaults = std::mem::take(&mut self.defaults);
        let (strict, mismatched) = (self.strict, self.mismatched_rows);
        *self = TableDecoder::with_encodings(
            &self.spec.clone(),
            Arc::clone(&self.schema),
            std::mem::take(&mut self.source_table),
            defaults,
        )
        .with_strict_schema(strict);
        self.mismatched_rows = mismatched;
    }

    /// Takes the columns' encodings from an event's schema part (`None`:
    /// the defaults). Cheap when it is the part of the previous row.
    fn use_encodings(&mut self, connect: Option<&Arc<ConnectFields>>) {
        let same = match (connect, &self.connect) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if same {
            return;
        }
        for (c, d) in self.columns.iter_mut().zip(&self.defaults) {
            c.logical = connect
                .and_then(|f| f.fields.get(&c.name).copied())
                .unwrap_or(*d);
        }
        self.connect = connect.cloned();
    }

    /// Decodes `raw`, the text (a JSON object) of one row image.
    pub fn append_row(&mut self, raw: &str, row: &RowMeta<'_>) -> Result<(), DecodeError> {
        let (kind, line) = (row.kind, row.line);
        self.use_encodings(row.connect);
        self.set.iter_mut().for_each(|s| *s = false);
        self.row_mismatched = false;
        self.read_fields(raw, line)?;
        // Columns the image does not carry.
        let lenient = kind == RowKind::UpdateBefore;
        for i in 0..self.columns.len() {
            if !self.set[i] {
                let c = &mut self.columns[i];
                if !c.nullable && !lenient {
                    return Err(DecodeError {
                        field: Some(c.name.clone()),
                        message: "missing, and the column is declared NOT NULL".to_string(),
                    });
                }
                if self.strict && !lenient {
                    return Err(DecodeError {
                        field: Some(c.name.clone()),
                        message: "missing from the row, which declares it (on_schema_mismatch = 'fail'; 'ignore' reads it as NULL)".to_string(),
                    });
                }
                append_null(c, lenient, line)?;
            }
        }
        self.mismatched_rows += u64::from(self.row_mismatched);
        self.context.append(kind, row.commit_ts, row.snapshot);
        if let Some(c) = &mut self.coordinate {
            c.append(row.stream, row.shard, row.sequence);
        }
        if let Some(m) = &mut self.message {
            m.append(&row.message);
        }
        Ok(())
    }

    /// Decodes the fields of a row image into their columns' builders,
    /// from the image's text: a structural scan finds each field's text,
    /// which is read as its column's type says (no JSON values built).
    fn read_fields(&mut self, raw: &str, line: u64) -> Result<(), DecodeError> {
        // Images usually list the columns in their declared order: the
        // next one is tried before the name lookup.
        let (mut next, resume) = match self.read_compact_fields(raw, line)? {
            CompactRead::Whole => return Ok(()),
            CompactRead::Stopped { columns, at } => (columns, at),
        };
        let mut fields = match resume {
            None => json_text::fields(raw),
            Some(at) => json_text::fields_after(raw, at),
        };
        while let Some(field) = fields.next() {
            let (key, value) = field.map_err(|e| DecodeError {
                field: None,
                message: format!("the row image is not a JSON object: {e}"),
            })?;
            let at = |message: String| DecodeError {
                field: Some(key.to_string()),
                message,
            };
            let known = match self.columns.get(next) {
                Some(c) if json_text::same_name(&c.name, &key) => Some(next),
                _ => self.index.get(key.as_ref()).copied(),
            };
            let Some(i) = known else {
                if self.strict {
                    return Err(at("is not declared for the table (on_schema_mismatch = 'fail'; 'ignore' leaves it out and counts the row)".to_string()));
                }
                self.row_mismatched = true;
                if !self.undeclared.iter().any(|u| *u == key) {
                    self.undeclared.push(key.to_string());
                }
                continue;
            };
            next = i + 1;
            if self.set[i] {
                return Err(at("appears twice in the row".to_string()));
            }
            self.set[i] = true;
            append_value(&mut self.columns[i], value, fields.plain_string(), line).map_err(at)?;
        }
        Ok(())
    }

    /// Reads the fields of a row image written as Debezium and most
    /// writers write one: compact (no whitespace), every column in its
    /// declared order, scalar values. Each field is then found by
    /// comparing the text with the column's [`Column::field_start`], and
    /// its value's end by the value's kind, where the general scan
    /// ([`json_text::fields`]) looked for each name's end, then the
    /// `:`, then the value's end, then matched the name to a column: two
    /// thirds of a field's decoding. It stops, leaving the rest to the
    /// general scan, at the first field that is not so: that scan then
    /// reads it, and says what is wrong with it, exactly as it would
    /// have.
    fn read_compact_fields(&mut self, raw: &str, line: u64) -> Result<CompactRead, DecodeError> {
        let b = raw.as_bytes();
        let mut stopped = CompactRead::Stopped {
            columns: 0,
            at: None,
        };
        if !self.compact_reads || b.first() != Some(&b'{') {
            return Ok(stopped);
        }
        let mut i = 1;
        for (n, c) in self.columns.iter_mut().enumerate() {
            let Some(start) = &c.field_start else {
                break;
            };
            let at = i + start.len();
            let Some((end, plain)) = b
                .get(i..at)
                .filter(|name| json_text::same_bytes(name, start))
                .and_then(|_| json_text::compact_value(b, at))
            else {
                break;
            };
            let delimiter = match b.get(end) {
                Some(&d @ (b',' | b'}')) => d,
                _ => break,
            };
            // Cut next to ASCII bytes (the quote and colon before, the
            // delimiter after; a string's quotes): character boundaries.
            let value = &raw[at..end];
            let plain = plain.then(|| &raw[at + 1..end - 1]);
            self.set[n] = true;
            append_value(c, value, plain, line).map_err(|message| DecodeError {
                field: Some(c.name.clone()),
                message,
            })?;
            if delimiter == b'}' && end + 1 == b.len() {
                return Ok(CompactRead::Whole);
            }
            stopped = CompactRead::Stopped {
                columns: n + 1,
                at: Some(end),
            };
            if delimiter == b'}' {
                break;
            }
            i = end + 1;
        }
        Ok(stopped)
    }

    /// The rows decoded so far as one batch (every transaction closed).
    pub fn finish(&mut self, ingest_ts_micros: i64) -> Result<RecordBatch, DecodeError> {
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for c in &mut self.columns {
            let array = finish_builder(&mut c.builder)?;
            c.builder = new_builder(&c.ty, &c.name, Room::of(&array));
            arrays.push(array);
        }
        arrays.extend(self.context.finish(ingest_ts_micros, &self.source_table));
        if let Some(c) = &mut self.coordinate {
            arrays.extend(c.finish());
        }
        if let Some(m) = &mut self.message {
            arrays.extend(m.finish());
        }
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| DecodeError {
            field: None,
            message: format!("internal: {e}"),
        })
    }
}

/// How far [`TableDecoder::read_compact_fields`] read a row image.
enum CompactRead {
    /// Every field, and the image's end.
    Whole,
    /// The first `columns` columns, up to the delimiter at byte `at`
    /// after the last (`None`: not a field).
    Stopped { columns: usize, at: Option<usize> },
}

fn finish_builder(b: &mut Builder) -> Result<ArrayRef, DecodeError> {
    Ok(match b {
        Builder::Bool(b) => Arc::new(b.finish()),
        Builder::Int32(b) => Arc::new(b.finish()),
        Builder::Int64(b) => Arc::new(b.finish()),
        Builder::UInt64(b) => Arc::new(b.finish()),
        Builder::Float32(b) => Arc::new(b.finish()),
        Builder::Float64(b) => Arc::new(b.finish()),
        Builder::Decimal(b, p, s) => Arc::new(
            b.finish()
                .with_precision_and_scale(*p, *s as i8)
                .expect("validated precision"),
        ),
        Builder::Text(b) | Builder::Uuid(b) | Builder::Json(b) => Arc::new(b.finish()),
        Builder::Binary(b) => Arc::new(b.finish()),
        Builder::Fixed(b, _) => Arc::new(b.finish()),
        Builder::Date(b) => Arc::new(b.finish()),
        Builder::Time(b) => Arc::new(b.finish()),
        Builder::Timestamp(b) => Arc::new(b.finish()),
        Builder::TimestampTz(b) => Arc::new(b.finish().with_timezone(UTC)),
        Builder::Nested(field, rows) => {
            let rows = std::mem::take(rows);
            decode_nested(field, &rows)?
        }
    })
}

/// Decodes nested values with arrow-json; on failure, finds the row at fault
/// so the error can name its line.
fn decode_nested(
    field: &FieldRef,
    rows: &[(u64, Option<String>)],
) -> Result<ArrayRef, DecodeError> {
    let decode = |rows: &[(u64, Option<String>)]| -> Result<ArrayRef, String> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "v",
            field.data_type().clone(),
            true,
        )]));
        let mut decoder = arrow::json::ReaderBuilder::new(schema)
            .with_batch_size(rows.len().max(1))
            .with_strict_mode(true)
            .build_decoder()
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        for (_, raw) in rows {
            match raw {
                Some(r) => {
                    text.push_str("{\"v\":");
                    text.push_str(r);
                    text.push_str("}\n");
                }
                None => text.push_str("{\"v\":null}\n"),
            }
        }
        decoder.decode(text.as_bytes()).map_err(|e| e.to_string())?;
        match decoder.flush().map_err(|e| e.to_string())? {
            Some(batch) => Ok(Arc::clone(batch.column(0))),
            None => Ok(new_null_array(field.data_type(), 0)),
        }
    };
    match decode(rows) {
        Ok(a) => Ok(a),
        Err(batch_error) => {
            for row in rows {
                if let Err(e) = decode(std::slice::from_ref(row)) {
                    return Err(DecodeError {
                        field: Some(field.name().clone()),
                        message: format!(
                            "line {}: value {} does not fit {}: {e}",
                            row.0,
                            shorten(row.1.as_deref().unwrap_or("null")),
                            CanonicalType::from_arrow(field.data_type())
                                .map_or("?".into(), |t| t.to_string())
                        ),
                    });
                }
            }
            Err(DecodeError {
                field: Some(field.name().clone()),
                message: batch_error,
            })
        }
    }
}

fn append_null(c: &mut Column, lenient: bool, line: u64) -> Result<(), DecodeError> {
    if !c.nullable {
        if !lenient {
            return Err(DecodeError {
                field: Some(c.name.clone()),
                message: "is NULL, and the column is declared NOT NULL".to_string(),
            });
        }
        // An update's before image may lack non-key columns (REPLICA
        // IDENTITY DEFAULT); only its key is ever used, so a zero value
        // stands in for what the image does not carry.
        append_default(&mut c.builder, line);
        return Ok(());
    }
    match &mut c.builder {
        Builder::Bool(b) => b.append_null(),
        Builder::Int32(b) => b.append_null(),
        Builder::Int64(b) => b.append_null(),
        Builder::UInt64(b) => b.append_null(),
        Builder::Float32(b) => b.append_null(),
        Builder::Float64(b) => b.append_null(),
        Builder::Decimal(b, ..) => b.append_null(),
        Builder::Text(b) | Builder::Uuid(b) | Builder::Json(b) => b.append_null(),
        Builder::Binary(b) => b.append_null(),
        Builder::Fixed(b, _) => b.append_null(),
        Builder::Date(b) => b.append_null(),
        Builder::Time(b) => b.append_null(),
        Builder::Timestamp(b) | Builder::TimestampTz(b) => b.append_null(),
        Builder::Nested(_, rows) => rows.push((line, None)),
    }
    Ok(())
}

fn append_default(b: &mut Builder, line: u64) {
    match b {
        Builder::Bool(b) => b.append_value(false),
        Builder::Int32(b) => b.append_value(0),
        Builder::Int64(b) => b.append_value(0),
        Builder::UInt64(b) => b.append_value(0),
        Builder::Float32(b) => b.append_value(0.0),
        Builder::Float64(b) => b.append_value(0.0),
        Builder::Decimal(b, ..) => b.append_value(0),
        Builder::Text(b) | Builder::Json(b) => b.append_value(""),
        Builder::Uuid(b) => b.append_value("00000000-0000-0000-0000-000000000000"),
        Builder::Binary(b) => b.append_value([]),
        Builder::Fixed(b, n) => b.append_value(vec![0u8; *n as usize]).expect("right width"),
        Builder::Date(b) => b.append_value(0),
        Builder::Time(b) => b.append_value(0),
        Builder::Timestamp(b) | Builder::TimestampTz(b) => b.append_value(0),
        Builder::Nested(f, rows) => rows.push((
            line,
            Some(match f.data_type() {
                arrow::datatypes::DataType::List(_) => "[]".to_string(),
                _ => "{}".to_string(),
            }),
        )),
    }
}

/// The raw JSON text of the named top-level fields of a JSON object,
/// scanning only as far as the last of them. `None` when the text is not a
/// plain object: the caller then decides the conservative way.
pub fn top_level_fields<'a>(raw: &'a str, wanted: &[String]) -> Option<Vec<Option<&'a str>>> {
    let mut found = vec![None; wanted.len()];
    top_level_fields_into(raw, wanted, &mut found).then_some(found)
}

/// Whether the named top-level fields differ between two JSON objects
/// (true too when either is not a plain object: the conservative answer).
/// No allocation for up to four fields: it runs for every update.
pub fn top_level_fields_differ(a: &str, b: &str, wanted: &[String]) -> bool {
    const INLINE: usize = 4;
    if wanted.len() > INLINE {
        return match (top_level_fields(a, wanted), top_level_fields(b, wanted)) {
            (Some(x), Some(y)) => x != y,
            _ => true,
        };
    }
    let (mut x, mut y) = ([None; INLINE], [None; INLINE]);
    let n = wanted.len();
    !(top_level_fields_into(a, wanted, &mut x[..n])
        && top_level_fields_into(b, wanted, &mut y[..n])
        && x[..n] == y[..n])
}

/// [`top_level_fields`] into `found` (one slot per wanted name, `None`
/// on entry); false when the text is not a plain object.
fn top_level_fields_into<'a>(
    raw: &'a str,
    wanted: &[String],
    found: &mut [Option<&'a str>],
) -> bool {
    let mut left = wanted.len();
    for field in json_text::fields(raw) {
        let Ok((key, value)) = field else {
            return false;
        };
        if let Some(k) = wanted.iter().position(|w| json_text::same_name(w, &key))
            && found[k].is_none()
        {
            found[k] = Some(value);
            left -= 1;
            if left == 0 {
                return true;
            }
        }
    }
    true
}

/// Appends one field's value, from its JSON text, to its column;
/// `plain` is the content of a string value without escapes, when the
/// scan of the row knows it is one (`None`: read `raw` as it is).
fn append_value(
    column: &mut Column,
    raw: &str,
    plain: Option<&str>,
    line: u64,
) -> Result<(), String> {
    // The commonest values of a row, read straight into their builders:
    // through the general reader below (the value's kind, then the
    // column's) a short integer cost three times as much.
    if column.logical == Logical::Plain {
        match &mut column.builder {
            Builder::Int64(b) => {
                if let Some(n) = json_text::short_integer(raw.as_bytes()) {
                    b.append_value(n);
                    return Ok(());
                }
            }
            Builder::Int32(b) => {
                if let Some(n) = json_text::short_integer(raw.as_bytes())
                    && let Ok(n) = i32::try_from(n)
                {
                    b.append_value(n);
                    return Ok(());
                }
            }
            Builder::Text(b) if !matches!(column.ty, CanonicalType::Unknown(_)) => {
                if let Some(text) = plain {
                    b.append_value(text);
                    return Ok(());
                }
            }
            _ => {}
        }
    }
    let raw_path = matches!(
        column.builder,
        Builder::Decimal(..) | Builder::Json(_) | Builder::Nested(..)
    ) || matches!(column.ty, CanonicalType::Unknown(_))
        || matches!(
            column.logical,
            Logical::DecimalBytes { .. } | Logical::VariableDecimal
        );
    if raw_path {
        return append_raw(column, raw, plain, line);
    }
    let v = ValueVisitor { column };
    let done: Result<(), de::value::Error> = match raw.as_bytes().first() {
        Some(b'"') => match plain {
            Some(text) => v.visit_str(text),
            None => v.visit_str(&json_text::string(raw)?),
        },
        Some(b'{') => Err(v.fail("{...}")),
        Some(b'[') => Err(v.fail("[...]")),
        _ => match raw {
            "null" => v.visit_unit(),
            "true" => v.visit_bool(true),
            "false" => v.visit_bool(false),
            _ => match json_text::number(raw)? {
                json_text::Number::I64(n) => v.visit_i64(n),
                json_text::Number::U64(n) => v.visit_u64(n),
                json_text::Number::F64(n) => v.visit_f64(n),
            },
        },
    };
    done.map_err(|e| e.to_string())
}

fn mismatch(value: &str, ty: &CanonicalType) -> String {
    format!("value {} does not fit {ty}", shorten(value))
}

/// Decimals, JSON, unknown and nested values, from their raw JSON text
/// (`plain`: as for [`append_value`]).
fn append_raw(c: &mut Column, raw: &str, plain: Option<&str>, line: u64) -> Result<(), String> {
    if raw == "null" {
        return append_null(c, false, line).map_err(|e| e.message);
    }
    if let Some(unscaled) = encoded_decimal(c.logical, raw)? {
        let (v, scale) = unscaled;
        return match &mut c.builder {
            Builder::Decimal(b, p, s) => {
                let v = rescale(v, scale, *s as i32, *p).map_err(|why| {
                    format!("{} ({why})", mismatch(&decimal_text(v, scale), &c.ty))
                })?;
                b.append_value(v);
                Ok(())
            }
            Builder::Text(b) => {
                b.append_value(decimal_text(v, scale));
                Ok(())
            }
            Builder::Float64(b) => {
                b.append_value(decimal_text(v, scale).parse::<f64>().unwrap_or(f64::NAN));
                Ok(())
            }
            _ => Err(mismatch(&decimal_text(v, scale), &c.ty)),
        };
    }
    match &mut c.builder {
        Builder::Decimal(b, p, s) => {
            let text: Cow<str> = match plain {
                Some(text) => Cow::Borrowed(text),
                None if raw.starts_with('"') => json_text::string(raw)?,
                None => Cow::Borrowed(raw),
            };
            let v = parse_decimal(&text, *p, *s).map_err(|why| {
                let hint = if base64::engine::general_purpose::STANDARD.decode(text.as_ref()).is_ok() {
                    " (a Kafka Connect decimal, as Debezium emits by default? set decimal_handling = 'precise' on the source)"
                } else {
                    ""
                };
                format!("{} ({why}){hint}", mismatch(raw, &c.ty))
            })?;
            b.append_value(v);
        }
        Builder::Json(b) | Builder::Text(b) => {
            // A JSON string carries its text (Debezium's Json type is a
            // string holding JSON); anything else is kept as JSON text,
            // once it is known to be JSON (the row's scan checked only its
            // brackets).
            if let Some(text) = plain {
                b.append_value(text);
            } else if raw.starts_with('"') {
                b.append_value(json_text::string(raw)?);
            } else {
                serde_json::from_str::<de::IgnoredAny>(raw)
                    .map_err(|e| format!("{} is not JSON: {e}", shorten(raw)))?;
                b.append_value(raw);
            }
        }
        Builder::Nested(_, rows) => rows.push((line, Some(raw.to_string()))),
        _ => unreachable!("raw path only for decimal, json, unknown and nested"),
    }
    Ok(())
}

/// A Connect-encoded decimal (`DecimalBytes` as base64 text,
/// `VariableDecimal` as its object): the unscaled value and its scale.
/// `None` when the value is not in that encoding (a JSON number or decimal
/// text of a column declared DECIMAL is read as is).
fn encoded_decimal(logical: Logical, raw: &str) -> Result<Option<(i128, i32)>, String> {
    match logical {
        Logical::DecimalBytes { scale } => {
            let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
                return Ok(None);
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(inner)
                .map_err(|_| {
                    format!(
                        "value {} is not a Kafka Connect decimal (base64 of the unscaled value at scale {scale}): set decimal_handling to how the connector encodes decimals",
                        shorten(raw)
                    )
                })?;
            Ok(Some((unscaled_from_bytes(&bytes, raw)?, scale)))
        }
        Logical::VariableDecimal => {
            #[derive(serde::Deserialize)]
            struct Variable {
                scale: i32,
                value: String,
            }
            let v: Variable = serde_json::from_str(raw).map_err(|_| {
                format!(
                    "value {} is not a VariableScaleDecimal ({{\"scale\": n, \"value\": base64}})",
                    shorten(raw)
                )
            })?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&v.value)
                .map_err(|_| format!("value {}: `value` is not base64", shorten(raw)))?;
            Ok(Some((unscaled_from_bytes(&bytes, raw)?, v.scale)))
        }
        _ => Ok(None),
    }
}

/// A big-endian two's-complement integer (Java's `BigInteger.toByteArray`).
fn unscaled_from_bytes(bytes: &[u8], raw: &str) -> Result<i128, String> {
    if bytes.is_empty() {
        return Ok(0);
    }
    if bytes.len() > 16 {
        return Err(format!(
            "value {} holds {} bytes: more than 38 digits",
            shorten(raw),
            bytes.len()
        ));
    }
    let fill = if bytes[0] & 0x80 != 0 { 0xFF } else { 0 };
    let mut full = [fill; 16];
    full[16 - bytes.len()..].copy_from_slice(bytes);
    Ok(i128::from_be_bytes(full))
}

/// `v` at `from` digits of scale, exactly at `to` within `precision`.
fn rescale(v: i128, from: i32, to: i32, precision: u8) -> Result<i128, String> {
    let out = if to >= from {
        10i128
            .checked_pow((to - from) as u32)
            .and_then(|m| v.checked_mul(m))
            .ok_or("too many digits")?
    } else {
        let d = 10i128
            .checked_pow((from - to) as u32)
            .ok_or("too many digits")?;
        if v % d != 0 {
            return Err(format!("more than {to} fraction digits"));
        }
        v / d
    };
    if out.unsigned_abs() >= 10u128.pow(precision as u32) {
        return Err(format!("more than {precision} digits"));
    }
    Ok(out)
}

/// The decimal text of `v` at `scale` (`1050`, 2 -> `10.50`).
pub(crate) fn decimal_text(v: i128, scale: i32) -> String {
    if scale <= 0 {
        let mut t = v.to_string();
        if v != 0 {
            t.extend(std::iter::repeat_n('0', (-scale) as usize));
        }
        return t;
    }
    let digits = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = if digits.len() <= scale {
        format!("{}{digits}", "0".repeat(scale - digits.len() + 1))
    } else {
        digits
    };
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{}{int}.{frac}", if v < 0 { "-" } else { "" })
}

/// Parses decimal text exactly into an integer scaled by `scale`; more
/// fraction digits than `scale` or more digits than `precision` is an
/// error, never a rounding.
pub fn parse_decimal(text: &str, precision: u8, scale: u8) -> Result<i128, String> {
    let b = text.trim().as_bytes();
    if let Some(v) = parse_short_decimal(b, precision, scale) {
        return Ok(v);
    }
    match parse_plain_decimal(b, precision, scale) {
        Some(r) => r,
        None => parse_decimal_general(text, precision, scale),
    }
}

/// Powers of ten up to 10^38, the largest an `i128` decimal holds.
const POW10: [i128; 39] = {
    let mut p = [1i128; 39];
    let mut i = 1;
    while i < 39 {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

/// Whether the unscaled value `v` (not negative) has more digits than
/// `precision` (a declared precision is at most 38, the most an `i128`
/// decimal holds; past that no bound is checked here).
fn beyond_precision(v: i128, precision: u8) -> bool {
    POW10
        .get(usize::from(precision))
        .is_some_and(|&bound| v >= bound)
}

/// `[-+]digits[.digits]` of at most 18 digits (a `u64` holds them without
/// overflow checks) at most `scale` of them after the point: most
/// decimals of a change stream. `None` for anything else, error or not,
/// which [`parse_plain_decimal`] then reads from the start. Its `i128`
/// arithmetic, checked at every digit, and the power it raised for the
/// precision were a twentieth of a decoding lane, for one decimal column.
#[inline]
fn parse_short_decimal(b: &[u8], precision: u8, scale: u8) -> Option<i128> {
    let (neg, digits) = match b.first()? {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut v: u64 = 0;
    let mut point = None;
    for (k, &c) in digits.iter().enumerate() {
        let d = c.wrapping_sub(b'0');
        if d <= 9 {
            v = v * 10 + u64::from(d);
        } else if c == b'.' && point.is_none() {
            point = Some(k);
        } else {
            return None;
        }
    }
    let frac = match point {
        // Digits on both sides of the point, as the plain reader wants
        // at least one digit in all.
        Some(k) if k == 0 || k + 1 == digits.len() => return None,
        Some(k) => digits.len() - k - 1,
        None if digits.len() > 18 => return None,
        None => 0,
    };
    if frac > usize::from(scale) || precision > 38 || scale > 38 {
        return None;
    }
    let v = i128::from(v).checked_mul(POW10[usize::from(scale) - frac])?;
    if beyond_precision(v, precision) {
        return None;
    }
    Some(if neg { -v } else { v })
}

/// `[-+]digits[.digits]` without allocating; `None` for other forms
/// (exponents), which take the general path.
fn parse_plain_decimal(b: &[u8], precision: u8, scale: u8) -> Option<Result<i128, String>> {
    let (neg, digits) = match b.first()? {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    let mut v: i128 = 0;
    let mut frac = 0u32;
    let mut dot = false;
    let mut any = false;
    for &c in digits {
        match c {
            b'0'..=b'9' => {
                any = true;
                if dot {
                    if frac >= scale as u32 {
                        // Digits past the scale must be zeros: they lose nothing.
                        if c != b'0' {
                            return Some(Err(format!("more than {scale} fraction digits")));
                        }
                        continue;
                    }
                    frac += 1;
                }
                v = match v
                    .checked_mul(10)
                    .and_then(|x| x.checked_add((c - b'0') as i128))
                {
                    Some(x) => x,
                    None => return Some(Err("too many digits".into())),
                };
            }
            b'.' if !dot => dot = true,
            b'e' | b'E' => return None,
            _ => return Some(Err("not a number".into())),
        }
    }
    if !any {
        return Some(Err("not a number".into()));
    }
    for _ in frac..scale as u32 {
        v = match v.checked_mul(10) {
            Some(x) => x,
            None => return Some(Err("too many digits".into())),
        };
    }
    if beyond_precision(v, precision) {
        return Some(Err(format!("more than {precision} digits")));
    }
    Some(Ok(if neg { -v } else { v }))
}

fn parse_decimal_general(text: &str, precision: u8, scale: u8) -> Result<i128, String> {
    let t = text.trim();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => (
            &t[..i],
            t[i + 1..]
                .parse::<i32>()
                .map_err(|_| "bad exponent".to_string())?,
        ),
        None => (t, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return Err("not a number".into());
    }
    let mut digits: String = format!("{int_part}{frac_part}");
    let mut frac_len = frac_part.len() as i32 - exp;
    if frac_len < 0 {
        digits.extend(std::iter::repeat_n('0', (-frac_len) as usize));
        frac_len = 0;
    }
    let frac_len = frac_len as usize;
    // Strip trailing zeros beyond the scale: they lose nothing.
    let mut digits = digits.as_str();
    let mut frac_len = frac_len;
    while frac_len > scale as usize && digits.ends_with('0') {
        digits = &digits[..digits.len() - 1];
        frac_len -= 1;
    }
    if frac_len > scale as usize {
        return Err(format!("more than {scale} fraction digits"));
    }
    let padded = format!("{digits}{}", "0".repeat(scale as usize - frac_len));
    let significant = padded.trim_start_matches('0');
    if significant.len() > precision as usize {
        return Err(format!("more than {precision} digits"));
    }
    let v: i128 = if significant.is_empty() {
        0
    } else {
        significant
            .parse()
            .map_err(|_| "too many digits".to_string())?
    };
    Ok(if neg { -v } else { v })
}

fn parse_date(s: &str) -> Option<i32> {
    let d = NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?;
    Some(chrono::Datelike::num_days_from_ce(&d) - EPOCH_DAYS_FROM_CE)
}

fn parse_time(s: &str) -> Option<i64> {
    let t = NaiveTime::parse_from_str(s, "%H:%M:%S%.f").ok()?;
    Some(t.num_seconds_from_midnight() as i64 * 1_000_000 + (t.nanosecond() as i64 / 1000))
}

/// `HH:MM:SS[.f]` with a zone (`Z`, `+01:00`): the UTC time of day.
fn parse_zoned_time(s: &str) -> Option<i64> {
    let (time, offset_secs) = if let Some(t) = s.strip_suffix('Z') {
        (t, 0i64)
    } else {
        let at = s.rfind(['+', '-'])?;
        let (t, z) = s.split_at(at);
        let sign = if z.starts_with('-') { -1 } else { 1 };
        let (h, m) = z[1..].split_once(':').unwrap_or((&z[1..], "0"));
        (
            t,
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60),
        )
    };
    let local = parse_time(time)?;
    Some((local - offset_secs * 1_000_000).rem_euclid(MICROS_PER_DAY))
}

fn parse_naive_timestamp(s: &str) -> Option<i64> {
    if let Some(p) = datetime_text::parse(s.as_bytes()) {
        return match p.offset_secs {
            None => exact_micros(p.local_secs, p.nanos),
            // chrono's formats below refuse a zone.
            Some(_) => None,
        };
    }
    let dt = NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .or_else(|_| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f"))
        .ok()?;
    exact_micros(
        dt.and_utc().timestamp(),
        dt.and_utc().timestamp_subsec_nanos(),
    )
}

fn parse_zoned_timestamp(s: &str) -> Option<i64> {
    if let Some(p) = datetime_text::parse(s.as_bytes()) {
        // Without a zone: chrono's formats below refuse it too.
        let offset = p.offset_secs?;
        return exact_micros(p.local_secs - i64::from(offset), p.nanos);
    }
    let dt = DateTime::parse_from_rfc3339(s)
        .or_else(|_| DateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .ok()?;
    exact_micros(dt.timestamp(), dt.timestamp_subsec_nanos())
}

/// Microseconds, refusing sub-microsecond digits (they would be lost).
fn exact_micros(secs: i64, nanos: u32) -> Option<i64> {
    if !nanos.is_multiple_of(1000) {
        return None;
    }
    secs.checked_mul(1_000_000)?
        .checked_add((nanos / 1000) as i64)
}

fn normalize_uuid(s: &str) -> Option<String> {
    let u = uuid::Uuid::parse_str(s).ok()?;
    Some(u.hyphenated().to_string())
}

struct ValueVisitor<'a> {
    column: &'a mut Column,
}

impl ValueVisitor<'_> {
    fn fail<E: de::Error>(&self, shown: &str) -> E {
        E::custom(mismatch(shown, &self.column.ty))
    }

    fn int<E: de::Error>(self, v: i64) -> Result<(), E> {
        let out_of_range = |ty: &CanonicalType| E::custom(mismatch(&v.to_string(), ty));
        // An epoch count in another unit than the column's microseconds.
        let micros = |v: i64| -> Option<i64> {
            match self.column.logical {
                Logical::Epoch(TimeUnitOf::Millis) => v.checked_mul(1000),
                Logical::Epoch(TimeUnitOf::Nanos) => (v % 1000 == 0).then_some(v / 1000),
                Logical::Epoch(TimeUnitOf::Days) => v.checked_mul(MICROS_PER_DAY),
                _ => Some(v),
            }
        };
        if matches!(
            self.column.builder,
            Builder::Time(_) | Builder::Timestamp(_) | Builder::TimestampTz(_)
        ) {
            let ty = self.column.ty.clone();
            let m = micros(v).ok_or_else(|| {
                E::custom(format!(
                    "{} (nanoseconds that a microsecond column would lose)",
                    mismatch(&v.to_string(), &ty)
                ))
            })?;
            match &mut self.column.builder {
                Builder::Time(b) if (0..MICROS_PER_DAY).contains(&m) => b.append_value(m),
                Builder::Timestamp(b) | Builder::TimestampTz(b) => b.append_value(m),
                _ => return Err(out_of_range(&ty)),
            }
            return Ok(());
        }
        match &mut self.column.builder {
            Builder::Int32(b) => {
                b.append_value(i32::try_from(v).map_err(|_| out_of_range(&CanonicalType::Int32))?)
            }
            Builder::Int64(b) => b.append_value(v),
            Builder::UInt64(b) if v >= 0 => b.append_value(v as u64),
            Builder::Float32(b) if (v as f32) as i64 == v => b.append_value(v as f32),
            Builder::Float64(b) if (v as f64) as i64 == v => b.append_value(v as f64),
            Builder::Date(b) => {
                b.append_value(i32::try_from(v).map_err(|_| out_of_range(&CanonicalType::Date))?)
            }
            _ => return Err(self.fail(&v.to_string())),
        }
        Ok(())
    }
}

/// Each kind of JSON value, appended to the column (the text of a field
/// is dispatched by [`append_value`]).
impl ValueVisitor<'_> {
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        append_null(self.column, false, 0).map_err(|e| E::custom(e.message))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        match &mut self.column.builder {
            Builder::Bool(b) => {
                b.append_value(v);
                Ok(())
            }
            _ => Err(self.fail(&v.to_string())),
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.int(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        if let Ok(i) = i64::try_from(v) {
            return self.int(i);
        }
        match &mut self.column.builder {
            Builder::UInt64(b) => {
                b.append_value(v);
                Ok(())
            }
            _ => Err(self.fail(&v.to_string())),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        match &mut self.column.builder {
            Builder::Float64(b) => b.append_value(v),
            Builder::Float32(b) => {
                let f = v as f32;
                if v.is_finite() && !f.is_finite() {
                    return Err(self.fail(&v.to_string()));
                }
                b.append_value(f)
            }
            _ => return Err(self.fail(&v.to_string())),
        }
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        let shown = || format!("\"{v}\"");
        let ok = match &mut self.column.builder {
            Builder::Text(b) => {
                b.append_value(v);
                true
            }
            Builder::Uuid(b) => match normalize_uuid(v) {
                Some(u) => {
                    b.append_value(u);
                    true
                }
                None => false,
            },
            Builder::Binary(b) => match base64::engine::general_purpose::STANDARD.decode(v) {
                Ok(bytes) => {
                    b.append_value(bytes);
                    true
                }
                Err(_) => false,
            },
            Builder::Fixed(b, n) => match base64::engine::general_purpose::STANDARD.decode(v) {
                Ok(bytes) if bytes.len() == *n as usize => {
                    b.append_value(bytes).expect("width checked");
                    true
                }
                Ok(bytes) => {
                    return Err(E::custom(format!(
                        "value {} holds {} bytes, and FIXED({n}) needs exactly {n}",
                        shorten(&shown()),
                        bytes.len()
                    )));
                }
                Err(_) => false,
            },
            Builder::Date(b) => match parse_date(v) {
                Some(d) => {
                    b.append_value(d);
                    true
                }
                None => false,
            },
            Builder::Time(b) if self.column.logical == Logical::ZonedTime => {
                match parse_zoned_time(v) {
                    Some(t) => {
                        b.append_value(t);
                        true
                    }
                    None => false,
                }
            }
            Builder::Time(b) => match parse_time(v) {
                Some(t) => {
                    b.append_value(t);
                    true
                }
                None => false,
            },
            Builder::Timestamp(b) => match parse_naive_timestamp(v) {
                Some(t) => {
                    b.append_value(t);
                    true
                }
                None => false,
            },
            Builder::TimestampTz(b) => match parse_zoned_timestamp(v) {
                Some(t) => {
                    b.append_value(t);
                    true
                }
                None => false,
            },
            Builder::Float64(b) => match v {
                "NaN" => {
                    b.append_value(f64::NAN);
                    true
                }
                "Infinity" => {
                    b.append_value(f64::INFINITY);
                    true
                }
                "-Infinity" => {
                    b.append_value(f64::NEG_INFINITY);
                    true
                }
                _ => false,
            },
            Builder::Float32(b) => match v {
                "NaN" => {
                    b.append_value(f32::NAN);
                    true
                }
                "Infinity" => {
                    b.append_value(f32::INFINITY);
                    true
                }
                "-Infinity" => {
                    b.append_value(f32::NEG_INFINITY);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if ok { Ok(()) } else { Err(self.fail(&shown())) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use urutau_planner::spec::{ColumnSpec, Ident};

    /// A decoder of a table of every scalar kind and a JSON column.
    fn decoder_of_many_kinds() -> TableDecoder {
        let column = |name: &str, ty: CanonicalType, nullable: bool| ColumnSpec {
            name: Ident::new(name, Default::default()),
            ty,
            nullable,
        };
        let table = SourceTableSchema {
            columns: vec![
                column("id", CanonicalType::Int64, false),
                column("qty", CanonicalType::Int32, true),
                column("name", CanonicalType::String, true),
                column(
                    "amount",
                    CanonicalType::Decimal {
                        precision: 10,
                        scale: 2,
                    },
                    true,
                ),
                column("at", CanonicalType::TimestampTz, true),
                column("ok", CanonicalType::Bool, true),
                column("doc", CanonicalType::Json, true),
                column("ratio", CanonicalType::Float64, true),
            ],
            primary_key: vec!["id".into()],
            dropped: vec![],
        };
        let scan = urutau_planner::bind::scan_schema(&table, context::Transport::None);
        TableDecoder::new(&table, scan, "t".to_string())
    }

    #[test]
    fn compact_row_images_decode_as_the_general_scan_decodes_them() {
        let images = [
            // Compact, in order: every field taken by the compact reader.
            r#"{"id":1,"qty":2,"name":"a","amount":"3.50","at":"2024-01-02T03:04:05Z","ok":true,"doc":"{}","ratio":0.5}"#,
            r#"{"id":-7,"qty":null,"name":null,"amount":null,"at":null,"ok":false,"doc":null,"ratio":null}"#,
            r#"{"id":1,"qty":2,"name":"with \"quotes\" and \\","amount":3.5,"at":"2024-01-02T03:04:05.123456+02:00","ok":null,"doc":"[1]","ratio":-1e3}"#,
            r#"{"id":1,"qty":2,"name":"é ü","amount":"-0.01","at":"2024-01-02 03:04:05Z","ok":true,"doc":"1","ratio":12}"#,
            // Fewer fields, more fields, another order, whitespace.
            r#"{"id":1,"qty":2}"#,
            r#"{"id":1}"#,
            r#"{}"#,
            r#"{"id":1,"qty":2,"extra":5,"name":"x"}"#,
            r#"{"id":1,"name":"x","qty":2}"#,
            r#"{"qty":2,"id":1}"#,
            r#"{"id":1, "qty":2}"#,
            r#"{"id" :1,"qty":2}"#,
            r#" {"id":1,"qty":2}"#,
            r#"{"id":1,"qty":2} "#,
            r#"{"id":1,"qty":2,"doc":{"a":[1,"}"]},"ratio":1}"#,
            r#"{"id":1,"qty":2,"doc":[1,2],"ratio":1}"#,
            // Values that do not fit, or are not JSON.
            r#"{"id":1,"qty":3000000000}"#,
            r#"{"id":"1","qty":2}"#,
            r#"{"id":1,"qty":2.5}"#,
            r#"{"id":1,"qty":12x,"name":"a"}"#,
            r#"{"id":1,"qty":1-2}"#,
            r#"{"id":1,"ok":tru}"#,
            r#"{"id":1,"ok":truex}"#,
            r#"{"id":1,"amount":"1.234"}"#,
            r#"{"id":1,"at":"yesterday"}"#,
            r#"{"id":null,"qty":2}"#,
            r#"{"qty":2}"#,
            // Broken structure.
            r#"{"id":1,"qty":2}x"#,
            r#"{"id":1,"qty":2"#,
            r#"{"id":1,"qty":2,}"#,
            r#"{"id":1"qty":2}"#,
            r#"{"id":1,"id":2}"#,
            r#"{"id":1,"qty":2,"name":"a}"#,
            r#"{"id":1,,"qty":2}"#,
            r#"{"id":1,"qty":}"#,
            "[1]",
            "",
        ];
        let meta_stream: Arc<str> = Arc::from("s");
        let meta = RowMeta {
            kind: RowKind::Insert,
            commit_ts: None,
            snapshot: false,
            line: 7,
            stream: &meta_stream,
            shard: 0,
            sequence: 0,
            message: MessageMeta {
                ts_micros: None,
                key: None,
                headers: None,
            },
            connect: None,
        };
        let mut taken_whole = 0;
        for image in images {
            let mut compact = decoder_of_many_kinds();
            let mut general = decoder_of_many_kinds();
            general.compact_reads = false;
            if let Ok(CompactRead::Whole) = compact.read_compact_fields(image, 7) {
                taken_whole += 1;
            }
            let mut compact = decoder_of_many_kinds();
            let a = compact.append_row(image, &meta);
            let b = general.append_row(image, &meta);
            assert_eq!(a, b, "{image}");
            if a.is_ok() {
                compact.close_transaction("1");
                general.close_transaction("1");
                assert_eq!(compact.finish(0), general.finish(0), "{image}");
            }
        }
        // The compact images whose values all fit, however many fields.
        assert_eq!(
            taken_whole, 6,
            "the images read whole by the compact reader"
        );
    }

    #[test]
    fn decimals_parse_exactly_or_fail() {
        assert_eq!(parse_decimal("12.34", 12, 2), Ok(1234));
        assert_eq!(parse_decimal("-0.01", 12, 2), Ok(-1));
        assert_eq!(parse_decimal("5", 12, 2), Ok(500));
        assert_eq!(parse_decimal("1.50", 3, 1), Ok(15));
        assert_eq!(parse_decimal("1.5e2", 5, 1), Ok(1500));
        assert_eq!(
            parse_decimal("99999999999999999999999999999999999999", 38, 0).unwrap(),
            99999999999999999999999999999999999999
        );
        assert!(parse_decimal("1.234", 12, 2).is_err());
        assert!(parse_decimal("1234", 3, 0).is_err());
        assert!(parse_decimal("abc", 3, 0).is_err());
        assert!(parse_decimal("", 3, 0).is_err());
    }

    #[test]
    fn plain_decimals_read_as_the_general_reader_reads_them() {
        // Every length up to 39 digits, the point anywhere.
        let digits = "123456789098765432101234567890987654321";
        // How many of them the short reader took (the rest it left to the
        // plain one).
        let mut short_ones = 0;
        for len in 1..=digits.len() {
            for point in 0..=len {
                for sign in ["", "-"] {
                    let text = format!("{sign}{}.{}", &digits[..point], &digits[point..len]);
                    let text = text.trim_end_matches('.');
                    for (precision, scale) in [(38, 0), (38, 2), (38, 10), (20, 5)] {
                        let plain = parse_plain_decimal(text.as_bytes(), precision, scale)
                            .expect("a plain form");
                        if let Some(short) = parse_short_decimal(text.as_bytes(), precision, scale)
                        {
                            assert_eq!(Ok(short), plain, "{text} ({precision},{scale})");
                            short_ones += 1;
                        }
                        let general = parse_decimal_general(text, precision, scale);
                        assert_eq!(
                            plain.is_ok(),
                            general.is_ok(),
                            "{text} ({precision},{scale})"
                        );
                        if let Ok(v) = plain {
                            assert_eq!(Ok(v), general, "{text} ({precision},{scale})");
                        }
                    }
                }
            }
        }
        assert!(short_ones > 500, "the short reader took {short_ones}");
        assert_eq!(parse_short_decimal(b"-12.5", 12, 2), Some(-1250));
        // A trailing zero past the scale, and 19 digits: the plain reader's.
        assert_eq!(parse_short_decimal(b"1.50", 3, 1), None);
        assert_eq!(parse_short_decimal(b"1234567890123456789", 38, 0), None);
        assert_eq!(
            parse_decimal("1234567890123456789.50", 38, 2),
            Ok(123456789012345678950)
        );
        assert_eq!(
            parse_decimal("1234567890123456789012345678901234567890", 38, 0),
            Err("too many digits".to_string())
        );
    }

    #[test]
    fn finds_top_level_fields_without_a_full_parse() {
        let raw = r#"{"id": 7, "s": "a\"b}", "n": {"id": 9, "x": [1, "]"]}, "k": "z"}"#;
        let f = top_level_fields(raw, &["k".to_string(), "id".to_string()]).unwrap();
        assert_eq!(f, vec![Some("\"z\""), Some("7")]);
        let f = top_level_fields(raw, &["missing".to_string()]).unwrap();
        assert_eq!(f, vec![None]);
        assert!(top_level_fields("[1]", &["a".to_string()]).is_none());
        assert!(top_level_fields(r#"{"a": 1"#, &["b".to_string()]).is_none());
        let id = ["id".to_string()];
        assert!(!top_level_fields_differ(raw, r#"{"x": 1, "id": 7}"#, &id));
        assert!(top_level_fields_differ(raw, r#"{"id": 8}"#, &id));
        assert!(top_level_fields_differ(raw, "[1]", &id));
        let many: Vec<String> = ["a", "b", "c", "d", "id"].map(String::from).to_vec();
        assert!(!top_level_fields_differ(raw, r#"{"id": 7}"#, &many));
        assert!(top_level_fields_differ(
            raw,
            r#"{"id": 7, "e": 1, "a": 2}"#,
            &many
        ));
    }

    #[test]
    fn connect_decimals_decode_exactly() {
        let d = |raw: &str, l: Logical| encoded_decimal(l, raw).unwrap().unwrap();
        // 10.50 at scale 2 is 1050 = 0x041A: "BBo=", as Debezium emits it.
        assert_eq!(d("\"BBo=\"", Logical::DecimalBytes { scale: 2 }), (1050, 2));
        // -1 is 0xFF.
        assert_eq!(d("\"/w==\"", Logical::DecimalBytes { scale: 0 }), (-1, 0));
        assert_eq!(
            d(r#"{"scale":3,"value":"BBo="}"#, Logical::VariableDecimal),
            (1050, 3)
        );
        assert_eq!(
            encoded_decimal(Logical::DecimalBytes { scale: 2 }, "10.5").unwrap(),
            None
        );
        assert!(encoded_decimal(Logical::DecimalBytes { scale: 2 }, "\"10.50\"").is_err());
        assert_eq!(rescale(1050, 2, 4, 10), Ok(105_000));
        assert_eq!(rescale(1050, 3, 2, 10), Ok(105));
        assert!(rescale(1055, 3, 2, 10).is_err());
        assert!(rescale(1050, 2, 2, 3).is_err());
        assert_eq!(decimal_text(1050, 2), "10.50");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(decimal_text(7, -2), "700");
        assert_eq!(parse_zoned_time("10:15:30Z"), Some(36_930_000_000));
        assert_eq!(parse_zoned_time("01:00:00+02:00"), Some(23 * 3_600_000_000));
    }

    #[test]
    fn temporal_text_forms() {
        assert_eq!(parse_date("1970-01-02"), Some(1));
        assert_eq!(parse_date("1969-12-31"), Some(-1));
        assert_eq!(parse_time("00:00:01.5"), Some(1_500_000));
        assert_eq!(
            parse_naive_timestamp("1969-12-31T23:59:59.999999"),
            Some(-1)
        );
        assert_eq!(parse_zoned_timestamp("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(
            parse_zoned_timestamp("2024-01-01T00:00:00.000000001Z"),
            None
        );
        assert_eq!(
            normalize_uuid("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11").unwrap(),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
        );
    }
}
