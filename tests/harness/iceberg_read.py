#!/usr/bin/env python3
"""Test harness: read an Iceberg table with DuckDB's iceberg extension, as an
independent reader of what urutau's Iceberg sink wrote.

    python iceberg_read.py <metadata.json> [--order-by COL[,COL...]]
    python iceberg_read.py <metadata.json> --select 'count(*) AS n, sum(v) AS v'
    python iceberg_read.py --avro-rows <file.avro>
    python iceberg_read.py --check-sequence-numbers <metadata.json>
    python iceberg_read.py --time-count <metadata.json>
    python iceberg_read.py --rest URI --warehouse s3://B/ --credential ID:SECRET
        --table NS.T --s3-endpoint http://H:P [--order-by COL[,COL...]] [--metadata]

With --rest the table's metadata location is looked up in the REST catalog
(and --metadata prints the table's metadata JSON instead of its rows); S3
files are read with the given endpoint (path style) and the credential's
key pair.

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
import urllib.parse
import urllib.request
import decimal
import importlib
import importlib.resources
import json
import math
import sys
import uuid

import duckdb


def connect(s3=None):
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    version = con.execute("PRAGMA version").fetchone()[0]
    names = ("httpfs", "avro", "iceberg") if s3 else ("avro", "iceberg")
    for name in names:  # iceberg reads manifests through avro
        pkg = importlib.import_module(f"duckdb_extension_{name}")
        path = importlib.resources.files(pkg) / "extensions" / version / f"{name}.duckdb_extension"
        if not path.is_file():
            raise SystemExit(f"duckdb-extension-{name} has no build for duckdb {version}")
        con.execute("LOAD '" + str(path).replace("'", "''") + "'")
    con.execute("SET TimeZone = 'UTC'")
    if s3:
        endpoint, key, secret, region = s3
        host = urllib.parse.urlparse(endpoint).netloc
        con.execute(
            f"CREATE SECRET s3 (TYPE s3, KEY_ID '{key}', SECRET '{secret}', REGION '{region}', "
            f"ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
        )
    return con


def rest_load(uri, warehouse, credential, table):
    """(metadata location, metadata) of a table in a REST catalog."""
    client_id, client_secret = credential.split(":", 1)
    base = uri.rstrip("/")
    form = urllib.parse.urlencode(
        {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret}
    ).encode()
    token = json.load(urllib.request.urlopen(urllib.request.Request(base + "/v1/oauth/tokens", data=form)))["access_token"]
    config = json.load(urllib.request.urlopen(base + "/v1/config?" + urllib.parse.urlencode({"warehouse": warehouse})))
    prefix = config.get("overrides", {}).get("prefix")
    ns, name = table.rsplit(".", 1)
    path = f"/v1/{prefix}/namespaces/{urllib.parse.quote(ns)}/tables/{urllib.parse.quote(name)}" if prefix else \
        f"/v1/namespaces/{urllib.parse.quote(ns)}/tables/{urllib.parse.quote(name)}"
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    body = json.load(urllib.request.urlopen(request))
    return body["metadata-location"], body["metadata"]


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


def check_sequence_numbers(metadata_json):
    """Every manifest the current snapshot lists, and every live entry in
    it, carries the sequence numbers of the snapshot that added it: a
    manifest's sequence_number is its adding snapshot's, its
    min_sequence_number the least of its live entries' data sequence
    numbers, and an entry's data and file sequence numbers are those of the
    snapshot whose id it carries (after the spec's inheritance for ADDED
    entries). Prints "<manifests> <entries>"; exits 1 naming a violation."""
    def local(p):
        return p[len("file://"):] if p.startswith("file://") else p

    with open(local(metadata_json)) as f:
        md = json.load(f)
    seq_of = {s["snapshot-id"]: s["sequence-number"] for s in md["snapshots"]}
    current = next(s for s in md["snapshots"] if s["snapshot-id"] == md["current-snapshot-id"])
    con = connect()
    lists = con.execute(
        "SELECT manifest_path, added_snapshot_id, sequence_number, min_sequence_number FROM read_avro(?)",
        [local(current["manifest-list"])],
    ).fetchall()
    entries = 0
    for path, added_by, seq, min_seq in lists:
        if added_by in seq_of and seq != seq_of[added_by]:
            raise SystemExit(f"{path}: sequence number {seq}, its snapshot {added_by} has {seq_of[added_by]}")
        rows = con.execute(
            "SELECT status, snapshot_id, sequence_number, file_sequence_number, data_file.file_path FROM read_avro(?)",
            [local(path)],
        ).fetchall()
        live = []
        for status, snap, data_seq, file_seq, file in rows:
            if status == 2:  # DELETED
                continue
            snap = added_by if snap is None else snap
            if status == 1:  # ADDED inherits from the manifest
                data_seq = seq if data_seq is None else data_seq
                file_seq = seq if file_seq is None else file_seq
            if snap in seq_of and not (data_seq == file_seq == seq_of[snap]):
                raise SystemExit(
                    f"{file} in {path}: data/file sequence numbers {data_seq}/{file_seq}, "
                    f"its snapshot {snap} has {seq_of[snap]}")
            live.append(data_seq)
            entries += 1
        if live and min_seq != min(live):
            raise SystemExit(f"{path}: min sequence number {min_seq}, its entries' least is {min(live)}")
    print(len(lists), entries)


def referenced_files(metadata_json):
    """Every file a snapshot the metadata keeps reads: its manifest list,
    the manifests in it and their live (added or existing) data and delete
    files, one path a line, as DuckDB reads the Avro files."""
    def local(p):
        return p[len("file://"):] if p.startswith("file://") else p

    with open(local(metadata_json)) as f:
        md = json.load(f)
    con = connect()
    out = set()
    for snap in md.get("snapshots", []):
        out.add(snap["manifest-list"])
        for (manifest,) in con.execute("SELECT manifest_path FROM read_avro(?)",
                                       [local(snap["manifest-list"])]).fetchall():
            out.add(manifest)
            for (file,) in con.execute("SELECT data_file.file_path FROM read_avro(?) WHERE status <> 2",
                                       [local(manifest)]).fetchall():
                out.add(file)
    for path in sorted(out):
        print(path)


def current_live_files(con, metadata_json):
    """The current snapshot's live data and delete files: (path, content,
    size, records) per file, as DuckDB reads the manifest list and the
    manifests (content: 0 data, 1 position deletes, 2 equality deletes)."""
    def local(p):
        return p[len("file://"):] if p.startswith("file://") else p

    with open(local(metadata_json)) as f:
        md = json.load(f)
    current = next(s for s in md["snapshots"] if s["snapshot-id"] == md["current-snapshot-id"])
    for (manifest,) in con.execute("SELECT manifest_path FROM read_avro(?)",
                                   [local(current["manifest-list"])]).fetchall():
        yield from con.execute(
            "SELECT data_file.file_path, data_file.content, data_file.file_size_in_bytes, "
            "data_file.record_count FROM read_avro(?) WHERE status <> 2",
            [local(manifest)]).fetchall()


def live_files(metadata_json):
    """The current snapshot's live data and delete files, one JSON object
    a line (see current_live_files)."""
    for (path, content, size, records) in current_live_files(connect(), metadata_json):
        print(json.dumps({"path": path, "content": content, "size": size, "records": records}))


def time_count(metadata_json):
    """Times count(*) over the table (iceberg_scan: deletes applied) and
    over its current snapshot's live data files read directly as Parquet,
    in one connection, each the fastest of three runs; prints both counts,
    both times, the data files' sizes and the live delete files of each kind as one JSON object
    (what a reader pays for the table's deletes)."""
    import time

    def local(p):
        return p[len("file://"):] if p.startswith("file://") else p

    con = connect()
    files, sizes, position_deletes, equality_deletes = [], [], 0, 0
    for (path, content, size, _) in current_live_files(con, metadata_json):
        if content == 0:
            files.append(local(path))
            sizes.append(size)
        elif content == 1:
            position_deletes += 1
        else:
            equality_deletes += 1

    def best_of_3(sql, arg):
        # Milliseconds are noisy: the fastest of three runs.
        best = None
        for _ in range(3):
            started = time.monotonic()
            n = con.execute(sql, [arg]).fetchone()[0]
            took = time.monotonic() - started
            best = took if best is None else min(best, took)
        return n, best

    table_rows, table_s = best_of_3("SELECT count(*) FROM iceberg_scan(?)", metadata_json)
    file_rows, files_s = best_of_3("SELECT count(*) FROM read_parquet(?)", files)
    print(json.dumps({"table_rows": table_rows, "table_seconds": table_s, "data_files": len(files),
                      "data_file_sizes": sorted(sizes, reverse=True),
                      "position_delete_files": position_deletes,
                      "equality_delete_files": equality_deletes, "file_rows": file_rows, "files_seconds": files_s}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metadata_json", nargs="?")
    p.add_argument("--order-by")
    p.add_argument("--select", help="print one JSON row of these SQL expressions over the table "
                   "(aggregates: a digest of a table too big to print)")
    p.add_argument("--rest")
    p.add_argument("--warehouse")
    p.add_argument("--credential")
    p.add_argument("--table")
    p.add_argument("--s3-endpoint")
    p.add_argument("--s3-region", default="us-east-1")
    p.add_argument("--metadata", action="store_true")
    p.add_argument("--avro-rows", help="print the number of records of an Avro file (a manifest list)")
    p.add_argument("--check-sequence-numbers", action="store_true",
                   help="check the current snapshot's manifests (see check_sequence_numbers)")
    p.add_argument("--referenced-files", action="store_true",
                   help="list every file a kept snapshot reads (see referenced_files)")
    p.add_argument("--live-files", action="store_true",
                   help="list the current snapshot's live files (see live_files)")
    p.add_argument("--time-count", action="store_true",
                   help="time count(*) over the table and over its data files (see time_count)")
    args = p.parse_args()
    if args.time_count:
        time_count(args.metadata_json)
        return
    if args.live_files:
        live_files(args.metadata_json)
        return
    if args.referenced_files:
        referenced_files(args.metadata_json)
        return
    if args.check_sequence_numbers:
        check_sequence_numbers(args.metadata_json)
        return
    if args.avro_rows:
        con = connect()
        print(con.execute("SELECT count(*) FROM read_avro(?)", [args.avro_rows]).fetchone()[0])
        return
    s3 = None
    if args.rest:
        location, metadata = rest_load(args.rest, args.warehouse, args.credential, args.table)
        if args.metadata:
            print(json.dumps({"metadata-location": location, "metadata": metadata}))
            return
        args.metadata_json = location
        key, secret = args.credential.split(":", 1)
        s3 = (args.s3_endpoint, key, secret, args.s3_region)
    con = connect(s3)
    if args.select:
        rel = con.execute(f"SELECT {args.select} FROM iceberg_scan(?)", [args.metadata_json])
        names = [d[0] for d in rel.description]
        row = rel.fetchone()
        print(json.dumps({n: (str(v) if isinstance(v, decimal.Decimal) else v) for n, v in zip(names, row)}))
        return
    src = con.sql("SELECT * FROM iceberg_scan($p) LIMIT 0", params={"p": args.metadata_json})
    names, renderers, select = src.columns, [], []
    for name, t in zip(src.columns, src.types):
        sql_type, changed, f = plan(t)
        renderers.append(f)
        select.append(f"CAST({quote(name)} AS {sql_type}) AS {quote(name)}" if changed else quote(name))
    sql = f"SELECT {', '.join(select)} FROM iceberg_scan(?)"
    if args.order_by:
        sql += " ORDER BY " + ", ".join(quote(c.strip()) for c in args.order_by.split(","))
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
