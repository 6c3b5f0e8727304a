//! Where an upsert table's keys may be: a conservative set of key ranges
//! that holds every key the table (and its staged parts) has, so a row
//! whose key lies outside every range is known to be new and is written as
//! a plain append, with no equality delete. An initial snapshot reads a
//! table in key order, chunk after chunk, so each chunk's keys lie above
//! everything written before it; inserts of increasing ids do the same.
//! Without this every such row would carry an equality delete, and a
//! reader pays for each of them (DuckDB took minutes to count a freshly
//! snapshotted 1M-row table).
//!
//! The set only ever over-approximates: ranges come from the key bounds of
//! the live data files in the manifests (at load), and from the exact keys
//! of each batch this sink writes (merged into runs, and coarsened when
//! there are too many). Deletes never shrink it. It covers one key column
//! of an integer type; any other key is "anywhere", which keeps the
//! equality delete for every row, as before.

use std::borrow::Cow;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Int32Type, Int64Type};
use iceberg::spec::{DataContentType, Datum, PrimitiveLiteral};

use super::compaction::LiveFile;

/// Runs one batch may add; past it, the closest runs are merged.
const RUNS_PER_BATCH: usize = 4096;
/// Ranges the set keeps; past it, neighbours are merged pairwise.
const MAX_RANGES: usize = 100_000;

/// The ranges a table's keys may lie in.
#[derive(Debug, Clone)]
pub(super) struct KeyRanges {
    /// Disjoint, non-adjacent inclusive ranges, by start; `None`: a key
    /// may be anywhere. A sorted vector, not a map: a batch's lookups
    /// search it by halving as it is, and a batch's new runs join it in
    /// one merge pass, where a map cost a search, a removal and an
    /// insertion per run (a twentieth of a Kafka run's sink) and a copy
    /// into flat slices for every batch's lookups.
    ranges: Option<Vec<(i64, i64)>>,
}

impl KeyRanges {
    /// A set that says every key may be present (no key is ever new).
    pub(super) fn anywhere() -> Self {
        KeyRanges { ranges: None }
    }

    /// An empty set: no key is present.
    #[cfg(test)]
    fn empty() -> Self {
        KeyRanges {
            ranges: Some(Vec::new()),
        }
    }

    /// The ranges of the live data files among `live`, for the key field
    /// `key_id`; `anywhere` when a data file carries no bounds for it, or
    /// they are not integers.
    pub(super) fn from_live_files<'a>(
        live: impl IntoIterator<Item = &'a LiveFile>,
        key_id: i32,
    ) -> Self {
        let mut bounds = Vec::new();
        for f in live {
            let file = f.entry.data_file();
            if file.content_type() != DataContentType::Data || file.record_count() == 0 {
                continue;
            }
            let bound = |d: Option<&Datum>| d.and_then(integer);
            match (
                bound(file.lower_bounds().get(&key_id)),
                bound(file.upper_bounds().get(&key_id)),
            ) {
                (Some(lo), Some(hi)) if lo <= hi => bounds.push((lo, hi)),
                _ => return KeyRanges::anywhere(),
            }
        }
        bounds.sort_unstable();
        let mut set = KeyRanges {
            ranges: Some(union(&[], &bounds)),
        };
        set.coarsen();
        set
    }

    /// Whether the set can say anything (its key is one integer column).
    pub(super) fn is_tracking(&self) -> bool {
        self.ranges.is_some()
    }

    /// For each row of the key column `keys`: whether its key may be
    /// present. A key of another type, or a null, may be.
    pub(super) fn may_contain(&self, keys: &ArrayRef) -> BooleanArray {
        let n = keys.len();
        let Some(ranges) = &self.ranges else {
            return BooleanArray::from(vec![true; n]);
        };
        let Some(values) = integer_values(keys) else {
            return BooleanArray::from(vec![true; n]);
        };
        // One search per key, the nulls (which may be anywhere) joined once
        // for the whole column: asking the array about each key's null
        // was a tenth of this lookup.
        let found = BooleanBuffer::collect_bool(n, |i| holds(ranges, values[i]));
        let found = match keys.logical_nulls() {
            Some(nulls) if nulls.null_count() > 0 => &found | &!nulls.inner(),
            _ => found,
        };
        BooleanArray::new(found, None)
    }

    /// Adds the keys of `keys` (a batch's key column, or only those of its
    /// keys [`Self::may_contain`] said are not present: the others add
    /// nothing): exact runs of consecutive keys, the closest merged when
    /// there are more than [`RUNS_PER_BATCH`]. A column of another type,
    /// or with a null, makes the set `anywhere`.
    pub(super) fn add_keys(&mut self, keys: &ArrayRef) {
        if self.ranges.is_none() || keys.is_empty() {
            return;
        }
        let values = integer_values(keys).filter(|_| keys.null_count() == 0);
        let Some(values) = values else {
            self.ranges = None;
            return;
        };
        // Keys all inside one range add nothing: the common case once a
        // table's key space is covered (updates, re-inserts). Sorting the
        // keys into runs and merging each into the set cost a twentieth of
        // a Kafka run's CPU otherwise.
        let (min, max) = values
            .iter()
            .fold((i64::MAX, i64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        if self.covers(min, max) {
            return;
        }
        let runs = runs(&values, (min, max), RUNS_PER_BATCH);
        self.add_sorted(&runs);
    }

    /// Whether one range holds all of `lo..=hi`.
    fn covers(&self, lo: i64, hi: i64) -> bool {
        self.ranges.as_ref().is_some_and(|ranges| {
            let at = ranges.partition_point(|(s, _)| *s <= lo);
            at > 0 && ranges[at - 1].1 >= hi
        })
    }

    /// Adds every range of `other` (`anywhere` makes this `anywhere`).
    pub(super) fn absorb(&mut self, other: &KeyRanges) {
        match &other.ranges {
            None => self.ranges = None,
            Some(theirs) => self.add_sorted(theirs),
        }
    }

    /// Adds the inclusive range `lo..=hi`, merged with any it touches.
    #[cfg(test)]
    fn insert(&mut self, lo: i64, hi: i64) {
        self.add_sorted(&[(lo, hi)]);
    }

    /// Adds `runs` (inclusive, sorted by start, disjoint) in one merge
    /// pass over the set.
    fn add_sorted(&mut self, runs: &[(i64, i64)]) {
        let Some(ranges) = &mut self.ranges else {
            return;
        };
        if runs.is_empty() {
            return;
        }
        *ranges = union(ranges, runs);
        self.coarsen();
    }

    /// Past [`MAX_RANGES`], neighbours merge pairwise (a superset still).
    fn coarsen(&mut self) {
        if let Some(ranges) = &mut self.ranges
            && ranges.len() > MAX_RANGES
        {
            *ranges = ranges
                .chunks(2)
                .map(|c| (c[0].0, c[c.len() - 1].1))
                .collect();
        }
    }

    /// How many ranges the set holds (none when `anywhere`).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ranges.as_ref().map_or(0, Vec::len)
    }
}

/// Whether one of `ranges` (sorted, disjoint) holds `k`: the last range
/// starting at or before it.
fn holds(ranges: &[(i64, i64)], k: i64) -> bool {
    let at = ranges.partition_point(|(s, _)| *s <= k);
    at > 0 && ranges[at - 1].1 >= k
}

/// The union of two lists of inclusive ranges, each sorted by start (they
/// may overlap within a list, as file bounds do), as disjoint,
/// non-adjacent ranges by start.
fn union(a: &[(i64, i64)], b: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = if j == b.len() || (i < a.len() && a[i].0 <= b[j].0) {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        match out.last_mut() {
            // Overlapping or adjacent: one range.
            Some(last) if last.1.saturating_add(1) >= next.0 => last.1 = last.1.max(next.1),
            _ => out.push(next),
        }
    }
    out
}

/// The runs of `values`, read off a bitmap of `bounds` when it takes at
/// most a word per value (keys drawn from a bounded id space, as updates
/// and inserts are): no sort. Sorting a batch's new keys was over half of
/// what adding them cost a Kafka run's sink while the key space filled.
fn dense_runs(values: &[i64], (min, max): (i64, i64)) -> Option<Vec<(i64, i64)>> {
    let span = u128::from(max.abs_diff(min)) + 1;
    if span > 64 * values.len() as u128 {
        return None;
    }
    let mut bits = vec![0u64; span.div_ceil(64) as usize];
    for &v in values {
        let at = v.abs_diff(min);
        bits[(at / 64) as usize] |= 1 << (at % 64);
    }
    // The key of bit `b` of word `w` (wrapping: past `i64::MAX` only as
    // the end of a run, one less).
    let key = |w: usize, b: u32| min.wrapping_add((w as i64) * 64 + i64::from(b));
    let mut runs = Vec::new();
    let mut start = None;
    for (w, &word) in bits.iter().enumerate() {
        let mut b = 0;
        while b < 64 {
            let rest = word >> b;
            match start {
                None if rest == 0 => break,
                None => {
                    b += rest.trailing_zeros();
                    start = Some(key(w, b));
                }
                Some(s) => {
                    b += rest.trailing_ones();
                    if b < 64 {
                        runs.push((s, key(w, b).wrapping_sub(1)));
                        start = None;
                    }
                }
            }
        }
    }
    if let Some(s) = start {
        runs.push((s, max));
    }
    Some(runs)
}

/// The runs of `values`, sorted first.
fn sorted_runs(mut values: Vec<i64>) -> Vec<(i64, i64)> {
    values.sort_unstable();
    values.dedup();
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for v in values {
        match runs.last_mut() {
            Some((_, hi)) if hi.saturating_add(1) == v => *hi = v,
            _ => runs.push((v, v)),
        }
    }
    runs
}

/// An integer bound's value.
fn integer(d: &Datum) -> Option<i64> {
    match d.literal() {
        PrimitiveLiteral::Int(v) => Some(i64::from(*v)),
        PrimitiveLiteral::Long(v) => Some(*v),
        _ => None,
    }
}

/// The values of an Int32 or Int64 column, a null as `None` (`None` for
/// another type): [`integer_values`] with the column's nulls.
pub(super) fn integers(keys: &ArrayRef) -> Option<impl Iterator<Item = Option<i64>> + '_> {
    let values = integer_values(keys)?;
    Some((0..keys.len()).map(move |i| keys.is_valid(i).then(|| values[i])))
}

/// The values of an Int64 or Int32 column as one slice (Int32 widened;
/// a null's slot holds any value); `None` for another type.
fn integer_values(keys: &ArrayRef) -> Option<Cow<'_, [i64]>> {
    match keys.data_type() {
        DataType::Int64 => Some(Cow::Borrowed(keys.as_primitive::<Int64Type>().values())),
        DataType::Int32 => Some(Cow::Owned(
            keys.as_primitive::<Int32Type>()
                .values()
                .iter()
                .map(|v| i64::from(*v))
                .collect(),
        )),
        _ => None,
    }
}

/// `values` (whose least and greatest are `bounds`) as inclusive runs of
/// consecutive integers, at most `limit` of them: past it, the runs either
/// side of the smallest gaps are merged.
fn runs(values: &[i64], bounds: (i64, i64), limit: usize) -> Vec<(i64, i64)> {
    let runs = dense_runs(values, bounds).unwrap_or_else(|| sorted_runs(values.to_vec()));
    if runs.len() <= limit {
        return runs;
    }
    // Keep the `limit - 1` widest gaps (the later of equal ones) as the
    // cuts: selected, not sorted, and marked in place, not sorted back
    // into order (the two sorts were two fifths of adding a batch's keys
    // while a table's key space filled).
    let mut gaps: Vec<(u64, usize)> = runs
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].0.abs_diff(w[0].1), i))
        .collect();
    let widest = limit.saturating_sub(1);
    let mut cut = vec![false; runs.len()];
    if widest > 0 {
        gaps.select_nth_unstable_by(widest - 1, |a, b| b.cmp(a));
        for &(_, i) in &gaps[..widest] {
            cut[i] = true;
        }
    }
    let last = runs.len() - 1;
    cut[last] = true;
    let mut merged = Vec::with_capacity(limit);
    let mut start = 0;
    for (i, _) in cut.iter().enumerate().filter(|(_, c)| **c) {
        merged.push((runs[start].0, runs[i].1));
        start = i + 1;
    }
    merged
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, Int64Array, StringArray};

    use super::*;

    fn longs(v: &[i64]) -> ArrayRef {
        Arc::new(Int64Array::from(v.to_vec()))
    }

    fn contains(set: &KeyRanges, v: &[i64]) -> Vec<bool> {
        set.may_contain(&longs(v))
            .iter()
            .map(Option::unwrap)
            .collect()
    }

    #[test]
    fn keys_outside_every_range_are_new() {
        let mut set = KeyRanges::empty();
        assert_eq!(contains(&set, &[1, 5]), [false, false]);
        set.add_keys(&longs(&[3, 1, 2, 10]));
        assert_eq!(set.len(), 2, "{set:?}");
        assert_eq!(
            contains(&set, &[0, 1, 2, 3, 4, 9, 10, 11]),
            [false, true, true, true, false, false, true, false]
        );
        // Filling the gap joins the ranges.
        set.add_keys(&longs(&[4, 5, 6, 7, 8, 9]));
        assert_eq!(set.len(), 1, "{set:?}");
        assert_eq!(contains(&set, &[0, 5, 11]), [false, true, false]);
    }

    #[test]
    fn keys_inside_a_range_add_nothing_keys_past_it_do() {
        let mut set = KeyRanges::empty();
        set.add_keys(&longs(&(0..100).collect::<Vec<_>>()));
        set.add_keys(&longs(&[5, 99, 0, 50]));
        assert_eq!(set.len(), 1, "{set:?}");
        assert_eq!(
            contains(&set, &[-1, 0, 99, 100]),
            [false, true, true, false]
        );
        // Inside at one end, past it at the other: the key past it is added.
        set.add_keys(&longs(&[5, 150]));
        assert_eq!(set.len(), 2, "{set:?}");
        assert_eq!(
            contains(&set, &[99, 100, 149, 150, 151]),
            [true, false, false, true, false]
        );
        // Below the first range.
        set.add_keys(&longs(&[-7, 3]));
        assert_eq!(contains(&set, &[-8, -7, -6]), [false, true, false]);
    }

    #[test]
    fn a_chunk_after_another_is_new_and_joins_it() {
        let mut set = KeyRanges::empty();
        let first: Vec<i64> = (1..=100_000).collect();
        set.add_keys(&longs(&first));
        let second: Vec<i64> = (100_001..=200_000).collect();
        assert!(contains(&set, &second).iter().all(|p| !p));
        set.add_keys(&longs(&second));
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn too_many_runs_merge_across_the_smallest_gaps_and_stay_a_superset() {
        // Every other key: 10_000 runs of one, more than a batch may add.
        let sparse: Vec<i64> = (0..10_000).map(|i| i * 2).collect();
        let mut set = KeyRanges::empty();
        set.add_keys(&longs(&sparse));
        assert!(set.len() <= RUNS_PER_BATCH, "{}", set.len());
        assert!(contains(&set, &sparse).iter().all(|p| *p));
        assert_eq!(contains(&set, &[-1, 20_000]), [false, false]);
        // A wide gap is kept as a cut.
        let r = runs(&[1, 3, 5, 1000, 1002], (1, 1002), 2);
        assert_eq!(r, [(1, 5), (1000, 1002)]);
    }

    #[test]
    fn past_the_range_limit_neighbours_merge() {
        let mut set = KeyRanges {
            ranges: Some((0..MAX_RANGES as i64).map(|i| (i * 10, i * 10)).collect()),
        };
        set.insert(MAX_RANGES as i64 * 10, MAX_RANGES as i64 * 10);
        assert!(set.len() <= MAX_RANGES / 2 + 1, "{}", set.len());
        assert_eq!(contains(&set, &[0, 10, 500, -5]), [true, true, true, false]);
    }

    #[test]
    fn the_union_of_two_range_lists_merges_what_overlaps_or_touches() {
        assert_eq!(union(&[], &[]), []);
        assert_eq!(
            union(&[(1, 3), (10, 12)], &[(4, 5), (8, 8), (20, 30)]),
            [(1, 5), (8, 8), (10, 12), (20, 30)]
        );
        // Overlaps within one list (file bounds) and one range covering
        // several of the other.
        assert_eq!(
            union(&[(0, 100)], &[(-5, 2), (1, 7), (50, 60), (101, 101)]),
            [(-5, 101)]
        );
        // The ends of the integers.
        assert_eq!(
            union(&[(i64::MIN, -1)], &[(0, i64::MAX)]),
            [(i64::MIN, i64::MAX)]
        );
    }

    #[test]
    fn adding_only_the_keys_not_present_gives_the_same_set() {
        let batches: Vec<Vec<i64>> = vec![
            vec![5, 1, 9, 30, 31],
            vec![2, 5, 30, 100, 3, 4],
            vec![6, 7, 8, 50, 31, 1],
            vec![10, 11, 12, -3],
        ];
        let (mut all, mut new_only) = (KeyRanges::empty(), KeyRanges::empty());
        for b in &batches {
            all.add_keys(&longs(b));
            let present = new_only.may_contain(&longs(b));
            let fresh: Vec<i64> = b
                .iter()
                .zip(present.iter())
                .filter(|(_, p)| !p.unwrap())
                .map(|(k, _)| *k)
                .collect();
            new_only.add_keys(&longs(&fresh));
            assert_eq!(all.ranges, new_only.ranges);
        }
        assert_eq!(
            all.ranges,
            Some(vec![(-3, -3), (1, 12), (30, 31), (50, 50), (100, 100)])
        );
    }

    /// The runs of `values` merged across all but the `limit - 1` widest
    /// gaps, by sorting every gap: what [`runs`] selects.
    fn merged_by_sorting(values: &[i64], limit: usize) -> Vec<(i64, i64)> {
        let runs = sorted_runs(values.to_vec());
        if runs.len() <= limit {
            return runs;
        }
        let mut gaps: Vec<(u64, usize)> = runs
            .windows(2)
            .enumerate()
            .map(|(i, w)| (w[1].0.abs_diff(w[0].1), i))
            .collect();
        gaps.sort_unstable_by(|a, b| b.cmp(a));
        let mut cuts: Vec<usize> = gaps[..limit - 1].iter().map(|(_, i)| *i).collect();
        cuts.sort_unstable();
        let mut merged = Vec::new();
        let mut start = 0;
        for cut in cuts.into_iter().chain([runs.len() - 1]) {
            merged.push((runs[start].0, runs[cut].1));
            start = cut + 1;
        }
        merged
    }

    #[test]
    fn the_widest_gaps_selected_are_those_sorting_finds() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..300usize {
            let n = 1 + round % 60;
            let values: Vec<i64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Small spreads: equal gaps, which the order breaks.
                    (x % (3 + (round as u64 % 7) * 40)) as i64
                })
                .collect();
            let bounds = (*values.iter().min().unwrap(), *values.iter().max().unwrap());
            for limit in [1, 2, 3, 5, 17] {
                assert_eq!(
                    runs(&values, bounds, limit),
                    merged_by_sorting(&values, limit),
                    "{values:?} {limit}"
                );
            }
        }
    }

    #[test]
    fn runs_read_off_a_bitmap_are_the_sorted_runs() {
        let check = |values: &[i64]| {
            let bounds = (*values.iter().min().unwrap(), *values.iter().max().unwrap());
            let dense = dense_runs(values, bounds).expect("a dense set");
            assert_eq!(dense, sorted_runs(values.to_vec()), "{values:?}");
        };
        // Word edges, duplicates, and the ends of the key space.
        check(&[0]);
        check(&[63, 64, 0, 127, 128, 64]);
        check(&[i64::MAX, i64::MAX - 1, i64::MAX - 3]);
        check(&[i64::MIN, i64::MIN + 1, i64::MIN + 5]);
        check(&(-70..70).filter(|v| v % 5 != 0).collect::<Vec<_>>());
        // Random keys from spans of one to 64 bits per key.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200u64 {
            let n = 1 + (round % 50) as usize;
            let spread = 1 + (round % 64) * n as u64;
            let values: Vec<i64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % spread) as i64 - 1000
                })
                .collect();
            check(&values);
        }
        // Spread thinner than a word per key: sorted instead.
        assert!(dense_runs(&[0, 64], (0, 64)).is_some());
        assert!(dense_runs(&[0, 128], (0, 128)).is_none());
        assert!(dense_runs(&[i64::MIN, i64::MAX], (i64::MIN, i64::MAX)).is_none());
    }

    #[test]
    fn other_key_types_and_nulls_are_anywhere() {
        let mut set = KeyRanges::empty();
        let text: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        assert!(set.may_contain(&text).value(0));
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(7), None]));
        let p = set.may_contain(&ints);
        assert!(!p.value(0) && p.value(1));
        set.add_keys(&ints);
        assert!(!set.is_tracking());
        assert_eq!(contains(&set, &[123]), [true]);
        assert!(!KeyRanges::anywhere().is_tracking());
    }
}
