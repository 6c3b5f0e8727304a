//! Postgres column types and values, as the CDC source sees them.
//!
//! Logical replication (`pgoutput`) sends every column value in Postgres's
//! text output format. The source pins the session settings that shape that
//! text (`TimeZone` UTC, `DateStyle` ISO, `bytea_output` hex), so it is
//! predictable; this module maps catalog types to canonical types
//! ([`canonical_type`]) and turns the text into Arrow arrays of exactly those
//! types ([`ColumnBuilder`]). Conversions are exact: a value that would lose
//! digits, precision or range is an error, never a rounding. Types with no
//! canonical mapping keep their text as [`CanonicalType::Unknown`], with a
//! warning for the planner to show.

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, BooleanBufferBuilder, ListArray, NullBufferBuilder,
    PrimitiveArray, StringArray,
};
use arrow::buffer::{Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Decimal128Type, Field, FieldRef, Float32Type,
    Float64Type, Int32Type, Int64Type, Time64MicrosecondType, TimestampMicrosecondType, UInt64Type,
};
use urutau_planner::types::{CanonicalType, MAX_DECIMAL_PRECISION};

use crate::sources::datetime_text::{days_from_civil, days_in_month};
use crate::sources::decode::parse_decimal;

/// Built-in type OIDs (`pg_type.oid`), fixed across Postgres versions.
mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

/// A Postgres column type as the catalog describes it. Domains are already
/// resolved to their base type by the caller and enums are passed as kind
/// [`PgTypeKind::Enum`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgType {
    /// `pg_type.oid` of the (base) type.
    pub oid: u32,
    /// The type modifier (`pg_attribute.atttypmod`), -1 when none.
    pub typmod: i32,
    /// format_type() text, e.g. "numeric(12,2)", "integer[]", "citext"
    pub name: String,
    /// What kind of type this is.
    pub kind: PgTypeKind,
}

/// The kind of a [`PgType`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgTypeKind {
    /// A base type, identified by its OID.
    Base,
    /// An enum type: its values are labels.
    Enum,
    /// an array; the element type
    Array(Box<PgType>),
}

/// The canonical type of a Postgres type, with a warning when it falls back
/// to Unknown (raw text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The canonical type values of the column are built as.
    pub ty: CanonicalType,
    /// Why the type fell back to [`CanonicalType::Unknown`], for the user.
    pub warning: Option<String>,
}

impl Mapping {
    fn exact(ty: CanonicalType) -> Mapping {
        Mapping { ty, warning: None }
    }

    fn unknown(name: &str, warning: String) -> Mapping {
        Mapping {
            ty: CanonicalType::Unknown(name.to_string()),
            warning: Some(warning),
        }
    }
}

/// Maps a Postgres type to its canonical type.
///
/// Built-in types are recognised by OID; enums become strings; arrays become
/// lists of their element's canonical type. Anything else, and any numeric
/// that does not fit a canonical decimal, becomes
/// [`CanonicalType::Unknown`] (values travel as their text) with a warning.
pub fn canonical_type(t: &PgType) -> Mapping {
    match &t.kind {
        PgTypeKind::Enum => Mapping::exact(CanonicalType::String),
        PgTypeKind::Base => base_mapping(t.oid, t.typmod, &t.name),
        PgTypeKind::Array(element) => array_mapping(t, element),
    }
}

fn array_mapping(t: &PgType, element: &PgType) -> Mapping {
    let inner = match &element.kind {
        PgTypeKind::Array(_) => {
            return Mapping::unknown(
                &t.name,
                format!(
                    "type {} is an array of arrays, which has no canonical mapping: \
                     its values travel as their text",
                    t.name
                ),
            );
        }
        PgTypeKind::Enum => Mapping::exact(CanonicalType::String),
        PgTypeKind::Base => {
            // The column's typmod (`numeric(12,2)[]`) describes its elements.
            let typmod = if element.typmod < 0 {
                t.typmod
            } else {
                element.typmod
            };
            base_mapping(element.oid, typmod, &element.name)
        }
    };
    match inner.ty {
        CanonicalType::Unknown(_) => {
            let why = inner.warning.unwrap_or_default();
            Mapping::unknown(
                &t.name,
                format!(
                    "type {} has no canonical mapping because its element type has none \
                     ({why}): its values travel as their text",
                    t.name
                ),
            )
        }
        ty => Mapping {
            ty: CanonicalType::List(Box::new(ty)),
            warning: inner.warning,
        },
    }
}

/// The canonical type of a built-in base type, by OID alone (`None` for
/// any other type: arrays, domains, enums and extension types need the
/// catalog). The same mapping [`canonical_type`] makes of the catalog.
pub fn builtin_base(type_oid: u32, typmod: i32) -> Option<CanonicalType> {
    // Every built-in base type maps exactly, except a numeric whose
    // precision no canonical decimal holds: its mapping names the type as
    // format_type spells it, which the catalog tells.
    let m = base_mapping(type_oid, typmod, "");
    match m.warning {
        None => Some(m.ty),
        Some(_) => None,
    }
}

fn base_mapping(type_oid: u32, typmod: i32, name: &str) -> Mapping {
    let ty = match type_oid {
        oid::BOOL => CanonicalType::Bool,
        oid::INT2 | oid::INT4 => CanonicalType::Int32,
        oid::INT8 => CanonicalType::Int64,
        oid::FLOAT4 => CanonicalType::Float32,
        oid::FLOAT8 => CanonicalType::Float64,
        oid::NUMERIC => return numeric_mapping(typmod, name),
        oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME => CanonicalType::String,
        oid::BYTEA => CanonicalType::Binary,
        oid::DATE => CanonicalType::Date,
        oid::TIME => CanonicalType::Time,
        oid::TIMESTAMP => CanonicalType::Timestamp,
        oid::TIMESTAMPTZ => CanonicalType::TimestampTz,
        oid::UUID => CanonicalType::Uuid,
        oid::JSON | oid::JSONB => CanonicalType::Json,
        _ => {
            return Mapping::unknown(
                name,
                format!("type {name} has no canonical mapping: its values travel as their text"),
            );
        }
    };
    Mapping::exact(ty)
}

/// `numeric(p,s)` from its typmod: `((p << 16) | (s & 0x7ff)) + 4`.
fn numeric_mapping(typmod: i32, name: &str) -> Mapping {
    if typmod < 4 {
        return Mapping::unknown(
            name,
            format!(
                "type {name} has no declared precision and scale, so its values travel as \
                 their text; cast it to a bounded decimal to get numbers, \
                 e.g. CAST(x AS DECIMAL(38,9))"
            ),
        );
    }
    let m = typmod - 4;
    let precision = (m >> 16) & 0xffff;
    // The scale is an 11-bit signed number (Postgres 15 allows negative
    // scales, which round to tens, hundreds, ...; and scales above the
    // precision); for the classic 0 <= s <= p this is just `m & 0xffff`.
    let scale = ((m & 0x7ff) ^ 0x400) - 0x400;
    if precision < 1 {
        return Mapping::unknown(
            name,
            format!(
                "type {name} has an invalid type modifier {typmod}: its values travel as their text"
            ),
        );
    }
    // numeric(p,-k) holds integers of up to p+k digits; numeric(p,s) with
    // s > p holds fractions below 10^(p-s) with s fraction digits.
    let (p, s) = if scale < 0 {
        (precision - scale, 0)
    } else {
        (precision.max(scale), scale)
    };
    if p > i32::from(MAX_DECIMAL_PRECISION) {
        return Mapping::unknown(
            name,
            format!(
                "type {name} holds more than {MAX_DECIMAL_PRECISION} digits, the most a \
                 canonical DECIMAL holds: its values travel as their text"
            ),
        );
    }
    Mapping::exact(CanonicalType::Decimal {
        precision: p as u8,
        scale: s as u8,
    })
}

/// Why a value was refused (without the value: the caller adds it).
type Reason = Cow<'static, str>;

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Builds one Arrow column from Postgres text values.
///
/// Values accumulate in typed buffers (no allocation per value beyond their
/// growth); [`ColumnBuilder::finish`] turns them into an array of exactly the
/// canonical type's Arrow type.
#[derive(Debug)]
pub struct ColumnBuilder {
    ty: CanonicalType,
    column: Column,
}

#[derive(Debug)]
enum Column {
    Scalar(Scalar),
    List(List),
}

impl ColumnBuilder {
    /// A builder for values of `ty`; an error for canonical types no
    /// Postgres text value is built as (struct, map, fixed, nested lists).
    pub fn new(ty: &CanonicalType) -> Result<ColumnBuilder, String> {
        let column = match ty {
            CanonicalType::List(item) => {
                if matches!(**item, CanonicalType::List(_)) {
                    return Err(format!(
                        "a Postgres column cannot be built as {ty}: \
                         multi-dimensional arrays are not supported"
                    ));
                }
                let item = Scalar::new(item)
                    .ok_or_else(|| format!("a Postgres column cannot be built as {ty}"))?;
                Column::List(List {
                    field: Arc::new(Field::new("item", item.data_type.clone(), true)),
                    item,
                    offsets: vec![0],
                    nulls: NullBufferBuilder::new(0),
                    scratch: Vec::new(),
                })
            }
            other => Column::Scalar(
                Scalar::new(other)
                    .ok_or_else(|| format!("a Postgres column cannot be built as {ty}"))?,
            ),
        };
        Ok(ColumnBuilder {
            ty: ty.clone(),
            column,
        })
    }

    /// Appends one value (None = SQL NULL). Err(message) names the value
    /// (shortened to ~60 chars) and the expected type; on Err nothing is
    /// appended.
    pub fn append(&mut self, text: Option<&[u8]>) -> Result<(), String> {
        let result = match (&mut self.column, text) {
            (Column::Scalar(s), None) => {
                s.push_null();
                Ok(())
            }
            (Column::Scalar(s), Some(t)) => s.push(t),
            (Column::List(l), None) => {
                l.push_null();
                Ok(())
            }
            (Column::List(l), Some(t)) => l.push(t),
        };
        result.map_err(|why| {
            format!(
                "value '{}' is not a valid {}: {why}",
                shorten(text.unwrap_or_default()),
                self.ty
            )
        })
    }

    /// The number of values appended since the last [`ColumnBuilder::finish`].
    pub fn len(&self) -> usize {
        match &self.column {
            Column::Scalar(s) => s.len(),
            Column::List(l) => l.nulls.len(),
        }
    }

    /// Whether no value was appended since the last [`ColumnBuilder::finish`].
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The appended values as an array of exactly `ty.arrow_type()`; the
    /// builder starts over empty.
    pub fn finish(&mut self) -> ArrayRef {
        match &mut self.column {
            Column::Scalar(s) => s.finish(),
            Column::List(l) => l.finish(),
        }
    }
}

/// A column of scalar values: typed values plus validity.
#[derive(Debug)]
struct Scalar {
    values: Values,
    nulls: NullBufferBuilder,
    data_type: DataType,
}

/// The typed values of a scalar column; a NULL holds a zero/empty slot.
#[derive(Debug)]
enum Values {
    Bool(BooleanBufferBuilder),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    UInt64(Vec<u64>),
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    Decimal(Vec<i128>, u8, u8),
    /// Strings, JSON and unknown types: the text as it came.
    Text(Bytes),
    /// UUIDs, as canonical lower-case hyphenated text.
    Uuid(Bytes),
    Binary(Bytes),
    /// Days since 1970-01-01.
    Date(Vec<i32>),
    /// Microseconds since midnight.
    Time(Vec<i64>),
    /// Microseconds since 1970-01-01 00:00:00 (UTC for timestamptz).
    Timestamp(Vec<i64>),
}

impl Scalar {
    fn new(ty: &CanonicalType) -> Option<Scalar> {
        let values = match ty {
            CanonicalType::Bool => Values::Bool(BooleanBufferBuilder::new(0)),
            CanonicalType::Int32 => Values::Int32(Vec::new()),
            CanonicalType::Int64 => Values::Int64(Vec::new()),
            CanonicalType::UInt64 => Values::UInt64(Vec::new()),
            CanonicalType::Float32 => Values::Float32(Vec::new()),
            CanonicalType::Float64 => Values::Float64(Vec::new()),
            CanonicalType::Decimal { precision, scale } => {
                Values::Decimal(Vec::new(), *precision, *scale)
            }
            CanonicalType::String | CanonicalType::Json | CanonicalType::Unknown(_) => {
                Values::Text(Bytes::new())
            }
            CanonicalType::Uuid => Values::Uuid(Bytes::new()),
            CanonicalType::Binary => Values::Binary(Bytes::new()),
            CanonicalType::Date => Values::Date(Vec::new()),
            CanonicalType::Time => Values::Time(Vec::new()),
            CanonicalType::Timestamp | CanonicalType::TimestampTz => Values::Timestamp(Vec::new()),
            CanonicalType::Fixed(_)
            | CanonicalType::Struct(_)
            | CanonicalType::List(_)
            | CanonicalType::Map(_, _) => return None,
        };
        Some(Scalar {
            values,
            nulls: NullBufferBuilder::new(0),
            data_type: ty.arrow_type(),
        })
    }

    fn len(&self) -> usize {
        self.nulls.len()
    }

    /// Parses and appends one non-null value; on error nothing is appended.
    fn push(&mut self, text: &[u8]) -> Result<(), Reason> {
        let zoned = matches!(self.data_type, DataType::Timestamp(_, Some(_)));
        match &mut self.values {
            Values::Bool(v) => v.append(parse_bool(text)?),
            Values::Int32(v) => {
                let n = parse_i64(text)?;
                v.push(i32::try_from(n).map_err(|_| "out of range for a 32-bit integer")?);
            }
            Values::Int64(v) => v.push(parse_i64(text)?),
            Values::UInt64(v) => v.push(parse_u64(text)?),
            Values::Float32(v) => v.push(parse_float::<f32>(text, f32::is_infinite)?),
            Values::Float64(v) => v.push(parse_float::<f64>(text, f64::is_infinite)?),
            Values::Decimal(v, precision, scale) => {
                let s = std::str::from_utf8(text).map_err(|_| "not a number")?;
                v.push(parse_decimal(s, *precision, *scale).map_err(Cow::Owned)?);
            }
            Values::Text(b) => {
                if std::str::from_utf8(text).is_err() {
                    return Err("not valid UTF-8".into());
                }
                b.push(text)?;
            }
            Values::Uuid(b) => {
                let u = uuid::Uuid::try_parse_ascii(text).map_err(|_| "not a UUID")?;
                let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
                b.push(u.hyphenated().encode_lower(&mut buf).as_bytes())?;
            }
            Values::Binary(b) => push_bytea_hex(b, text)?,
            Values::Date(v) => v.push(parse_date(text)?),
            Values::Time(v) => v.push(parse_time(text)?),
            Values::Timestamp(v) => v.push(parse_timestamp(text, zoned)?),
        }
        self.nulls.append_non_null();
        Ok(())
    }

    fn push_null(&mut self) {
        match &mut self.values {
            Values::Bool(v) => v.append(false),
            Values::Int32(v) | Values::Date(v) => v.push(0),
            Values::Int64(v) | Values::Time(v) | Values::Timestamp(v) => v.push(0),
            Values::UInt64(v) => v.push(0),
            Values::Float32(v) => v.push(0.0),
            Values::Float64(v) => v.push(0.0),
            Values::Decimal(v, _, _) => v.push(0),
            Values::Text(b) | Values::Uuid(b) | Values::Binary(b) => b.push_empty(),
        }
        self.nulls.append_null();
    }

    /// Drops the values after the first `len`.
    fn truncate(&mut self, len: usize) {
        match &mut self.values {
            Values::Bool(v) => v.truncate(len),
            Values::Int32(v) | Values::Date(v) => v.truncate(len),
            Values::Int64(v) | Values::Time(v) | Values::Timestamp(v) => v.truncate(len),
            Values::UInt64(v) => v.truncate(len),
            Values::Float32(v) => v.truncate(len),
            Values::Float64(v) => v.truncate(len),
            Values::Decimal(v, _, _) => v.truncate(len),
            Values::Text(b) | Values::Uuid(b) | Values::Binary(b) => b.truncate(len),
        }
        self.nulls.truncate(len);
    }

    fn finish(&mut self) -> ArrayRef {
        let nulls = self.nulls.finish();
        let dt = self.data_type.clone();
        match &mut self.values {
            Values::Bool(v) => Arc::new(BooleanArray::new(v.finish(), nulls)),
            Values::Int32(v) => primitive::<Int32Type>(v, nulls, dt),
            Values::Int64(v) => primitive::<Int64Type>(v, nulls, dt),
            Values::UInt64(v) => primitive::<UInt64Type>(v, nulls, dt),
            Values::Float32(v) => primitive::<Float32Type>(v, nulls, dt),
            Values::Float64(v) => primitive::<Float64Type>(v, nulls, dt),
            Values::Decimal(v, _, _) => primitive::<Decimal128Type>(v, nulls, dt),
            Values::Date(v) => primitive::<Date32Type>(v, nulls, dt),
            Values::Time(v) => primitive::<Time64MicrosecondType>(v, nulls, dt),
            Values::Timestamp(v) => primitive::<TimestampMicrosecondType>(v, nulls, dt),
            Values::Text(b) | Values::Uuid(b) => {
                let (offsets, data) = b.take();
                Arc::new(
                    StringArray::try_new(offsets, data, nulls)
                        .expect("every appended value was checked to be UTF-8"),
                )
            }
            Values::Binary(b) => {
                let (offsets, data) = b.take();
                Arc::new(BinaryArray::new(offsets, data, nulls))
            }
        }
    }
}

/// Takes the values, leaving an empty vector of the same capacity (the next
/// batch is likely as large).
fn take_vec<T>(v: &mut Vec<T>) -> Vec<T> {
    let capacity = v.len();
    std::mem::replace(v, Vec::with_capacity(capacity))
}

fn primitive<T: ArrowPrimitiveType>(
    v: &mut Vec<T::Native>,
    nulls: Option<NullBuffer>,
    data_type: DataType,
) -> ArrayRef {
    Arc::new(
        PrimitiveArray::<T>::new(ScalarBuffer::from(take_vec(v)), nulls).with_data_type(data_type),
    )
}

/// Variable-length values: Arrow offsets and data.
#[derive(Debug)]
struct Bytes {
    offsets: Vec<i32>,
    data: Vec<u8>,
}

impl Bytes {
    fn new() -> Bytes {
        Bytes {
            offsets: vec![0],
            data: Vec::new(),
        }
    }

    fn end(&self) -> i32 {
        self.offsets[self.offsets.len() - 1]
    }

    /// Ends the value whose bytes were written to `data` from `start` on.
    fn commit(&mut self, start: usize) -> Result<(), Reason> {
        match i32::try_from(self.data.len()) {
            Ok(end) => {
                self.offsets.push(end);
                Ok(())
            }
            Err(_) => {
                self.data.truncate(start);
                Err("the column holds more than 2 GiB in one batch".into())
            }
        }
    }

    fn push(&mut self, value: &[u8]) -> Result<(), Reason> {
        let start = self.data.len();
        self.data.extend_from_slice(value);
        self.commit(start)
    }

    fn push_empty(&mut self) {
        let end = self.end();
        self.offsets.push(end);
    }

    fn truncate(&mut self, len: usize) {
        self.offsets.truncate(len + 1);
        let end = self.end() as usize;
        self.data.truncate(end);
    }

    fn take(&mut self) -> (OffsetBuffer<i32>, Buffer) {
        let mut offsets = Vec::with_capacity(self.offsets.len());
        offsets.push(0);
        let offsets = std::mem::replace(&mut self.offsets, offsets);
        let data = take_vec(&mut self.data);
        (
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Buffer::from_vec(data),
        )
    }
}

/// A column of one-dimensional arrays of scalar elements.
#[derive(Debug)]
struct List {
    item: Scalar,
    field: FieldRef,
    offsets: Vec<i32>,
    nulls: NullBufferBuilder,
    /// Reused for elements that need unescaping.
    scratch: Vec<u8>,
}

impl List {
    fn push_null(&mut self) {
        let end = self.offsets[self.offsets.len() - 1];
        self.offsets.push(end);
        self.nulls.append_null();
    }

    /// Parses and appends one array literal; on error its elements already
    /// appended are dropped again.
    fn push(&mut self, text: &[u8]) -> Result<(), Reason> {
        let start = self.item.len();
        let parsed = parse_array(&mut self.item, &mut self.scratch, text).and_then(|()| {
            i32::try_from(self.item.len())
                .map_err(|_| "the column holds too many array elements in one batch".into())
        });
        match parsed {
            Ok(end) => {
                self.offsets.push(end);
                self.nulls.append_non_null();
                Ok(())
            }
            Err(why) => {
                self.item.truncate(start);
                Err(why)
            }
        }
    }

    fn finish(&mut self) -> ArrayRef {
        let mut offsets = Vec::with_capacity(self.offsets.len());
        offsets.push(0);
        let offsets = std::mem::replace(&mut self.offsets, offsets);
        Arc::new(ListArray::new(
            self.field.clone(),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            self.item.finish(),
            self.nulls.finish(),
        ))
    }
}

/// Whitespace as Postgres's array parser skips it.
fn is_pg_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c')
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_pg_space(b[i]) {
        i += 1;
    }
    i
}

/// Appends the elements of a one-dimensional array literal
/// (`{1,NULL,"a \"b\""}`) to `item`.
fn parse_array(item: &mut Scalar, scratch: &mut Vec<u8>, b: &[u8]) -> Result<(), Reason> {
    const UNTERMINATED: &str = "not a complete array literal (missing '}')";
    let mut i = skip_space(b, 0);
    match b.get(i) {
        Some(b'{') => i += 1,
        Some(b'[') => {
            return Err("arrays with explicit bounds (e.g. [0:1]={...}) are not supported".into());
        }
        _ => return Err("not an array literal (expected '{')".into()),
    }
    i = skip_space(b, i);
    if b.get(i) == Some(&b'}') {
        i += 1;
    } else {
        let mut n = 0usize;
        loop {
            n += 1;
            i = skip_space(b, i);
            let element = match b.get(i) {
                None => return Err(UNTERMINATED.into()),
                Some(b'{') => {
                    return Err("multi-dimensional arrays are not supported".into());
                }
                Some(b'"') => {
                    i += 1;
                    let start = i;
                    let mut escaped = false;
                    loop {
                        match b.get(i) {
                            None => return Err(UNTERMINATED.into()),
                            Some(b'"') => break,
                            Some(b'\\') => {
                                escaped = true;
                                i += 2;
                            }
                            Some(_) => i += 1,
                        }
                    }
                    let raw = &b[start..i];
                    i += 1;
                    Some(if escaped {
                        unescape(raw, scratch);
                        &scratch[..]
                    } else {
                        raw
                    })
                }
                Some(_) => {
                    let start = i;
                    let mut end = i;
                    let mut escaped = false;
                    loop {
                        match b.get(i) {
                            None => return Err(UNTERMINATED.into()),
                            Some(b',' | b'}') => break,
                            Some(b'"' | b'{') => {
                                return Err(format!(
                                    "element {n}: unexpected '{}' in an unquoted element",
                                    b[i] as char
                                )
                                .into());
                            }
                            Some(b'\\') => {
                                escaped = true;
                                i += 2;
                                end = i;
                            }
                            Some(&c) => {
                                i += 1;
                                if !is_pg_space(c) {
                                    end = i;
                                }
                            }
                        }
                    }
                    let raw = &b[start..end];
                    if raw.is_empty() {
                        return Err(format!("element {n} is empty").into());
                    }
                    if !escaped && raw.eq_ignore_ascii_case(b"NULL") {
                        None
                    } else if escaped {
                        unescape(raw, scratch);
                        Some(&scratch[..])
                    } else {
                        Some(raw)
                    }
                }
            };
            match element {
                None => item.push_null(),
                Some(e) => item
                    .push(e)
                    .map_err(|why| format!("element {n} '{}': {why}", shorten(e)))?,
            }
            i = skip_space(b, i);
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {
                    i += 1;
                    break;
                }
                None => return Err(UNTERMINATED.into()),
                Some(_) => return Err(format!("expected ',' or '}}' after element {n}").into()),
            }
        }
    }
    if skip_space(b, i) != b.len() {
        return Err("unexpected text after the array".into());
    }
    Ok(())
}

/// Copies `raw` to `out` with backslash escapes resolved.
fn unescape(raw: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut bytes = raw.iter();
    while let Some(&c) = bytes.next() {
        if c == b'\\' {
            if let Some(&next) = bytes.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
}

/// A value shown in an error: at most 60 characters.
fn shorten(text: &[u8]) -> String {
    const MAX_CHARS: usize = 60;
    // 60 characters take at most 240 bytes: never decode more.
    let head = &text[..text.len().min(MAX_CHARS * 4)];
    let s = String::from_utf8_lossy(head);
    if s.chars().count() > MAX_CHARS || head.len() < text.len() {
        format!("{}...", s.chars().take(MAX_CHARS).collect::<String>())
    } else {
        s.into_owned()
    }
}

fn parse_bool(b: &[u8]) -> Result<bool, Reason> {
    match b {
        b"t" => Ok(true),
        b"f" => Ok(false),
        _ => Err("expected 't' or 'f'".into()),
    }
}

fn parse_i64(b: &[u8]) -> Result<i64, Reason> {
    const NOT: &str = "not an integer";
    let (negative, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(NOT.into());
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = i64::from(c - b'0');
        // Accumulating negatives reaches i64::MIN.
        v = v
            .checked_mul(10)
            .and_then(|v| {
                if negative {
                    v.checked_sub(d)
                } else {
                    v.checked_add(d)
                }
            })
            .ok_or("out of range for a 64-bit integer")?;
    }
    Ok(v)
}

fn parse_u64(b: &[u8]) -> Result<u64, Reason> {
    let digits = b.strip_prefix(b"+").unwrap_or(b);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err("not an unsigned integer".into());
    }
    let mut v: u64 = 0;
    for &c in digits {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
            .ok_or("out of range for an unsigned 64-bit integer")?;
    }
    Ok(v)
}

/// A float as Postgres prints it (shortest round-trip digits, `NaN`,
/// `Infinity`, `-Infinity`); finite text beyond the type's range is refused.
fn parse_float<F: std::str::FromStr + Copy>(
    b: &[u8],
    is_infinite: fn(F) -> bool,
) -> Result<F, Reason> {
    const NOT: &str = "not a number";
    let s = std::str::from_utf8(b).map_err(|_| NOT)?;
    let v: F = s.parse().map_err(|_| NOT)?;
    if is_infinite(v) {
        let word = s.trim_start_matches(['+', '-']);
        if !word.eq_ignore_ascii_case("infinity") && !word.eq_ignore_ascii_case("inf") {
            return Err("out of range for the float type".into());
        }
    }
    Ok(v)
}

fn push_bytea_hex(b: &mut Bytes, text: &[u8]) -> Result<(), Reason> {
    let Some(hex) = text.strip_prefix(b"\\x") else {
        return Err("not hex-format bytea (\\x...)".into());
    };
    if !hex.len().is_multiple_of(2) {
        return Err("an odd number of hex digits".into());
    }
    let start = b.data.len();
    b.data.reserve(hex.len() / 2);
    for pair in hex.chunks_exact(2) {
        match (hex_digit(pair[0]), hex_digit(pair[1])) {
            (Some(high), Some(low)) => b.data.push((high << 4) | low),
            _ => {
                b.data.truncate(start);
                return Err("not a hex digit".into());
            }
        }
    }
    b.commit(start)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Reads `min..=max` ASCII digits at `*i`.
fn take_digits(b: &[u8], i: &mut usize, min: usize, max: usize) -> Option<i64> {
    let start = *i;
    let mut v: i64 = 0;
    while *i < b.len() && *i - start < max && b[*i].is_ascii_digit() {
        v = v * 10 + i64::from(b[*i] - b'0');
        *i += 1;
    }
    (*i - start >= min).then_some(v)
}

fn take_byte(b: &[u8], i: &mut usize, c: u8) -> Option<()> {
    if b.get(*i) == Some(&c) {
        *i += 1;
        Some(())
    } else {
        None
    }
}

/// Refuses the special values Postgres prints for dates and timestamps
/// outside any canonical range.
fn refuse_special(b: &[u8], what: &str) -> Result<(), Reason> {
    if b.ends_with(b" BC") {
        return Err(format!("{what} before the year 1 (BC) are not supported").into());
    }
    if b == b"infinity" || b == b"-infinity" {
        return Err(format!("infinite {what} are not supported").into());
    }
    Ok(())
}

/// `YYYY-MM-DD` (the year may have more than 4 digits) at `*i`, as days
/// since 1970-01-01.
fn parse_date_at(b: &[u8], i: &mut usize) -> Result<i64, Reason> {
    const NOT: &str = "not a date (YYYY-MM-DD)";
    let year = take_digits(b, i, 4, 7).ok_or(NOT)?;
    take_byte(b, i, b'-').ok_or(NOT)?;
    let month = take_digits(b, i, 2, 2).ok_or(NOT)?;
    take_byte(b, i, b'-').ok_or(NOT)?;
    let day = take_digits(b, i, 2, 2).ok_or(NOT)?;
    if year < 1 || !(1..=12).contains(&month) || !(1..=days_in_month(year, month)).contains(&day) {
        return Err("no such date".into());
    }
    Ok(days_from_civil(year, month, day))
}

/// `HH:MM:SS[.ffffff]` at `*i`, as microseconds since midnight.
fn parse_time_at(b: &[u8], i: &mut usize) -> Result<i64, Reason> {
    const NOT: &str = "not a time (HH:MM:SS[.ffffff])";
    let hour = take_digits(b, i, 2, 2).ok_or(NOT)?;
    take_byte(b, i, b':').ok_or(NOT)?;
    let minute = take_digits(b, i, 2, 2).ok_or(NOT)?;
    take_byte(b, i, b':').ok_or(NOT)?;
    let second = take_digits(b, i, 2, 2).ok_or(NOT)?;
    let mut micros = 0i64;
    if take_byte(b, i, b'.').is_some() {
        let mut n = 0;
        while let Some(&c) = b.get(*i)
            && c.is_ascii_digit()
        {
            if n < 6 {
                micros = micros * 10 + i64::from(c - b'0');
            } else if c != b'0' {
                return Err("more than 6 fraction digits (finer than microseconds)".into());
            }
            n += 1;
            *i += 1;
        }
        if n == 0 {
            return Err(NOT.into());
        }
        for _ in n..6 {
            micros *= 10;
        }
    }
    if minute > 59 || second > 59 {
        return Err("no such time".into());
    }
    if hour > 23 {
        if hour == 24 && minute == 0 && second == 0 && micros == 0 {
            return Err("24:00:00 is past the last time of day (23:59:59.999999)".into());
        }
        return Err("no such time".into());
    }
    Ok(((hour * 60 + minute) * 60 + second) * 1_000_000 + micros)
}

/// `+HH[:MM[:SS]]` or `-HH[:MM[:SS]]` at `*i`, as seconds east of UTC.
fn parse_offset_at(b: &[u8], i: &mut usize) -> Result<i64, Reason> {
    const NOT: &str = "no UTC offset (+HH[:MM[:SS]])";
    let negative = match b.get(*i) {
        Some(b'+') => false,
        Some(b'-') => true,
        _ => return Err(NOT.into()),
    };
    *i += 1;
    let hours = take_digits(b, i, 2, 2).ok_or(NOT)?;
    let mut minutes = 0;
    let mut seconds = 0;
    if take_byte(b, i, b':').is_some() {
        minutes = take_digits(b, i, 2, 2).ok_or(NOT)?;
        if take_byte(b, i, b':').is_some() {
            seconds = take_digits(b, i, 2, 2).ok_or(NOT)?;
        }
    }
    if hours > 23 || minutes > 59 || seconds > 59 {
        return Err("no such UTC offset".into());
    }
    let offset = (hours * 60 + minutes) * 60 + seconds;
    Ok(if negative { -offset } else { offset })
}

fn parse_date(b: &[u8]) -> Result<i32, Reason> {
    refuse_special(b, "dates")?;
    let mut i = 0;
    let days = parse_date_at(b, &mut i)?;
    if i != b.len() {
        return Err("not a date (YYYY-MM-DD)".into());
    }
    i32::try_from(days).map_err(|_| "out of DATE's range".into())
}

fn parse_time(b: &[u8]) -> Result<i64, Reason> {
    let mut i = 0;
    let micros = parse_time_at(b, &mut i)?;
    if i != b.len() {
        return Err("not a time (HH:MM:SS[.ffffff])".into());
    }
    Ok(micros)
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]`, followed by a UTC offset when `zoned`,
/// as microseconds since 1970-01-01 00:00:00 UTC.
fn parse_timestamp(b: &[u8], zoned: bool) -> Result<i64, Reason> {
    let not: &'static str = if zoned {
        "not a timestamp with time zone (YYYY-MM-DD HH:MM:SS[.ffffff]+HH[:MM])"
    } else {
        "not a timestamp (YYYY-MM-DD HH:MM:SS[.ffffff])"
    };
    refuse_special(b, "timestamps")?;
    let mut i = 0;
    let days = parse_date_at(b, &mut i)?;
    match b.get(i) {
        Some(b' ' | b'T') => i += 1,
        _ => return Err(not.into()),
    }
    let micros = parse_time_at(b, &mut i)?;
    let offset = if zoned {
        parse_offset_at(b, &mut i)?
    } else {
        0
    };
    if i != b.len() {
        return Err(not.into());
    }
    days.checked_mul(MICROS_PER_DAY)
        .and_then(|t| t.checked_add(micros))
        .and_then(|t| t.checked_sub(offset * 1_000_000))
        .ok_or_else(|| "out of the microsecond timestamp range".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::TimeUnit;
    use urutau_planner::types::StructField;

    fn base(oid: u32, typmod: i32, name: &str) -> PgType {
        PgType {
            oid,
            typmod,
            name: name.to_string(),
            kind: PgTypeKind::Base,
        }
    }

    fn array_of(element: PgType, typmod: i32, name: &str) -> PgType {
        PgType {
            oid: 0,
            typmod,
            name: name.to_string(),
            kind: PgTypeKind::Array(Box::new(element)),
        }
    }

    fn exact(t: &PgType) -> CanonicalType {
        let m = canonical_type(t);
        assert_eq!(m.warning, None, "{t:?}");
        m.ty
    }

    fn dec(precision: u8, scale: u8) -> CanonicalType {
        CanonicalType::Decimal { precision, scale }
    }

    /// `numeric(p,s)`'s typmod, as Postgres computes it.
    fn numeric_typmod(p: i32, s: i32) -> i32 {
        ((p << 16) | (s & 0x7ff)) + 4
    }

    // ---- mapping ----

    #[test]
    fn maps_builtin_scalars_by_oid() {
        let cases = [
            (16, "boolean", CanonicalType::Bool),
            (21, "smallint", CanonicalType::Int32),
            (23, "integer", CanonicalType::Int32),
            (20, "bigint", CanonicalType::Int64),
            (700, "real", CanonicalType::Float32),
            (701, "double precision", CanonicalType::Float64),
            (25, "text", CanonicalType::String),
            (1043, "character varying(20)", CanonicalType::String),
            (1042, "character(3)", CanonicalType::String),
            (19, "name", CanonicalType::String),
            (17, "bytea", CanonicalType::Binary),
            (1082, "date", CanonicalType::Date),
            (1083, "time without time zone", CanonicalType::Time),
            (
                1114,
                "timestamp without time zone",
                CanonicalType::Timestamp,
            ),
            (1184, "timestamp with time zone", CanonicalType::TimestampTz),
            (2950, "uuid", CanonicalType::Uuid),
            (114, "json", CanonicalType::Json),
            (3802, "jsonb", CanonicalType::Json),
        ];
        for (oid, name, want) in cases {
            assert_eq!(exact(&base(oid, -1, name)), want, "{name}");
        }
    }

    #[test]
    fn maps_numeric_typmods() {
        assert_eq!(numeric_typmod(12, 2), 786438);
        assert_eq!(exact(&base(1700, 786438, "numeric(12,2)")), dec(12, 2));
        assert_eq!(
            exact(&base(1700, numeric_typmod(38, 10), "numeric(38,10)")),
            dec(38, 10)
        );
        assert_eq!(
            exact(&base(1700, numeric_typmod(5, 0), "numeric(5,0)")),
            dec(5, 0)
        );
        // Postgres 15: negative scale (integers rounded to hundreds) and a
        // scale above the precision.
        assert_eq!(
            exact(&base(1700, numeric_typmod(5, -2), "numeric(5,-2)")),
            dec(7, 0)
        );
        assert_eq!(
            exact(&base(1700, numeric_typmod(3, 5), "numeric(3,5)")),
            dec(5, 5)
        );
    }

    #[test]
    fn numeric_beyond_38_digits_is_unknown() {
        let m = canonical_type(&base(1700, numeric_typmod(39, 2), "numeric(39,2)"));
        assert_eq!(m.ty, CanonicalType::Unknown("numeric(39,2)".into()));
        assert!(m.warning.unwrap().contains("more than 38 digits"));
        let m = canonical_type(&base(1700, numeric_typmod(37, -2), "numeric(37,-2)"));
        assert_eq!(m.ty, CanonicalType::Unknown("numeric(37,-2)".into()));
    }

    #[test]
    fn numeric_without_typmod_is_unknown_with_a_cast_hint() {
        let m = canonical_type(&base(1700, -1, "numeric"));
        assert_eq!(m.ty, CanonicalType::Unknown("numeric".into()));
        let w = m.warning.unwrap();
        assert!(w.contains("CAST(x AS DECIMAL(38,9))"), "{w}");
        assert!(w.contains("numeric"), "{w}");
    }

    #[test]
    fn domains_map_as_their_base_type() {
        // The caller resolves a domain to its base type's OID and typmod;
        // the domain's name plays no part.
        assert_eq!(exact(&base(23, -1, "posint")), CanonicalType::Int32);
        assert_eq!(exact(&base(1700, 786438, "money_amount")), dec(12, 2));
    }

    #[test]
    fn enums_are_strings() {
        let t = PgType {
            oid: 16_500,
            typmod: -1,
            name: "mood".into(),
            kind: PgTypeKind::Enum,
        };
        assert_eq!(exact(&t), CanonicalType::String);
    }

    #[test]
    fn other_types_are_unknown_with_a_warning() {
        for (oid, name) in [(790, "money"), (16_400, "citext"), (1186, "interval")] {
            let m = canonical_type(&base(oid, -1, name));
            assert_eq!(m.ty, CanonicalType::Unknown(name.into()));
            assert_eq!(
                m.warning.as_deref(),
                Some(
                    format!(
                        "type {name} has no canonical mapping: its values travel as their text"
                    )
                    .as_str()
                )
            );
        }
    }

    #[test]
    fn arrays_map_to_lists_of_their_elements() {
        let t = array_of(base(23, -1, "integer"), -1, "integer[]");
        assert_eq!(
            exact(&t),
            CanonicalType::List(Box::new(CanonicalType::Int32))
        );
        // The column's typmod describes the elements.
        let t = array_of(base(1700, -1, "numeric"), 786438, "numeric(12,2)[]");
        assert_eq!(exact(&t), CanonicalType::List(Box::new(dec(12, 2))));
        let mood = PgType {
            oid: 16_500,
            typmod: -1,
            name: "mood".into(),
            kind: PgTypeKind::Enum,
        };
        assert_eq!(
            exact(&array_of(mood, -1, "mood[]")),
            CanonicalType::List(Box::new(CanonicalType::String))
        );
    }

    #[test]
    fn arrays_of_unknown_elements_are_unknown() {
        let m = canonical_type(&array_of(base(790, -1, "money"), -1, "money[]"));
        assert_eq!(m.ty, CanonicalType::Unknown("money[]".into()));
        let w = m.warning.unwrap();
        assert!(
            w.starts_with("type money[] has no canonical mapping"),
            "{w}"
        );
        assert!(w.contains("type money has no canonical mapping"), "{w}");

        let m = canonical_type(&array_of(base(1700, -1, "numeric"), -1, "numeric[]"));
        assert_eq!(m.ty, CanonicalType::Unknown("numeric[]".into()));
        assert!(m.warning.unwrap().contains("CAST("));

        let nested = array_of(
            array_of(base(23, -1, "integer"), -1, "integer[]"),
            -1,
            "integer[][]",
        );
        let m = canonical_type(&nested);
        assert_eq!(m.ty, CanonicalType::Unknown("integer[][]".into()));
        assert!(m.warning.is_some());
    }

    // ---- helpers for values ----

    fn build(ty: &CanonicalType, values: &[Option<&str>]) -> ArrayRef {
        let mut b = ColumnBuilder::new(ty).unwrap();
        for v in values {
            b.append(v.map(str::as_bytes))
                .unwrap_or_else(|e| panic!("{v:?} as {ty}: {e}"));
        }
        assert_eq!(b.len(), values.len());
        let a = b.finish();
        assert_eq!(a.data_type(), &ty.arrow_type());
        assert_eq!(a.len(), values.len());
        a
    }

    /// The error for `text`, checking nothing was appended.
    fn reject(ty: &CanonicalType, text: &str) -> String {
        let mut b = ColumnBuilder::new(ty).unwrap();
        let err = b
            .append(Some(text.as_bytes()))
            .expect_err(&format!("{text:?} should not be a valid {ty}"));
        assert_eq!(b.len(), 0, "{text:?} appended on error");
        let a = b.finish();
        assert_eq!(a.len(), 0);
        if let DataType::List(_) = a.data_type() {
            assert_eq!(a.as_list::<i32>().values().len(), 0);
        }
        err
    }

    fn int32s(ty: &CanonicalType, values: &[&str]) -> Vec<i32> {
        let vals: Vec<Option<&str>> = values.iter().map(|v| Some(*v)).collect();
        let a = build(ty, &vals);
        match ty {
            CanonicalType::Date => a.as_primitive::<Date32Type>().values().to_vec(),
            _ => a.as_primitive::<Int32Type>().values().to_vec(),
        }
    }

    fn int64s(ty: &CanonicalType, values: &[&str]) -> Vec<i64> {
        let vals: Vec<Option<&str>> = values.iter().map(|v| Some(*v)).collect();
        let a = build(ty, &vals);
        match ty {
            CanonicalType::Int64 => a.as_primitive::<Int64Type>().values().to_vec(),
            CanonicalType::Time => a.as_primitive::<Time64MicrosecondType>().values().to_vec(),
            _ => a
                .as_primitive::<TimestampMicrosecondType>()
                .values()
                .to_vec(),
        }
    }

    fn strings(ty: &CanonicalType, values: &[&str]) -> Vec<String> {
        let vals: Vec<Option<&str>> = values.iter().map(|v| Some(*v)).collect();
        let a = build(ty, &vals);
        a.as_string::<i32>()
            .iter()
            .map(|s| s.unwrap().to_string())
            .collect()
    }

    // ---- scalar values ----

    #[test]
    fn bools() {
        let a = build(&CanonicalType::Bool, &[Some("t"), Some("f"), None]);
        let a = a.as_boolean();
        assert!(a.value(0));
        assert!(!a.value(1));
        assert!(a.is_null(2));
        for bad in ["true", "x", "", "T"] {
            reject(&CanonicalType::Bool, bad);
        }
    }

    #[test]
    fn int32_bounds() {
        let ty = CanonicalType::Int32;
        assert_eq!(
            int32s(&ty, &["0", "-2147483648", "2147483647", "+7", "-32768"]),
            vec![0, i32::MIN, i32::MAX, 7, -32768]
        );
        let e = reject(&ty, "2147483648");
        assert!(e.contains("out of range"), "{e}");
        reject(&ty, "-2147483649");
        for bad in ["", "-", "1.0", "abc", " 1", "1 ", "1e3", "0x10"] {
            reject(&ty, bad);
        }
    }

    #[test]
    fn int64_bounds() {
        let ty = CanonicalType::Int64;
        assert_eq!(
            int64s(&ty, &["9223372036854775807", "-9223372036854775808", "42"]),
            vec![i64::MAX, i64::MIN, 42]
        );
        reject(&ty, "9223372036854775808");
        reject(&ty, "-9223372036854775809");
        reject(&ty, "99999999999999999999999");
        reject(&ty, "12a");
    }

    #[test]
    fn uint64_values() {
        let a = build(
            &CanonicalType::UInt64,
            &[Some("18446744073709551615"), Some("0")],
        );
        assert_eq!(
            a.as_primitive::<UInt64Type>().values().to_vec(),
            vec![u64::MAX, 0]
        );
        reject(&CanonicalType::UInt64, "18446744073709551616");
        reject(&CanonicalType::UInt64, "-1");
    }

    #[test]
    fn floats() {
        let a = build(
            &CanonicalType::Float64,
            &[
                Some("1.5"),
                Some("-0"),
                Some("NaN"),
                Some("Infinity"),
                Some("-Infinity"),
                Some("1e+308"),
                Some("4.9406564584124654e-324"),
                Some("0.1"),
            ],
        );
        let v = a.as_primitive::<Float64Type>().values();
        assert_eq!(v[0], 1.5);
        assert!(v[1] == 0.0 && v[1].is_sign_negative());
        assert!(v[2].is_nan());
        assert_eq!(v[3], f64::INFINITY);
        assert_eq!(v[4], f64::NEG_INFINITY);
        assert_eq!(v[5], 1e308);
        assert_eq!(v[6], f64::from_bits(1));
        assert_eq!(v[7], 0.1);
        reject(&CanonicalType::Float64, "1e400");
        reject(&CanonicalType::Float64, "abc");
        reject(&CanonicalType::Float64, "");

        let a = build(
            &CanonicalType::Float32,
            &[Some("3.4028235e+38"), Some("0.1"), Some("-Infinity"), None],
        );
        let a = a.as_primitive::<Float32Type>();
        assert_eq!(a.value(0), f32::MAX);
        assert_eq!(a.value(1), 0.1f32);
        assert_eq!(a.value(2), f32::NEG_INFINITY);
        assert!(a.is_null(3));
        reject(&CanonicalType::Float32, "1e39");
    }

    #[test]
    fn decimals_are_exact() {
        let a = build(
            &dec(38, 10),
            &[
                Some("9999999999999999999999999999.9999999999"),
                Some("-9999999999999999999999999999.9999999999"),
                Some("0"),
                None,
            ],
        );
        let a = a.as_primitive::<Decimal128Type>();
        assert_eq!(a.value(0), 10i128.pow(38) - 1);
        assert_eq!(a.value(1), -(10i128.pow(38) - 1));
        assert_eq!(a.value(2), 0);
        assert!(a.is_null(3));
        reject(&dec(38, 10), "10000000000000000000000000000");

        let a = build(
            &dec(12, 2),
            &[Some("-0.5"), Some("12.3"), Some("1.00"), Some("1.000")],
        );
        assert_eq!(
            a.as_primitive::<Decimal128Type>().values().to_vec(),
            vec![-50, 1230, 100, 100]
        );
        let e = reject(&dec(12, 2), "1.005");
        assert!(e.contains("'1.005'") && e.contains("DECIMAL(12,2)"), "{e}");
        reject(&dec(12, 2), "10000000000.00");
        for bad in ["NaN", "Infinity", "-Infinity", "", "abc", "1.2.3"] {
            reject(&dec(12, 2), bad);
        }
    }

    #[test]
    fn text_types_keep_their_text() {
        assert_eq!(
            strings(&CanonicalType::String, &["héllo", "", "a,b", "x  "]),
            vec!["héllo", "", "a,b", "x  "]
        );
        assert_eq!(
            strings(&CanonicalType::Json, &[r#"{"a": [1, 2]}"#]),
            vec![r#"{"a": [1, 2]}"#]
        );
        assert_eq!(
            strings(&CanonicalType::Unknown("money".into()), &["$1.00"]),
            vec!["$1.00"]
        );
        let mut b = ColumnBuilder::new(&CanonicalType::String).unwrap();
        let e = b.append(Some(b"ab\xffcd")).unwrap_err();
        assert!(e.contains("UTF-8"), "{e}");
        assert!(b.is_empty());
    }

    #[test]
    fn bytea_hex() {
        let a = build(
            &CanonicalType::Binary,
            &[Some("\\x0aff"), Some("\\x"), None, Some("\\xDEADbeef")],
        );
        let a = a.as_binary::<i32>();
        assert_eq!(a.value(0), &[0x0a, 0xff]);
        assert_eq!(a.value(1), b"");
        assert!(a.is_null(2));
        assert_eq!(a.value(3), &[0xde, 0xad, 0xbe, 0xef]);
        for bad in ["abc", "\\x0", "\\xzz", "\\x0g", "\\001", ""] {
            reject(&CanonicalType::Binary, bad);
        }
        // A failed value leaves no bytes behind.
        let mut b = ColumnBuilder::new(&CanonicalType::Binary).unwrap();
        b.append(Some(b"\\x01")).unwrap();
        b.append(Some(b"\\x02zz")).unwrap_err();
        b.append(Some(b"\\x03")).unwrap();
        let a = b.finish();
        let a = a.as_binary::<i32>();
        assert_eq!(a.len(), 2);
        assert_eq!(a.value(0), &[1]);
        assert_eq!(a.value(1), &[3]);
    }

    #[test]
    fn uuids_become_canonical_text() {
        assert_eq!(
            strings(
                &CanonicalType::Uuid,
                &[
                    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                    "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
                ]
            ),
            vec![
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
            ]
        );
        for bad in ["", "a0eebc99", "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"] {
            reject(&CanonicalType::Uuid, bad);
        }
    }

    #[test]
    fn dates() {
        let days = |y, m, d| {
            let date = chrono::NaiveDate::from_ymd_opt(y, m, d).unwrap();
            (date - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()).num_days() as i32
        };
        assert_eq!(
            int32s(
                &CanonicalType::Date,
                &[
                    "1970-01-01",
                    "2024-01-31",
                    "1969-12-31",
                    "2024-02-29",
                    "2000-02-29",
                    "0099-01-01",
                    "0001-01-01",
                    "10000-01-01",
                    "1900-03-01",
                ]
            ),
            vec![
                0,
                days(2024, 1, 31),
                -1,
                days(2024, 2, 29),
                days(2000, 2, 29),
                days(99, 1, 1),
                days(1, 1, 1),
                days(10000, 1, 1),
                days(1900, 3, 1),
            ]
        );
        assert_eq!(days(2024, 1, 31), 19753);
        for bad in [
            "2023-02-29",
            "1900-02-29",
            "2024-13-01",
            "2024-00-10",
            "2024-04-31",
            "0000-01-01",
            "99-01-01",
            "2024-1-31",
            "2024-01-31x",
            "2024-01-31 00:00:00",
            "",
        ] {
            reject(&CanonicalType::Date, bad);
        }
        let e = reject(&CanonicalType::Date, "2024-01-31 BC");
        assert!(e.contains("BC"), "{e}");
        let e = reject(&CanonicalType::Date, "infinity");
        assert!(e.contains("infinite"), "{e}");
        reject(&CanonicalType::Date, "-infinity");
    }

    #[test]
    fn times() {
        assert_eq!(
            int64s(
                &CanonicalType::Time,
                &[
                    "00:00:00",
                    "23:59:59.999999",
                    "12:34:56.5",
                    "01:02:03.000001",
                    "01:02:03.1234560",
                ]
            ),
            vec![
                0,
                86_399_999_999,
                45_296_500_000,
                3_723_000_001,
                3_723_123_456
            ]
        );
        let e = reject(&CanonicalType::Time, "24:00:00");
        assert!(e.contains("24:00:00"), "{e}");
        let e = reject(&CanonicalType::Time, "12:00:00.1234567");
        assert!(e.contains("fraction"), "{e}");
        for bad in [
            "12:60:00",
            "12:00:60",
            "25:00:00",
            "12:00",
            "12:00:00.",
            "12:00:00+00",
            "1:00:00",
            "",
        ] {
            reject(&CanonicalType::Time, bad);
        }
    }

    #[test]
    fn timestamps() {
        let micros = |s: &str| {
            let t = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap();
            t.and_utc().timestamp_micros()
        };
        let values = [
            "1970-01-01 00:00:00",
            "1969-12-31 23:59:59.5",
            "1969-12-31 23:59:59.999999",
            "1900-01-01 00:00:00.000001",
            "2024-01-31 12:34:56.123456",
            "0001-01-01 00:00:00",
            "2024-02-29 23:59:59.99",
        ];
        let want: Vec<i64> = values.iter().map(|s| micros(s)).collect();
        assert_eq!(int64s(&CanonicalType::Timestamp, &values), want);
        assert_eq!(want[1], -500_000);
        assert_eq!(want[2], -1);
        assert_eq!(
            int64s(&CanonicalType::Timestamp, &["2024-01-31T12:34:56"]),
            vec![micros("2024-01-31 12:34:56")]
        );
        for bad in [
            "2024-01-31 12:00:00+00",
            "2024-01-31",
            "2024-01-31 12:00:00 BC",
            "infinity",
            "-infinity",
            "2024-01-31 12:00:00.1234567",
            "2024-02-30 00:00:00",
            "2024-01-31  12:00:00",
        ] {
            reject(&CanonicalType::Timestamp, bad);
        }
        // Years i64 microseconds cannot reach.
        let e = reject(&CanonicalType::Timestamp, "294270-01-01 00:00:00");
        assert!(e.contains("range"), "{e}");
    }

    #[test]
    fn timestamptz_converts_offsets_to_utc() {
        let utc = |s: &str| {
            let t = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap();
            t.and_utc().timestamp_micros()
        };
        assert_eq!(
            int64s(
                &CanonicalType::TimestampTz,
                &[
                    "2024-01-31 12:00:00+00",
                    "2024-01-31 12:00:00+05:30",
                    "2024-01-31 12:00:00-08",
                    "2024-01-31 12:00:00.25+01:02:03",
                    "1969-12-31 23:59:59.999999+00",
                    "1970-01-01 00:00:00+01",
                ]
            ),
            vec![
                utc("2024-01-31 12:00:00"),
                utc("2024-01-31 06:30:00"),
                utc("2024-01-31 20:00:00"),
                utc("2024-01-31 10:57:57.25"),
                -1,
                -3_600_000_000,
            ]
        );
        for bad in [
            "2024-01-31 12:00:00",
            "2024-01-31 12:00:00Z",
            "2024-01-31 12:00:00+5",
            "2024-01-31 12:00:00+05:3",
            "2024-01-31 12:00:00+05:60",
            "2024-01-31 12:00:00+00 BC",
            "infinity",
            "2024-01-31 12:00:00+00 ",
        ] {
            reject(&CanonicalType::TimestampTz, bad);
        }
    }

    // ---- arrays ----

    fn list(item: CanonicalType) -> CanonicalType {
        CanonicalType::List(Box::new(item))
    }

    #[test]
    fn int_arrays_with_nulls_and_empties() {
        let a = build(
            &list(CanonicalType::Int32),
            &[
                Some("{1,2,NULL}"),
                Some("{}"),
                None,
                Some("{-2147483648}"),
                Some("{ 3 , null ,4 }"),
            ],
        );
        let l = a.as_list::<i32>();
        assert!(l.is_valid(0) && l.is_valid(1) && l.is_null(2));
        assert_eq!(l.value_offsets(), &[0, 3, 3, 3, 4, 7]);
        let items = l.values().as_primitive::<Int32Type>();
        assert_eq!(items.value(0), 1);
        assert_eq!(items.value(1), 2);
        assert!(items.is_null(2));
        assert_eq!(items.value(3), i32::MIN);
        assert_eq!(items.value(4), 3);
        assert!(items.is_null(5));
        assert_eq!(items.value(6), 4);
    }

    #[test]
    fn text_arrays_with_quotes_and_escapes() {
        let a = build(
            &list(CanonicalType::String),
            &[
                Some(r#"{"a b","c\"d",NULL,"NULL","back\\slash",plain,""}"#),
                Some(r#"{"{x}","a,b"}"#),
                Some(r"{a\,b}"),
            ],
        );
        let l = a.as_list::<i32>();
        let items = l.values().as_string::<i32>();
        let got: Vec<Option<&str>> = items.iter().collect();
        assert_eq!(
            got,
            vec![
                Some("a b"),
                Some("c\"d"),
                None,
                Some("NULL"),
                Some("back\\slash"),
                Some("plain"),
                Some(""),
                Some("{x}"),
                Some("a,b"),
                Some("a,b"),
            ]
        );
        assert_eq!(l.value_offsets(), &[0, 7, 9, 10]);
    }

    #[test]
    fn arrays_of_other_element_types() {
        let a = build(&list(dec(12, 2)), &[Some("{1.50,-0.5,NULL}")]);
        let items = a.as_list::<i32>().values().as_primitive::<Decimal128Type>();
        assert_eq!(items.value(0), 150);
        assert_eq!(items.value(1), -50);
        assert!(items.is_null(2));

        let a = build(
            &list(CanonicalType::Timestamp),
            &[Some(r#"{"1970-01-01 00:00:01","1969-12-31 23:59:59.5"}"#)],
        );
        let items = a
            .as_list::<i32>()
            .values()
            .as_primitive::<TimestampMicrosecondType>();
        assert_eq!(items.values().to_vec(), vec![1_000_000, -500_000]);

        let a = build(&list(CanonicalType::Binary), &[Some(r#"{"\\x0102",NULL}"#)]);
        let items = a.as_list::<i32>().values().as_binary::<i32>();
        assert_eq!(items.value(0), &[1, 2]);
        assert!(items.is_null(1));

        let a = build(&list(CanonicalType::Bool), &[Some("{t,f}")]);
        let items = a.as_list::<i32>().values().as_boolean();
        assert!(items.value(0) && !items.value(1));

        let a = build(
            &list(CanonicalType::Json),
            &[Some(r#"{"{\"a\": 1}","[1, 2]"}"#)],
        );
        let items = a.as_list::<i32>().values().as_string::<i32>();
        assert_eq!(items.value(0), r#"{"a": 1}"#);
        assert_eq!(items.value(1), "[1, 2]");
    }

    #[test]
    fn bad_arrays_are_refused_and_leave_nothing() {
        let ty = list(CanonicalType::Int32);
        let e = reject(&ty, "{{1,2},{3,4}}");
        assert!(e.contains("multi-dimensional"), "{e}");
        let e = reject(&ty, "[0:1]={1,2}");
        assert!(e.contains("bounds"), "{e}");
        let e = reject(&ty, "{1,x}");
        assert!(
            e.contains("element 2 'x'") && e.contains("LIST<INT>"),
            "{e}"
        );
        for bad in [
            "", "1,2", "{1,2", "{1,2}x", "{1,,2}", "{,}", "{1 2}", "{\"1}", "{1\"2\"}", "{1,}",
        ] {
            reject(&ty, bad);
        }

        // A refused array leaves no elements behind.
        let mut b = ColumnBuilder::new(&ty).unwrap();
        b.append(Some(b"{1,2}")).unwrap();
        b.append(Some(b"{3,4,oops}")).unwrap_err();
        b.append(Some(b"{5}")).unwrap();
        let a = b.finish();
        let l = a.as_list::<i32>();
        assert_eq!(l.len(), 2);
        assert_eq!(l.value_offsets(), &[0, 2, 3]);
        assert_eq!(
            l.values().as_primitive::<Int32Type>().values().to_vec(),
            vec![1, 2, 5]
        );
    }

    // ---- errors, types and reuse ----

    #[test]
    fn errors_name_the_value_shortened_and_the_type() {
        let long = "x".repeat(200);
        let e = reject(&CanonicalType::Int64, &long);
        assert!(e.contains(&format!("'{}...'", "x".repeat(60))), "{e}");
        assert!(e.contains("BIGINT"), "{e}");
        assert!(e.len() < 150, "{e}");
        let e = reject(&CanonicalType::Int32, "abc");
        assert_eq!(e, "value 'abc' is not a valid INT: not an integer");
    }

    #[test]
    fn unbuildable_types_are_refused() {
        let struct_ty = CanonicalType::Struct(vec![StructField {
            name: "a".into(),
            ty: CanonicalType::Int32,
        }]);
        let map_ty = CanonicalType::Map(
            Box::new(CanonicalType::String),
            Box::new(CanonicalType::Int32),
        );
        for ty in [
            struct_ty.clone(),
            map_ty,
            CanonicalType::Fixed(16),
            list(list(CanonicalType::Int32)),
            list(struct_ty),
            list(CanonicalType::Fixed(4)),
        ] {
            assert!(ColumnBuilder::new(&ty).is_err(), "{ty}");
        }
    }

    #[test]
    fn finish_gives_exactly_the_arrow_type_and_resets() {
        let cases: Vec<(CanonicalType, &str)> = vec![
            (CanonicalType::Bool, "t"),
            (CanonicalType::Int32, "1"),
            (CanonicalType::Int64, "1"),
            (CanonicalType::UInt64, "1"),
            (CanonicalType::Float32, "1"),
            (CanonicalType::Float64, "1"),
            (dec(38, 10), "1.5"),
            (dec(1, 0), "7"),
            (CanonicalType::String, "a"),
            (CanonicalType::Binary, "\\x00"),
            (CanonicalType::Date, "2024-01-31"),
            (CanonicalType::Time, "01:00:00"),
            (CanonicalType::Timestamp, "2024-01-31 01:00:00"),
            (CanonicalType::TimestampTz, "2024-01-31 01:00:00+00"),
            (CanonicalType::Uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            (CanonicalType::Json, "{}"),
            (CanonicalType::Unknown("money".into()), "$1.00"),
            (list(CanonicalType::Int64), "{1}"),
            (
                list(CanonicalType::TimestampTz),
                "{\"2024-01-31 01:00:00+00\"}",
            ),
            (list(dec(12, 2)), "{1.5}"),
            (
                list(CanonicalType::Uuid),
                "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            ),
        ];
        for (ty, value) in cases {
            let mut b = ColumnBuilder::new(&ty).unwrap();
            assert!(b.is_empty());
            b.append(Some(value.as_bytes())).unwrap();
            b.append(None).unwrap();
            assert_eq!(b.len(), 2);
            let a = b.finish();
            assert_eq!(a.data_type(), &ty.arrow_type(), "{ty}");
            assert_eq!(a.len(), 2);
            assert!(a.is_valid(0) && a.is_null(1), "{ty}");
            a.to_data().validate_full().unwrap();
            // The builder starts over, still of the same type.
            assert_eq!(b.len(), 0);
            b.append(Some(value.as_bytes())).unwrap();
            let a = b.finish();
            assert_eq!(a.data_type(), &ty.arrow_type(), "{ty}");
            assert_eq!(a.len(), 1);
            assert_eq!(a.null_count(), 0);
            a.to_data().validate_full().unwrap();
            let empty = b.finish();
            assert_eq!(empty.len(), 0);
            assert_eq!(empty.data_type(), &ty.arrow_type(), "{ty}");
        }
        assert_eq!(
            CanonicalType::TimestampTz.arrow_type(),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
    }
}
