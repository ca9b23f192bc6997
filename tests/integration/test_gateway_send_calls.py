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
import threading

import grpc
import pytest

from commitlog_service.main import serving as commitlog_serving
from gateway_service.main import GatewayServiceConfig, serving as gateway_serving
from mqstore.gateway.config import GatewayConfig
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc
from mqstore_launcher.child import free_port
from mqstore_rpc.gen.mqstore.v1 import common_pb2
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


class ElectingLog:
    """A stand-in CommitLog (DescribeTopic and Append only) whose first ``refusals`` Appends are refused as a leader
    refuses while its lease is unconfirmed: UNAVAILABLE, trailer mqstore-error NotWritten, nothing written."""

    def __init__(self, refusals: int):
        self.refusals, self.appends, self.written = refusals, 0, []
        self._lock = threading.Lock()

    def describe(self, request, context):
        topic = cpb.Topic(name=request.name, queue_count=2, kind=common_pb2.TOPIC_KIND_NORMAL)
        return cpb.TopicDescription(topic=topic)

    def append(self, request, context):
        with self._lock:
            self.appends += 1
            if self.appends <= self.refusals:
                context.set_trailing_metadata((("mqstore-error", "NotWritten"), ("mqstore-retriable", "true")))
                context.abort(grpc.StatusCode.UNAVAILABLE, "this commit log (n1) may have lost its leadership lease "
                                                           "of epoch 3: it takes no writes until it is confirmed")
            self.written.extend(m.body for m in request.messages)
            offset = len(self.written) - 1
        return cpb.AppendResponse(results=[cpb.AppendResult(msg_id="0" * 32, queue_id=0, queue_offset=offset,
                                                            physical_offset=offset, replicas=1)])

    def serve(self):
        handlers = {"DescribeTopic": grpc.unary_unary_rpc_method_handler(
                        self.describe, request_deserializer=cpb.DescribeTopicRequest.FromString,
                        response_serializer=cpb.TopicDescription.SerializeToString),
                    "Append": grpc.unary_unary_rpc_method_handler(
                        self.append, request_deserializer=cpb.AppendRequest.FromString,
                        response_serializer=cpb.AppendResponse.SerializeToString)}
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("mqstore.v1.CommitLog", handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        return server, f"127.0.0.1:{port}"


def test_a_send_the_log_refused_unwritten_is_sent_again_within_the_clients_deadline_and_counted():
    """mqstore.gateway.publishing: through the real servicer and its wire, a send refused NotWritten (a leader's
    election) is sent again and answered OK, stored once, counted in mqstore_gateway_sends_sent_again_total;
    refused for longer than its deadline allows, it gets the refusal before the deadline (PROXY_TIMEOUT: the
    client retries), having been sent again only within the deadline less 0.5 s."""
    log = ElectingLog(refusals=3)
    log_server, address = log.serve()
    config = GatewayServiceConfig(gateway=GatewayConfig(topic_cache_ms=CACHE_MS),
                                  server=ServerConfig(port=0, metrics_port=0), commitlog_address=address,
                                  txn_address=f"127.0.0.1:{free_port()}")
    try:
        with gateway_serving(config) as (server, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            reply = stub.SendMessage(s.SendMessageRequest(messages=[_message(0)]), metadata=CLIENT, timeout=3)
            assert reply.status.code == d.OK, reply
            assert (log.appends, log.written) == (4, [b"body-0"])      # three refusals, then written once
            assert scrape(server.metrics_port).value("mqstore_gateway_sends_sent_again_total") == 3
            log.refusals, before = log.appends + 100, log.appends
            # a 1 s deadline leaves 0.5 s to wait: pauses of 50, 100 and 200 ms fit, the next (400) does not
            refused = stub.SendMessage(s.SendMessageRequest(messages=[_message(1)]), metadata=CLIENT, timeout=1.0)
            assert refused.status.code == d.PROXY_TIMEOUT and "leadership lease" in refused.status.message
            assert 1 <= log.appends - before <= 4 and log.written == [b"body-0"]
    finally:
        log_server.stop(None)
