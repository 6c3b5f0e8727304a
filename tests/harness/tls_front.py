#!/usr/bin/env python3
"""Test harness: a TLS front for a plain-TCP server (the Iceberg REST
catalog fixture, SeaweedFS's S3 and REST catalog), so that the TLS tests
reach real servers over https with a certificate of the harness's own CA
(tests/harness/certs.py).

    tls_front.py --cert PEM --key PEM --to HOST:PORT

Listens on 127.0.0.1 on a port the system picks, prints
`listening on 127.0.0.1:PORT` once it accepts, and serves until killed:
each connection's TLS is ended here and its bytes are relayed to
HOST:PORT as they are (a handshake the client refuses closes only that
connection).
"""
import argparse
import socket
import ssl
import sys
import threading


def pump(src, dst):
    """Copies src to dst until src ends, then ends dst's writing side."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(conn, context, target):
    try:
        tls = context.wrap_socket(conn, server_side=True)
    except (ssl.SSLError, OSError):
        conn.close()
        return
    try:
        upstream = socket.create_connection(target)
    except OSError:
        tls.close()
        return
    back = threading.Thread(target=pump, args=(upstream, tls), daemon=True)
    back.start()
    pump(tls, upstream)
    back.join()
    tls.close()
    upstream.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--to", required=True, help="HOST:PORT of the plain server")
    args = p.parse_args()
    host, port = args.to.rsplit(":", 1)
    target = (host, int(port))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    print(f"listening on 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, context, target), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
