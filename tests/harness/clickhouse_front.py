#!/usr/bin/env python3
"""clickhouse_front.py -- TEST HARNESS, NOT A CLICKHOUSE SERVER.

A small HTTP front around the *real* ClickHouse engine that ships inside the
`chdb` Python package (chdb-core 26.9).  It speaks the subset of ClickHouse's
HTTP interface that the Rust crates `clickhouse` 0.15.x and
`clickhouse-ext-arrow` 0.1.0 use, so a project's tests can run against a real
ClickHouse engine when no clickhouse-server binary is available.

It is meant for tests on loopback only: one process, one chdb session, one
global lock around every engine call, every request body buffered in memory,
no users/roles/quotas (an optional single user/password check), no real HTTP
sessions.  Do not use it as a server for anything else.

Usage
  python clickhouse_front.py [serve] --port P --path DIR [--user U --password PW]
      Serve 127.0.0.1:P in the foreground (P=0 picks a free port).  Prints one
      JSON line {"port", "pid", "url", "path"} on stdout when ready.
  python clickhouse_front.py start --path DIR [--port P] [--user U --password PW]
                                   [--log FILE] [--watch-pid PID]
                                   [--tls-cert PEM --tls-key PEM]   (https)
      Start a detached server, wait until it is ready, print the same JSON
      line and exit 0.  --watch-pid makes the server exit when PID is gone.
  python clickhouse_front.py stop --pid N [--timeout S]
      SIGTERM the server started above (SIGKILL after S seconds).

HTTP surface
  GET/POST /?query=...            query in the URL and/or in the body
  POST body = query text           when there is no `query` parameter
  INSERT ... FORMAT X + data       data from the body (and inline text after
                                   FORMAT X), fed to chdb's streaming insert
  Transfer-Encoding: chunked, Content-Length bodies
  decompress=1                     ClickHouse compressed blocks (LZ4 0x82,
                                   NONE 0x02, ZSTD 0x90 if `zstandard` is
                                   installed); CityHash128 checksums verified
                                   (error 40 CHECKSUM_DOESNT_MATCH)
  compress=1                       reply in ClickHouse LZ4 compressed blocks
  enable_http_compression=1 + Accept-Encoding: lz4|gzip|deflate
  Content-Encoding: gzip|deflate|lz4 request bodies
  default_format / X-ClickHouse-Format, database / X-ClickHouse-Database
  user/password params, X-ClickHouse-User/-Key, Basic auth (code 516)
  param_<name> in the URL or as multipart/form-data fields -> {name:Type}
  any other parameter -> ClickHouse setting for that request only
  /ping, /replicas_status -> "Ok.\\n"
  errors -> HTTP status as ClickHouse maps the code, body
            "Code: N. DB::Exception: ...", header X-ClickHouse-Exception-Code
"""

import argparse
import base64
import gzip
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

try:
    import lz4.block as lz4_block
    import lz4.frame as lz4_frame
except ImportError:  # pragma: no cover - reported when compression is used
    lz4_block = lz4_frame = None
try:
    from clickhouse_cityhash.cityhash import CityHash128
except ImportError:  # pragma: no cover
    CityHash128 = None
try:
    import zstandard
except ImportError:
    zstandard = None

# --------------------------------------------------------------------------
# Error codes (numbers as reported by the engine's errorCodeToName()).
# --------------------------------------------------------------------------
CANNOT_PARSE_TEXT = 6
ATTEMPT_TO_READ_AFTER_EOF = 32
BAD_ARGUMENTS = 36
TOO_LARGE_SIZE_COMPRESSED = 39
CHECKSUM_DOESNT_MATCH = 40
NOT_IMPLEMENTED = 48
UNKNOWN_FORMAT = 73
UNKNOWN_COMPRESSION_METHOD = 89
UNKNOWN_SETTING = 115
CANNOT_DECOMPRESS = 271
AUTHENTICATION_FAILED = 516
STD_EXCEPTION = 1001

ERROR_NAMES = {
    CANNOT_PARSE_TEXT: "CANNOT_PARSE_TEXT",
    ATTEMPT_TO_READ_AFTER_EOF: "ATTEMPT_TO_READ_AFTER_EOF",
    BAD_ARGUMENTS: "BAD_ARGUMENTS",
    TOO_LARGE_SIZE_COMPRESSED: "TOO_LARGE_SIZE_COMPRESSED",
    CHECKSUM_DOESNT_MATCH: "CHECKSUM_DOESNT_MATCH",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    UNKNOWN_FORMAT: "UNKNOWN_FORMAT",
    UNKNOWN_COMPRESSION_METHOD: "UNKNOWN_COMPRESSION_METHOD",
    UNKNOWN_SETTING: "UNKNOWN_SETTING",
    CANNOT_DECOMPRESS: "CANNOT_DECOMPRESS",
    AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED",
    STD_EXCEPTION: "STD_EXCEPTION",
}

# HTTP status for an exception code, following ClickHouse's own table
# (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp); numbers from errorCodeToName.
_HTTP_401 = {194}                                   # REQUIRED_PASSWORD
_HTTP_403 = {192, 193, 516, 512, 497}               # UNKNOWN_USER, WRONG_PASSWORD,
                                                    # AUTHENTICATION_FAILED,
                                                    # SET_NON_GRANTED_ROLE, ACCESS_DENIED
_HTTP_400 = {36, 427, 6, 25, 26, 38, 41, 72, 441, 675, 676, 27, 376, 15, 44, 37,
             123, 8, 167, 168, 223, 62, 117, 53, 321}
_HTTP_404 = {60, 46, 47, 50, 56, 81, 115, 152, 63, 73, 336, 78, 511}
_HTTP_OTHER = {229: 413, 48: 501, 209: 503, 76: 503, 381: 411, 159: 408,
               439: 503, 779: 415}


def http_status_for(code):
    if code in _HTTP_401:
        return 401
    if code in _HTTP_403:
        return 403
    if code in _HTTP_400:
        return 400
    if code in _HTTP_404:
        return 404
    return _HTTP_OTHER.get(code, 500)


class ChError(Exception):
    """An error to be reported the way ClickHouse reports it."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code
        self.text = text  # "Code: N. DB::Exception: ..." (no version suffix)

    @classmethod
    def make(cls, code, message):
        name = ERROR_NAMES.get(code, "")
        suffix = f". ({name})" if name else ""
        return cls(code, f"Code: {code}. DB::Exception: {message}{suffix}")


_CODE_RE = re.compile(r"Code: (\d+)\. (.*)", re.S)


def engine_error(exc):
    """Turn an exception raised by chdb into a ChError with the engine's code."""
    msg = str(exc)
    m = _CODE_RE.search(msg)
    if m:
        return ChError(int(m.group(1)), f"Code: {m.group(1)}. {m.group(2).rstrip()}")
    return ChError.make(STD_EXCEPTION, f"{type(exc).__name__}: {msg}")


# --------------------------------------------------------------------------
# ClickHouse compressed-block framing (decompress=1 / compress=1)
#   16 bytes checksum | method u8 | compressed size u32 LE (incl. the 9-byte
#   header) | uncompressed size u32 LE | payload
#   checksum = CityHash128 v1.0.2 of (header + payload), written as two u64 LE
#   words; with the `clickhouse-cityhash` package the integer's HIGH 64 bits
#   come first on the wire (checked against the engine's own .bin files).
# --------------------------------------------------------------------------
METHOD_NONE = 0x02
METHOD_LZ4 = 0x82
METHOD_ZSTD = 0x90
_HEADER = 9
_CKSUM = 16
_MAX_BLOCK = 1 << 30
_MASK64 = (1 << 64) - 1


def _need_compression_libs():
    if lz4_block is None or CityHash128 is None:
        raise ChError.make(NOT_IMPLEMENTED, "compression needs the Python packages "
                           "'lz4' and 'clickhouse-cityhash'")


def block_checksum(header_and_payload):
    h = CityHash128(header_and_payload)
    return struct.pack("<QQ", h >> 64, h & _MASK64)


class BlockDecoder:
    """Incremental decoder of ClickHouse compressed blocks."""

    def __init__(self, verify=True):
        _need_compression_libs()
        self.verify = verify
        self.buf = bytearray()
        self.pos = 0
        self.blocks = 0

    def feed(self, data):
        self.buf += data
        out = []
        buf = self.buf
        while len(buf) - self.pos >= _CKSUM + _HEADER:
            p = self.pos
            method = buf[p + _CKSUM]
            csize, usize = struct.unpack_from("<II", buf, p + _CKSUM + 1)
            if csize < _HEADER or csize > _MAX_BLOCK or usize > _MAX_BLOCK:
                raise ChError.make(TOO_LARGE_SIZE_COMPRESSED,
                                   f"Too large size_compressed_without_checksum: {csize}. "
                                   "Most likely corrupted data.")
            end = p + _CKSUM + csize
            if len(buf) < end:
                break
            block = bytes(buf[p:end])  # copy: no exported views on self.buf
            if self.verify:
                expected = block[:_CKSUM]
                actual = block_checksum(block[_CKSUM:])
                if actual != expected:
                    raise ChError.make(
                        CHECKSUM_DOESNT_MATCH,
                        "Checksum doesn't match: corrupted data. Reference: "
                        f"{expected.hex()}. Actual: {actual.hex()}. "
                        f"Size of compressed block: {csize}")
            out.append(self._decompress(method, memoryview(block)[_CKSUM + _HEADER:], usize))
            self.pos = end
            self.blocks += 1
        if self.pos and self.pos > (1 << 20):
            del self.buf[:self.pos]
            self.pos = 0
        elif self.pos == len(self.buf):
            self.buf.clear()
            self.pos = 0
        return out

    @staticmethod
    def _decompress(method, payload, usize):
        if method == METHOD_LZ4:
            try:
                data = lz4_block.decompress(payload, uncompressed_size=usize)
            except Exception as e:
                raise ChError.make(CANNOT_DECOMPRESS, f"Cannot decompress LZ4-encoded data: {e}")
        elif method == METHOD_NONE:
            data = bytes(payload)
        elif method == METHOD_ZSTD and zstandard is not None:
            try:
                data = zstandard.ZstdDecompressor().decompress(bytes(payload), max_output_size=usize)
            except Exception as e:
                raise ChError.make(CANNOT_DECOMPRESS, f"Cannot decompress ZSTD-encoded data: {e}")
        else:
            raise ChError.make(UNKNOWN_COMPRESSION_METHOD,
                               f"Unknown compression method: {method:#x}")
        if len(data) != usize:
            raise ChError.make(CANNOT_DECOMPRESS,
                               f"Decompressed size {len(data)} differs from header {usize}")
        return data

    def finish(self):
        if len(self.buf) - self.pos:
            raise ChError.make(ATTEMPT_TO_READ_AFTER_EOF,
                               "Cannot read all data: truncated compressed block "
                               f"({len(self.buf) - self.pos} trailing bytes)")


def compress_blocks(data, block_size=1 << 20):
    """Encode `data` as ClickHouse LZ4 compressed blocks (for compress=1)."""
    _need_compression_libs()
    out = []
    view = memoryview(data)
    for off in range(0, len(data), block_size):
        chunk = view[off:off + block_size]
        payload = lz4_block.compress(chunk, store_size=False)
        header = struct.pack("<BII", METHOD_LZ4, _HEADER + len(payload), len(chunk))
        framed = header + payload
        out.append(block_checksum(framed))
        out.append(framed)
    return b"".join(out)


# --------------------------------------------------------------------------
# SQL helpers
# --------------------------------------------------------------------------
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$") | frozenset(range(0x80, 0x100))
_SPACE = frozenset(b" \t\r\n\f\v")
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _skip_quoted(buf, i):
    quote = buf[i]
    i += 1
    n = len(buf)
    while i < n:
        c = buf[i]
        if c == 0x5C:  # backslash escape
            i += 2
            continue
        if c == quote:
            if i + 1 < n and buf[i + 1] == quote:  # doubled quote
                i += 2
                continue
            return i + 1
        i += 1
    return n


def _skip_space_and_comments(buf, i):
    n = len(buf)
    while i < n:
        if buf[i] in _SPACE:
            i += 1
        elif buf.startswith(b"--", i):
            j = buf.find(b"\n", i)
            i = n if j < 0 else j + 1
        elif buf.startswith(b"/*", i):
            j = buf.find(b"*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            break
    return i


def split_insert(buf):
    """If `buf` (bytes) starts with `INSERT ... FORMAT <name>`, return
    (statement_without_format, format_name, data_offset); else None.
    The data starts after the first newline following the format name, or
    after the blanks following it when there is no newline (ClickHouse's rule).
    INSERT ... VALUES / INSERT ... SELECT return None (run as plain SQL)."""
    n = len(buf)
    i = _skip_space_and_comments(buf, 0)
    if buf[i:i + 6].upper() != b"INSERT" or (i + 6 < n and buf[i + 6] in _WORD):
        return None
    depth = 0
    while i < n:
        c = buf[i]
        if c in _SPACE or buf.startswith(b"--", i) or buf.startswith(b"/*", i):
            i = _skip_space_and_comments(buf, i)
        elif c in (0x27, 0x22, 0x60):  # ' " `
            i = _skip_quoted(buf, i)
        elif c == 0x28:  # (
            depth += 1
            i += 1
        elif c == 0x29:  # )
            depth -= 1
            i += 1
        elif c in _WORD:
            j = i
            while j < n and buf[j] in _WORD:
                j += 1
            word = buf[i:j].upper()
            if depth == 0:
                if word == b"FORMAT":
                    k = _skip_space_and_comments(buf, j)
                    m = k
                    while m < n and buf[m] in _WORD:
                        m += 1
                    if m == k:
                        return None
                    d = m
                    while d < n and buf[d] in b" \t\f":
                        d += 1
                    if d < n and buf[d] == 0x0D:
                        d += 1
                    if d < n and buf[d] == 0x0A:
                        d += 1
                    stmt = bytes(buf[:i]).decode("utf-8", "replace").rstrip()
                    return stmt, bytes(buf[k:m]).decode("ascii", "replace"), d
                if word in (b"VALUES", b"SELECT", b"WITH"):
                    return None
            i = j
        else:
            i += 1
    return None


_SET_STMT = re.compile(r"^\s*SET\s+(.*)$", re.I | re.S)
_SET_NAME = re.compile(r"(?:^|,)\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")


def set_statement_names(sql):
    """Setting names assigned by a plain `SET a = 1, b = 'x'` statement."""
    m = _SET_STMT.match(sql)
    return _SET_NAME.findall(m.group(1)) if m else []


def quote_ident(name):
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_string(value):
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Parameters the HTTP layer consumes itself (never forwarded as settings).
HTTP_ONLY_PARAMS = frozenset({
    "query", "database", "default_format", "user", "password", "quota_key",
    "query_id", "session_id", "session_timeout", "session_check",
    "close_session", "compress", "decompress", "buffer_size",
    "wait_end_of_query", "role", "stacktrace", "client_protocol_version",
    "enable_http_compression", "http_zlib_compression_level",
    "http_native_compression_disable_checksumming_on_decompress",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
    "add_http_cors_header", "http_response_headers",
})
# chdb-only pseudo formats that are not ClickHouse formats.
_PY_ONLY_FORMATS = frozenset({"dataframe", "arrowtable", "datastore", "debug"})


def content_type_for(fmt):
    f = fmt.lower()
    if f.startswith(("tabseparated", "tsv")):
        return "text/tab-separated-values; charset=UTF-8"
    if f.startswith("csv"):
        return "text/csv; charset=UTF-8; header=absent"
    if f.startswith("json"):
        return "application/json; charset=UTF-8"
    if f.startswith(("pretty", "vertical", "markdown")):
        return "text/plain; charset=UTF-8"
    return "application/octet-stream"


def _truthy(v):
    return str(v).strip().lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------
# The engine: one chdb session, one lock
# --------------------------------------------------------------------------
class Engine:
    def __init__(self, path):
        from chdb import session as chdb_session  # heavy import, do it once
        os.makedirs(path, exist_ok=True)
        self.path = os.path.abspath(path)
        self.session = chdb_session.Session(self.path)
        self.lock = threading.Lock()
        row = self.session.query("SELECT version(), timezone()", "TabSeparated").bytes()
        self.version, self.timezone = row.decode().strip().split("\t")

    def close(self):
        acquired = self.lock.acquire(timeout=30)
        try:
            self.session.close()
        finally:
            if acquired:
                self.lock.release()

    def run(self, database, settings, action, resets=()):
        """Run `action(session)` with `database` current and `settings` applied;
        both (and the settings named in `resets`, i.e. those changed by a SET
        statement in the request) are reset afterwards, so that requests do not
        leak state into the shared session, as with ClickHouse's stateless HTTP."""
        with self.lock:
            s = self.session
            try:
                s.query("USE " + quote_ident(database or "default"))
            except Exception as e:
                raise engine_error(e)
            applied = []
            try:
                for name, value in settings:
                    if not _SETTING_NAME.match(name):
                        raise ChError.make(UNKNOWN_SETTING, f"Unknown setting '{name}'")
                    try:
                        s.query(f"SET {name} = {quote_string(value)}")
                    except Exception as e:
                        raise engine_error(e)
                    applied.append(name)
                return action(s)
            finally:
                for name in list(applied) + [r for r in resets if r not in applied]:
                    try:
                        s.query(f"SET {name} = DEFAULT")
                    except Exception:
                        pass
                try:
                    s.query("USE default")
                except Exception:
                    pass


def do_query(sql, fmt, params):
    def action(s):
        try:
            res = s.query(sql, fmt, params=params)
        except Exception as e:
            raise engine_error(e)
        summary = {
            "read_rows": res.rows_read(), "read_bytes": res.bytes_read(),
            "written_rows": 0, "written_bytes": 0,
            "elapsed_ns": int(res.elapsed() * 1e9),
        }
        return res.bytes(), summary
    return action


def do_insert(stmt, fmt, chunks):
    def action(s):
        try:
            ins = s.send_insert(stmt, fmt)
        except Exception as e:
            raise engine_error(e)
        try:
            for chunk in chunks:
                if chunk:
                    ins.append(chunk)
            res = ins.finish()
        except Exception as e:
            try:
                ins.cancel()
            except Exception:
                pass
            raise engine_error(e)
        summary = {
            "read_rows": res.rows_written, "read_bytes": res.bytes_written,
            "written_rows": res.rows_written, "written_bytes": res.bytes_written,
            "elapsed_ns": int(res.elapsed * 1e9),
        }
        return b"", summary
    return action


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------
def parse_multipart(body, content_type):
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise ChError.make(BAD_ARGUMENTS, "multipart/form-data without boundary")
    delim = b"--" + m.group(1).encode()
    fields = []
    for part in body.split(delim)[1:]:
        if part.startswith(b"--"):
            break
        if part.startswith(b"\r\n"):
            part = part[2:]
        head, _, value = part.partition(b"\r\n\r\n")
        if value.endswith(b"\r\n"):
            value = value[:-2]
        disp = ""
        for line in head.decode("utf-8", "replace").split("\r\n"):
            if line.lower().startswith("content-disposition:"):
                disp = line
        nm = re.search(r'\bname="([^"]*)"', disp)
        fn = re.search(r'\bfilename="([^"]*)"', disp)
        if nm:
            fields.append((nm.group(1), value, fn.group(1) if fn else None))
    return fields


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "chfront"
    sys_version = ""
    disable_nagle_algorithm = True
    rbufsize = 1 << 16

    # ---- logging -----------------------------------------------------------
    def log_message(self, fmt, *args):
        if self.server.verbose:
            line = re.sub(r"(password=)[^&\s]*", r"\1***", fmt % args)
            sys.stderr.write("%s [%s] %s\n" % (self.address_string(),
                                                self.log_date_time_string(), line))

    def log_error(self, fmt, *args):
        sys.stderr.write("chfront: " + (fmt % args) + "\n")

    # ---- body ----------------------------------------------------------------
    def _body_chunks(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    raise ChError.make(ATTEMPT_TO_READ_AFTER_EOF, "Unexpected end of chunked body")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ChError.make(CANNOT_PARSE_TEXT, "Bad chunk size in chunked body")
                if size == 0:
                    while True:  # trailers
                        t = self.rfile.readline(65537)
                        if t in (b"\r\n", b"\n", b""):
                            return
                while size:
                    data = self.rfile.read(min(size, 1 << 20))
                    if not data:
                        raise ChError.make(ATTEMPT_TO_READ_AFTER_EOF, "Unexpected end of chunked body")
                    size -= len(data)
                    yield data
                self.rfile.readline(3)  # CRLF after the chunk
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left > 0:
                data = self.rfile.read(min(left, 1 << 20))
                if not data:
                    raise ChError.make(ATTEMPT_TO_READ_AFTER_EOF, "Unexpected end of body")
                left -= len(data)
                yield data

    def _drain(self):
        gen = self._body
        self._body = iter(())
        try:
            for _ in gen:
                pass
        except Exception:
            self.close_connection = True

    # ---- responses ---------------------------------------------------------
    def _send(self, status, body, headers):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _send_error(self, err, query_id):
        text = err.text
        if not re.search(r"\(version [^)]*\)?\)\s*$", text):
            text += f" (version {self.server.engine.version} (official build))"
        self.log_error("%s", text.splitlines()[0][:300])
        self._send(http_status_for(err.code), (text + "\n").encode("utf-8", "replace"), [
            ("Content-Type", "text/plain; charset=UTF-8"),
            ("X-ClickHouse-Exception-Code", str(err.code)),
            ("X-ClickHouse-Query-Id", query_id),
            ("X-ClickHouse-Server-Display-Name", "chfront"),
        ])

    def do_GET(self):
        self._handle()

    def do_POST(self):
        self._handle()

    def do_HEAD(self):
        self._handle()

    # ---- main ----------------------------------------------------------------
    def _handle(self):
        url = urlsplit(self.path)
        self._body = self._body_chunks()
        params = parse_qsl(url.query, keep_blank_values=True)
        query_id = dict(params).get("query_id") or str(uuid.uuid4())
        try:
            if url.path in ("/ping", "/replicas_status") or (url.path == "/" and not params and self.command in ("GET", "HEAD")):
                self._drain()
                self._send(200, b"Ok.\n", [("Content-Type", "text/html; charset=UTF-8")])
                return
            if url.path not in ("/", ""):
                self._drain()
                self._send(404, f"There is no handle {url.path}\n\nUse / or /ping for health checks.\n".encode(),
                           [("Content-Type", "text/plain; charset=UTF-8")])
                return
            self._handle_query(params, query_id)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # ChError, or unexpected: answer in ClickHouse's shape
            if not isinstance(e, ChError):
                e = ChError.make(STD_EXCEPTION, f"{type(e).__name__}: {e}")
            try:
                self._drain()
                self._send_error(e, query_id)
            except OSError:
                self.close_connection = True

    def _handle_query(self, params, query_id):
        hdr = self.headers
        body_is_form = hdr.get("Content-Type", "").lower().startswith("multipart/form-data")
        if body_is_form:
            raw = b"".join(self._body)
            for name, value, filename in parse_multipart(raw, hdr["Content-Type"]):
                if filename is not None:
                    raise ChError.make(NOT_IMPLEMENTED, "external data (file parts) is not supported by this test front")
                params.append((name, value.decode("utf-8", "replace")))

        # later occurrences win, like ClickHouse's settings
        p = {}
        for k, v in params:
            p[k] = v
        query_id = p.get("query_id") or query_id

        # ---- authentication ------------------------------------------------
        user = hdr.get("X-ClickHouse-User") or p.get("user")
        password = hdr.get("X-ClickHouse-Key") or p.get("password")
        auth = hdr.get("Authorization", "")
        if auth.lower().startswith("basic ") and user is None:
            try:
                u, _, pw = base64.b64decode(auth[6:].strip()).decode("utf-8").partition(":")
                user, password = u, pw
            except Exception:
                raise ChError.make(AUTHENTICATION_FAILED, "Malformed Basic authorization header")
        user = user or "default"
        password = password or ""
        srv = self.server
        if srv.auth_user is not None and (user != srv.auth_user or password != (srv.auth_password or "")):
            raise ChError.make(AUTHENTICATION_FAILED,
                               f"{user}: Authentication failed: password is incorrect, "
                               "or there is no user with such name")

        database = hdr.get("X-ClickHouse-Database") or p.get("database") or "default"
        fmt = hdr.get("X-ClickHouse-Format") or p.get("default_format") or "TabSeparated"
        if fmt.lower() in _PY_ONLY_FORMATS:
            raise ChError.make(UNKNOWN_FORMAT, f"Unknown output format {fmt}")
        qparams = {k[6:]: v for k, v in p.items() if k.startswith("param_")}
        settings = [(k, v) for k, v in p.items()
                    if k not in HTTP_ONLY_PARAMS and not k.startswith("param_")]
        verify = not _truthy(p.get("http_native_compression_disable_checksumming_on_decompress", "0"))

        # ---- body: content-encoding, decompress=1 ----------------------
        chunks = []
        if not body_is_form:
            enc = hdr.get("Content-Encoding", "").strip().lower()
            source = self._body
            if enc and enc != "identity":
                source = [self._decode_content(enc, b"".join(self._body))]
            if _truthy(p.get("decompress", "0")):
                dec = BlockDecoder(verify=verify)
                for raw in source:
                    chunks.extend(dec.feed(raw))
                dec.finish()
            else:
                chunks = list(source)

        # ---- what to run -------------------------------------------------------
        sql = None
        q = p.get("query")
        if q is not None:
            # ClickHouse runs `query` + "\n" + body; the statement must be in `query`.
            head = q.encode("utf-8") + (b"\n" if chunks else b"")
            found = split_insert(head)
            if found is not None:
                stmt, ifmt, off = found
                action = do_insert(stmt, ifmt, [head[off:]] + chunks)
            else:
                sql = q + ("\n" + b"".join(chunks).decode("utf-8", "replace") if chunks else "")
                action = do_query(sql, fmt, qparams)
        else:
            body = b"".join(chunks)
            found = split_insert(body)
            if found is not None:
                stmt, ifmt, off = found
                action = do_insert(stmt, ifmt, [body[off:]])
            else:
                sql = body.decode("utf-8", "replace")
                if not sql.strip():
                    raise ChError.make(BAD_ARGUMENTS, "Empty query")
                action = do_query(sql, fmt, qparams)

        resets = set_statement_names(sql) if sql is not None else []
        t0 = time.perf_counter()
        result, summary = srv.engine.run(database, settings, action, resets)
        summary["result_rows"] = summary.get("written_rows", 0)
        summary["result_bytes"] = len(result)
        summary.setdefault("elapsed_ns", int((time.perf_counter() - t0) * 1e9))

        # ---- encode the reply ----------------------------------------------
        headers = [
            ("Content-Type", content_type_for(fmt) if result else "text/plain; charset=UTF-8"),
            ("X-ClickHouse-Query-Id", query_id),
            ("X-ClickHouse-Format", fmt),
            ("X-ClickHouse-Timezone", srv.engine.timezone),
            ("X-ClickHouse-Server-Display-Name", "chfront"),
            ("X-ClickHouse-Summary", json.dumps({k: str(v) for k, v in summary.items()},
                                                separators=(",", ":"))),
        ]
        if _truthy(p.get("compress", "0")):
            result = compress_blocks(result)
        elif _truthy(p.get("enable_http_compression", "0")):
            result, enc = self._encode_content(result)
            if enc:
                headers.append(("Content-Encoding", enc))
        self._send(200, result, headers)

    def _decode_content(self, enc, data):
        try:
            if enc in ("gzip", "x-gzip"):
                return gzip.decompress(data)
            if enc == "deflate":
                return zlib.decompress(data)
            if enc == "lz4" and lz4_frame is not None:
                return lz4_frame.decompress(data)
            if enc == "zstd" and zstandard is not None:
                return zstandard.ZstdDecompressor().decompressobj().decompress(data)
        except Exception as e:
            raise ChError.make(CANNOT_DECOMPRESS, f"Cannot decode {enc} request body: {e}")
        raise ChError.make(UNKNOWN_COMPRESSION_METHOD, f"Unknown HTTP compression method {enc}")

    def _encode_content(self, data):
        accepted = [a.split(";")[0].strip().lower()
                    for a in self.headers.get("Accept-Encoding", "").split(",")]
        for enc in accepted:
            if enc == "lz4" and lz4_frame is not None:
                return lz4_frame.compress(data), "lz4"
            if enc == "gzip":
                return gzip.compress(data, compresslevel=3), "gzip"
            if enc == "deflate":
                return zlib.compress(data, 3), "deflate"
            if enc == "zstd" and zstandard is not None:
                return zstandard.ZstdCompressor(level=3).compress(data), "zstd"
        return data, None


class FrontServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


# --------------------------------------------------------------------------
# Command line: serve / start / stop
# --------------------------------------------------------------------------
def cmd_serve(args):
    engine = Engine(args.path)
    server = FrontServer((args.host, args.port), Handler)
    scheme = "http"
    if args.tls_cert:
        # https: the handshake happens on the handler thread's first read.
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        scheme = "https"
    server.engine = engine
    server.verbose = args.verbose
    server.auth_user = args.user
    server.auth_password = args.password
    port = server.server_address[1]
    info = {"port": port, "pid": os.getpid(), "url": f"{scheme}://{args.host}:{port}",
            "path": engine.path, "engine_version": engine.version}
    line = json.dumps(info)
    print(line, flush=True)
    if args.ready_fd is not None:
        os.write(args.ready_fd, (line + "\n").encode())
        os.close(args.ready_fd)

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.watch_pid:
        def watch():
            while True:
                time.sleep(1.0)
                try:
                    os.kill(args.watch_pid, 0)
                except ProcessLookupError:
                    stop()
                    return
                except PermissionError:
                    pass
        threading.Thread(target=watch, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        engine.close()
    return 0


def cmd_start(args):
    os.makedirs(args.path, exist_ok=True)
    log = args.log or os.path.join(os.path.abspath(args.path), "chfront.log")
    rfd, wfd = os.pipe()
    cmd = [sys.executable, os.path.abspath(__file__), "serve", "--path", args.path,
           "--port", str(args.port), "--host", args.host, "--ready-fd", str(wfd)]
    if args.user is not None:
        cmd += ["--user", args.user]
    if args.password is not None:
        cmd += ["--password", args.password]
    if args.watch_pid:
        cmd += ["--watch-pid", str(args.watch_pid)]
    if args.verbose:
        cmd.append("--verbose")
    if args.tls_cert:
        cmd += ["--tls-cert", args.tls_cert, "--tls-key", args.tls_key]
    with open(log, "ab") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                pass_fds=(wfd,), start_new_session=True, close_fds=True)
    os.close(wfd)
    deadline = time.monotonic() + args.timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            sys.stderr.write(f"chfront: server did not become ready in {args.timeout}s (log: {log})\n")
            return 1
        ready, _, _ = select.select([rfd], [], [], left)
        if ready:
            data = os.read(rfd, 4096)
            if not data:
                break
            buf += data
    os.close(rfd)
    if b"\n" not in buf:
        code = proc.wait(timeout=5) if proc.poll() is None else proc.returncode
        sys.stderr.write(f"chfront: server exited early (status {code}); see {log}\n")
        return 1
    info = json.loads(buf.split(b"\n", 1)[0])
    info["log"] = log
    print(json.dumps(info), flush=True)
    return 0


def _is_front(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"clickhouse_front" in f.read()
    except OSError:
        return None  # unknown (no /proc): do not refuse


def cmd_stop(args):
    pid = args.pid
    if _is_front(pid) is False:
        sys.stderr.write(f"chfront: pid {pid} is not a clickhouse_front process; not signalling it\n")
        print(json.dumps({"pid": pid, "stopped": False}))
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(json.dumps({"pid": pid, "stopped": True, "signal": None}))
        return 0
    deadline = time.monotonic() + args.timeout
    sig = "SIGTERM"
    while True:
        try:
            os.kill(pid, 0)
            if _is_front(pid) is False:  # zombie reaped and pid reused, or gone
                break
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
                sig = "SIGKILL"
            except ProcessLookupError:
                pass
            break
        try:  # reap it if it is our own child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    print(json.dumps({"pid": pid, "stopped": True, "signal": sig}))
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "start", "stop", "-h", "--help"):
        argv.insert(0, "serve")
    ap = argparse.ArgumentParser(description="TEST HARNESS: ClickHouse HTTP front over chdb")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "start"):
        sp = sub.add_parser(name)
        sp.add_argument("--path", required=True, help="chdb data directory (one per process)")
        sp.add_argument("--port", type=int, default=0, help="0 = pick a free port")
        sp.add_argument("--host", default="127.0.0.1")
        sp.add_argument("--user", default=None)
        sp.add_argument("--password", default=None)
        sp.add_argument("--watch-pid", type=int, default=None,
                        help="exit when this process is gone")
        sp.add_argument("--verbose", action="store_true")
        sp.add_argument("--tls-cert", default=None, help="serve https with this PEM certificate")
        sp.add_argument("--tls-key", default=None, help="the certificate's PEM key")
        if name == "serve":
            sp.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
        else:
            sp.add_argument("--log", default=None)
            sp.add_argument("--timeout", type=float, default=60.0)
    sp = sub.add_parser("stop")
    sp.add_argument("--pid", type=int, required=True)
    sp.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args(argv)
    return {"serve": cmd_serve, "start": cmd_start, "stop": cmd_stop}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
