"""Which codec a CommitLog process uses, and that it says so (mqstore.codec).

A real server process: GetStoreInfo's ``codec`` and ``mqstore store-info`` name the codec in use; with
MQSTORE_PURE_PYTHON=1 that is "python" and the process logs ``codec.pure_python`` exactly once, with
the reason. Append through gRPC (valid and refused batches) gives the same stored bytes and errors on
both codecs: run here once per codec, each in its own process. A package built without a C compiler
still builds (pip wheel with CC=false) and holds no extension.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import grpc
import pytest

from mqstore import codec
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from tests.integration.test_cli import MQSTORE
from tests.support.processes import ServiceProcess, commitlog

pytestmark = [pytest.mark.integration, pytest.mark.codec]

ROOT = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60
RPC_TIMEOUT_S = 10
BUILD_TIMEOUT_S = 300
EXPECTED = {"": codec.COMPILED, "1": codec.PYTHON}  # MQSTORE_PURE_PYTHON -> the codec a built package uses


def _require_built() -> None:
    """The extension must be built here (whatever MQSTORE_PURE_PYTHON says for this process)."""
    try:
        from mqstore.codec import _records  # noqa: F401 - only whether it imports
    except ImportError as exc:
        pytest.fail(f"the compiled codec is not built here ({exc}): run make setup with a C compiler")


def _process(data_dir: pathlib.Path, pure: str) -> ServiceProcess:
    """A CommitLog process (small sparse segments) with MQSTORE_PURE_PYTHON set to ``pure``."""
    return commitlog(data_dir, "--segment-size-bytes", "64KiB", "--preallocate-segments", "false",
                     env={codec.ENV_PURE_PYTHON: pure})


@pytest.fixture(params=["", "1"], ids=["compiled", "pure-python"])
def served(request, tmp_path):
    """A CommitLog process with MQSTORE_PURE_PYTHON unset or 1; yields (process, stub, expected codec)."""
    if request.param == "":
        _require_built()
    with _process(tmp_path / "data", request.param) as srv:
        srv.started(START_TIMEOUT_S)
        with grpc.insecure_channel(srv.address) as channel:
            yield srv, commitlog_pb2_grpc.CommitLogStub(channel), EXPECTED[request.param]


def test_store_info_and_the_cli_name_the_codec_and_the_python_path_warns_once(served):
    srv, stub, expected = served
    assert stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).codec == expected
    done = subprocess.run([str(MQSTORE), "--address", srv.address, "store-info"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert f"codec: {expected}" in done.stdout.splitlines()
    stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=RPC_TIMEOUT_S)
    stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"x")]), timeout=RPC_TIMEOUT_S)
    srv.stop()
    warnings = [line for line in srv.lines if '"codec.pure_python"' in line]
    if expected == codec.PYTHON:
        assert len(warnings) == 1 and codec.ENV_PURE_PYTHON in warnings[0], srv.stderr()
    else:
        assert warnings == []


def _append(stub, request: pb.AppendRequest):
    try:
        return stub.Append(request, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


# Valid and refused batches: each codec must answer them alike (the refused ones with the same
# status and message, storing nothing of the batch).
REQUESTS = [
    pb.AppendRequest(topic="t", messages=[
        common_pb2.MessageInput(body=b"a" * 100, tags="tg", keys=["k1", "k2"], properties={"b": "2", "a": "1"},
                                flag=3, born_timestamp_ms=1_700_000_000_000, queue_id=1),
        common_pb2.MessageInput(body=b"b", sharding_key="s", properties={"UNIQ_KEY": "U1"}),
        common_pb2.MessageInput(body=b"c", born_timestamp_ms=5)]),
    pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"ok"),
                                          common_pb2.MessageInput(body=b"x", tags="a", properties={"TAGS": "b"})]),
    pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"")]),
    pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"x", keys=["has space"])]),
    pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"x", queue_id=9)]),
    pb.AppendRequest(topic="nope", messages=[common_pb2.MessageInput(body=b"x")]),
    pb.AppendRequest(topic="t"),
    pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"d", keys=["k3"])]),
]


def _run_requests(data_dir: pathlib.Path, pure: str) -> list:
    """Each request's outcome (results or status and message), then every stored message as pulled."""
    with _process(data_dir, pure) as srv:
        srv.started(START_TIMEOUT_S)
        with grpc.insecure_channel(srv.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=RPC_TIMEOUT_S)
            outcomes = []
            for request in REQUESTS:
                got = _append(stub, request)
                if isinstance(got, pb.AppendResponse):
                    got = [(r.queue_id, r.queue_offset, r.physical_offset, r.size_bytes) for r in got.results]
                outcomes.append(got)
            for queue_id in (0, 1):
                pull = stub.Pull(pb.PullRequest(topic="t", queue_id=queue_id, offset=0, max_messages=100),
                                 timeout=RPC_TIMEOUT_S)
                # UNIQ_KEY differs between processes (its pid and random part); everything else must not.
                outcomes += [(m.queue_offset, m.physical_offset, m.body, m.tags, list(m.keys), m.flag,
                              sorted((k, v) for k, v in m.properties.items() if k != "UNIQ_KEY"))
                             for m in pull.messages]
            return outcomes


def test_append_through_grpc_stores_and_refuses_alike_on_both_codecs(tmp_path):
    _require_built()
    compiled = _run_requests(tmp_path / "compiled", "")
    assert _run_requests(tmp_path / "python", "1") == compiled
    assert len(compiled[0]) == 3 and len(compiled[7]) == 1  # the two valid batches were stored
    assert all(isinstance(outcome[0], grpc.StatusCode) for outcome in compiled[1:7]), compiled[1:7]


@pytest.mark.slow
def test_a_build_without_a_c_compiler_gives_a_package_without_the_extension(tmp_path):
    """pip builds the wheel with CC=false: the build warns and the wheel holds no compiled module."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("core", "services"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("*.so", "__pycache__", "build"))
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    env.pop("MQSTORE_REQUIRE_COMPILED", None)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(tmp_path / "dist"), str(source)], capture_output=True, text=True,
                          env=env, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the compiled codec did not build" in done.stdout + done.stderr
    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mqstore/codec/__init__.py" in names
    assert not [n for n in names if n.endswith(".so")], names
