"""The processes of ``make run`` (mqstore_launcher.launcher): checking ports before anything starts, and
knowing that the server answering on a port is the child the launcher started.

A port's answer alone proves nothing: another program (another ``make run``, someone's server) may hold
the port while the child fails to bind it, and a health probe would reach that other server. So a
:class:`Child` trusts only its own process: it reads the child's output (its JSON log lines on stderr,
and stdout with them) line by line, appends each to the child's log file (``log_path``: the launcher
keeps its terminal for its own lines) or, without one, copies it to the launcher's stderr, and watches
for the ``server.started`` event carrying the child's own pid, which the service logs only once it has
bound its port (``grpc.so_reuseport`` off: no other server shares it) and is serving. Only then does it
ask gRPC health, for the child's own gRPC service name (``mqstore.v1.Compactor``, ...), and requires
SERVING. It keeps the child's last log lines for the report when the child fails to start (the lines
of this run: a log file keeps those of earlier runs too).
"""

from __future__ import annotations

import collections
import errno
import json
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Mapping, Sequence, TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mqstore import defaults

HOST = defaults.HOST
STOP_TIMEOUT_S = 30.0       # SIGTERM, then this long before SIGKILL
POLL_INTERVAL_S = 0.1
HEALTH_TIMEOUT_S = 5.0
LOG_TAIL_LINES = 15


class StartFailed(Exception):
    """A child did not come up; the message names it, says why and quotes its last log lines."""


def port_problems(wanted: Sequence[tuple[str, int]], make_target: str = "run") -> list[str]:
    """For each (service name, port) that cannot be bound on HOST now, a line naming the port, the service
    and the flag that moves it (``make <make_target> RUN_ARGS=...``); empty when every port is free. Binds
    with SO_REUSEADDR, as gRPC does, so a connection of an earlier run in TIME_WAIT is not taken for a
    server."""
    problems: list[str] = []
    seen: dict[int, str] = {}
    for name, port in wanted:
        if port in seen:
            problems.append(f"port {port} is asked for both {seen[port]} and {name}: give {name} another one "
                            f"with --{name}-port")
            continue
        seen[port] = name
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((HOST, port))
            except OSError as exc:
                why = "is in use (another mqstore, or another program)" if exc.errno == errno.EADDRINUSE \
                    else f"cannot be bound ({exc.strerror})"
                problems.append(f"port {port} of {name} on {HOST} {why}: choose another with --{name}-port N, "
                                f"e.g. make {make_target} RUN_ARGS=\"--{name}-port {free_port()}\"")
    return problems


def free_port() -> int:
    """A port that is free on HOST right now (for a suggestion; nothing keeps it free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class Child:
    """One service process, in its own session (Ctrl-C in the terminal reaches only the launcher).

    ``log_path``: the file its output is appended to (created with its directory; None: the launcher's
    stderr, ``err``).

    Thread-safety: a reader thread (``<name>-output``) copies the output and records the start event; every
    other method is for the launcher's main thread.
    """

    def __init__(self, name: str, grpc_service: str, port: int, command: Sequence[str],
                 env: Mapping[str, str] | None = None, err: TextIO | None = None,
                 channel: Callable[[str], grpc.Channel] = grpc.insecure_channel,
                 log_path: pathlib.Path | None = None):
        self.name, self.grpc_service, self.port = name, grpc_service, port
        self.log_path = log_path
        self._channel = channel  # how the health probe connects (TLS when the launcher's --tls)
        self._report = err if err is not None else sys.stderr  # the launcher's own lines
        self._output = self._report  # where the child's output goes
        if log_path is not None:
            log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._output = open(log_path, "a", encoding="utf-8", errors="backslashreplace")  # closed by stop()
        self._tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._started = threading.Event()
        self._started_port: int | None = None
        self.process = subprocess.Popen(list(command), start_new_session=True, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="backslashreplace")
        self._reader = threading.Thread(target=self._copy_output, name=f"{name}-output", daemon=True)
        self._reader.start()

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def _copy_output(self) -> None:
        copying = True
        for line in self.process.stdout:
            if copying:
                try:
                    self._output.write(line)
                    self._output.flush()
                except (OSError, ValueError) as exc:  # our stderr or the file failed (a closed pipe, a full
                    copying = False                    # disk): keep draining the child's, so it never blocks
                    self._tail.append(f"(writing its log failed: {exc}; not copying further lines)\n")
            self._tail.append(line)
            if not self._started.is_set() and '"server.started"' in line:
                self._note_start(line)

    def _note_start(self, line: str) -> None:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return  # a line that merely mentions the event: not the service's own log
        if event.get("event") == "server.started" and event.get("pid") == self.process.pid:
            self._started_port = event.get("port")
            self._started.set()

    def last_lines(self) -> str:
        lines = list(self._tail)
        return "".join(f"    {line}" for line in lines) if lines else "    (it logged nothing)\n"

    def _failed(self, why: str) -> StartFailed:
        return StartFailed(f"{self.name} ({self.address}) {why}. Its last log lines:\n{self.last_lines()}")

    def wait_ready(self, stop: threading.Event, timeout_s: float) -> bool:
        """True once this child has logged ``server.started`` with its own pid and port and answers health
        SERVING for its gRPC service; False if ``stop`` was set first. StartFailed when it exited, bound
        another port, was not SERVING, or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while not self._started.wait(POLL_INTERVAL_S):
            if stop.is_set():
                return False
            if self.process.poll() is not None:
                self._reader.join(STOP_TIMEOUT_S)  # its last lines, for the report
                raise self._failed(f"exited with status {self.process.returncode} before serving")
            if time.monotonic() > deadline:
                raise self._failed(f"logged no server.started within {timeout_s:.0f} s")
        if self._started_port != self.port:
            raise self._failed(f"bound port {self._started_port}, not {self.port}")
        while True:
            status = self._health()
            if status == health_pb2.HealthCheckResponse.SERVING:
                return True
            if self.process.poll() is not None:
                raise self._failed(f"exited with status {self.process.returncode} right after it started")
            if time.monotonic() > deadline:
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                raise self._failed(f"started, but its health is {name}")
            if stop.wait(POLL_INTERVAL_S):
                return False

    def _health(self) -> int:
        with self._channel(self.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=self.grpc_service), timeout=HEALTH_TIMEOUT_S)
            except grpc.RpcError as exc:  # e.g. DEADLINE_EXCEEDED on a machine under load: ask again
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                return health_pb2.HealthCheckResponse.UNKNOWN
            return reply.status

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._report.write(f"{self.name} did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM; killing it\n")
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._reader.join(STOP_TIMEOUT_S)
        self.process.stdout.close()
        if self.log_path is not None and not self._reader.is_alive():
            self._output.close()
        return self.process.returncode
