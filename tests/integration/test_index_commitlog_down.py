"""What the Index service answers while the commit log is down (real processes on 127.0.0.1).

The index keeps a 32-bit hash of ``topic#key`` per entry, so every candidate is verified against its
message in the commit log. With the commit log process stopped:

* Stats answers (connected false, last_error says why);
* QueryByKey / QueryByUniqKey for a key without index entries answer from the index alone (empty page,
  NOT_FOUND);
* a query with candidates, even with include_messages=false, is UNAVAILABLE with a message naming the
  key, the commit log's address and when to retry; QueryByTime (answered by the commit log) likewise;
* after the commit log is back on the same port the same query answers again.

This is what README.md ("The Index service") and protos/mqstore/v1/index.proto promise.
"""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, index_pb2, index_pb2_grpc

from tests.support.processes import ServiceProcess, commitlog

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

RPC_TIMEOUT_S = 10
WAIT_S = 60
POLL_S = 0.05
TOPIC = "down"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_log(data_dir, port: int) -> ServiceProcess:
    return commitlog(data_dir, "--port", str(port), "--segment-size-bytes", "1MiB",
                     "--preallocate-segments", "false").started()


def start_index(data_dir, log_address: str) -> ServiceProcess:
    args = ["--data-dir", str(data_dir), "--port", "0", "--grace-s", "1", "--commitlog", log_address,
            "--heartbeat-ms", "50", "--backoff-initial-ms", "20", "--backoff-max-ms", "300",
            "--rpc-timeout-ms", "3000"]
    return ServiceProcess("index_service.main", args).started()


def wait_until(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        pause.wait(POLL_S)
    raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}")


def status_of(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


def test_index_answers_what_it_can_while_the_commitlog_is_stopped(tmp_path):
    port = free_port()
    log_address = f"127.0.0.1:{port}"
    log_proc = start_log(tmp_path / "log", port)
    index = start_index(tmp_path / "index", log_address)
    channels = [grpc.insecure_channel(log_address), grpc.insecure_channel(index.address)]
    log, idx = commitlog_pb2_grpc.CommitLogStub(channels[0]), index_pb2_grpc.IndexStub(channels[1])
    stats = lambda: idx.Stats(index_pb2.IndexStatsRequest(), timeout=RPC_TIMEOUT_S)  # noqa: E731
    query = lambda key, **kw: idx.QueryByKey(  # noqa: E731
        index_pb2.QueryByKeyRequest(topic=TOPIC, key=key, **kw), timeout=RPC_TIMEOUT_S)
    by_uniq = lambda uniq: idx.QueryByUniqKey(  # noqa: E731
        index_pb2.QueryByUniqKeyRequest(topic=TOPIC, uniq_key=uniq), timeout=RPC_TIMEOUT_S)
    try:
        log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=RPC_TIMEOUT_S)
        [appended] = log.Append(pb.AppendRequest(topic=TOPIC, messages=[
            common_pb2.MessageInput(body=b"x", keys=["order-1"])]), timeout=RPC_TIMEOUT_S).results
        end = appended.physical_offset + appended.size_bytes
        wait_until(lambda: stats().indexed_physical_offset >= end, "the message to be indexed")
        assert [loc.uniq_key for loc in query("order-1").locators] == [appended.uniq_key]

        assert log_proc.stop() == 0  # a real, cleanly stopped commit log process
        down = wait_until(lambda: not (s := stats()).connected and s, "the index to notice")
        assert down.last_error and down.indexed_physical_offset >= end

        assert list(query("no-such-key").locators) == []          # no candidate: answered at once
        missing = status_of(lambda: by_uniq("0" * 32))
        assert missing.code() == grpc.StatusCode.NOT_FOUND

        for call in (lambda: query("order-1"), lambda: query("order-1", include_messages=True),
                     lambda: by_uniq(appended.uniq_key)):
            error = status_of(call)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            text = error.details()
            assert "cannot verify the 1 index candidate(s)" in text and log_address in text, text
            assert "Retry when the commit log is back" in text, text
        by_time = status_of(lambda: idx.QueryByTime(index_pb2.QueryByTimeRequest(topic=TOPIC, timestamp_ms=0),
                                                    timeout=RPC_TIMEOUT_S))
        assert by_time.code() == grpc.StatusCode.UNAVAILABLE and "retry when it is back" in by_time.details()

        log_proc = start_log(tmp_path / "log", port)
        wait_until(lambda: stats().connected, "the index to reconnect")
        assert [loc.uniq_key for loc in query("order-1").locators] == [appended.uniq_key]
    finally:
        for channel in channels:
            channel.close()
        index.stop()
        log_proc.stop()
