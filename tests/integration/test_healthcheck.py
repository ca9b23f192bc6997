"""``python -m mqstore_rpc.healthcheck`` (the container health check) against a real gRPC server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from mqstore_rpc import healthcheck
from mqstore_rpc.server import ServerConfig, create_server

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 30


@pytest.fixture
def server():
    """A bound, started server whose health is NOT_SERVING until the test marks it serving."""
    srv = create_server(ServerConfig(port=0, grace_s=0.5))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def test_port_comes_from_mqstore_port_as_the_service_reads_it(server, capsys):
    env = {"MQSTORE_PORT": str(server.port)}
    assert healthcheck.main([], env=env) == 1
    assert "NOT_SERVING" in capsys.readouterr().out
    server.mark_serving()
    done = subprocess.run([sys.executable, "-m", "mqstore_rpc.healthcheck"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip() == f"127.0.0.1:{server.port} (server): SERVING"
    assert healthcheck.main(["--address", f"127.0.0.1:{server.port}", "--service", "no.such.Service"], env={}) == 1


def test_nothing_listening_or_no_port_fails(capsys):
    assert healthcheck.main(["--address", f"127.0.0.1:{closed_port()}", "--timeout-s", "2"], env={}) == 1
    assert "UNREACHABLE: " in capsys.readouterr().out
    for bad in ({}, {"MQSTORE_PORT": "fifty"}, {"MQSTORE_PORT": "0"}):
        with pytest.raises(SystemExit) as usage:
            healthcheck.main([], env=bad)
        assert usage.value.code == 2
