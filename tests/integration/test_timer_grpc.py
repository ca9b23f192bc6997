"""Delayed delivery through the CommitLog service (mqstore.timer): real gRPC on 127.0.0.1 (port 0), real files, the
real timer duty and clock; one server for the module (a 100 ms precision)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import grpc
import pytest
import structlog.testing

from commitlog_service.main import CommitLogConfig, serving, warn_short_retention
from mqstore.config import StoreConfig
from mqstore.timer.config import TimerConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from mqstore_rpc.server import ServerConfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

T = 10
MAX_DELAY_MS = 60_000
TIMER = TimerConfig(timer_max_delay_ms=MAX_DELAY_MS, timer_precision_ms=100, timer_wheel_slots=600)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The port of the module's commit log, its topics "delayed" and "plain" created."""
    store = StoreConfig(data_dir=tmp_path_factory.mktemp("timer") / "data", segment_size_bytes=1 << 20,
                        preallocate_segments=False)
    with serving(CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0), timer=TIMER)) as (_, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            for name in ("delayed", "plain"):
                stub.CreateTopic(pb.CreateTopicRequest(name=name, queue_count=1), timeout=T)
        yield port


@pytest.fixture(scope="module")
def log(server):
    with grpc.insecure_channel(f"127.0.0.1:{server}") as channel:
        yield commitlog_pb2_grpc.CommitLogStub(channel)


def _cli(port: int, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "mqstore_cli", "--address", f"127.0.0.1:{port}", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == expect, f"mqstore {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done


def _read(stub, topic: str) -> list:
    return list(stub.Pull(pb.PullRequest(topic=topic, queue_id=0, offset=0, max_messages=1000), timeout=T).messages)


def _delivered(stub, uniq_key: str):
    return [m for m in _read(stub, "delayed") if m.uniq_key == uniq_key]


def test_a_delayed_message_is_delivered_at_its_time_not_before(log):
    sent_ms = int(time.time() * 1000)
    result = log.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(
        body=b"later", tags="TagA", keys=["k1"], properties={"p": "v"}, delay_ms=400)]), timeout=T).results[0]
    assert result.uniq_key
    wait_until(lambda: _delivered(log, result.uniq_key), timeout_s=15, what="the delayed message delivered")
    (copy,) = _delivered(log, result.uniq_key)
    due = int(copy.properties["TIMER_DELIVER_MS"])
    assert sent_ms + 400 <= due + 50  # the server's clock took the delay (the test's may differ by a little)
    assert copy.store_timestamp_ms >= due  # never early
    assert int(copy.properties["TIMER_DEQUEUE_MS"]) >= due
    assert copy.body == b"later" and copy.tags == "TagA" and list(copy.keys) == ["k1"] and copy.properties["p"] == "v"
    assert "TIMER_UNIT" in copy.properties and "REAL_TOPIC" not in copy.properties


@pytest.mark.parametrize("properties", [{"TIMER_DELAY_MS": "300"}, {"TIMER_DELAY_SEC": "1"}])
def test_the_timer_properties_ask_the_same(log, properties):
    result = log.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(
        body=b"prop", properties=properties)]), timeout=T).results[0]
    wait_until(lambda: _delivered(log, result.uniq_key), timeout_s=15, what="the delayed message delivered")


def test_a_delivery_time_in_the_past_is_delivered_at_once(log):
    result = log.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(
        body=b"past", deliver_at_ms=1_000)]), timeout=T).results[0]
    wait_until(lambda: _delivered(log, result.uniq_key), timeout_s=5, what="the past-due message delivered")


def test_a_delay_above_the_limit_is_refused_naming_it(log):
    with pytest.raises(grpc.RpcError) as info:
        log.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(
            body=b"x", delay_ms=MAX_DELAY_MS + 1_000)]), timeout=T)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--timer-max-delay-ms" in info.value.details() and str(MAX_DELAY_MS) in info.value.details()


def test_the_store_set_names_are_refused(log):
    with pytest.raises(grpc.RpcError) as info:
        log.Append(pb.AppendRequest(topic="plain", messages=[common_pb2.MessageInput(
            body=b"x", properties={"TIMER_UNIT": "3"})]), timeout=T)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_recalled_message_is_not_delivered(log):
    first = log.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(
        body=b"recalled", delay_ms=2_000)]), timeout=T).results[0]  # room for the recall on a loaded machine
    later = log.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(
        body=b"kept", delay_ms=2_200)]), timeout=T).results[0]
    answer = log.RecallTimer(pb.RecallTimerRequest(topic="delayed", msg_id=first.msg_id), timeout=T)
    assert answer.deliver_at_ms > 0
    wait_until(lambda: _delivered(log, later.uniq_key), timeout_s=15, what="the later message delivered")
    assert not _delivered(log, first.uniq_key)
    with pytest.raises(grpc.RpcError) as info:  # due and gone: nothing to recall
        log.RecallTimer(pb.RecallTimerRequest(topic="delayed", msg_id=later.msg_id), timeout=T)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as info:  # another topic's name: the same answer as no such message
        log.RecallTimer(pb.RecallTimerRequest(topic="plain", msg_id=first.msg_id), timeout=T)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_mixed_batch_is_refused(log):
    with pytest.raises(grpc.RpcError) as info:
        log.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(body=b"a", delay_ms=100),
                                                               common_pb2.MessageInput(body=b"b")]), timeout=T)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "batches of their own" in info.value.details()


def test_append_stream_routes_delayed_items(log):
    items = [pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(body=b"s1", delay_ms=200)]),
             pb.AppendRequest(topic="plain", messages=[common_pb2.MessageInput(body=b"s2")])]
    results = log.AppendStream(iter(items), timeout=T).results
    wait_until(lambda: _delivered(log, results[0].uniq_key), timeout_s=15, what="the streamed delayed message")
    assert any(m.uniq_key == results[1].uniq_key for m in _read(log, "plain"))


def test_a_port_answering_append_on_its_loop_routes_delayed_messages(tmp_path):
    store = StoreConfig(data_dir=tmp_path / "data", segment_size_bytes=1 << 20, preallocate_segments=False)
    config = CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0), timer=TIMER)
    with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(pb.CreateTopicRequest(name="delayed", queue_count=1), timeout=T)
        result = stub.Append(pb.AppendRequest(topic="delayed", messages=[common_pb2.MessageInput(
            body=b"loop", delay_ms=200)]), timeout=T).results[0]
        wait_until(lambda: _delivered(stub, result.uniq_key), timeout_s=15, what="the delayed message delivered")


def test_the_cli_sends_delayed_messages_and_recalls_them(server, log):
    sent = _cli(server, "send", "delayed", "cli-later", "--delay", "300ms").stdout
    kept = re.search(r"uniq_key=(\w+)", sent).group(1)
    at = _cli(server, "send", "delayed", "cli-past", "--deliver-at", "2020-01-01T00:00:00Z").stdout
    past = re.search(r"uniq_key=(\w+)", at).group(1)
    # due in 12 s: the recall's CLI must start and answer before then (a CLI start took over 4 s at load ~30)
    recalled = _cli(server, "send", "delayed", "cli-recalled", "--delay", "12s").stdout
    msg_id, uniq = re.search(r"msg_id=(\w+)\s+uniq_key=(\w+)", recalled).groups()
    assert "recalled" in _cli(server, "recall", "delayed", msg_id).stdout
    wait_until(lambda: _delivered(log, kept) and _delivered(log, past), timeout_s=15, what="the CLI's messages")
    later = _cli(server, "send", "delayed", "cli-after", "--delay", "12s").stdout  # sent after the recall: due later
    wait_until(lambda: _delivered(log, re.search(r"uniq_key=(\w+)", later).group(1)), timeout_s=40,
               what="a message due after the recalled one")
    assert not _delivered(log, uniq)
    assert "--timer-max-delay-ms" in _cli(server, "send", "delayed", "x", "--delay", "2d", expect=1).stderr


def test_a_retention_shorter_than_the_wheel_is_said_at_start(tmp_path):
    store = StoreConfig(data_dir=tmp_path, retention_ms=1_000)
    with structlog.testing.capture_logs() as logs:
        warn_short_retention(CommitLogConfig(store=store, timer=TIMER))
        warn_short_retention(CommitLogConfig(store=StoreConfig(data_dir=tmp_path), timer=TIMER))  # 72 h: fine
    assert [e["event"] for e in logs] == ["timer.retention_short"] and logs[0]["wheel_span_ms"] == 60_000
