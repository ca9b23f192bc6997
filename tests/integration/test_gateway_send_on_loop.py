"""Where the Local-mode gateway's SendMessage runs (mqstore_rpc.aio.at_once_when, LogPort.appends_at_once,
Publisher.sends_at_once): on its port's event loop when the commit log's appends do not wait (one node, ASYNC
flush) and no message needs another service or a lookup; a send whose topic is not in the cache yet, a delayed
message, a transaction's half, a request holding one of those, and every send of a SYNC flush store run in the
handler pool, with nothing sent twice. Real gRPC on 127.0.0.1, the commit log in this process."""

from __future__ import annotations

import dataclasses
import threading

import grpc
import pytest

from commitlog_service.main import serving
from mqstore.gateway.publishing import Publisher
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc
from tests.integration.test_gateway_local import CLIENT, TIMEOUT_S, node_config

pytestmark = pytest.mark.integration

LOOP = "grpc-aio-loop"  # mqstore_rpc.aio.LoopThread's thread (each port's)


@pytest.fixture
def sends(monkeypatch) -> list[tuple[str, bool]]:
    """(message id, whether it ran on a loop) of every Publisher.send."""
    seen: list[tuple[str, bool]] = []
    real = Publisher.send

    def spy(self, p, wait_s=0.0):
        seen.append((p.message_id, threading.current_thread().name == LOOP))
        return real(self, p, wait_s)
    monkeypatch.setattr(Publisher, "send", spy)
    return seen


def _message(message_id: str, kind: int = d.NORMAL, delay_s: int = 0) -> d.Message:
    m = d.Message(topic=d.Resource(name="t"), body=b"local")
    m.system_properties.message_id = message_id
    m.system_properties.message_type = kind
    if delay_s:
        m.system_properties.delivery_timestamp.GetCurrentTime()
        m.system_properties.delivery_timestamp.seconds += delay_s
    return m


def _queue_ends(channel) -> int:
    log = commitlog_pb2_grpc.CommitLogStub(channel)
    return sum(log.GetQueueInfo(pb.GetQueueInfoRequest(topic="t", queue_id=q), timeout=TIMEOUT_S).max_offset
               for q in range(2))


def _serve(config, sends, send_all):
    with serving(config) as (server, port), grpc.insecure_channel(f"127.0.0.1:{port}") as log_channel:
        commitlog_pb2_grpc.CommitLogStub(log_channel).CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2),
                                                                  timeout=TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{server.extra_ports['gateway']}") as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)

            def send(*messages: d.Message) -> s.SendMessageResponse:
                return stub.SendMessage(s.SendMessageRequest(messages=list(messages)), metadata=CLIENT,
                                        timeout=TIMEOUT_S)
            send_all(send, lambda: _queue_ends(log_channel))


def test_sends_run_on_the_loop_when_nothing_waits_and_in_the_pool_otherwise(tmp_path, sends):
    def send_all(send, queue_ends):
        assert send(_message("01SEND00000000000000000000000001")).status.code == d.OK  # the topic looked up
        assert send(_message("01SEND00000000000000000000000002")).status.code == d.OK  # the topic cached
        assert sends == [("01SEND00000000000000000000000001", False), ("01SEND00000000000000000000000002", True)]
        before = queue_ends()
        del sends[:]
        # One message of the request is delayed (the timer): the whole request in the pool, each message once
        reply = send(_message("01SEND00000000000000000000000003"),
                     _message("01SEND00000000000000000000000004", d.DELAY, delay_s=3600))
        assert [e.status.code for e in reply.entries] == [d.OK, d.OK]
        assert sends == [("01SEND00000000000000000000000003", False), ("01SEND00000000000000000000000004", False)]
        assert queue_ends() == before + 1  # the normal one once; the delayed one is in the timer's topic
        del sends[:]
        # A transaction's half goes to the Transaction service (none listens here: its entry says so)
        send(_message("01SEND00000000000000000000000005", d.TRANSACTION))
        assert sends == [("01SEND00000000000000000000000005", False)]
    _serve(node_config(tmp_path, "a", gateway=True), sends, send_all)


def test_a_sync_flush_stores_sends_run_in_the_pool(tmp_path, sends):
    config = node_config(tmp_path, "a", gateway=True)
    config = dataclasses.replace(config, store=dataclasses.replace(config.store, flush_mode="SYNC"))

    def send_all(send, queue_ends):
        for i in range(2):
            assert send(_message(f"01SYNC0000000000000000000000000{i}")).status.code == d.OK
        assert [on_loop for _, on_loop in sends] == [False, False]  # each append waits for its fsync
        assert queue_ends() == 2
    _serve(config, sends, send_all)
