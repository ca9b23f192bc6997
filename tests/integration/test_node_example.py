"""The Node.js example of README.md ("Other languages"), ``node examples/node/example.js``, run as written
against a real CommitLog server process (127.0.0.1, port 0): it loads protos/ with keepCase and longs as
strings, creates a topic, appends two messages with keys and pulls them back. Skipped only where
``node`` is not installed; its packages come from ``make setup`` (``npm ci`` in examples/node)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc
from tests.support.processes import commitlog

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "node"
NODE = shutil.which("node")
RUN_TIMEOUT_S = 120
STACK_TRACE = re.compile(r"^\s+at \S.*:\d+:\d+\)?$", re.M)  # a Node stack frame


@pytest.fixture
def server(tmp_path):
    srv = commitlog(tmp_path / "data", "--segment-size-bytes", "64KiB", "--preallocate-segments", "false")
    try:
        yield srv.started()
    finally:
        srv.stop()


def run_example(address: str, *args: str) -> subprocess.CompletedProcess:
    assert (EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir(), \
        "examples/node/node_modules is missing: run `make setup` (npm ci in examples/node)"
    return subprocess.run([NODE, "examples/node/example.js", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env={**os.environ, "MQSTORE_ADDRESS": address},
                          stdin=subprocess.DEVNULL)


@pytest.mark.skipif(NODE is None, reason="node is not installed: the Node.js example cannot run here")
def test_the_node_example_appends_with_keys_and_pulls_them_back(server):
    done = run_example(server.address)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # a clean run: nothing on stderr, no stack trace
    lines = done.stdout.splitlines()
    assert lines[0] == "created topic node-demo"
    appended = [re.fullmatch(r"appended msg_id=([0-9A-F]{32}) uniq_key=[0-9A-F]{32} queue=0 offset=(\d) "
                             r"DURABILITY_WRITTEN", line) for line in lines[1:3]]
    assert all(appended) and [m.group(2) for m in appended] == ["0", "1"], lines
    assert lines[3:] == [f"pulled 0:0 msg_id={appended[0].group(1)} keys=order-1 body=hello from node",
                         f"pulled 0:1 msg_id={appended[1].group(1)} keys=order-2,customer-7 body=second message",
                         "next_offset=2 max_offset=2"]
    with grpc.insecure_channel(server.address) as channel:  # what node wrote is what the store holds
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        pulled = stub.Pull(pb.PullRequest(topic="node-demo", queue_id=0, offset=0), timeout=30)
    assert [(m.body, list(m.keys), dict(m.properties).get("lang")) for m in pulled.messages] == [
        (b"hello from node", ["order-1"], None), (b"second message", ["order-2", "customer-7"], "en")]
    again = run_example(server.address)  # a second run finds the topic and appends after the first two
    assert again.returncode == 0 and again.stdout.startswith("topic node-demo exists already\n"), again.stderr
    assert "queue=0 offset=2 " in again.stdout


@pytest.mark.skipif(NODE is None, reason="node is not installed: the Node.js example cannot run here")
def test_the_node_example_prints_the_status_and_the_trailers_of_an_error(server):
    done = run_example(server.address, server.address, "bad name")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: INVALID_ARGUMENT: topic name 'bad name' has the illegal character")
    assert done.stderr.strip().endswith("(mqstore-error=InvalidArgument, mqstore-retriable=false)")
    assert STACK_TRACE.search(done.stderr) is None, done.stderr  # the error said in one line, no stack trace


def test_the_readmes_node_block_installs_the_packages_first():
    """README's Node.js block starts with the install step (a newcomer's first `node examples/node/example.js`
    failed with "Cannot find module '@grpc/grpc-js'"), a make target that exists."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("node examples/node/example.js") - 200:readme.index("node examples/node/example.js")]
    assert "```sh\nmake node-example " in block, block
    dry = subprocess.run(["make", "-n", "node-example"], cwd=ROOT, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)  # -n: says what it would run, installs nothing
    assert dry.returncode == 0, dry.stdout + dry.stderr
