//! The `memory` sink: tables held in process memory, in named stores that
//! outlive a run (so a test can run a pipeline, stop it, run it again and
//! inspect the result). Commits are atomic: a batch and its position apply
//! together or not at all. Faults can be armed to make a commit fail (as a
//! crash before the commit would) or to reject a batch (as a sink refusing
//! a value would) — the memory sink is a test double, and says so.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use arrow::array::Array;
use arrow::datatypes::SchemaRef;
use arrow::util::display::array_value_to_string;
use async_trait::async_trait;
use datafusion::common::ScalarValue;
use urutau_planner::options::{OptionDef, OptionType};
use urutau_planner::registry::{SinkKindDef, SinkProvider};
use urutau_planner::sink::{Sink, SinkBatch, SinkError};
use urutau_planner::spec::{SinkSpec, WriteMode};
use urutau_planner::target::TargetTable;

/// One table of a store.
#[derive(Debug, Clone, Default)]
pub struct MemoryTable {
    pub schema: Option<SchemaRef>,
    pub mode: Option<WriteMode>,
    /// Upsert tables: key -> row.
    pub rows: HashMap<Vec<ScalarValue>, Vec<ScalarValue>>,
    /// Append tables: every row, in commit order.
    pub appended: Vec<Vec<ScalarValue>>,
    pub position: Option<String>,
    /// Every commit: (position, rows, deletes).
    pub commits: Vec<(String, usize, usize)>,
}

impl MemoryTable {
    /// The table's rows as text (NULL as `NULL`), sorted: upsert tables
    /// by content, append tables in commit order.
    pub fn text_rows(&self) -> Vec<Vec<String>> {
        let show = |row: &Vec<ScalarValue>| -> Vec<String> {
            row.iter()
                .map(|v| {
                    if v.is_null() {
                        "NULL".to_string()
                    } else {
                        v.to_string()
                    }
                })
                .collect()
        };
        match self.mode {
            Some(WriteMode::Upsert) => {
                let mut out: Vec<Vec<String>> = self.rows.values().map(show).collect();
                out.sort();
                out
            }
            _ => self.appended.iter().map(show).collect(),
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

    /// A copy of a table (dotted name).
    pub fn table(&self, name: &str) -> Option<MemoryTable> {
        self.tables.lock().expect("tables lock").get(name).cloned()
    }

    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().expect("faults lock") = faults;
    }
}

/// Registers the `memory` kind.
pub struct MemorySinkProvider {
    def: SinkKindDef,
}

impl MemorySinkProvider {
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

fn row_at(batch: &SinkBatch, i: usize) -> Result<Vec<ScalarValue>, SinkError> {
    batch
        .rows
        .columns()
        .iter()
        .map(|c| ScalarValue::try_from_array(c, i).map_err(|e| SinkError::Io(e.to_string())))
        .collect()
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
        // Build the new state first: a failure leaves the table untouched.
        let key_idx = table.key_indices();
        let mut rows = Vec::with_capacity(batch.rows.num_rows());
        for i in 0..batch.rows.num_rows() {
            rows.push((row_at(batch, i)?, batch.deletes.value(i)));
        }
        let mut tables = self.store.tables.lock().expect("tables lock");
        let t = tables.entry(table.display_name()).or_default();
        match table.mode {
            WriteMode::Upsert => {
                for (row, delete) in rows {
                    let key: Vec<ScalarValue> = key_idx.iter().map(|k| row[*k].clone()).collect();
                    if delete {
                        t.rows.remove(&key);
                    } else {
                        t.rows.insert(key, row);
                    }
                }
            }
            WriteMode::Append | WriteMode::AppendIdempotent => {
                t.appended.extend(rows.into_iter().map(|(r, _)| r));
            }
        }
        t.position = Some(position.to_string());
        t.commits.push((
            position.to_string(),
            batch.rows.num_rows(),
            batch.delete_count(),
        ));
        Ok(())
    }
}
