"""``python -m mqstore_rpc.launcher --data-dir ./data``: every service on loopback, for ``make run``.

Starts each service of the :data:`SERVICES` table whose module is installed as a child process (its own
process group, so Ctrl-C reaches only the launcher, which then stops the children in reverse order),
waits until each answers gRPC health with SERVING, creates the ``demo`` topic if missing, and prints the
endpoints and examples that work as printed in another shell (the venv activated first; the addresses
exported when the ports are not the defaults). ``--<name>-port`` (``--commitlog-port``,
``--index-port``, ...) moves a service (the README test runs the launcher on free ports). The commit
log and the Transaction service get the same MQSTORE_INTERNAL_TOKEN (the shared secret of
CommitLogInternal): the variable when set, else a random one kept in ``<data-dir>/internal-token``. On Ctrl-C or
SIGTERM: SIGTERM to each child, wait, SIGKILL if it does not exit, and exit 0. If a child dies on its
own, the others are stopped and the launcher exits 1. Adding a service is one row of SERVICES.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore import fs
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0     # recovery of a large log can take a while
STOP_TIMEOUT_S = 30.0       # SIGTERM, then this long before SIGKILL
POLL_INTERVAL_S = 0.1
DEMO_TOPIC = "demo"
TOKEN_ENV = "MQSTORE_INTERNAL_TOKEN"


@dataclass(frozen=True)
class ServiceEntry:
    """One row of the table: how ``make run`` starts a service."""

    name: str                 # also its flag: --<name>-port
    module: str               # run as python -m <module>
    default_port: int
    data_subdir: str          # its --data-dir under the launcher's; "" = the data dir itself
    follows_commitlog: bool   # gets --commitlog <the commit log's address>
    address_env: str          # where the mqstore CLI looks for it (the banner exports it if not the default)
    examples: tuple[str, ...] = ()  # banner lines that work as printed; {address} is the service's
    calls_txn: bool = False   # gets --txn <the Transaction service's address>


_APPEND_JSON = '{"topic":"demo","messages":[{"body":"aGVsbG8=","keys":["k1"]}]}'

# In start order; stopped in reverse. The commit log comes first: the others follow it.
SERVICES = (
    ServiceEntry("commitlog", "commitlog_service.main", 50051, "", False, "MQSTORE_ADDRESS", (
        "grpcurl -plaintext {address} list",
        f"grpcurl -plaintext -d '{_APPEND_JSON}' {{address}} mqstore.v1.CommitLog/Append",
        "mqstore send demo hello world --queue 0 --key k1",
        "mqstore pull demo --queue 0")),
    ServiceEntry("index", "index_service.main", 50052, "index", True, "MQSTORE_INDEX_ADDRESS", (
        "mqstore query key demo k1",)),
    ServiceEntry("txn", "txn_service.main", 50053, "txn", True, "MQSTORE_TXN_ADDRESS", (
        "mqstore txn send demo paid shipped --group pg",)),
    ServiceEntry("compactor", "compactor_service.main", 50054, "compactor", True, "MQSTORE_COMPACTOR_ADDRESS", (
        "grpcurl -plaintext {address} mqstore.v1.Compactor/Stats",)),
    # The RocketMQ 5 gateway (apache.rocketmq.v2, for the official clients); it keeps nothing on disk.
    ServiceEntry("gateway", "gateway_service.main", 8081, "gateway", True, "MQSTORE_GATEWAY_ADDRESS", (
        "grpcurl -plaintext {address} list",), calls_txn=True),
)
COMMITLOG_PORT = SERVICES[0].default_port
TXN_PORT = next(e.default_port for e in SERVICES if e.name == "txn")


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


def services(ports: Mapping[str, int] | None = None) -> tuple[Service, ...]:
    """The table with ports (``ports`` by name; the defaults for the rest), in start order."""
    ports = ports or {}
    commitlog = f"{HOST}:{ports.get('commitlog', COMMITLOG_PORT)}"
    txn = f"{HOST}:{ports.get('txn', TXN_PORT)}"
    return tuple(Service(e, ports.get(e.name, e.default_port),
                         (("--commitlog", commitlog) if e.follows_commitlog else ()) + (("--txn", txn) if e.calls_txn
                                                                                         else ()))
                 for e in SERVICES)


class Child:
    """One service process. Not thread-safe: used by the launcher's main thread only."""

    def __init__(self, service: Service, data_dir: pathlib.Path, env: Mapping[str, str] | None = None):
        self.service = service
        self.process = subprocess.Popen(service.command(data_dir), start_new_session=True, env=env)

    def wait_healthy(self, stop: threading.Event, timeout_s: float) -> bool:
        """True when health says SERVING; False if the child exited, ``stop`` was set or time ran out."""
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.service.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline and not stop.is_set() and self.process.poll() is None:
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return True
                except grpc.RpcError:
                    pass  # not listening yet: keep polling until the deadline
                stop.wait(POLL_INTERVAL_S)
        return False

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"{self.service.name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it", file=sys.stderr)
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        return self.process.returncode


def ensure_demo_topic(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        try:
            stub.DescribeTopic(commitlog_pb2.DescribeTopicRequest(name=DEMO_TOPIC), timeout=10)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name=DEMO_TOPIC), timeout=10)


def _activate_command() -> str | None:
    """How another shell gets this venv's ``mqstore`` and ``grpcurl`` on PATH (None outside a venv)."""
    activate = pathlib.Path(sys.prefix) / "bin" / "activate"
    if sys.prefix == sys.base_prefix or not activate.exists():
        return None
    try:
        activate = activate.relative_to(pathlib.Path.cwd())
    except ValueError:
        pass  # the venv is elsewhere: give its absolute path
    return f"source {activate}"


def banner(children: list[Child]) -> str:
    """The endpoints and examples that work as printed (in another shell, from this directory)."""
    lines = ["", "mqstore is running:"]
    lines += [f"  {c.service.name:<10} {c.service.address}" for c in children]
    lines += ["", "Try, in another shell in this directory:"]
    if activate := _activate_command():
        lines.append(f"  {activate}")
    exports = [f"{c.service.entry.address_env}={c.service.address}" for c in children
               if c.service.port != c.service.entry.default_port]
    if exports:
        lines.append("  export " + " ".join(exports))
    lines += [f"  {example.replace('{address}', c.service.address)}"
              for c in children for example in c.service.entry.examples]
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


def _start_all(data_dir: pathlib.Path, ports: Mapping[str, int], stop: threading.Event,
               children: list[Child]) -> bool:
    env = {**os.environ, TOKEN_ENV: internal_token(data_dir)}  # the commit log and txn share it
    for service in services(ports):
        if not service.available():
            continue
        child = Child(service, data_dir, env)
        children.append(child)
        if not child.wait_healthy(stop, READY_TIMEOUT_S):
            if not stop.is_set():
                print(f"{service.name} did not become healthy (exit status {child.process.poll()})", file=sys.stderr)
            return False
    return True


def run(data_dir: pathlib.Path, ports: Mapping[str, int] | None = None) -> int:
    """Every installed service, ``ports`` by name (the defaults for the rest), until Ctrl-C; the exit status."""
    ports = ports or {}
    stop = threading.Event()
    _install_stop_handlers(stop)
    fs.make_dirs(data_dir)  # the creation rule (mqstore.fs)
    children: list[Child] = []
    status = 0
    try:
        if not _start_all(data_dir, ports, stop, children):
            return 0 if stop.is_set() else 1
        ensure_demo_topic(children[0].service.address)
        print(banner(children), flush=True)
        while not stop.wait(0.5):  # wake up now and then to notice a child that died on its own
            dead = [c for c in children if c.process.poll() is not None]
            if dead:
                print(f"{dead[0].service.name} exited with status {dead[0].process.returncode}; stopping",
                      file=sys.stderr)
                status = 1
                break
    finally:
        for child in reversed(children):
            child.stop()
    print("stopped", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore_rpc.launcher", description="run every mqstore service locally")
    parser.add_argument("--data-dir", type=pathlib.Path, default=pathlib.Path("data"))
    for entry in SERVICES:
        parser.add_argument(f"--{entry.name}-port", dest=entry.name, type=_port, default=entry.default_port,
                            help=f"default {entry.default_port}")
    parser.add_argument("--ha", action="store_true", help="three commit log replicas with automatic failover "
                        "through a throwaway etcd, and the other services (mqstore_rpc.launcher_ha; make run-ha)")
    args = parser.parse_args(argv)
    if args.ha:
        from mqstore_rpc import launcher_ha  # only this mode needs etcd
        return launcher_ha.run(args.data_dir.resolve())
    return run(args.data_dir.resolve(), {entry.name: getattr(args, entry.name) for entry in SERVICES})


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, not {port}")  # 0 would hide the address
    return port


if __name__ == "__main__":
    sys.exit(main())
