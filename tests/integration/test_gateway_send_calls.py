"""What one send through the gateway costs the commit log, counted by the commit log's own per-RPC
metrics: sequential sends are one request each on the CommitLogInternal.AppendBatchesStream the first send
opened (the producer's born host, the gateway's README) and start no call at all: no DescribeTopic while the
topic's cached answer is fresh (GatewayConfig.topic_cache_ms), nor any other call. Concurrent sends are all
answered OK, each stored once, in no more requests than sends (coalesced: mqstore.gateway.coalescing).
A commit log, a Transaction service and a gateway in this process (real gRPC on
127.0.0.1, port 0), sends with raw apache.rocketmq.v2 stubs."""

from __future__ import annotations

import concurrent.futures
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
CONCURRENT, THREADS = 64, 8
RECEIVED = "grpc_server_msg_received_total"
BATCHES = "mqstore.v1.CommitLogInternal/AppendBatchesStream"
# Generous: the test must not depend on how fast a loaded machine sends, only on the count of calls.
CACHE_MS = 600_000


def _calls(port: int, metric: str = "grpc_server_started_total") -> dict[str, float]:
    """Calls the commit log has started (or with ``metric`` request messages it received), by "service/method"."""
    scraped = scrape(port)
    out: dict[str, float] = {}
    for sample in scraped.samples:
        if sample.name == metric:
            key = f"{sample.labels['grpc_service']}/{sample.labels['grpc_method']}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


def _moved(before: dict, after: dict) -> dict:
    return {key: n for key in after if (n := after.get(key, 0.0) - before.get(key, 0.0))}


def _message(i: int) -> d.Message:
    m = d.Message(topic=d.Resource(name="t"), body=f"body-{i}".encode())
    m.system_properties.message_id = f"01SENDCALLS{i:08d}"
    m.system_properties.message_type = d.NORMAL
    m.system_properties.born_timestamp.GetCurrentTime()
    return m


def test_a_send_is_one_request_on_the_append_stream_and_no_other_call_to_the_commit_log(tmp_path):
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
                metrics = log_server.metrics_port
                before = _calls(metrics), _calls(metrics, RECEIVED)
                for i in range(1, SENDS + 1):
                    sent = stub.SendMessage(s.SendMessageRequest(messages=[_message(i)]), metadata=CLIENT,
                                            timeout=TIMEOUT_S)
                    assert sent.status.code == d.OK, sent
                after = _calls(metrics), _calls(metrics, RECEIVED)
                # Concurrent sends: every one answered OK with its own offset, in at most one request each
                with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
                    answers = list(pool.map(lambda i: stub.SendMessage(
                        s.SendMessageRequest(messages=[_message(i)]), metadata=CLIENT, timeout=TIMEOUT_S),
                        range(SENDS + 1, SENDS + 1 + CONCURRENT)))
                last = _calls(metrics, RECEIVED)
                with grpc.insecure_channel(f"127.0.0.1:{log_port}") as channel:
                    stored = sum(commitlog_pb2_grpc.CommitLogStub(channel).GetQueueInfo(
                        cpb.GetQueueInfoRequest(topic="t", queue_id=q), timeout=TIMEOUT_S).max_offset for q in (0, 1))
    # The Transaction service follows the log on its own streams, opened before `before`; anything the
    # sends caused shows as a call started here.
    assert _moved(before[0], after[0]) == {}, _moved(before[0], after[0])
    assert _moved(before[1], after[1]) == {BATCHES: SENDS}, _moved(before[1], after[1])
    assert all(a.status.code == d.OK for a in answers), [a for a in answers if a.status.code != d.OK][:1]
    assert len({a.entries[0].message_id for a in answers}) == CONCURRENT
    assert stored == 1 + SENDS + CONCURRENT  # each message stored once
    assert 1 <= _moved(after[1], last)[BATCHES] <= CONCURRENT
