//! The `memory` sink: tables held in process memory, in named stores that
//! outlive a run (so a test can run a pipeline, stop it, run it again and
//! inspect the result). Commits are atomic: a batch and its position apply
//! together or not at all. Faults can be armed to make a commit fail (as a
//! crash before the commit would) or to reject a batch (as a sink refusing
//! a value would) — the memory sink is a test double, and says so.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::util::display::array_value_to_string;
use arrow_row::{RowConverter, SortField};
use async_trait::async_trait;
use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SinkKindDef, SinkProvider};
use urutau_planner::sink::{Sink, SinkBatch, SinkError};
use urutau_planner::spec::{SinkSpec, WriteMode};
use urutau_planner::target::TargetTable;

/// One table of a store. Rows stay in the batches they were committed in;
/// an upsert table indexes the live row of each key.
#[derive(Debug, Default)]
struct MemoryTable {
    schema: Option<SchemaRef>,
    mode: Option<WriteMode>,
    batches: Vec<RecordBatch>,
    /// Upsert: key -> (batch, row) of its live image.
    live: foldhash::HashMap<MemoryKey, (u32, u32)>,
    position: Option<String>,
    commits: Vec<(String, usize, usize)>,
}

/// A key of an upsert table: a single BIGINT as itself (the common case, no
/// allocation), anything else in Arrow's row format.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum MemoryKey {
    Int(i64),
    Row(Box<[u8]>),
}

/// What a table holds, as text, for tests to compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSnapshot {
    pub columns: Vec<String>,
    /// Upsert tables: live rows sorted; append tables: every row in commit
    /// order. NULL renders as `NULL`.
    pub rows: Vec<Vec<String>>,
    pub position: Option<String>,
    /// Every commit: (position, rows, deletes).
    pub commits: Vec<(String, usize, usize)>,
}

fn row_text(batch: &RecordBatch, row: usize) -> Vec<String> {
    batch
        .columns()
        .iter()
        .map(|c| {
            if c.is_null(row) {
                "NULL".to_string()
            } else {
                array_value_to_string(c, row).unwrap_or_else(|e| format!("<{e}>"))
            }
        })
        .collect()
}

impl MemoryTable {
    /// The rows a query sees: an upsert table's live images (in commit
    /// order), an append table's every row.
    fn live_batches(&self) -> Result<Vec<RecordBatch>, arrow::error::ArrowError> {
        match self.mode {
            Some(WriteMode::Upsert) => {
                let mut at: Vec<(usize, usize)> = self
                    .live
                    .values()
                    .map(|(b, r)| (*b as usize, *r as usize))
                    .collect();
                at.sort_unstable();
                if at.is_empty() {
                    return Ok(Vec::new());
                }
                let batches: Vec<&RecordBatch> = self.batches.iter().collect();
                Ok(vec![arrow::compute::interleave_record_batch(
                    &batches, &at,
                )?])
            }
            _ => Ok(self.batches.clone()),
        }
    }

    fn snapshot(&self) -> TableSnapshot {
        let rows = match self.mode {
            Some(WriteMode::Upsert) => {
                let mut rows: Vec<Vec<String>> = self
                    .live
                    .values()
                    .map(|(b, r)| row_text(&self.batches[*b as usize], *r as usize))
                    .collect();
                rows.sort();
                rows
            }
            _ => self
                .batches
                .iter()
                .flat_map(|b| (0..b.num_rows()).map(move |r| row_text(b, r)))
                .collect(),
        };
        TableSnapshot {
            columns: self
                .schema
                .as_ref()
                .map(|s| s.fields().iter().map(|f| f.name().clone()).collect())
                .unwrap_or_default(),
            rows,
            position: self.position.clone(),
            commits: self.commits.clone(),
        }
    }
}

/// Faults a test arms on a store.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// The commit after this many more succeed fails, applying nothing.
    pub fail_after_commits: Option<usize>,
    /// A batch with a row whose column (name) renders as this value is
    /// rejected, applying nothing.
    pub reject_value: Option<(String, String)>,
}

/// A named set of tables.
#[derive(Debug, Default)]
pub struct MemoryStore {
    tables: Mutex<HashMap<String, MemoryTable>>,
    faults: Mutex<Faults>,
}

static STORES: LazyLock<Mutex<HashMap<String, Arc<MemoryStore>>>> = LazyLock::new(Default::default);

impl MemoryStore {
    /// The store of this name (created empty on first use).
    pub fn named(name: &str) -> Arc<MemoryStore> {
        Arc::clone(
            STORES
                .lock()
                .expect("stores lock")
                .entry(name.to_string())
                .or_default(),
        )
    }

    /// Forgets the store of this name.
    pub fn drop_named(name: &str) {
        STORES.lock().expect("stores lock").remove(name);
    }

    /// What a table (dotted name) holds.
    pub fn table(&self, name: &str) -> Option<TableSnapshot> {
        self.tables
            .lock()
            .expect("tables lock")
            .get(name)
            .map(MemoryTable::snapshot)
    }

    /// Rows a table holds (live keys of an upsert table), without rendering
    /// them.
    pub fn row_count(&self, name: &str) -> Option<usize> {
        self.tables
            .lock()
            .expect("tables lock")
            .get(name)
            .map(|t| match t.mode {
                Some(WriteMode::Upsert) => t.live.len(),
                _ => t.batches.iter().map(|b| b.num_rows()).sum(),
            })
    }

    /// Arms faults for the next commits into this store.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().expect("faults lock") = faults;
    }
}

/// Registers the `memory` kind.
pub struct MemorySinkProvider {
    def: SinkKindDef,
}

impl MemorySinkProvider {
    /// The `memory` kind's definition.
    pub fn new() -> Self {
        MemorySinkProvider {
            def: SinkKindDef {
                name: "memory",
                exec_name: "MemorySinkExec",
                doc: "tables in process memory (tests)",
                options: vec![
                    OptionDef::new("store", OptionType::String, "the store's name")
                        .default("default"),
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

impl Default for MemorySinkProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl SinkProvider for MemorySinkProvider {
    fn def(&self) -> &SinkKindDef {
        &self.def
    }

    fn open(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>, SinkError> {
        let store = spec.options.get("store").unwrap_or("default");
        Ok(Arc::new(MemorySink {
            store: MemoryStore::named(store),
        }))
    }
}

/// The memory sink.
#[derive(Debug)]
pub struct MemorySink {
    store: Arc<MemoryStore>,
}

#[async_trait]
impl Sink for MemorySink {
    async fn ensure_table(&self, table: &TargetTable) -> Result<(), SinkError> {
        let schema = table.arrow_schema();
        let mut tables = self.store.tables.lock().expect("tables lock");
        let t = tables.entry(table.display_name()).or_default();
        match &t.schema {
            None => {
                t.schema = Some(schema);
                t.mode = Some(table.mode);
            }
            Some(existing) if existing.fields() != schema.fields() => {
                let want: Vec<String> = schema
                    .fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect();
                let have: Vec<String> = existing
                    .fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect();
                return Err(SinkError::TableMismatch(format!(
                    "{} has columns [{}], the route writes [{}]",
                    table.display_name(),
                    have.join(", "),
                    want.join(", ")
                )));
            }
            Some(_) => {}
        }
        Ok(())
    }

    async fn committed_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError> {
        Ok(self
            .store
            .tables
            .lock()
            .expect("tables lock")
            .get(&table.display_name())
            .and_then(|t| t.position.clone()))
    }

    async fn peek_position(&self, table: &TargetTable) -> Result<Option<String>, SinkError> {
        self.committed_position(table).await
    }

    async fn read_table(
        &self,
        table: &TargetTable,
    ) -> Result<Option<Arc<dyn TableProvider>>, SinkError> {
        let tables = self.store.tables.lock().expect("tables lock");
        let Some(t) = tables.get(&table.display_name()) else {
            return Ok(None);
        };
        let Some(schema) = t.schema.clone() else {
            return Ok(None);
        };
        let batches = t
            .live_batches()
            .map_err(|e| SinkError::Io(format!("reading {}: {e}", table.display_name())))?;
        let provider = MemTable::try_new(schema, vec![batches])
            .map_err(|e| SinkError::Io(format!("reading {}: {e}", table.display_name())))?;
        Ok(Some(Arc::new(provider)))
    }

    async fn commit(
        &self,
        table: &TargetTable,
        batch: &SinkBatch,
        position: &str,
    ) -> Result<(), SinkError> {
        {
            let mut faults = self.store.faults.lock().expect("faults lock");
            if let Some(n) = faults.fail_after_commits.as_mut() {
                if *n == 0 {
                    faults.fail_after_commits = None;
                    return Err(SinkError::Io("injected failure (memory sink fault)".into()));
                }
                *n -= 1;
            }
            if let Some((column, value)) = &faults.reject_value
                && let Some(c) = batch.rows.column_by_name(column)
            {
                for i in 0..c.len() {
                    if !c.is_null(i)
                        && array_value_to_string(c, i).ok().as_deref() == Some(value.as_str())
                    {
                        return Err(SinkError::Rejected(format!(
                            "column {column} holds {value}, which this sink refuses (memory sink fault)"
                        )));
                    }
                }
            }
        }
        // Compute everything first: a failure leaves the table untouched.
        let keys: Vec<MemoryKey> = if table.mode == WriteMode::Upsert {
            let columns: Vec<_> = table
                .key_indices()
                .iter()
                .map(|i| Arc::clone(batch.rows.column(*i)))
                .collect();
            match columns.as_slice() {
                [c] if c.data_type() == &arrow::datatypes::DataType::Int64 => c
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .iter()
                    .map(|v| MemoryKey::Int(*v))
                    .collect(),
                _ => {
                    let converter = RowConverter::new(
                        columns
                            .iter()
                            .map(|c| SortField::new(c.data_type().clone()))
                            .collect(),
                    )
                    .map_err(|e| SinkError::Io(e.to_string()))?;
                    let rows = converter
                        .convert_columns(&columns)
                        .map_err(|e| SinkError::Io(e.to_string()))?;
                    (0..rows.num_rows())
                        .map(|i| MemoryKey::Row(Box::from(rows.row(i).data())))
                        .collect()
                }
            }
        } else {
            Vec::new()
        };
        let mut tables = self.store.tables.lock().expect("tables lock");
        let t = tables.entry(table.display_name()).or_default();
        let batch_id = t.batches.len() as u32;
        if table.mode == WriteMode::Upsert {
            for (i, key) in keys.into_iter().enumerate() {
                if batch.deletes.value(i) {
                    t.live.remove(&key);
                } else {
                    t.live.insert(key, (batch_id, i as u32));
                }
            }
        }
        t.batches.push(batch.rows.clone());
        t.position = Some(position.to_string());
        t.commits.push((
            position.to_string(),
            batch.rows.num_rows(),
            batch.delete_count(),
        ));
        Ok(())
    }
}
