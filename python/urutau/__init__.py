"""urutau from Python: try a pipeline on sample data, look at what each
table would receive, change the SQL, look again, run it for real and query
what landed.

    import urutau
    p = urutau.load("examples/quickstart.sql")
    p.preview(limit=100)["lake.orders"].to_pandas()   # nothing is written
    print(p.explain())                                # the DataFusion plans
    report = p.run()                                  # until caught up
    p.sql("SELECT status, count(*) FROM lake.orders GROUP BY status")

A pipeline is the same SQL (or YAML) the `urutau` command runs, and every
function here is the command's: `explain()` is `urutau plan --explain`,
`preview()` is `urutau preview`, `run()` is `urutau run`, `sql()` is
`urutau query`. Tables are pyarrow tables (`.to_pandas()`,
`polars.from_arrow`). Secrets (passwords, tokens) are redacted in every
message, plan and error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import pyarrow as pa
import pyarrow.ipc

from ._urutau import (
    NativePipeline as _NativePipeline,
    PipelineError,
    QueryError,
    RunError,
    __version__,
)

__all__ = [
    "Pipeline",
    "PipelineError",
    "QueryError",
    "RunError",
    "RunReport",
    "TableReport",
    "load",
    "CHANGE_COLUMN",
    "__version__",
]

#: The column `Pipeline.preview` appends to every table: what the sink
#: would do with the row (``upsert`` or ``delete`` on an upsert table,
#: ``append`` on an append table).
CHANGE_COLUMN = "_change"

PathLike = Union[str, "os.PathLike[str]"]


def _table(ipc: bytes) -> pa.Table:
    """A pyarrow table from an Arrow IPC stream."""
    return pa.ipc.open_stream(pa.py_buffer(ipc)).read_all()


@dataclass(frozen=True)
class TableReport:
    """What one run did to one table."""

    #: Rows written (upserts, deletes and appended changes).
    rows: int
    #: Rows written as deletes.
    deletes: int
    #: Commits made.
    commits: int
    #: The source position the table holds now (or held at start).
    position: Optional[str]


@dataclass(frozen=True)
class RunReport:
    """What a run did, per table (keyed like `Pipeline.routes`)."""

    tables: Dict[str, TableReport] = field(default_factory=dict)
    #: The run ended on a stop request (an interrupt) rather than by
    #: catching up.
    stopped: bool = False

    def __repr__(self) -> str:
        rows = ", ".join(
            f"{name}: {t.rows} rows ({t.deletes} deletes) in {t.commits} commits"
            for name, t in self.tables.items()
        )
        state = "stopped" if self.stopped else "caught up"
        return f"RunReport({state}; {rows})"


class Pipeline:
    """A loaded, validated and planned pipeline.

    Loading checks everything `urutau validate` checks (an invalid
    pipeline raises `PipelineError` with the line and column); nothing is
    created or committed until `run()`.
    """

    def __init__(self, native: _NativePipeline):
        self._native = native

    @classmethod
    def from_sql(
        cls, text: str, base_dir: PathLike = ".", name: str = "pipeline"
    ) -> "Pipeline":
        """A pipeline from pipeline SQL text. Relative paths in it (a file
        source's `path`, an Iceberg sink's SQLite `uri` and `warehouse`)
        are relative to `base_dir`. `name` names the text in diagnostics
        (`name.sql:3:14`)."""
        return cls(_NativePipeline.from_text(text, "sql", name, os.fspath(base_dir)))

    @classmethod
    def from_yaml(
        cls, text: str, base_dir: PathLike = ".", name: str = "pipeline"
    ) -> "Pipeline":
        """A pipeline from the Go engine's YAML; see `from_sql`."""
        return cls(_NativePipeline.from_text(text, "yaml", name, os.fspath(base_dir)))

    @property
    def name(self) -> str:
        """The pipeline's name."""
        return self._native.name

    @property
    def routes(self) -> List[str]:
        """The tables the pipeline writes, `sink.table` as written in it:
        the keys of `preview()` and the names `sql()` knows."""
        return list(self._native.routes)

    @property
    def warnings(self) -> Optional[str]:
        """What validation warned about, rendered like the CLI does."""
        return self._native.warnings

    def explain(self, format: str = "indent") -> str:
        """The logical and physical DataFusion plan of every route, the
        text of `urutau plan --explain` (`format`: ``indent`` or
        ``tree``)."""
        return self._native.explain(format)

    def describe(self) -> str:
        """The pipeline's sources, sinks and tables (types, keys, options),
        the text of `urutau plan`."""
        return self._native.describe()

    def preview(self, limit: int = 1000) -> Dict[str, pa.Table]:
        """What each table would receive from its next `limit` changes
        (after the position its sink holds; from the beginning when it
        holds none): the rows after the filter, casts, metadata columns and
        collapse, with `CHANGE_COLUMN` at the end. Commits, acknowledges
        and creates nothing; reads only as much of the source as needed."""
        if limit < 0:
            raise ValueError("limit is a number of changes, 0 or more")
        return {name: _table(ipc) for name, ipc in self._native.preview(limit).items()}

    def run(self, exit_when_caught_up: bool = True, progress: bool = True) -> RunReport:
        """Runs the pipeline: each table resumes from the position its sink
        holds. With `exit_when_caught_up` it returns once everything the
        sources held at start is committed; otherwise it runs until
        interrupted. An interrupt (Ctrl-C, a notebook's stop button) stops
        it after the commit in flight and returns the report with
        ``stopped=True``. `progress` shows a bar (tqdm, when installed):
        the snapshot's rows copied of those estimated, then rows
        committed. A failure raises `RunError`."""
        handle = self._native.start(exit_when_caught_up)
        bar = _Progress() if progress else None
        try:
            while True:
                try:
                    report = handle.wait(0.2)
                    if report is not None:
                        break
                    if bar is not None:
                        bar.update(json.loads(handle.status()))
                except KeyboardInterrupt:
                    handle.stop()
                    report = handle.wait(None)
                    break
        finally:
            if bar is not None:
                bar.close()
        return RunReport(
            tables={
                name: TableReport(
                    rows=t["rows"],
                    deletes=t["deletes"],
                    commits=t["commits"],
                    position=t["position"],
                )
                for name, t in report["tables"].items()
            },
            stopped=report["stopped"],
        )

    def sql(self, query: str) -> pa.Table:
        """DataFusion SQL over the pipeline's sink tables, named as the
        pipeline writes them (``lake.orders``): Iceberg with its deletes
        applied, ClickHouse as ``FINAL`` reads it. Read-only: other
        statements raise `QueryError`, as does a table nothing was
        committed to yet."""
        return _table(self._native.sql(query))

    def read(self, table: str) -> pa.Table:
        """Every row of one sink table (``lake.orders``)."""
        return _table(self._native.read(table))

    def _repr_markdown_(self) -> str:
        return f"**pipeline {self.name}**: " + ", ".join(f"`{r}`" for r in self.routes)

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, routes={self.routes!r})"


def load(path: PathLike) -> Pipeline:
    """Loads a pipeline file (``.sql`` or ``.yaml``); relative paths in it
    are relative to the working directory, as for the `urutau` command."""
    return Pipeline(_NativePipeline.load(os.fspath(path)))


class _Progress:
    """A tqdm bar over a run's status, when tqdm is installed."""

    def __init__(self) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # no bar without tqdm
            self._bar = None
            return
        self._bar = tqdm(total=None, unit=" rows", desc="starting", leave=True)
        self._snapshot_done = False

    def update(self, status: dict) -> None:
        if self._bar is None:
            return
        snapshots = status.get("snapshots") or {}
        copying = [s for s in snapshots.values() if not s.get("done")]
        if copying:
            self._bar.set_description("snapshot")
            self._bar.total = sum(s.get("rows_estimated", 0) for s in snapshots.values()) or None
            self._bar.n = sum(s.get("rows_copied", 0) for s in snapshots.values())
        else:
            tables = status.get("tables") or {}
            self._bar.set_description("committed")
            self._bar.total = None
            self._bar.n = sum(t.get("upserts", 0) + t.get("deletes", 0) for t in tables.values())
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
