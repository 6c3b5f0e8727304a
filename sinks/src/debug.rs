//! The `debug` sink: prints every committed batch as a table on standard
//! output, for experimenting with a pipeline. It keeps positions in memory
//! only, so each run starts from the source's beginning.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::pretty::pretty_format_batches;
use async_trait::async_trait;
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SinkKindDef, SinkProvider};
use urutau_planner::sink::{Sink, SinkBatch, SinkError};
use urutau_planner::spec::{SinkSpec, WriteMode};
use urutau_planner::target::TargetTable;

/// Registers the `debug` kind.
pub struct DebugSinkProvider {
    def: SinkKindDef,
}

impl DebugSinkProvider {
    /// The `debug` kind's definition.
    pub fn new() -> Self {
        DebugSinkProvider {
            def: SinkKindDef {
                name: "debug",
                exec_name: "DebugSinkExec",
                doc: "prints each committed batch (experiments)",
                options: vec![
                    OptionDef::new(
                        "max_rows",
                        OptionType::Int {
                            min: 0,
                            max: 1_000_000,
                        },
                        "rows printed per commit (the rest are counted)",
                    )
                    .default("50"),
                ],
                maintenance: false,
                partitioning: false,
                partitioning_warning: None,
                partitioned_tables: false,
                write_modes: &[WriteMode::Upsert, WriteMode::Append],
                namespace_option: None,
                route_rules: vec![],
            },
        }
    }
}

impl Default for DebugSinkProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl SinkProvider for DebugSinkProvider {
    fn def(&self) -> &SinkKindDef {
        &self.def
    }

    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(DebugSink {
            name: spec.name.name.clone(),
            max_rows: spec
                .options
                .get("max_rows")
                .and_then(|v| v.parse().ok())
                .unwrap_or(50),
            positions: Mutex::new(HashMap::new()),
        }))
    }
}

/// The debug sink.
#[derive(Debug)]
pub struct DebugSink {
    name: String,
    max_rows: usize,
    positions: Mutex<HashMap<String, String>>,
}

/// The batch with a leading `change` column (upsert/delete or the op).
fn annotate(batch: &SinkBatch, mode: WriteMode) -> Result<RecordBatch, SinkError> {
    let change: Vec<&str> = (0..batch.rows.num_rows())
        .map(|i| match (mode, batch.deletes.value(i)) {
            (WriteMode::Upsert, true) => "delete",
            (WriteMode::Upsert, false) => "upsert",
            (_, true) => "append (delete)",
            (_, false) => "append",
        })
        .collect();
    let mut fields = vec![Arc::new(Field::new("change", DataType::Utf8, false))];
    fields.extend(batch.rows.schema().fields().iter().cloned());
    let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(change))];
    columns.extend(batch.rows.columns().iter().cloned());
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| SinkError::Io(e.to_string()))
}

#[async_trait]
impl Sink for DebugSink {
    async fn ensure_table(&self, table: &TargetTable) -> Result<(), SinkError> {
        let columns: Vec<String> = table
            .columns
            .iter()
            .map(|c| {
                format!(
                    "{} {}{}",
                    c.name,
                    c.ty,
                    if c.nullable { "" } else { " NOT NULL" }
                )
            })
            .collect();
        println!(
            "-- {}.{}: {} table ({}){}",
            self.name,
            table.display_name(),
            table.mode,
            columns.join(", "),
            if table.key.is_empty() {
                String::new()
            } else {
                format!(" key [{}]", table.key.join(", "))
            }
        );
        Ok(())
    }

    async fn peek_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError> {
        self.committed_position(table).await
    }

    async fn committed_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError> {
        Ok(self
            .positions
            .lock()
            .expect("positions lock")
            .get(&table.display_name())
            .cloned())
    }

    async fn commit(
        &self,
        table: &TargetTable,
        batch: &SinkBatch,
        position: &str,
    ) -> Result<(), SinkError> {
        let mut out = String::new();
        let n = batch.rows.num_rows();
        if n == 0 {
            out.push_str(&format!(
                "-- {}.{} @ {position}: no changes (position advanced)\n",
                self.name,
                table.display_name()
            ));
        } else {
            out.push_str(&format!(
                "-- {}.{} @ {position}: {n} row(s), {} delete(s)\n",
                self.name,
                table.display_name(),
                batch.delete_count()
            ));
            let shown = annotate(batch, table.mode)?;
            let shown = shown.slice(0, n.min(self.max_rows));
            if shown.num_rows() > 0 {
                let text =
                    pretty_format_batches(&[shown]).map_err(|e| SinkError::Io(e.to_string()))?;
                out.push_str(&format!("{text}\n"));
            }
            if n > self.max_rows {
                out.push_str(&format!("... and {} more row(s)\n", n - self.max_rows));
            }
        }
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(out.as_bytes())
            .and_then(|_| stdout.flush())
            .map_err(|e| SinkError::Io(format!("writing to standard output: {e}")))?;
        self.positions
            .lock()
            .expect("positions lock")
            .insert(table.display_name(), position.to_string());
        Ok(())
    }
}
