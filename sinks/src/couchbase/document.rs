//! Arrow rows as Couchbase documents: the key text and the JSON body.
//!
//! Built column by column into one buffer per row (no per-row maps): each
//! column gets an [`Encoder`] over its typed array once, then appends its
//! value of every row.
//!
//! The text forms, one per type (documented in the README):
//! - bool, int32/int64/uint64 and finite floats: JSON booleans and numbers
//!   (every digit of a uint64 is kept in the text);
//! - decimal: a string with every digit and the scale's zeros (`"12.50"`);
//! - string, uuid: JSON strings; json: the JSON value itself, embedded;
//! - binary, fixed: base64 strings (standard alphabet, padded);
//! - date `"2024-01-31"`, time `"12:34:56.789012"`, timestamp
//!   `"2024-01-31T12:34:56.789012"`, timestamptz `"2024-01-31T12:34:56.789012Z"`
//!   (always six fractional digits);
//! - struct: an object; list: an array; map: an object when its keys are
//!   text, otherwise an array of `[key, value]` pairs.
//!
//! A float that is NaN or infinite, or a json column whose text is not
//! JSON, has no JSON form: the batch is rejected with the table, the key
//! and the column.

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Date32Array, Decimal128Array,
    FixedSizeBinaryArray, Float32Array, Float64Array, Int32Array, Int64Array, ListArray, MapArray,
    StringArray, StructArray, Time64MicrosecondArray, TimestampMicrosecondArray, UInt64Array,
};
use base64::Engine as _;
use urutau_planner::types::CanonicalType;

/// The reserved object holding a document's pipeline metadata.
pub const METADATA_FIELD: &str = "_urutau";

/// Writes one value of a column as JSON.
enum Encoder<'a> {
    Bool(&'a BooleanArray),
    Int32(&'a Int32Array),
    Int64(&'a Int64Array),
    UInt64(&'a UInt64Array),
    Float32(&'a Float32Array),
    Float64(&'a Float64Array),
    Decimal(&'a Decimal128Array),
    Text(&'a StringArray),
    Json(&'a StringArray),
    Binary(&'a BinaryArray),
    Fixed(&'a FixedSizeBinaryArray),
    Date(&'a Date32Array),
    Time(&'a Time64MicrosecondArray),
    Timestamp(&'a TimestampMicrosecondArray, bool),
    Struct(&'a StructArray, Vec<(Vec<u8>, Encoder<'a>)>),
    List(&'a ListArray, Box<Encoder<'a>>),
    Map {
        map: &'a MapArray,
        keys: Box<Encoder<'a>>,
        values: Box<Encoder<'a>>,
        text_keys: bool,
    },
}

/// Why a value has no JSON form (the column is added by the caller).
#[derive(Debug)]
pub struct NoJsonForm(pub String);

impl<'a> Encoder<'a> {
    fn new(array: &'a ArrayRef, ty: &CanonicalType) -> Result<Encoder<'a>, NoJsonForm> {
        use CanonicalType as C;
        let unexpected = || {
            NoJsonForm(format!(
                "an Arrow {} column where {ty:?} was planned",
                array.data_type()
            ))
        };
        Ok(match ty {
            C::Bool => Encoder::Bool(array.as_boolean_opt().ok_or_else(unexpected)?),
            C::Int32 => Encoder::Int32(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::Int64 => Encoder::Int64(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::UInt64 => Encoder::UInt64(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::Float32 => Encoder::Float32(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::Float64 => Encoder::Float64(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::Decimal { .. } => Encoder::Decimal(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::String | C::Uuid | C::Unknown(_) => {
                Encoder::Text(array.as_string_opt().ok_or_else(unexpected)?)
            }
            C::Json => Encoder::Json(array.as_string_opt().ok_or_else(unexpected)?),
            C::Binary => Encoder::Binary(array.as_binary_opt().ok_or_else(unexpected)?),
            C::Fixed(_) => Encoder::Fixed(array.as_fixed_size_binary_opt().ok_or_else(unexpected)?),
            C::Date => Encoder::Date(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::Time => Encoder::Time(array.as_primitive_opt().ok_or_else(unexpected)?),
            C::Timestamp | C::TimestampTz => Encoder::Timestamp(
                array.as_primitive_opt().ok_or_else(unexpected)?,
                matches!(ty, C::TimestampTz),
            ),
            C::Struct(fields) => {
                let s = array.as_struct_opt().ok_or_else(unexpected)?;
                let mut children = Vec::with_capacity(fields.len());
                for (f, child) in fields.iter().zip(s.columns()) {
                    children.push((json_name(&f.name), Encoder::new(child, &f.ty)?));
                }
                Encoder::Struct(s, children)
            }
            C::List(item) => {
                let l = array.as_list_opt::<i32>().ok_or_else(unexpected)?;
                Encoder::List(l, Box::new(Encoder::new(l.values(), item)?))
            }
            C::Map(k, v) => {
                let m = array.as_map_opt().ok_or_else(unexpected)?;
                Encoder::Map {
                    map: m,
                    keys: Box::new(Encoder::new(m.keys(), k)?),
                    values: Box::new(Encoder::new(m.values(), v)?),
                    text_keys: matches!(**k, C::String | C::Uuid | C::Unknown(_)),
                }
            }
        })
    }

    fn is_null(&self, row: usize) -> bool {
        let a: &dyn Array = match self {
            Encoder::Bool(a) => *a,
            Encoder::Int32(a) => *a,
            Encoder::Int64(a) => *a,
            Encoder::UInt64(a) => *a,
            Encoder::Float32(a) => *a,
            Encoder::Float64(a) => *a,
            Encoder::Decimal(a) => *a,
            Encoder::Text(a) | Encoder::Json(a) => *a,
            Encoder::Binary(a) => *a,
            Encoder::Fixed(a) => *a,
            Encoder::Date(a) => *a,
            Encoder::Time(a) => *a,
            Encoder::Timestamp(a, _) => *a,
            Encoder::Struct(a, _) => *a,
            Encoder::List(a, _) => *a,
            Encoder::Map { map, .. } => *map,
        };
        a.is_null(row)
    }

    /// Appends the value at `row` as JSON.
    fn write(&self, row: usize, out: &mut Vec<u8>) -> Result<(), NoJsonForm> {
        if self.is_null(row) {
            out.extend_from_slice(b"null");
            return Ok(());
        }
        match self {
            Encoder::Bool(a) => {
                out.extend_from_slice(if a.value(row) { b"true" } else { b"false" })
            }
            Encoder::Int32(a) => write_display(out, a.value(row)),
            Encoder::Int64(a) => write_display(out, a.value(row)),
            Encoder::UInt64(a) => write_display(out, a.value(row)),
            Encoder::Float32(a) => write_float(out, a.value(row) as f64, Some(a.value(row)))?,
            Encoder::Float64(a) => write_float(out, a.value(row), None)?,
            Encoder::Decimal(a) => write_str(out, &a.value_as_string(row)),
            Encoder::Text(a) => write_str(out, a.value(row)),
            Encoder::Json(a) => {
                let text = a.value(row);
                if serde_json::from_str::<&serde_json::value::RawValue>(text).is_err() {
                    return Err(NoJsonForm(format!(
                        "a json value that is not JSON: {}",
                        truncated(text)
                    )));
                }
                out.extend_from_slice(text.trim().as_bytes());
            }
            Encoder::Binary(a) => write_base64(out, a.value(row)),
            Encoder::Fixed(a) => write_base64(out, a.value(row)),
            Encoder::Date(a) => {
                let d = chrono::DateTime::from_timestamp(a.value(row) as i64 * 86_400, 0)
                    .ok_or_else(|| NoJsonForm(format!("a date out of range: {}", a.value(row))))?;
                write_str(out, &d.format("%Y-%m-%d").to_string());
            }
            Encoder::Time(a) => {
                let us = a.value(row);
                let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(
                    (us / 1_000_000) as u32,
                    ((us % 1_000_000) * 1000) as u32,
                )
                .ok_or_else(|| NoJsonForm(format!("a time out of range: {us} µs")))?;
                write_str(out, &t.format("%H:%M:%S%.6f").to_string());
            }
            Encoder::Timestamp(a, tz) => {
                let us = a.value(row);
                let t = chrono::DateTime::from_timestamp_micros(us)
                    .ok_or_else(|| NoJsonForm(format!("a timestamp out of range: {us} µs")))?;
                let f = if *tz {
                    "%Y-%m-%dT%H:%M:%S%.6fZ"
                } else {
                    "%Y-%m-%dT%H:%M:%S%.6f"
                };
                write_str(out, &t.format(f).to_string());
            }
            Encoder::Struct(_, children) => {
                out.push(b'{');
                for (i, (name, child)) in children.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(name);
                    out.push(b':');
                    child.write(row, out)?;
                }
                out.push(b'}');
            }
            Encoder::List(l, item) => {
                let offsets = l.value_offsets();
                out.push(b'[');
                for (n, j) in (offsets[row] as usize..offsets[row + 1] as usize).enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    item.write(j, out)?;
                }
                out.push(b']');
            }
            Encoder::Map {
                map,
                keys,
                values,
                text_keys,
            } => {
                let offsets = map.value_offsets();
                out.push(if *text_keys { b'{' } else { b'[' });
                for (n, j) in (offsets[row] as usize..offsets[row + 1] as usize).enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    if *text_keys {
                        keys.write(j, out)?;
                        out.push(b':');
                        values.write(j, out)?;
                    } else {
                        out.push(b'[');
                        keys.write(j, out)?;
                        out.push(b',');
                        values.write(j, out)?;
                        out.push(b']');
                    }
                }
                out.push(if *text_keys { b'}' } else { b']' });
            }
        }
        Ok(())
    }
}

fn write_display(out: &mut Vec<u8>, v: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, "{v}");
}

fn write_float(out: &mut Vec<u8>, v: f64, as_f32: Option<f32>) -> Result<(), NoJsonForm> {
    if !v.is_finite() {
        return Err(NoJsonForm(format!("{v}: JSON has no NaN or infinity")));
    }
    // serde_json writes the shortest text that reads back to the same float.
    let r = match as_f32 {
        Some(f) => serde_json::to_writer(&mut *out, &f),
        None => serde_json::to_writer(&mut *out, &v),
    };
    r.map_err(|e| NoJsonForm(e.to_string()))
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string always serializes");
}

fn write_base64(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(
        base64::engine::general_purpose::STANDARD
            .encode(b)
            .as_bytes(),
    );
    out.push(b'"');
}

fn json_name(name: &str) -> Vec<u8> {
    serde_json::to_vec(name).expect("a string always serializes")
}

fn truncated(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// One column to write: its JSON name and its values.
pub struct Column<'a> {
    pub name: &'a str,
    pub array: &'a ArrayRef,
    pub ty: &'a CanonicalType,
}

/// A value of `column` without a JSON form, at row `row`.
#[derive(Debug)]
pub struct EncodeError {
    pub row: usize,
    pub column: String,
    pub cause: String,
}

/// The JSON array text of the given columns' values, one per row: a
/// document key (`[42]`, `["eu",7]`).
pub fn key_texts(columns: &[Column<'_>], rows: usize) -> Result<Vec<String>, EncodeError> {
    let mut out: Vec<Vec<u8>> = (0..rows).map(|_| vec![b'[']).collect();
    for (i, c) in columns.iter().enumerate() {
        let enc = encoder(c)?;
        for (row, buf) in out.iter_mut().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            enc.write(row, buf).map_err(|e| at(row, c, e))?;
        }
    }
    Ok(out
        .into_iter()
        .map(|mut b| {
            b.push(b']');
            String::from_utf8(b).expect("JSON text is UTF-8")
        })
        .collect())
}

/// The JSON object text of each row for which `wanted` is true (`None`
/// elsewhere): `data` at the top level, `metadata` (when any) under
/// [`METADATA_FIELD`].
pub fn bodies(
    data: &[Column<'_>],
    metadata: &[Column<'_>],
    rows: usize,
    wanted: impl Fn(usize) -> bool,
) -> Result<Vec<Option<Vec<u8>>>, EncodeError> {
    let mut out: Vec<Option<Vec<u8>>> = (0..rows)
        .map(|r| wanted(r).then(|| Vec::with_capacity(64)))
        .collect();
    if data.is_empty() {
        for buf in out.iter_mut().flatten() {
            buf.push(b'{');
        }
    }
    write_members(data, &mut out, |buf, i| {
        buf.push(if i == 0 { b'{' } else { b',' });
    })?;
    if !metadata.is_empty() {
        let open = json_name(METADATA_FIELD);
        let after_data = !data.is_empty();
        write_members(metadata, &mut out, |buf, i| {
            if i > 0 || after_data {
                buf.push(b',');
            }
            if i == 0 {
                buf.extend_from_slice(&open);
                buf.extend_from_slice(b":{");
            }
        })?;
        for buf in out.iter_mut().flatten() {
            buf.push(b'}');
        }
    }
    for buf in out.iter_mut().flatten() {
        buf.push(b'}');
    }
    Ok(out)
}

/// Appends `"name":value` of every column to each wanted row, after
/// `prefix(buffer, column index)`.
fn write_members(
    cols: &[Column<'_>],
    out: &mut [Option<Vec<u8>>],
    prefix: impl Fn(&mut Vec<u8>, usize),
) -> Result<(), EncodeError> {
    for (i, c) in cols.iter().enumerate() {
        let enc = encoder(c)?;
        let name = json_name(c.name);
        for (row, buf) in out.iter_mut().enumerate() {
            let Some(buf) = buf else { continue };
            prefix(buf, i);
            buf.extend_from_slice(&name);
            buf.push(b':');
            enc.write(row, buf).map_err(|e| at(row, c, e))?;
        }
    }
    Ok(())
}

fn encoder<'a>(c: &Column<'a>) -> Result<Encoder<'a>, EncodeError> {
    Encoder::new(c.array, c.ty).map_err(|e| at(0, c, e))
}

fn at(row: usize, c: &Column<'_>, e: NoJsonForm) -> EncodeError {
    EncodeError {
        row,
        column: c.name.to_string(),
        cause: e.0,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        Int32Builder, ListBuilder, MapBuilder, StringBuilder, TimestampMicrosecondArray,
    };
    use arrow::datatypes::{DataType, Field, Fields};
    use urutau_planner::types::StructField;

    use super::*;

    fn col<'a>(name: &'a str, array: &'a ArrayRef, ty: &'a CanonicalType) -> Column<'a> {
        Column { name, array, ty }
    }

    fn body_texts(data: &[Column<'_>], meta: &[Column<'_>], rows: usize) -> Vec<String> {
        bodies(data, meta, rows, |_| true)
            .unwrap()
            .into_iter()
            .map(|b| String::from_utf8(b.unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn keys_are_exact_json_arrays() {
        let big: ArrayRef = Arc::new(UInt64Array::from(vec![u64::MAX, 7]));
        let region: ArrayRef = Arc::new(StringArray::from(vec!["eu", "a\"b"]));
        let dec: ArrayRef = Arc::new(
            Decimal128Array::from(vec![i128::MAX / 10, -1050])
                .with_precision_and_scale(38, 2)
                .unwrap(),
        );
        let (u, s, d) = (
            CanonicalType::UInt64,
            CanonicalType::String,
            CanonicalType::Decimal {
                precision: 38,
                scale: 2,
            },
        );
        let keys = key_texts(
            &[
                col("r", &region, &s),
                col("id", &big, &u),
                col("d", &dec, &d),
            ],
            2,
        )
        .unwrap();
        assert_eq!(
            keys[0],
            r#"["eu",18446744073709551615,"170141183460469231731687303715884105.72"]"#
        );
        assert_eq!(keys[1], r#"["a\"b",7,"-10.50"]"#);
    }

    #[test]
    fn bodies_are_native_json_with_metadata_apart() {
        let id: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        let json: ArrayRef = Arc::new(StringArray::from(vec![r#" {"a": [1, 2]} "#, "null"]));
        let bin: ArrayRef = Arc::new(BinaryArray::from(vec![&b"\x00\xff"[..], b""]));
        let ts: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(vec![-1, 1_700_000_000_123_456]).with_timezone("UTC"),
        );
        let op: ArrayRef = Arc::new(StringArray::from(vec!["c", "d"]));
        let (i, j, b, t, s) = (
            CanonicalType::Int64,
            CanonicalType::Json,
            CanonicalType::Binary,
            CanonicalType::TimestampTz,
            CanonicalType::String,
        );
        let texts = body_texts(
            &[
                col("id", &id, &i),
                col("doc", &json, &j),
                col("bin", &bin, &b),
                col("at", &ts, &t),
            ],
            &[col("op", &op, &s)],
            2,
        );
        assert_eq!(
            texts[0],
            r#"{"id":1,"doc":{"a": [1, 2]},"bin":"AP8=","at":"1969-12-31T23:59:59.999999Z","_urutau":{"op":"c"}}"#
        );
        assert_eq!(
            texts[1],
            r#"{"id":null,"doc":null,"bin":"","at":"2023-11-14T22:13:20.123456Z","_urutau":{"op":"d"}}"#
        );
        for t in &texts {
            serde_json::from_str::<serde_json::Value>(t).unwrap();
        }
    }

    #[test]
    fn nested_values_are_objects_and_arrays() {
        let mut lb = ListBuilder::new(Int32Builder::new());
        lb.values().append_value(1);
        lb.values().append_null();
        lb.append(true);
        let list: ArrayRef = Arc::new(lb.finish());
        let mut mb = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
        mb.keys().append_value("k");
        mb.values().append_value(5);
        mb.append(true).unwrap();
        let map: ArrayRef = Arc::new(mb.finish());
        let mut ib = MapBuilder::new(None, Int32Builder::new(), StringBuilder::new());
        ib.keys().append_value(3);
        ib.values().append_value("x");
        ib.append(true).unwrap();
        let int_map: ArrayRef = Arc::new(ib.finish());
        let st: ArrayRef = Arc::new(StructArray::new(
            Fields::from(vec![Field::new("a b", DataType::Int32, true)]),
            vec![Arc::new(Int32Array::from(vec![9])) as ArrayRef],
            None,
        ));
        let lt = CanonicalType::List(Box::new(CanonicalType::Int32));
        let mt = CanonicalType::Map(
            Box::new(CanonicalType::String),
            Box::new(CanonicalType::Int32),
        );
        let it = CanonicalType::Map(
            Box::new(CanonicalType::Int32),
            Box::new(CanonicalType::String),
        );
        let stt = CanonicalType::Struct(vec![StructField {
            name: "a b".into(),
            ty: CanonicalType::Int32,
        }]);
        let texts = body_texts(
            &[
                col("l", &list, &lt),
                col("m", &map, &mt),
                col("im", &int_map, &it),
                col("s", &st, &stt),
            ],
            &[],
            1,
        );
        assert_eq!(
            texts[0],
            r#"{"l":[1,null],"m":{"k":5},"im":[[3,"x"]],"s":{"a b":9}}"#
        );
    }

    #[test]
    fn values_without_json_form_name_row_and_column() {
        let f: ArrayRef = Arc::new(Float64Array::from(vec![1.5, f64::NAN]));
        let ft = CanonicalType::Float64;
        let e = bodies(&[col("ratio", &f, &ft)], &[], 2, |_| true).unwrap_err();
        assert_eq!((e.row, e.column.as_str()), (1, "ratio"));
        assert!(e.cause.contains("NaN"), "{}", e.cause);
        let j: ArrayRef = Arc::new(StringArray::from(vec!["{oops"]));
        let jt = CanonicalType::Json;
        let e = bodies(&[col("doc", &j, &jt)], &[], 1, |_| true).unwrap_err();
        assert!(e.cause.contains("not JSON"), "{}", e.cause);
        // Rows that are not wanted (deletes) are not encoded at all.
        let out = bodies(&[col("ratio", &f, &ft)], &[], 2, |r| r == 0).unwrap();
        assert_eq!(out[0].as_deref(), Some(&b"{\"ratio\":1.5}"[..]));
        assert!(out[1].is_none());
    }
}
