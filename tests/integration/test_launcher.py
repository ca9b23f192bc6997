"""``make run``'s launcher (python -m mqstore_launcher) starting real services: a port that cannot be
bound stops it before anything starts; a child that fails to start is named with its last log lines,
the others are stopped and "mqstore is running" is never printed; a server of someone else on a child's
port is not taken for the child. (The launcher that works: tests/integration/test_readme.py.)"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from mqstore_launcher import launcher
from mqstore_launcher.child import Child, StartFailed, free_port, port_problems

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCHER_TIMEOUT_S = 240  # five services start and stop on a loaded 2-core machine
STARTED = re.compile(r"^starting (\w+) on 127\.0\.0\.1:(\d+) \(pid (\d+)\)$", re.M)


def run_launcher(data_dir: pathlib.Path, ports: dict[str, int], env: dict[str, str] | None = None):
    command = [sys.executable, "-m", "mqstore_launcher", "--data-dir", str(data_dir)]
    for name, port in ports.items():
        command += [f"--{name}-port", str(port)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=LAUNCHER_TIMEOUT_S,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def free_ports_for_all(besides: int = 0) -> dict[str, int]:
    """A distinct free port for each service, none of them ``besides``."""
    ports: dict[str, int] = {}
    while len(set(ports.values()) - {besides}) < len(launcher.SERVICES):
        ports = {e.name: free_port() for e in launcher.SERVICES}
    return ports


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def listening(port: int = 0):
    """A socket listening on 127.0.0.1 (a program that holds the port); yields its port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_port_in_use_stops_the_launcher_before_it_starts_anything(tmp_path):
    with listening() as taken:
        ports = free_ports_for_all(besides=taken)
        ports["compactor"] = taken
        done = run_launcher(tmp_path / "data", ports)
    assert done.returncode == 1, done.stderr
    assert f"port {taken} of compactor on 127.0.0.1 is in use" in done.stderr
    assert "--compactor-port" in done.stderr and "RUN_ARGS=" in done.stderr
    assert "starting" not in done.stdout and not (tmp_path / "data").exists()  # nothing started, nothing made


def test_port_problems_name_each_port_in_use_and_a_port_asked_twice():
    with listening() as taken:
        free = free_port()
        problems = port_problems([("commitlog", free), ("index", taken), ("txn", free)])
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"port {taken} of index on 127.0.0.1 is in use")
    assert problems[1] == f"port {free} is asked for both commitlog and txn: give txn another one with --txn-port"


def test_a_child_that_fails_to_start_is_named_and_the_others_are_stopped(tmp_path):
    ports = free_ports_for_all()
    # Read by the compactor only: it refuses the setting and exits 2 while the others start fine.
    done = run_launcher(tmp_path / "data", ports, env={"MQSTORE_DELETE_RETENTION_MS": "-1"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "mqstore is running" not in done.stdout
    assert f"mqstore did not start: compactor (127.0.0.1:{ports['compactor']}) exited with status 2" in done.stderr
    report = done.stderr[done.stderr.index("mqstore did not start"):]
    assert "config.invalid" in report and "delete_retention_ms" in report  # its last log lines
    started = {name: int(pid) for name, _, pid in STARTED.findall(done.stdout)}
    assert set(started) == {"commitlog", "index", "txn", "compactor", "gateway"}, done.stdout
    assert [name for name, pid in started.items() if alive(pid)] == []
    assert port_problems(list(ports.items())) == []  # every port free again


class _ForeignHealth:
    """Someone else's gRPC server on a port: health says SERVING for everything, even our names."""

    def __init__(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        servicer = health.HealthServicer()
        for name in ("", "mqstore.v1.Compactor"):
            servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_a_server_of_someone_else_on_the_port_is_not_taken_for_the_child(tmp_path):
    foreign = _ForeignHealth()
    service = launcher.services({"compactor": foreign.port})[3]
    child = Child(service.name, service.entry.grpc_service, service.port, service.command(tmp_path), dict(os.environ))
    try:
        with pytest.raises(StartFailed) as failed:
            child.wait_ready(threading.Event(), LAUNCHER_TIMEOUT_S)
        message = str(failed.value)
        assert message.startswith(f"compactor (127.0.0.1:{foreign.port}) exited with status 1 before serving")
        assert "server.start_failed" in message and "cannot bind" in message
    finally:
        child.stop()
        foreign.server.stop(None)
