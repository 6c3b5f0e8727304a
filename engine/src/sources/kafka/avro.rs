//! Avro messages in Confluent's wire format (magic byte 0, a 4-byte
//! big-endian schema id, the Avro binary body), with their schemas fetched
//! from a schema registry by id (`GET /schemas/ids/{id}`) and kept.
//!
//! A message is rendered as the JSON Kafka Connect's JsonConverter would
//! write for it, with its logical types already in the units the decoder
//! reads without hints: `decimal` (and Debezium's `VariableScaleDecimal`)
//! as decimal text, `date` as days, times and timestamps in microseconds
//! (`*-millis`, Debezium's `Time`/`Timestamp` and `Nano*` converted
//! exactly), `uuid` and enums as text, other bytes as base64, unions as
//! their branch's value. The row images then go through the same decoding
//! as JSON events: one set of value rules for every format.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;

/// The unit conversion of an integer with a temporal logical type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    Same,
    /// Milliseconds to microseconds.
    Milli,
    /// Nanoseconds to microseconds (exactly, or an error).
    Nano,
}

/// One compiled schema node (named types are referenced by index).
#[derive(Debug, Clone)]
enum Node {
    Null,
    Boolean,
    Int(Scale),
    Long(Scale),
    Float,
    Double,
    /// `bytes`/`fixed`: base64, or decimal text at `Some(scale)`.
    Bytes(Option<i32>),
    Fixed(usize, Option<i32>),
    String,
    Record(Vec<(String, usize)>),
    /// Debezium's `VariableScaleDecimal` record (`scale`, `value`).
    VariableDecimal,
    Enum(Vec<String>),
    Array(usize),
    Map(usize),
    Union(Vec<usize>),
}

/// A schema, compiled for decoding.
#[derive(Debug)]
pub struct Schema {
    nodes: Vec<Node>,
    root: usize,
    /// Its top-level record has `op` and `after`/`before`: a Debezium
    /// envelope (otherwise a plain row).
    pub envelope: bool,
}

struct Compiler {
    nodes: Vec<Node>,
    named: HashMap<String, usize>,
}

impl Compiler {
    fn full_name(name: &str, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if !name.contains('.') && !ns.is_empty() => format!("{ns}.{name}"),
            _ => name.to_string(),
        }
    }

    fn push(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn compile(&mut self, v: &Value, namespace: Option<&str>) -> Result<usize, String> {
        match v {
            Value::String(name) => self.named_or_primitive(name, namespace, None),
            Value::Array(branches) => {
                let mut idx = Vec::with_capacity(branches.len());
                for b in branches {
                    idx.push(self.compile(b, namespace)?);
                }
                Ok(self.push(Node::Union(idx)))
            }
            Value::Object(o) => {
                let ty = o.get("type").ok_or("a schema object without `type`")?;
                let logical = o.get("logicalType").and_then(Value::as_str);
                let connect = o.get("connect.name").and_then(Value::as_str);
                let ty = match ty {
                    Value::String(t) => t.as_str(),
                    // `{"type": {...}}`: the nested schema.
                    other => return self.compile(other, namespace),
                };
                match ty {
                    "record" | "error" => {
                        let name = o
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or("a record without a name")?;
                        let ns = o.get("namespace").and_then(Value::as_str).or(namespace);
                        let full = Self::full_name(name, ns);
                        if connect == Some("io.debezium.data.VariableScaleDecimal") {
                            let i = self.push(Node::VariableDecimal);
                            self.named.insert(full, i);
                            return Ok(i);
                        }
                        // Registered first: fields may refer to it.
                        let i = self.push(Node::Record(Vec::new()));
                        self.named.insert(full.clone(), i);
                        let inner_ns = full.rsplit_once('.').map(|(n, _)| n.to_string());
                        let mut fields = Vec::new();
                        for f in o
                            .get("fields")
                            .and_then(Value::as_array)
                            .ok_or("a record without fields")?
                        {
                            let fname = f
                                .get("name")
                                .and_then(Value::as_str)
                                .ok_or("a field without a name")?;
                            let ft = f.get("type").ok_or("a field without a type")?;
                            fields
                                .push((fname.to_string(), self.compile(ft, inner_ns.as_deref())?));
                        }
                        self.nodes[i] = Node::Record(fields);
                        Ok(i)
                    }
                    "enum" => {
                        let name = o
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or("an enum without a name")?;
                        let ns = o.get("namespace").and_then(Value::as_str).or(namespace);
                        let symbols = o
                            .get("symbols")
                            .and_then(Value::as_array)
                            .ok_or("an enum without symbols")?
                            .iter()
                            .map(|s| s.as_str().unwrap_or_default().to_string())
                            .collect();
                        let i = self.push(Node::Enum(symbols));
                        self.named.insert(Self::full_name(name, ns), i);
                        Ok(i)
                    }
                    "fixed" => {
                        let name = o
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or("a fixed without a name")?;
                        let ns = o.get("namespace").and_then(Value::as_str).or(namespace);
                        let size = o
                            .get("size")
                            .and_then(Value::as_u64)
                            .ok_or("a fixed without a size")?;
                        let scale = decimal_scale(o, logical);
                        let i = self.push(Node::Fixed(size as usize, scale));
                        self.named.insert(Self::full_name(name, ns), i);
                        Ok(i)
                    }
                    "array" => {
                        let items = self
                            .compile(o.get("items").ok_or("an array without items")?, namespace)?;
                        Ok(self.push(Node::Array(items)))
                    }
                    "map" => {
                        let values = self
                            .compile(o.get("values").ok_or("a map without values")?, namespace)?;
                        Ok(self.push(Node::Map(values)))
                    }
                    "bytes" => Ok(self.push(Node::Bytes(decimal_scale(o, logical)))),
                    primitive => {
                        self.named_or_primitive(primitive, namespace, Some((logical, connect)))
                    }
                }
            }
            _ => Err(format!("not a schema: {v}")),
        }
    }

    fn named_or_primitive(
        &mut self,
        name: &str,
        namespace: Option<&str>,
        annotations: Option<(Option<&str>, Option<&str>)>,
    ) -> Result<usize, String> {
        let (logical, connect) = annotations.unwrap_or((None, None));
        let node = match name {
            "null" => Node::Null,
            "boolean" => Node::Boolean,
            "int" => Node::Int(match (logical, connect) {
                (Some("time-millis"), _) | (_, Some("io.debezium.time.Time")) => Scale::Milli,
                _ => Scale::Same,
            }),
            "long" => Node::Long(match (logical, connect) {
                (Some("timestamp-millis" | "local-timestamp-millis"), _)
                | (
                    _,
                    Some("io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp"),
                ) => Scale::Milli,
                (_, Some("io.debezium.time.NanoTimestamp" | "io.debezium.time.NanoTime")) => {
                    Scale::Nano
                }
                _ => Scale::Same,
            }),
            "float" => Node::Float,
            "double" => Node::Double,
            "bytes" => Node::Bytes(None),
            "string" => Node::String,
            other => {
                let full = Self::full_name(other, namespace);
                return self
                    .named
                    .get(&full)
                    .or_else(|| self.named.get(other))
                    .copied()
                    .ok_or_else(|| format!("unknown type `{other}`"));
            }
        };
        Ok(self.push(node))
    }
}

fn decimal_scale(o: &serde_json::Map<String, Value>, logical: Option<&str>) -> Option<i32> {
    (logical == Some("decimal")).then(|| o.get("scale").and_then(Value::as_i64).unwrap_or(0) as i32)
}

impl Schema {
    /// Compiles a schema's JSON text.
    pub fn parse(text: &str) -> Result<Schema, String> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| format!("the schema is not JSON: {e}"))?;
        let mut c = Compiler {
            nodes: Vec::new(),
            named: HashMap::new(),
        };
        let root = c.compile(&v, None)?;
        let envelope = match &c.nodes[root] {
            Node::Record(fields) => {
                fields.iter().any(|(n, _)| n == "op")
                    && fields.iter().any(|(n, _)| n == "after" || n == "before")
            }
            _ => false,
        };
        Ok(Schema {
            nodes: c.nodes,
            root,
            envelope,
        })
    }

    /// Renders an Avro body as JSON text into `out`.
    pub fn render(&self, body: &[u8], out: &mut String) -> Result<(), String> {
        let mut r = Reader { b: body, i: 0 };
        self.value(self.root, &mut r, out)?;
        if r.i != body.len() {
            return Err(format!("{} bytes after the record", body.len() - r.i));
        }
        Ok(())
    }

    fn value(&self, node: usize, r: &mut Reader<'_>, out: &mut String) -> Result<(), String> {
        match &self.nodes[node] {
            Node::Null => out.push_str("null"),
            Node::Boolean => out.push_str(if r.byte()? != 0 { "true" } else { "false" }),
            Node::Int(s) | Node::Long(s) => {
                let v = r.long()?;
                let v = match s {
                    Scale::Same => v,
                    Scale::Milli => v.checked_mul(1000).ok_or("a time out of range")?,
                    Scale::Nano if v % 1000 == 0 => v / 1000,
                    Scale::Nano => {
                        return Err(format!(
                            "{v} ns has nanoseconds a microsecond column would lose"
                        ));
                    }
                };
                let _ = write!(out, "{v}");
            }
            Node::Float => {
                let b = r.take(4)?;
                number(
                    out,
                    f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
                );
            }
            Node::Double => {
                let b = r.take(8)?;
                number(out, f64::from_le_bytes(b.try_into().expect("8 bytes")));
            }
            Node::Bytes(scale) => {
                let n = r.len()?;
                let b = r.take(n)?;
                bytes(out, b, *scale);
            }
            Node::Fixed(n, scale) => {
                let b = r.take(*n)?;
                bytes(out, b, *scale);
            }
            Node::String => {
                let n = r.len()?;
                let s =
                    std::str::from_utf8(r.take(n)?).map_err(|_| "a string that is not UTF-8")?;
                out.push_str(&serde_json::to_string(s).expect("a string serialises"));
            }
            Node::Record(fields) => {
                out.push('{');
                for (k, (name, f)) in fields.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(name).expect("a name serialises"));
                    out.push(':');
                    self.value(*f, r, out)?;
                }
                out.push('}');
            }
            Node::VariableDecimal => {
                let scale = r.long()? as i32;
                let n = r.len()?;
                bytes(out, r.take(n)?, Some(scale));
            }
            Node::Enum(symbols) => {
                let i = r.long()?;
                let s = symbols
                    .get(i as usize)
                    .ok_or_else(|| format!("enum index {i} out of range"))?;
                out.push_str(&serde_json::to_string(s).expect("a symbol serialises"));
            }
            Node::Array(item) => {
                out.push('[');
                let mut first = true;
                loop {
                    let count = r.block()?;
                    if count == 0 {
                        break;
                    }
                    for _ in 0..count {
                        if !first {
                            out.push(',');
                        }
                        first = false;
                        self.value(*item, r, out)?;
                    }
                }
                out.push(']');
            }
            Node::Map(value) => {
                out.push('{');
                let mut first = true;
                loop {
                    let count = r.block()?;
                    if count == 0 {
                        break;
                    }
                    for _ in 0..count {
                        if !first {
                            out.push(',');
                        }
                        first = false;
                        let n = r.len()?;
                        let k = std::str::from_utf8(r.take(n)?)
                            .map_err(|_| "a map key that is not UTF-8")?;
                        out.push_str(&serde_json::to_string(k).expect("a key serialises"));
                        out.push(':');
                        self.value(*value, r, out)?;
                    }
                }
                out.push('}');
            }
            Node::Union(branches) => {
                let i = r.long()?;
                let b = branches
                    .get(i as usize)
                    .ok_or_else(|| format!("union branch {i} out of range"))?;
                self.value(*b, r, out)?;
            }
        }
        Ok(())
    }
}

fn number(out: &mut String, v: f64) {
    if v.is_finite() {
        let _ = write!(out, "{}", serde_json::Number::from_f64(v).expect("finite"));
    } else if v.is_nan() {
        out.push_str("\"NaN\"");
    } else if v > 0.0 {
        out.push_str("\"Infinity\"");
    } else {
        out.push_str("\"-Infinity\"");
    }
}

/// Bytes as base64 text, or as decimal text when they are a decimal.
fn bytes(out: &mut String, b: &[u8], scale: Option<i32>) {
    match scale {
        Some(s) if b.len() <= 16 => {
            let fill = if b.first().is_some_and(|x| x & 0x80 != 0) {
                0xFF
            } else {
                0
            };
            let mut full = [fill; 16];
            full[16 - b.len()..].copy_from_slice(b);
            let v = i128::from_be_bytes(full);
            out.push('"');
            out.push_str(&crate::sources::decode::decimal_text(v, s));
            out.push('"');
        }
        _ => {
            out.push('"');
            out.push_str(&base64::engine::general_purpose::STANDARD.encode(b));
            out.push('"');
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let v = *self.b.get(self.i).ok_or("the body ends early")?;
        self.i += 1;
        Ok(v)
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .i
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or("the body ends early")?;
        let s = &self.b[self.i..end];
        self.i = end;
        Ok(s)
    }

    /// A zig-zag varint.
    fn long(&mut self) -> Result<i64, String> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7F) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
            }
        }
        Err("a varint longer than 10 bytes".to_string())
    }

    fn len(&mut self) -> Result<usize, String> {
        let n = self.long()?;
        usize::try_from(n).map_err(|_| format!("a negative length {n}"))
    }

    /// The item count of the next array or map block (a negative count is
    /// followed by the block's size in bytes).
    fn block(&mut self) -> Result<u64, String> {
        let n = self.long()?;
        if n < 0 {
            self.long()?;
        }
        Ok(n.unsigned_abs())
    }
}

/// Schemas by id, fetched from the registry on first sight.
#[derive(Clone)]
pub struct Registry {
    url: String,
    /// The URL without credentials, for messages.
    shown: String,
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
    /// This client's schemas (no lock on the way of each message).
    schemas: HashMap<u32, Arc<Schema>>,
    /// The schemas of every clone (the decoding lanes): each is fetched
    /// once, under this lock, whichever lane meets it first.
    shared: Arc<std::sync::Mutex<HashMap<u32, Arc<Schema>>>>,
}

impl Registry {
    /// A client of the registry at `url`, trusting the CA file `ca` (the
    /// source's `tls_ca`) besides the built-in roots for an https URL;
    /// fetches run on `runtime`.
    pub fn new(
        url: &str,
        ca: Option<&std::path::Path>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Registry, String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("schema_registry `{url}`: {e}"))?;
        let mut shown = parsed.clone();
        let _ = shown.set_password(None);
        let _ = shown.set_username("");
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(30));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca)
                .map_err(|e| format!("tls_ca `{}` cannot be read: {e}", ca.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("tls_ca `{}` is not PEM certificates: {e}", ca.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        Ok(Registry {
            url: url.trim_end_matches('/').to_string(),
            shown: shown.to_string().trim_end_matches('/').to_string(),
            http,
            runtime,
            schemas: HashMap::new(),
            shared: Arc::default(),
        })
    }

    /// Splits a Confluent-framed message: its schema and body.
    pub fn frame<'a>(&mut self, value: &'a [u8]) -> Result<(Arc<Schema>, &'a [u8]), String> {
        if value.len() < 5 || value[0] != 0 {
            return Err(format!(
                "not in Confluent's Avro wire format (magic byte 0, schema id): starts with {:02x?}",
                &value[..value.len().min(5)]
            ));
        }
        let id = u32::from_be_bytes(value[1..5].try_into().expect("4 bytes"));
        Ok((self.schema(id)?, &value[5..]))
    }

    fn schema(&mut self, id: u32) -> Result<Arc<Schema>, String> {
        if let Some(s) = self.schemas.get(&id) {
            return Ok(Arc::clone(s));
        }
        let shared = Arc::clone(&self.shared);
        let mut shared = shared
            .lock()
            .map_err(|_| "the schema cache is poisoned".to_string())?;
        if let Some(s) = shared.get(&id) {
            self.schemas.insert(id, Arc::clone(s));
            return Ok(Arc::clone(s));
        }
        let url = format!("{}/schemas/ids/{id}", self.url);
        let http = self.http.clone();
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(500 << attempt));
            }
            let fetched = self.runtime.block_on(async {
                let resp = http
                    .get(&url)
                    .send()
                    .await
                    .map_err(|e| e.without_url().to_string())?;
                let status = resp.status();
                let body = resp.text().await.map_err(|e| e.without_url().to_string())?;
                Ok::<_, String>((status, body))
            });
            match fetched {
                Ok((status, body)) if status.is_success() => {
                    let v: Value = serde_json::from_str(&body)
                        .map_err(|e| format!("schema {id} from {}: {e}", self.shown))?;
                    let text = v["schema"]
                        .as_str()
                        .ok_or_else(|| format!("schema {id} from {}: no `schema`", self.shown))?;
                    let schema = Arc::new(
                        Schema::parse(text)
                            .map_err(|e| format!("schema {id} from {}: {e}", self.shown))?,
                    );
                    self.schemas.insert(id, Arc::clone(&schema));
                    shared.insert(id, Arc::clone(&schema));
                    return Ok(schema);
                }
                Ok((status, body)) if status.is_client_error() => {
                    return Err(format!(
                        "schema {id} is not in the registry {} ({status}: {})",
                        self.shown,
                        body.chars().take(200).collect::<String>()
                    ));
                }
                Ok((status, _)) => last = status.to_string(),
                Err(e) => last = e,
            }
        }
        Err(format!(
            "cannot fetch schema {id} from the registry {}: {last}",
            self.shown
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zz(v: i64) -> Vec<u8> {
        let mut u = ((v << 1) ^ (v >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (u & 0x7F) as u8;
            u >>= 7;
            if u == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    #[test]
    fn renders_records_with_logical_types_as_the_decoder_reads_them() {
        let schema = Schema::parse(
            r#"{"type":"record","name":"Row","namespace":"t","fields":[
                {"name":"id","type":"long"},
                {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
                {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"d","type":{"type":"int","logicalType":"date"}},
                {"name":"opt","type":["null","string"]},
                {"name":"tags","type":{"type":"array","items":"string"}},
                {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
                {"name":"again","type":["null","Row"]}
            ]}"#,
        )
        .unwrap();
        assert!(!schema.envelope);
        let mut body = Vec::new();
        body.extend(zz(-7));
        body.extend(zz(2));
        body.extend([0x04, 0x1A]); // 1050 -> 10.50
        body.extend(zz(1_700_000_000_123));
        body.extend(zz(19_000));
        body.extend(zz(1));
        body.extend(zz(2));
        body.extend(b"hi");
        body.extend(zz(2));
        body.extend(zz(1));
        body.extend(b"a");
        body.extend(zz(1));
        body.extend(b"b");
        body.extend(zz(0));
        body.extend(zz(1));
        body.extend(zz(0));
        let mut out = String::new();
        schema.render(&body, &mut out).unwrap();
        assert_eq!(
            out,
            r#"{"id":-7,"amount":"10.50","ts":1700000000123000,"d":19000,"opt":"hi","tags":["a","b"],"kind":"B","again":null}"#
        );
        assert!(
            schema
                .render(&body[..body.len() - 1], &mut String::new())
                .is_err()
        );
    }

    #[test]
    fn a_debezium_envelope_is_recognised() {
        let schema = Schema::parse(
            r#"{"type":"record","name":"Envelope","namespace":"dbz.public.t","fields":[
                {"name":"before","type":["null",{"type":"record","name":"Value","fields":[{"name":"id","type":"int"}]}]},
                {"name":"after","type":["null","Value"]},
                {"name":"op","type":"string"}
            ]}"#,
        )
        .unwrap();
        assert!(schema.envelope);
    }
}
