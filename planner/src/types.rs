//! Canonical types: the closed set of column kinds every source maps into and
//! every sink maps out of, with their Arrow representation.
//!
//! A pipeline never exposes a source's native types to a sink directly: the
//! source decodes into a canonical type, casts move between canonical types
//! under the closed matrix of [`crate::cast`], and each sink has exactly one
//! mapping from canonical types to its own. `uuid` and `json` travel as Arrow
//! `Utf8` (canonical text); the planner tracks their canonical kind beside the
//! Arrow schema so sinks can still write them natively.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, TimeUnit};

/// The time zone name canonical `timestamptz` values carry in Arrow.
pub const UTC: &str = "UTC";

/// Precision bound of `decimal(p,s)`: Arrow `Decimal128` (and Iceberg) stop at 38.
pub const MAX_DECIMAL_PRECISION: u8 = 38;

/// A canonical column type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CanonicalType {
    Bool,
    Int32,
    Int64,
    UInt64,
    Float32,
    Float64,
    Decimal {
        precision: u8,
        scale: u8,
    },
    String,
    Binary,
    Fixed(i32),
    Date,
    Time,
    Timestamp,
    TimestampTz,
    Uuid,
    Json,
    Struct(Vec<StructField>),
    List(Box<CanonicalType>),
    Map(Box<CanonicalType>, Box<CanonicalType>),
    /// A source type with no canonical mapping; the value travels as its raw
    /// text and the name of the source type is kept for messages.
    Unknown(String),
}

/// A named field of a `struct<...>` type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StructField {
    pub name: String,
    pub ty: CanonicalType,
}

/// The parameterless tag of a [`CanonicalType`], used by the cast matrix and
/// in messages (`int64`, `decimal`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Bool,
    Int32,
    Int64,
    UInt64,
    Float32,
    Float64,
    Decimal,
    String,
    Binary,
    Fixed,
    Date,
    Time,
    Timestamp,
    TimestampTz,
    Uuid,
    Json,
    Struct,
    List,
    Map,
    Unknown,
}

impl Kind {
    /// Every scalar kind, in the order the spec lists them.
    pub const SCALARS: [Kind; 16] = [
        Kind::Bool,
        Kind::Int32,
        Kind::Int64,
        Kind::UInt64,
        Kind::Float32,
        Kind::Float64,
        Kind::Decimal,
        Kind::String,
        Kind::Binary,
        Kind::Fixed,
        Kind::Date,
        Kind::Time,
        Kind::Timestamp,
        Kind::TimestampTz,
        Kind::Uuid,
        Kind::Json,
    ];

    /// The lower-case name the spec uses for this kind.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Int32 => "int32",
            Kind::Int64 => "int64",
            Kind::UInt64 => "uint64",
            Kind::Float32 => "float32",
            Kind::Float64 => "float64",
            Kind::Decimal => "decimal",
            Kind::String => "string",
            Kind::Binary => "binary",
            Kind::Fixed => "fixed",
            Kind::Date => "date",
            Kind::Time => "time",
            Kind::Timestamp => "timestamp",
            Kind::TimestampTz => "timestamptz",
            Kind::Uuid => "uuid",
            Kind::Json => "json",
            Kind::Struct => "struct",
            Kind::List => "list",
            Kind::Map => "map",
            Kind::Unknown => "unknown",
        }
    }

    /// Nested kinds carry other types inside.
    pub fn is_nested(self) -> bool {
        matches!(self, Kind::Struct | Kind::List | Kind::Map)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl CanonicalType {
    /// The parameterless kind of this type.
    pub fn kind(&self) -> Kind {
        match self {
            CanonicalType::Bool => Kind::Bool,
            CanonicalType::Int32 => Kind::Int32,
            CanonicalType::Int64 => Kind::Int64,
            CanonicalType::UInt64 => Kind::UInt64,
            CanonicalType::Float32 => Kind::Float32,
            CanonicalType::Float64 => Kind::Float64,
            CanonicalType::Decimal { .. } => Kind::Decimal,
            CanonicalType::String => Kind::String,
            CanonicalType::Binary => Kind::Binary,
            CanonicalType::Fixed(_) => Kind::Fixed,
            CanonicalType::Date => Kind::Date,
            CanonicalType::Time => Kind::Time,
            CanonicalType::Timestamp => Kind::Timestamp,
            CanonicalType::TimestampTz => Kind::TimestampTz,
            CanonicalType::Uuid => Kind::Uuid,
            CanonicalType::Json => Kind::Json,
            CanonicalType::Struct(_) => Kind::Struct,
            CanonicalType::List(_) => Kind::List,
            CanonicalType::Map(_, _) => Kind::Map,
            CanonicalType::Unknown(_) => Kind::Unknown,
        }
    }

    /// The Arrow type values of this canonical type travel as.
    pub fn arrow_type(&self) -> DataType {
        match self {
            CanonicalType::Bool => DataType::Boolean,
            CanonicalType::Int32 => DataType::Int32,
            CanonicalType::Int64 => DataType::Int64,
            CanonicalType::UInt64 => DataType::UInt64,
            CanonicalType::Float32 => DataType::Float32,
            CanonicalType::Float64 => DataType::Float64,
            CanonicalType::Decimal { precision, scale } => {
                DataType::Decimal128(*precision, *scale as i8)
            }
            CanonicalType::String
            | CanonicalType::Uuid
            | CanonicalType::Json
            | CanonicalType::Unknown(_) => DataType::Utf8,
            CanonicalType::Binary => DataType::Binary,
            CanonicalType::Fixed(n) => DataType::FixedSizeBinary(*n),
            CanonicalType::Date => DataType::Date32,
            CanonicalType::Time => DataType::Time64(TimeUnit::Microsecond),
            CanonicalType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            CanonicalType::TimestampTz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC)))
            }
            CanonicalType::Struct(fields) => DataType::Struct(Fields::from(
                fields
                    .iter()
                    .map(|f| Field::new(&f.name, f.ty.arrow_type(), true))
                    .collect::<Vec<_>>(),
            )),
            CanonicalType::List(item) => {
                DataType::List(Arc::new(Field::new("item", item.arrow_type(), true)))
            }
            CanonicalType::Map(key, value) => DataType::Map(
                Arc::new(Field::new(
                    "entries",
                    DataType::Struct(Fields::from(vec![
                        Field::new("key", key.arrow_type(), false),
                        Field::new("value", value.arrow_type(), true),
                    ])),
                    false,
                )),
                false,
            ),
        }
    }

    /// The canonical type an Arrow type computed by an expression belongs to,
    /// or `None` when it has none (intervals, unions, ...). The result's own
    /// Arrow type may differ from `dt` (e.g. `Int16` belongs to `int32`); the
    /// planner casts such values to the canonical representation.
    pub fn from_arrow(dt: &DataType) -> Option<CanonicalType> {
        Some(match dt {
            DataType::Boolean => CanonicalType::Bool,
            DataType::Int8 | DataType::Int16 | DataType::Int32 => CanonicalType::Int32,
            DataType::UInt8 | DataType::UInt16 => CanonicalType::Int32,
            DataType::Int64 | DataType::UInt32 => CanonicalType::Int64,
            DataType::UInt64 => CanonicalType::UInt64,
            DataType::Float16 | DataType::Float32 => CanonicalType::Float32,
            DataType::Float64 => CanonicalType::Float64,
            DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s)
                if *s >= 0 && *p <= MAX_DECIMAL_PRECISION =>
            {
                CanonicalType::Decimal {
                    precision: *p,
                    scale: *s as u8,
                }
            }
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => CanonicalType::String,
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                CanonicalType::Binary
            }
            DataType::FixedSizeBinary(n) => CanonicalType::Fixed(*n),
            DataType::Date32 | DataType::Date64 => CanonicalType::Date,
            DataType::Time32(_) | DataType::Time64(_) => CanonicalType::Time,
            DataType::Timestamp(_, None) => CanonicalType::Timestamp,
            DataType::Timestamp(_, Some(_)) => CanonicalType::TimestampTz,
            DataType::Struct(fields) => CanonicalType::Struct(
                fields
                    .iter()
                    .map(|f| {
                        Some(StructField {
                            name: f.name().clone(),
                            ty: CanonicalType::from_arrow(f.data_type())?,
                        })
                    })
                    .collect::<Option<Vec<_>>>()?,
            ),
            DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => {
                CanonicalType::List(Box::new(CanonicalType::from_arrow(f.data_type())?))
            }
            DataType::Map(entries, _) => match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => CanonicalType::Map(
                    Box::new(CanonicalType::from_arrow(kv[0].data_type())?),
                    Box::new(CanonicalType::from_arrow(kv[1].data_type())?),
                ),
                _ => return None,
            },
            DataType::Dictionary(_, value) => CanonicalType::from_arrow(value)?,
            _ => return None,
        })
    }

    /// Parses a type as written in a pipeline (`BIGINT`, `decimal(20,2)`,
    /// `STRUCT<a INT, b LIST<TEXT>>`, `timestamp with time zone`, ...).
    ///
    /// With `allow_unknown`, a name that is not canonical becomes
    /// [`CanonicalType::Unknown`] (source declarations of a type the engine
    /// cannot map); otherwise it is an error.
    pub fn parse(text: &str, allow_unknown: bool) -> Result<CanonicalType, TypeParseError> {
        let mut p = TypeParser {
            src: text,
            pos: 0,
            allow_unknown,
        };
        let ty = p.parse_type()?;
        p.skip_ws();
        if p.pos < text.len() {
            return Err(p.error(format!("unexpected `{}` after type {ty}", &text[p.pos..])));
        }
        Ok(ty)
    }
}

impl fmt::Display for CanonicalType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CanonicalType::Bool => f.write_str("BOOLEAN"),
            CanonicalType::Int32 => f.write_str("INT"),
            CanonicalType::Int64 => f.write_str("BIGINT"),
            CanonicalType::UInt64 => f.write_str("UBIGINT"),
            CanonicalType::Float32 => f.write_str("REAL"),
            CanonicalType::Float64 => f.write_str("DOUBLE"),
            CanonicalType::Decimal { precision, scale } => {
                write!(f, "DECIMAL({precision},{scale})")
            }
            CanonicalType::String => f.write_str("VARCHAR"),
            CanonicalType::Binary => f.write_str("BYTEA"),
            CanonicalType::Fixed(n) => write!(f, "FIXED({n})"),
            CanonicalType::Date => f.write_str("DATE"),
            CanonicalType::Time => f.write_str("TIME"),
            CanonicalType::Timestamp => f.write_str("TIMESTAMP"),
            CanonicalType::TimestampTz => f.write_str("TIMESTAMPTZ"),
            CanonicalType::Uuid => f.write_str("UUID"),
            CanonicalType::Json => f.write_str("JSON"),
            CanonicalType::Struct(fields) => {
                f.write_str("STRUCT<")?;
                for (i, field) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{} {}", field.name, field.ty)?;
                }
                f.write_str(">")
            }
            CanonicalType::List(item) => write!(f, "LIST<{item}>"),
            CanonicalType::Map(k, v) => write!(f, "MAP<{k}, {v}>"),
            CanonicalType::Unknown(name) => write!(f, "UNKNOWN({name})"),
        }
    }
}

/// A type that could not be parsed; `offset` is the byte offset in the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TypeParseError {
    pub offset: usize,
    pub message: String,
}

struct TypeParser<'a> {
    src: &'a str,
    pos: usize,
    allow_unknown: bool,
}

impl TypeParser<'_> {
    fn error(&self, message: String) -> TypeParseError {
        TypeParseError {
            offset: self.pos,
            message,
        }
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.src[self.pos..].chars().next() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }

    fn peek_char(&mut self) -> Option<char> {
        self.skip_ws();
        self.src[self.pos..].chars().next()
    }

    fn eat_char(&mut self, c: char) -> bool {
        if self.peek_char() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect_char(&mut self, c: char) -> Result<(), TypeParseError> {
        if self.eat_char(c) {
            Ok(())
        } else {
            let found = self
                .peek_char()
                .map_or("end of type".to_string(), |c| format!("`{c}`"));
            Err(self.error(format!("expected `{c}`, found {found}")))
        }
    }

    /// An identifier-like word (letters, digits, `_`), or a double-quoted name.
    fn word(&mut self) -> Option<String> {
        self.skip_ws();
        let rest = &self.src[self.pos..];
        if let Some(stripped) = rest.strip_prefix('"') {
            let end = stripped.find('"')?;
            self.pos += end + 2;
            return Some(stripped[..end].to_string());
        }
        let len = rest
            .char_indices()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
            .map_or(rest.len(), |(i, _)| i);
        if len == 0 {
            return None;
        }
        self.pos += len;
        Some(rest[..len].to_string())
    }

    /// Consumes the given words (case-insensitive) if they all follow.
    fn eat_words(&mut self, words: &[&str]) -> bool {
        let save = self.pos;
        for w in words {
            match self.word() {
                Some(found) if found.eq_ignore_ascii_case(w) => {}
                _ => {
                    self.pos = save;
                    return false;
                }
            }
        }
        true
    }

    fn number(&mut self) -> Result<i64, TypeParseError> {
        self.skip_ws();
        let rest = &self.src[self.pos..];
        let len = rest
            .char_indices()
            .find(|(i, c)| !(c.is_ascii_digit() || (*i == 0 && *c == '-')))
            .map_or(rest.len(), |(i, _)| i);
        let n = rest[..len]
            .parse::<i64>()
            .map_err(|_| self.error("expected a number".to_string()))?;
        self.pos += len;
        Ok(n)
    }

    /// `(n, m, ...)` after a type name, when present.
    fn params(&mut self) -> Result<Vec<i64>, TypeParseError> {
        let mut out = Vec::new();
        if self.eat_char('(') {
            loop {
                out.push(self.number()?);
                if self.eat_char(')') {
                    break;
                }
                self.expect_char(',')?;
            }
        }
        Ok(out)
    }

    fn parse_type(&mut self) -> Result<CanonicalType, TypeParseError> {
        let start = self.pos;
        let Some(name) = self.word() else {
            return Err(self.error("expected a type name".to_string()));
        };
        let lower = name.to_ascii_lowercase();
        let ty = match lower.as_str() {
            "bool" | "boolean" => CanonicalType::Bool,
            "int" | "int4" | "integer" | "int32" => CanonicalType::Int32,
            "bigint" | "int8" | "int64" | "long" => {
                if self.eat_words(&["unsigned"]) {
                    CanonicalType::UInt64
                } else {
                    CanonicalType::Int64
                }
            }
            "ubigint" | "uint64" => CanonicalType::UInt64,
            "real" | "float4" | "float32" => CanonicalType::Float32,
            "double" => {
                self.eat_words(&["precision"]);
                CanonicalType::Float64
            }
            "float8" | "float64" | "float" => CanonicalType::Float64,
            "decimal" | "numeric" => {
                let at = self.pos;
                let params = self.params()?;
                let (p, s) = match params.as_slice() {
                    [p] => (*p, 0),
                    [p, s] => (*p, *s),
                    [] => {
                        if self.allow_unknown {
                            // An unbounded numeric has no canonical mapping.
                            return Ok(CanonicalType::Unknown(name));
                        }
                        return Err(TypeParseError {
                            offset: at,
                            message: format!("{name} needs a precision: {name}(p,s)"),
                        });
                    }
                    _ => {
                        return Err(TypeParseError {
                            offset: at,
                            message: format!("{name} takes (precision, scale)"),
                        });
                    }
                };
                if !(1..=MAX_DECIMAL_PRECISION as i64).contains(&p) || s < 0 || s > p {
                    return Err(TypeParseError {
                        offset: at,
                        message: format!(
                            "{name}({p},{s}) is out of range: precision 1..={MAX_DECIMAL_PRECISION}, scale 0..=precision"
                        ),
                    });
                }
                CanonicalType::Decimal {
                    precision: p as u8,
                    scale: s as u8,
                }
            }
            "varchar" | "text" | "string" | "char" | "character" | "bpchar" | "nvarchar" => {
                if lower == "character" {
                    self.eat_words(&["varying"]);
                }
                self.params()?; // a length is a source constraint, not a type
                CanonicalType::String
            }
            "bytea" | "binary" | "varbinary" | "blob" | "bytes" => {
                self.params()?;
                CanonicalType::Binary
            }
            "fixed" => {
                let at = self.pos;
                match self.params()?.as_slice() {
                    [n] if *n > 0 && *n <= i32::MAX as i64 => CanonicalType::Fixed(*n as i32),
                    _ => {
                        return Err(TypeParseError {
                            offset: at,
                            message: "fixed needs a positive length: FIXED(n)".to_string(),
                        });
                    }
                }
            }
            "date" => CanonicalType::Date,
            "time" => {
                self.params()?;
                if self.eat_words(&["with", "time", "zone"]) {
                    if self.allow_unknown {
                        return Ok(CanonicalType::Unknown("time with time zone".into()));
                    }
                    return Err(TypeParseError {
                        offset: start,
                        message: "time with time zone has no canonical type".to_string(),
                    });
                }
                self.eat_words(&["without", "time", "zone"]);
                CanonicalType::Time
            }
            "timestamp" | "datetime" => {
                self.params()?;
                if self.eat_words(&["with", "time", "zone"]) {
                    CanonicalType::TimestampTz
                } else {
                    self.eat_words(&["without", "time", "zone"]);
                    CanonicalType::Timestamp
                }
            }
            "timestamptz" => {
                self.params()?;
                CanonicalType::TimestampTz
            }
            "uuid" => CanonicalType::Uuid,
            "json" | "jsonb" => CanonicalType::Json,
            "struct" | "row" => {
                let close = if self.eat_char('<') {
                    '>'
                } else {
                    self.expect_char('(')?;
                    ')'
                };
                let mut fields = Vec::new();
                loop {
                    let at = self.pos;
                    let Some(field_name) = self.word() else {
                        return Err(self.error("expected a field name".to_string()));
                    };
                    self.eat_char(':');
                    let ty = self.parse_type()?;
                    if fields.iter().any(|f: &StructField| f.name == field_name) {
                        return Err(TypeParseError {
                            offset: at,
                            message: format!("duplicate struct field `{field_name}`"),
                        });
                    }
                    fields.push(StructField {
                        name: field_name,
                        ty,
                    });
                    if self.eat_char(close) {
                        break;
                    }
                    self.expect_char(',')?;
                }
                CanonicalType::Struct(fields)
            }
            "list" | "array" => {
                let close = if self.eat_char('<') {
                    '>'
                } else {
                    self.expect_char('(')?;
                    ')'
                };
                let item = self.parse_type()?;
                self.expect_char(close)?;
                CanonicalType::List(Box::new(item))
            }
            "map" => {
                let close = if self.eat_char('<') {
                    '>'
                } else {
                    self.expect_char('(')?;
                    ')'
                };
                let key_at = self.pos;
                let key = self.parse_type()?;
                if key.kind().is_nested() {
                    return Err(TypeParseError {
                        offset: key_at,
                        message: format!("map keys must be scalar, found {key}"),
                    });
                }
                self.expect_char(',')?;
                let value = self.parse_type()?;
                self.expect_char(close)?;
                CanonicalType::Map(Box::new(key), Box::new(value))
            }
            _ => {
                if self.allow_unknown {
                    // Keep any parameters in the raw name for messages.
                    let params_start = self.pos;
                    self.params()?;
                    let raw = format!("{name}{}", self.src[params_start..self.pos].trim());
                    CanonicalType::Unknown(raw)
                } else {
                    return Err(TypeParseError {
                        offset: start,
                        message: format!(
                            "unknown type `{name}` (types: BOOLEAN, INT, BIGINT, UBIGINT, REAL, DOUBLE, DECIMAL(p,s), VARCHAR, BYTEA, FIXED(n), DATE, TIME, TIMESTAMP, TIMESTAMPTZ, UUID, JSON, STRUCT<..>, LIST<T>, MAP<K, V>)"
                        ),
                    });
                }
            }
        };
        // Postgres-style array suffix: `INT[]`.
        let mut ty = ty;
        while self.src[self.pos..].trim_start().starts_with("[]") {
            self.skip_ws();
            self.pos += 2;
            ty = CanonicalType::List(Box::new(ty));
        }
        Ok(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> CanonicalType {
        CanonicalType::parse(s, false).unwrap()
    }

    #[test]
    fn parses_every_spelling() {
        assert_eq!(p("BOOLEAN"), CanonicalType::Bool);
        assert_eq!(p("int"), CanonicalType::Int32);
        assert_eq!(p("BIGINT"), CanonicalType::Int64);
        assert_eq!(p("bigint unsigned"), CanonicalType::UInt64);
        assert_eq!(p("UBIGINT"), CanonicalType::UInt64);
        assert_eq!(p("real"), CanonicalType::Float32);
        assert_eq!(p("double precision"), CanonicalType::Float64);
        assert_eq!(
            p("decimal(20, 2)"),
            CanonicalType::Decimal {
                precision: 20,
                scale: 2
            }
        );
        assert_eq!(p("varchar(12)"), CanonicalType::String);
        assert_eq!(p("character varying"), CanonicalType::String);
        assert_eq!(p("bytea"), CanonicalType::Binary);
        assert_eq!(p("fixed(16)"), CanonicalType::Fixed(16));
        assert_eq!(p("timestamp with time zone"), CanonicalType::TimestampTz);
        assert_eq!(
            p("timestamp(6) without time zone"),
            CanonicalType::Timestamp
        );
        assert_eq!(p("TIMESTAMPTZ"), CanonicalType::TimestampTz);
        assert_eq!(p("jsonb"), CanonicalType::Json);
        assert_eq!(
            p("int[]"),
            CanonicalType::List(Box::new(CanonicalType::Int32))
        );
        assert_eq!(
            p("STRUCT<a INT, b LIST<TEXT>>"),
            CanonicalType::Struct(vec![
                StructField {
                    name: "a".into(),
                    ty: CanonicalType::Int32
                },
                StructField {
                    name: "b".into(),
                    ty: CanonicalType::List(Box::new(CanonicalType::String))
                },
            ])
        );
        assert_eq!(
            p("map<varchar, bigint>"),
            CanonicalType::Map(
                Box::new(CanonicalType::String),
                Box::new(CanonicalType::Int64)
            )
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "BOOLEAN",
            "DECIMAL(38,10)",
            "STRUCT<a INT, b LIST<VARCHAR>>",
            "MAP<VARCHAR, STRUCT<x DOUBLE>>",
            "FIXED(3)",
            "TIMESTAMPTZ",
        ] {
            assert_eq!(p(s).to_string(), s);
            assert_eq!(p(&p(s).to_string()), p(s));
        }
    }

    #[test]
    fn rejects_bad_types_with_offsets() {
        let e = CanonicalType::parse("decimal(50,2)", false).unwrap_err();
        assert!(e.message.contains("out of range"), "{e}");
        let e = CanonicalType::parse("point", false).unwrap_err();
        assert!(e.message.contains("unknown type `point`"), "{e}");
        let e = CanonicalType::parse("map<list<int>, int>", false).unwrap_err();
        assert_eq!(e.offset, 4);
        assert_eq!(
            CanonicalType::parse("point", true).unwrap(),
            CanonicalType::Unknown("point".into())
        );
        assert_eq!(
            CanonicalType::parse("numeric", true).unwrap(),
            CanonicalType::Unknown("numeric".into())
        );
    }

    #[test]
    fn arrow_types_are_canonical_and_map_back() {
        for s in [
            "BOOLEAN",
            "INT",
            "BIGINT",
            "UBIGINT",
            "REAL",
            "DOUBLE",
            "DECIMAL(12,2)",
            "VARCHAR",
            "BYTEA",
            "FIXED(4)",
            "DATE",
            "TIME",
            "TIMESTAMP",
            "TIMESTAMPTZ",
            "STRUCT<a INT>",
            "LIST<BIGINT>",
            "MAP<VARCHAR, INT>",
        ] {
            let t = p(s);
            assert_eq!(CanonicalType::from_arrow(&t.arrow_type()), Some(t));
        }
        assert_eq!(
            CanonicalType::from_arrow(&DataType::Interval(arrow::datatypes::IntervalUnit::DayTime)),
            None
        );
    }
}
