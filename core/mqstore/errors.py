"""The one exception tree of mqstore.

Every error a caller can cause or observe is a subclass of :class:`MqStoreError`, carries a message a
person can act on (the field, the limit, the file and position), and maps to exactly one gRPC status
code in ``mqstore_rpc.errors``. Domain code raises these; it never returns sentinels.
"""

from __future__ import annotations


class MqStoreError(Exception):
    """Base of all mqstore errors."""

    retriable = False


class InvalidArgument(MqStoreError):
    """The request is malformed: a field is missing, too large or has the wrong shape."""


class NotFound(MqStoreError):
    """The topic, queue, message or offset asked for does not exist."""


class AlreadyExists(MqStoreError):
    """The thing to create exists already."""


class OutOfRange(MqStoreError):
    """An offset or position outside the valid range; the message states the range."""

    def __init__(self, message: str, *, min_value: int | None = None, max_value: int | None = None):
        super().__init__(message)
        self.min_value = min_value
        self.max_value = max_value


class FailedPrecondition(MqStoreError):
    """The store is not in a state that allows the operation (protected topic, needs repair...)."""


class NotLeader(FailedPrecondition):
    """A write (append, topic change, offset commit) reached a replica of the commit log; only the leader
    takes writes. ``leader_address`` ("host:port", "" while no leader is known) is where to send it."""

    def __init__(self, message: str, *, leader_address: str = ""):
        super().__init__(message)
        self.leader_address = leader_address


class PermissionDenied(MqStoreError):
    """The caller may not do this: a service-to-service door called without the shared secret, or an
    authenticated user without the permission the call needs (the message names it)."""


class Unauthenticated(MqStoreError):
    """The call carries no credentials, or credentials that are not accepted (mqstore.auth)."""


class ResourceExhausted(MqStoreError):
    """A resource ran out: disk full (read-only mode), too many waiters."""


class Unavailable(MqStoreError):
    """Try again later: starting, stopping, or an fsync did not confirm in time."""

    retriable = True


class NotWritten(Unavailable):
    """Unavailable, and certain that nothing was done: the request never reached the service (no connection
    could be made to it), or a leader refused it before writing anything (its lease unconfirmed, a handover
    under way, too few replicas in sync). Safe to send again as it is; no retry can duplicate it."""


class FlushTimeout(Unavailable):
    """A SYNC append was written but no fsync covered it within the timeout."""


class NotEnoughReplicas(NotWritten):
    """A SYNC-replicated append was refused before anything was written: fewer copies are in sync than
    ``min_insync_replicas`` asks for (Kafka's NOT_ENOUGH_REPLICAS, RocketMQ's IN_SYNC_REPLICAS_NOT_ENOUGH)."""


class ReplicationTimeout(Unavailable):
    """A SYNC-replicated append is written on the leader but not enough in-sync replicas confirmed it in
    time (RocketMQ's FLUSH_SLAVE_TIMEOUT): it was never acknowledged as durable, may survive or be cut
    by a later failover, and a retry may duplicate it."""


class OutcomeUnknown(Unavailable):
    """A write to another service failed in a way that does not prove nothing was written (the
    connection dropped, a deadline passed, the peer died or timed out its fsync): it may have landed.
    The caller must find out from the log before deciding again (the Transaction service's
    "outcome unknown" state); retrying the same write blindly could apply it twice."""


class DataLoss(MqStoreError):
    """Stored bytes fail their checks (CRC, length); nothing from them is served. When one stored
    record is known to be bad, ``physical_offset`` (and for a queue read ``queue_offset``) say which,
    so that a reader can skip it deliberately."""

    def __init__(self, message: str, *, physical_offset: int | None = None, queue_offset: int | None = None):
        super().__init__(message)
        self.physical_offset = physical_offset
        self.queue_offset = queue_offset


class CorruptLog(DataLoss):
    """Corruption before the tail of the commit log; start refuses until `mqstore repair` is run."""

    def __init__(self, message: str, *, path: str, position: int, physical_offset: int):
        super().__init__(message, physical_offset=physical_offset)
        self.path = path
        self.position = position


SHOWN_CHARS = 64  # of a user value in an error message


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A value the caller gave, for an error message: its repr when short, else the repr of its first
    ``limit`` characters (or bytes) and how long it was, e.g. ``'aaaa'... (40960 bytes)``. Keys, topic
    names, ids, tokens and properties have no small bound of their own, and a message that repeats one
    whole can outgrow gRPC's status trailer (about 8 KiB), which turns the answer into another error."""
    if isinstance(value, (str, bytes, bytearray)):
        if len(value) <= limit:
            return repr(value)
        size = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(value)
        return f"{value[:limit]!r}... ({size} bytes)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class InvariantViolation(AssertionError):
    """A bug: an internal invariant does not hold. Never caused by bad input."""


def invariant(condition: bool, message: str) -> None:
    """Check an internal invariant; unlike ``assert`` this survives ``python -O``."""
    if not condition:
        raise InvariantViolation(message)


# ---- refusals of the RocketMQ 5 gateway (core/mqstore/gateway) -------------------------------------
# The RocketMQ 5 protocol names these cases with codes of its own (gateway_service.status maps each to
# its apache.rocketmq.v2.Code); through mqstore's own gRPC mapping they are the statuses of their bases.

class TopicNotFound(NotFound):
    """The topic does not exist (RocketMQ 5: TOPIC_NOT_FOUND)."""


class IllegalPropertyKey(InvalidArgument):
    """A user property uses a name the gateway sets itself (RocketMQ 5: ILLEGAL_MESSAGE_PROPERTY_KEY)."""


class IllegalMessageId(InvalidArgument):
    """A message without a usable message id (RocketMQ 5: ILLEGAL_MESSAGE_ID)."""


class IllegalDeliveryTime(InvalidArgument):
    """A delivery time the timer refuses: too far ahead (RocketMQ 5: ILLEGAL_DELIVERY_TIME)."""


class IllegalFilterExpression(InvalidArgument):
    """A filter expression the gateway cannot apply (RocketMQ 5: ILLEGAL_FILTER_EXPRESSION)."""


class IllegalInvisibleTime(InvalidArgument):
    """An invisible duration outside the allowed range (RocketMQ 5: ILLEGAL_INVISIBLE_TIME)."""


class InvalidReceiptHandle(InvalidArgument):
    """A receipt handle that does not parse, or no longer works (RocketMQ 5: INVALID_RECEIPT_HANDLE)."""


class InvalidTransactionId(InvalidArgument):
    """A transaction id that names no transaction (RocketMQ 5: INVALID_TRANSACTION_ID)."""


class PropertyConflictsWithType(InvalidArgument):
    """A message whose fields disagree with its type (RocketMQ 5: MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)."""


class ClientIdRequired(InvalidArgument):
    """A call without the x-mq-client-id header (RocketMQ 5: CLIENT_ID_REQUIRED)."""


class IllegalAccessPoint(InvalidArgument):
    """A route query without the endpoints the client used (RocketMQ 5: ILLEGAL_ACCESS_POINT)."""


class BodyTooLarge(InvalidArgument):
    """A message body over the advertised limit (RocketMQ 5: MESSAGE_BODY_TOO_LARGE)."""


class Unsupported(FailedPrecondition):
    """A message type the gateway does not serve (RocketMQ 5: UNSUPPORTED)."""
