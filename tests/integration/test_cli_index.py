"""``mqstore query key|id|time`` and ``mqstore index-stats`` as subprocesses against a real CommitLog
server and a real Index server (in this process, 127.0.0.1, port 0)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading
import time

import grpc
import pytest
from commitlog_service.main import CommitLogConfig
from commitlog_service.main import serving as commitlog_serving
from mqstore.index.config import IndexConfig
from mqstore.index.follower import FollowerConfig
from index_service.main import IndexServiceConfig, serving
from mqstore.config import StoreConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import (
    commitlog_pb2_grpc,
    common_pb2,
    index_pb2,
    index_pb2_grpc,
)
from mqstore_rpc.server import ServerConfig

pytestmark = pytest.mark.integration

MQSTORE = pathlib.Path(sys.executable).with_name("mqstore")
CLI_TIMEOUT_S = 60
WAIT_S = 30


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(commitlog address, index address, append results) with topic "cli" indexed."""
    root = tmp_path_factory.mktemp("cli-index")
    log_config = CommitLogConfig(store=StoreConfig(data_dir=root / "log", segment_size_bytes=64 * 1024,
                                                   preallocate_segments=False), server=ServerConfig(port=0, grace_s=1))
    with commitlog_serving(log_config) as (_, log_port):
        # Small index files (the default's first file is 400 MB, allocated for real).
        index = IndexConfig(root / "index", slot_count=1000, entry_count=4000)
        index_config = IndexServiceConfig(index=index, server=ServerConfig(port=0, grace_s=1),
                                          commitlog_address=f"127.0.0.1:{log_port}",
                                          follower=FollowerConfig(heartbeat_ms=50))
        with serving(index_config) as (_, index_port), grpc.insecure_channel(f"127.0.0.1:{log_port}") as ch, \
                grpc.insecure_channel(f"127.0.0.1:{index_port}") as ich:
            log = commitlog_pb2_grpc.CommitLogStub(ch)
            log.CreateTopic(pb.CreateTopicRequest(name="cli", queue_count=1), timeout=10)
            results = list(log.Append(pb.AppendRequest(topic="cli", messages=[
                common_pb2.MessageInput(body=b"m%d" % i, keys=["order-%d" % (i % 2)]) for i in range(6)]),
                timeout=10).results)
            end = log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10).visible_physical_offset
            index = index_pb2_grpc.IndexStub(ich)
            deadline, pause = time.monotonic() + WAIT_S, threading.Event()
            while index.Stats(index_pb2.IndexStatsRequest(), timeout=10).indexed_physical_offset < end:
                assert time.monotonic() < deadline, "the index did not catch up"
                pause.wait(0.02)
            yield f"127.0.0.1:{log_port}", f"127.0.0.1:{index_port}", results


def run(*args: str, expect: int | None = 0, env=None) -> subprocess.CompletedProcess:
    """``expect=None`` accepts any exit status."""
    done = subprocess.run([str(MQSTORE), *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)
    assert expect is None or done.returncode == expect, \
        f"mqstore {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done


def test_query_key_pages_and_json(servers):
    _, index, results = servers
    first = run("--index-address", index, "query", "key", "cli", "order-1", "--max", "2")
    lines = first.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [results[5].msg_id, results[3].msg_id]
    assert "next page: " in first.stderr
    token = first.stderr.rsplit("next page: ", 1)[1].strip()
    rest = run("query", "key", "cli", "order-1", "--page-token", token, "--index-address", index)
    assert [line.split()[0] for line in rest.stdout.splitlines()] == [results[1].msg_id]
    [page] = [json.loads(x) for x in run("--json", "--index-address", index, "query", "key", "cli", "order-0",
                                         "--all", "--max", "10", "--messages").stdout.splitlines()]
    assert [loc["msg_id"] for loc in page["locators"]] == [results[i].msg_id for i in (4, 2, 0)]
    assert page["messages"][0]["keys"] == ["order-0"]


def test_query_id_time_and_stats(servers):
    _, index, results = servers
    by_id = run("--index-address", index, "query", "id", "cli", results[2].uniq_key, "--messages").stdout
    assert by_id.split()[0] == results[2].msg_id and "body=m2" in by_id
    missing = run("--index-address", index, "query", "id", "cli", "NOPE", expect=1)
    assert missing.stderr.startswith("error: NOT_FOUND: ")
    offset = run("--index-address", index, "query", "time", "cli", "0", str(results[3].store_timestamp_ms)).stdout
    assert int(offset) == min(r.queue_offset for r in results if r.store_timestamp_ms >= results[3].store_timestamp_ms)
    [stats] = [json.loads(x) for x in run("--json", "index-stats", env={"MQSTORE_INDEX_ADDRESS": index,
                                                                         "PATH": ""}).stdout.splitlines()]
    assert stats["connected"] is True and int(stats["records_indexed"]) == 6


def test_send_prints_both_ids_and_each_works_where_it_belongs(servers):
    """``send`` labels the offset msg id (for ``get``) and the UNIQ_KEY (for ``query id``), also in --json."""
    log, index, _ = servers
    line = run("--address", log, "send", "cli", "both-ids", "--key", "both").stdout.strip()
    fields = dict(part.split("=", 1) for part in line.split("  ") if "=" in part)
    assert set(fields) >= {"msg_id", "uniq_key", "queue", "offset"} and fields["msg_id"] != fields["uniq_key"], line
    [as_json] = [json.loads(x) for x in run("--json", "--address", log, "send", "cli", "both-json").stdout.splitlines()]
    assert len(as_json["msg_id"]) == 32 and len(as_json["uniq_key"]) == 32 and as_json["msg_id"] != as_json["uniq_key"]

    assert "body: both-ids" in run("--address", log, "get", fields["msg_id"]).stdout
    deadline, pause = time.monotonic() + WAIT_S, threading.Event()
    while True:  # the index follows the log asynchronously
        found = run("--index-address", index, "query", "id", "cli", fields["uniq_key"], expect=None)
        if found.returncode == 0 or time.monotonic() > deadline:
            break
        pause.wait(0.05)
    assert found.returncode == 0 and found.stdout.split()[0] == fields["msg_id"], found.stderr
