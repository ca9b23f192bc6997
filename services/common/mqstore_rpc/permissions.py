"""What each RPC touches and the permission it needs: one table for every service (with auth on).

:data:`PERMISSIONS` maps the full method name (``/mqstore.v1.CommitLog/Append``) to a :class:`Need`:
the action (PUB, SUB, ADMIN; mqstore.auth.model) and the resources a request names, read from the
request by the interceptor (mqstore_rpc.auth) before the servicer runs. For a stream of requests every
item is checked as it arrives (AppendStream: each batch's topic). Three kinds of entries:

* a resource function of the request: the topic it names, the group, both (CommitOffset needs SUB on
  the topic and on the group, as RocketMQ checks a consumer), or the cluster for what names neither
  (GetMessage by position reads any topic's record; Stats and other figures);
* ``deferred``: the request names an object whose topic only the service knows (Commit and Rollback
  name a transaction id): the interceptor authenticates the caller, and the servicer, once it has
  looked the object up, calls :func:`mqstore_rpc.auth.require` with its topic;
* :data:`OPEN`: health and reflection, which anyone may call (probes, ``grpcurl list``).

tests/unit/test_permissions.py fails when an RPC of any service in protos/ (or of the gateway's) has
no entry, or an entry names no RPC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mqstore.auth.model import ADMIN, CLUSTER_RESOURCE, PUB, SUB, Resource, group, topic

Resources = Callable[[Any], Sequence[Resource]]


@dataclass(frozen=True)
class Need:
    action: str
    resources: Resources | None = None   # None with deferred: the servicer checks
    deferred: bool = False

    def of(self, request) -> Sequence[Resource]:
        return self.resources(request) if self.resources is not None else ()


OPEN = None  # no credentials needed


def _topic(field: str = "topic") -> Resources:
    return lambda request: (topic(getattr(request, field)),)


def _cluster(_request) -> Sequence[Resource]:
    return (CLUSTER_RESOURCE,)


def _topic_and_group(request) -> Sequence[Resource]:
    return (topic(request.topic), group(request.group))


def _tail(request) -> Sequence[Resource]:
    # A Tail without a topic filter (or with transaction types, which select records of any topic)
    # reads the whole log: the cluster. With topics only: each of them.
    if not request.topics or request.transaction_types:
        return (CLUSTER_RESOURCE,)
    return tuple(topic(name) for name in request.topics)


def _check_back(message) -> Sequence[Resource]:
    # The hello names the producer group whose checks the stream receives; answers name a check sent
    # on this stream, which the hello already allowed.
    if message.WhichOneof("kind") == "hello":
        return (group(message.hello.producer_group),)
    return ()


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
    # Also guarded by its shared secret (commitlog.proto); the services call it as `service`.
    "/mqstore.v1.CommitLogInternal/Append": _CLUSTER_ADMIN,
    # ---- Access (on the CommitLog server)
    "/mqstore.v1.Access/CreateUser": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/UpdateUser": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/DeleteUser": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/ListUsers": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/AddRule": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/DeleteRule": _CLUSTER_ADMIN,
    "/mqstore.v1.Access/ListRules": _CLUSTER_ADMIN,
    # ---- Index
    "/mqstore.v1.Index/QueryByKey": _topic_sub(),
    "/mqstore.v1.Index/QueryByUniqKey": _topic_sub(),
    "/mqstore.v1.Index/QueryByTime": _topic_sub(),
    "/mqstore.v1.Index/Stats": _CLUSTER_ADMIN,
    # ---- Transaction
    "/mqstore.v1.Transaction/Prepare": _topic_pub(),
    "/mqstore.v1.Transaction/Commit": Need(PUB, deferred=True),
    "/mqstore.v1.Transaction/Rollback": Need(PUB, deferred=True),
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
}

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
