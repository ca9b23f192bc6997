"""The permission matrix: every RPC of every service, with authentication on, called with no credentials,
a wrong secret, a user lacking the permission the RPC needs, and a user holding exactly it; each gets its
exact status. Every denial is one ``auth.denied`` event and one count, and no secret reaches a log line.

The four services run in this process on one shared auth database, as the launcher runs them, each
following the commit log as the services' own identity (``service`` with the internal token). The
gateway's calls are made to both of its deployments: its own server (Cluster mode) and the commit log's
second port (Local mode), which takes the same credentials and permissions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import itertools
import json
import pathlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc
import pytest
import structlog

from commitlog_service.main import serving as commitlog_serving
from compactor_service.main import serving as compactor_serving
from gateway_service.main import GatewayServiceConfig
from gateway_service.main import serving as gateway_serving
from mqstore.gateway.config import GatewayConfig
from mqstore_launcher.node import LocalMode
from gateway_service.composition import LocalGatewayConfig
from index_service.main import IndexServiceConfig
from index_service.main import serving as index_serving
from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.sealing import Kek
from mqstore.clock import SystemClock
from mqstore.index.config import IndexConfig
from mqstore.index.follower import FollowerConfig
from mqstore.meta.auth import AuthStore
from mqstore.replication.config import ReplicationConfig
from mqstore_rpc import auth as rpc_auth
from mqstore_rpc.gen.mqstore.v1 import access_pb2 as apb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import common_pb2, compactor_pb2 as kpb, index_pb2 as ipb, txn_pb2 as tpb
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2 as ppb
from mqstore_rpc.gen.mqstore.v1 import replication_pb2 as rpb
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d, service_pb2 as v2
from mqstore_rpc.permissions import PERMISSIONS
from mqstore_rpc.peers import Peers
from mqstore_rpc.secret import Secret
from mqstore_rpc.server import AuthConfig, ServerConfig
from tests.integration.test_commitlog_grpc import make_config
from tests.integration.test_compactor_service import compactor_config
from tests.integration.txn_testing import TOKEN, txn_config
from tests.support.gateway import free_port
from tests.support.scrape import scrape
from tests.support.transport import PLAINTEXT, TRANSPORTS, Transport
from tests.support.waiting import wait_until
from txn_service.main import serving as txn_serving

pytestmark = pytest.mark.integration
TIMEOUT_S = 10
TOPIC, GROUP, KV = "t1", "g1", "kv"
WRONG = "not-the-secret-at-all"


@dataclass
class Call:
    """How to call one RPC once, and the status a caller holding the permission gets."""

    kind: str                                  # unary | client_stream | server_stream | bidi
    request: Callable[["World"], Any]          # the request (a list of items for a request stream)
    allowed: grpc.StatusCode = grpc.StatusCode.OK
    metadata: tuple = ()
    answer: Callable[[bytes], grpc.StatusCode] | None = None  # the status the first streamed answer carries
    # What a caller lacking the permission gets: a transaction's end answers it as an unknown id (no
    # existence oracle, txn.proto), the denial still logged and counted
    refused: grpc.StatusCode = grpc.StatusCode.PERMISSION_DENIED


def _frame_status(raw: bytes) -> grpc.StatusCode:
    """A Transact answer's status: a frame is checked as its unary call, and refused in its ``error``."""
    answer = tpb.TransactResponse.FromString(raw)
    if answer.WhichOneof("kind") != "error":
        return grpc.StatusCode.OK
    return next(code for code in grpc.StatusCode if code.value[0] == answer.error.code)


@dataclass
class World:
    """What the calls refer to, made before the matrix runs."""

    ports: dict[str, int]
    physical_offset: int = 0
    uniq_key: str = ""
    txns: dict[str, str] = dataclasses.field(default_factory=dict)
    rule_id: int = 0
    created: int = 0
    sdk_keys: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)  # user -> (access, secret key)
    revocable: str = ""                        # an access key RevokeSdkKey may revoke
    transport: Transport = PLAINTEXT           # how the matrix's calls reach the servers

    def fresh(self, prefix: str) -> str:
        self.created += 1
        return f"{prefix}-{self.created}"


def _msg(body: bytes = b"v", **fields) -> common_pb2.MessageInput:
    return common_pb2.MessageInput(body=body, **fields)


def _txn_commit(w: World) -> tpb.EndRequest:
    return tpb.EndRequest(transaction_id=w.txns.pop("commit"))


def _txn_rollback(w: World) -> tpb.EndRequest:
    return tpb.EndRequest(transaction_id=w.txns.pop("rollback"))


CALLS: dict[str, Call] = {
    "/mqstore.v1.CommitLog/CreateTopic": Call("unary", lambda w: cpb.CreateTopicRequest(name=w.fresh("new"))),
    "/mqstore.v1.CommitLog/UpdateTopic": Call("unary", lambda w: cpb.UpdateTopicRequest(name=TOPIC)),
    "/mqstore.v1.CommitLog/DeleteTopic": Call("unary", lambda w: cpb.DeleteTopicRequest(name="doomed")),
    "/mqstore.v1.CommitLog/ListTopics": Call("unary", lambda w: cpb.ListTopicsRequest()),
    "/mqstore.v1.CommitLog/DescribeTopic": Call("unary", lambda w: cpb.DescribeTopicRequest(name=TOPIC)),
    "/mqstore.v1.CommitLog/Append": Call("unary", lambda w: cpb.AppendRequest(topic=TOPIC, messages=[_msg()])),
    "/mqstore.v1.CommitLog/AppendStream": Call("client_stream",
                                               lambda w: [cpb.AppendRequest(topic=TOPIC, messages=[_msg()])]),
    "/mqstore.v1.CommitLog/Pull": Call("unary", lambda w: cpb.PullRequest(topic=TOPIC, queue_id=0, offset=0)),
    "/mqstore.v1.CommitLog/GetMessage": Call("unary", lambda w: cpb.GetMessageRequest(
        physical_offset=w.physical_offset)),
    "/mqstore.v1.CommitLog/GetMessages": Call("unary", lambda w: cpb.GetMessagesRequest(
        physical_offsets=[w.physical_offset])),
    "/mqstore.v1.CommitLog/Tail": Call("server_stream", lambda w: cpb.TailRequest(
        start=cpb.TAIL_START_EARLIEST, topics=[TOPIC])),
    "/mqstore.v1.CommitLog/GetQueueInfo": Call("unary", lambda w: cpb.GetQueueInfoRequest(topic=TOPIC)),
    "/mqstore.v1.CommitLog/GetOffsetByTime": Call("unary", lambda w: cpb.GetOffsetByTimeRequest(topic=TOPIC)),
    "/mqstore.v1.CommitLog/CommitOffset": Call("unary", lambda w: cpb.CommitOffsetRequest(
        group=GROUP, topic=TOPIC, queue_id=0, offset=0)),
    "/mqstore.v1.CommitLog/QueryOffset": Call("unary", lambda w: cpb.QueryOffsetRequest(
        group=GROUP, topic=TOPIC, queue_id=0)),
    "/mqstore.v1.CommitLog/GetStoreInfo": Call("unary", lambda w: cpb.GetStoreInfoRequest()),
    "/mqstore.v1.CommitLog/ListRetentionHolds": Call("unary", lambda w: cpb.ListRetentionHoldsRequest()),
    # the matrix's commit log has no tier: FAILED_PRECONDITION once ADMIN is granted
    "/mqstore.v1.CommitLog/GetTierStatus": Call("unary", lambda w: cpb.GetTierStatusRequest(),
                                                allowed=grpc.StatusCode.FAILED_PRECONDITION),
    # a msg_id of no delayed message: NOT_FOUND once PUB on the topic is granted
    "/mqstore.v1.CommitLog/RecallTimer": Call("unary", lambda w: cpb.RecallTimerRequest(topic=TOPIC, msg_id="0" * 32),
                                              allowed=grpc.StatusCode.NOT_FOUND),
    # Past authentication and the permission, the shared secret is checked, then the request:
    # INVALID_ARGUMENT (no writer) shows both were passed.
    "/mqstore.v1.CommitLogInternal/Append": Call("unary", lambda w: cpb.InternalAppendRequest(topic=TOPIC),
                                                 grpc.StatusCode.INVALID_ARGUMENT,
                                                 (("mqstore-internal-token", TOKEN),)),
    "/mqstore.v1.CommitLogInternal/AppendBatches": Call("unary", lambda w: cpb.InternalAppendBatchesRequest(),
                                                        grpc.StatusCode.INVALID_ARGUMENT,
                                                        (("mqstore-internal-token", TOKEN),)),
    "/mqstore.v1.CommitLogInternal/AppendBatchesStream": Call(
        "bidi", lambda w: [cpb.InternalAppendBatchesRequest()], grpc.StatusCode.INVALID_ARGUMENT,
        (("mqstore-internal-token", TOKEN),)),
    "/mqstore.v1.Access/CreateUser": Call("unary", lambda w: apb.CreateUserRequest(name=w.fresh("made"))),
    "/mqstore.v1.Access/UpdateUser": Call("unary", lambda w: apb.UpdateUserRequest(name="victim", new_secret=True)),
    "/mqstore.v1.Access/DeleteUser": Call("unary", lambda w: apb.DeleteUserRequest(name="doomed-user")),
    "/mqstore.v1.Access/ListUsers": Call("unary", lambda w: apb.ListUsersRequest()),
    "/mqstore.v1.Access/AddRule": Call("unary", lambda w: apb.AddRuleRequest(
        user="victim", resource_kind=apb.RESOURCE_KIND_TOPIC, pattern="x*", actions=[apb.ACTION_SUB])),
    "/mqstore.v1.Access/DeleteRule": Call("unary", lambda w: apb.DeleteRuleRequest(id=w.rule_id)),
    "/mqstore.v1.Access/ListRules": Call("unary", lambda w: apb.ListRulesRequest()),
    "/mqstore.v1.Access/CreateSdkKey": Call("unary", lambda w: apb.CreateSdkKeyRequest(user="victim")),
    "/mqstore.v1.Access/ListSdkKeys": Call("unary", lambda w: apb.ListSdkKeysRequest()),
    "/mqstore.v1.Access/RevokeSdkKey": Call("unary", lambda w: apb.RevokeSdkKeyRequest(access_key=w.revocable)),
    "/mqstore.v1.Index/QueryByKey": Call("unary", lambda w: ipb.QueryByKeyRequest(topic=TOPIC, key="k")),
    "/mqstore.v1.Index/QueryByUniqKey": Call("unary", lambda w: ipb.QueryByUniqKeyRequest(
        topic=TOPIC, uniq_key=w.uniq_key)),
    "/mqstore.v1.Index/QueryByTime": Call("unary", lambda w: ipb.QueryByTimeRequest(topic=TOPIC)),
    "/mqstore.v1.Index/Stats": Call("unary", lambda w: ipb.IndexStatsRequest()),
    "/mqstore.v1.Transaction/Prepare": Call("unary", lambda w: tpb.PrepareRequest(
        topic=TOPIC, messages=[_msg()], producer_group=GROUP)),
    "/mqstore.v1.Transaction/Commit": Call("unary", _txn_commit, refused=grpc.StatusCode.NOT_FOUND),
    "/mqstore.v1.Transaction/Rollback": Call("unary", _txn_rollback, refused=grpc.StatusCode.NOT_FOUND),
    # An admitted CheckBack ends with OK when the producer closes its side after the hello.
    "/mqstore.v1.Transaction/CheckBack": Call("bidi", lambda w: [tpb.CheckBackMessage(
        hello=tpb.CheckBackHello(producer_group=GROUP))]),
    # Frames are checked as their unary calls (PUB on the topic): a refused one is answered in its error.
    "/mqstore.v1.Transaction/Transact": Call("bidi", lambda w: [tpb.TransactRequest(request_id=1, prepare=(
        tpb.PrepareRequest(topic=TOPIC, messages=[_msg()], producer_group=GROUP)))], answer=_frame_status),
    "/mqstore.v1.Transaction/ListOpen": Call("unary", lambda w: tpb.ListOpenRequest()),
    "/mqstore.v1.Transaction/Show": Call("unary", lambda w: tpb.ShowRequest(transaction_id=w.txns["show"])),
    "/mqstore.v1.Transaction/ForceResolve": Call("unary", lambda w: tpb.ForceResolveRequest(
        transaction_id=w.txns["force"], decision=tpb.DECISION_ROLLBACK, reason="matrix", operator="test")),
    "/mqstore.v1.Transaction/ListAudit": Call("unary", lambda w: tpb.ListAuditRequest()),
    "/mqstore.v1.Transaction/Stats": Call("unary", lambda w: tpb.TxnStatsRequest()),
    "/mqstore.v1.Compactor/Pull": Call("unary", lambda w: kpb.CompactedPullRequest(topic=KV, queue_id=0)),
    "/mqstore.v1.Compactor/GetLatest": Call("unary", lambda w: kpb.GetLatestRequest(topic=KV, key="key")),
    "/mqstore.v1.Compactor/BatchGetLatest": Call("unary", lambda w: kpb.BatchGetLatestRequest(topic=KV, keys=["key"])),
    "/mqstore.v1.Compactor/Scan": Call("server_stream", lambda w: kpb.ScanRequest(topic=KV)),
    "/mqstore.v1.Compactor/Compact": Call("unary", lambda w: kpb.CompactRequest(topic=KV)),
    "/mqstore.v1.Compactor/DescribeQueue": Call("unary", lambda w: kpb.DescribeQueueRequest(topic=KV)),
    "/mqstore.v1.Compactor/GetQueueOffsets": Call("unary", lambda w: kpb.GetQueueOffsetsRequest(topic=KV)),
    "/mqstore.v1.Compactor/Stats": Call("unary", lambda w: kpb.CompactorStatsRequest()),
    "/mqstore.v1.Compactor/ListQueues": Call("unary", lambda w: kpb.ListQueuesRequest()),
}

# The gateway answers in the response's Status (the gRPC status OK); every call names its client. A client
# id belongs to the user who first presented it (gateway sessions): each call is a client of its own.
CLIENT_ID = (("x-mq-client-id", "matrix-client"),)
_CLIENT_IDS = itertools.count()
ENDPOINTS = d.Endpoints(scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=8081)])
V2 = "/apache.rocketmq.v2.MessagingService/"


def _v2_topic(name: str = TOPIC) -> d.Resource:
    return d.Resource(name=name)


def _v2_queue() -> d.MessageQueue:
    return d.MessageQueue(topic=_v2_topic(), id=0)


def _v2_send(w: World) -> v2.SendMessageRequest:
    message = d.Message(topic=_v2_topic(), body=b"via gateway")
    message.system_properties.message_id = w.fresh("01")
    message.system_properties.message_type = d.NORMAL
    return v2.SendMessageRequest(messages=[message])


def _v2_receive(w: World) -> v2.ReceiveMessageRequest:
    request = v2.ReceiveMessageRequest(group=d.Resource(name=GROUP), message_queue=_v2_queue(), batch_size=1,
                                       filter_expression=d.FilterExpression(type=d.TAG, expression="*"))
    request.invisible_duration.FromMilliseconds(30_000)
    request.long_polling_timeout.FromMilliseconds(1_000)
    return request


def _v2_telemetry(w: World) -> list:
    settings = d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(topics=[_v2_topic()]))
    return [v2.TelemetryCommand(settings=settings)]


GATEWAY_CALLS: dict[str, Call] = {
    V2 + "QueryRoute": Call("unary", lambda w: v2.QueryRouteRequest(topic=_v2_topic(), endpoints=ENDPOINTS)),
    V2 + "Heartbeat": Call("unary", lambda w: v2.HeartbeatRequest(group=d.Resource(name=GROUP),
                                                                  client_type=d.SIMPLE_CONSUMER)),
    V2 + "SendMessage": Call("unary", _v2_send),
    V2 + "QueryAssignment": Call("unary", lambda w: v2.QueryAssignmentRequest(
        topic=_v2_topic(), group=d.Resource(name=GROUP), endpoints=ENDPOINTS)),
    V2 + "ReceiveMessage": Call("server_stream", _v2_receive),
    V2 + "AckMessage": Call("unary", lambda w: v2.AckMessageRequest(
        group=d.Resource(name=GROUP), topic=_v2_topic(), entries=[v2.AckMessageEntry(message_id="01",
                                                                                     receipt_handle="bad")])),
    V2 + "ForwardMessageToDeadLetterQueue": Call("unary", lambda w: v2.ForwardMessageToDeadLetterQueueRequest(
        group=d.Resource(name=GROUP), topic=_v2_topic(), receipt_handle="bad", message_id="01")),
    V2 + "PullMessage": Call("server_stream", lambda w: v2.PullMessageRequest(group=d.Resource(name=GROUP),
                                                                             message_queue=_v2_queue())),
    V2 + "UpdateOffset": Call("unary", lambda w: v2.UpdateOffsetRequest(group=d.Resource(name=GROUP),
                                                                         message_queue=_v2_queue())),
    V2 + "GetOffset": Call("unary", lambda w: v2.GetOffsetRequest(group=d.Resource(name=GROUP),
                                                                   message_queue=_v2_queue())),
    V2 + "QueryOffset": Call("unary", lambda w: v2.QueryOffsetRequest(message_queue=_v2_queue())),
    V2 + "EndTransaction": Call("unary", lambda w: v2.EndTransactionRequest(
        topic=_v2_topic(), message_id="01", transaction_id="no-such-tx", resolution=d.COMMIT,
        source=d.SOURCE_CLIENT)),
    V2 + "Telemetry": Call("bidi", _v2_telemetry),
    V2 + "NotifyClientTermination": Call("unary", lambda w: v2.NotifyClientTerminationRequest(
        group=d.Resource(name=GROUP))),
    V2 + "ChangeInvisibleDuration": Call("unary", lambda w: v2.ChangeInvisibleDurationRequest(
        group=d.Resource(name=GROUP), topic=_v2_topic(), receipt_handle="bad", message_id="01")),
    V2 + "RecallMessage": Call("unary", lambda w: v2.RecallMessageRequest(topic=_v2_topic(), recall_handle="x")),
    V2 + "SyncLiteSubscription": Call("unary", lambda w: v2.SyncLiteSubscriptionRequest(
        topic=_v2_topic(), group=d.Resource(name=GROUP))),
}
CALLS.update({method: dataclasses.replace(call, metadata=CLIENT_ID) for method, call in GATEWAY_CALLS.items()})
CALLS.update({
    "/mqstore.v1.Consumer/Receive": Call("unary", lambda w: ppb.ReceiveRequest(
        group=GROUP, topic=TOPIC, invisible_duration_ms=10_000)),
    "/mqstore.v1.Consumer/Ack": Call("unary", lambda w: ppb.AckRequest(group=GROUP, topic=TOPIC,
                                                                       receipt_handles=["bad"])),
    "/mqstore.v1.Consumer/ChangeInvisibleDuration": Call("unary", lambda w: ppb.ChangeInvisibleDurationRequest(
        group=GROUP, topic=TOPIC, receipt_handle="bad", invisible_duration_ms=1_000),
        grpc.StatusCode.INVALID_ARGUMENT),
    "/mqstore.v1.Consumer/ForwardToDeadLetter": Call("unary", lambda w: ppb.ForwardToDeadLetterRequest(
        group=GROUP, topic=TOPIC, receipt_handle="bad"), grpc.StatusCode.INVALID_ARGUMENT),
    "/mqstore.v1.Consumer/Stats": Call("unary", lambda w: ppb.PopStatsRequest()),
    "/mqstore.v1.Consumer/GetGroupSettings": Call("unary", lambda w: ppb.GetGroupSettingsRequest(group=GROUP)),
    "/mqstore.v1.Consumer/SetGroupSettings": Call("unary", lambda w: ppb.GroupSettings(group=GROUP, ordered=False)),
    # The commit log leads a static group of one: an admitted Replicate that opens with an ack instead of
    # its hello, or a switchover where no controller runs, is refused by the servicer, after the check.
    "/mqstore.v1.Replication/Replicate": Call("bidi", lambda w: [rpb.ReplicaMessage(ack=rpb.ReplicaAck())],
                                              grpc.StatusCode.INVALID_ARGUMENT),
    "/mqstore.v1.Replication/GetReplicationState": Call("unary", lambda w: rpb.GetReplicationStateRequest()),
    "/mqstore.v1.Replication/TransferLeadership": Call("unary", lambda w: rpb.TransferLeadershipRequest(
        target_node_id="n2"), grpc.StatusCode.FAILED_PRECONDITION),
})
SERVER_OF = {"CommitLog": "commitlog", "CommitLogInternal": "commitlog", "Access": "commitlog", "Index": "index",
             "Transaction": "txn", "Compactor": "compactor", "Consumer": "commitlog", "MessagingService": "gateway",
             "Replication": "commitlog"}


def _secret_of(user: str) -> str:
    return f"secret-of-{user}-0123456789"


def _users(admin: AccessAdmin, world: World) -> None:
    """only-X: exactly action X on every topic, group and the cluster; others-X: the two other actions.
    Each has an SDK key too (the gateway's signed requests)."""
    for action in access.ACTIONS:
        others = frozenset(access.ACTIONS) - {action}
        for name, actions in ((f"only-{action.lower()}", frozenset({action})), (f"others-{action.lower()}", others)):
            admin.create_user(name, access.NORMAL, _secret_of(name))
            for kind in (access.TOPIC, access.GROUP):
                admin.add_rule(name, kind, "*", actions, access.ALLOW)
            admin.add_rule(name, access.CLUSTER, "*", actions, access.ALLOW)
            created = admin.create_sdk_key(name)
            world.sdk_keys[name] = (created.key.access_key, created.secret_key)
    admin.create_user("victim", access.NORMAL, _secret_of("victim"))
    world.revocable = admin.create_sdk_key("victim").key.access_key
    admin.create_user("doomed-user", access.NORMAL, _secret_of("doomed-user"))


def _auth(url: str, token: str = TOKEN, kek_file: str = "",
          transport: Transport = PLAINTEXT) -> tuple[ServerConfig, Peers]:
    """A server's settings with authentication on, served over ``transport``, and how the services call each
    other (as the internal identity, over the same transport: with the client certificate over mutual TLS)."""
    peers = Peers(transport.client(), "service", Secret(token))
    auth = AuthConfig(enabled=True, url=Secret(url), refresh_ms=100, internal_token=Secret(token), kek_file=kek_file)
    return ServerConfig(port=0, grace_s=0.5, metrics_port=0, auth=auth, peers=peers, tls=transport.server()), peers


@contextlib.contextmanager
def _services(tmp_path: pathlib.Path, transport: Transport = PLAINTEXT, **txn_overrides):
    """``transport``: every server's, the Local gateway port's included (open a client's channel with
    ``transport.channel(port)``); ``txn_overrides``: the Transaction service's settings, as txn_config's
    (transaction_timeout_ms, ...)."""
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    server, peers = _auth(url, kek_file=str(tmp_path / "auth.kek"), transport=transport)
    txn_port = free_port()  # the commit log's Local-mode gateway is told it before the service starts
    local_gateway = LocalGatewayConfig(port=0, txn_address=f"127.0.0.1:{txn_port}",
                                       gateway=GatewayConfig(long_poll_min_ms=500, long_poll_max_ms=3000))
    log_config = dataclasses.replace(make_config(tmp_path / "log"), server=server, internal_token=TOKEN,
                                     replication=ReplicationConfig(node_id="n1"),  # serves mqstore.v1.Replication
                                     hosted=(LocalMode(gateway=local_gateway),))
    with contextlib.ExitStack() as stack:
        log_server, log_port = stack.enter_context(commitlog_serving(log_config))
        address = f"127.0.0.1:{log_port}"
        index_config = IndexServiceConfig(
            index=IndexConfig(tmp_path / "index", slot_count=16, entry_count=64, max_keys_per_message=8),
            server=server, commitlog_address=address,
            follower=FollowerConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200))
        txn_cfg = dataclasses.replace(txn_config(tmp_path / "txn", log_port, **txn_overrides),
                                      server=dataclasses.replace(server, port=txn_port))
        compactor_cfg = dataclasses.replace(compactor_config(tmp_path / "compactor", log_port), server=server)
        servers = {"commitlog": (log_server, log_port)}
        servers["index"] = stack.enter_context(index_serving(index_config))
        servers["txn"] = stack.enter_context(txn_serving(txn_cfg))
        servers["compactor"] = stack.enter_context(compactor_serving(compactor_cfg))
        gateway_cfg = GatewayServiceConfig(gateway=GatewayConfig(long_poll_min_ms=500, long_poll_max_ms=3000),
                                           server=server, commitlog_address=address,
                                           txn_address=f"127.0.0.1:{servers['txn'][1]}")
        servers["gateway"] = stack.enter_context(gateway_serving(gateway_cfg))
        yield url, servers, peers, tmp_path / "auth.kek", log_server.extra_ports["gateway"]


def _stub(channel: grpc.Channel, method: str, kind: str):
    make = {"unary": channel.unary_unary, "client_stream": channel.stream_unary,
            "server_stream": channel.unary_stream, "bidi": channel.stream_stream}[kind]
    return make(method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b)


def _invoke(channel: grpc.Channel, method: str, call: Call, request, metadata) -> grpc.StatusCode:
    stub = _stub(channel, method, call.kind)
    metadata = tuple((k, f"{v}-{next(_CLIENT_IDS)}") if k == "x-mq-client-id" else (k, v) for k, v in metadata)
    timeout = TIMEOUT_S
    try:
        if call.kind in ("unary", "client_stream"):
            stub(iter(request) if call.kind == "client_stream" else request, timeout=timeout, metadata=metadata)
        else:
            responses = stub(iter(request) if call.kind == "bidi" else request, timeout=timeout, metadata=metadata)
            first = next(iter(responses), None)
            responses.cancel()
            if call.answer is not None and first is not None:
                return call.answer(first)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _prepare_world(url: str, servers: dict, peers: Peers, kek_file: pathlib.Path) -> World:
    world = World({name: port for name, (_, port) in servers.items()})
    with peers.channel(f"127.0.0.1:{world.ports['commitlog']}") as channel:
        def log(method, request):
            return _stub(channel, f"/mqstore.v1.CommitLog/{method}", "unary")(request, timeout=TIMEOUT_S)
        for name, kind in ((TOPIC, common_pb2.TOPIC_KIND_NORMAL), ("doomed", common_pb2.TOPIC_KIND_NORMAL),
                           (KV, common_pb2.TOPIC_KIND_COMPACTION)):
            log("CreateTopic", cpb.CreateTopicRequest(name=name, queue_count=1, kind=kind))
        appended = cpb.AppendResponse.FromString(log("Append", cpb.AppendRequest(
            topic=TOPIC, messages=[_msg(keys=["k"])])))
        world.physical_offset, world.uniq_key = appended.results[0].physical_offset, appended.results[0].uniq_key
        log("Append", cpb.AppendRequest(topic=KV, messages=[_msg(keys=["key"])]))
    with peers.channel(f"127.0.0.1:{world.ports['txn']}") as channel:
        prepare = _stub(channel, "/mqstore.v1.Transaction/Prepare", "unary")
        stats = _stub(channel, "/mqstore.v1.Transaction/Stats", "unary")
        wait_until(lambda: not tpb.TxnStats.FromString(stats(tpb.TxnStatsRequest(), timeout=TIMEOUT_S)).recovering,
                   "the txn service to recover")
        for role in ("commit", "rollback", "show", "force"):
            response = tpb.PrepareResponse.FromString(prepare(tpb.PrepareRequest(
                topic=TOPIC, messages=[_msg()], producer_group=GROUP), timeout=TIMEOUT_S))
            world.txns[role] = response.transaction_id
    with peers.channel(f"127.0.0.1:{world.ports['compactor']}") as channel:
        queues = _stub(channel, "/mqstore.v1.Compactor/ListQueues", "unary")
        wait_until(lambda: kpb.ListQueuesResponse.FromString(queues(kpb.ListQueuesRequest(), timeout=TIMEOUT_S))
                   .queues, "the compactor to hold the kv queue")
    with peers.channel(f"127.0.0.1:{world.ports['index']}") as channel:
        query = _stub(channel, "/mqstore.v1.Index/QueryByKey", "unary")
        wait_until(lambda: ipb.QueryByKeyResponse.FromString(query(ipb.QueryByKeyRequest(topic=TOPIC, key="k"),
                                                                   timeout=TIMEOUT_S)).locators, "the index")
    store = AuthStore(url, SystemClock())
    try:
        admin = AccessAdmin(store, kek=Kek(kek_file, create=True))
        _users(admin, world)
        world.rule_id = admin.add_rule("victim", access.TOPIC, "gone", frozenset({access.SUB}), access.ALLOW).rule_id
    finally:
        store.close()
    return world


def _bearer(user: str, secret: str) -> tuple:
    return ((rpc_auth.METADATA_KEY, rpc_auth.token(user, secret)),)


def _signed(access_key: str, secret_key: str, age_s: int = 0) -> tuple:
    """What a RocketMQ SDK sends with these credentials (mqstore.auth.signature), signed ``age_s`` ago."""
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - age_s))
    digest = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
    return ((rpc_auth.METADATA_KEY, f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
                                    f"Signature={digest}"), ("x-mq-date-time", date))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_rpc_of_every_service_gets_its_exact_status(tmp_path, transport, certs):
    """Over TLS too: the channel's encryption changes no answer (issue 32's attacks ran over TLS)."""
    transport = Transport(transport, certs)
    # Every event of every level, as the JSON renderer would write it (structlog's capture changes no
    # global configuration that later tests rely on).
    with structlog.testing.capture_logs() as events, \
            _services(tmp_path, transport) as (url, servers, peers, kek_file, local_port):
        world = _prepare_world(url, servers, peers, kek_file)
        world.transport = transport
        world.ports["gateway-local"] = local_port  # its denials are counted in the commit log's metrics
        if transport.kind != "plaintext":   # every port speaks TLS only, the Local gateway's too
            assert {name: _plaintext_refused(port) for name, port in world.ports.items()} == \
                dict.fromkeys(world.ports, True)
        wait_until(lambda: _probe(world), "the services to see the new users (auth_refresh_ms)")
        outcomes, denials = _run_matrix(world)
        scraped = {name: scrape(server.metrics_port) for name, (server, _) in servers.items()}
    wrong = {key: got for key, (got, want) in outcomes.items() if got != want}
    assert wrong == {}, "\n".join(f"{k}: got {g.name}, want {outcomes[k][1].name}" for k, g in wrong.items())
    counted = sum(s.value("mqstore_auth_denied_total") for s in scraped.values())
    denied_events = [e for e in events if e["event"] == "auth.denied"]
    # Denial lines are sampled (mqstore_rpc.auth.DenialLog): the rest are counted in one summary line per
    # interval (the last one written at the server's stop); the metric counts every denial
    suppressed = sum(e["suppressed"] for e in events if e["event"] == "auth.denied_suppressed")
    assert counted == len(denied_events) + suppressed == denials
    text = "\n".join(json.dumps(e, default=str) for e in events)
    for secret in [TOKEN, WRONG, *(_secret_of(u) for u in _all_users()), *(sk for _, sk in world.sdk_keys.values())]:
        assert secret not in text, "a secret reached a log line"
    assert "Signature=" not in text, "a signature reached a log line"


def _all_users() -> list[str]:
    return [f"{p}-{a.lower()}" for a in access.ACTIONS for p in ("only", "others")] + ["victim", "doomed-user"]


def _plaintext_refused(port: int) -> bool:
    """A plaintext call to ``port`` fails its connection (a TLS port's handshake): UNAVAILABLE."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False


def _probe(world: World) -> bool:
    with world.transport.channel(world.ports["compactor"]) as channel:
        code = _invoke(channel, "/mqstore.v1.Compactor/Stats", CALLS["/mqstore.v1.Compactor/Stats"],
                       kpb.CompactorStatsRequest(), _bearer("only-admin", _secret_of("only-admin")))
    return code == grpc.StatusCode.OK


def _run_matrix(world: World) -> tuple[dict, int]:
    outcomes: dict[tuple[str, ...], tuple[grpc.StatusCode, grpc.StatusCode]] = {}
    denials = 0
    for method, call, server in [(m, c, server) for m, c in CALLS.items()
                                 for server in _servers_of(m.split("/")[1].rsplit(".", 1)[1])]:
        service = method.split("/")[1].rsplit(".", 1)[1]
        need = PERMISSIONS[method]
        action = need.action
        lacking = "only-admin" if need.either else f"others-{action.lower()}"  # PUB or SUB: neither of them
        with world.transport.channel(world.ports[server]) as channel:
            cases = [("no credentials", (), grpc.StatusCode.UNAUTHENTICATED),
                     ("wrong secret", _bearer(f"only-{action.lower()}", WRONG), grpc.StatusCode.UNAUTHENTICATED),
                     ("unknown user", _bearer("nobody", WRONG), grpc.StatusCode.UNAUTHENTICATED),
                     ("missing permission", _bearer(lacking, _secret_of(lacking)), call.refused),
                     ("allowed", _bearer(f"only-{action.lower()}", _secret_of(f"only-{action.lower()}")), call.allowed)]
            # The RocketMQ SDKs' signed requests, as the same users: refused before the allowed call (which
            # may use up what it names); the gateway takes them, the other services take bearer only.
            allowed_key, lacking_key = world.sdk_keys[f"only-{action.lower()}"], world.sdk_keys[lacking]
            if service == "MessagingService":
                cases[-1:-1] = [
                    ("signed, wrong secret key", _signed(allowed_key[0], WRONG), grpc.StatusCode.UNAUTHENTICATED),
                    ("signed, unknown access key", _signed("MQ00000000000000", WRONG), grpc.StatusCode.UNAUTHENTICATED),
                    ("signed, 20 min old", _signed(*allowed_key, age_s=1200), grpc.StatusCode.UNAUTHENTICATED),
                    ("signed, missing permission", _signed(*lacking_key), grpc.StatusCode.PERMISSION_DENIED)]
                cases.append(("signed, allowed", _signed(*allowed_key), call.allowed))
            else:
                cases.insert(-1, ("signed, not the gateway", _signed(*allowed_key), grpc.StatusCode.UNAUTHENTICATED))
            for case, metadata, want in cases:
                request = call.request(world) if case in ("allowed", "signed, allowed") else _peek(call, world)
                got = _invoke(channel, method, call, request, (*metadata, *call.metadata))
                outcomes[(method, case, server)] = (got, want)
                denials += (want in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
                            or case == "missing permission") and case not in ("allowed", "signed, allowed")
    return outcomes, denials


def _servers_of(service: str) -> tuple[str, ...]:
    """The gateway's calls are made to both deployments: its own process and the commit log's port."""
    return (SERVER_OF[service], "gateway-local") if service == "MessagingService" else (SERVER_OF[service],)


def _peek(call: Call, world: World):
    """The request of a refused call: the same shape, without using up what the allowed call needs."""
    return call.request(dataclasses.replace(world, txns=dict(world.txns)))


def test_the_matrix_covers_every_rpc_in_the_permission_table():
    assert set(CALLS) == {m for m, need in PERMISSIONS.items() if need is not None}
