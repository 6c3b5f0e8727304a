//! One batch as one `INSERT ... FORMAT ArrowStream`, and what happens when
//! its outcome is unknown.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt8Array, UInt64Array,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema};
use clickhouse::Client;
use clickhouse_ext_arrow::ArrowClientExt;
use urutau_planner::sink::SinkError;

use super::ddl::{self, ident};
use super::{as_u64, query_rows};

/// The batch's rows with the reserved columns appended: `position` and
/// `seq` the same on every row, `is_deleted` from the batch's deletes.
pub fn with_reserved(
    rows: &RecordBatch,
    deletes: &BooleanArray,
    position: &str,
    seq: u64,
) -> Result<RecordBatch, SinkError> {
    let n = rows.num_rows();
    let mut fields: Vec<Arc<Field>> = rows.schema().fields().iter().cloned().collect();
    let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
    fields.push(Arc::new(Field::new(ddl::POSITION, DataType::Utf8, false)));
    columns.push(Arc::new(StringArray::from_iter_values(
        std::iter::repeat_n(position, n),
    )));
    fields.push(Arc::new(Field::new(ddl::SEQ, DataType::UInt64, false)));
    columns.push(Arc::new(UInt64Array::from_value(seq, n)));
    fields.push(Arc::new(Field::new(
        ddl::IS_DELETED,
        DataType::UInt8,
        false,
    )));
    let flags = cast(deletes, &DataType::UInt8)
        .map_err(|e| SinkError::Io(format!("the delete flags: {e}")))?;
    let flags = flags
        .as_any()
        .downcast_ref::<UInt8Array>()
        .map(|a| a.iter().map(|v| v.unwrap_or(0)).collect::<UInt8Array>())
        .unwrap_or_else(|| UInt8Array::from_value(0, n));
    columns.push(Arc::new(flags));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| SinkError::Io(format!("the insert batch: {e}")))
}

/// Inserts `rows` (all carrying `seq`) into `database.table` once: when the
/// insert fails, a batch that landed anyway (a lost response) is found by
/// its `seq` and counts as done; one that did not land is an error — a
/// server rejection (a value the column cannot hold) is terminal with the
/// server's words.
pub async fn insert_once(
    client: &Client,
    database: &str,
    table: &str,
    rows: &RecordBatch,
    seq: u64,
) -> Result<(), SinkError> {
    let result = async {
        let mut insert = client.insert_arrow(table)?;
        insert.write(rows).await?;
        insert.end().await
    }
    .await;
    let Err(e) = result else {
        return Ok(());
    };
    let landed = query_rows(
        client,
        &format!(
            "SELECT count() AS n FROM {}.{} WHERE {} = {seq}",
            ident(database),
            ident(table),
            ident(ddl::SEQ)
        ),
    )
    .await;
    match landed {
        Ok(r) if as_u64(r.first().and_then(|r| r.get("n"))) == rows.num_rows() as u64 => {
            tracing::warn!(table = %format!("{database}.{table}"), seq, error = %e,
                "the insert reported a failure but landed whole; not repeating it");
            Ok(())
        }
        _ => Err(match e {
            clickhouse::error::Error::BadResponse(msg) => SinkError::Rejected(format!(
                "ClickHouse refused the insert into {database}.{table}: {}",
                msg.trim()
            )),
            other => SinkError::Io(format!(
                "clickhouse: inserting into {database}.{table}: {}",
                crate::tls::with_causes(&other)
            )),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    #[test]
    fn reserved_columns_follow_the_rows() {
        let rows = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let deletes = BooleanArray::from(vec![false, true, false]);
        let b = with_reserved(&rows, &deletes, "0/16B3748", 7).unwrap();
        let names: Vec<_> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["id", "position", "seq", "is_deleted"]);
        let flags = b.column(3).as_any().downcast_ref::<UInt8Array>().unwrap();
        assert_eq!(flags.values().to_vec(), vec![0, 1, 0]);
        let seq = b.column(2).as_any().downcast_ref::<UInt64Array>().unwrap();
        assert_eq!(seq.values().to_vec(), vec![7, 7, 7]);
    }
}
