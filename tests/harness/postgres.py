#!/usr/bin/env python3
"""Test harness: a throw-away PostgreSQL server (Debian's postgresql package)
for the tests: its own data directory, bound to 127.0.0.1 on a free port,
configured for logical replication.

    postgres.py start --dir D      -> prints one JSON line: port, pid, dir, uri
    postgres.py stop --dir D       -> stops it (pg_ctl stop -m fast; --mode, --timeout)

initdb refuses to run as root: as root, the server runs as the `postgres`
user, which owns the data directory.
"""
import argparse
import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys


def bindir():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise SystemExit("postgres harness: no PostgreSQL server (apt-get install postgresql)")
    return os.path.dirname(found[-1])


def as_owner(cmd):
    """Runs cmd as the postgres user when we are root."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--"] + cmd
    return cmd


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args):
    data = os.path.abspath(os.path.join(args.dir, "data"))
    os.makedirs(args.dir, exist_ok=True)
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(args.dir, pw.pw_uid, pw.pw_gid)
        # The parents must be traversable for the postgres user.
        d = os.path.abspath(args.dir)
        while d not in ("/", ""):
            mode = os.stat(d).st_mode
            os.chmod(d, mode | 0o011)
            d = os.path.dirname(d)
    b = bindir()
    if not os.path.exists(os.path.join(data, "PG_VERSION")):
        subprocess.run(
            as_owner([os.path.join(b, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    port = args.port or free_port()
    with open(os.path.join(data, "postgresql.auto.conf"), "a") as f:
        f.write(
            f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{os.path.abspath(args.dir)}'\n"
            "wal_level = logical\nmax_replication_slots = 16\nmax_wal_senders = 16\nfsync = off\n"
            "synchronous_commit = off\nfull_page_writes = off\n"
        )
    with open(os.path.join(data, "pg_hba.conf"), "a") as f:
        f.write("host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n")
    log = os.path.join(os.path.abspath(args.dir), "postgres.log")
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        for p in (os.path.join(data, "postgresql.auto.conf"), os.path.join(data, "pg_hba.conf")):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    subprocess.run(
        as_owner([os.path.join(b, "pg_ctl"), "-D", data, "-l", log, "-w", "-t", "60", "start"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with open(os.path.join(data, "postmaster.pid")) as f:
        pid = int(f.readline())
    print(json.dumps({
        "port": port,
        "pid": pid,
        "dir": os.path.abspath(args.dir),
        "uri": f"postgres://postgres@127.0.0.1:{port}/postgres",
        "log": log,
    }))


def stop(args):
    """pg_ctl stop -m MODE, waiting at most --timeout seconds; exits 1 with
    pg_ctl's message when the server did not stop in time."""
    data = os.path.join(os.path.abspath(args.dir), "data")
    failed = None
    if os.path.exists(os.path.join(data, "postmaster.pid")):
        res = subprocess.run(
            as_owner([os.path.join(bindir(), "pg_ctl"), "-D", data, "-m", args.mode, "-w",
                      "-t", str(args.timeout), "stop"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if res.returncode != 0:
            failed = (res.stdout + res.stderr).decode(errors="replace")
    if args.remove_dir:
        shutil.rmtree(args.dir, ignore_errors=True)
    if failed is not None:
        raise SystemExit(f"postgres harness: pg_ctl stop -m {args.mode} failed: {failed}")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--dir", required=True)
    s.add_argument("--port", type=int)
    t = sub.add_parser("stop")
    t.add_argument("--dir", required=True)
    t.add_argument("--remove-dir", action="store_true")
    t.add_argument("--mode", choices=["smart", "fast", "immediate"], default="fast")
    t.add_argument("--timeout", type=int, default=60, help="seconds pg_ctl waits")
    args = p.parse_args()
    {"start": start, "stop": stop}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
