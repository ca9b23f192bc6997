"""The gateway's test rig: the real CommitLog, Transaction and gateway services as processes on 127.0.0.1
free ports, in either deployment (``MODES``): "cluster", the gateway as its own process, or "local", the
gateway served by the commit log process (``--gateway-port``); and the official RocketMQ 5 clients (Python
and Node, pinned) in subprocesses driven by JSON lines (tests/clients/python/rmq_driver.py,
tests/clients/node/driver.js).

``make test`` installs the clients first (``make rmq-clients``: the Python client into .venv-rmq from
requirements-rmq-client.lock, the Node client with ``npm ci`` into tests/clients/node/node_modules). A
missing client fails the test with that instruction: it is never skipped.

Every process a test starts is stopped: the rig and each client are context managers. The clients
write their logs under $HOME/logs, so HOME is the test's own directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import shutil
import socket
import subprocess
import threading
import time
from typing import Iterator

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc
from mqstore_rpc.auth import BearerToken
from tests.support.processes import COMMITLOG, ServiceProcess

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY_CLIENT = ROOT / ".venv-rmq" / "bin" / "python"
PY_DRIVER = ROOT / "tests" / "clients" / "python" / "rmq_driver.py"
NODE_DIR = ROOT / "tests" / "clients" / "node"
NODE_DRIVER = NODE_DIR / "driver.js"
TOKEN = "gateway-test-token"
CALL_TIMEOUT_S = 90      # one client command (a receive long-polls up to its await time on a loaded machine)
RPC_TIMEOUT_S = 10
CLIENTS = ("python", "node")
MODES = ("cluster", "local")   # the gateway as its own process, or inside the commit log process
# The gateway and the Transaction service both inside the commit log process (--txn-port, no --gateway-txn)
ALL_LOCAL = "all-local"
# The Transaction service asks about a transaction open for 1 s, every 2 s: check-back within seconds.
FAST_CHECKS = ("--transaction-timeout-ms", "1000", "--check-interval-ms", "2000", "--check-scan-interval-ms", "200",
               "--op-batch-interval-ms", "50")


def client_command(kind: str, endpoint: str) -> list[str]:
    if kind == "python":
        if not PY_CLIENT.exists():
            pytest.fail(f"the RocketMQ Python client is not installed ({PY_CLIENT}): run `make rmq-clients`")
        return [str(PY_CLIENT), str(PY_DRIVER), endpoint]
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
        pytest.fail(f"node or the RocketMQ Node client is missing ({NODE_DIR}/node_modules): install Node.js "
                    f">= 16.19 and run `make rmq-clients`")
    return [node, str(NODE_DRIVER), endpoint]


class ClientDriver:
    """One official client in a subprocess. ``call(op, **fields)`` sends a command and returns its reply
    (AssertionError when it failed, unless ``expect_error``; None: either way); ``events`` holds the checks
    it answered."""

    def __init__(self, kind: str, endpoint: str, home: pathlib.Path, credentials: tuple[str, str] | None = None):
        self.kind = kind
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HOME": str(home)}
        if credentials is not None:  # an SDK key: the client signs every request with it
            env.update(RMQ_ACCESS_KEY=credentials[0], RMQ_SECRET_KEY=credentials[1])
        self.process = subprocess.Popen(client_command(kind, endpoint), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env)
        self.replies: queue.Queue[dict] = queue.Queue()
        self.events: queue.Queue[dict] = queue.Queue()
        self.stderr_lines: list[str] = []
        self.sent_ids: list[str] = []   # every "sent" event's message id (send_stream), in order
        self._ids = 0
        self._out = threading.Thread(target=self._read_stdout, name=f"{kind}-client-stdout", daemon=True)
        self._out.start()
        self._err = threading.Thread(target=lambda: self.stderr_lines.extend(self.process.stderr),
                                     name=f"{kind}-client-stderr", daemon=True)
        self._err.start()
        ready = self._next(self.events, 60, "the client to start")
        assert ready.get("event") == "ready", ready

    def _read_stdout(self) -> None:
        for line in self.process.stdout:
            item = json.loads(line)
            if item.get("event") == "sent":
                self.sent_ids.append(item["message_id"])
            (self.events if "event" in item else self.replies).put(item)

    def _next(self, source: queue.Queue, timeout_s: float, what: str) -> dict:
        try:
            return source.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"{self.kind} client: no answer within {timeout_s} s waiting for {what} (exit "
                                 f"code {self.process.poll()}); stderr:\n{''.join(self.stderr_lines[-40:])}") from None

    def call(self, op: str, *, expect_error: bool | None = False, timeout_s: float = CALL_TIMEOUT_S,
             **fields) -> dict:
        self.begin(op, **fields)
        return self.reply(op, expect_error=expect_error, timeout_s=timeout_s)

    def begin(self, op: str, **fields) -> None:
        """Send a command without waiting: ``reply()`` takes its answer (commands run one at a time)."""
        self._ids += 1
        self.process.stdin.write(json.dumps({"id": self._ids, "op": op, **fields}) + "\n")
        self.process.stdin.flush()

    def reply(self, op: str = "the last command", *, expect_error: bool | None = False,
              timeout_s: float = CALL_TIMEOUT_S) -> dict:
        """The answer to the last command; ``expect_error`` None: either outcome (the caller looks)."""
        reply = self._next(self.replies, timeout_s, op)
        assert reply["id"] == self._ids, reply
        if expect_error is None:  # either outcome: the caller reads reply["ok"]
            return reply
        if expect_error:
            assert not reply["ok"], f"{self.kind} {op} should have failed: {reply}"
        else:
            assert reply["ok"], f"{self.kind} {op} failed: {reply}"
        return reply

    def next_event(self, timeout_s: float = CALL_TIMEOUT_S, kind: str = "check") -> dict:
        """The next event of ``kind`` (others before it are dropped)."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._next(self.events, max(0.0, deadline - time.monotonic()), f"a {kind} event")
            if event.get("event") == kind:
                return event

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.call("shutdown", timeout_s=30)
            except AssertionError:
                pass  # a client that cannot shut down is killed below: the test has its own assertions
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream and not stream.closed:
                stream.close()

    def __enter__(self) -> "ClientDriver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def free_port() -> int:
    """A port free now (Local mode: the commit log is told the Transaction service's port before that
    service, which reads the log, can start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Stack:
    """CommitLog, Transaction and gateway processes over one data directory. ``restart_gateway()`` and
    ``restart_commitlog()`` bring a killed one back on the same port. In Local mode ``gateway`` is the
    commit log process (it serves the gateway), so both restarts restart it; ``gateway_args`` are given
    to it as ``--gateway-*`` flags. In ``ALL_LOCAL`` mode the commit log process serves the Transaction
    service too (``txn_args`` as ``--txn-*`` flags) and its gateway finds it without ``--gateway-txn``."""

    def __init__(self, tmp: pathlib.Path, gateway_args: tuple[str, ...] = (), txn_args: tuple[str, ...] = FAST_CHECKS,
                 auth: bool = False, mode: str = "cluster"):
        assert mode in (*MODES, ALL_LOCAL), mode
        self.tmp, self.gateway_args, self.txn_args, self.auth, self.mode = tmp, gateway_args, txn_args, auth, mode
        self.env = {"MQSTORE_INTERNAL_TOKEN": TOKEN}
        if auth:  # one auth database and kek file for every service; the rig calls as `service`
            self.env.update(MQSTORE_AUTH="on", MQSTORE_AUTH_URL=f"sqlite:///{tmp / 'auth.db'}",
                            MQSTORE_AUTH_KEK_FILE=str(tmp / "auth.kek"), MQSTORE_AUTH_REFRESH_MS="200")
        self.commitlog = self.txn = self._gateway_process = None
        self.commitlog_port = self.gateway_port = self.txn_port = 0
        self.more_gateways: list[ServiceProcess] = []   # another_gateway()'s, stopped with the rest

    @property
    def gateway(self) -> ServiceProcess | None:
        return self._gateway_process if self.mode == "cluster" else self.commitlog

    @property
    def txn_address(self) -> str:
        return f"127.0.0.1:{self.txn_port}" if self.mode == ALL_LOCAL else self.txn.address

    def start(self) -> "Stack":
        self.txn_port = free_port() if self.mode != "cluster" else 0
        self.commitlog = self._commitlog(0)
        self.commitlog_port = int(self.commitlog.address.rsplit(":", 1)[1])
        if self.mode == ALL_LOCAL:
            return self
        self.txn = ServiceProcess("txn_service.main", ["--data-dir", str(self.tmp / "txn"), "--port",
                                                       str(self.txn_port), "--grace-s", "1", "--commitlog",
                                                       self.commitlog.address, *self.txn_args],
                                  self.env).started().serving()
        if self.mode == "cluster":
            self._gateway_process = self._gateway(0)
            self.gateway_port = int(self._gateway_process.address.rsplit(":", 1)[1])
        return self

    def _commitlog(self, port: int) -> ServiceProcess:
        args = ["--data-dir", str(self.tmp / "log"), "--port", str(port), "--grace-s", "1"]
        if self.mode == "cluster":
            return ServiceProcess(COMMITLOG, args, self.env).started()
        local = [a.replace("--", "--gateway-", 1) if a.startswith("--") else a for a in self.gateway_args]
        if self.mode == ALL_LOCAL:
            local += ["--txn-port", str(self.txn_port),
                      *(a.replace("--", "--txn-", 1) if a.startswith("--") else a for a in self.txn_args)]
        else:
            local += ["--gateway-txn", f"127.0.0.1:{self.txn_port}"]
        process = ServiceProcess(COMMITLOG, [
            *args, "--gateway-port", str(self.gateway_port), "--gateway-rpc-timeout-ms", "5000", *local], self.env)
        try:
            event = process.wait_for("server.started")
        except BaseException:
            process.stop()
            raise
        if self.mode == ALL_LOCAL:  # the Transaction port is ready once it has read the log (its own health)
            process.address = f"127.0.0.1:{event['ports']['txn']}"
            process.serving()
        process.address = f"127.0.0.1:{event['port']}"
        self.gateway_port = event["ports"]["gateway"]
        return process

    def _gateway(self, port: int) -> ServiceProcess:
        return ServiceProcess("gateway_service.main", [
            "--port", str(port), "--grace-s", "1", "--commitlog", self.commitlog.address, "--txn", self.txn.address,
            "--rpc-timeout-ms", "5000", *self.gateway_args], self.env).started()

    def another_gateway(self) -> ServiceProcess:
        """One more gateway process (Cluster mode) on a free port, to the same commit log and Transaction
        service: two gateways as ``make run-ha`` runs them."""
        assert self.mode == "cluster", "Local mode's gateway is the commit log process's"
        process = self._gateway(0)
        self.more_gateways.append(process)
        return process

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def restart_gateway(self) -> None:
        if self.mode != "cluster":
            self.restart_commitlog()
            return
        self._gateway_process.stop()
        self._gateway_process = self._gateway(self.gateway_port)

    def restart_commitlog(self) -> None:
        self.commitlog.stop()
        self.commitlog = self._commitlog(self.commitlog_port)

    def client(self, kind: str, name: str = "", credentials: tuple[str, str] | None = None,
               endpoint: str = "") -> ClientDriver:
        """An official client of ``endpoint`` (default: the gateway's; ``a;b``: several gateways)."""
        return ClientDriver(kind, endpoint or self.endpoint, self.tmp / f"home-{kind}-{name or time.monotonic_ns()}",
                            credentials)

    def channel(self) -> grpc.Channel:
        """A channel to the CommitLog server; with auth on, calling as ``service`` (a super user)."""
        channel = grpc.insecure_channel(self.commitlog.address)
        if self.auth:
            channel = grpc.intercept_channel(channel, BearerToken("service", TOKEN))
        return channel

    @contextlib.contextmanager
    def log_stub(self) -> Iterator[commitlog_pb2_grpc.CommitLogStub]:
        channel = self.channel()
        try:
            yield commitlog_pb2_grpc.CommitLogStub(channel)
        finally:
            channel.close()

    def create_topic(self, name: str, queues: int = 4) -> None:
        with self.log_stub() as stub:
            stub.CreateTopic(cpb.CreateTopicRequest(name=name, queue_count=queues), timeout=RPC_TIMEOUT_S)

    def visible(self, topic: str, queues: int = 4) -> list:
        """Every message a consumer can Pull from ``topic`` (all queues)."""
        out = []
        with self.log_stub() as stub:
            for queue_id in range(queues):
                offset = 0
                while True:
                    r = stub.Pull(cpb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=1000),
                                  timeout=RPC_TIMEOUT_S)
                    out += r.messages
                    if not r.messages:
                        break
                    offset = r.next_offset
        return out

    def stop(self) -> None:
        for process in (*self.more_gateways, self._gateway_process, self.txn, self.commitlog):
            if process is not None:
                process.stop()


@contextlib.contextmanager
def stack(tmp: pathlib.Path, **kwargs) -> Iterator[Stack]:
    rig = Stack(tmp, **kwargs)
    try:
        yield rig.start()
    finally:
        rig.stop()
