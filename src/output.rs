//! Query results as text (a table for a terminal, CSV, or JSON lines) or
//! as an Arrow IPC stream (for Python).

use arrow::error::ArrowError;

use crate::QueryResult;

/// How `urutau query` prints rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A boxed table with a header (Arrow's pretty printer).
    Table,
    /// CSV with a header line.
    Csv,
    /// One JSON object per row.
    Json,
}

/// The rows of `result` in `format`.
pub fn render(result: &QueryResult, format: Format) -> Result<String, ArrowError> {
    match format {
        Format::Table => {
            let mut text = if result.batches.is_empty() {
                // Still show the columns of an empty result.
                arrow::util::pretty::pretty_format_batches(&[
                    arrow::array::RecordBatch::new_empty(result.schema.clone()),
                ])?
                .to_string()
            } else {
                arrow::util::pretty::pretty_format_batches(&result.batches)?.to_string()
            };
            let n = result.num_rows();
            text.push_str(&format!("\n{n} row{}\n", if n == 1 { "" } else { "s" }));
            Ok(text)
        }
        Format::Csv => {
            let mut out = Vec::new();
            {
                let mut w = arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut out);
                if result.batches.is_empty() {
                    w.write(&arrow::array::RecordBatch::new_empty(result.schema.clone()))?;
                }
                for b in &result.batches {
                    w.write(b)?;
                }
            }
            String::from_utf8(out).map_err(|e| ArrowError::ExternalError(Box::new(e)))
        }
        Format::Json => {
            let mut out = Vec::new();
            {
                let mut w = arrow::json::LineDelimitedWriter::new(&mut out);
                for b in &result.batches {
                    w.write(b)?;
                }
                w.finish()?;
            }
            String::from_utf8(out).map_err(|e| ArrowError::ExternalError(Box::new(e)))
        }
    }
}

/// The rows of `result` as an Arrow IPC stream (schema, then batches): how
/// they cross into another Arrow implementation (pyarrow reads it with
/// `pyarrow.ipc.open_stream`) without a second copy of the format.
pub fn ipc_stream(result: &QueryResult) -> Result<Vec<u8>, ArrowError> {
    let mut out = Vec::new();
    {
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, &result.schema)?;
        for b in &result.batches {
            w.write(b)?;
        }
        w.finish()?;
    }
    Ok(out)
}
