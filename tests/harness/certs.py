#!/usr/bin/env python3
"""Test harness: a throw-away certificate authority for the TLS tests, made
with the openssl command line at set-up (nothing here is a real CA).

    certs.py make --dir D   -> prints one JSON line with the files' paths

Makes, in D (kept when already there):
  ca.crt / ca.key          the test CA (CN "urutau test CA")
  server.crt / server.key  a server certificate the CA signed, for
                           DNS:localhost and IP:127.0.0.1
  client.crt / client.key  a client certificate for the user in CN
                           ("urutau_cert"), for Postgres `cert` auth
  other-ca.crt             a second CA that signed nothing here: a client
                           trusting only it must refuse the server
Keys are P-256 EC, PKCS#8, mode 0600.
"""
import argparse
import json
import os
import subprocess
import sys

CLIENT_USER = "urutau_cert"


def openssl(*args, cwd):
    res = subprocess.run(["openssl", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if res.returncode != 0:
        raise SystemExit(f"certs harness: openssl {' '.join(args)}: {res.stderr.decode(errors='replace')}")


def key(name, cwd):
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name, cwd=cwd)
    os.chmod(os.path.join(cwd, name), 0o600)


def ca(name, subject, cwd):
    key(f"{name}.key", cwd)
    openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt", "-days", "3650",
            "-subj", subject,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=cwd)


def signed(name, subject, extensions, cwd):
    key(f"{name}.key", cwd)
    openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd)
    with open(os.path.join(cwd, f"{name}.ext"), "w") as f:
        f.write(extensions)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "3650", "-extfile", f"{name}.ext", cwd=cwd)


def make(args):
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    files = {n: os.path.join(d, n) for n in
             ("ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key", "other-ca.crt")}
    if not all(os.path.exists(p) for p in files.values()):
        ca("ca", "/CN=urutau test CA", d)
        signed("server", "/CN=localhost",
               "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
               "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n", d)
        signed("client", f"/CN={CLIENT_USER}",
               "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n", d)
        ca("other-ca", "/CN=urutau other test CA", d)
    print(json.dumps({
        "dir": d,
        "ca": files["ca.crt"],
        "server_cert": files["server.crt"],
        "server_key": files["server.key"],
        "client_cert": files["client.crt"],
        "client_key": files["client.key"],
        "client_user": CLIENT_USER,
        "other_ca": files["other-ca.crt"],
    }))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--dir", required=True)
    args = p.parse_args()
    {"make": make}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
