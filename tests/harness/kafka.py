#!/usr/bin/env python3
"""Test harness for the Kafka source: a real Apache Kafka broker (single KRaft
node) and a real Debezium (Kafka Connect standalone + the Debezium PostgreSQL
connector), both fetched from Maven by ./kafka-fetch; confluent-kafka (PyPI)
as the independent client. Every command prints JSON on stdout (consume: one
JSON line per message), diagnostics on stderr, and exits nonzero with a
message on failure.

  kafka.py start --dir D [--home H] [--timeout S] [--secure]
      -> a KRaft broker+controller on free 127.0.0.1 ports, detached (own
         process group), data and kafka.log in D; waits for a metadata round
         trip; prints {"brokers": "127.0.0.1:P", "pid", "dir", "log"}.
         A D that already holds a formatted broker is restarted with its data
         and its ports (and its listeners: --secure is remembered).
         --secure adds, beside the PLAINTEXT listener the harness's own
         commands use, two TLS listeners whose certificate the harness's
         test CA signed (certs.py, made in D/certs): SASL_SSL (SCRAM-SHA-256,
         SCRAM-SHA-512 and PLAIN users with random passwords) and SSL that
         requires a client certificate of that CA (mutual TLS); it prints
         "secure": {"sasl_ssl": "127.0.0.1:P", "ssl": "127.0.0.1:P",
         "scram_user", "scram_password", "plain_user", "plain_password",
         "ca", "client_cert", "client_key", "other_ca"}.
  kafka.py stop --dir D [--graceful]         -> SIGKILLs the group (--graceful:
                                                SIGTERM first); idempotent
  kafka.py create-topic --brokers B --topic T [--partitions N] [--config k=v]...
  kafka.py add-partitions --brokers B --topic T --total N
  kafka.py produce --brokers B --topic T [--no-offsets] < JSON lines
      {"value": str|null, "key": str|null, "partition": int, "headers":
      {name: str|null}, "timestamp_ms": int} (all but value optional; null
      value = tombstone) -> {"count": n, "offsets": [[partition, offset], ...]}
      (input order). Keys are partitioned with murmur2 like the Java client.
  kafka.py produce-avro --brokers B --topic T --registry URL --schema-file F
      [--key-schema-file K] [--subject S] [--key-subject S] [--no-offsets] < JSON lines
      {"value": object|null, "key": ..., "partition": int, "headers": {name: str|null},
      "timestamp_ms": int} (all but value optional) -> registers F (and K) with
      the registry (POST /subjects/<S>/versions; subjects default to T-value /
      T-key), then produces Confluent wire-format messages: 0x00, the schema id
      (4 bytes big-endian), the Avro binary body (fastavro schemaless_writer);
      null value = tombstone (no bytes at all). Key: with K, encoded and framed
      like the value; without K, a string sent as raw UTF-8 (null/absent: no
      key); murmur2-partitioned on the bytes sent. Every line is converted and
      encoded before anything is registered or sent. Prints {"count": n,
      "schema_id": id, "key_schema_id": id (with K only), "offsets":
      [[partition, offset], ...]} (input order). JSON -> Avro, per schema type:
        null: null. boolean: true/false. int, long: JSON integers only (range-
          checked); so date (days), time-millis (int ms), time-micros,
          timestamp-millis/-micros/-nanos and local-timestamp-* (epoch units)
          take the integer AS IS, no strings.
        float, double: any JSON number, or "NaN", "Infinity", "-Infinity".
        string: a string; logicalType uuid: a string that parses as a UUID, sent
          as given.
        bytes, fixed: a string (its UTF-8 bytes), {"base64": "..."} or
          {"hex": "..."}; fixed: exactly size bytes.
        decimal (bytes or fixed): a string such as "10.50" or "-3" or a JSON
          number (read exactly, never through a float), scaled to the schema's
          scale (fewer fractional digits are padded, more are an error, never
          rounded), at most precision digits; written as the minimal big-endian
          two's complement of the unscaled value, as Java's
          BigInteger.toByteArray (Kafka Connect, Debezium) writes it, or sign-
          extended to a fixed's size. {"base64"/"hex": ...} sends raw bytes.
        enum: a symbol. array: a list. map: an object. record: an object; a
          missing field takes its schema default (Avro JSON form: bytes defaults
          one code point per byte, a union default of the first branch), with no
          default it is an error, and so is an unknown member.
        union: {"<branch>": value} picks that branch explicitly when the object
          has exactly one member and its name is a branch's (a named type's full
          or short name, or "null", "long", "string", "array", "map", ...: the
          type name, whatever the logicalType: {"long": 5}); any other value
          goes to the FIRST branch that takes it, in schema order (null -> "null";
          so ["string", decimal] takes "1.5" as the string). The explicit form
          wins: a map value that looks like one must be wrapped ({"map": {...}}).
          The chosen branch is passed to fastavro in its tuple notation.
  kafka.py delete-records --brokers B --topic T --partition P --before OFFSET
      -> {"topic", "partition", "low_watermark"}
  kafka.py watermarks --brokers B --topic T -> {"partitions": {"0": [low, high]}}
  kafka.py consume --brokers B --topic T [--values-only] [--wait-count N]
      -> every message from the low to the high watermarks (taken at start,
         after --wait-count messages are there), partition by partition:
         {"partition", "offset", "key", "value", "headers", "timestamp_ms"}
         per line, or the raw value per line (tombstones skipped).
  kafka.py connect-start --dir D [--home H] --brokers B --pg-host H --pg-port P
      --pg-user U [--pg-password X] --pg-db DB --slot S --publication PUB
      --tables public.a,public.b --topic-prefix dbz [--schemas-enable true|false]
      [--name N] [--extra k=v]... [--timeout S]
      -> creates PUB FOR TABLE the tables (psql) unless it exists, starts
         Connect standalone with Debezium (pgoutput) detached, offsets in D;
         waits until connector and task are RUNNING, Debezium has logged
         "Processing messages" (snapshot done, replication stream open) and
         each snapshotted table's topic holds the snapshot's records; prints
         {"pid", "rest", "dir", "name", "log"}. Topics are created by Connect
         (1 partition): the broker does not auto-create them.
  kafka.py connect-stop --dir D              -> SIGTERM (offsets flush), then
                                                SIGKILL after 15 s; idempotent

Dependencies: Python 3 stdlib, confluent-kafka, fastavro for produce-avro
(tests/harness/requirements.txt),
Java 17+ for the servers, psql for connect-start.
"""
import argparse
import base64
import decimal
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
# This file is named like the `kafka` package (kafka-python): keep its
# directory off the import path so no import can pick this script up.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
             "-XX:+ExitOnOutOfMemoryError"]
BROKER_HEAP = ["-Xms64m", "-Xmx512m", "-XX:MaxMetaspaceSize=192m"]
CONNECT_HEAP = ["-Xms64m", "-Xmx512m", "-XX:MaxMetaspaceSize=256m"]
LONG_MAX = 9223372036854775807
# Debezium 3.6.1 logs this (PostgresStreamingChangeEventSource) once the
# snapshot is done (or skipped) and the replication stream from the slot is open.
STREAMING_RE = re.compile(r"INFO Processing messages \(io\.debezium\.connector\.postgresql\.")
# ... and this (RelationalSnapshotChangeEventSource) per table it snapshotted.
EXPORTED_RE = re.compile(r"Finished exporting (\d+) records for table '([^']+)'")


def log(msg):
    print(f"kafka harness: {msg}", file=sys.stderr, flush=True)


def fail(msg):
    print(f"kafka harness: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def emit(obj):
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def tail(path, n=40):
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


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def find_java():
    jh = os.environ.get("JAVA_HOME")
    if jh and os.access(os.path.join(jh, "bin", "java"), os.X_OK):
        return os.path.join(jh, "bin", "java")
    j = shutil.which("java")
    if not j:
        fail("'java' not found: install Java 17+ (Debian: apt-get install openjdk-17-jre-headless)")
    return j


def find_home(explicit):
    home = explicit or os.environ.get("URUTAU_TEST_KAFKA_HOME")
    if not home:
        try:
            res = subprocess.run([os.path.join(HERE, "kafka-fetch")], stdout=subprocess.PIPE, check=True)
        except subprocess.CalledProcessError as e:
            fail(f"kafka-fetch failed (exit {e.returncode}); see its messages above")
        home = res.stdout.decode().strip().splitlines()[-1]
    home = os.path.abspath(home)
    for sub in ("broker/lib", "connect/lib", "connect/plugins/debezium-postgres"):
        if not os.path.isdir(os.path.join(home, sub)):
            fail(f"{home} has no {sub}: run tests/harness/kafka-fetch (or pass --home)")
    return home


def prop_escape(v):
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def write_props(path, props):
    with open(path + ".tmp", "w") as f:
        for k, v in props.items():
            f.write(f"{k}={prop_escape(v)}\n")
    os.replace(path + ".tmp", path)


def read_props(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                out[k] = v
    return out


def kv_list(items, what):
    out = {}
    for item in items or []:
        if "=" not in item:
            fail(f"{what} {item!r} is not key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out


def read_pid(d, name="pid"):
    try:
        return int(open(os.path.join(d, name)).read().strip())
    except (OSError, ValueError):
        return None


def write_pid(d, pid, name="pid"):
    p = os.path.join(d, name)
    with open(p + ".tmp", "w") as f:
        f.write(f"{pid}\n")
    os.replace(p + ".tmp", p)


def is_java_main(pid, main_class):
    cmd = read_cmdline(pid)
    return bool(cmd) and main_class.encode() in cmd


def kill_group(pid, main_class, grace=0.0):
    """Ends the process group led by pid (if pid still runs main_class)."""
    if not (alive(pid) and is_java_main(pid, main_class)):
        return
    if grace > 0:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        fail(f"pid {pid} still alive 10 s after SIGKILL")


def require_client():
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        fail("the confluent-kafka package is missing: pip install -r tests/harness/requirements.txt "
             "(confluent-kafka==2.16.1), or run with the venv python from tests/harness/setup")


def quiet_error_cb(err):
    pass


def admin(brokers, quiet=False):
    from confluent_kafka.admin import AdminClient
    conf = {"bootstrap.servers": brokers, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}
    if quiet:
        conf.update({"error_cb": quiet_error_cb, "log_level": 0})
    return AdminClient(conf)


def topic_meta(a, topic, timeout=10):
    md = a.list_topics(topic=topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return None
    return t


def partition_ids(a, topic):
    t = topic_meta(a, topic)
    if t is None:
        fail(f"topic {topic!r} does not exist")
    return sorted(t.partitions)


def wait_partitions(a, topic, n, timeout=30):
    """Until the metadata shows n partitions of topic, each with a leader."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            t = topic_meta(a, topic, timeout=5)
        except Exception:
            t = None
        if t is not None and len(t.partitions) == n and all(
                p.leader >= 0 and p.error is None for p in t.partitions.values()):
            return
        if time.monotonic() > deadline:
            fail(f"topic {topic!r} did not show {n} partitions with leaders within {timeout} s")
        time.sleep(0.05)


def watermarks_of(a, topic, parts=None):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec
    parts = parts if parts is not None else partition_ids(a, topic)
    out = {}
    for spec_name, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):
        futs = a.list_offsets({TopicPartition(topic, p): spec for p in parts}, request_timeout=30)
        for tp, fut in futs.items():
            out.setdefault(tp.partition, {})[spec_name] = fut.result().offset
    return {p: (out[p]["low"], out[p]["high"]) for p in parts}


# --- the broker -------------------------------------------------------------

BROKER_MAIN = "kafka.Kafka"


def broker_props(d, port, cport, secure=None):
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{cport}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": os.path.join(d, "data"),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        # A restart after SIGKILL waits until the old incarnation's session
        # expires (DuplicateBrokerRegistrationException until then): keep it short.
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # Nothing is ever removed by time or size: the tests trim a log with
        # delete-records, so log.retention.check.interval.ms does not matter.
        "log.retention.ms": "-1",
        "log.retention.bytes": "-1",
        # Accept any producer timestamp (4.x rejects those > 1 h ahead).
        "log.message.timestamp.before.max.ms": str(LONG_MAX),
        "log.message.timestamp.after.max.ms": str(LONG_MAX),
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    if secure:
        props["listeners"] += f",SASL_SSL://{secure['sasl_ssl']},SSL://{secure['ssl']}"
        props["advertised.listeners"] += f",SASL_SSL://{secure['sasl_ssl']},SSL://{secure['ssl']}"
        props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL,SSL:SSL"
        props.update(secure_props(secure))
    return props


# --- the TLS listeners (--secure) -------------------------------------------

SCRAM_USER = "urutau_scram"
PLAIN_USER = "urutau_plain"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def make_secure(d, sasl_port, ssl_port):
    """The test CA's files (certs.py), the broker's PEM keystore (its key,
    then its certificate) and random passwords; kept in D/secure.json."""
    res = subprocess.run([sys.executable, os.path.join(HERE, "certs.py"), "make", "--dir",
                          os.path.join(d, "certs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if res.returncode != 0:
        fail(f"certs.py failed (it needs the openssl command): {res.stderr.decode(errors='replace')}")
    certs = json.loads(res.stdout)
    keystore = os.path.join(certs["dir"], "broker-keystore.pem")
    with open(certs["server_key"]) as k, open(certs["server_cert"]) as c:
        pem = k.read() + c.read()
    with open(keystore, "w") as f:
        f.write(pem)
    os.chmod(keystore, 0o600)
    secure = {
        "sasl_ssl": f"127.0.0.1:{sasl_port}",
        "ssl": f"127.0.0.1:{ssl_port}",
        # Letters and digits only: they go into a JAAS line and a
        # kafka-storage argument unquoted.
        "scram_user": SCRAM_USER,
        "scram_password": "scram" + uuid.uuid4().hex,
        "plain_user": PLAIN_USER,
        "plain_password": "plain" + uuid.uuid4().hex,
        "ca": certs["ca"],
        "client_cert": certs["client_cert"],
        "client_key": certs["client_key"],
        "other_ca": certs["other_ca"],
        "keystore": keystore,
    }
    path = os.path.join(d, "secure.json")
    with open(path, "w") as f:
        json.dump(secure, f)
    os.chmod(path, 0o600)
    return secure


def read_secure(d):
    try:
        with open(os.path.join(d, "secure.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def secure_props(secure):
    """SASL_SSL (SCRAM users stored by kafka-storage format, a PLAIN user in
    its JAAS line) and SSL requiring a client certificate, one PEM keystore
    and the test CA as truststore for both."""
    scram_jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    plain_jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                  f'user_{secure["plain_user"]}="{secure["plain_password"]}";')
    props = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": secure["keystore"],
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": secure["ca"],
        "listener.name.ssl.ssl.client.auth": "required",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": ",".join((*SCRAM_MECHANISMS, "PLAIN")),
        "listener.name.sasl_ssl.plain.sasl.jaas.config": plain_jaas,
    }
    for m in SCRAM_MECHANISMS:
        props[f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config"] = scram_jaas
    return props


def scram_args(secure):
    """kafka-storage format's --add-scram arguments for the SCRAM user."""
    out = []
    for m in SCRAM_MECHANISMS:
        out += ["--add-scram", f'{m}=[name={secure["scram_user"]},password={secure["scram_password"]}]']
    return out


def random_cluster_id():
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def cmd_start(args):
    require_client()
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    old = read_pid(d)
    if old and alive(old) and is_java_main(old, BROKER_MAIN):
        fail(f"a broker is already running from {d} (pid {old}); run `stop --dir {d}` first")
    home = find_home(args.home)
    java = find_java()
    lib = os.path.join(home, "broker", "lib", "*")
    log4j = os.path.join(home, "broker", "log4j2.properties")
    conf = os.path.join(d, "server.properties")
    logfile = os.path.join(d, "kafka.log")
    restart = os.path.exists(conf) and os.path.exists(os.path.join(d, "data", "meta.properties"))
    t0 = time.monotonic()
    secure = None
    for attempt in range(3):
        if restart:
            # Same data, same ports, same listeners; the rest as this script
            # says now.
            old_props = read_props(conf)
            port = int(old_props["advertised.listeners"].split(",")[0].rsplit(":", 1)[1])
            cport = int(old_props["controller.quorum.voters"].rsplit(":", 1)[1])
            secure = read_secure(d)
            write_props(conf, broker_props(d, port, cport, secure))
        else:
            shutil.rmtree(os.path.join(d, "data"), ignore_errors=True)
            port, cport, sasl_port, ssl_port = free_ports(4)
            secure = make_secure(d, sasl_port, ssl_port) if args.secure else None
            props = broker_props(d, port, cport, secure)
            write_props(conf, props)
            fmt = subprocess.run([java, *JVM_FLAGS, "-Xmx256m", f"-Dlog4j2.configurationFile={log4j}",
                                  "-cp", lib, "kafka.tools.StorageTool", "format", "-t", random_cluster_id(),
                                  "-c", conf, *(scram_args(secure) if secure else [])],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
            if fmt.returncode != 0:
                fail(f"kafka-storage format failed (exit {fmt.returncode}):\n{fmt.stdout.decode(errors='replace')}")
        with open(logfile, "ab") as out:
            proc = subprocess.Popen([java, *JVM_FLAGS, *BROKER_HEAP, f"-Dlog4j2.configurationFile={log4j}",
                                     "-cp", lib, BROKER_MAIN, conf], cwd=d, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    close_fds=True)
        write_pid(d, proc.pid)
        brokers = f"127.0.0.1:{port}"
        err = wait_broker(proc, brokers, port, t0 + args.timeout)
        if err is None:
            break
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        os.remove(os.path.join(d, "pid"))
        text = tail(logfile, 60)
        if not restart and "Address already in use" in text and attempt < 2:
            log(f"port clash ({err}); retrying with new ports")
            continue
        fail(f"{err}\n--- tail of {logfile} ---\n{text}")
    log(f"broker pid {proc.pid} ready at {brokers} in {time.monotonic() - t0:.2f} s"
        f"{' (restarted)' if restart else ''}, RSS {rss_mb(proc.pid)} MB")
    info = {"brokers": brokers, "pid": proc.pid, "dir": d, "log": logfile}
    if secure:
        info["secure"] = {k: v for k, v in secure.items() if k != "keystore"}
    emit(info)


def wait_broker(proc, brokers, port, deadline):
    """None once a metadata round trip lists this broker, else why not."""
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            pass
        if proc.poll() is not None:
            return f"the broker exited with status {proc.returncode} before listening on {port}"
        if time.monotonic() > deadline:
            return f"the broker did not listen on {port} in time"
        time.sleep(0.05)
    a = admin(brokers, quiet=True)
    while True:
        try:
            md = a.list_topics(timeout=2)
            if 1 in md.brokers:
                return None
        except Exception:
            pass
        if proc.poll() is not None:
            return f"the broker exited with status {proc.returncode} before answering metadata"
        if time.monotonic() > deadline:
            return f"the broker at {brokers} answered no metadata request in time"
        time.sleep(0.1)


def cmd_stop(args):
    d = os.path.abspath(args.dir)
    pid = read_pid(d)
    if pid is None:
        return
    kill_group(pid, BROKER_MAIN, grace=30.0 if args.graceful else 0.0)
    try:
        os.remove(os.path.join(d, "pid"))
    except FileNotFoundError:
        pass


# --- admin + data -----------------------------------------------------------

def cmd_create_topic(args):
    require_client()
    from confluent_kafka.admin import NewTopic
    a = admin(args.brokers)
    cfg = kv_list(args.config, "--config")
    fut = a.create_topics([NewTopic(args.topic, num_partitions=args.partitions, replication_factor=1,
                                    config=cfg)], request_timeout=30)[args.topic]
    try:
        fut.result()
    except Exception as e:
        fail(f"create topic {args.topic!r}: {e}")
    wait_partitions(a, args.topic, args.partitions)
    emit({"topic": args.topic, "partitions": args.partitions})


def cmd_add_partitions(args):
    require_client()
    from confluent_kafka.admin import NewPartitions
    a = admin(args.brokers)
    fut = a.create_partitions([NewPartitions(args.topic, args.total)], request_timeout=30)[args.topic]
    try:
        fut.result()
    except Exception as e:
        fail(f"add partitions to {args.topic!r} (total {args.total}): {e}")
    wait_partitions(a, args.topic, args.total)
    emit({"topic": args.topic, "partitions": args.total})


def cmd_produce(args):
    require_client()
    from confluent_kafka import KafkaException, Producer
    p = Producer({
        "bootstrap.servers": args.brokers,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "batch.size": 1048576,
        "queue.buffering.max.messages": 1000000,
        "queue.buffering.max.kbytes": 1048576,
        "compression.type": "none",
        "partitioner": "murmur2_random",  # like the Java client's default
        "message.timeout.ms": 120000,
    })
    offsets = []
    errors = []
    count = 0

    def make_cb(i):
        def cb(err, msg):
            if err is not None:
                errors.append((i, err))
            else:
                offsets[i] = [msg.partition(), msg.offset()]
        return cb

    def errors_only(err, msg):
        if err is not None:
            errors.append(("?", err))

    topic = args.topic
    for lineno, line in enumerate(sys.stdin.buffer, 1):
        if not line.strip():
            continue
        try:
            m = json.loads(line)
        except ValueError as e:
            fail(f"stdin line {lineno} is not JSON: {e}")
        if not isinstance(m, dict) or "value" not in m:
            fail(f"stdin line {lineno}: expected an object with a \"value\"")
        kw = {}
        try:
            v = m["value"]
            kw["value"] = None if v is None else v.encode()
            k = m.get("key")
            if k is not None:
                kw["key"] = k.encode()
            if m.get("partition") is not None:
                kw["partition"] = int(m["partition"])
            if m.get("headers"):
                kw["headers"] = [(n, None if hv is None else hv.encode()) for n, hv in m["headers"].items()]
            if m.get("timestamp_ms") is not None:
                kw["timestamp"] = int(m["timestamp_ms"])
        except (AttributeError, TypeError, ValueError) as e:
            fail(f"stdin line {lineno}: value/key/header values must be strings or null, partition and "
                 f"timestamp_ms integers ({e})")
        if args.no_offsets:
            kw["on_delivery"] = errors_only
        else:
            offsets.append(None)
            kw["on_delivery"] = make_cb(count)
        while True:
            try:
                p.produce(topic, **kw)
                break
            except BufferError:
                p.poll(0.05)
            except KafkaException as e:
                fail(f"produce (line {lineno}): {e}")
        count += 1
        if count % 10000 == 0:
            p.poll(0)
            if errors:
                break
    left = p.flush(120)
    if left:
        fail(f"{left} messages still undelivered after 120 s")
    if errors:
        i, err = errors[0]
        fail(f"{len(errors)} messages failed; the first (message #{i}): {err}")
    out = {"count": count}
    if not args.no_offsets:
        out["offsets"] = offsets
    emit(out)


# --- Avro in the Confluent wire format (produce-avro) -----------------------

AVRO_CT = "application/vnd.schemaregistry.v1+json"
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
AVRO_LONG_MIN, AVRO_LONG_MAX = -(1 << 63), (1 << 63) - 1
NAMED_AVRO_TYPES = ("record", "error", "enum", "fixed")


class AvroInputError(Exception):
    pass


def registry_register(url, subject, schema_text):
    """POST {url}/subjects/{subject}/versions -> the schema id."""
    from urllib.parse import quote
    req = urllib.request.Request(
        f"{url.rstrip('/')}/subjects/{quote(subject, safe='')}/versions",
        data=json.dumps({"schema": schema_text, "schemaType": "AVRO"}).encode(), method="POST",
        headers={"Content-Type": AVRO_CT, "Accept": AVRO_CT})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        fail(f"the registry refused the schema for subject {subject!r}: HTTP {e.code} {detail}")
    except (urllib.error.URLError, OSError) as e:
        fail(f"the registry at {url} is unreachable: {e}")
    except ValueError as e:
        fail(f"the registry's answer for subject {subject!r} is not JSON: {e}")
    if not isinstance(body, dict) or not isinstance(body.get("id"), int):
        fail(f"the registry's answer for subject {subject!r} has no integer id: {body!r}")
    return body["id"]


def load_avro_schema(path):
    """(compact schema text, fastavro parsed schema, named types) of an .avsc file."""
    try:
        import fastavro
    except ImportError:
        fail("the fastavro package is missing: pip install -r tests/harness/requirements.txt "
             "(fastavro==1.13.1), or run with the venv python from tests/harness/setup")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as e:
        fail(f"cannot read the schema file {path}: {e}")
    except ValueError as e:
        fail(f"the schema file {path} is not JSON: {e}")
    named = {}
    try:
        parsed = fastavro.parse_schema(raw, named)
    except Exception as e:
        fail(f"the schema file {path} is not a valid Avro schema: {type(e).__name__}: {e}")
    return json.dumps(raw, separators=(",", ":"), ensure_ascii=False), parsed, named


class AvroFromJson:
    """Turns a JSON value into the datum fastavro writes for a (parsed) schema,
    exactly: every logical type is turned into its physical value here, and
    every union value into fastavro's tuple notation (branch name, value), so
    fastavro itself neither converts nor guesses. What is accepted is listed in
    the module docstring (produce-avro)."""

    def __init__(self, named):
        self.named = named

    def resolve(self, s):
        while isinstance(s, str) and s in self.named:
            s = self.named[s]
        return s

    @staticmethod
    def branch_name(b):
        """The name fastavro's tuple notation uses for a union branch."""
        if isinstance(b, str):
            return b
        if isinstance(b, dict):
            if b.get("type") in NAMED_AVRO_TYPES:
                return b["name"]
            if isinstance(b.get("type"), str):
                return b["type"]
        raise AvroInputError(f"unsupported union branch {b!r}")

    def conv(self, s, v, path, default=False):
        s = self.resolve(s)
        if isinstance(s, list):
            return self.union(s, v, path, default)
        props = s if isinstance(s, dict) else {}
        t = props.get("type") if isinstance(s, dict) else s
        if isinstance(t, (dict, list)):
            return self.conv(t, v, path, default)
        lt = props.get("logicalType")

        def bad(what):
            return AvroInputError(f"{path}: {what}, got {json.dumps(v, default=str)[:200]}")

        if t == "null":
            if v is not None:
                raise bad("expected null")
            return None
        if t == "boolean":
            if not isinstance(v, bool):
                raise bad("expected true or false")
            return v
        if t in ("int", "long"):
            if not isinstance(v, int) or isinstance(v, bool):
                raise bad(f"expected an integer ({t}{', ' + lt if lt else ''})")
            lo, hi = (INT_MIN, INT_MAX) if t == "int" else (AVRO_LONG_MIN, AVRO_LONG_MAX)
            if not lo <= v <= hi:
                raise bad(f"out of range for {t}")
            return v
        if t in ("float", "double"):
            if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity"):
                return float(v.replace("Infinity", "inf"))
            if isinstance(v, bool) or not isinstance(v, (int, float, decimal.Decimal)):
                raise bad(f"expected a number (or \"NaN\", \"Infinity\", \"-Infinity\") for {t}")
            return float(v)
        if t == "string":
            if not isinstance(v, str):
                raise bad("expected a string")
            if lt == "uuid":
                try:
                    uuid.UUID(v)
                except ValueError:
                    raise bad("expected a UUID string")
            return v
        if t in ("bytes", "fixed"):
            size = props.get("size") if t == "fixed" else None
            if lt == "decimal" and not default and not (isinstance(v, dict) and len(v) == 1 and
                                                         set(v) & {"base64", "hex"}):
                out = self.decimal_bytes(props, v, path, size)
            else:
                out = self.raw_bytes(v, path, default)
            if size is not None and len(out) != size:
                raise bad(f"fixed {props.get('name')} takes exactly {size} bytes, not {len(out)}")
            return out
        if t == "enum":
            if not isinstance(v, str) or v not in props["symbols"]:
                raise bad(f"expected one of the symbols {props['symbols']}")
            return v
        if t == "array":
            if not isinstance(v, list):
                raise bad("expected an array")
            return [self.conv(props["items"], x, f"{path}[{i}]", default) for i, x in enumerate(v)]
        if t == "map":
            if not isinstance(v, dict):
                raise bad("expected an object (map)")
            return {k: self.conv(props["values"], x, f"{path}.{k}", default) for k, x in v.items()}
        if t in ("record", "error"):
            if not isinstance(v, dict):
                raise bad(f"expected an object (record {props['name']})")
            out = {}
            names = set()
            for fld in props["fields"]:
                n = fld["name"]
                names.add(n)
                if n in v:
                    out[n] = self.conv(fld["type"], v[n], f"{path}.{n}", default)
                elif "default" in fld:
                    out[n] = self.conv(fld["type"], fld["default"], f"{path}.{n}(default)", True)
                else:
                    raise AvroInputError(f"{path}: field {n!r} of record {props['name']} is missing "
                                         "and has no default")
            extra = sorted(set(v) - names)
            if extra:
                raise AvroInputError(f"{path}: record {props['name']} has no field(s) {extra}")
            return out
        raise AvroInputError(f"{path}: unsupported Avro type {t!r}")

    def union(self, branches, v, path, default):
        if default:  # Avro: a union field's default is of its first branch
            return (self.branch_name(branches[0]), self.conv(branches[0], v, path, True))
        names = [self.branch_name(b) for b in branches]
        if isinstance(v, dict) and len(v) == 1:
            (k, inner), = v.items()
            for b, n in zip(branches, names):
                if k == n or (isinstance(self.resolve(b), dict) and self.resolve(b).get("type")
                              in NAMED_AVRO_TYPES and k == n.rsplit(".", 1)[-1]):
                    return (n, self.conv(b, inner, f"{path}<{n}>"))
        why = []
        for b, n in zip(branches, names):
            try:
                return (n, self.conv(b, v, f"{path}<{n}>"))
            except AvroInputError as e:
                why.append(str(e))
        raise AvroInputError(f"{path}: no branch of the union {names} takes the value: " + "; ".join(why))

    @staticmethod
    def raw_bytes(v, path, default):
        if default:  # Avro JSON defaults: one code point 0-255 per byte
            if not isinstance(v, str):
                raise AvroInputError(f"{path}: a bytes default must be a string")
            return v.encode("latin-1")
        if isinstance(v, str):
            return v.encode("utf-8")
        if isinstance(v, dict) and len(v) == 1 and "base64" in v:
            try:
                return base64.b64decode(v["base64"], validate=True)
            except (ValueError, TypeError) as e:
                raise AvroInputError(f"{path}: bad base64: {e}")
        if isinstance(v, dict) and len(v) == 1 and "hex" in v:
            try:
                return bytes.fromhex(v["hex"])
            except (ValueError, TypeError) as e:
                raise AvroInputError(f"{path}: bad hex: {e}")
        raise AvroInputError(f"{path}: expected a string (sent as UTF-8), {{\"base64\": ...}} or "
                             f"{{\"hex\": ...}}, got {json.dumps(v, default=str)[:200]}")

    @staticmethod
    def decimal_bytes(props, v, path, size):
        """Big-endian two's complement of the unscaled value, minimal (like Java's
        BigInteger.toByteArray, what Kafka Connect's Decimal and Debezium write),
        or sign-extended to a fixed's size."""
        if isinstance(v, bool) or not isinstance(v, (str, int, decimal.Decimal)):
            raise AvroInputError(f"{path}: expected a decimal as a string (\"10.50\") or a JSON number, "
                                 f"got {json.dumps(v, default=str)[:200]}")
        try:
            d = decimal.Decimal(v.strip() if isinstance(v, str) else v)
        except decimal.InvalidOperation:
            raise AvroInputError(f"{path}: {v!r} is not a decimal number")
        if not d.is_finite():
            raise AvroInputError(f"{path}: {v!r}: Avro decimals have no NaN or infinity")
        scale = int(props.get("scale", 0))
        precision = props.get("precision")
        sign, digits, exp = d.as_tuple()
        n = int("".join(map(str, digits)) or "0")
        shift = exp + scale
        if shift >= 0:
            n *= 10 ** shift
        else:
            n, rem = divmod(n, 10 ** -shift)
            if rem:
                raise AvroInputError(f"{path}: {v!r} has more than {scale} digits after the point "
                                     f"(scale {scale}); not rounded")
        if precision is not None and len(str(n)) > int(precision) and n != 0:
            raise AvroInputError(f"{path}: {v!r} has more than {precision} digits (precision {precision})")
        if sign:
            n = -n
        length = ((n if n >= 0 else ~n).bit_length() + 8) // 8
        if size is not None:
            if length > size:
                raise AvroInputError(f"{path}: {v!r} does not fit in fixed({size})")
            length = size
        return n.to_bytes(length, "big", signed=True)


def cmd_produce_avro(args):
    require_client()
    import io
    import fastavro
    from confluent_kafka import KafkaException, Producer
    vtext, vparsed, vnamed = load_avro_schema(args.schema_file)
    vconv = AvroFromJson(vnamed)
    kconv = None
    if args.key_schema_file:
        ktext, kparsed, knamed = load_avro_schema(args.key_schema_file)
        kconv = AvroFromJson(knamed)
    # Everything is converted and encoded before anything is registered or sent.
    msgs = []
    for lineno, line in enumerate(sys.stdin.buffer, 1):
        if not line.strip():
            continue
        try:
            m = json.loads(line, parse_float=decimal.Decimal)
        except ValueError as e:
            fail(f"stdin line {lineno} is not JSON: {e}")
        if not isinstance(m, dict) or "value" not in m:
            fail(f"stdin line {lineno}: expected an object with a \"value\"")
        extra = sorted(set(m) - {"value", "key", "partition", "headers", "timestamp_ms"})
        if extra:
            fail(f"stdin line {lineno}: unknown member(s) {extra}")
        kw = {}
        try:
            if m["value"] is not None:
                buf = io.BytesIO()
                fastavro.schemaless_writer(buf, vparsed, vconv.conv(vparsed, m["value"], "value"))
                kw["value"] = buf.getvalue()  # framed once the id is known
            k = m.get("key")
            if k is not None:
                if kconv is not None:
                    buf = io.BytesIO()
                    fastavro.schemaless_writer(buf, kparsed, kconv.conv(kparsed, k, "key"))
                    kw["key"] = buf.getvalue()
                elif isinstance(k, str):
                    kw["key"] = k.encode()
                else:
                    fail(f"stdin line {lineno}: without --key-schema-file the key must be a string "
                         "(sent as UTF-8) or null")
        except AvroInputError as e:
            fail(f"stdin line {lineno}: {e}")
        except Exception as e:  # fastavro's own complaints
            fail(f"stdin line {lineno}: Avro encoding failed: {type(e).__name__}: {e}")
        try:
            if m.get("partition") is not None:
                if not isinstance(m["partition"], int) or isinstance(m["partition"], bool):
                    raise TypeError("partition must be an integer")
                kw["partition"] = m["partition"]
            if m.get("headers"):
                kw["headers"] = [(n, None if hv is None else hv.encode()) for n, hv in m["headers"].items()]
            if m.get("timestamp_ms") is not None:
                if not isinstance(m["timestamp_ms"], int) or isinstance(m["timestamp_ms"], bool):
                    raise TypeError("timestamp_ms must be an integer")
                kw["timestamp"] = m["timestamp_ms"]
        except (AttributeError, TypeError, ValueError) as e:
            fail(f"stdin line {lineno}: headers must be an object of strings or nulls, partition and "
                 f"timestamp_ms integers ({e})")
        msgs.append((lineno, kw))
    vsubject = args.subject or f"{args.topic}-value"
    vid = registry_register(args.registry, vsubject, vtext)
    vprefix = b"\x00" + vid.to_bytes(4, "big")
    kid = None
    if kconv is not None:
        kid = registry_register(args.registry, args.key_subject or f"{args.topic}-key", ktext)
        kprefix = b"\x00" + kid.to_bytes(4, "big")
    p = Producer({
        "bootstrap.servers": args.brokers,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 20,
        "compression.type": "none",
        "partitioner": "murmur2_random",  # like the Java client's default (on the encoded key)
        "message.timeout.ms": 120000,
    })
    offsets = [None] * len(msgs)
    errors = []

    def make_cb(i):
        def cb(err, msg):
            if err is not None:
                errors.append((i, err))
            else:
                offsets[i] = [msg.partition(), msg.offset()]
        return cb

    for i, (lineno, kw) in enumerate(msgs):
        if "value" in kw:
            kw["value"] = vprefix + kw["value"]
        if kid is not None and "key" in kw:
            kw["key"] = kprefix + kw["key"]
        kw["on_delivery"] = make_cb(i)
        while True:
            try:
                p.produce(args.topic, **kw)
                break
            except BufferError:
                p.poll(0.05)
            except KafkaException as e:
                fail(f"produce (line {lineno}): {e}")
    left = p.flush(120)
    if left:
        fail(f"{left} messages still undelivered after 120 s")
    if errors:
        i, err = errors[0]
        fail(f"{len(errors)} messages failed; the first (stdin line {msgs[i][0]}): {err}")
    out = {"count": len(msgs), "schema_id": vid}
    if kid is not None:
        out["key_schema_id"] = kid
    if not args.no_offsets:
        out["offsets"] = offsets
    emit(out)


def cmd_delete_records(args):
    require_client()
    from confluent_kafka import TopicPartition
    a = admin(args.brokers)
    futs = a.delete_records([TopicPartition(args.topic, args.partition, args.before)], request_timeout=30)
    try:
        res = list(futs.values())[0].result()
    except Exception as e:
        fail(f"delete-records {args.topic}[{args.partition}] before {args.before}: {e}")
    emit({"topic": args.topic, "partition": args.partition, "low_watermark": res.low_watermark})


def cmd_watermarks(args):
    require_client()
    a = admin(args.brokers)
    wm = watermarks_of(a, args.topic)
    emit({"partitions": {str(p): [lo, hi] for p, (lo, hi) in wm.items()}})


def text(b):
    if b is None:
        return None
    try:
        return b.decode()
    except UnicodeDecodeError:
        return b.decode(errors="replace")


def cmd_consume(args):
    require_client()
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    a = admin(args.brokers)
    parts = partition_ids(a, args.topic)
    deadline = time.monotonic() + args.timeout
    while True:
        wm = watermarks_of(a, args.topic, parts)
        have = sum(hi - lo for lo, hi in wm.values())
        if args.wait_count is None or have >= args.wait_count:
            break
        if time.monotonic() > deadline:
            fail(f"topic {args.topic!r} holds {have} messages, fewer than --wait-count {args.wait_count}, "
                 f"after {args.timeout:.0f} s")
        time.sleep(0.2)
    c = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": "urutau-harness-consume",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
        "fetch.max.bytes": 52428800,
    })
    out = sys.stdout
    buf = []
    try:
        for p in parts:
            lo, hi = wm[p]
            if hi <= lo:
                continue
            c.assign([TopicPartition(args.topic, p, lo)])
            nxt = lo
            while nxt < hi:
                if time.monotonic() > deadline:
                    fail(f"partition {p}: read up to offset {nxt} of {hi} within {args.timeout:.0f} s")
                for m in c.consume(num_messages=min(10000, hi - nxt), timeout=1.0):
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        fail(f"partition {p} at offset {nxt}: {m.error()}")
                    off = m.offset()
                    if off >= hi:
                        nxt = hi
                        break
                    nxt = off + 1
                    if args.values_only:
                        if m.value() is not None:
                            buf.append(text(m.value()))
                    else:
                        hs = m.headers()
                        buf.append(json.dumps({
                            "partition": p,
                            "offset": off,
                            "key": text(m.key()),
                            "value": text(m.value()),
                            "headers": None if hs is None else {n: text(v) for n, v in hs},
                            "timestamp_ms": m.timestamp()[1],
                        }, ensure_ascii=False))
                if len(buf) >= 10000:
                    out.write("\n".join(buf) + "\n")
                    buf.clear()
            c.unassign()
    finally:
        if buf:
            out.write("\n".join(buf) + "\n")
        out.flush()
        c.close()


# --- Kafka Connect + Debezium -----------------------------------------------

CONNECT_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"


def find_psql():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"))
    if found:
        return found[-1]
    p = shutil.which("psql")
    if not p:
        fail("no psql (Debian: apt-get install postgresql-client)")
    return p


def qident(name):
    return '"' + name.replace('"', '""') + '"'


def qtable(name):
    schema, _, table = name.rpartition(".")
    return f"{qident(schema)}.{qident(table)}" if schema else qident(table)


def psql(args, sql):
    env = dict(os.environ)
    if args.pg_password is not None:
        env["PGPASSWORD"] = args.pg_password
    res = subprocess.run([find_psql(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", args.pg_host,
                          "-p", str(args.pg_port), "-U", args.pg_user, "-d", args.pg_db, "-c", sql],
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if res.returncode != 0:
        fail(f"psql failed on {sql!r}: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout.decode().strip()


def ensure_publication(args, tables):
    lit = args.publication.replace("'", "''")
    if psql(args, f"SELECT 1 FROM pg_publication WHERE pubname = '{lit}'") == "1":
        log(f"publication {args.publication!r} exists; left as it is")
        return
    psql(args, f"CREATE PUBLICATION {qident(args.publication)} FOR TABLE {', '.join(qtable(t) for t in tables)}")
    log(f"created publication {args.publication!r} for {', '.join(tables)}")


def rest_get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return None, None


def cmd_connect_start(args):
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    old = read_pid(d, "connect.pid")
    if old and alive(old) and is_java_main(old, CONNECT_MAIN):
        fail(f"Connect is already running from {d} (pid {old}); run `connect-stop --dir {d}` first")
    if args.schemas_enable not in ("true", "false"):
        fail("--schemas-enable must be true or false")
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    if not tables:
        fail("--tables names no table")
    home = find_home(args.home)
    java = find_java()
    ensure_publication(args, tables)
    name = args.name or f"urutau-debezium-{args.slot}"
    rest_port = free_ports(1)[0]
    worker = {
        "bootstrap.servers": args.brokers,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": args.schemas_enable,
        "value.converter.schemas.enable": args.schemas_enable,
        "offset.storage.file.filename": os.path.join(d, "connect.offsets"),
        "offset.flush.interval.ms": "1000",
        "plugin.path": os.path.join(home, "connect", "plugins"),
        "plugin.discovery": "service_load",
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(rest_port),
        "topic.creation.enable": "true",
    }
    connector = {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": args.pg_host,
        "database.port": str(args.pg_port),
        "database.user": args.pg_user,
        "database.password": args.pg_password or "",
        "database.dbname": args.pg_db,
        "topic.prefix": args.topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": args.slot,
        "publication.name": args.publication,
        "publication.autocreate.mode": "disabled",
        "table.include.list": ",".join(tables),
        # The broker does not auto-create topics: Connect creates them.
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
    }
    connector.update(kv_list(args.extra, "--extra"))
    wconf, cconf = os.path.join(d, "worker.properties"), os.path.join(d, "connector.properties")
    write_props(wconf, worker)
    write_props(cconf, connector)
    logfile = os.path.join(d, "connect.log")
    start_at = os.path.getsize(logfile) if os.path.exists(logfile) else 0
    log4j = os.path.join(home, "connect", "log4j2.properties")
    t0 = time.monotonic()
    with open(logfile, "ab") as out:
        proc = subprocess.Popen([java, *JVM_FLAGS, *CONNECT_HEAP, f"-Dlog4j2.configurationFile={log4j}",
                                 "-cp", os.path.join(home, "connect", "lib", "*"), CONNECT_MAIN, wconf, cconf],
                                cwd=d, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    write_pid(d, proc.pid, "connect.pid")
    rest = f"http://127.0.0.1:{rest_port}"

    def give_up(msg):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        try:
            os.remove(os.path.join(d, "connect.pid"))
        except FileNotFoundError:
            pass
        errors = [line[:600] for line in new_log().splitlines()
                  if " ERROR " in line and "CloudEventsConverter" not in line and "Failed to discover" not in line]
        first = "".join(f"{e}\n" for e in errors[:12])
        fail(f"{msg}\n--- first ERROR lines of {logfile} ---\n{first}--- tail of {logfile} ---\n{tail(logfile, 60)}")

    def new_log():
        try:
            with open(logfile, "rb") as f:
                f.seek(start_at)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    deadline = t0 + args.timeout
    running = streaming = False
    status = None
    while not (running and streaming):
        if proc.poll() is not None:
            give_up(f"Connect exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            give_up(f"connector {name!r} not running+streaming within {args.timeout:.0f} s "
                    f"(running={running}, streaming={streaming}, last status {json.dumps(status)})")
        if not running:
            code, status = rest_get(f"{rest}/connectors/{name}/status")
            if code == 200 and status:
                states = [status.get("connector", {}).get("state")] + [t.get("state") for t in
                                                                       status.get("tasks", [])]
                if "FAILED" in states:
                    traces = [t.get("trace", "") for t in status.get("tasks", []) if t.get("state") == "FAILED"]
                    traces.append(status.get("connector", {}).get("trace", "") or "")
                    give_up(f"connector {name!r} FAILED: {''.join(x for x in traces if x)[:4000]}")
                running = len(states) >= 2 and all(s == "RUNNING" for s in states)
        if not streaming:
            text_ = new_log()
            streaming = bool(STREAMING_RE.search(text_))
        if not (running and streaming):
            time.sleep(0.2)
    # The snapshot's records are sent asynchronously: wait until each
    # snapshotted table's topic holds at least as many messages as Debezium
    # exported (default topic naming <prefix>.<schema>.<table> only).
    exported = {t: int(n) for n, t in EXPORTED_RE.findall(new_log()) if int(n) > 0}
    renamed = [k for k in connector if k.startswith(("transforms", "topic.naming", "topic.delimiter"))]
    if exported and renamed:
        log(f"not waiting for the snapshot records in Kafka: topic names changed by {', '.join(renamed)}")
    elif exported:
        require_client()
        a = admin(args.brokers, quiet=True)
        for table, n in sorted(exported.items()):
            topic = f"{args.topic_prefix}.{table}"
            while True:
                have = 0
                try:
                    if topic_meta(a, topic, timeout=2) is not None:
                        have = sum(hi - lo for lo, hi in watermarks_of(a, topic).values())
                except Exception:
                    pass
                if have >= n:
                    break
                if proc.poll() is not None:
                    give_up(f"Connect exited with status {proc.returncode}")
                if time.monotonic() > deadline:
                    give_up(f"topic {topic!r} holds {have} of the {n} snapshot records after {args.timeout:.0f} s")
                time.sleep(0.1)
    # A task can fail right after starting (e.g. a missing slot permission):
    # look once more.
    code, status = rest_get(f"{rest}/connectors/{name}/status")
    if code == 200 and status and any(t.get("state") == "FAILED" for t in status.get("tasks", [])):
        give_up(f"connector {name!r} task FAILED after streaming started: {json.dumps(status)[:4000]}")
    log(f"Connect pid {proc.pid} ({rest}) streaming in {time.monotonic() - t0:.2f} s, RSS {rss_mb(proc.pid)} MB")
    emit({"pid": proc.pid, "rest": rest, "dir": d, "name": name, "log": logfile})


def cmd_connect_stop(args):
    d = os.path.abspath(args.dir)
    pid = read_pid(d, "connect.pid")
    if pid is None:
        return
    kill_group(pid, CONNECT_MAIN, grace=args.grace)
    try:
        os.remove(os.path.join(d, "connect.pid"))
    except FileNotFoundError:
        pass


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("start", help="start a single-node KRaft broker")
    s.add_argument("--dir", required=True)
    s.add_argument("--home", help="kafka-fetch's home (default: $URUTAU_TEST_KAFKA_HOME, else run kafka-fetch)")
    s.add_argument("--timeout", type=float, default=90.0)
    s.add_argument("--secure", action="store_true",
                   help="add SASL_SSL and SSL (mutual TLS) listeners with the test CA's certificate")
    s.set_defaults(func=cmd_start)
    s = sub.add_parser("stop")
    s.add_argument("--dir", required=True)
    s.add_argument("--graceful", action="store_true", help="SIGTERM first (controlled shutdown, up to 30 s)")
    s.set_defaults(func=cmd_stop)

    def with_topic(name, func, **kw):
        s = sub.add_parser(name, **kw)
        s.add_argument("--brokers", required=True)
        s.add_argument("--topic", required=True)
        s.set_defaults(func=func)
        return s

    s = with_topic("create-topic", cmd_create_topic)
    s.add_argument("--partitions", type=int, default=1)
    s.add_argument("--config", action="append", metavar="K=V", help="a topic config, repeatable")
    s = with_topic("add-partitions", cmd_add_partitions)
    s.add_argument("--total", type=int, required=True)
    s = with_topic("produce", cmd_produce)
    s.add_argument("--no-offsets", action="store_true", help="print only the count (bulk loads)")
    s = with_topic("produce-avro", cmd_produce_avro)
    s.add_argument("--registry", required=True, help="the schema registry's URL")
    s.add_argument("--schema-file", required=True, help="the value's Avro schema (.avsc)")
    s.add_argument("--key-schema-file", help="the key's Avro schema (default: keys are UTF-8 strings)")
    s.add_argument("--subject", help="the value schema's subject (default: <topic>-value)")
    s.add_argument("--key-subject", help="the key schema's subject (default: <topic>-key)")
    s.add_argument("--no-offsets", action="store_true", help="print no offsets (bulk loads)")
    s = with_topic("delete-records", cmd_delete_records)
    s.add_argument("--partition", type=int, required=True)
    s.add_argument("--before", type=int, required=True, help="new low watermark (-1: the high watermark)")
    with_topic("watermarks", cmd_watermarks)
    s = with_topic("consume", cmd_consume)
    s.add_argument("--values-only", action="store_true")
    s.add_argument("--wait-count", type=int, help="first wait until the topic holds N messages")
    s.add_argument("--timeout", type=float, default=120.0)

    s = sub.add_parser("connect-start", help="start Kafka Connect standalone with Debezium's Postgres connector")
    s.add_argument("--dir", required=True)
    s.add_argument("--home")
    s.add_argument("--brokers", required=True)
    s.add_argument("--pg-host", required=True)
    s.add_argument("--pg-port", type=int, required=True)
    s.add_argument("--pg-user", required=True)
    s.add_argument("--pg-password")
    s.add_argument("--pg-db", required=True)
    s.add_argument("--slot", required=True)
    s.add_argument("--publication", required=True)
    s.add_argument("--tables", required=True, help="comma-separated schema.table list")
    s.add_argument("--topic-prefix", required=True)
    s.add_argument("--schemas-enable", default="true")
    s.add_argument("--name")
    s.add_argument("--extra", action="append", metavar="K=V", help="extra connector property, repeatable")
    s.add_argument("--timeout", type=float, default=180.0)
    s.set_defaults(func=cmd_connect_start)
    s = sub.add_parser("connect-stop")
    s.add_argument("--dir", required=True)
    s.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    s.set_defaults(func=cmd_connect_stop)

    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
