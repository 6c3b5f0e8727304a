"""The Python package against the embedded default (file source -> Iceberg
on a local SQLite catalog): every function of `import urutau`.

Run by tests/python.rs with the virtualenv tests/harness/python-install
made (`URUTAU_BIN` is the CLI, to compare with; `URUTAU_REPO` the
repository). Plain unittest: `python tests/python/test_api.py`.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

import pyarrow as pa

import urutau

REPO = pathlib.Path(os.environ.get("URUTAU_REPO", pathlib.Path(__file__).resolve().parents[2]))
BIN = os.environ.get("URUTAU_BIN", "urutau")
QUICKSTART = (REPO / "examples" / "quickstart.sql").read_text()


def quickstart_in(work: pathlib.Path) -> str:
    """The quickstart with its data copied into `work` (its paths stay
    relative: `base_dir` resolves them)."""
    (work / "examples" / "data").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "data" / "shop.jsonl", work / "examples" / "data")
    return QUICKSTART


def ids(table: pa.Table) -> list:
    return sorted(table.column("id").to_pylist())


class TestPipeline(unittest.TestCase):
    def setUp(self):
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="urutau-py-"))
        self.text = quickstart_in(self.work)
        # Somewhere else: base_dir, not the working directory, decides.
        self.elsewhere = tempfile.mkdtemp(prefix="urutau-py-cwd-")
        self.old_cwd = os.getcwd()
        os.chdir(self.elsewhere)

    def tearDown(self):
        os.chdir(self.old_cwd)
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.elsewhere, ignore_errors=True)

    def test_every_function_on_the_quickstart(self):
        p = urutau.Pipeline.from_sql(self.text, base_dir=self.work, name="quickstart")
        self.assertEqual(p.name, "quickstart")
        self.assertEqual(p.routes, ["lake.orders", "lake.customer_changes"])
        self.assertIn("IcebergSinkExec", p.explain())
        self.assertIn("IcebergSinkExec", p.explain("tree"))
        self.assertIn("pipeline quickstart", p.describe())
        with self.assertRaises(ValueError):
            p.explain("fancy")

        # Preview: per route, what the sink would receive; nothing written.
        preview = p.preview(limit=1000)
        self.assertEqual(sorted(preview), ["lake.customer_changes", "lake.orders"])
        orders = preview["lake.orders"]
        self.assertIsInstance(orders, pa.Table)
        self.assertEqual(
            orders.column_names,
            ["id", "customer_id", "amount", "status", "created_at", "committed_at", "change_op", urutau.CHANGE_COLUMN],
        )
        kinds = dict(zip(orders.column("id").to_pylist(), orders.column("_change").to_pylist()))
        self.assertEqual({k for k, v in kinds.items() if v == "upsert"}, {1, 3, 6, 40})
        self.assertEqual(kinds[2], "delete")
        self.assertEqual(kinds[4], "delete")
        self.assertEqual(sorted(os.listdir(self.work)), ["examples"], "preview created nothing")
        self.assertEqual(p.preview(2)["lake.customer_changes"].num_rows, 2, "limit changes per table")
        self.assertEqual(orders.to_pandas().shape[0], orders.num_rows)

        # Run: the report per table; the files land under base_dir.
        report = p.run(progress=False)
        self.assertIsInstance(report, urutau.RunReport)
        self.assertFalse(report.stopped)
        self.assertEqual(report.tables["lake.orders"].rows, orders.num_rows)
        self.assertEqual(report.tables["lake.orders"].deletes, orders.num_rows - 4)
        self.assertEqual(report.tables["lake.orders"].commits, 1)
        self.assertTrue(report.tables["lake.orders"].position)
        self.assertTrue((self.work / "warehouse" / "catalog.db").exists())
        self.assertEqual(os.listdir(self.elsewhere), [], "nothing in the working directory")

        # What landed equals what the preview showed.
        landed = p.sql("SELECT * FROM lake.orders ORDER BY id")
        upserts = orders.filter(pa.compute.equal(orders.column("_change"), "upsert")).sort_by("id")
        self.assertEqual(landed.column("id").to_pylist(), upserts.column("id").to_pylist())
        self.assertEqual(landed.column("status").to_pylist(), upserts.column("status").to_pylist())
        self.assertEqual(
            [str(v) for v in landed.column("amount").to_pylist()],
            [str(v) for v in upserts.column("amount").to_pylist()],
        )
        self.assertEqual(ids(p.read("lake.orders")), [1, 3, 6, 40])
        counts = p.sql("SELECT status, count(*) AS n FROM lake.orders GROUP BY status ORDER BY status").to_pydict()
        self.assertEqual(counts, {"status": ["new", "paid", "shipped"], "n": [2, 1, 1]})
        frame = p.read("lake.customer_changes").to_pandas()
        self.assertEqual(len(frame), 5)

        # Again: everything is committed, nothing new; the preview is empty.
        again = p.run(progress=False)
        self.assertEqual(again.tables["lake.orders"].rows, 0)
        self.assertEqual(p.preview(10)["lake.orders"].num_rows, 0)

    def test_explain_is_the_cli_text(self):
        # load(): relative paths from the working directory, as the CLI.
        os.chdir(self.work)
        (self.work / "p.sql").write_text(self.text)
        p = urutau.load("p.sql")
        cli = subprocess.run([BIN, "plan", "--explain", "p.sql"], capture_output=True, text=True, check=True)
        self.assertEqual(p.explain(), cli.stdout)
        cli = subprocess.run([BIN, "plan", "p.sql"], capture_output=True, text=True, check=True)
        self.assertEqual(p.describe(), cli.stdout)
        yaml = (REPO / "examples" / "quickstart.yaml").read_text()
        y = urutau.Pipeline.from_yaml(yaml, base_dir=self.work)
        self.assertEqual(y.routes, p.routes)

    def test_an_invalid_pipeline_raises_pipeline_error_with_its_location(self):
        text = "CREATE PIPELINE bad;\nCREATE SOURCE s FROM file WITH (pathh = 'x.jsonl');\n"
        with self.assertRaises(urutau.PipelineError) as caught:
            urutau.Pipeline.from_sql(text, name="bad")
        e = caught.exception
        self.assertEqual((e.line, e.column), (1, 17))
        self.assertIn("bad.sql:2:33", str(e))
        self.assertIn("did you mean `path`?", str(e))
        unknown = [d for d in e.diagnostics if "pathh" in d["message"]]
        self.assertEqual((unknown[0]["line"], unknown[0]["column"]), (2, 33))
        self.assertIn("never ignored", unknown[0]["rule"])
        with self.assertRaises(urutau.PipelineError) as caught:
            urutau.load(self.work / "missing.sql")
        self.assertIn("cannot read the file", str(caught.exception))

    def test_runtime_failures_raise_run_error_and_secrets_stay_hidden(self):
        # A refused connection is transient and retried: a 2 s budget ends
        # the run quickly (the default is 5 minutes).
        text = self.text.replace(
            "catalog   = 'sql',\n  uri       = 'sqlite://warehouse/catalog.db',",
            "catalog = 'rest', uri = 'http://127.0.0.1:1/catalog', client_id = 'u', client_secret = 't0psecretpw', retry_timeout = '2s',",
        )
        self.assertNotEqual(text, self.text)
        p = urutau.Pipeline.from_sql(text, base_dir=self.work)
        for shown in (p.explain(), p.describe()):
            self.assertNotIn("t0psecretpw", shown)
        with self.assertRaises(urutau.RunError) as caught:
            p.run(progress=False)
        self.assertNotIn("t0psecretpw", str(caught.exception))
        self.assertIn("lake.orders", str(caught.exception))
        with self.assertRaises(urutau.QueryError):
            urutau.Pipeline.from_sql(self.text, base_dir=self.work).sql("DROP TABLE lake.orders")
        with self.assertRaises(urutau.QueryError) as caught:
            urutau.Pipeline.from_sql(self.text, base_dir=self.work).sql("SELECT * FROM lake.orders")
        self.assertIn("run the pipeline first", str(caught.exception))

    def test_two_pipelines_one_after_the_other_do_not_interfere(self):
        a = urutau.Pipeline.from_sql(self.text, base_dir=self.work / "a")
        os.makedirs(self.work / "b" / "examples" / "data")
        shutil.copy(REPO / "examples" / "data" / "shop.jsonl", self.work / "b" / "examples" / "data")
        os.makedirs(self.work / "a" / "examples" / "data")
        shutil.copy(REPO / "examples" / "data" / "shop.jsonl", self.work / "a" / "examples" / "data")
        only_customers = self.text.split("-- Upsert:")[0] + self.text.split("-- Append: every change is a row.")[1]
        b = urutau.Pipeline.from_sql(only_customers, base_dir=self.work / "b")
        self.assertEqual(b.routes, ["lake.customer_changes"])
        ra = a.run(progress=False)
        rb = b.run(progress=False)
        self.assertEqual(sorted(ra.tables), ["lake.customer_changes", "lake.orders"])
        self.assertEqual(sorted(rb.tables), ["lake.customer_changes"])
        self.assertEqual(rb.tables["lake.customer_changes"].rows, 5, "b started from its own empty sink")
        self.assertEqual(a.read("lake.customer_changes").num_rows, 5)
        self.assertEqual(b.read("lake.customer_changes").num_rows, 5)

    def test_an_interrupt_stops_a_run_after_the_commit_in_flight(self):
        p = urutau.Pipeline.from_sql(self.text, base_dir=self.work)
        # Python leaves SIGINT ignored when it started ignoring it (a
        # background job of a non-interactive shell): make it an interrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        main = threading.main_thread().ident
        timer = threading.Timer(1.5, lambda: signal.pthread_kill(main, signal.SIGINT))
        timer.start()
        try:
            report = p.run(exit_when_caught_up=False, progress=True)
        finally:
            timer.cancel()
        self.assertTrue(report.stopped)
        self.assertEqual(report.tables["lake.orders"].rows, 7, "everything there was, committed")
        self.assertEqual(ids(p.read("lake.orders")), [1, 3, 6, 40])

    def test_help_shows_docstrings(self):
        for f in (urutau.Pipeline.preview, urutau.Pipeline.run, urutau.Pipeline.sql, urutau.load):
            self.assertTrue(f.__doc__ and len(f.__doc__) > 40, f)
        stubs = pathlib.Path(urutau.__file__).parent / "_urutau.pyi"
        self.assertTrue(stubs.exists(), "type stubs are installed")
        self.assertTrue((pathlib.Path(urutau.__file__).parent / "py.typed").exists())


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
