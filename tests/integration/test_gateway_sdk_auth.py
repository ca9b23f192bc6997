"""The official RocketMQ 5 clients (Python 5.1.2, Node 1.0.8), unchanged, authenticate to the gateway with
SDK credentials (an access key and secret key made by the Access service): they sign every request
(MQv2-HMAC-SHA1) and act as the user owning the key, whose rules apply. A wrong secret key, an unknown
access key, a topic the user may not publish to, a revoked key and a deleted user's key are refused (within
the refresh interval); no log line of any
service holds a secret key or a signature.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from mqstore_rpc.gen.mqstore.v1 import access_pb2 as apb, access_pb2_grpc
from tests.support.gateway import CLIENTS, stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]
TOPIC, FORBIDDEN, GROUP = "sdk-orders", "sdk-forbidden", "sdk-group"
WAIT_S = 60


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with _rig(tmp_path_factory, "cluster") as s:
        yield s


@contextlib.contextmanager
def _rig(tmp_path_factory, mode: str):
    with stack(tmp_path_factory.mktemp(f"gateway-sdk-{mode}"), auth=True, mode=mode) as s:
        for topic in (TOPIC, FORBIDDEN):
            s.create_topic(topic, 2)
        with s.channel() as channel:
            access = access_pb2_grpc.AccessStub(channel)
            access.CreateUser(apb.CreateUserRequest(name="app"), timeout=10)
            for kind, pattern, actions in ((apb.RESOURCE_KIND_TOPIC, TOPIC, [apb.ACTION_PUB, apb.ACTION_SUB]),
                                           (apb.RESOURCE_KIND_GROUP, GROUP, [apb.ACTION_SUB]),
                                           (apb.RESOURCE_KIND_TOPIC, FORBIDDEN, [apb.ACTION_SUB])):
                access.AddRule(apb.AddRuleRequest(user="app", resource_kind=kind, pattern=pattern, actions=actions),
                               timeout=10)
            s.access = access
            yield s


def new_key(rig) -> tuple[str, str]:
    created = rig.access.CreateSdkKey(apb.CreateSdkKeyRequest(user="app"), timeout=10)
    return created.key.access_key, created.secret_key


def denials(rig) -> list[dict]:
    events = [json.loads(line) for line in rig.gateway.stderr().splitlines() if line.startswith("{")]
    return [e for e in events if e.get("event") == "auth.denied"]


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_client_with_sdk_credentials_sends_and_receives(rig, kind):
    ak, sk = new_key(rig)
    with rig.client(kind, "producer", credentials=(ak, sk)) as producer:
        producer.call("producer", topics=[TOPIC])
        sent = {producer.call("send", topic=TOPIC, body=f"{kind}-{i}", tag="t")["message_id"] for i in range(3)}
    with rig.client(kind, "consumer", credentials=(ak, sk)) as consumer:
        consumer.call("consumer", group=GROUP, topic=TOPIC, await_s=2)
        got: dict[str, str] = {}

        def received_all() -> bool:
            for m in consumer.call("receive", max=16, invisible_s=30)["messages"]:
                got[m["message_id"]] = m["body"]
                consumer.call("ack", handle=m["handle"])
            return sent <= set(got)
        wait_until(received_all, "the messages sent with SDK credentials to be received", timeout_s=WAIT_S)
    assert {got[i] for i in sent} == {f"{kind}-{i}" for i in range(3)}
    assert all(e["reason"] != "bad_credentials" or e.get("access_key") != ak for e in denials(rig))


@pytest.mark.parametrize("kind", CLIENTS)
def test_wrong_secret_unknown_key_and_a_forbidden_topic_are_refused(rig, kind):
    ak, sk = new_key(rig)
    before = len(denials(rig))
    for credentials in ((ak, "not-the-secret-key-at-all"), ("MQ0000000000000000", sk)):
        with rig.client(kind, f"refused-{credentials[0]}", credentials=credentials) as client:
            client.begin("producer", topics=[TOPIC])
            reply = client.reply("producer", expect_error=None)
            if reply["ok"]:  # a client that starts without a route still cannot send
                client.call("send", topic=TOPIC, body="refused", expect_error=True)
    refused = denials(rig)[before:]
    assert {e["reason"] for e in refused} == {"bad_credentials"}
    assert {e["access_key"] for e in refused} == {ak, "MQ0000000000000000"}
    before = len(denials(rig))
    with rig.client(kind, "forbidden", credentials=(ak, sk)) as client:
        client.call("producer", topics=[TOPIC])
        client.call("send", topic=FORBIDDEN, body="not allowed", expect_error=True)   # SUB only: no PUB
    permission = [e for e in denials(rig)[before:] if e["reason"] == "permission"]
    assert permission and all(e["user"] == "app" for e in permission)
    assert any("lacks PUB on topic 'sdk-forbidden'" in e["message"] for e in permission)


def test_a_revoked_key_is_refused_within_the_refresh_interval(rig):
    ak, sk = new_key(rig)
    with rig.client("python", "revoked", credentials=(ak, sk)) as client:
        client.call("producer", topics=[TOPIC])
        client.call("send", topic=TOPIC, body="before revocation")
        rig.access.RevokeSdkKey(apb.RevokeSdkKeyRequest(access_key=ak), timeout=10)

        def refused() -> bool:
            reply = client.call("send", topic=TOPIC, body="after revocation", expect_error=None)
            return not reply["ok"]
        wait_until(refused, "the revoked key to be refused", timeout_s=WAIT_S)
    assert any(e.get("access_key") == ak and e["reason"] == "bad_credentials" for e in denials(rig))


def test_deleting_the_user_refuses_its_keys_within_the_refresh_interval(rig):
    rig.access.CreateUser(apb.CreateUserRequest(name="short-lived"), timeout=10)
    rig.access.AddRule(apb.AddRuleRequest(user="short-lived", resource_kind=apb.RESOURCE_KIND_TOPIC, pattern=TOPIC,
                                          actions=[apb.ACTION_PUB]), timeout=10)
    created = rig.access.CreateSdkKey(apb.CreateSdkKeyRequest(user="short-lived"), timeout=10)
    ak = created.key.access_key
    with rig.client("node", "deleted", credentials=(ak, created.secret_key)) as client:
        client.call("producer", topics=[TOPIC])
        client.call("send", topic=TOPIC, body="before deletion")
        rig.access.DeleteUser(apb.DeleteUserRequest(name="short-lived"), timeout=10)
        wait_until(lambda: not client.call("send", topic=TOPIC, body="after deletion", expect_error=None)["ok"],
                   "the deleted user's key to be refused", timeout_s=WAIT_S)
    assert ak not in [k.access_key for k in rig.access.ListSdkKeys(apb.ListSdkKeysRequest(), timeout=10).keys]
    assert any(e.get("access_key") == ak and e["reason"] == "bad_credentials" for e in denials(rig))


def test_no_log_line_holds_a_secret_key_or_a_signature(rig):
    ak, sk = new_key(rig)
    with rig.client("node", "logs", credentials=(ak, sk)) as client:
        client.call("producer", topics=[TOPIC])
        client.call("send", topic=TOPIC, body="logged?")
    with rig.client("python", "logs-wrong", credentials=(ak, sk[::-1])) as client:
        client.begin("producer", topics=[TOPIC])
        if client.reply("producer", expect_error=None)["ok"]:
            client.call("send", topic=TOPIC, body="refused", expect_error=True)
    keys = [k.access_key for k in rig.access.ListSdkKeys(apb.ListSdkKeysRequest(user="app"), timeout=10).keys]
    assert ak in keys
    logs = "\n".join(p.stderr() + p.stdout for p in (rig.gateway, rig.commitlog, rig.txn))
    assert sk not in logs and sk[::-1] not in logs
    assert "Signature=" not in logs and "MQv2-HMAC-SHA1 Credential" not in logs


def test_in_local_mode_the_commit_logs_gateway_port_takes_sdk_credentials(tmp_path_factory):
    """The gateway served by the commit log process (Local mode) takes the SDKs' signed requests on its
    gateway port, as the gateway's own process does, while the commit log's own port refuses them."""
    with _rig(tmp_path_factory, "local") as local:
        ak, sk = new_key(local)
        with local.client("python", "local-producer", credentials=(ak, sk)) as producer:
            producer.call("producer", topics=[TOPIC])
            assert producer.call("send", topic=TOPIC, body="local", tag="t")["message_id"]
        with local.client("python", "local-refused", credentials=(ak, "not-the-secret-key-at-all")) as client:
            client.begin("producer", topics=[TOPIC])
            if client.reply("producer", expect_error=None)["ok"]:
                client.call("send", topic=TOPIC, body="refused", expect_error=True)
