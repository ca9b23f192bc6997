"""What one send through the gateway costs the commit log, counted by the commit log's own per-RPC
metrics: exactly one CommitLogInternal.Append per message (the producer's born host, the gateway's
README), and no DescribeTopic while the topic's cached answer is fresh (GatewayConfig.topic_cache_ms),
nor any other call. A commit log, a Transaction service and a gateway in this process (real gRPC on
127.0.0.1, port 0), sends with raw apache.rocketmq.v2 stubs."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from commitlog_service.main import serving as commitlog_serving
from gateway_service.main import GatewayServiceConfig, serving as gateway_serving
from mqstore.gateway.config import GatewayConfig
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.txn_testing import TOKEN, txn_service, wait_ready
from tests.support.scrape import scrape

pytestmark = pytest.mark.integration
CLIENT = (("x-mq-client-id", "send-calls-test"),)
TIMEOUT_S = 10
SENDS = 25
# Generous: the test must not depend on how fast a loaded machine sends, only on the count of calls.
CACHE_MS = 600_000


def _calls(port: int) -> dict[str, float]:
    """Calls the commit log has started, by "service/method"."""
    scraped = scrape(port)
    out: dict[str, float] = {}
    for sample in scraped.samples:
        if sample.name == "grpc_server_started_total":
            key = f"{sample.labels['grpc_service']}/{sample.labels['grpc_method']}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


def _message(i: int) -> d.Message:
    m = d.Message(topic=d.Resource(name="t"), body=f"body-{i}".encode())
    m.system_properties.message_id = f"01SENDCALLS{i:08d}"
    m.system_properties.message_type = d.NORMAL
    m.system_properties.born_timestamp.GetCurrentTime()
    return m


def test_a_send_is_one_internal_append_and_no_other_call_to_the_commit_log(tmp_path):
    log_config = dataclasses.replace(make_config(tmp_path / "log"), internal_token=TOKEN,
                                     server=ServerConfig(port=0, grace_s=0.5, metrics_port=0))
    with commitlog_serving(log_config) as (log_server, log_port):
        with grpc.insecure_channel(f"127.0.0.1:{log_port}") as channel:
            commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(cpb.CreateTopicRequest(name="t", queue_count=2),
                                                                   timeout=TIMEOUT_S)
        with txn_service(tmp_path / "txn", log_port) as (txn_server, txn_stub):
            wait_ready(txn_stub)
            config = GatewayServiceConfig(gateway=GatewayConfig(topic_cache_ms=CACHE_MS), server=ServerConfig(port=0),
                                          commitlog_address=f"127.0.0.1:{log_port}",
                                          txn_address=f"127.0.0.1:{txn_server.port}", internal_token=TOKEN)
            with gateway_serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = service_pb2_grpc.MessagingServiceStub(channel)
                first = stub.SendMessage(s.SendMessageRequest(messages=[_message(0)]), metadata=CLIENT,
                                         timeout=TIMEOUT_S)
                assert first.status.code == d.OK, first
                before = _calls(log_server.metrics_port)
                for i in range(1, SENDS + 1):
                    sent = stub.SendMessage(s.SendMessageRequest(messages=[_message(i)]), metadata=CLIENT,
                                            timeout=TIMEOUT_S)
                    assert sent.status.code == d.OK, sent
                after = _calls(log_server.metrics_port)
    moved = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    # The Transaction service follows the log on its own streams, opened before `before`; anything the
    # sends caused shows as a unary call here.
    moved = {key: n for key, n in moved.items() if n}
    assert moved == {"mqstore.v1.CommitLogInternal/AppendBatches": SENDS}, moved
