#!/usr/bin/env python3
"""Test harness for the Couchbase sink: a local gocaves mock cluster
(Couchbase's own mock for SDK testing, built by ./gocaves-build from the Go
module plus our small patch gocaves.patch), and the official Couchbase Python
SDK (PyPI `couchbase`) as the independent reader.

  couchbase.py start --dir D [--bin PATH] [--timeout S] [--tls-cert PEM --tls-key PEM]
      -> starts `gocaves --mock-only` detached (own process group), logs in D,
         prints one JSON line {"connstr", "pid", "username", "password"}
         (with --tls-*, the nodes also serve TLS with that certificate, and
         "tls_connstr" is the couchbases:// seed list: patch item 4)
  couchbase.py stop --dir D
      -> kills the process group from D/pid (SIGKILL: all state is in memory);
         idempotent
  couchbase.py get    CONN < ["k1", "k2"]       -> {"k1": doc-or-null, ...}
  couchbase.py upsert CONN < {"k1": doc, ...}   -> {"k1": cas, ...}
  couchbase.py remove CONN < ["k1", "k2"]       -> {"k1": true|false, ...}
      CONN = --connstr C --username U --password P --bucket B
             [--scope S] [--collection X] [--timeout S]
      (scope and collection default to _default; they must already exist).

gocaves listens on random 127.0.0.1 ports: 2 nodes, buckets `default`
(1 replica) and `memd`, user Administrator/password. It has no query service,
so documents are read by key only.  Dependencies: Python 3 stdlib; the
`couchbase` package for get/upsert/remove.
"""
import argparse
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# This file is named like the SDK's package: keep its directory off the import
# path so that `import couchbase` finds the SDK, not this script.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
USERNAME = "Administrator"
PASSWORD = "password"
CONNSTR_RE = re.compile(r'\{"connstr":\s*"([^"]+)"\}')
TLS_CONNSTR_RE = re.compile(r'\{"tls_connstr":\s*"([^"]+)"\}')


def fail(msg):
    print(f"couchbase harness: {msg}", file=sys.stderr)
    sys.exit(1)


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def read_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def is_gocaves(pid):
    cmd = read_cmdline(pid)
    return bool(cmd) and b"gocaves" in os.path.basename(cmd[0]) and b"--mock-only" in cmd


def kv_hosts(connstr):
    """[(host, port)] from couchbase://h1:p1,h2:p2 (default KV port 11210)."""
    rest = connstr.split("://", 1)[-1].split("?", 1)[0]
    out = []
    for part in rest.split(","):
        host, _, port = part.strip().rpartition(":")
        out.append((host or part, int(port) if port.isdigit() else 11210))
    return out


def find_bin(explicit):
    if explicit:
        return os.path.abspath(explicit)
    try:
        res = subprocess.run([os.path.join(HERE, "gocaves-build")], stdout=subprocess.PIPE, check=True)
    except subprocess.CalledProcessError as e:
        fail(f"gocaves-build failed (exit {e.returncode}); see its messages above")
    return res.stdout.decode().strip().splitlines()[-1]


def cmd_start(args):
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    pidfile = os.path.join(d, "pid")
    if os.path.exists(pidfile):
        try:
            old = int(open(pidfile).read().strip())
        except ValueError:
            old = 0
        if old and alive(old) and is_gocaves(old):
            fail(f"gocaves already running from {d} (pid {old}); run `stop --dir {d}` first")
        os.remove(pidfile)
    binary = find_bin(args.bin)
    if not os.access(binary, os.X_OK):
        fail(f"gocaves binary not found or not executable: {binary}")
    out_log, err_log = os.path.join(d, "gocaves.out"), os.path.join(d, "gocaves.err")
    t0 = time.monotonic()
    env = dict(os.environ)
    if args.tls_cert:
        env["GOCAVES_TLS_CERT_FILE"] = os.path.abspath(args.tls_cert)
        env["GOCAVES_TLS_KEY_FILE"] = os.path.abspath(args.tls_key)
    with open(out_log, "wb") as out, open(err_log, "wb") as err:
        proc = subprocess.Popen([binary, "--mock-only"], cwd=d, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True, close_fds=True, env=env)

    def give_up(msg):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        fail(f"{msg}\n--- tail of {err_log} ---\n{tail(err_log)}--- tail of {out_log} ---\n{tail(out_log)}")

    deadline = t0 + args.timeout
    connstr = None
    tls_connstr = None
    while connstr is None:
        log = tail(err_log, 200)
        m = CONNSTR_RE.search(log)
        t = TLS_CONNSTR_RE.search(log)
        if m and (t or not args.tls_cert):
            connstr = m.group(1)
            tls_connstr = t.group(1) if t else None
            break
        if proc.poll() is not None:
            give_up(f"gocaves exited with status {proc.returncode} before printing its connstr")
        if time.monotonic() > deadline:
            give_up(f"gocaves printed no connstr within {args.timeout:.0f} s")
        time.sleep(0.05)
    host, port = kv_hosts(connstr)[0]
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            break
        except OSError:
            pass
        if proc.poll() is not None:
            give_up(f"gocaves exited with status {proc.returncode} before its KV port {port} accepted")
        if time.monotonic() > deadline:
            give_up(f"gocaves KV port {host}:{port} did not accept a connection within {args.timeout:.0f} s")
        time.sleep(0.05)
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{proc.pid}\n")
    os.replace(pidfile + ".tmp", pidfile)
    print(f"couchbase harness: gocaves pid {proc.pid} ready in {time.monotonic() - t0:.2f} s: {connstr}",
          file=sys.stderr)
    info = {"connstr": connstr, "pid": proc.pid, "username": USERNAME, "password": PASSWORD}
    if tls_connstr:
        info["tls_connstr"] = tls_connstr
    print(json.dumps(info), flush=True)


def cmd_stop(args):
    d = os.path.abspath(args.dir)
    pidfile = os.path.join(d, "pid")
    try:
        pid = int(open(pidfile).read().strip())
    except (OSError, ValueError):
        return  # not running (or already stopped)
    if alive(pid) and is_gocaves(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            fail(f"gocaves pid {pid} still alive 10 s after SIGKILL")
    os.remove(pidfile)


# --- the independent reader: the official Couchbase Python SDK -------------

def watchdog(seconds):
    """The SDK may block in C++ code; make sure the CLI never hangs a test."""
    def expire():
        print(f"couchbase harness: gave up after {seconds:.0f} s (watchdog)", file=sys.stderr, flush=True)
        os._exit(3)
    t = threading.Timer(seconds, expire)
    t.daemon = True
    t.start()


def open_collection(args):
    from datetime import timedelta
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.options import ClusterOptions, ClusterTimeoutOptions, WaitUntilReadyOptions
    from couchbase.diagnostics import ServiceType

    timeout = timedelta(seconds=args.timeout)
    # The KV timeout is the SDK's 2.5 s by default; gocaves on a loaded
    # 2-core CI machine can miss it (CI saw a first get time out), and a
    # reader that fails there fails a test for nothing the sink did.
    opts = ClusterOptions(PasswordAuthenticator(args.username, args.password),
                          timeout_options=ClusterTimeoutOptions(connect_timeout=timeout,
                                                                bootstrap_timeout=timeout,
                                                                kv_timeout=timeout))
    # Connecting, waiting for KV and opening the bucket are tried three
    # times, each on a new Cluster: gocaves on a loaded 2-core CI machine
    # has missed a bootstrap (CI saw "Failed to connect") and an open of a
    # bucket that had been read moments before (CI saw open_bucket time out
    # with UnAmbiguousTimeoutException), neither of which says anything of
    # the sink. A mock that is gone, or a bucket that does not exist, fails
    # all three.
    last = None
    for attempt in range(1, 4):
        cluster = None
        try:
            step = f"cannot connect to {args.connstr}"
            cluster = Cluster(args.connstr, opts)
            step = f"cluster {args.connstr} not ready within {args.timeout:.0f} s"
            cluster.wait_until_ready(timeout, WaitUntilReadyOptions(service_types=[ServiceType.KeyValue]))
            # The 4.x Bucket has no wait_until_ready: opening it waits for
            # the bucket and times out when the bucket does not exist.
            step = f"bucket {args.bucket!r} could not be opened (does it exist?)"
            bucket = cluster.bucket(args.bucket)
            break
        except Exception as e:
            last = f"{step}: {e!r}"
            print(f"couchbase harness: try {attempt} of 3: {last}", file=sys.stderr, flush=True)
            if cluster is not None:
                try:
                    cluster.close()
                except Exception:
                    pass
            if attempt == 3:
                fail(f"{last} (3 tries)")
            time.sleep(1)
    return bucket.scope(args.scope).collection(args.collection)


def explain(e, args):
    """A clearer message for an unknown scope/collection (the SDK just times out)."""
    text = repr(e)
    if "collection_outdated" in text or "collection_not_found" in text.lower():
        return (f"collection {args.scope}.{args.collection} of bucket {args.bucket!r} "
                f"is unknown to the server (does it exist?): {text}")
    return text


def read_stdin(kind):
    try:
        data = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        fail(f"stdin is not JSON: {e}")
    if not isinstance(data, kind) or (kind is list and not all(isinstance(k, str) for k in data)):
        fail("stdin must be a JSON array of string keys" if kind is list else
             "stdin must be a JSON object {key: document}")
    return data


def decode(coll, key, result):
    """The document as JSON: content_as[dict], else the raw bytes parsed as JSON."""
    try:
        return result.content_as[dict]
    except Exception:
        pass
    from couchbase.exceptions import ValueFormatException
    from couchbase.options import GetOptions
    from couchbase.transcoder import RawBinaryTranscoder, RawJSONTranscoder
    try:
        raw = coll.get(key, GetOptions(transcoder=RawJSONTranscoder())).value
    except ValueFormatException:
        raw = coll.get(key, GetOptions(transcoder=RawBinaryTranscoder())).value
    if isinstance(raw, str):
        raw = raw.encode()
    try:
        return json.loads(raw)
    except ValueError:
        return {"$binary_base64": base64.b64encode(raw).decode()}


def get_one(coll, key, args, not_found, attempts=3):
    """One document (None: there is none). A read is idempotent, so a
    timeout is tried again, twice; any other error fails at once."""
    from couchbase.exceptions import AmbiguousTimeoutException, UnAmbiguousTimeoutException
    for attempt in range(1, attempts + 1):
        try:
            return decode(coll, key, coll.get(key))
        except not_found:
            return None
        except (AmbiguousTimeoutException, UnAmbiguousTimeoutException) as e:
            if attempt == attempts:
                fail(f"get {key!r}: {explain(e, args)} (timed out {attempts} times)")
        except Exception as e:
            fail(f"get {key!r}: {explain(e, args)}")


def cmd_get(args):
    from couchbase.exceptions import DocumentNotFoundException
    keys = read_stdin(list)
    coll = open_collection(args)
    out = {}
    for k in keys:
        out[k] = get_one(coll, k, args, DocumentNotFoundException)
    print(json.dumps(out, ensure_ascii=False), flush=True)


def cmd_upsert(args):
    docs = read_stdin(dict)
    coll = open_collection(args)
    out = {}
    for k, doc in docs.items():
        try:
            out[k] = coll.upsert(k, doc).cas
        except Exception as e:
            fail(f"upsert {k!r}: {explain(e, args)}")
    print(json.dumps(out), flush=True)


def cmd_remove(args):
    from couchbase.exceptions import DocumentNotFoundException
    keys = read_stdin(list)
    coll = open_collection(args)
    out = {}
    for k in keys:
        try:
            coll.remove(k)
            out[k] = True
        except DocumentNotFoundException:
            out[k] = False
        except Exception as e:
            fail(f"remove {k!r}: {explain(e, args)}")
    print(json.dumps(out), flush=True)


def cmd_layout(args):
    """Every bucket with its scopes and their collections, as the SDK's
    management APIs list them: {bucket: {scope: [collection, ...]}} (a
    memcached bucket, which has none: null)."""
    from datetime import timedelta
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.options import ClusterOptions, WaitUntilReadyOptions
    from couchbase.diagnostics import ServiceType

    try:
        cluster = Cluster(args.connstr, ClusterOptions(PasswordAuthenticator(args.username, args.password)))
        cluster.wait_until_ready(timedelta(seconds=args.timeout),
                                 WaitUntilReadyOptions(service_types=[ServiceType.KeyValue]))
        out = {}
        for b in cluster.buckets().get_all_buckets():
            if str(b.bucket_type.value) == "memcached":
                out[b.name] = None  # no scopes or collections
                continue
            scopes = cluster.bucket(b.name).collections().get_all_scopes()
            out[b.name] = {s.name: sorted(c.name for c in s.collections) for s in scopes}
    except Exception as e:
        fail(f"listing the cluster's buckets and collections: {e!r}")
    print(json.dumps(out, sort_keys=True), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--dir", required=True)
    s.add_argument("--bin", help="gocaves binary (default: built/found by ./gocaves-build)")
    s.add_argument("--timeout", type=float, default=60.0)
    s.add_argument("--tls-cert", help="also serve TLS with this PEM certificate (needs --tls-key)")
    s.add_argument("--tls-key")
    s.set_defaults(func=cmd_start)
    s = sub.add_parser("stop")
    s.add_argument("--dir", required=True)
    s.set_defaults(func=cmd_stop)
    for name, func in (("get", cmd_get), ("upsert", cmd_upsert), ("remove", cmd_remove)):
        s = sub.add_parser(name)
        s.add_argument("--connstr", required=True)
        s.add_argument("--username", default=USERNAME)
        s.add_argument("--password", default=PASSWORD)
        s.add_argument("--bucket", required=True)
        s.add_argument("--scope", default="_default")
        s.add_argument("--collection", default="_default")
        s.add_argument("--timeout", type=float, default=30.0, help="connect/ready timeout, seconds")
        s.set_defaults(func=func, sdk=True)
    s = sub.add_parser("layout")
    s.add_argument("--connstr", required=True)
    s.add_argument("--username", default=USERNAME)
    s.add_argument("--password", default=PASSWORD)
    s.add_argument("--timeout", type=float, default=30.0, help="connect/ready timeout, seconds")
    s.set_defaults(func=cmd_layout, sdk=True)
    args = p.parse_args(argv)
    if getattr(args, "sdk", False):
        # Room for the three tries of open_collection (each may wait out a
        # connect and a ready timeout) and the reads after them.
        watchdog(args.timeout * 6 + 60)
        try:
            import couchbase  # noqa: F401
        except ImportError:
            fail("the Couchbase Python SDK is missing: pip install -r tests/harness/requirements.txt "
                 "(couchbase==4.6.3), or run with the venv python from tests/harness/setup")
    args.func(args)


if __name__ == "__main__":
    main()
