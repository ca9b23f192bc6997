"""What each RPC touches and the permission it needs: one table for every service (with auth on).

:data:`PERMISSIONS` maps the full method name (``/mqstore.v1.CommitLog/Append``) to a :class:`Need`:
the action (PUB, SUB, ADMIN; mqstore.access) and the resources a request names, read from the
request by the interceptor (mqstore_rpc.auth) before the servicer runs. For a stream of requests every
item is checked as it arrives (AppendStream: each batch's topic). Three kinds of entries:

* a resource function of the request: the topic it names, the group, both (CommitOffset needs SUB on
  the topic and on the group, as RocketMQ checks a consumer), or the cluster for what names neither
  (GetMessage by position reads any topic's record; Stats and other figures);
* ``deferred``: the request names an object whose topic only the service knows (Commit and Rollback
  name a transaction id): the interceptor authenticates the caller, and the servicer, once it has
  looked the object up, calls :func:`mqstore_rpc.auth.require` with its topic and producer group, and
  answers a denial as it answers an unknown id (txn.proto: no existence oracle) (Transact: for each
  frame, as its unary call would be checked; a denied frame is answered in its ``error``, as its call
  would be, and the stream goes on);
* :data:`OPEN`: health and reflection, which anyone may call (probes, ``grpcurl list``).

Whatever a resource function names, two kinds of topic are decided before the user's rules
(mqstore.auth.reserved, in Authority.decide, so every entry and every deferred check is covered): a
system topic (``RMQ_SYS_*``, ``rmq_sys_REVIVE_LOG``, ...) only for the internal identity ``service``, a
super user refused too; a retry or dead-letter topic needs the action on the group it encodes as well.

tests/unit/ops/test_permissions.py fails when an RPC of a service some server registers (protos/, the
gateway's apache.rocketmq.v2.MessagingService) has no entry, or an entry names no RPC.

The gateway's RocketMQ clients: with authentication on, the gateway takes the same bearer credentials
(metadata ``authorization: Bearer <user>:<secret>``). The official RocketMQ 5 SDKs sign each request
with HMAC-SHA1 of an AccessKey/SecretKey instead, which cannot be checked against a hashed secret: with
authentication on they cannot use the gateway until they send bearer credentials (README).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mqstore.access import ADMIN, CLUSTER_RESOURCE, PUB, SUB, Resource, group, topic

# A resource function gives the resources a request names; an item may also be (action, resource) when
# the request names resources for different actions (a RocketMQ client's Telemetry settings).
Resources = Callable[[Any], Sequence[Resource | tuple[str, Resource]]]


@dataclass(frozen=True)
class Need:
    action: str
    resources: Resources | None = None   # None with deferred: the servicer checks
    deferred: bool = False
    either: str = ""                     # a second action that also suffices (QueryRoute: PUB or SUB)

    def __post_init__(self) -> None:
        if self.deferred and self.resources is not None:  # the interceptor checks no resource of a deferred need
            raise ValueError("a deferred Need names no resources: its servicer checks them (mqstore_rpc.auth.require)")

    def checks(self, request) -> list[tuple[tuple[str, ...], Resource]]:
        """(actions any one of which suffices, resource) for each resource the request names."""
        return [check for item in (self.resources(request) if self.resources is not None else ())
                for check in self.check(item)]

    def check(self, item: Resource | tuple[str, Resource]) -> list[tuple[tuple[str, ...], Resource]]:
        """(actions any one of which suffices, resource) for one item a resource function gave."""
        if isinstance(item, Resource):
            return [((self.action, self.either) if self.either else (self.action,), item)]
        return [((item[0],), item[1])]


OPEN = None  # no credentials needed


def _topic(field: str = "topic") -> Resources:
    return lambda request: (topic(getattr(request, field)),)


def _cluster(_request) -> Sequence[Resource]:
    return (CLUSTER_RESOURCE,)


def _topic_and_group(request) -> Sequence[Resource]:
    return (topic(request.topic), group(request.group))


def _group(request) -> Sequence[Resource]:
    return (group(request.group),)


def _tail(request) -> Sequence[Resource | tuple[str, Resource]]:
    # A Tail without a topic filter (or with transaction types, which select records of any topic)
    # reads the whole log: the cluster. With topics only: each of them. Naming a retention hold stops
    # retention of the whole log: ADMIN on the cluster too (mqstore.retention_holds).
    hold = ((ADMIN, CLUSTER_RESOURCE),) if request.hold_retention_as else ()
    if not request.topics or request.transaction_types:
        return (CLUSTER_RESOURCE, *hold)
    return (*(topic(name) for name in request.topics), *hold)


def _prepare(request) -> Sequence[Resource]:
    # The topic and the producer group the halves are recorded with (PGROUP), as RocketMQ ACL 2.0 checks
    # a producer's Group resource: check-back asks that group, and ending the transaction needs PUB on both.
    return (topic(request.topic), group(request.producer_group))


def _check_back(message) -> Sequence[Resource]:
    # The hello names the producer group whose checks the stream receives; the servicer sends only the
    # checks of topics the stream's user may PUB (mqstore.txn.checkback), and answers name a check sent
    # on this stream.
    if message.WhichOneof("kind") == "hello":
        return (group(message.hello.producer_group),)
    return ()


def _v2_name(resource) -> str:
    """A RocketMQ v2 Resource's name (its namespace is not used by mqstore)."""
    return resource.name


def _v2_topic_and_group(request) -> Sequence[Resource]:
    return (topic(_v2_name(request.topic)), group(_v2_name(request.group)))


def _v2_queue_and_group(request) -> Sequence[Resource]:
    return (topic(_v2_name(request.message_queue.topic)), group(_v2_name(request.group)))


def _v2_group_if_any(request) -> Sequence[Resource]:
    # Producers send no group: authenticating them is the whole check.
    return (group(_v2_name(request.group)),) if request.HasField("group") and request.group.name else ()


def _v2_sent_topics(request) -> Sequence[Resource]:
    return tuple(topic(name) for name in sorted({_v2_name(m.topic) for m in request.messages}))


def _v2_telemetry(command) -> Sequence[tuple[str, Resource]]:
    # The client's settings say what it will do: publish to topics (PUB), or receive as a group (SUB on
    # the group and each subscribed topic). The other commands answer what the gateway asked.
    if not command.HasField("settings"):
        return ()
    settings = command.settings
    out = [(PUB, topic(_v2_name(t))) for t in settings.publishing.topics]
    if settings.HasField("subscription"):
        out.append((SUB, group(_v2_name(settings.subscription.group))))
        out += [(SUB, topic(_v2_name(e.topic))) for e in settings.subscription.subscriptions]
    return out


def _topic_pub(field: str = "topic") -> Need:
    return Need(PUB, _topic(field))


def _topic_sub(field: str = "topic") -> Need:
    return Need(SUB, _topic(field))


def _topic_admin(field: str = "topic") -> Need:
    return Need(ADMIN, _topic(field))


_CLUSTER_SUB = Need(SUB, _cluster)
_CLUSTER_ADMIN = Need(ADMIN, _cluster)

PERMISSIONS: dict[str, Need | None] = {
    # ---- CommitLog
    "/mqstore.v1.CommitLog/CreateTopic": _topic_admin("name"),
    "/mqstore.v1.CommitLog/UpdateTopic": _topic_admin("name"),
    "/mqstore.v1.CommitLog/DeleteTopic": _topic_admin("name"),
    "/mqstore.v1.CommitLog/ListTopics": _CLUSTER_SUB,
    "/mqstore.v1.CommitLog/DescribeTopic": _topic_sub("name"),
    "/mqstore.v1.CommitLog/Append": _topic_pub(),
    "/mqstore.v1.CommitLog/AppendStream": _topic_pub(),
    "/mqstore.v1.CommitLog/Pull": _topic_sub(),
    "/mqstore.v1.CommitLog/GetMessage": _CLUSTER_SUB,
    "/mqstore.v1.CommitLog/GetMessages": _CLUSTER_SUB,
    "/mqstore.v1.CommitLog/Tail": Need(SUB, _tail),
    "/mqstore.v1.CommitLog/GetQueueInfo": _topic_sub(),
    "/mqstore.v1.CommitLog/GetOffsetByTime": _topic_sub(),
    "/mqstore.v1.CommitLog/CommitOffset": Need(SUB, _topic_and_group),
    "/mqstore.v1.CommitLog/QueryOffset": Need(SUB, _topic_and_group),
    "/mqstore.v1.CommitLog/GetStoreInfo": _CLUSTER_SUB,
    "/mqstore.v1.CommitLog/ListRetentionHolds": _CLUSTER_ADMIN,
    "/mqstore.v1.CommitLog/GetTierStatus": _CLUSTER_ADMIN,
    "/mqstore.v1.CommitLog/RecallTimer": _topic_pub(),
    # Also guarded by its shared secret (commitlog.proto); the services call it as `service`.
    "/mqstore.v1.CommitLogInternal/Append": _CLUSTER_ADMIN,
    "/mqstore.v1.CommitLogInternal/AppendBatches": _CLUSTER_ADMIN,
    "/mqstore.v1.CommitLogInternal/AppendBatchesStream": _CLUSTER_ADMIN,
    # ---- Replication (on the CommitLog server): a replica's stream reads the whole log as `service`
    "/mqstore.v1.Replication/Replicate": _CLUSTER_ADMIN,
    "/mqstore.v1.Replication/GetReplicationState": _CLUSTER_SUB,
    "/mqstore.v1.Replication/TransferLeadership": _CLUSTER_ADMIN,
    # ---- Access (on the CommitLog server)
    "/mqstore.v1.Access/CreateUser": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/UpdateUser": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/DeleteUser": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/ListUsers": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/AddRule": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/DeleteRule": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/ListRules": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/CreateSdkKey": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/ListSdkKeys": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/RevokeSdkKey": _CLUSTER_ADMIN,
    # ---- Index
    "/mqstore.v1.Index/QueryByKey": _topic_sub(),
    "/mqstore.v1.Index/QueryByUniqKey": _topic_sub(),
    "/mqstore.v1.Index/QueryByTime": _topic_sub(),
    "/mqstore.v1.Index/Stats": _CLUSTER_ADMIN,
    # ---- Transaction
    "/mqstore.v1.Transaction/Prepare": Need(PUB, _prepare),
    # PUB on the transaction's own topic and group, looked up by id; refused as an unknown id (no oracle)
    "/mqstore.v1.Transaction/Commit": Need(PUB, deferred=True),
    "/mqstore.v1.Transaction/Rollback": Need(PUB, deferred=True),
    "/mqstore.v1.Transaction/Transact": Need(PUB, deferred=True),  # each frame as its call: the servicer checks
    "/mqstore.v1.Transaction/CheckBack": Need(PUB, _check_back),
    "/mqstore.v1.Transaction/ListOpen": _CLUSTER_ADMIN,
    "/mqstore.v1.Transaction/Show": _CLUSTER_ADMIN,
    "/mqstore.v1.Transaction/ForceResolve": _CLUSTER_ADMIN,
    "/mqstore.v1.Transaction/ListAudit": _CLUSTER_ADMIN,
    "/mqstore.v1.Transaction/Stats": _CLUSTER_ADMIN,
    # ---- Compactor
    "/mqstore.v1.Compactor/Pull": _topic_sub(),
    "/mqstore.v1.Compactor/GetLatest": _topic_sub(),
    "/mqstore.v1.Compactor/BatchGetLatest": _topic_sub(),
    "/mqstore.v1.Compactor/Scan": _topic_sub(),
    "/mqstore.v1.Compactor/Compact": _topic_admin(),
    "/mqstore.v1.Compactor/DescribeQueue": _topic_sub(),
    "/mqstore.v1.Compactor/GetQueueOffsets": _topic_sub(),
    "/mqstore.v1.Compactor/Stats": _CLUSTER_ADMIN,
    "/mqstore.v1.Compactor/ListQueues": _CLUSTER_ADMIN,
    # ---- Consumer (pop consumption, on the CommitLog server): the topic and the group
    "/mqstore.v1.Consumer/Receive": Need(SUB, _topic_and_group),
    "/mqstore.v1.Consumer/Ack": Need(SUB, _topic_and_group),
    "/mqstore.v1.Consumer/ChangeInvisibleDuration": Need(SUB, _topic_and_group),
    "/mqstore.v1.Consumer/ForwardToDeadLetter": Need(SUB, _topic_and_group),
    "/mqstore.v1.Consumer/Stats": _CLUSTER_ADMIN,
    "/mqstore.v1.Consumer/GetGroupSettings": Need(SUB, _group),
    "/mqstore.v1.Consumer/SetGroupSettings": Need(ADMIN, _group),
    # ---- the RocketMQ 5 gateway (apache.rocketmq.v2.MessagingService)
    "/apache.rocketmq.v2.MessagingService/QueryRoute": Need(SUB, lambda r: (topic(_v2_name(r.topic)),), either=PUB),
    "/apache.rocketmq.v2.MessagingService/Heartbeat": Need(SUB, _v2_group_if_any, either=PUB),
    "/apache.rocketmq.v2.MessagingService/SendMessage": Need(PUB, _v2_sent_topics),
    "/apache.rocketmq.v2.MessagingService/QueryAssignment": Need(SUB, _v2_topic_and_group),
    "/apache.rocketmq.v2.MessagingService/ReceiveMessage": Need(SUB, _v2_queue_and_group),
    "/apache.rocketmq.v2.MessagingService/AckMessage": Need(SUB, _v2_topic_and_group),
    "/apache.rocketmq.v2.MessagingService/ForwardMessageToDeadLetterQueue": Need(SUB, _v2_topic_and_group),
    "/apache.rocketmq.v2.MessagingService/PullMessage": Need(SUB, _v2_queue_and_group),
    "/apache.rocketmq.v2.MessagingService/UpdateOffset": Need(SUB, _v2_queue_and_group),
    "/apache.rocketmq.v2.MessagingService/GetOffset": Need(SUB, _v2_queue_and_group),
    "/apache.rocketmq.v2.MessagingService/QueryOffset": Need(SUB, lambda r: (topic(_v2_name(r.message_queue.topic)),)),
    # The request's topic, which the Transaction service then requires to be the transaction's own (and
    # its producer group the topic, the gateway's rule): EndRequest.topic and producer_group, else NOT_FOUND
    "/apache.rocketmq.v2.MessagingService/EndTransaction": Need(PUB, lambda r: (topic(_v2_name(r.topic)),)),
    "/apache.rocketmq.v2.MessagingService/Telemetry": Need(PUB, _v2_telemetry),
    "/apache.rocketmq.v2.MessagingService/NotifyClientTermination": Need(SUB, _v2_group_if_any, either=PUB),
    "/apache.rocketmq.v2.MessagingService/ChangeInvisibleDuration": Need(SUB, _v2_topic_and_group),
    "/apache.rocketmq.v2.MessagingService/RecallMessage": Need(PUB, lambda r: (topic(_v2_name(r.topic)),)),
    "/apache.rocketmq.v2.MessagingService/SyncLiteSubscription": Need(SUB, _v2_topic_and_group),
}

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
