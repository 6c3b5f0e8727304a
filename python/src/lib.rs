//! `urutau._urutau`: the native half of the Python package, a thin PyO3
//! layer over the library facade ([`urutau::Pipeline`]). The Python half
//! (`urutau/__init__.py`) turns what this returns into pyarrow tables and
//! report objects, and drives runs (progress, interrupts).
//!
//! Every call that waits (planning, a preview, a query, a run) releases
//! the GIL and blocks on one process-wide Tokio runtime. Rows cross as
//! Arrow IPC streams (bytes), which pyarrow reads without a second copy of
//! the format and without tying this module to one pyarrow build.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use urutau::{ExplainFormat, Language, QueryResult, RunOptions};

create_exception!(
    _urutau,
    PipelineError,
    PyException,
    "The pipeline is invalid: the message is the CLI's diagnostic (file:line:col, rule, hint); `.line`, `.column` and `.rule` are the first error's, `.diagnostics` all of them."
);
create_exception!(
    _urutau,
    RunError,
    PyException,
    "A runtime failure: a source, a commit or a sink failed, or a server could not be asked."
);
create_exception!(
    _urutau,
    QueryError,
    RunError,
    "A query of the sink tables failed (bad SQL, a table nothing was committed to yet)."
);

/// The runtime every call blocks on.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("urutau")
            .build()
            .expect("the urutau runtime starts")
    })
}

/// Runs `f` to completion without the GIL.
fn block<F: std::future::Future + Send>(py: Python<'_>, f: F) -> F::Output
where
    F::Output: Send,
{
    py.detach(|| runtime().block_on(f))
}

/// The Python exception of a facade error.
fn to_py(py: Python<'_>, e: urutau::Error) -> PyErr {
    match e {
        urutau::Error::Invalid {
            rendered,
            diagnostics,
        } => {
            let err = PipelineError::new_err(rendered);
            let value = err.value(py);
            let items = PyList::empty(py);
            for d in &diagnostics {
                let item = PyDict::new(py);
                let _ = item.set_item("line", d.span.line);
                let _ = item.set_item("column", d.span.col);
                let _ = item.set_item("message", &d.message);
                let _ = item.set_item("rule", d.rule.as_deref());
                let _ = item.set_item("help", d.help.as_deref());
                let _ = item.set_item("severity", format!("{:?}", d.severity).to_lowercase());
                let _ = items.append(item);
            }
            // The first error as the message shows it (by position).
            let first = diagnostics
                .iter()
                .filter(|d| d.severity == urutau::Severity::Error)
                .min_by_key(|d| (d.span.line, d.span.col));
            let _ = value.setattr("line", first.map(|d| d.span.line));
            let _ = value.setattr("column", first.map(|d| d.span.col));
            let _ = value.setattr("rule", first.and_then(|d| d.rule.clone()));
            let _ = value.setattr("diagnostics", items);
            err
        }
        urutau::Error::Query(m) => QueryError::new_err(m),
        urutau::Error::Unavailable(m) | urutau::Error::Run(m) => RunError::new_err(m),
    }
}

/// Rows as an Arrow IPC stream.
fn ipc<'py>(py: Python<'py>, result: &QueryResult) -> PyResult<Bound<'py, PyBytes>> {
    let bytes = urutau::output::ipc_stream(result)
        .map_err(|e| RunError::new_err(format!("encoding the rows: {e}")))?;
    Ok(PyBytes::new(py, &bytes))
}

/// A loaded and planned pipeline.
#[pyclass(module = "urutau._urutau", frozen)]
struct NativePipeline {
    inner: Arc<urutau::Pipeline>,
}

#[pymethods]
impl NativePipeline {
    /// Loads a pipeline file (`.sql` or `.yaml`); relative paths in it are
    /// relative to the working directory, as for the CLI.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let p = block(py, urutau::Pipeline::load(&path)).map_err(|e| to_py(py, e))?;
        Ok(NativePipeline { inner: Arc::new(p) })
    }

    /// A pipeline from text (`language`: `sql` or `yaml`).
    #[staticmethod]
    #[pyo3(signature = (text, language, name, base_dir=None))]
    fn from_text(
        py: Python<'_>,
        text: &str,
        language: &str,
        name: &str,
        base_dir: Option<PathBuf>,
    ) -> PyResult<Self> {
        let language = match language {
            "sql" => Language::Sql,
            "yaml" => Language::Yaml,
            other => {
                return Err(PyValueError::new_err(format!(
                    "language is 'sql' or 'yaml', not {other:?}"
                )));
            }
        };
        let p = block(
            py,
            urutau::Pipeline::from_text(text, name, language, base_dir.as_deref()),
        )
        .map_err(|e| to_py(py, e))?;
        Ok(NativePipeline { inner: Arc::new(p) })
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    #[getter]
    fn routes(&self) -> Vec<String> {
        self.inner.routes().to_vec()
    }

    #[getter]
    fn warnings(&self) -> Option<String> {
        self.inner.warnings().map(str::to_string)
    }

    fn explain(&self, format: &str) -> PyResult<String> {
        let format = match format {
            "indent" => ExplainFormat::Indent,
            "tree" => ExplainFormat::Tree,
            other => {
                return Err(PyValueError::new_err(format!(
                    "format is 'indent' or 'tree', not {other:?}"
                )));
            }
        };
        Ok(self.inner.explain(format).to_string())
    }

    fn describe(&self) -> String {
        self.inner.describe().to_string()
    }

    /// `{route: ipc bytes}` of what each table would receive.
    fn preview<'py>(&self, py: Python<'py>, limit: u64) -> PyResult<Bound<'py, PyDict>> {
        let inner = Arc::clone(&self.inner);
        let tables =
            block(py, async move { inner.preview(limit).await }).map_err(|e| to_py(py, e))?;
        let out = PyDict::new(py);
        for (name, result) in &tables {
            out.set_item(name, ipc(py, result)?)?;
        }
        Ok(out)
    }

    /// DataFusion SQL over the sink tables, as ipc bytes.
    fn sql<'py>(&self, py: Python<'py>, query: &str) -> PyResult<Bound<'py, PyBytes>> {
        let inner = Arc::clone(&self.inner);
        let query = query.to_string();
        let result = block(py, async move { inner.sql(&query).await }).map_err(|e| to_py(py, e))?;
        ipc(py, &result)
    }

    /// Every row of one sink table, as ipc bytes.
    fn read<'py>(&self, py: Python<'py>, table: &str) -> PyResult<Bound<'py, PyBytes>> {
        let inner = Arc::clone(&self.inner);
        let table = table.to_string();
        let result =
            block(py, async move { inner.read(&table).await }).map_err(|e| to_py(py, e))?;
        ipc(py, &result)
    }

    /// Starts a run in the background.
    fn start(&self, py: Python<'_>, exit_when_caught_up: bool) -> PyResult<NativeRun> {
        let inner = Arc::clone(&self.inner);
        let options = RunOptions {
            exit_when_caught_up,
            ..RunOptions::default()
        };
        let handle = block(py, async move {
            // The run's task lives on the runtime, past this call.
            inner.start(options).await
        })
        .map_err(|e| to_py(py, e))?;
        Ok(NativeRun {
            handle: Mutex::new(Some(handle)),
        })
    }
}

/// A run in progress.
#[pyclass(module = "urutau._urutau", frozen)]
struct NativeRun {
    handle: Mutex<Option<urutau::RunHandle>>,
}

#[pymethods]
impl NativeRun {
    /// Asks the run to stop after the commit in flight.
    fn stop(&self) {
        if let Some(h) = self.handle.lock().expect("run lock").as_ref() {
            h.stop();
        }
    }

    /// The run's figures so far, as `/statusz` JSON text.
    fn status(&self) -> String {
        match self.handle.lock().expect("run lock").as_ref() {
            Some(h) => h.status().to_string(),
            None => "{}".to_string(),
        }
    }

    /// Waits up to `timeout` seconds (forever when None); the report as a
    /// dict once the run ended, None while it goes on. A failed run raises
    /// RunError.
    #[pyo3(signature = (timeout=None))]
    fn wait<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let finished = py.detach(|| {
            loop {
                let done = match self.handle.lock().expect("run lock").as_ref() {
                    Some(h) => h.is_finished(),
                    None => return Err("the run's report was already taken"),
                };
                if done {
                    return Ok(true);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        match finished {
            Err(m) => Err(RunError::new_err(m)),
            Ok(false) => Ok(None),
            Ok(true) => {
                let handle = self
                    .handle
                    .lock()
                    .expect("run lock")
                    .take()
                    .expect("checked above");
                let report = block(py, handle.wait()).map_err(|e| to_py(py, e))?;
                let out = PyDict::new(py);
                out.set_item("stopped", report.stopped)?;
                let tables = PyDict::new(py);
                for r in &report.routes {
                    let t = PyDict::new(py);
                    t.set_item("rows", r.rows)?;
                    t.set_item("deletes", r.deletes)?;
                    t.set_item("commits", r.commits)?;
                    t.set_item("position", r.position.as_deref())?;
                    tables.set_item(&r.name, t)?;
                }
                out.set_item("tables", tables)?;
                Ok(Some(out))
            }
        }
    }
}

/// The native module.
#[pymodule]
fn _urutau(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<NativePipeline>()?;
    m.add_class::<NativeRun>()?;
    m.add("PipelineError", py.get_type::<PipelineError>())?;
    m.add("RunError", py.get_type::<RunError>())?;
    m.add("QueryError", py.get_type::<QueryError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
