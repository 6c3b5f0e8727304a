//! Which columns of a data file are written without a Parquet dictionary.
//!
//! Parquet's writer keeps a dictionary for every column until the
//! dictionary outgrows its page limit (1 MiB), so a 10,000-row file of
//! values that hardly repeat (a customer id, an amount) hashes and indexes
//! every value for a dictionary as large as the column: time and space for
//! nothing. Java's parquet-mr drops such a dictionary after its first page
//! (when it does not make the column smaller). Here a strided sample of
//! the batch decides before the file is written: a column whose distinct
//! values are estimated at [`PLAIN_BELOW`] of its non-null rows or more
//! (each value repeating less than 4/3 times on average) is written
//! plain. Readers see no difference; only the encoding changes.

use std::hash::Hash;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Decimal128Type, Int32Type, Int64Type, TimeUnit,
    TimestampMicrosecondType,
};

/// Values sampled from a column at most.
const SAMPLE: usize = 1024;

/// Fewer non-null sampled values than this: no decision (the dictionary
/// stays, as Parquet would keep it).
const MIN_VALUES: usize = 64;

/// A column is written plain when its estimated number of distinct values
/// is at least this share of its non-null values (each value repeats less
/// than 4/3 times on average): a dictionary would then hold nearly every
/// value once more, and its indices would save little.
const PLAIN_BELOW: f64 = 0.75;

/// The top-level columns of `batch` (written as one file) that a
/// dictionary would not shrink.
pub(super) fn plain_columns(batch: &RecordBatch) -> Vec<String> {
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .filter(|(_, column)| barely_repeats(column.as_ref()))
        .map(|(field, _)| field.name().clone())
        .collect()
}

/// Whether the distinct values of `column` are estimated at
/// [`PLAIN_BELOW`] of its non-null rows or more. Only the types whose
/// values are read straight from the array are sampled; any other keeps
/// its dictionary.
fn barely_repeats(column: &dyn Array) -> bool {
    match column.data_type() {
        DataType::Int32 => primitive::<Int32Type>(column),
        DataType::Date32 => primitive::<Date32Type>(column),
        DataType::Int64 => primitive::<Int64Type>(column),
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            primitive::<TimestampMicrosecondType>(column)
        }
        DataType::Decimal128(_, _) => primitive::<Decimal128Type>(column),
        DataType::Utf8 => {
            let a = column.as_string::<i32>();
            estimate(column, |i| a.value(i))
        }
        _ => false,
    }
}

/// [`barely_repeats`] for a column of primitive values.
fn primitive<T: ArrowPrimitiveType>(column: &dyn Array) -> bool
where
    T::Native: Hash + Eq,
{
    let a = column.as_primitive::<T>();
    estimate(column, |i| a.value(i))
}

/// Samples up to [`SAMPLE`] rows of `column` evenly and compares the
/// distinct values found with what a column of [`PLAIN_BELOW`] times as
/// many distinct values as non-null rows would show.
fn estimate<V: Hash + Eq>(column: &dyn Array, value: impl Fn(usize) -> V) -> bool {
    let rows = column.len();
    if rows == 0 {
        return false;
    }
    let stride = rows.div_ceil(SAMPLE);
    // foldhash, not the standard SipHash: a file's samples are a few
    // thousand values, and SipHash made this estimate cost a twentieth of
    // an Iceberg sink's batch.
    let mut seen =
        foldhash::HashSet::with_capacity_and_hasher(SAMPLE, foldhash::fast::RandomState::default());
    let mut valid = 0usize;
    let nulls = column.logical_nulls();
    for i in (0..rows).step_by(stride) {
        if nulls.as_ref().is_none_or(|n| n.is_valid(i)) {
            valid += 1;
            seen.insert(value(i));
        }
    }
    if valid < MIN_VALUES {
        return false;
    }
    let distinct = seen.len() as f64;
    if stride == 1 {
        // Every row was read: the count is exact.
        return distinct >= PLAIN_BELOW * valid as f64;
    }
    // Non-null rows of the column, estimated from the sample's share.
    let non_null = rows as f64 * valid as f64 / rows.div_ceil(stride) as f64;
    let threshold = PLAIN_BELOW * non_null;
    distinct >= expected_distinct(threshold, valid as f64)
}

/// The distinct values expected among `draws` values drawn uniformly from
/// `distinct` equally frequent ones.
fn expected_distinct(distinct: f64, draws: f64) -> f64 {
    distinct * (1.0 - (-draws / distinct).exp())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap()
    }

    /// Pseudo-random values in `0..range` (xorshift64*, fixed seed).
    fn random(rows: i64, range: u64) -> Int64Array {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        Int64Array::from_iter_values((0..rows).map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % range) as i64
        }))
    }

    #[test]
    fn columns_whose_values_hardly_repeat_are_written_plain() {
        let rows = 10_000i64;
        let b = batch(vec![
            // About 8,200 distinct of 10,000 (random ids of 50,000).
            ("customer_id", Arc::new(random(rows, 50_000))),
            // About 4,500 distinct (of 5,400 possible): each about twice.
            ("created_at", Arc::new(random(rows, 5_400))),
            (
                "status",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| ["new", "paid", "shipped"][i as usize % 3]),
                )),
            ),
            (
                "code",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("c{i}")),
                )),
            ),
            // Mostly null: too few values to judge.
            (
                "rare",
                Arc::new(Int64Array::from_iter(
                    (0..rows).map(|i| (i % 500 == 0).then_some(i)),
                )),
            ),
        ]);
        assert_eq!(plain_columns(&b), ["customer_id", "code"]);
    }

    #[test]
    fn a_small_batch_is_counted_exactly() {
        let unique = Int64Array::from_iter_values(0..200);
        let halves = Int64Array::from_iter_values((0..200).map(|i| i / 2));
        assert!(barely_repeats(&unique));
        // Each value twice: half as many distinct values as rows.
        assert!(!barely_repeats(&halves));
        // Too few values.
        assert!(!barely_repeats(&Int64Array::from_iter_values(0..10)));
        assert!(!barely_repeats(&Int64Array::from(Vec::<i64>::new())));
    }

    #[test]
    fn the_expected_distinct_count_grows_with_the_draws() {
        assert!((expected_distinct(1e9, 1000.0) - 1000.0).abs() < 0.01);
        assert!((expected_distinct(10.0, 1e6) - 10.0).abs() < 1e-9);
        let d = expected_distinct(7_500.0, 1024.0);
        assert!(d > 950.0 && d < 960.0, "{d}");
    }
}
