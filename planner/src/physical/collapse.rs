//! `CollapseExec`: per-key collapse of an upsert route's batch. Within one
//! batch the last change of a key wins, in arrival order; a winning update
//! before-image (the old key of an update that changed the key) or delete
//! becomes a delete of its key. The output holds one row per key, in the
//! order of each key's last change.

use std::any::Any;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use arrow::compute::kernels::zip::zip;
use arrow::datatypes::{DataType, Int64Type};
use arrow_row::{RowConverter, SortField};
use datafusion::common::{Result, internal_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use crate::context;

/// The collapse node.
#[derive(Debug)]
pub struct CollapseExec {
    input: Arc<dyn ExecutionPlan>,
    key: Vec<String>,
    key_indices: Vec<usize>,
    properties: Arc<PlanProperties>,
}

impl CollapseExec {
    /// `key` names columns of the input.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, key: Vec<String>) -> Result<Self> {
        let schema = input.schema();
        let key_indices = key
            .iter()
            .map(|k| schema.index_of(k))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if key_indices.is_empty() {
            return internal_err!("collapse needs a key");
        }
        Ok(CollapseExec {
            properties: super::stream_properties(schema),
            input,
            key,
            key_indices,
        })
    }
}

impl DisplayAs for CollapseExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "key=[{}]", self.key.join(", ")),
            _ => write!(f, "CollapseExec: key=[{}]", self.key.join(", ")),
        }
    }
}

/// Which rows win for their key (`true` at each winner).
fn winners(batch: &RecordBatch, key_indices: &[usize]) -> Result<Vec<bool>> {
    let n = batch.num_rows();
    let mut last: Vec<bool> = vec![false; n];
    // Fast path: one Int64 key, the common case.
    if let [k] = key_indices
        && batch.column(*k).data_type() == &DataType::Int64
        && batch.column(*k).null_count() == 0
    {
        let keys = batch.column(*k).as_primitive::<Int64Type>().values();
        let mut seen: foldhash::HashMap<i64, u32> =
            foldhash::HashMap::with_capacity_and_hasher(n, Default::default());
        for (i, key) in keys.iter().enumerate() {
            match seen.entry(*key) {
                Entry::Occupied(mut e) => {
                    last[*e.get() as usize] = false;
                    e.insert(i as u32);
                }
                Entry::Vacant(e) => {
                    e.insert(i as u32);
                }
            }
            last[i] = true;
        }
    } else {
        let columns: Vec<ArrayRef> = key_indices
            .iter()
            .map(|i| Arc::clone(batch.column(*i)))
            .collect();
        let converter = RowConverter::new(
            columns
                .iter()
                .map(|c| SortField::new(c.data_type().clone()))
                .collect(),
        )?;
        let rows = converter.convert_columns(&columns)?;
        let mut seen: foldhash::HashMap<&[u8], u32> =
            foldhash::HashMap::with_capacity_and_hasher(n, Default::default());
        for i in 0..n {
            match seen.entry(rows.row(i).data()) {
                Entry::Occupied(mut e) => {
                    last[*e.get() as usize] = false;
                    e.insert(i as u32);
                }
                Entry::Vacant(e) => {
                    e.insert(i as u32);
                }
            }
            last[i] = true;
        }
    }
    Ok(last)
}

/// Collapses one batch (layout: `__op`, `__before`, then data columns).
pub fn collapse_batch(batch: &RecordBatch, key_indices: &[usize]) -> Result<RecordBatch> {
    let schema = batch.schema();
    let op_idx = schema.index_of(context::OP)?;
    let before_idx = schema.index_of(context::BEFORE)?;
    let keep = BooleanArray::from(winners(batch, key_indices)?);
    // A filter, not a take of the winners' indices: most rows win, and a
    // filter copies runs of them at once (the take, value by value, was
    // the collapse's largest cost).
    let collapsed = if keep.true_count() == batch.num_rows() {
        batch.clone()
    } else {
        filter_record_batch(batch, &keep)?
    };
    let before = collapsed.column(before_idx).as_boolean();
    if before.true_count() == 0 {
        return Ok(collapsed);
    }
    // A before-image that wins deletes its key.
    let ops = collapsed.column(op_idx).as_string::<i32>();
    let delete = StringArray::new_scalar(context::OP_DELETE);
    let new_ops = zip(before, &delete, ops)?;
    let mut columns = collapsed.columns().to_vec();
    columns[op_idx] = new_ops;
    columns[before_idx] = Arc::new(BooleanArray::from(vec![false; collapsed.num_rows()]));
    Ok(RecordBatch::try_new(schema, columns)?)
}

impl ExecutionPlan for CollapseExec {
    fn name(&self) -> &str {
        "CollapseExec"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }
    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(CollapseExec::try_new(
            children.swap_remove(0),
            self.key.clone(),
        )?))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let key_indices = self.key_indices.clone();
        let stream = input.map(move |batch| collapse_batch(&batch?, &key_indices));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    /// A batch of `(op, before, id, v)` rows.
    fn batch(rows: &[(&str, bool, i64, &str)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new(context::OP, DataType::Utf8, false),
            Field::new(context::BEFORE, DataType::Boolean, false),
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.1)))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3))),
            ],
        )
        .unwrap()
    }

    fn rows(b: &RecordBatch) -> Vec<(String, bool, i64, String)> {
        (0..b.num_rows())
            .map(|i| {
                (
                    b.column(0).as_string::<i32>().value(i).to_string(),
                    b.column(1).as_boolean().value(i),
                    b.column(2).as_primitive::<Int64Type>().value(i),
                    b.column(3).as_string::<i32>().value(i).to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn the_last_change_of_each_key_wins_in_the_order_of_those_changes() {
        let input = batch(&[
            ("insert", false, 1, "a"),
            ("insert", false, 2, "b"),
            ("update", false, 1, "a2"),
            ("insert", false, 3, "c"),
            ("delete", false, 2, "b"),
            // An update that moved key 4 to 5: its before image wins for 4.
            ("insert", false, 4, "d"),
            ("update", false, 5, "d"),
            ("update", true, 4, "d"),
        ]);
        let out = collapse_batch(&input, &[2]).unwrap();
        let s = |x: &str| x.to_string();
        assert_eq!(
            rows(&out),
            vec![
                (s("update"), false, 1, s("a2")),
                (s("insert"), false, 3, s("c")),
                (s("delete"), false, 2, s("b")),
                (s("update"), false, 5, s("d")),
                (s("delete"), false, 4, s("d")),
            ]
        );
        // A key of two columns (the general path): (1, a) and (1, a2) are
        // different keys.
        assert_eq!(
            rows(&collapse_batch(&input, &[2, 3]).unwrap()),
            vec![
                (s("insert"), false, 1, s("a")),
                (s("update"), false, 1, s("a2")),
                (s("insert"), false, 3, s("c")),
                (s("delete"), false, 2, s("b")),
                (s("update"), false, 5, s("d")),
                (s("delete"), false, 4, s("d")),
            ]
        );
        // Every key once: the batch as it is.
        let unique = batch(&[("insert", false, 1, "a"), ("update", false, 2, "b")]);
        assert_eq!(rows(&collapse_batch(&unique, &[2]).unwrap()), rows(&unique));
    }
}
