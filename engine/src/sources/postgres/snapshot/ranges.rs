//! Splitting a table's key space into ranges that readers copy in
//! parallel.
//!
//! A table whose first key column is an integer is split by value: the
//! span from its smallest to its largest first-key value (after the
//! committed progress) is cut into ranges of equal width, as many as the
//! planner's row estimate divided by the chunk size. Each range is then
//! read in chunks of at most `snapshot_chunk_rows` rows in key order, so
//! a dense range costs one chunk and a crowded one several, whatever the
//! key distribution; an empty range costs one quick query. The last range
//! is open above: rows inserted past the largest key while the snapshot
//! runs are read too. Any other key is one range read chunk after chunk
//! (no split point can be computed without reading the keys).
//!
//! The ranges are not recorded: the stream emits a table's chunks in key
//! order whatever order their windows close in (see the stream's
//! `Emission`), so the committed progress is always one key below which
//! everything is copied, and a restart splits what lies above it anew.

use sqlx::postgres::PgConnection;

use super::super::catalog::{PgTable, quote_ident};
use super::super::errors;
use super::KeyColumn;
use crate::sources::SourceError;

/// The share of `snapshot_chunk_rows` a range holds on average: below 1,
/// so a range a little fuller than the estimate still fits one chunk.
const RANGE_FILL: f64 = 0.8;

/// How a table's remaining keys are split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    /// One range: the whole table after the committed key.
    Whole,
    /// `count` ranges of `width` first-key values each, the first above
    /// `low` (the last is open above).
    Ranges { low: i128, width: i128, count: u64 },
}

impl Split {
    /// The number of ranges.
    pub fn count(&self) -> u64 {
        match self {
            Split::Whole => 1,
            Split::Ranges { count, .. } => *count,
        }
    }

    /// Range `index`'s bounds on the first key column: (exclusive lower,
    /// inclusive upper), `None` where the range is open (range 0 starts
    /// after the committed key; the last range has no upper bound).
    pub fn bounds(&self, index: u64) -> (Option<i128>, Option<i128>) {
        match self {
            Split::Whole => (None, None),
            Split::Ranges { low, width, count } => {
                let i = i128::from(index);
                let lower = (index > 0).then(|| low + i * width);
                let upper = (index + 1 < *count).then(|| low + (i + 1) * width);
                (lower, upper)
            }
        }
    }

    /// Splits `[min, max]` for about `rows` rows into ranges of about
    /// `chunk_rows * RANGE_FILL` rows.
    pub fn of_span(min: i128, max: i128, rows: f64, chunk_rows: usize) -> Split {
        let span = max - min + 1;
        let wanted = (rows / (chunk_rows.max(1) as f64 * RANGE_FILL)).ceil();
        let count = if wanted.is_finite() && wanted > 1.0 {
            (wanted as i128).min(span).min(1_000_000_000)
        } else {
            1
        };
        if count <= 1 || span <= 1 {
            return Split::Whole;
        }
        let width = (span + count - 1) / count;
        let count = (span + width - 1) / width;
        Split::Ranges {
            low: min - 1,
            width,
            count: count as u64,
        }
    }
}

/// True for the integer types a key can be split by value on.
fn splittable(type_name: &str) -> bool {
    matches!(type_name, "bigint" | "integer" | "smallint")
}

/// Computes how the keys of `table` after `after` are split: the first key
/// column's smallest and largest values (from the key's index) and the
/// planner's estimate of the table's rows.
pub async fn split(
    conn: &mut PgConnection,
    table: &PgTable,
    key: &[KeyColumn],
    after: Option<&[String]>,
    chunk_rows: usize,
) -> Result<Split, SourceError> {
    let Some(first) = key.first().filter(|k| splittable(&k.type_name)) else {
        return Ok(Split::Whole);
    };
    let column = quote_ident(&first.name);
    let filter = match after {
        Some(values) => format!(" WHERE {}", after_filter(key, values)),
        None => String::new(),
    };
    let what = format!("splitting the keys of {table} for the snapshot");
    let (min, max): (Option<i64>, Option<i64>) = sqlx::query_as(&format!(
        "SELECT min({column})::int8, max({column})::int8 FROM {}{filter}",
        table.quoted()
    ))
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| errors::sql(&what, &e))?;
    let (Some(min), Some(max)) = (min, max) else {
        return Ok(Split::Whole);
    };
    let plan: (sqlx::types::JsonValue,) = sqlx::query_as(&format!(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM {}{filter}",
        table.quoted()
    ))
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| errors::sql(&what, &e))?;
    let rows = plan.0[0]["Plan"]["Plan Rows"].as_f64().unwrap_or(0.0);
    Ok(Split::of_span(
        i128::from(min),
        i128::from(max),
        rows,
        chunk_rows,
    ))
}

/// `(k1, k2, ...) > (v1::t1, v2::t2, ...)`: the rows after a key.
pub fn after_filter(key: &[KeyColumn], values: &[String]) -> String {
    let columns: Vec<String> = key.iter().map(|k| quote_ident(&k.name)).collect();
    let bounds: Vec<String> = values
        .iter()
        .zip(key)
        .map(|(v, k)| format!("{}::{}", literal(v), k.type_name))
        .collect();
    format!("({}) > ({})", columns.join(", "), bounds.join(", "))
}

/// A SQL string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_keys_split_into_ranges_of_a_chunk_or_less() {
        // 1..=1,000,000 with 1M rows in chunks of 5,000: ranges of 4,000.
        let s = Split::of_span(1, 1_000_000, 1_000_000.0, 5_000);
        assert_eq!(
            s,
            Split::Ranges {
                low: 0,
                width: 4_000,
                count: 250
            }
        );
        assert_eq!(s.bounds(0), (None, Some(4_000)));
        assert_eq!(s.bounds(1), (Some(4_000), Some(8_000)));
        assert_eq!(s.bounds(249), (Some(996_000), None));
    }

    #[test]
    fn ranges_cover_the_span_without_gaps_or_overlaps() {
        for (min, max, rows, chunk) in [
            (-50i128, 1_234, 10_000.0, 7),
            (i64::MIN as i128, i64::MAX as i128, 3e6, 5_000),
            (5, 9, 1e9, 1),
        ] {
            let s = Split::of_span(min, max, rows, chunk);
            let n = s.count();
            let mut previous_upper = None;
            for i in 0..n {
                let (lower, upper) = s.bounds(i);
                assert_eq!(lower, previous_upper, "range {i} of {s:?}");
                if let (Some(l), Some(u)) = (lower, upper) {
                    assert!(u > l);
                }
                previous_upper = upper;
            }
            assert_eq!(previous_upper, None, "the last range is open");
            if let Split::Ranges { low, width, .. } = s {
                assert!(low < min && low + width >= min);
                // The last range starts at or below max.
                assert!(low + i128::from(n - 1) * width < max);
            }
        }
    }

    #[test]
    fn small_or_unknown_tables_are_one_range() {
        assert_eq!(Split::of_span(1, 1_000, 100.0, 5_000), Split::Whole);
        assert_eq!(Split::of_span(1, 1_000_000, 0.0, 5_000), Split::Whole);
        assert_eq!(Split::of_span(7, 7, 1e6, 5_000), Split::Whole);
        assert_eq!(Split::Whole.bounds(0), (None, None));
    }

    #[test]
    fn literals_double_quotes() {
        assert_eq!(literal("o'brien"), "'o''brien'");
    }
}
