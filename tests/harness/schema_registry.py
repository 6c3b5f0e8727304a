#!/usr/bin/env python3
"""TEST HARNESS ONLY: a small in-memory stand-in for the Confluent Schema
Registry, implementing the subset of its REST API that Avro clients (serializers,
deserializers, the Kafka source's tests) use. No real schema registry can be
installed on the test machines (see shared/testing/SERVERS.md): this is not
one, it enforces no compatibility, keeps nothing on disk, and must never be
used outside tests. Python 3 stdlib only.

  schema_registry.py start --dir D [--timeout S] [--tls-cert C --tls-key K]
      -> `serve` detached (own process group) on a free 127.0.0.1 port, pid in
         D/pid, log (one line per request) in D/registry.log; waits until it
         answers; prints {"url": "http://127.0.0.1:P", "pid": N, "dir", "log"}.
         All state is in memory: a new start begins empty. With --tls-cert
         and --tls-key (PEM) the same registry also answers HTTPS on a second
         free port: "https_url": "https://127.0.0.1:P2" (register over http,
         read over https).
  schema_registry.py stop --dir D            -> SIGKILLs the group; idempotent
  schema_registry.py serve --port P [--host H] [--port-file F]
      [--tls-cert C --tls-key K --tls-port-file F2]
      -> the server in the foreground (what start runs); --port 0 picks a free
         port, written to F (atomically) once listening; the HTTPS port (always
         a free one) to F2.

The API (JSON bodies; responses application/vnd.schemaregistry.v1+json;
query strings are accepted and ignored, e.g. ?fetchMaxId=false, ?normalize=true):
  POST /subjects/{s}/versions    {"schema": "<text>", "schemaType"?: "AVRO"|"JSON"|"PROTOBUF",
                                  "references"?: [...]} -> {"id": N}
      The same schema (AVRO/JSON: compared as parsed JSON, so whitespace and
      key order do not matter; PROTOBUF: as text) gets the same id under any
      subject; registering it again under a subject adds no version.
  POST /subjects/{s}             same body -> {"subject", "version", "id", "schema"}
                                 (lookup; 40401 unknown subject, 40403 not registered there)
  GET  /subjects                 -> ["s1", ...]
  GET  /subjects/{s}/versions    -> [1, 2, ...]
  GET  /subjects/{s}/versions/{n|latest|-1}        -> {"subject", "version", "id", "schema"}
  GET  /subjects/{s}/versions/{n|latest|-1}/schema -> the schema itself (raw JSON)
  DELETE /subjects/{s}           -> [versions]  (forgets the subject; ids stay valid)
  GET  /schemas/ids/{id}         -> {"schema": "<text>"} (404 {"error_code": 40403, ...})
  GET  /schemas/ids/{id}/versions -> [{"subject", "version"}]
  GET  /schemas/ids/{id}/subjects -> ["s"]
  GET  /schemas/types            -> ["AVRO", "JSON", "PROTOBUF"]
  GET|PUT /config[/{s}]          -> {"compatibilityLevel": "BACKWARD"} / {"compatibility": X}
                                    (stored, never enforced)
  POST /compatibility/subjects/{s}/versions/{v} -> {"is_compatible": true} (always)
  GET  /_stats                   -> {"schema_fetches": {"<id>": count}, "requests": n}
                                    (harness only: counts GET /schemas/ids/{id}, including
                                    unknown ids, so a test can check that a consumer caches)
  DELETE /_stats                 -> resets the counters
Responses carry "schemaType" only for non-AVRO schemas, as Confluent's do.
Schemas are checked to be JSON, not to be valid Avro. Errors: {"error_code":
404xx|422xx|50001, "message": "..."}; any other path is a 404 with error_code
404 (confluent-kafka 2.16's serializers first ask GET /associations/... and
take that 404 as "no association"). Verified with confluent-kafka 2.16.1's
SchemaRegistryClient, AvroSerializer and AvroDeserializer.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")


def log(msg):
    print(f"schema registry harness: {msg}", file=sys.stderr, flush=True)


def fail(msg):
    log(msg)
    sys.exit(1)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class ApiError(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Registry:
    """All state, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.schemas = {}       # id -> {"schema": text, "schemaType": t, "references": [...]}
        self.by_key = {}        # canonical key -> id
        self.subjects = {}      # subject -> [id of version 1, id of version 2, ...]
        self.config = {None: "BACKWARD"}  # None: global
        self.fetches = {}       # id (str) -> count
        self.requests = 0

    @staticmethod
    def canonical(body):
        if not isinstance(body, dict):
            raise ApiError(422, 42201, "the request body must be a JSON object with a \"schema\"")
        text = body.get("schema")
        if not isinstance(text, str):
            raise ApiError(422, 42201, "\"schema\" must be a string holding the schema text")
        stype = body.get("schemaType") or "AVRO"
        if stype not in SCHEMA_TYPES:
            raise ApiError(422, 42201, f"unknown schemaType {stype!r}")
        refs = body.get("references") or []
        if stype == "PROTOBUF":
            key_text = text.strip()
        else:
            try:
                key_text = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
            except ValueError as e:
                raise ApiError(422, 42201, f"Invalid schema: not JSON ({e})")
        key = json.dumps([stype, key_text, refs], sort_keys=True)
        return key, {"schema": text, "schemaType": stype, "references": refs}

    def register(self, subject, body):
        key, rec = self.canonical(body)
        with self.lock:
            sid = self.by_key.get(key)
            if sid is None:
                sid = len(self.schemas) + 1
                self.schemas[sid] = rec
                self.by_key[key] = sid
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid

    def lookup(self, subject, body):
        key, _ = self.canonical(body)
        with self.lock:
            versions = self.subjects.get(subject)
            if versions is None:
                raise ApiError(404, 40401, f"Subject '{subject}' not found.")
            sid = self.by_key.get(key)
            if sid is None or sid not in versions:
                raise ApiError(404, 40403, "Schema not found")
            return self.version_doc(subject, versions.index(sid) + 1, sid)

    def version_doc(self, subject, version, sid):
        rec = self.schemas[sid]
        doc = {"subject": subject, "version": version, "id": sid, "schema": rec["schema"]}
        if rec["schemaType"] != "AVRO":
            doc["schemaType"] = rec["schemaType"]
        if rec["references"]:
            doc["references"] = rec["references"]
        return doc

    def version(self, subject, v):
        with self.lock:
            versions = self.subjects.get(subject)
            if versions is None:
                raise ApiError(404, 40401, f"Subject '{subject}' not found.")
            if v in ("latest", "-1"):
                n = len(versions)
            else:
                try:
                    n = int(v)
                except ValueError:
                    raise ApiError(422, 42202, f"The specified version '{v}' is not a valid version id. "
                                   "Allowed values are between [1, 2^31-1] and the string \"latest\"")
                if n < 1:
                    raise ApiError(422, 42202, f"The specified version '{v}' is not a valid version id.")
            if n < 1 or n > len(versions):
                raise ApiError(404, 40402, f"Version {v} not found.")
            return self.version_doc(subject, n, versions[n - 1])

    def by_id(self, sid_text, count):
        with self.lock:
            if count:
                self.fetches[sid_text] = self.fetches.get(sid_text, 0) + 1
            try:
                sid = int(sid_text)
            except ValueError:
                sid = None
            rec = self.schemas.get(sid)
            if rec is None:
                raise ApiError(404, 40403, f"Schema {sid_text} not found")
            return sid, rec

    def subjects_of(self, sid):
        with self.lock:
            return [(s, vs.index(sid) + 1) for s, vs in sorted(self.subjects.items()) if sid in vs]


def make_handler(reg):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "urutau-test-schema-registry/1"

        def log_message(self, fmt, *args):
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} {fmt % args}\n")
            sys.stderr.flush()

        def send(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def handle_any(self, method):
            with reg.lock:
                reg.requests += 1
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = 0
            raw = self.rfile.read(n) if n > 0 else b""  # always read: keep-alive

            def body():
                if not raw.strip():
                    return None
                try:
                    return json.loads(raw)
                except ValueError as e:
                    raise ApiError(422, 422, f"the request body is not JSON: {e}")

            try:
                path = urllib.parse.urlsplit(self.path).path
                parts = [urllib.parse.unquote(p) for p in path.split("/") if p]
                status, obj = route(method, parts, body)
                self.send(status, obj)
            except ApiError as e:
                self.send(e.status, {"error_code": e.code, "message": e.message})
            except Exception as e:  # a bug here must show as an error, not a hang
                self.send(500, {"error_code": 50001, "message": f"internal error: {e!r}"})

        def do_GET(self):
            self.handle_any("GET")

        def do_POST(self):
            self.handle_any("POST")

        def do_PUT(self):
            self.handle_any("PUT")

        def do_DELETE(self):
            self.handle_any("DELETE")

    def schema_doc(rec):
        doc = {"schema": rec["schema"]}
        if rec["schemaType"] != "AVRO":
            doc["schemaType"] = rec["schemaType"]
        if rec["references"]:
            doc["references"] = rec["references"]
        return doc

    def route(method, p, body):
        n = len(p)
        if n == 1 and p[0] == "subjects" and method == "GET":
            with reg.lock:
                return 200, sorted(reg.subjects)
        if n >= 2 and p[0] == "subjects":
            subject = p[1]
            if n == 2 and method == "POST":
                return 200, reg.lookup(subject, body())
            if n == 2 and method == "DELETE":
                with reg.lock:
                    versions = reg.subjects.pop(subject, None)
                if versions is None:
                    raise ApiError(404, 40401, f"Subject '{subject}' not found.")
                return 200, list(range(1, len(versions) + 1))
            if n == 3 and p[2] == "versions":
                if method == "POST":
                    return 200, {"id": reg.register(subject, body())}
                if method == "GET":
                    with reg.lock:
                        versions = reg.subjects.get(subject)
                    if versions is None:
                        raise ApiError(404, 40401, f"Subject '{subject}' not found.")
                    return 200, list(range(1, len(versions) + 1))
            if n == 4 and p[2] == "versions" and method == "GET":
                return 200, reg.version(subject, p[3])
            if n == 5 and p[2] == "versions" and p[4] == "schema" and method == "GET":
                doc = reg.version(subject, p[3])
                try:
                    return 200, json.loads(doc["schema"])
                except ValueError:
                    return 200, doc["schema"]
        if n >= 3 and p[0] == "schemas" and p[1] == "ids" and method == "GET":
            sid, rec = reg.by_id(p[2], count=(n == 3))
            if n == 3:
                return 200, schema_doc(rec)
            if n == 4 and p[3] == "versions":
                return 200, [{"subject": s, "version": v} for s, v in reg.subjects_of(sid)]
            if n == 4 and p[3] == "subjects":
                return 200, [s for s, _ in reg.subjects_of(sid)]
        if n == 2 and p == ["schemas", "types"] and method == "GET":
            return 200, list(SCHEMA_TYPES)
        if p and p[0] == "config" and n <= 2:
            subject = p[1] if n == 2 else None
            if method == "GET":
                with reg.lock:
                    level = reg.config.get(subject)
                if level is None:
                    raise ApiError(404, 40408, f"Subject '{subject}' does not have subject-level "
                                   "compatibility configured")
                return 200, {"compatibilityLevel": level}
            if method == "PUT":
                b = body()
                level = b.get("compatibility") if isinstance(b, dict) else None
                if not isinstance(level, str):
                    raise ApiError(422, 42203, "the body must be {\"compatibility\": \"<level>\"}")
                with reg.lock:
                    reg.config[subject] = level.upper()
                return 200, {"compatibility": level.upper()}
            if method == "DELETE" and subject is not None:
                with reg.lock:
                    level = reg.config.pop(subject, None)
                if level is None:
                    raise ApiError(404, 40401, f"Subject '{subject}' not found.")
                return 200, {"compatibilityLevel": level}
        if n in (4, 5) and p[0] == "compatibility" and p[1] == "subjects" and method == "POST":
            body()
            return 200, {"is_compatible": True}
        if p == ["_stats"]:
            if method == "GET":
                with reg.lock:
                    return 200, {"schema_fetches": dict(reg.fetches), "requests": reg.requests}
            if method == "DELETE":
                with reg.lock:
                    reg.fetches.clear()
                    reg.requests = 0
                return 200, {}
        if n == 0 and method == "GET":
            return 200, {}
        raise ApiError(404, 404, f"HTTP 404 Not Found: no {method} /{'/'.join(p)} in this test stand-in")

    return Handler


def write_port(path, port):
    with open(path + ".tmp", "w") as f:
        f.write(f"{port}\n")
    os.replace(path + ".tmp", path)


def cmd_serve(args):
    handler = make_handler(Registry())
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    port = server.server_address[1]
    if args.tls_cert:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        tls = ThreadingHTTPServer((args.host, 0), handler)
        tls.daemon_threads = True
        tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
        threading.Thread(target=tls.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True).start()
        log(f"listening on https://{args.host}:{tls.server_address[1]}")
        if args.tls_port_file:
            write_port(args.tls_port_file, tls.server_address[1])
    if args.port_file:
        write_port(args.port_file, port)
    log(f"listening on http://{args.host}:{port} (pid {os.getpid()})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass


# --- start / stop -----------------------------------------------------------

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


def is_ours(pid):
    cmd = read_cmdline(pid)
    return any(os.path.basename(c) == b"schema_registry.py" for c in cmd) and b"serve" in cmd


def read_pid(d):
    try:
        return int(open(os.path.join(d, "pid")).read().strip())
    except (OSError, ValueError):
        return None


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def cmd_start(args):
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    old = read_pid(d)
    if old and alive(old) and is_ours(old):
        fail(f"a schema registry is already running from {d} (pid {old}); run `stop --dir {d}` first")
    port_file = os.path.join(d, "port")
    tls_port_file = os.path.join(d, "tls-port")
    for f in (port_file, tls_port_file):
        try:
            os.remove(f)
        except FileNotFoundError:
            pass
    if bool(args.tls_cert) != bool(args.tls_key):
        fail("--tls-cert and --tls-key go together")
    tls = ["--tls-cert", os.path.abspath(args.tls_cert), "--tls-key", os.path.abspath(args.tls_key),
           "--tls-port-file", tls_port_file] if args.tls_cert else []
    logfile = os.path.join(d, "registry.log")
    t0 = time.monotonic()
    with open(logfile, "ab") as out:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", "--host", "127.0.0.1",
                                 "--port", "0", "--port-file", port_file, *tls], cwd=d, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    pid_path = os.path.join(d, "pid")
    with open(pid_path + ".tmp", "w") as f:
        f.write(f"{proc.pid}\n")
    os.replace(pid_path + ".tmp", pid_path)

    def give_up(msg):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        try:
            os.remove(pid_path)
        except FileNotFoundError:
            pass
        fail(f"{msg}\n--- tail of {logfile} ---\n{tail(logfile)}")

    deadline = t0 + args.timeout
    url = None
    while True:
        if proc.poll() is not None:
            give_up(f"the registry exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            give_up(f"the registry did not answer within {args.timeout:.0f} s")
        if url is None:
            try:
                url = f"http://127.0.0.1:{int(open(port_file).read().strip())}"
            except (OSError, ValueError):
                pass
        if url is not None:
            try:
                with urllib.request.urlopen(f"{url}/config", timeout=2) as r:
                    if r.status == 200 and "compatibilityLevel" in json.loads(r.read()):
                        break
            except (urllib.error.URLError, OSError, ValueError):
                pass
        time.sleep(0.05)
    log(f"pid {proc.pid} answering at {url} in {time.monotonic() - t0:.2f} s (in memory; a test harness)")
    info = {"url": url, "pid": proc.pid, "dir": d, "log": logfile}
    if tls:
        # Written before the http port, which was read above.
        info["https_url"] = f"https://127.0.0.1:{int(open(tls_port_file).read().strip())}"
    emit(info)


def cmd_stop(args):
    d = os.path.abspath(args.dir)
    pid = read_pid(d)
    if pid is None:
        return
    if alive(pid) and is_ours(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            fail(f"pid {pid} still alive 10 s after SIGKILL")
    for name in ("pid", "port"):
        try:
            os.remove(os.path.join(d, name))
        except FileNotFoundError:
            pass


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start the stand-in detached on a free 127.0.0.1 port")
    s.add_argument("--dir", required=True)
    s.add_argument("--timeout", type=float, default=20.0)
    s.add_argument("--tls-cert", help="also answer HTTPS with this certificate (PEM)")
    s.add_argument("--tls-key", help="the key of --tls-cert (PEM)")
    s.set_defaults(func=cmd_start)
    s = sub.add_parser("stop")
    s.add_argument("--dir", required=True)
    s.set_defaults(func=cmd_stop)
    s = sub.add_parser("serve", help="run the stand-in in the foreground")
    s.add_argument("--port", type=int, required=True, help="0: a free port (see --port-file)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port-file", help="write the port listened on to this file")
    s.add_argument("--tls-cert")
    s.add_argument("--tls-key")
    s.add_argument("--tls-port-file", help="write the HTTPS port to this file")
    s.set_defaults(func=cmd_serve)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
