//! The Python package (`python/`, `import urutau`) and the notebook
//! (`examples/notebook.ipynb`), run from the virtualenv
//! tests/harness/python-install makes with the README's command
//! (`pip install ./python`): tests/python/test_api.py (every function
//! against the embedded default) and tests/python/run_notebook.py (the
//! notebook executed by nbclient, its outputs checked).

use std::path::PathBuf;
use std::process::Command;

/// The python of the virtualenv holding the package:
/// `URUTAU_TEST_PYTHON_PACKAGE` (scripts/test sets it), else the default
/// venv of tests/harness/python-install. Missing: the test fails saying
/// how to make it.
fn package_python() -> PathBuf {
    let python = std::env::var("URUTAU_TEST_PYTHON_PACKAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/var/tmp/urutau-python-venv/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import urutau, nbclient"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} cannot import urutau and nbclient: run tests/harness/python-install (scripts/test does), or set URUTAU_TEST_PYTHON_PACKAGE",
        python.display()
    );
    python
}

/// Runs a script of tests/python/ with the package's python; it must exit 0.
fn run_script(name: &str) {
    let repo = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(package_python())
        .arg(format!("{repo}/tests/python/{name}"))
        .env("URUTAU_BIN", env!("CARGO_BIN_EXE_urutau"))
        .env("URUTAU_REPO", repo)
        .output()
        .expect("python runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/python/{name} failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}{stderr}");
}

#[test]
fn the_python_api_works_against_the_embedded_default() {
    run_script("test_api.py");
}

#[test]
fn the_notebook_executes_and_shows_what_it_says() {
    run_script("run_notebook.py");
}
