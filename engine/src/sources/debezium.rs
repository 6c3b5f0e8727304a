//! Debezium change events, as the file and Kafka sources read them: the
//! envelope (`{before, after, source, op, ...}`, bare or wrapped as
//! `{"schema": ..., "payload": ...}`), the row images an event yields, and
//! the value encodings of Kafka Connect (from the schema part when the
//! event has one, else from the source's `decimal_handling` and
//! `time_precision` settings, which mirror Debezium's connector options).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher as _};
use std::sync::Arc;

use serde::Deserialize;
use urutau_planner::evolution::{SchemaChange, SchemaChanges, promotes};
use urutau_planner::plan::BeforeImages;
use urutau_planner::registry::SourceTableSchema;
use urutau_planner::spec::{ColumnSpec, Ident};
use urutau_planner::types::CanonicalType;

use super::decode::{Logical, TimeUnitOf, top_level_fields_differ};
use super::json_text;
use crate::change_batch::RowKind;

/// A Debezium event's envelope (a `payload` wrapper is opened by
/// [`parse_event`]); row images and ids as their JSON text, `null` as
/// `None`.
#[derive(Default)]
pub struct Envelope<'a> {
    pub op: Option<Cow<'a, str>>,
    pub before: Option<&'a str>,
    pub after: Option<&'a str>,
    pub source: Option<SourceInfo<'a>>,
    /// `transaction.id` (Debezium's transaction metadata).
    pub transaction_id: Option<&'a str>,
}

/// `source` of an envelope: where the change was read.
#[derive(Default)]
pub struct SourceInfo<'a> {
    pub table: Option<Cow<'a, str>>,
    pub schema: Option<Cow<'a, str>>,
    pub ts_ms: Option<i64>,
    /// `txId`, as its JSON text.
    pub tx_id: Option<&'a str>,
}

/// One event, its wrapper opened: the envelope and the schema part, if any.
pub struct Event<'a> {
    pub envelope: Envelope<'a>,
    pub schema: Option<&'a str>,
}

/// Parses an event's text (bare or `{"schema", "payload"}`). Only the
/// envelope's structure is scanned here: the row images are left as text
/// for the typed decoder, which reads each once (see
/// [`super::json_text`]).
pub fn parse_event(text: &str) -> Result<Event<'_>, String> {
    // Scanned in place: building the envelope in a wrapper of its own and
    // moving it out (twice for a `payload`) cost a fortieth of a Kafka
    // decoding lane in copies.
    let mut event = Event {
        envelope: Envelope::default(),
        schema: None,
    };
    let mut payload = None;
    scan_envelope(text, &mut event.envelope, &mut payload, &mut event.schema)
        .map_err(|e| format!("malformed change event: {e}"))?;
    if let Some(p) = payload {
        // The wrapper's own envelope fields, if any, are not the event's.
        event.envelope = Envelope::default();
        let (mut inner_payload, mut inner_schema) = (None, None);
        scan_envelope(
            p,
            &mut event.envelope,
            &mut inner_payload,
            &mut inner_schema,
        )
        .map_err(|e| format!("malformed change event payload: {e}"))?;
    }
    Ok(event)
}

/// The envelope fields of one object into `env`, and the wrapper's
/// `payload` and `schema` (Kafka Connect's schema part,
/// `value.converter.schemas.enable`); a field given twice is an error.
fn scan_envelope<'a>(
    text: &'a str,
    env: &mut Envelope<'a>,
    payload: &mut Option<&'a str>,
    schema: &mut Option<&'a str>,
) -> Result<(), String> {
    let mut seen = Seen::default();
    let mut fields = json_text::fields(text);
    while let Some(field) = fields.next() {
        let (key, raw) = field?;
        match key.as_ref() {
            "op" => seen.once(0, "op", &mut env.op, raw, |r| scanned_string(&fields, r))?,
            "before" => seen.once(1, "before", &mut env.before, raw, Ok)?,
            "after" => seen.once(2, "after", &mut env.after, raw, Ok)?,
            "source" => seen.once(3, "source", &mut env.source, raw, scan_source)?,
            "transaction" => {
                seen.once(4, "transaction", &mut env.transaction_id, raw, |r| {
                    Ok(json_text::field(r, "id")?.filter(|id| !json_text::is_null(id)))
                })?;
            }
            "payload" => seen.once(5, "payload", payload, raw, Ok)?,
            "schema" => seen.once(6, "schema", schema, raw, Ok)?,
            _ => {}
        }
    }
    Ok(())
}

/// `source`'s fields.
fn scan_source(text: &str) -> Result<SourceInfo<'_>, String> {
    let mut s = SourceInfo::default();
    let mut seen = Seen::default();
    let mut fields = json_text::fields(text);
    while let Some(field) = fields.next() {
        let (key, raw) = field?;
        match key.as_ref() {
            "table" => seen.once(0, "table", &mut s.table, raw, |r| {
                scanned_string(&fields, r)
            })?,
            "schema" => seen.once(1, "schema", &mut s.schema, raw, |r| {
                scanned_string(&fields, r)
            })?,
            "ts_ms" => seen.once(2, "ts_ms", &mut s.ts_ms, raw, json_text::integer)?,
            "txId" => seen.once(3, "txId", &mut s.tx_id, raw, Ok)?,
            _ => {}
        }
    }
    Ok(s)
}

/// The string value `raw` of the field `fields` returned last: its content
/// as the scan found it when it has no escapes (not looked through again).
fn scanned_string<'a>(
    fields: &json_text::Fields<'a>,
    raw: &'a str,
) -> Result<Cow<'a, str>, String> {
    match fields.plain_string() {
        Some(content) => Ok(Cow::Borrowed(content)),
        None => json_text::string(raw),
    }
}

/// The fields of one object already read, a bit each (`bit`, numbered
/// per object): each may be given once. It runs for every field of every
/// event: comparing names (by their text) was 2% of a Kafka run.
#[derive(Default)]
struct Seen(u32);

impl Seen {
    /// Reads `raw` into `slot` with `read` (`null` leaves it `None`);
    /// field `name` has bit `bit`.
    fn once<'a, T, R: Into<Option<T>>>(
        &mut self,
        bit: u32,
        name: &'static str,
        slot: &mut Option<T>,
        raw: &'a str,
        read: impl FnOnce(&'a str) -> Result<R, String>,
    ) -> Result<(), String> {
        let mask = 1 << bit;
        if self.0 & mask != 0 {
            return Err(format!("duplicate field `{name}`"));
        }
        self.0 |= mask;
        if !json_text::is_null(raw) {
            *slot = read(raw).map_err(|e| format!("`{name}`: {e}"))?.into();
        }
        Ok(())
    }
}

impl Envelope<'_> {
    /// The event's transaction id (`transaction.id`, else `source.txId`).
    pub fn transaction_id(&self) -> Option<String> {
        self.transaction_id
            .or(self.source.as_ref().and_then(|s| s.tx_id))
            .map(str::to_string)
    }

    /// When the change was committed at the source (`source.ts_ms`), in
    /// microseconds.
    pub fn commit_ts_micros(&self) -> Option<i64> {
        self.source
            .as_ref()
            .and_then(|s| s.ts_ms)
            .map(|ms| ms * 1000)
    }
}

/// The row images of one event (at most two), in emission order.
pub type RowImages<'a> = [Option<(RowKind, &'a str)>; 2];

/// What an event means for a routed table.
pub enum EventRows<'a> {
    /// Row images to decode; `snapshot` for `op = r`.
    Rows {
        images: RowImages<'a>,
        snapshot: bool,
    },
    /// `op = t`: the table was truncated.
    Truncate,
}

/// The row images of an event with op `op` for a table whose routes need
/// `before_images`; an error names what is wrong with the event.
pub fn row_images<'a>(
    op: &str,
    before: Option<&'a str>,
    after: Option<&'a str>,
    before_images: &BeforeImages,
) -> Result<EventRows<'a>, String> {
    let need = |kind: RowKind, image: Option<&'a str>| match image {
        Some(i) if !json_text::is_null(i) => Ok((kind, i)),
        _ => Err(format!(
            "op `{op}` needs `{}`, which is null or missing",
            if kind == RowKind::Delete {
                "before"
            } else {
                "after"
            }
        )),
    };
    Ok(match op {
        "c" => EventRows::Rows {
            images: [Some(need(RowKind::Insert, after)?), None],
            snapshot: false,
        },
        "r" => EventRows::Rows {
            images: [Some(need(RowKind::Insert, after)?), None],
            snapshot: true,
        },
        // The before image follows the after image: it is only emitted for
        // a key the update left, which no other row of this update touches,
        // so the order does not matter.
        "u" => {
            let after = need(RowKind::Update, after)?;
            let before = before.filter(|b| !json_text::is_null(b));
            let wants = match (before, before_images) {
                (None, _) | (_, BeforeImages::Never) => false,
                (Some(_), BeforeImages::Always) => true,
                (Some(b), BeforeImages::OnKeyChange(columns)) => {
                    // Not a plain object: the full decode will say why.
                    top_level_fields_differ(b, after.1, columns)
                }
            };
            EventRows::Rows {
                images: [
                    Some(after),
                    wants.then(|| (RowKind::UpdateBefore, before.expect("checked"))),
                ],
                snapshot: false,
            }
        }
        "d" => EventRows::Rows {
            images: [Some(need(RowKind::Delete, before)?), None],
            snapshot: false,
        },
        "t" => EventRows::Truncate,
        other => return Err(format!("unknown op `{other}` (c, r, u, d, t)")),
    })
}

/// Debezium's `decimal.handling.mode`: how a schemaless event encodes
/// DECIMAL columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecimalHandling {
    /// Base64 of the big-endian two's-complement unscaled value, at the
    /// declared scale (Debezium's default).
    Precise,
    /// Decimal text (`"10.50"`).
    String,
    /// A JSON number.
    Double,
}

/// Debezium's `time.precision.mode`: the unit of integer TIME and
/// TIMESTAMP values in a schemaless event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimePrecision {
    /// Debezium's default: microseconds for columns of default precision
    /// (`MicroTime`, `MicroTimestamp`).
    Adaptive,
    /// Like adaptive; TIME always in microseconds.
    AdaptiveTimeMicroseconds,
    /// Kafka Connect's types: milliseconds.
    Connect,
}

/// How a source's schemaless events encode values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encodings {
    pub decimal: DecimalHandling,
    pub time: TimePrecision,
}

impl Encodings {
    /// Reads `decimal_handling` and `time_precision` (checked option
    /// values), with the kind's default decimal handling.
    pub fn from_options(
        decimal: Option<&str>,
        time: Option<&str>,
        default_decimal: DecimalHandling,
    ) -> Self {
        Encodings {
            decimal: match decimal {
                Some("precise") => DecimalHandling::Precise,
                Some("string") => DecimalHandling::String,
                Some("double") => DecimalHandling::Double,
                _ => default_decimal,
            },
            time: match time {
                Some("connect") => TimePrecision::Connect,
                Some("adaptive_time_microseconds") => TimePrecision::AdaptiveTimeMicroseconds,
                _ => TimePrecision::Adaptive,
            },
        }
    }

    /// The encoding of each declared column of `table` when an event has
    /// no schema part.
    pub fn column_logicals(&self, table: &SourceTableSchema) -> Vec<Logical> {
        table
            .columns
            .iter()
            .map(|c| match (&c.ty, self.decimal, self.time) {
                (CanonicalType::Decimal { scale, .. }, DecimalHandling::Precise, _) => {
                    Logical::DecimalBytes {
                        scale: *scale as i32,
                    }
                }
                (CanonicalType::Time | CanonicalType::Timestamp, _, TimePrecision::Connect) => {
                    Logical::Epoch(TimeUnitOf::Millis)
                }
                _ => Logical::Plain,
            })
            .collect()
    }
}

/// The value encodings a Kafka Connect schema part gives the fields of an
/// event's row images (`after`, else `before`): field name -> encoding;
/// and the shape of the row it describes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ConnectFields {
    pub fields: HashMap<String, Logical>,
    /// The row's fields in order, each with its canonical type (`None`:
    /// a Connect type with no canonical one, e.g. a variable-scale
    /// decimal).
    pub shape: Vec<(String, Option<CanonicalType>)>,
}

#[derive(Deserialize)]
struct SchemaNode {
    #[serde(default, rename = "type")]
    ty: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    field: Option<String>,
    #[serde(default)]
    fields: Vec<SchemaNode>,
    #[serde(default)]
    items: Option<Box<SchemaNode>>,
    #[serde(default)]
    keys: Option<Box<SchemaNode>>,
    #[serde(default)]
    values: Option<Box<SchemaNode>>,
    #[serde(default)]
    parameters: HashMap<String, serde_json::Value>,
}

/// A schema parameter as a number (Connect writes them as strings).
fn parameter(node: &SchemaNode, key: &str) -> Option<i64> {
    match node.parameters.get(key)? {
        serde_json::Value::String(s) => s.parse().ok(),
        serde_json::Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// The canonical type of a Connect schema node, as Debezium's logical
/// names and Connect's types describe the column (`None`: none fits).
fn canonical_of(node: &SchemaNode) -> Option<CanonicalType> {
    use CanonicalType as C;
    let logical = node.name.as_deref().unwrap_or("");
    Some(match logical {
        "org.apache.kafka.connect.data.Decimal" => C::Decimal {
            precision: parameter(node, "connect.decimal.precision").unwrap_or(38) as u8,
            scale: parameter(node, "scale")? as u8,
        },
        "io.debezium.data.VariableScaleDecimal" => return None,
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => C::Date,
        "io.debezium.time.Time"
        | "org.apache.kafka.connect.data.Time"
        | "io.debezium.time.MicroTime"
        | "io.debezium.time.NanoTime"
        | "io.debezium.time.ZonedTime" => C::Time,
        "io.debezium.time.Timestamp"
        | "org.apache.kafka.connect.data.Timestamp"
        | "io.debezium.time.MicroTimestamp"
        | "io.debezium.time.NanoTimestamp" => C::Timestamp,
        "io.debezium.time.ZonedTimestamp" => C::TimestampTz,
        "io.debezium.data.Json" => C::Json,
        "io.debezium.data.Uuid" => C::Uuid,
        "io.debezium.data.Enum" | "io.debezium.data.Bits" => C::String,
        _ => match node.ty.as_deref()? {
            "int8" | "int16" | "int32" => C::Int32,
            "int64" => C::Int64,
            "float" | "float32" => C::Float32,
            "double" | "float64" => C::Float64,
            "boolean" => C::Bool,
            "string" => C::String,
            "bytes" => C::Binary,
            "array" => C::List(Box::new(canonical_of(node.items.as_deref()?)?)),
            "map" => C::Map(
                Box::new(canonical_of(node.keys.as_deref()?)?),
                Box::new(canonical_of(node.values.as_deref()?)?),
            ),
            _ => return None,
        },
    })
}

impl ConnectFields {
    /// Reads an envelope's schema part.
    pub fn parse(schema: &str) -> Result<ConnectFields, String> {
        let node: SchemaNode = serde_json::from_str(schema)
            .map_err(|e| format!("malformed schema part of a change event: {e}"))?;
        let image = node
            .fields
            .iter()
            .find(|f| f.field.as_deref() == Some("after"))
            .or_else(|| {
                node.fields
                    .iter()
                    .find(|f| f.field.as_deref() == Some("before"))
            });
        // A schema of the row itself (a raw record) has its fields at the top.
        let fields = match image {
            Some(i) => &i.fields,
            None => &node.fields,
        };
        let mut out = HashMap::new();
        let mut shape = Vec::with_capacity(fields.len());
        for f in fields {
            let Some(name) = &f.field else { continue };
            out.insert(name.clone(), logical_of(f)?);
            shape.push((name.clone(), canonical_of(f)));
        }
        Ok(ConnectFields { fields: out, shape })
    }

    /// What this schema part asks of a table planned as `planned`: `None`
    /// when the plan reads its events as they are; else the grown shape
    /// (Debezium's events carry their table's shape, so a column added or
    /// widened at the source shows here first): fields the plan lacks are
    /// added, nullable (those without a canonical type are left out, as
    /// undeclared fields are), and a planned column whose type the event
    /// widens in place is widened. Other type differences stay the
    /// declaration's to convert (or refuse, value by value). With
    /// `schema_changes = 'fail'` any such change is an error saying what
    /// changed.
    pub fn shape_change(
        &self,
        source: &str,
        table: &[String],
        planned: &SourceTableSchema,
        policy: SchemaChanges,
    ) -> Result<Option<SchemaChange>, String> {
        let mut grown = planned.clone();
        let mut what = Vec::new();
        let mut added = Vec::new();
        for (name, ty) in &self.shape {
            let Some(ty) = ty else { continue };
            match grown.columns.iter_mut().find(|c| &c.name.name == name) {
                Some(c) if promotes(&c.ty, ty) => {
                    what.push(format!("column {name} changed from {} to {ty}", c.ty));
                    c.ty = ty.clone();
                }
                Some(_) => {}
                None => {
                    what.push(format!("column {name} ({ty}) added"));
                    added.push(name.clone());
                    grown.columns.push(ColumnSpec {
                        name: Ident::new(name.clone(), Default::default()),
                        ty: ty.clone(),
                        nullable: true,
                    });
                }
            }
        }
        if what.is_empty() {
            return Ok(None);
        }
        let description = what.join("; ");
        if policy == SchemaChanges::Fail {
            return Err(format!(
                "the events' schema part says table {} changed at the source: {description}; its routes set schema_changes = 'fail' (set it to 'evolve' to let the targets follow)",
                table.join(".")
            ));
        }
        Ok(Some(SchemaChange {
            source: source.to_string(),
            table: table.to_vec(),
            schema: grown,
            description,
            added,
        }))
    }
}

fn logical_of(f: &SchemaNode) -> Result<Logical, String> {
    let name = f.name.as_deref().unwrap_or("");
    Ok(match name {
        "org.apache.kafka.connect.data.Decimal" => {
            let scale = f
                .parameters
                .get("scale")
                .and_then(|s| match s {
                    serde_json::Value::String(s) => s.parse::<i32>().ok(),
                    serde_json::Value::Number(n) => n.as_i64().map(|n| n as i32),
                    _ => None,
                })
                .ok_or_else(|| {
                    format!(
                        "field `{}`: a Decimal schema without a scale parameter",
                        f.field.as_deref().unwrap_or("?")
                    )
                })?;
            Logical::DecimalBytes { scale }
        }
        "io.debezium.data.VariableScaleDecimal" => Logical::VariableDecimal,
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => {
            Logical::Epoch(TimeUnitOf::Days)
        }
        "io.debezium.time.Time"
        | "org.apache.kafka.connect.data.Time"
        | "io.debezium.time.Timestamp"
        | "org.apache.kafka.connect.data.Timestamp" => Logical::Epoch(TimeUnitOf::Millis),
        "io.debezium.time.MicroTime" | "io.debezium.time.MicroTimestamp" => {
            Logical::Epoch(TimeUnitOf::Micros)
        }
        "io.debezium.time.NanoTime" | "io.debezium.time.NanoTimestamp" => {
            Logical::Epoch(TimeUnitOf::Nanos)
        }
        "io.debezium.time.ZonedTime" => Logical::ZonedTime,
        _ => Logical::Plain,
    })
}

/// Parsed schema parts, by their text's hash: a topic's events repeat one
/// schema part (3-4 kB each), which is parsed once.
#[derive(Default)]
pub struct SchemaCache {
    parsed: HashMap<u64, Vec<ParsedSchema>>,
}

/// A schema part's text and its encodings.
type ParsedSchema = (Box<str>, Arc<ConnectFields>);

impl SchemaCache {
    /// The encodings of `schema` (parsed on first sight).
    pub fn get(&mut self, text: &str) -> Result<Arc<ConnectFields>, String> {
        let mut h = std::hash::BuildHasher::build_hasher(&foldhash::quality::FixedState::default());
        text.hash(&mut h);
        let bucket = self.parsed.entry(h.finish()).or_default();
        if let Some((_, f)) = bucket.iter().find(|(t, _)| &**t == text) {
            return Ok(Arc::clone(f));
        }
        let fields = Arc::new(ConnectFields::parse(text)?);
        if self.parsed.len() > 1024 {
            // Schemas churning without end: forget them rather than grow.
            self.parsed.clear();
        }
        self.parsed
            .entry(h.finish())
            .or_default()
            .push((text.into(), Arc::clone(&fields)));
        Ok(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_part_gives_each_field_its_encoding() {
        let schema = r#"{"type":"struct","fields":[
            {"type":"struct","fields":[
                {"type":"int32","optional":false,"field":"id"},
                {"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"},"field":"balance"},
                {"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1,"field":"t"},
                {"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1,"field":"d"},
                {"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1,"field":"ts"}
            ],"optional":true,"name":"dbz.public.t.Value","field":"before"},
            {"type":"struct","fields":[
                {"type":"int32","optional":false,"field":"id"},
                {"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"},"field":"balance"},
                {"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1,"field":"t"},
                {"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1,"field":"d"},
                {"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1,"field":"ts"}
            ],"optional":true,"name":"dbz.public.t.Value","field":"after"},
            {"type":"string","optional":false,"field":"op"}
        ],"optional":false,"name":"dbz.public.t.Envelope"}"#;
        let f = ConnectFields::parse(schema).unwrap();
        assert_eq!(f.fields["id"], Logical::Plain);
        assert_eq!(f.fields["balance"], Logical::DecimalBytes { scale: 2 });
        assert_eq!(f.fields["t"], Logical::Epoch(TimeUnitOf::Micros));
        assert_eq!(f.fields["d"], Logical::Epoch(TimeUnitOf::Days));
        assert_eq!(f.fields["ts"], Logical::Plain);
        let mut cache = SchemaCache::default();
        let a = cache.get(schema).unwrap();
        let b = cache.get(schema).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn a_schema_part_grows_the_plan_by_added_and_widened_columns() {
        let schema = r#"{"type":"struct","fields":[{"type":"struct","field":"after","fields":[
            {"type":"int64","optional":false,"field":"id"},
            {"type":"int64","optional":true,"field":"qty"},
            {"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"amount"},
            {"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","field":"at"},
            {"type":"array","optional":true,"items":{"type":"string","optional":true},"field":"tags"},
            {"type":"struct","optional":true,"name":"io.debezium.data.VariableScaleDecimal","fields":[],"field":"odd"},
            {"type":"string","optional":true,"field":"name"}
        ]}]}"#;
        let f = ConnectFields::parse(schema).unwrap();
        let planned = SourceTableSchema {
            columns: vec![
                ColumnSpec {
                    name: Ident::new("id", Default::default()),
                    ty: CanonicalType::Int64,
                    nullable: false,
                },
                ColumnSpec {
                    name: Ident::new("qty", Default::default()),
                    ty: CanonicalType::Int32,
                    nullable: true,
                },
                ColumnSpec {
                    name: Ident::new("name", Default::default()),
                    ty: CanonicalType::Json,
                    nullable: true,
                },
            ],
            primary_key: vec!["id".into()],
            dropped: vec![],
        };
        let table = vec!["t".to_string()];
        let change = f
            .shape_change("k", &table, &planned, SchemaChanges::Evolve)
            .unwrap()
            .unwrap();
        let shape: Vec<String> = change
            .schema
            .columns
            .iter()
            .map(|c| format!("{} {}", c.name.name, c.ty))
            .collect();
        assert_eq!(
            shape,
            [
                "id BIGINT",
                "qty BIGINT",
                "name JSON",
                "amount DECIMAL(12,2)",
                "at TIMESTAMPTZ",
                "tags LIST<VARCHAR>"
            ],
            "a declared type the event does not widen stays; odd has no canonical type"
        );
        assert_eq!(change.added, ["amount", "at", "tags"]);
        assert!(
            change
                .description
                .starts_with("column qty changed from INT to BIGINT")
        );
        // Planned as grown: nothing more to change.
        assert!(
            f.shape_change("k", &table, &change.schema, SchemaChanges::Evolve)
                .unwrap()
                .is_none()
        );
        let e = f
            .shape_change("k", &table, &planned, SchemaChanges::Fail)
            .unwrap_err();
        assert!(e.contains("schema_changes = 'fail'"), "{e}");
    }

    #[test]
    fn wrapped_and_bare_events_parse_alike() {
        let bare = r#"{"before":null,"after":{"id":1},"source":{"table":"t","ts_ms":5},"op":"c"}"#;
        let wrapped = format!(r#"{{"schema":{{"type":"struct","fields":[]}},"payload":{bare}}}"#);
        for text in [bare, wrapped.as_str()] {
            let e = parse_event(text).unwrap();
            assert_eq!(e.envelope.op.as_deref(), Some("c"));
            assert_eq!(e.envelope.after.unwrap(), r#"{"id":1}"#);
            assert_eq!(e.envelope.commit_ts_micros(), Some(5000));
        }
        assert!(parse_event(&wrapped).unwrap().schema.is_some());
        let rows = row_images("d", None, None, &BeforeImages::Never);
        assert!(rows.is_err_and(|e| e.contains("`before`")));
    }

    #[test]
    fn every_envelope_and_source_field_may_be_given_once() {
        let fields = [
            r#""op":"u""#,
            r#""before":{"id":1}"#,
            r#""after":{"id":1}"#,
            r#""source":{"table":"t","schema":"s","ts_ms":5,"txId":7}"#,
            r#""transaction":{"id":"x"}"#,
        ];
        // Each once: no field is taken for another.
        let all = format!("{{{}}}", fields.join(","));
        let e = parse_event(&all).unwrap();
        assert_eq!(e.envelope.transaction_id.unwrap(), r#""x""#);
        let source = e.envelope.source.unwrap();
        assert_eq!(source.tx_id, Some("7"));
        assert_eq!(source.schema.as_deref(), Some("s"));
        let wrapped = r#"{"schema":{},"payload":{"op":"c"}}"#;
        assert!(parse_event(wrapped).is_ok());
        // Each twice: an error naming it.
        for (f, name) in fields
            .iter()
            .zip(["op", "before", "after", "source", "transaction"])
        {
            let err = parse_event(&format!("{{{f},{f}}}")).err().unwrap();
            assert!(err.contains(&format!("duplicate field `{name}`")), "{err}");
        }
        for name in ["payload", "schema"] {
            let err = parse_event(&format!(r#"{{"{name}":{{}},"{name}":{{}}}}"#))
                .err()
                .unwrap();
            assert!(err.contains(&format!("duplicate field `{name}`")), "{err}");
        }
        for f in [
            r#""table":"t""#,
            r#""schema":"s""#,
            r#""ts_ms":1"#,
            r#""txId":2"#,
        ] {
            let err = parse_event(&format!(r#"{{"op":"c","source":{{{f},{f}}}}}"#))
                .err()
                .unwrap();
            assert!(err.contains("`source`: duplicate field"), "{err}");
        }
    }
}
