"""The protocol facts only the clients' code states (reference: rocketmq-v2-gateway.md), checked on the
gateway's own conversions: statuses as apache.rocketmq.v2 codes, the settings reply (a non-zero
max_body_size, an exponential backoff policy, the clamped long poll), the received message's system
properties (message id, MD5 digest in upper-case hex, encoding, attempt, receipt handle) and the route
(queue 0 always there, every queue READ_WRITE on broker 0)."""

from __future__ import annotations

import hashlib

import pytest

from mqstore import errors
from mqstore.gateway.config import GatewayConfig
from mqstore.model import KIND_NORMAL, TopicRecord
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from gateway_service import convert, status
from gateway_service.servicer import overall
from gateway_service.telemetry import settings_reply
from tests.unit.gateway.messages import stored


@pytest.mark.parametrize("error, code", [
    (errors.TopicNotFound("x"), d.TOPIC_NOT_FOUND), (errors.InvalidReceiptHandle("x"), d.INVALID_RECEIPT_HANDLE),
    (errors.IllegalInvisibleTime("x"), d.ILLEGAL_INVISIBLE_TIME), (errors.InvalidArgument("x"), d.BAD_REQUEST),
    (errors.InvalidTransactionId("x"), d.INVALID_TRANSACTION_ID), (errors.Unsupported("x"), d.UNSUPPORTED),
    (errors.FlushTimeout("x"), d.MASTER_PERSISTENCE_TIMEOUT), (errors.Unavailable("x"), d.PROXY_TIMEOUT),
    (errors.ResourceExhausted("x"), d.TOO_MANY_REQUESTS), (errors.ClientIdRequired("x"), d.CLIENT_ID_REQUIRED),
    (errors.CorruptLog("x", path="p", position=0, physical_offset=0), d.INTERNAL_SERVER_ERROR)])
def test_errors_become_the_protocols_codes(error, code):
    assert status.code_for(error) == code
    assert status.status_of(error).message == "x"


def test_every_error_of_the_tree_has_a_non_zero_code():
    """A zero (or missing) code makes the Python client raise "response is illegal"."""
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)
    for cls in subclasses(errors.MqStoreError):
        assert status.code_for(cls.__new__(cls)) not in (0, d.OK), cls


def test_the_top_level_status_is_the_entries_when_they_agree():
    ok, bad = status.ok(), d.Status(code=d.INVALID_RECEIPT_HANDLE, message="stale")
    assert overall([bad]).code == d.INVALID_RECEIPT_HANDLE     # the clients read only the top-level status
    assert overall([ok, ok]).code == d.OK
    assert overall([ok, bad]).code == d.MULTIPLE_RESULTS


def test_a_producers_settings_carry_a_body_limit_and_an_exponential_backoff():
    asked = d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(topics=[d.Resource(name="t")]))
    reply = settings_reply(asked, GatewayConfig(max_body_bytes=1 << 20))
    assert reply.publishing.max_body_size == 1 << 20
    assert [r.name for r in reply.publishing.topics] == ["t"]
    assert reply.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert reply.backoff_policy.max_attempts > 0 and not reply.metric.on


@pytest.mark.parametrize("asked_ms, expected_ms", [(0, 5_000), (30_000, 20_000), (10_000, 10_000)])
def test_a_consumers_settings_clamp_the_long_poll(asked_ms, expected_ms):
    sub = d.Subscription(group=d.Resource(name="g"), long_polling_timeout=convert.duration(asked_ms))
    reply = settings_reply(d.Settings(client_type=d.SIMPLE_CONSUMER, subscription=sub),
                           GatewayConfig(max_delivery_attempts=4))
    assert convert.duration_ms(reply.subscription.long_polling_timeout) == expected_ms
    assert reply.subscription.receive_batch_size == 32 and reply.subscription.group.name == "g"
    assert reply.backoff_policy.max_attempts == 4
    assert reply.backoff_policy.WhichOneof("strategy") == "exponential_backoff"


def test_a_received_message_has_what_both_clients_need():
    m = stored(b"payload", topic="%RETRY%g_t", properties={
        "UNIQ_KEY": "01ABC", "TAGS": "paid", "KEYS": "k1 k2", "color": "blue", "__SHARDINGKEY": "order-1",
        "RETRY_TOPIC": "t", "ORIGIN_MESSAGE_ID": "7F00", "POP_CK": "1:2"}, queue_id=2, queue_offset=17)
    out = convert.message_out(m, topic="t", receipt_handle="v1:handle", delivery_attempt=3, invisible_ms=30_000)
    sp = out.system_properties
    assert (out.topic.name, out.body, sp.message_id, sp.tag, list(sp.keys)) == ("t", b"payload", "01ABC", "paid",
                                                                                ["k1", "k2"])
    assert (sp.body_digest.type, sp.body_digest.checksum) == (d.MD5, hashlib.md5(b"payload").hexdigest().upper())
    assert (sp.body_encoding, sp.receipt_handle, sp.delivery_attempt) == (d.IDENTITY, "v1:handle", 3)
    assert (sp.message_type, sp.message_group, sp.queue_id, sp.queue_offset) == (d.FIFO, "order-1", 2, 17)
    assert dict(out.user_properties) == {"color": "blue"}      # the server's own properties stay out
    assert sp.born_host == "127.0.0.1:4000" and sp.born_timestamp.seconds == 1_700_000_000


def test_the_route_has_queue_zero_and_every_queue_read_write_on_broker_zero():
    endpoints = d.Endpoints(scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=8081)])
    queues = convert.message_queues(TopicRecord("t", 3, KIND_NORMAL, 0, 0), endpoints, ("NORMAL", "FIFO"), "mqstore")
    assert [q.id for q in queues] == [0, 1, 2]
    assert all(q.permission == d.READ_WRITE and q.broker.id == 0 and q.broker.endpoints == endpoints for q in queues)
    assert list(queues[0].accept_message_types) == [d.NORMAL, d.FIFO]


def test_a_consumers_settings_say_fifo_for_an_ordered_group_only():
    sub = d.Subscription(group=d.Resource(name="g"))
    asked = d.Settings(client_type=d.SIMPLE_CONSUMER, subscription=sub)
    assert settings_reply(asked, GatewayConfig(), fifo=True).subscription.fifo
    assert not settings_reply(asked, GatewayConfig()).subscription.fifo
