"""Issue 32, "unambiguous system names": the attacks of its table, run against every service with
authentication on (the rig of test_auth_matrix: the four services and the gateway in both modes, in this
process, on one auth database), in plaintext and over TLS.

* Retry topic names collided: ``%RETRY%{group}_{topic}`` made (``billing_svc``, ``payments``) and
  (``billing``, ``svc_payments``) share one, so a user with SUB on ``svc_payments`` and group ``billing``
  received the victim's unacked payment, receipt handle and all. Through the Consumer service and the
  gateway (Cluster and Local).
* A deny rule was bypassed through system topics: with ``allow SUB *, deny SUB secret`` a Pull of
  ``RMQ_SYS_TRANS_HALF_TOPIC`` returned the halves of ``secret``. Pull, Tail, the Index, the Compactor,
  queue and topic reads, pop and the gateway all refuse a system topic to anyone but the internal
  identity (a super user too); the services, which read them as that identity, keep working.
"""

from __future__ import annotations

import contextlib
import itertools

import grpc
import pytest

from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.sealing import Kek
from mqstore.clock import SystemClock
from mqstore.meta.auth import AuthStore
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d, service_pb2 as v2
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import common_pb2, compactor_pb2 as kpb, index_pb2 as ipb, txn_pb2 as tpb
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2 as ppb
from tests.integration.test_auth_matrix import _bearer, _services, _stub
from tests.support.transport import TRANSPORTS, Transport
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
TIMEOUT_S = 10
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
SYSTEM = (HALF, "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX",
          "rmq_sys_REVIVE_LOG", "RMQ_SYS_CONSUMER_OFFSETS", "RMQ_SYS_TOPIC_EVENTS")
GATEWAY_MODES = ("gateway", "gateway-local")   # Cluster mode (its own process), Local mode (the commit log's port)
ENDPOINTS = d.Endpoints(scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=8081)])
ALL = frozenset(access.ACTIONS)
_names = itertools.count(1)


def _secret(user: str) -> str:
    return f"secret-of-{user}-0123456789"


# user -> its rules (kind, pattern, actions, decision); "root" is a super user
USERS = {
    # The victim: its topics payments-* and secret, its consumer group billing_svc, a compaction topic.
    "victim": [(access.TOPIC, "payments-*", frozenset({access.PUB, access.SUB}), access.ALLOW),
               (access.TOPIC, "secret", frozenset({access.PUB, access.SUB}), access.ALLOW),
               (access.TOPIC, "kv", frozenset({access.PUB, access.SUB}), access.ALLOW),
               (access.GROUP, "*", frozenset({access.PUB, access.SUB}), access.ALLOW)],
    # The attacker: SUB on svc_payments-* and the group billing, nothing of the victim's.
    "mallory": [(access.TOPIC, "svc_payments-*", frozenset({access.PUB, access.SUB}), access.ALLOW),
                (access.GROUP, "billing", frozenset({access.SUB}), access.ALLOW)],
    # SUB on every topic, and on the group billing only.
    "peeker": [(access.TOPIC, "*", frozenset({access.SUB}), access.ALLOW),
               (access.GROUP, "billing", frozenset({access.SUB}), access.ALLOW)],
    # allow SUB * (and every action on every group), deny SUB secret.
    "snoop": [(access.TOPIC, "*", frozenset({access.SUB}), access.ALLOW),
              (access.TOPIC, "secret", frozenset({access.SUB}), access.DENY),
              (access.GROUP, "*", ALL, access.ALLOW)],
    # Even ADMIN and PUB on every topic, group and the cluster.
    "admin": [(kind, "*", ALL, access.ALLOW) for kind in (access.TOPIC, access.GROUP, access.CLUSTER)],
}


class Rig:
    def __init__(self, servers: dict, peers, local_port: int, transport: Transport):
        self.ports = {name: port for name, (_, port) in servers.items()}
        self.ports["gateway-local"] = local_port
        self.peers, self.transport = peers, transport
        self._channels: dict[str, grpc.Channel] = {}

    def channel(self, service: str) -> grpc.Channel:
        if service not in self._channels:
            self._channels[service] = self.transport.channel(self.ports[service])
        return self._channels[service]

    def call(self, service: str, method: str, request, user: str = "", kind: str = "unary", metadata=()):
        """The answer's bytes (a server stream: the first message's, or None), as ``user`` ("" = the internal
        identity, through the services' own peers)."""
        if user:
            return _once(_stub(self.channel(service), method, kind), request, kind,
                         _bearer(user, _secret(user)) + tuple(metadata))
        with self.peers.channel(f"127.0.0.1:{self.ports[service]}") as channel:
            return _once(_stub(channel, method, kind), request, kind, tuple(metadata))

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def _once(stub, request, kind: str, metadata):
    if kind == "unary":
        return stub(request, timeout=TIMEOUT_S, metadata=metadata)
    responses = stub(request, timeout=TIMEOUT_S, metadata=metadata)
    try:
        return next(iter(responses), None)
    finally:
        responses.cancel()


@pytest.fixture(scope="module", params=TRANSPORTS)
def rig(request, tmp_path_factory, certs):
    tmp = tmp_path_factory.mktemp(f"attack-system-names-{request.param}")
    transport = Transport(request.param, certs)
    with _services(tmp, transport) as (url, servers, peers, kek_file, local_port):
        store = AuthStore(url, SystemClock())
        try:
            admin = AccessAdmin(store, kek=Kek(str(kek_file), create=True))
            admin.create_user("root", access.SUPER, _secret("root"))
            for user, rules in USERS.items():
                admin.create_user(user, access.NORMAL, _secret(user))
                for kind, pattern, actions, decision in rules:
                    admin.add_rule(user, kind, pattern, actions, decision)
        finally:
            store.close()
        r = Rig(servers, peers, local_port, transport)
        for name, kind in (("secret", common_pb2.TOPIC_KIND_NORMAL), ("kv", common_pb2.TOPIC_KIND_COMPACTION)):
            r.call("commitlog", "/mqstore.v1.CommitLog/CreateTopic",
                   cpb.CreateTopicRequest(name=name, queue_count=1, kind=kind))
        wait_until(lambda: _allowed(lambda: r.call("commitlog", "/mqstore.v1.CommitLog/GetQueueInfo",
                                                   cpb.GetQueueInfoRequest(topic="secret"), "victim")),
                   "the services to see the new users (auth_refresh_ms)")
        # The victim's transaction on secret: its half sits in RMQ_SYS_TRANS_HALF_TOPIC.
        stats = "/mqstore.v1.Transaction/Stats"
        wait_until(lambda: not tpb.TxnStats.FromString(r.call("txn", stats, tpb.TxnStatsRequest())).recovering,
                   "the txn service to recover")
        r.call("txn", "/mqstore.v1.Transaction/Prepare", tpb.PrepareRequest(
            topic="secret", producer_group="secret-producers",
            messages=[common_pb2.MessageInput(body=b"the victim's secret half", keys=["k"])]), "victim")
        try:
            yield r
        finally:
            r.close()


def _allowed(call) -> bool:
    try:
        call()
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            return False
        raise
    return True


def _denied(rig: Rig, *call) -> str:
    """The denial's message of ``rig.call(*call)``, which must be refused PERMISSION_DENIED."""
    with pytest.raises(grpc.RpcError) as raised:
        rig.call(*call)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED, raised.value
    return raised.value.details()


# ---- the retry topic collision --------------------------------------------------------------------------

def _victim_message_in_retry(rig: Rig, topic: str) -> bytes:
    """The victim (group billing_svc) receives its payment on ``topic`` and does not ack it: its invisible
    time passes and pop consumption copies it to billing_svc's retry topic of ``topic``."""
    body = f"victim's payment on {topic}".encode()
    rig.call("commitlog", "/mqstore.v1.CommitLog/Append",
             cpb.AppendRequest(topic=topic, messages=[common_pb2.MessageInput(body=body)]), "victim")
    got = ppb.ReceiveResponse.FromString(rig.call("commitlog", "/mqstore.v1.Consumer/Receive", ppb.ReceiveRequest(
        group="billing_svc", topic=topic, invisible_duration_ms=100, long_poll_ms=2000), "victim"))
    assert [m.message.body for m in got.messages] == [body]

    def copied() -> bool:
        stats = ppb.PopStats.FromString(rig.call("commitlog", "/mqstore.v1.Consumer/Stats",
                                                 ppb.PopStatsRequest(group="billing_svc", topic=topic)))
        return stats.group_in_flight == 0 and any(q.topic.startswith("%RETRY%") and q.max_offset >= 1
                                                  for q in stats.queues)
    wait_until(copied, "the victim's unacked message to be copied to its retry topic")
    return body


def _receive_as_mallory(rig: Rig, path: str, topic: str) -> list[bytes]:
    """What mallory (group billing, topic ``topic``) receives through ``path``."""
    if path == "consumer":
        got = ppb.ReceiveResponse.FromString(rig.call("commitlog", "/mqstore.v1.Consumer/Receive", ppb.ReceiveRequest(
            group="billing", topic=topic, invisible_duration_ms=30_000, long_poll_ms=1000), "mallory"))
        return [m.message.body for m in got.messages]
    request = v2.ReceiveMessageRequest(group=d.Resource(name="billing"),
                                       message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=0),
                                       batch_size=32, filter_expression=d.FilterExpression(type=d.TAG, expression="*"))
    request.invisible_duration.FromMilliseconds(30_000)
    request.long_polling_timeout.FromMilliseconds(1_000)
    metadata = (("x-mq-client-id", f"mallory-{path}"),)
    stub = _stub(rig.channel(path), "/apache.rocketmq.v2.MessagingService/ReceiveMessage", "server_stream")
    answers = [v2.ReceiveMessageResponse.FromString(raw) for raw in stub(
        request, timeout=TIMEOUT_S, metadata=_bearer("mallory", _secret("mallory")) + metadata)]
    return [a.message.body for a in answers if a.WhichOneof("content") == "message"]


@pytest.mark.parametrize("path", ["consumer", *GATEWAY_MODES])
def test_a_group_whose_retry_name_collides_receives_none_of_the_victims_messages(rig, path):
    n = next(_names)
    victim_topic, mallory_topic = f"payments-{n}", f"svc_payments-{n}"  # legacy names: both billing_svc_payments-n
    for topic in (victim_topic, mallory_topic):
        rig.call("commitlog", "/mqstore.v1.CommitLog/CreateTopic", cpb.CreateTopicRequest(name=topic, queue_count=1))
    body = _victim_message_in_retry(rig, victim_topic)
    assert body not in _receive_as_mallory(rig, path, mallory_topic)
    # The victim's message is not lost: it comes back to the victim, attempt 2.
    again = ppb.ReceiveResponse.FromString(rig.call("commitlog", "/mqstore.v1.Consumer/Receive", ppb.ReceiveRequest(
        group="billing_svc", topic=victim_topic, invisible_duration_ms=30_000, long_poll_ms=3000), "victim"))
    assert [(m.message.body, m.delivery_attempt) for m in again.messages] == [(body, 2)]
    # Its retry topic is read only with SUB on group billing_svc too: not with SUB on every topic alone.
    retry = f"%RETRY%billing_svc+{victim_topic}"
    assert again.messages[0].message.topic == retry
    details = _denied(rig, "commitlog", "/mqstore.v1.CommitLog/Pull", cpb.PullRequest(topic=retry), "peeker")
    assert "also needs SUB on group 'billing_svc'" in details and "payment" not in details.replace(victim_topic, "")


# ---- system topics --------------------------------------------------------------------------------------

def _native_reads(topic: str) -> dict[str, tuple[str, str, object, str]]:
    """Every native RPC that reads ``topic``: name -> (service, method, request, kind)."""
    return {
        "Pull": ("commitlog", "/mqstore.v1.CommitLog/Pull", cpb.PullRequest(topic=topic), "unary"),
        "Tail": ("commitlog", "/mqstore.v1.CommitLog/Tail",
                 cpb.TailRequest(start=cpb.TAIL_START_EARLIEST, topics=[topic]), "server_stream"),
        "GetQueueInfo": ("commitlog", "/mqstore.v1.CommitLog/GetQueueInfo", cpb.GetQueueInfoRequest(topic=topic),
                         "unary"),
        "GetOffsetByTime": ("commitlog", "/mqstore.v1.CommitLog/GetOffsetByTime",
                            cpb.GetOffsetByTimeRequest(topic=topic, timestamp_ms=0), "unary"),
        "DescribeTopic": ("commitlog", "/mqstore.v1.CommitLog/DescribeTopic", cpb.DescribeTopicRequest(name=topic),
                          "unary"),
        "QueryOffset": ("commitlog", "/mqstore.v1.CommitLog/QueryOffset",
                        cpb.QueryOffsetRequest(topic=topic, group="snoopers"), "unary"),
        "Receive": ("commitlog", "/mqstore.v1.Consumer/Receive",
                    ppb.ReceiveRequest(group="snoopers", topic=topic, invisible_duration_ms=10_000), "unary"),
        "QueryByKey": ("index", "/mqstore.v1.Index/QueryByKey", ipb.QueryByKeyRequest(topic=topic, key="k"), "unary"),
        "QueryByTime": ("index", "/mqstore.v1.Index/QueryByTime", ipb.QueryByTimeRequest(topic=topic), "unary"),
        "CompactedPull": ("compactor", "/mqstore.v1.Compactor/Pull", kpb.CompactedPullRequest(topic=topic), "unary"),
        "GetLatest": ("compactor", "/mqstore.v1.Compactor/GetLatest", kpb.GetLatestRequest(topic=topic, key="k"),
                      "unary"),
    }


def test_the_half_topic_holds_the_victims_half_which_only_the_internal_identity_reads(rig):
    def halves() -> list[bytes]:
        answer = cpb.PullResponse.FromString(rig.call("commitlog", "/mqstore.v1.CommitLog/Pull",
                                                      cpb.PullRequest(topic=HALF)))
        return [m.body for m in answer.messages]
    wait_until(lambda: b"the victim's secret half" in halves(), "the half to be readable by the internal identity")


@pytest.mark.parametrize("user", ["snoop", "admin", "root"])
@pytest.mark.parametrize("rpc", sorted(_native_reads(HALF)))
def test_no_user_rule_reads_the_half_topic_through_any_rpc(rig, user, rpc):
    service, method, request, kind = _native_reads(HALF)[rpc]
    details = _denied(rig, service, method, request, user, kind)
    assert "system topic" in details and "secret" not in details.replace(f"secret-of-{user}", "")
    # The deny rule itself still holds where it always did.
    if user == "snoop":
        _denied(rig, "commitlog", "/mqstore.v1.CommitLog/Pull", cpb.PullRequest(topic="secret"), user)


@pytest.mark.parametrize("topic", SYSTEM)
def test_every_system_topic_is_refused_to_a_rule_on_star_and_to_a_super_user(rig, topic):
    for user in ("snoop", "root"):
        _denied(rig, "commitlog", "/mqstore.v1.CommitLog/Pull", cpb.PullRequest(topic=topic), user)
        _denied(rig, "commitlog", "/mqstore.v1.CommitLog/Tail",
                cpb.TailRequest(start=cpb.TAIL_START_EARLIEST, topics=[topic]), user, "server_stream")
        # the offsets topic's own rows (a pop group's revive checkpoint is one) are no user's either
        for method, request in (("QueryOffset", cpb.QueryOffsetRequest(group="g", topic=topic)),
                                ("CommitOffset", cpb.CommitOffsetRequest(group="g", topic=topic, offset=0)),
                                ("Append", cpb.AppendRequest(topic=topic, messages=[common_pb2.MessageInput()]))):
            _denied(rig, "commitlog", f"/mqstore.v1.CommitLog/{method}", request, user)


@pytest.mark.parametrize("mode", GATEWAY_MODES)
def test_the_gateway_refuses_a_system_topic_to_every_client(rig, mode):
    queue = d.MessageQueue(topic=d.Resource(name=HALF), id=0)
    receive = v2.ReceiveMessageRequest(group=d.Resource(name="snoopers"), message_queue=queue, batch_size=32,
                                       filter_expression=d.FilterExpression(type=d.TAG, expression="*"))
    receive.invisible_duration.FromMilliseconds(30_000)
    receive.long_polling_timeout.FromMilliseconds(1_000)
    calls = {
        "QueryRoute": (v2.QueryRouteRequest(topic=d.Resource(name=HALF), endpoints=ENDPOINTS), "unary"),
        "ReceiveMessage": (receive, "server_stream"),
        "PullMessage": (v2.PullMessageRequest(group=d.Resource(name="snoopers"), message_queue=queue, batch_size=32,
                                              filter_expression=d.FilterExpression(type=d.TAG, expression="*")),
                        "server_stream"),
        "GetOffset": (v2.GetOffsetRequest(group=d.Resource(name="snoopers"), message_queue=queue), "unary"),
        "QueryOffset": (v2.QueryOffsetRequest(message_queue=queue), "unary"),
    }
    metadata = (("x-mq-client-id", f"snoop-{mode}"),)
    for user in ("snoop", "root"):
        for name, (request, kind) in calls.items():
            details = _denied(rig, mode, f"/apache.rocketmq.v2.MessagingService/{name}", request, user, kind,
                              metadata)
            assert "system topic" in details, name


def test_the_txn_service_and_the_compactor_still_read_what_they_need(rig):
    prepared = tpb.PrepareResponse.FromString(rig.call("txn", "/mqstore.v1.Transaction/Prepare", tpb.PrepareRequest(
        topic="secret", producer_group="secret-producers",
        messages=[common_pb2.MessageInput(body=b"committed secret")]), "victim"))
    rig.call("txn", "/mqstore.v1.Transaction/Commit", tpb.EndRequest(transaction_id=prepared.transaction_id), "victim")

    def committed() -> bool:
        answer = cpb.PullResponse.FromString(rig.call("commitlog", "/mqstore.v1.CommitLog/Pull",
                                                      cpb.PullRequest(topic="secret"), "victim"))
        return b"committed secret" in [m.body for m in answer.messages]
    wait_until(committed, "the committed transaction's message in secret")
    rig.call("commitlog", "/mqstore.v1.CommitLog/Append", cpb.AppendRequest(
        topic="kv", messages=[common_pb2.MessageInput(body=b"v1", keys=["key"])]), "victim")

    def latest() -> bytes:
        with contextlib.suppress(grpc.RpcError):
            return kpb.LatestValue.FromString(rig.call("compactor", "/mqstore.v1.Compactor/GetLatest",
                                                       kpb.GetLatestRequest(topic="kv", key="key"), "victim")).value
        return b""
    wait_until(lambda: latest() == b"v1", "the compactor to serve the kv topic")
