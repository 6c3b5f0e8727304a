"""Executes examples/notebook.ipynb with nbclient (in examples/, with the
python running this script as its kernel) and checks each tagged cell's
output. Run by tests/python.rs: `python tests/python/run_notebook.py`.
"""

import pathlib
import sys

import nbformat
from nbclient import NotebookClient

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "notebook.ipynb"


def text_of(cell) -> str:
    """Everything a cell printed or displayed, as plain text."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        data = out.get("data", {})
        if "text/plain" in data:
            parts.append(data["text/plain"])
        if "text/markdown" in data:
            parts.append(data["text/markdown"])
    return "".join(parts)


def main() -> int:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel is this interpreter (the virtualenv with urutau in it).
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO / "examples")}},
    )
    client.execute()
    by_tag = {}
    for cell in nb.cells:
        for tag in cell.get("metadata", {}).get("tags", []):
            by_tag[tag] = text_of(cell)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                print(f"cell failed: {out.get('ename')}: {out.get('evalue')}")
                return 1
    expectations = {
        "setup": ["shop.jsonl ->"],
        "first-pipeline": ["pipeline shop", "lake.orders"],
        # Orders 1, 3, 6 and 40 live, the others deleted; test orders kept.
        "first-preview": ["_change", "upsert", "delete", "test"],
        "second-preview": ["changed_at", "change_op", "_change", "delete"],
        "explain": ["FilterExec", "IcebergSinkExec", "CAST", "changed_at"],
        "run": ["caught up", "lake.orders"],
        "query": ["new", "paid", "shipped", "orders", "total"],
        "read": ["changed_at", "shipped"],
    }
    failed = False
    for tag, wanted in expectations.items():
        shown = by_tag.get(tag)
        if shown is None:
            print(f"no cell tagged {tag!r}")
            failed = True
            continue
        for w in wanted:
            if w not in shown:
                print(f"cell {tag!r} does not show {w!r}; it shows:\n{shown}")
                failed = True
    if "test" in by_tag.get("query", ""):
        print("the query shows test orders the route filters out:\n" + by_tag["query"])
        failed = True
    print("notebook executed; outputs checked" if not failed else "notebook outputs wrong")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
