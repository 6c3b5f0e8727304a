//! The closed cast matrix: which conversions between canonical types a
//! pipeline may ask for.
//!
//! The rule of the spec: widening always, to-string always, narrowing and
//! parsing never; the one temporal reinterpretation is the explicit
//! `assume_utc(ts)`; a column whose source type has no canonical mapping
//! (`unknown`) bypasses the matrix — its raw text becomes the declared type at
//! run time, and a value that does not convert stops the pipeline.
//!
//! "Widening" means every value of the source type converts exactly:
//! `int32 -> int64`, `int32 -> float64`, `float32 -> float64`,
//! integers into a decimal with enough integer digits, a decimal into one
//! with at least as many integer and fraction digits, `date -> timestamp`
//! (midnight), `fixed(n) -> binary`, and nested types element by element.
//! `timestamptz -> timestamp` keeps the UTC wall clock (the instant is kept,
//! the zone marker dropped), as the Go engine does.
//!
//! Where this matrix is stricter than the Go engine's (which also admits
//! `float -> decimal`, `string -> uuid` and `string -> json`), the reason is
//! the spec's rule: those conversions can fail or round, i.e. they parse or
//! narrow.

use std::fmt;

use crate::types::{CanonicalType, Kind};

/// How an accepted cast is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastPlan {
    /// Same type: no expression needed.
    Identity,
    /// An Arrow cast between the two representations.
    Arrow,
    /// A nested value rendered as JSON text (`to_json`).
    ToJsonText,
    /// The source type is unknown: its raw text is cast to the declared type
    /// at run time (bypass); a value that does not convert is a data error.
    Bypass,
}

/// Why a cast is refused; each variant is one rule of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastRule {
    /// The target cannot hold every value of the source.
    Narrowing,
    /// The source is text that would have to be parsed.
    Parsing,
    /// A zone-less time would have to be declared to be UTC: `assume_utc`.
    Reinterpretation,
    /// Binary to text needs a chosen encoding: `to_hex` / `to_base64`.
    BinaryEncoding,
    /// The two types have no conversion at all.
    Incompatible,
}

impl CastRule {
    /// The rule as a user reads it in an error.
    pub fn explain(self) -> &'static str {
        match self {
            CastRule::Narrowing => {
                "narrowing casts are never allowed: the target type cannot hold every value of the source type"
            }
            CastRule::Parsing => {
                "parsing casts are never allowed: text is not reinterpreted as another type"
            }
            CastRule::Reinterpretation => {
                "a time without a zone is never silently given one: write assume_utc(column) to assert it is UTC"
            }
            CastRule::BinaryEncoding => {
                "binary to text needs an explicit encoding: write to_hex(column) or to_base64(column)"
            }
            CastRule::Incompatible => "these types have no conversion",
        }
    }

    /// A short name for tables and tests.
    pub fn name(self) -> &'static str {
        match self {
            CastRule::Narrowing => "narrowing",
            CastRule::Parsing => "parsing",
            CastRule::Reinterpretation => "reinterpretation",
            CastRule::BinaryEncoding => "binary-encoding",
            CastRule::Incompatible => "incompatible",
        }
    }
}

impl fmt::Display for CastRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A refused cast: the rule, and a hint specific to the two types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CastRejection {
    pub rule: CastRule,
    pub hint: Option<String>,
}

fn reject(rule: CastRule) -> Result<CastPlan, CastRejection> {
    Err(CastRejection { rule, hint: None })
}

fn reject_with(rule: CastRule, hint: String) -> Result<CastPlan, CastRejection> {
    Err(CastRejection {
        rule,
        hint: Some(hint),
    })
}

/// Integer digits a decimal needs to hold every value of an integer kind.
fn integer_digits(kind: Kind) -> Option<u8> {
    match kind {
        Kind::Int32 => Some(10),
        Kind::Int64 => Some(19),
        Kind::UInt64 => Some(20),
        _ => None,
    }
}

/// Decides whether `from -> to` is allowed and how it is carried out.
pub fn check_cast(from: &CanonicalType, to: &CanonicalType) -> Result<CastPlan, CastRejection> {
    use CanonicalType as T;
    if from == to {
        return Ok(CastPlan::Identity);
    }
    if let T::Unknown(_) = from {
        return Ok(CastPlan::Bypass);
    }
    let fk = from.kind();
    // Only plain text is ever "parsed"; uuid and json text have no
    // conversion to other kinds at all.
    let textual = fk == Kind::String;
    match to {
        T::Unknown(_) => reject(CastRule::Incompatible),
        T::String => match fk {
            Kind::Binary | Kind::Fixed => reject(CastRule::BinaryEncoding),
            Kind::Struct | Kind::List | Kind::Map => Ok(CastPlan::ToJsonText),
            _ => Ok(CastPlan::Arrow),
        },
        T::Json => match fk {
            Kind::Struct | Kind::List | Kind::Map => Ok(CastPlan::ToJsonText),
            Kind::String => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Uuid => match fk {
            Kind::String => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Bool => {
            if textual {
                reject(CastRule::Parsing)
            } else {
                reject(CastRule::Incompatible)
            }
        }
        T::Int32 => match fk {
            Kind::Int64 | Kind::UInt64 | Kind::Float32 | Kind::Float64 | Kind::Decimal => {
                reject(CastRule::Narrowing)
            }
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Int64 => match fk {
            Kind::Int32 => Ok(CastPlan::Arrow),
            Kind::UInt64 => reject_with(
                CastRule::Narrowing,
                "uint64 values above 2^63-1 do not fit int64; keep UBIGINT or use DECIMAL(20,0)"
                    .into(),
            ),
            Kind::Float32 | Kind::Float64 | Kind::Decimal => reject(CastRule::Narrowing),
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::UInt64 => match fk {
            Kind::Int32 | Kind::Int64 => reject_with(
                CastRule::Narrowing,
                "negative values do not fit an unsigned type".into(),
            ),
            Kind::Float32 | Kind::Float64 | Kind::Decimal => reject(CastRule::Narrowing),
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Float64 => match fk {
            Kind::Float32 | Kind::Int32 => Ok(CastPlan::Arrow),
            Kind::Int64 | Kind::UInt64 | Kind::Decimal => reject_with(
                CastRule::Narrowing,
                "float64 holds integers exactly only up to 2^53; use a DECIMAL wide enough".into(),
            ),
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Float32 => match fk {
            Kind::Float64 | Kind::Int32 | Kind::Int64 | Kind::UInt64 | Kind::Decimal => {
                reject(CastRule::Narrowing)
            }
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Decimal { precision, scale } => {
            let (p, s) = (*precision, *scale);
            match from {
                T::Int32 | T::Int64 | T::UInt64 => {
                    let need = integer_digits(fk).expect("integer kind");
                    if p - s >= need {
                        Ok(CastPlan::Arrow)
                    } else {
                        reject_with(
                            CastRule::Narrowing,
                            format!(
                                "{fk} needs {need} integer digits: DECIMAL({},{s}) or wider",
                                need + s
                            ),
                        )
                    }
                }
                T::Decimal {
                    precision: fp,
                    scale: fs,
                } => {
                    if s >= *fs && p - s >= fp - fs {
                        Ok(CastPlan::Arrow)
                    } else {
                        let need_s = s.max(*fs);
                        let need_p = need_s + (fp - fs).max(p - s);
                        reject_with(
                            CastRule::Narrowing,
                            format!(
                                "{from} does not fit {to}; the narrowest widening with scale {need_s} is DECIMAL({need_p},{need_s})"
                            ),
                        )
                    }
                }
                T::Float32 | T::Float64 => reject_with(
                    CastRule::Narrowing,
                    "binary floating point values are not exact decimals".into(),
                ),
                _ if textual => reject(CastRule::Parsing),
                _ => reject(CastRule::Incompatible),
            }
        }
        T::Binary => match fk {
            Kind::Fixed => Ok(CastPlan::Arrow),
            _ => reject(CastRule::Incompatible),
        },
        T::Fixed(n) => match from {
            T::Fixed(m) if m != n => reject_with(
                CastRule::Incompatible,
                format!("fixed({m}) and fixed({n}) differ in length"),
            ),
            T::Binary => reject(CastRule::Narrowing),
            _ => reject(CastRule::Incompatible),
        },
        T::Date => match fk {
            Kind::Timestamp | Kind::TimestampTz => reject(CastRule::Narrowing),
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Time => match fk {
            Kind::Timestamp | Kind::TimestampTz => reject(CastRule::Narrowing),
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::Timestamp => match fk {
            Kind::Date | Kind::TimestampTz => Ok(CastPlan::Arrow),
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::TimestampTz => match fk {
            Kind::Timestamp => reject_with(
                CastRule::Reinterpretation,
                "write assume_utc(column) if the values are UTC".into(),
            ),
            Kind::Date => reject_with(
                CastRule::Reinterpretation,
                "write assume_utc(CAST(column AS TIMESTAMP)) if midnight UTC is meant".into(),
            ),
            _ if textual => reject(CastRule::Parsing),
            _ => reject(CastRule::Incompatible),
        },
        T::List(to_item) => match from {
            T::List(from_item) => element_cast(from_item, to_item),
            _ => reject(CastRule::Incompatible),
        },
        T::Map(tk, tv) => match from {
            T::Map(fk2, fv) => {
                let k = element_cast(fk2, tk)?;
                let v = element_cast(fv, tv)?;
                Ok(if k == CastPlan::Identity && v == CastPlan::Identity {
                    CastPlan::Identity
                } else {
                    CastPlan::Arrow
                })
            }
            _ => reject(CastRule::Incompatible),
        },
        T::Struct(to_fields) => match from {
            T::Struct(from_fields)
                if from_fields.len() == to_fields.len()
                    && from_fields
                        .iter()
                        .zip(to_fields)
                        .all(|(a, b)| a.name == b.name) =>
            {
                for (a, b) in from_fields.iter().zip(to_fields) {
                    element_cast(&a.ty, &b.ty)?;
                }
                Ok(CastPlan::Arrow)
            }
            T::Struct(_) => reject_with(
                CastRule::Incompatible,
                "struct casts keep the field names and their order".into(),
            ),
            _ => reject(CastRule::Incompatible),
        },
    }
}

/// Inside a nested type only plain Arrow conversions apply (no JSON
/// rendering, no bypass): the element rule is the scalar rule.
fn element_cast(from: &CanonicalType, to: &CanonicalType) -> Result<CastPlan, CastRejection> {
    match check_cast(from, to)? {
        CastPlan::Identity => Ok(CastPlan::Identity),
        CastPlan::Arrow => Ok(CastPlan::Arrow),
        CastPlan::ToJsonText | CastPlan::Bypass => reject_with(
            CastRule::Incompatible,
            format!("elements of type {from} cannot become {to} inside a nested value"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> CanonicalType {
        CanonicalType::parse(s, true).unwrap()
    }

    #[test]
    fn decimal_widening_needs_room_on_both_sides() {
        assert_eq!(
            check_cast(&t("decimal(10,2)"), &t("decimal(12,4)")),
            Ok(CastPlan::Arrow)
        );
        let e = check_cast(&t("decimal(10,2)"), &t("decimal(10,4)")).unwrap_err();
        assert_eq!(e.rule, CastRule::Narrowing);
        assert!(e.hint.unwrap().contains("DECIMAL(12,4)"));
        assert_eq!(
            check_cast(&t("decimal(10,2)"), &t("decimal(12,1)"))
                .unwrap_err()
                .rule,
            CastRule::Narrowing
        );
        assert_eq!(
            check_cast(&t("ubigint"), &t("decimal(20,0)")),
            Ok(CastPlan::Arrow)
        );
        assert_eq!(
            check_cast(&t("bigint"), &t("decimal(20,2)"))
                .unwrap_err()
                .hint
                .unwrap(),
            "int64 needs 19 integer digits: DECIMAL(21,2) or wider"
        );
    }

    #[test]
    fn nested_rules() {
        assert_eq!(
            check_cast(&t("list<int>"), &t("list<bigint>")),
            Ok(CastPlan::Arrow)
        );
        assert_eq!(
            check_cast(&t("list<bigint>"), &t("list<int>"))
                .unwrap_err()
                .rule,
            CastRule::Narrowing
        );
        assert_eq!(
            check_cast(&t("struct<a int>"), &t("varchar")),
            Ok(CastPlan::ToJsonText)
        );
        assert_eq!(
            check_cast(&t("map<text, int>"), &t("json")),
            Ok(CastPlan::ToJsonText)
        );
        assert_eq!(
            check_cast(&t("struct<a int>"), &t("struct<b int>"))
                .unwrap_err()
                .rule,
            CastRule::Incompatible
        );
        assert_eq!(
            check_cast(&t("struct<a int>"), &t("struct<a bigint>")),
            Ok(CastPlan::Arrow)
        );
    }

    #[test]
    fn unknown_bypasses_to_anything() {
        assert_eq!(
            check_cast(&t("point"), &t("decimal(10,2)")),
            Ok(CastPlan::Bypass)
        );
        assert_eq!(check_cast(&t("point"), &t("date")), Ok(CastPlan::Bypass));
    }
}
