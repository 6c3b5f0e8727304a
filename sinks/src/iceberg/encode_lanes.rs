//! A Parquet row group's columns encoded side by side: Parquet encodes
//! (and compresses) each column chunk on its own, so the columns of a
//! batch are spread over lanes, as many as the machine has cores, one on
//! the calling task and each other on a blocking task. On one task, a
//! sink's last batches (nothing left to decode beside them) kept one core
//! of two busy encoding while the other waited, and a long compaction
//! pass used one core whatever the machine had.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use parquet::arrow::arrow_writer::{ArrowColumnChunk, ArrowColumnWriter, compute_leaves};
use parquet::errors::ParquetError;

/// How many lanes `items` pieces of work get: one per core, at most one
/// per piece.
fn lanes_for(items: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(items).max(1)
}

/// `work` on every item, the items spread over `lanes` lanes by `weight`
/// (the heaviest first, each onto the lane with the least so far); the
/// results in the items' order. One lane runs on the calling task, each
/// other on a blocking task.
async fn in_lanes<T, R>(
    items: Vec<T>,
    lanes: usize,
    weight: impl Fn(&T) -> usize,
    work: fn(T) -> Result<R, ParquetError>,
) -> Result<Vec<R>, ParquetError>
where
    T: Send + 'static,
    R: Send + 'static,
{
    let lanes = lanes.min(items.len());
    if lanes <= 1 {
        return items.into_iter().map(work).collect();
    }
    let mut order: Vec<(usize, usize)> = items
        .iter()
        .map(&weight)
        .enumerate()
        .map(|(i, w)| (w, i))
        .collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let mut lane_of = vec![0; items.len()];
    let mut loads = vec![0usize; lanes];
    for (w, i) in order {
        let lightest = (0..lanes).min_by_key(|l| loads[*l]).expect("lanes");
        loads[lightest] += w.max(1);
        lane_of[i] = lightest;
    }
    let mut groups: Vec<Vec<(usize, T)>> = (0..lanes).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        groups[lane_of[i]].push((i, item));
    }
    let run = move |group: Vec<(usize, T)>| {
        group
            .into_iter()
            .map(|(i, item)| work(item).map(|r| (i, r)))
            .collect::<Result<Vec<_>, _>>()
    };
    let mut groups = groups.into_iter();
    let here = groups.next().expect("lanes");
    let tasks: Vec<_> = groups
        .map(|g| tokio::task::spawn_blocking(move || run(g)))
        .collect();
    let mut results: Vec<Option<R>> = std::iter::repeat_with(|| None)
        .take(lane_of.len())
        .collect();
    // The first lane's work here, while the others run; every lane is
    // awaited even when one fails, so no task outlives the file.
    let mine = run(here);
    let mut first_error = mine.as_ref().err().map(|e| e.to_string());
    let mut place = |done: Vec<(usize, R)>| {
        for (i, r) in done {
            results[i] = Some(r);
        }
    };
    if let Ok(done) = mine {
        place(done);
    }
    for task in tasks {
        match task.await {
            Ok(Ok(done)) => place(done),
            Ok(Err(e)) => {
                first_error.get_or_insert(e.to_string());
            }
            Err(e) => {
                first_error.get_or_insert(format!("a column encoding task failed: {e}"));
            }
        }
    }
    if let Some(e) = first_error {
        return Err(ParquetError::General(e));
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect())
}

/// One top-level column of a batch with the writers of its leaf columns
/// (a struct or list has several, a primitive one).
pub struct ColumnWork {
    pub field: FieldRef,
    pub array: ArrayRef,
    pub writers: Vec<ArrowColumnWriter>,
}

/// Encodes each column of a batch into its writers, the columns spread
/// over the cores; the writers, in the columns' order.
pub async fn write_columns(
    columns: Vec<ColumnWork>,
) -> Result<Vec<Vec<ArrowColumnWriter>>, ParquetError> {
    let lanes = lanes_for(columns.len());
    in_lanes(
        columns,
        lanes,
        |c| c.array.get_array_memory_size(),
        |mut c: ColumnWork| {
            let leaves = compute_leaves(c.field.as_ref(), &c.array)?;
            if leaves.len() != c.writers.len() {
                return Err(ParquetError::General(format!(
                    "column {} has {} leaf columns where the writer has {}",
                    c.field.name(),
                    leaves.len(),
                    c.writers.len()
                )));
            }
            for (w, leaf) in c.writers.iter_mut().zip(&leaves) {
                w.write(leaf)?;
            }
            Ok(c.writers)
        },
    )
    .await
}

/// Closes the leaf column writers of a row group (their last pages
/// encoded and compressed), spread over the cores; the chunks, in order.
pub async fn close_columns(
    writers: Vec<ArrowColumnWriter>,
) -> Result<Vec<ArrowColumnChunk>, ParquetError> {
    let lanes = lanes_for(writers.len());
    in_lanes(
        writers,
        lanes,
        ArrowColumnWriter::memory_size,
        ArrowColumnWriter::close,
    )
    .await
}

/// Splits `writers` (leaf order) by top-level column: `leaves[i]` writers
/// for column `i`.
pub fn by_column(writers: Vec<ArrowColumnWriter>, leaves: &[usize]) -> Vec<Vec<ArrowColumnWriter>> {
    let mut rest = writers.into_iter();
    leaves
        .iter()
        .map(|n| rest.by_ref().take(*n).collect())
        .collect()
}

/// The leaf columns of each top-level column of a Parquet schema.
pub fn leaves_per_column(schema: &parquet::schema::types::SchemaDescriptor) -> Arc<[usize]> {
    let mut counts = vec![0usize; schema.root_schema().get_fields().len()];
    for leaf in 0..schema.num_columns() {
        counts[schema.get_column_root_idx(leaf)] += 1;
    }
    counts.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn double(n: u64) -> Result<u64, ParquetError> {
        Ok(n * 2)
    }

    fn fail_on_seven(n: u64) -> Result<u64, ParquetError> {
        match n {
            7 => Err(ParquetError::General("seven".to_string())),
            n => Ok(n),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn results_keep_the_items_order_whatever_lane_ran_them() {
        let items: Vec<u64> = (0..20).collect();
        // Uneven weights: the heaviest items go to different lanes.
        for lanes in [1, 2, 3, 30] {
            let out = in_lanes(items.clone(), lanes, |n| (*n as usize * 7) % 11, double)
                .await
                .unwrap();
            assert_eq!(
                out,
                items.iter().map(|n| n * 2).collect::<Vec<_>>(),
                "{lanes} lanes"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_item_fails_the_whole_and_says_why() {
        for lanes in [1, 3] {
            let err = in_lanes((0..10).collect(), lanes, |_| 1, fail_on_seven)
                .await
                .unwrap_err();
            assert!(err.to_string().contains("seven"), "{lanes} lanes: {err}");
        }
    }

    #[test]
    fn the_leaves_of_each_top_level_column_are_counted() {
        use parquet::schema::parser::parse_message_type;
        let schema = parse_message_type(
            "message m {
                required int64 id;
                optional group s { optional int32 a; optional binary b (UTF8); }
                optional group l (LIST) { repeated group list { optional int64 element; } }
            }",
        )
        .unwrap();
        let descr = parquet::schema::types::SchemaDescriptor::new(Arc::new(schema));
        assert_eq!(&*leaves_per_column(&descr), &[1, 2, 1]);
    }
}
