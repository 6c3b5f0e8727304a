//! Splitting a table's key space into ranges that readers copy in
//! parallel.
//!
//! A table is split on its first key column, whatever its type (integer,
//! text, uuid, timestamp, ...): the column's values in a sample of the
//! table's pages (`TABLESAMPLE SYSTEM`, a few percent of a large table,
//! the whole of a small one) are sorted by the server, and every value
//! that stands about `0.8 * snapshot_chunk_rows` table rows after the
//! previous one is a bound. The ranges so hold about the same number of
//! rows however the keys are spread (dense, sparse or skewed), and their
//! number follows the rows sampled, not the planner's estimate (which only
//! sizes the sample). Each range is read in chunks of at most
//! `snapshot_chunk_rows` rows in key order, so a range fuller than the
//! sample said costs one more chunk and an empty one a quick query: the
//! split decides how evenly the work spreads, never what is read. The last
//! range is open above (rows inserted past the largest key while the
//! snapshot runs are read too). The bounds are values of the column as
//! the server prints them, ordered and compared by the server with the
//! column's own ordering (its collation for text), the one the chunks'
//! `ORDER BY` uses.
//!
//! A table read by `ctid` (no primary key nor unique index on NOT NULL
//! columns) is split on its pages instead, no sample needed: the bounds
//! are `(page,0)` every `pages / ranges` pages of the relation's current
//! size (a tid no row has: a range holds whole pages), and the server
//! reads each chunk by a TID range scan.
//!
//! The ranges are not recorded: the stream emits a table's chunks in key
//! order whatever order their windows close in (see the stream's
//! `Emission`), so the committed progress is always one key below which
//! everything is copied, and a restart splits what lies above it anew.

use std::sync::Arc;

use sqlx::postgres::PgConnection;

use super::super::catalog::{PgTable, quote_ident};
use super::super::errors;
use super::KeyColumn;
use crate::sources::SourceError;

/// The share of `snapshot_chunk_rows` a range holds on average: below 1,
/// so a range a little fuller than the estimate still fits one chunk.
const RANGE_FILL: f64 = 0.8;

/// Sampled rows per range: enough pages that a bound lands within about
/// a page of its quantile.
const SAMPLE_ROWS_PER_RANGE: f64 = 100.0;

/// A table with at most this many rows is sampled whole (exact bounds).
const SAMPLE_ROWS_AT_LEAST: f64 = 10_000.0;

/// Ranges per table at most (a bound per range is sorted by the server).
const MAX_RANGES: f64 = 100_000.0;

/// How a table's remaining keys are split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    /// One range: the whole table after the committed key.
    Whole,
    /// Ranges cut at these values of the first key column (ascending,
    /// distinct, as the server prints them): range 0 ends at the first,
    /// range `i` holds the values above bound `i - 1` up to bound `i`, and
    /// the last range is everything above the last bound.
    At(Arc<[String]>),
}

impl Split {
    /// The number of ranges.
    pub fn count(&self) -> u64 {
        match self {
            Split::Whole => 1,
            Split::At(bounds) => bounds.len() as u64 + 1,
        }
    }

    /// Range `index`'s bounds on the first key column: (exclusive lower,
    /// inclusive upper), `None` where the range is open (range 0 starts
    /// after the committed key; the last range has no upper bound).
    pub fn bounds(&self, index: u64) -> (Option<&str>, Option<&str>) {
        match self {
            Split::Whole => (None, None),
            Split::At(bounds) => {
                let i = index as usize;
                let lower = i.checked_sub(1).and_then(|l| bounds.get(l));
                (lower.map(String::as_str), bounds.get(i).map(String::as_str))
            }
        }
    }

    /// The split at `bounds` as the sample gave them (`Whole` for none).
    fn at(bounds: Vec<String>) -> Split {
        match bounds.is_empty() {
            true => Split::Whole,
            false => Split::At(bounds.into()),
        }
    }
}

/// How many ranges `rows` rows make in chunks of `chunk_rows` (1: no
/// split).
fn ranges_for(rows: f64, chunk_rows: usize) -> usize {
    let wanted = (rows / (chunk_rows.max(1) as f64 * RANGE_FILL)).ceil();
    match wanted.is_finite() && wanted > 1.0 {
        true => wanted.min(MAX_RANGES) as usize,
        false => 1,
    }
}

/// Sampled rows per range when `percent` of the table is sampled: a
/// range holds about `chunk_rows * RANGE_FILL` rows of the table.
fn stride(chunk_rows: usize, percent: f64) -> u64 {
    ((chunk_rows.max(1) as f64 * RANGE_FILL * percent / 100.0).floor() as u64).max(1)
}

/// The share of the table's pages (in percent, as `TABLESAMPLE` takes
/// it) to sample for `ranges` ranges of a table of `table_rows` rows.
fn sample_percent(ranges: usize, table_rows: f64) -> f64 {
    let wanted = (ranges as f64 * SAMPLE_ROWS_PER_RANGE).max(SAMPLE_ROWS_AT_LEAST);
    match table_rows > wanted {
        true => (wanted / table_rows * 100.0).max(0.000_001),
        false => 100.0,
    }
}

/// The planner's estimate of the rows `SELECT 1 FROM {from}` returns
/// (works on a table never analysed: the planner scales its pages).
async fn estimate(conn: &mut PgConnection, from: &str, what: &str) -> Result<f64, SourceError> {
    let plan: (sqlx::types::JsonValue,) =
        sqlx::query_as(&format!("EXPLAIN (FORMAT JSON) SELECT 1 FROM {from}"))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| errors::sql(what, &e))?;
    Ok(plan.0[0]["Plan"]["Plan Rows"].as_f64().unwrap_or(0.0))
}

/// Computes how the keys of `table` after `after` are split: the
/// planner's estimates of the rows left and of the whole table size the
/// sample; every `stride`-th value of the first key column in the sorted
/// sample is a bound, so the ranges follow the rows actually sampled
/// (however far the estimate is off).
pub async fn split(
    conn: &mut PgConnection,
    table: &PgTable,
    key: &[KeyColumn],
    after: Option<&[String]>,
    chunk_rows: usize,
) -> Result<Split, SourceError> {
    let Some(first) = key.first() else {
        return Ok(Split::Whole);
    };
    let what = format!("splitting the keys of {table} for the snapshot");
    if first.is_ctid() {
        return split_pages(conn, table, after, chunk_rows, &what).await;
    }
    let filter = match after {
        Some(values) => format!(" WHERE {}", after_filter(key, values)),
        None => String::new(),
    };
    let left = estimate(conn, &format!("{}{filter}", table.quoted()), &what).await?;
    let ranges = ranges_for(left, chunk_rows);
    if ranges <= 1 {
        return Ok(Split::Whole);
    }
    let table_rows = match after {
        Some(_) => estimate(conn, &table.quoted(), &what).await?,
        None => left,
    };
    let column = quote_ident(&first.name);
    let percent = sample_percent(ranges, table_rows);
    // Every stride-th sampled value (fewer when the sample would make more
    // than MAX_RANGES ranges), distinct, in the column's order: `ORDER BY
    // b` is the column's value, not its text (the output is named apart,
    // else ORDER BY would sort the text: '10' before '9').
    let sql = format!(
        "SELECT b::text AS bound FROM (
           SELECT {column} AS b, row_number() OVER (ORDER BY {column}) AS r, count(*) OVER () AS n
           FROM {} TABLESAMPLE SYSTEM ({percent}) REPEATABLE (0){filter}
         ) s
         WHERE r % greatest({stride}, ceil(n / {MAX_RANGES:.1})::int8) = 0
         GROUP BY b ORDER BY b",
        table.quoted(),
        stride = stride(chunk_rows, percent),
    );
    match sqlx::query_scalar::<_, String>(&sql)
        .fetch_all(&mut *conn)
        .await
    {
        Ok(bounds) => Ok(Split::at(bounds)),
        // A table the server will not sample (or a key it will not sort
        // that way) is read whole by one session: slower, never wrong. A
        // lost session fails the copy that follows, as it would anyway.
        Err(sqlx::Error::Database(e)) => {
            tracing::warn!(table = %table, error = %e, "the snapshot reads the table as one key range: its keys could not be sampled");
            Ok(Split::Whole)
        }
        Err(e) => Err(errors::sql(&what, &e)),
    }
}

/// Splits the pages of a table read by ctid after the tid `after`.
async fn split_pages(
    conn: &mut PgConnection,
    table: &PgTable,
    after: Option<&[String]>,
    chunk_rows: usize,
    what: &str,
) -> Result<Split, SourceError> {
    let pages: i64 = sqlx::query_scalar(
        "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int8",
    )
    .bind(table.quoted())
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| errors::sql(what, &e))?;
    let rows = estimate(conn, &table.quoted(), what).await?;
    let first_page = after
        .and_then(|a| a.first())
        .and_then(|tid| tid_page(tid))
        .unwrap_or(0);
    Ok(Split::at(page_bounds(
        first_page,
        pages.max(0) as u64,
        rows,
        chunk_rows,
    )))
}

/// The page of a tid's text (`(12,3)`: 12).
fn tid_page(tid: &str) -> Option<u64> {
    tid.strip_prefix('(')?.split_once(',')?.0.parse().ok()
}

/// Bounds `(page,0)` that cut pages `first..pages` of a table of about
/// `rows` rows into ranges of about `chunk_rows * RANGE_FILL` rows.
fn page_bounds(first: u64, pages: u64, rows: f64, chunk_rows: usize) -> Vec<String> {
    let left = pages.saturating_sub(first);
    if left == 0 {
        return Vec::new();
    }
    let rows_left = rows * left as f64 / pages as f64;
    let ranges = (ranges_for(rows_left, chunk_rows) as u64).min(left);
    let step = left.div_ceil(ranges.max(1));
    (1..ranges)
        .map(|i| first + i * step)
        .take_while(|p| *p < pages)
        .map(|p| format!("({p},0)"))
        .collect()
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
    fn rows_make_ranges_of_a_chunk_or_less() {
        // 1M rows in chunks of 5,000: ranges of 4,000.
        assert_eq!(ranges_for(1_000_000.0, 5_000), 250);
        assert_eq!(ranges_for(100.0, 5_000), 1);
        assert_eq!(ranges_for(0.0, 5_000), 1);
        assert_eq!(ranges_for(f64::NAN, 5_000), 1);
        assert_eq!(ranges_for(1e12, 1), MAX_RANGES as usize);
        // A whole table: a bound every 800 rows of chunks of 1,000; a
        // 2.5% sample: every 20th sampled row (800 rows of the table).
        assert_eq!(stride(1_000, 100.0), 800);
        assert_eq!(stride(1_000, 2.5), 20);
        assert_eq!(stride(10, 0.001), 1);
    }

    #[test]
    fn small_tables_are_sampled_whole_and_large_ones_in_part() {
        assert_eq!(sample_percent(7, 5_000.0), 100.0);
        // 1,250 ranges of a 5M-row table: 125,000 rows, 2.5%.
        assert!((sample_percent(1_250, 5e6) - 2.5).abs() < 1e-9);
        assert!(sample_percent(2, 1e15) > 0.0);
    }

    #[test]
    fn bounds_cut_ranges_without_gaps_or_overlaps() {
        let s = Split::at(vec!["b".into(), "m".into(), "x".into()]);
        assert_eq!(s.count(), 4);
        assert_eq!(s.bounds(0), (None, Some("b")));
        assert_eq!(s.bounds(1), (Some("b"), Some("m")));
        assert_eq!(s.bounds(2), (Some("m"), Some("x")));
        assert_eq!(s.bounds(3), (Some("x"), None));
        let mut previous_upper = None;
        for i in 0..s.count() {
            let (lower, upper) = s.bounds(i);
            assert_eq!(lower, previous_upper, "range {i}");
            previous_upper = upper;
        }
        assert_eq!(previous_upper, None, "the last range is open");
    }

    #[test]
    fn an_empty_sample_is_one_range() {
        assert_eq!(Split::at(Vec::new()), Split::Whole);
        assert_eq!(Split::Whole.count(), 1);
        assert_eq!(Split::Whole.bounds(0), (None, None));
    }

    #[test]
    fn pages_are_cut_into_ranges_of_whole_pages() {
        // 1,000 pages of 10 rows, chunks of 1,000: 13 ranges of 77 pages
        // (800 rows or less).
        let bounds = page_bounds(0, 1_000, 10_000.0, 1_000);
        assert_eq!(bounds.len(), 12);
        assert_eq!(bounds[0], "(77,0)");
        assert_eq!(bounds[11], "(924,0)");
        // Resumed at page 500: the rest, in ranges about as large.
        let rest = page_bounds(500, 1_000, 10_000.0, 1_000);
        assert_eq!(rest.first().map(String::as_str), Some("(572,0)"));
        assert_eq!(rest.len(), 6);
        // A small table, an empty one, one read to its end: one range.
        assert!(page_bounds(0, 3, 30.0, 1_000).is_empty());
        assert!(page_bounds(0, 0, 0.0, 1_000).is_empty());
        assert!(page_bounds(7, 7, 70.0, 1).is_empty());
        // More ranges than pages: a page each at most.
        assert_eq!(page_bounds(0, 3, 3_000.0, 10).len(), 2);
        assert_eq!(tid_page("(12,3)"), Some(12));
        assert_eq!(tid_page("12"), None);
    }

    #[test]
    fn literals_double_quotes() {
        assert_eq!(literal("o'brien"), "'o''brien'");
    }
}
