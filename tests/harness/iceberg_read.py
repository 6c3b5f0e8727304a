#!/usr/bin/env python3
"""Test harness: read an Iceberg table with DuckDB's iceberg extension, as an
independent reader of what urutau's Iceberg sink wrote.

    python iceberg_read.py <metadata.json> [--order-by COL]

Prints one JSON object per row (keys = column names, table order). Works
offline: the avro and iceberg extensions are loaded from the files shipped in
their pip packages; nothing is downloaded or auto-loaded.

Rendering: bool/int as JSON; float/double as JSON numbers (NaN/Infinity as
strings); decimal as an exact string ("1234.50"); date "YYYY-MM-DD"; time
"HH:MM:SS.ffffff"; timestamp "YYYY-MM-DDTHH:MM:SS.ffffff"; timestamptz the same
in UTC with "+00:00"; uuid canonical lower case; binary/fixed lower-case hex;
struct an object; list an array; map {"keys": [...], "values": [...]}.
"""
import argparse
import datetime as dt
import decimal
import importlib
import importlib.resources
import json
import math
import sys
import uuid

import duckdb


def connect():
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    version = con.execute("PRAGMA version").fetchone()[0]
    for name in ("avro", "iceberg"):  # iceberg reads manifests through avro
        pkg = importlib.import_module(f"duckdb_extension_{name}")
        path = importlib.resources.files(pkg) / "extensions" / version / f"{name}.duckdb_extension"
        if not path.is_file():
            raise SystemExit(f"duckdb-extension-{name} has no build for duckdb {version}")
        con.execute("LOAD '" + str(path).replace("'", "''") + "'")
    con.execute("SET TimeZone = 'UTC'")
    return con


def render(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dt.datetime):
        return v.isoformat(timespec="microseconds")
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, dt.time):
        return v.isoformat(timespec="microseconds")
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): render(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [render(x) for x in v]
    return str(v)


def quote(name):
    return '"' + name.replace('"', '""') + '"'


def plan(t):
    """(sql type, whether it changed, renderer) for a DuckDB type. TIMESTAMP
    WITH TIME ZONE is fetched as TIMESTAMP in UTC (fetching it as such needs
    pytz) and rendered with +00:00."""
    tid = t.id
    if tid == "timestamp with time zone":
        return "TIMESTAMP", True, lambda v: None if v is None else v.isoformat(timespec="microseconds") + "+00:00"
    if tid == "map":
        kt, kc, kf = plan(t.key)
        vt, vc, vf = plan(t.value)

        def f(v):
            if v is None:
                return None
            items = list(v.items()) if isinstance(v, dict) else list(zip(v["key"], v["value"]))
            return {"keys": [kf(k) for k, _ in items], "values": [vf(x) for _, x in items]}

        return f"MAP({kt}, {vt})", kc or vc, f
    if tid == "struct":
        fields = [(name,) + plan(ct) for name, ct in t.children]

        def f(v):
            if v is None:
                return None
            return {name: ff(v[name]) for name, _, _, ff in fields}

        sql = "STRUCT(" + ", ".join(f"{quote(n)} {ft}" for n, ft, _, _ in fields) + ")"
        return sql, any(c for _, _, c, _ in fields), f
    if tid == "list":
        et, ec, ef = plan(t.child)
        return f"{et}[]", ec, (lambda v: None if v is None else [ef(x) for x in v])
    return str(t), False, render


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metadata_json")
    p.add_argument("--order-by")
    args = p.parse_args()
    con = connect()
    src = con.sql("SELECT * FROM iceberg_scan($p) LIMIT 0", params={"p": args.metadata_json})
    names, renderers, select = src.columns, [], []
    for name, t in zip(src.columns, src.types):
        sql_type, changed, f = plan(t)
        renderers.append(f)
        select.append(f"CAST({quote(name)} AS {sql_type}) AS {quote(name)}" if changed else quote(name))
    sql = f"SELECT {', '.join(select)} FROM iceberg_scan(?)"
    if args.order_by:
        sql += f" ORDER BY {quote(args.order_by)}"
    rel = con.execute(sql, [args.metadata_json])
    out = sys.stdout
    while True:
        rows = rel.fetchmany(4096)
        if not rows:
            break
        for row in rows:
            out.write(json.dumps({n: f(v) for n, f, v in zip(names, renderers, row)}, ensure_ascii=False, allow_nan=False) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
