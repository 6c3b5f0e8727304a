#!/usr/bin/env python3
"""Test harness: a throw-away PostgreSQL server (Debian's postgresql package)
for the tests: its own data directory, bound to 127.0.0.1 on a free port,
configured for logical replication.

    postgres.py start --dir D      -> prints one JSON line: port, pid, dir, uri
    postgres.py start --dir D --tls CERTS
                                   -> the same server accepting only TLS over TCP
                                      (see start_tls)
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
    if args.tls:
        tls_files(args.tls, data)
    else:
        with open(os.path.join(data, "pg_hba.conf"), "a") as f:
            f.write("host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n")
    log = os.path.join(os.path.abspath(args.dir), "postgres.log")
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        for p in os.listdir(data):
            if p.endswith(".conf") or p.startswith("tls-"):
                os.chown(os.path.join(data, p), pw.pw_uid, pw.pw_gid)
    subprocess.run(
        as_owner([os.path.join(b, "pg_ctl"), "-D", data, "-l", log, "-w", "-t", "60", "start"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with open(os.path.join(data, "postmaster.pid")) as f:
        pid = int(f.readline())
    info = {
        "port": port,
        "pid": pid,
        "dir": os.path.abspath(args.dir),
        "uri": f"postgres://postgres@127.0.0.1:{port}/postgres",
        "log": log,
    }
    if args.tls:
        info.update(tls_roles(b, os.path.abspath(args.dir), port))
    print(json.dumps(info))


# The TLS server's roles: `postgres` and `urutau_md5` log in with a password
# (SCRAM-SHA-256 and md5), `urutau_cert` with its client certificate.
TLS_PASSWORD = "tls-secret-pw"


def tls_files(certs, data):
    """Copies the harness CA's server certificate into the data directory,
    turns ssl on and writes a pg_hba.conf that accepts TCP connections over
    TLS only (hostssl; plain TCP finds no line and is refused); the Unix
    socket stays trusted for the harness itself."""
    import shutil as sh
    for src, dst in (("server.crt", "tls-server.crt"), ("server.key", "tls-server.key"), ("ca.crt", "tls-ca.crt")):
        sh.copyfile(os.path.join(certs, src), os.path.join(data, dst))
    os.chmod(os.path.join(data, "tls-server.key"), 0o600)
    with open(os.path.join(data, "postgresql.auto.conf"), "a") as f:
        f.write("ssl = on\nssl_cert_file = 'tls-server.crt'\nssl_key_file = 'tls-server.key'\n"
                "ssl_ca_file = 'tls-ca.crt'\npassword_encryption = 'scram-sha-256'\n")
    with open(os.path.join(data, "pg_hba.conf"), "w") as f:
        f.write("local all all trust\n"
                "hostssl all urutau_cert 127.0.0.1/32 cert\n"
                "hostssl replication urutau_cert 127.0.0.1/32 cert\n"
                "hostssl all urutau_md5 127.0.0.1/32 md5\n"
                "hostssl replication urutau_md5 127.0.0.1/32 md5\n"
                "hostssl all all 127.0.0.1/32 scram-sha-256\n"
                "hostssl replication all 127.0.0.1/32 scram-sha-256\n")


def tls_roles(b, socket_dir, port):
    """Sets the passwords and makes the certificate and md5 roles (over the
    Unix socket); returns what a test needs to connect."""
    sql = (f"ALTER ROLE postgres PASSWORD '{TLS_PASSWORD}';"
           "CREATE ROLE urutau_cert LOGIN SUPERUSER REPLICATION;"
           "SET password_encryption = 'md5';"
           f"CREATE ROLE urutau_md5 LOGIN SUPERUSER REPLICATION PASSWORD '{TLS_PASSWORD}';")
    subprocess.run(
        as_owner([os.path.join(b, "psql"), "-h", socket_dir, "-p", str(port), "-U", "postgres",
                  "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return {
        "uri": f"postgres://postgres:{TLS_PASSWORD}@127.0.0.1:{port}/postgres?sslmode=require",
        "password": TLS_PASSWORD,
    }


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
    s.add_argument("--tls", help="a directory of certs.py: accept only TLS over TCP")
    t = sub.add_parser("stop")
    t.add_argument("--dir", required=True)
    t.add_argument("--remove-dir", action="store_true")
    t.add_argument("--mode", choices=["smart", "fast", "immediate"], default="fast")
    t.add_argument("--timeout", type=int, default=60, help="seconds pg_ctl waits")
    args = p.parse_args()
    {"start": start, "stop": stop}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
