//! The `partition_by` grammar: `day(c)`, `month(c)`, `year(c)`, `hour(c)`,
//! `identity(c)` (or a bare column), `bucket(N, c)`, `truncate(N, c)`,
//! comma-separated.

use std::fmt;

use crate::types::Kind;

/// A partition transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transform {
    Identity,
    Year,
    Month,
    Day,
    Hour,
    Bucket(u32),
    Truncate(u32),
}

/// One partition field: a transform of a target column.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PartitionField {
    pub transform: Transform,
    pub column: String,
}

impl fmt::Display for PartitionField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transform {
            Transform::Identity => write!(f, "identity({})", self.column),
            Transform::Year => write!(f, "year({})", self.column),
            Transform::Month => write!(f, "month({})", self.column),
            Transform::Day => write!(f, "day({})", self.column),
            Transform::Hour => write!(f, "hour({})", self.column),
            Transform::Bucket(n) => write!(f, "bucket({n}, {})", self.column),
            Transform::Truncate(n) => write!(f, "truncate({n}, {})", self.column),
        }
    }
}

impl Transform {
    /// Whether the transform applies to a column of `kind` (Iceberg's rules).
    pub fn accepts(self, kind: Kind) -> bool {
        use Kind as K;
        match self {
            Transform::Identity => !kind.is_nested(),
            Transform::Year | Transform::Month | Transform::Day => {
                matches!(kind, K::Date | K::Timestamp | K::TimestampTz)
            }
            Transform::Hour => matches!(kind, K::Timestamp | K::TimestampTz),
            Transform::Bucket(_) => matches!(
                kind,
                K::Int32
                    | K::Int64
                    | K::Decimal
                    | K::Date
                    | K::Time
                    | K::Timestamp
                    | K::TimestampTz
                    | K::String
                    | K::Uuid
                    | K::Binary
                    | K::Fixed
            ),
            Transform::Truncate(_) => {
                matches!(
                    kind,
                    K::Int32 | K::Int64 | K::Decimal | K::String | K::Binary
                )
            }
        }
    }
}

/// A `partition_by` text that does not follow the grammar; `offset` is the
/// byte offset of the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionParseError {
    pub offset: usize,
    pub message: String,
}

/// Parses a `partition_by` value.
pub fn parse_partition_by(text: &str) -> Result<Vec<PartitionField>, PartitionParseError> {
    let mut out = Vec::new();
    let mut offset = 0;
    for part in split_top_level(text) {
        let item = part.trim();
        let lead = part.len() - part.trim_start().len();
        let at = offset + lead;
        offset += part.len() + 1;
        if item.is_empty() {
            return Err(PartitionParseError {
                offset: at,
                message: "empty partition field".into(),
            });
        }
        let err = |message: String| PartitionParseError {
            offset: at,
            message,
        };
        let Some(open) = item.find('(') else {
            if is_ident(item) {
                out.push(PartitionField {
                    transform: Transform::Identity,
                    column: unquote(item),
                });
                continue;
            }
            return Err(err(format!("`{item}` is not a column or a transform")));
        };
        if !item.ends_with(')') {
            return Err(err(format!("`{item}`: missing `)`")));
        }
        let func = item[..open].trim().to_ascii_lowercase();
        let args: Vec<&str> = item[open + 1..item.len() - 1]
            .split(',')
            .map(str::trim)
            .collect();
        let column_arg = |a: &str| -> Result<String, PartitionParseError> {
            if is_ident(a) {
                Ok(unquote(a))
            } else {
                Err(err(format!("`{a}` is not a column name")))
            }
        };
        let width = |a: &str| -> Result<u32, PartitionParseError> {
            a.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| err(format!("`{a}` is not a positive width")))
        };
        let transform = match (func.as_str(), args.as_slice()) {
            ("identity", [c]) => (Transform::Identity, column_arg(c)?),
            ("year" | "years", [c]) => (Transform::Year, column_arg(c)?),
            ("month" | "months", [c]) => (Transform::Month, column_arg(c)?),
            ("day" | "days", [c]) => (Transform::Day, column_arg(c)?),
            ("hour" | "hours", [c]) => (Transform::Hour, column_arg(c)?),
            ("bucket", [n, c]) => (Transform::Bucket(width(n)?), column_arg(c)?),
            ("truncate", [n, c]) => (Transform::Truncate(width(n)?), column_arg(c)?),
            ("bucket" | "truncate", _) => {
                return Err(err(format!("{func} takes (N, column)")));
            }
            (
                "identity" | "year" | "years" | "month" | "months" | "day" | "days" | "hour"
                | "hours",
                _,
            ) => return Err(err(format!("{func} takes (column)"))),
            _ => {
                return Err(err(format!(
                    "unknown partition transform `{func}` (day|month|year|hour|identity(c), bucket(N,c), truncate(N,c))"
                )));
            }
        };
        out.push(PartitionField {
            transform: transform.0,
            column: transform.1,
        });
    }
    Ok(out)
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn is_ident(s: &str) -> bool {
    (s.starts_with('"') && s.ends_with('"') && s.len() > 2)
        || (!s.is_empty()
            && s.chars().all(|c| c.is_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit()))
}

fn unquote(s: &str) -> String {
    s.trim_matches('"').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_grammar() {
        let f =
            parse_partition_by("day(created_at), bucket(16, id), truncate(4, \"name\"), region")
                .unwrap();
        assert_eq!(
            f,
            vec![
                PartitionField {
                    transform: Transform::Day,
                    column: "created_at".into()
                },
                PartitionField {
                    transform: Transform::Bucket(16),
                    column: "id".into()
                },
                PartitionField {
                    transform: Transform::Truncate(4),
                    column: "name".into()
                },
                PartitionField {
                    transform: Transform::Identity,
                    column: "region".into()
                },
            ]
        );
        assert_eq!(f[1].to_string(), "bucket(16, id)");
    }

    #[test]
    fn rejects_bad_fields_with_offset() {
        let e = parse_partition_by("day(a), weekly(b)").unwrap_err();
        assert_eq!(e.offset, 8);
        assert!(e.message.contains("unknown partition transform `weekly`"));
        assert!(parse_partition_by("bucket(a)").is_err());
        assert!(parse_partition_by("bucket(0, a)").is_err());
    }
}
