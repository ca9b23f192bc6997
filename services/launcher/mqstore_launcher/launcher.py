"""``python -m mqstore_launcher --data-dir ./data``: every service on loopback, for ``make run``.

Before starting anything it checks that each service's port can be bound on 127.0.0.1; if one cannot,
it names the port, the service and the flag that moves it (``--commitlog-port``, ``--index-port``,
``--txn-port``, ``--compactor-port``; ``make run RUN_ARGS="..."``) and exits 1 having started nothing.
Then it starts the commit log, and once that serves, the services that follow it, each as a child
process in its own session (so Ctrl-C reaches only the launcher). A child counts as running only when
it has logged ``server.started`` with its own pid and port and answers gRPC health SERVING for its own
service (mqstore_launcher.child: a server of someone else on the port does not count). Each service's
output (its JSON log) is appended to ``<data-dir>/logs/<name>.log``, named as it starts and in the banner,
so that the terminal holds the launcher's own lines; ``--service-logs stream`` copies it to the
launcher's stderr instead. If any child fails to start, the launcher prints which one and its last log
lines, stops the others and exits 1;
"mqstore is running" is printed only once every child serves. Then it creates the ``demo`` topic if
missing and prints the endpoints, the disk the store takes, and examples that work as printed in
another shell (the venv activated first; the addresses exported when the ports are not the defaults).

File sizes: a service's defaults are for production (1 GiB commit log segments, preallocated; index
files of 400 MB; 64 MiB compaction segments), which would make an empty ``make run`` store take 1.6 GB.
The launcher gives a new data dir smaller files (:data:`EMBEDDED_SIZES`: an empty store takes about
:func:`empty_store_mib`, 65 MiB) and keeps a data dir made with other segment sizes on its own (segment
sizes cannot change under an existing log). A variable the user set (``MQSTORE_SEGMENT_SIZE_BYTES``,
...) wins over these.

The commit log and the Transaction service get the same MQSTORE_INTERNAL_TOKEN (the shared secret of
CommitLogInternal): the variable when set, else a random one kept in ``<data-dir>/internal-token``. On
Ctrl-C or SIGTERM: SIGTERM to each child in reverse order, wait, SIGKILL if it does not exit, and exit
0. If a child dies on its own, the others are stopped and the launcher exits 1. Adding a service is one
row of SERVICES.

Operations (mqstore_rpc.settings): each service serves /metrics on its port + 100 (checked free with the
gRPC ports; the banner lists them). ``--tls`` (``make run-tls``) makes a throwaway CA and certificates
in ``<data-dir>/tls`` (mqstore_rpc.tls_certs, openssl) and starts every service with TLS, the services
calling each other over it. ``--auth`` (or MQSTORE_AUTH=on) turns authentication on for every service;
they share one auth database, ``<data-dir>/auth.db`` (MQSTORE_AUTH_URL when set), and one key-encryption
key of SDK secret keys, ``<data-dir>/auth.kek`` (MQSTORE_AUTH_KEK_FILE when set), and call each other
as ``service`` with the internal token, as the launcher does for its own calls.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping, TextIO

import grpc
from mqstore.format import segment_name

from mqstore import defaults, disk_space, fs
from mqstore_rpc import private_files
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from mqstore_rpc.peers import Peers
from mqstore_rpc.secret import Secret
from mqstore_rpc.tls import client_tls
from mqstore_rpc.tls_certs import make_ca

from mqstore_launcher.child import HOST, Child, StartFailed, port_problems

READY_TIMEOUT_S = 120.0     # recovery of a large log can take a while
DEMO_TOPIC = "demo"
TOKEN_ENV = "MQSTORE_INTERNAL_TOKEN"
MiB = 1 << 20
METRICS_PORT_OFFSET = defaults.METRICS_PORT_OFFSET   # mqstore_rpc.settings: /metrics is on the gRPC port + 100
PLAINTEXT = Peers()         # no TLS, no credentials


@dataclass(frozen=True)
class ServiceEntry:
    """One row of the table: how ``make run`` starts a service."""

    name: str                 # also its flag: --<name>-port
    module: str               # run as python -m <module>
    default_port: int
    data_subdir: str          # its --data-dir under the launcher's; "" = the data dir itself
    follows_commitlog: bool   # gets --commitlog <the commit log's address>
    address_env: str          # where the mqstore CLI looks for it (the banner exports it if not the default)
    grpc_service: str         # its gRPC service: health is asked for this name
    examples: tuple[str, ...] = ()  # banner lines that work as printed; {address} is the service's
    calls_txn: bool = False   # gets --txn <the Transaction service's address>


_APPEND_JSON = '{"topic":"demo","messages":[{"body":"aGVsbG8=","keys":["k1"]}]}'

# In start order; stopped in reverse. The commit log comes first: the others follow it.
SERVICES = (
    ServiceEntry("commitlog", "mqstore_launcher.node", defaults.COMMITLOG_PORT, "", False, "MQSTORE_ADDRESS",
                 "mqstore.v1.CommitLog", (
                     "grpcurl -plaintext {address} list",
                     f"grpcurl -plaintext -d '{_APPEND_JSON}' {{address}} mqstore.v1.CommitLog/Append",
                     "mqstore send demo hello world --queue 0 --key k1",
                     "mqstore pull demo --queue 0")),
    ServiceEntry("index", "index_service.main", defaults.INDEX_PORT, "index", True, "MQSTORE_INDEX_ADDRESS",
                 "mqstore.v1.Index", ("mqstore query key demo k1",)),
    ServiceEntry("txn", "txn_service.main", defaults.TXN_PORT, "txn", True, "MQSTORE_TXN_ADDRESS",
                 "mqstore.v1.Transaction", ("mqstore txn send demo paid shipped --group pg",)),
    ServiceEntry("compactor", "compactor_service.main", defaults.COMPACTOR_PORT, "compactor", True,
                 "MQSTORE_COMPACTOR_ADDRESS", "mqstore.v1.Compactor", (
                     "grpcurl -plaintext {address} mqstore.v1.Compactor/Stats",)),
    # The RocketMQ 5 gateway (apache.rocketmq.v2, for the official clients); it keeps nothing on disk.
    ServiceEntry("gateway", "gateway_service.main", defaults.GATEWAY_PORT, "gateway", True, "MQSTORE_GATEWAY_ADDRESS",
                 "apache.rocketmq.v2.MessagingService", ("grpcurl -plaintext {address} list",), calls_txn=True),
)
COMMITLOG_PORT = SERVICES[0].default_port
TXN_PORT = next(e.default_port for e in SERVICES if e.name == "txn")

# The smaller files of a data dir that make run creates: (flag, value, the variable that overrides it).
# 64 MiB commit log segments (preallocated: a full disk fails at creation, not as SIGBUS later), with
# the next one created 4 MiB ahead of the write position instead of 64 MiB (the warmer's reach), consume
# queue files of 50,000 entries (1 MB each, one per queue written), index files of 100,000 slots and
# 400,000 entries (8.4 MB; a new file every 400,000 keys), compaction log segments of 8 MiB (a round
# writes its output segments whole; a record is at most a 4 MiB body).
EMBEDDED_SEGMENT_BYTES = 64 * MiB
EMBEDDED_SIZES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "commitlog": (("--segment-size-bytes", str(EMBEDDED_SEGMENT_BYTES), "MQSTORE_SEGMENT_SIZE_BYTES"),
                  ("--warm-ahead-bytes", str(4 * MiB), "MQSTORE_WARM_AHEAD_BYTES"),
                  ("--cq-entries-per-file", "50000", "MQSTORE_CQ_ENTRIES_PER_FILE")),
    "index": (("--slot-count", "100000", "MQSTORE_SLOT_COUNT"), ("--entry-count", "400000", "MQSTORE_ENTRY_COUNT")),
    "compactor": (("--segment-size-bytes", str(8 * MiB), "MQSTORE_SEGMENT_SIZE_BYTES"),),
}


def empty_store_mib() -> int:
    """What a new data dir takes on disk before the first message: the commit log's first segment
    (preallocated) and its space reserve (mqstore.disk_space); index and consume queue files are sparse
    until written. The banner's disk line measures it (``disk_bytes``)."""
    return round((EMBEDDED_SEGMENT_BYTES + disk_space.SPACE_RESERVE_BYTES) / MiB)


def existing_segment_bytes(data_dir: pathlib.Path) -> int | None:
    """The size of the commit log segments already in ``data_dir`` (None for a new store)."""
    directory = data_dir / "commitlog"
    if not directory.is_dir():
        return None
    for path in sorted(directory.iterdir()):
        try:
            segment_name.parse(path.name)
        except ValueError:
            continue  # temp files, .broken copies
        return path.stat().st_size
    return None


def uses_embedded_sizes(data_dir: pathlib.Path) -> bool:
    """True for a new data dir or one made with the embedded sizes; False for one made with others (the
    services' defaults then, so that its log opens)."""
    existing = existing_segment_bytes(data_dir)
    return existing is None or existing == EMBEDDED_SEGMENT_BYTES


def size_flags(name: str, embedded: bool, env: Mapping[str, str]) -> tuple[str, ...]:
    if not embedded:
        return ()
    return tuple(part for flag, value, variable in EMBEDDED_SIZES.get(name, ()) if variable not in env
                 for part in (flag, value))


@dataclass(frozen=True)
class Service:
    """A row of the table with the port it runs on."""

    entry: ServiceEntry
    port: int
    extra_args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def available(self) -> bool:
        try:
            return importlib.util.find_spec(self.entry.module) is not None
        except ModuleNotFoundError:
            return False

    def command(self, data_dir: pathlib.Path) -> list[str]:
        directory = data_dir / self.entry.data_subdir if self.entry.data_subdir else data_dir
        return [sys.executable, "-m", self.entry.module, "--data-dir", str(directory), "--host", HOST,
                "--port", str(self.port), *self.extra_args]


def services(ports: Mapping[str, int] | None = None, embedded: bool = False,
             env: Mapping[str, str] | None = None) -> tuple[Service, ...]:
    """The table with ports (``ports`` by name; the defaults for the rest), in start order, with the
    embedded file sizes when ``embedded`` (except those ``env`` sets)."""
    ports = ports or {}
    env = os.environ if env is None else env
    commitlog = f"{HOST}:{ports.get('commitlog', COMMITLOG_PORT)}"
    txn = f"{HOST}:{ports.get('txn', TXN_PORT)}"
    return tuple(Service(e, ports.get(e.name, e.default_port),
                         (("--commitlog", commitlog) if e.follows_commitlog else ())
                         + (("--txn", txn) if e.calls_txn else ())
                         + size_flags(e.name, embedded, env)) for e in SERVICES)


SERVICE_LOGS = ("files", "stream")  # --service-logs: each service's log in a file (the default), or on stderr
LOGS_SUBDIR = "logs"


def log_path(data_dir: pathlib.Path, name: str) -> pathlib.Path:
    """Where ``--service-logs files`` appends a service's JSON log: ``<data-dir>/logs/<name>.log``."""
    return data_dir / LOGS_SUBDIR / f"{name}.log"


def start_child(service: Service, data_dir: pathlib.Path, env: Mapping[str, str],
                peers: Peers = PLAINTEXT, service_logs: str = "files") -> Child:
    """The service's process; its log appended to :func:`log_path` (``files``) or copied to stderr (``stream``)."""
    return Child(service.name, service.entry.grpc_service, service.port, service.command(data_dir), env,
                 channel=peers.channel,
                 log_path=log_path(data_dir, service.name) if service_logs == "files" else None)


@dataclass(frozen=True)
class Security:
    """What ``--tls`` and ``--auth`` turned on, and how the launcher's own calls go."""

    ca: str = ""                     # the CA file clients trust ("" = plaintext)
    auth: bool = False
    token_file: str = ""
    env: tuple[tuple[str, str], ...] = ()
    peers: Peers = PLAINTEXT


def security(data_dir: pathlib.Path, tls: bool, auth: bool, token: str) -> Security:
    """The children's environment for TLS (a throwaway CA in <data-dir>/tls) and authentication (one shared
    auth database), and the launcher's own channel settings."""
    env: dict[str, str] = {}
    ca = ""
    if tls:
        certs = make_ca(data_dir / "tls")
        ca = str(certs / "ca.pem")
        env.update(MQSTORE_TLS_CERT=str(certs / "server.pem"), MQSTORE_TLS_KEY=str(certs / "server.key"),
                   MQSTORE_TLS_CA=ca)
    if auth:
        env.update(MQSTORE_AUTH="on")
    env["MQSTORE_AUTH_URL"] = os.environ.get("MQSTORE_AUTH_URL") or f"sqlite:///{data_dir / 'auth.db'}"
    # One key-encryption key of SDK secret keys for all: the CommitLog server seals, the gateway opens.
    env["MQSTORE_AUTH_KEK_FILE"] = os.environ.get("MQSTORE_AUTH_KEK_FILE") or str(data_dir.resolve() / "auth.kek")
    peers = Peers(client_tls(ca) if ca else None, "service", Secret(token))
    return Security(ca, auth, str(data_dir / "internal-token"), tuple(env.items()), peers)


def ensure_demo_topic(address: str, peers: Peers = PLAINTEXT) -> None:
    with peers.channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        try:
            stub.DescribeTopic(commitlog_pb2.DescribeTopicRequest(name=DEMO_TOPIC), timeout=10)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name=DEMO_TOPIC), timeout=10)


def disk_bytes(path: pathlib.Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks, as ``du``; sparse parts are free)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(directory, name), follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                continue  # removed while we walked (a temp file of a service)
    return total


def sizes_text(data_dir: pathlib.Path, embedded: bool) -> str:
    """The segment size the store uses, and why the disk it takes is what it is."""
    if embedded:
        return f"commit log segments of {EMBEDDED_SEGMENT_BYTES // MiB} MiB, preallocated"
    existing = existing_segment_bytes(data_dir) or 0
    return (f"commit log segments of {existing / MiB:,.0f} MiB, preallocated, as this data dir was made; "
            f"a new data dir gets {EMBEDDED_SEGMENT_BYTES // MiB} MiB ones")


def _display(path: pathlib.Path) -> str:
    try:
        return str(path.relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def _activate_command() -> str | None:
    """How another shell gets this venv's ``mqstore`` and ``grpcurl`` on PATH (None outside a venv)."""
    activate = pathlib.Path(sys.prefix) / "bin" / "activate"
    if sys.prefix == sys.base_prefix or not activate.exists():
        return None
    return f"source {_display(activate)}"


def banner(children: list, data_dir: pathlib.Path | None = None, embedded: bool = True,
           security: Security | None = None) -> str:
    """The endpoints, the disk the store takes, and examples that work as printed (in another shell, from
    this directory). ``children`` have ``.name``, ``.address``, ``.port`` (Child or Service)."""
    rows = {e.name: e for e in SERVICES}
    security = security or Security()
    lines = ["", "mqstore is running:"]
    lines += [f"  {c.name:<10} {c.address}  metrics http://{HOST}:{c.port + METRICS_PORT_OFFSET}/metrics"
              for c in children]
    if security.ca:
        lines.append(f"  TLS on: clients trust {security.ca}")
    if security.auth:
        lines.append("  authentication on: users and rules with `mqstore user` and `mqstore acl`, RocketMQ SDK keys "
                     "with `mqstore user sdk-key` (README)")
    if data_dir is not None:
        lines.append(f"  {'disk':<10} {disk_bytes(data_dir) / MiB:,.1f} MiB in {_display(data_dir)} "
                     f"({sizes_text(data_dir, embedded)})")
    logs = [c.log_path for c in children if getattr(c, "log_path", None) is not None]
    if logs:
        lines.append(f"  {'logs':<10} {_display(logs[0].parent)}/{{{','.join(p.stem for p in logs)}}}.log "
                     f"(each service's JSON log; --service-logs stream puts them on this terminal)")
    lines += ["", "Try, in another shell in this directory:"]
    if activate := _activate_command():
        lines.append(f"  {activate}")
    exports = [f"{rows[c.name].address_env}={c.address}" for c in children if c.port != rows[c.name].default_port]
    if security.ca:
        exports.append(f"MQSTORE_TLS_CA={security.ca}")
    if exports:
        lines.append("  export " + " ".join(exports))
    if security.auth:
        lines.append(f"  export MQSTORE_USER=service MQSTORE_SECRET=$(cat {security.token_file})"
                     f"   # the services' identity: make your own users with it")
    grpcurl = f"grpcurl -cacert {security.ca}" if security.ca else "grpcurl -plaintext"
    if security.auth:
        grpcurl += ' -H "authorization: Bearer service:$MQSTORE_SECRET"'
    lines += [f"  {example.replace('{address}', c.address).replace('grpcurl -plaintext', grpcurl)}"
              for c in children for example in rows[c.name].examples]
    lines += ["", "Ctrl-C stops everything.", ""]
    return "\n".join(lines)


def _install_stop_handlers(stop: threading.Event) -> None:
    def handler(_signum, _frame) -> None:
        stop.set()
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def internal_token(data_dir: pathlib.Path) -> str:
    """The shared secret of CommitLogInternal for this data dir: MQSTORE_INTERNAL_TOKEN when set, else the
    file ``<data-dir>/internal-token`` (created once, mode 0600, random), so restarts keep it."""
    if given := os.environ.get(TOKEN_ENV):
        return given
    path = data_dir / "internal-token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
            out.flush()
            fs.sync_created(fd, path)  # the creation rule (mqstore.fs): a cut must not leave it empty
    return path.read_text().strip()


def _start_all(todo: tuple[Service, ...], data_dir: pathlib.Path, stop: threading.Event,
               children: list[Child], out: TextIO, secure: Security, service_logs: str) -> bool:
    """The commit log first; once it serves, the others together. True when all serve, False when
    ``stop`` came first; StartFailed names the first child that failed."""
    # The commit log and txn share the internal token; every service gets the TLS and auth settings.
    env = {**os.environ, TOKEN_ENV: internal_token(data_dir), **dict(secure.env)}
    for wave in (todo[:1], todo[1:]):
        began = time.monotonic()
        started = []
        for service in wave:
            child = start_child(service, data_dir, env, secure.peers, service_logs)
            children.append(child)
            started.append(child)
            out.write(f"starting {service.name} on {service.address} (pid {child.pid})"
                      + (f", its log in {_display(child.log_path)}" if child.log_path else "") + "\n")
        out.flush()
        for child in started:
            if not child.wait_ready(stop, READY_TIMEOUT_S):
                return False
            out.write(f"{child.name} is serving ({time.monotonic() - began:.1f} s)\n")
            out.flush()
    return True


def _watch(children: list[Child], stop: threading.Event, err: TextIO) -> int:
    """Until ``stop``: 0; or 1 as soon as a child exits on its own."""
    while not stop.wait(0.5):  # wake up now and then to notice a child that died on its own
        for child in children:
            if child.process.poll() is not None:
                err.write(f"{child.name} exited with status {child.process.returncode}; stopping the others\n"
                          f"Its last log lines:\n{child.last_lines()}")
                return 1
    return 0


def run(data_dir: pathlib.Path, ports: Mapping[str, int] | None = None,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr, *, tls: bool = False, auth: bool = False,
        service_logs: str = "files") -> int:
    """Every installed service, ``ports`` by name (the defaults for the rest), until Ctrl-C; the exit status.
    ``service_logs``: "files" (each service's log in <data-dir>/logs) or "stream" (on ``err``)."""
    embedded = uses_embedded_sizes(data_dir)
    todo = tuple(s for s in services(ports, embedded) if s.available())
    wanted = [(s.name, s.port) for s in todo] + [(f"{s.name} metrics", s.port + METRICS_PORT_OFFSET) for s in todo]
    if problems := port_problems(wanted):
        err.write("mqstore did not start anything:\n" + "".join(f"  {p}\n" for p in problems))
        return 1
    stop = threading.Event()
    _install_stop_handlers(stop)
    private_files.make_data_dir(data_dir)  # 0700, the creation rule (mqstore.fs)
    auth = auth or os.environ.get("MQSTORE_AUTH", "").lower() in ("1", "on", "true", "yes")
    secure = security(data_dir, tls, auth, internal_token(data_dir))
    out.write(f"starting mqstore in {_display(data_dir)}: {sizes_text(data_dir, embedded)}"
              + (f" (an empty store takes ~{empty_store_mib()} MiB: the first segment and a "
                 f"{disk_space.SPACE_RESERVE_BYTES // MiB} MiB space reserve)" if embedded else "") + "\n")
    children: list[Child] = []
    status = 0
    try:
        # False: Ctrl-C came first (stop, exit 0)
        if _start_all(todo, data_dir, stop, children, out, secure, service_logs):
            ensure_demo_topic(children[0].address, secure.peers)
            out.write(banner(children, data_dir, embedded, secure) + "\n")
            out.flush()
            status = _watch(children, stop, err)
    except StartFailed as exc:
        err.write(f"mqstore did not start: {exc}Stopping the others.\n")
        status = 1
    except grpc.RpcError as exc:
        err.write(f"mqstore did not start: creating the {DEMO_TOPIC} topic failed: "
                  f"{exc.code().name}: {exc.details()}\n")
        status = 1
    finally:
        for child in reversed(children):
            out.write(f"stopping {child.name}\n")
            out.flush()
            child.stop()
    out.write("stopped\n")
    out.flush()
    return status
