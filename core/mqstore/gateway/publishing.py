"""Sends of RocketMQ 5 clients as mqstore appends, and the topics' routes.

A v2 message becomes one :class:`mqstore.model.MessageIn`, as the Java proxy builds its broker message
(SendMessageActivity.buildMessage):

  v2 message (system properties)      mqstore message
  ----------------------------------- ---------------------------------------------------------------------
  message_id (client-generated)       property UNIQ_KEY: the Index finds it by this id, and it is what the
                                      send result and every receive return as message_id
  tag                                 tags (property TAGS)
  keys                                keys (property KEYS)
  message_group (FIFO)                sharding_key (the commit log hashes it to a queue, as the proxy does)
                                      and property __SHARDINGKEY (returned as message_group on receive)
  born_timestamp                      born_timestamp_ms
  (the producer's address)            born_host (when the gateway appends through CommitLogInternal,
                                      writer "gateway": see Publisher)
  user_properties                     properties (the names the gateway sets itself are refused)
  delivery_timestamp (DELAY)          property TIMER_DELIVER_MS: the commit log's timer delivers it then
                                      (mqstore.timer); returned as delivery_timestamp on receive
  body                                body (at most max_body_bytes)

The queue is chosen here, never taken from the request: the Node client names queue 0 for every send.
NORMAL, FIFO and DELAY sends are one CommitLog.Append each; TRANSACTION sends are Transaction.Prepare with the
topic as producer group (the proxy's rule, since v2 has no producer group on the wire). A message with a
delivery_timestamp is DELAY whatever type the client names (the proxy infers it too), and takes no message
group and no transaction. Its limit is the commit log's one (--timer-max-delay-ms: ILLEGAL_DELIVERY_TIME naming
it); a delivery time absurdly far ahead (past the year 5000) is ILLEGAL_DELIVERY_TIME naming the likely unit
mistake (the Python client 5.1.2 puts msg.delivery_timestamp into Timestamp.seconds although its docs say
milliseconds). A time in the past is delivered at once. LITE and PRIORITY are refused (Unsupported) and never
advertised.

Recall (v2 RecallMessage, RocketMQ 5's cancel of a delay message): a DELAY send's result carries a recall handle,
base64url (unpadded) of ``v1 <topic> <timer record's msg_id> <message_id>`` (RocketMQ's proxy encodes its own
``v1 topic broker TIMER_OUT_MS msgId`` the same way; a client treats it as opaque). :meth:`Publisher.recall`
decodes it and cancels with the commit log's RecallTimer (mqstore.timer.scheduling.recall, by the timer record's
msg_id): a handle that does not decode, or names another topic than the request, is InvalidArgument
(BAD_REQUEST); a message unknown or due already (delivered or being delivered) is NotFound (NOT_FOUND, saying
which: not MESSAGE_NOT_FOUND, which the Python client 5.1.2 takes for success, as on an empty receive). A recall
again before the due time answers OK again (idempotent, as RecallTimer).

A commit log's election (issue 34): while its leader is lost and until a new one takes writes (~2 s), every
append is refused without being written: a replica's NotLeader (no leader known yet, or the lost one still
named until its lease lapses) or NotWritten (the lost leader's address unreachable, a new leader not yet
confirmed or with too few replicas in sync); a transaction's Prepare likewise (the Transaction service passes its
log's NotWritten on, the half unwritten and its id released; its standby, fenced and recovering refusals are
NotWritten too, and the TxnClient raises the active one's error over the standby's: mqstore_rpc.endpoints). The
official clients retry a failed send at once, three attempts in all (RocketMQ's Java client none for a
transactional one), which an election outlasts: so :meth:`Publisher.send` sends such a refused append or Prepare
again itself, after a
pause (50 ms, doubling to 400 ms), for up to ``wait_s`` (the servicer's: --send-leader-wait-ms, at most the
client's deadline less SEND_WAIT_RESERVE_S, so that the client never gives up on a send that may still be
written and sends it twice). Nothing else is sent again: an append that may have been written (a connection
lost after sending, a deadline) is the client's to retry, as RocketMQ's proxy leaves it.

Thread-safe: the topic cache has its own lock, the Publisher's count of sends made again its own.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import structlog
from mqstore import waits
from mqstore.clock import Clock, SystemClock
from mqstore.errors import (BodyTooLarge, FailedPrecondition, IllegalDeliveryTime, IllegalMessageId,
                            IllegalPropertyKey, InvalidArgument, NotFound, NotLeader, NotWritten,
                            PropertyConflictsWithType, TopicNotFound, Unsupported)
from mqstore.format.record import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, AppendResult, MessageIn, TopicRecord
from mqstore import topics as topic_rules

NORMAL, FIFO, DELAY, TRANSACTION = "NORMAL", "FIFO", "DELAY", "TRANSACTION"
log = structlog.get_logger("mqstore.gateway.publishing")
T = TypeVar("T")
SEND_WAIT_RESERVE_S = 0.5          # a send stops waiting for a leader this long before its client's deadline
SEND_PAUSE_FIRST_S, SEND_PAUSE_MAX_S = 0.05, 0.4
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"   # RocketMQ's MessageConst.PROPERTY_SHARDING_KEY: the message group
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # mqstore.timer.messages.DELIVER_MS (a layer apart: spelled here)
# A delivery time past this (the year 5138) is a seconds field holding milliseconds (see the module docstring).
ABSURD_DELIVERY_MS = 100_000_000_000_000
# Property names the gateway, the store or the Transaction service set themselves (RocketMQ's MessageConst
# names among them): a user property of one of these names is refused, as the proxy refuses reserved keys.
RESERVED_PROPERTIES = frozenset({
    PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_SHARDING_KEY, "TRAN_MSG", "PGROUP", "REAL_TOPIC",
    "REAL_QID", "__transactionId__", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "DELAY",
    "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "RETRY_TOPIC", "RECONSUME_TIME", "MAX_RECONSUME_TIMES",
    "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "ORIGIN_MESSAGE_ID", "POP_CK", "MIN_OFFSET", "MAX_OFFSET", "WAIT"})
# What each topic kind accepts (advertised in the route as accept_message_types).
ACCEPTED_TYPES = {KIND_NORMAL: (NORMAL, FIFO, DELAY, TRANSACTION),
                  # a COMPACTION topic routes by key: a message group would contradict it, and the
                  # Transaction service refuses these topics
                  KIND_COMPACTION: (NORMAL,)}


def send_wait_s(leader_wait_ms: int, left_s: float | None) -> float:
    """How long a SendMessage's appends may wait out an election: ``leader_wait_ms`` (--send-leader-wait-ms),
    ending SEND_WAIT_RESERVE_S before the client's deadline (``left_s``: the call's time remaining, None
    without a deadline); never negative."""
    wait_s = leader_wait_ms / 1000
    if left_s is not None:
        wait_s = min(wait_s, left_s - SEND_WAIT_RESERVE_S)
    return max(0.0, wait_s)


@dataclass(slots=True)
class Publish:
    """One message of a SendMessageRequest, in the gateway's terms. Not frozen: built once per send on the
    hot path (as MessageIn, a frozen dataclass costs several times as much to construct); treat it as
    immutable."""
    topic: str
    body: bytes
    message_id: str
    message_type: str                 # NORMAL, FIFO, DELAY, TRANSACTION, or the name of another v2 type
    tag: str = ""
    keys: tuple[str, ...] = ()
    message_group: str = ""
    user_properties: dict[str, str] = field(default_factory=dict)
    born_timestamp_ms: int = 0
    # The producer's address as the gateway sees it (IPv4 bytes, port); port 0 = unknown (the commit log
    # then stores the gateway's own address)
    born_host: bytes = b"\x7f\x00\x00\x01"
    born_port: int = 0
    delivery_ms: int = 0              # delivery_timestamp in epoch ms; 0 = none


@dataclass(frozen=True, slots=True)
class Sent:
    message_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str = ""
    recall_handle: str = ""           # DELAY sends only (see the module docstring)


RECALL_HANDLE_VERSION = "v1"


def recall_handle(topic: str, timer_msg_id: str, message_id: str) -> str:
    """The recall handle of a DELAY send (see the module docstring)."""
    text = f"{RECALL_HANDLE_VERSION} {topic} {timer_msg_id} {message_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def parse_recall_handle(handle: str) -> tuple[str, str, str]:
    """(topic, timer record's msg_id, message_id) of a handle :func:`recall_handle` made; InvalidArgument for
    anything else."""
    bad = InvalidArgument(f"recall_handle {handle[:64]!r} is not one this gateway returned: give the recall_handle "
                          f"of the DELAY message's send result, unchanged")
    if not handle or len(handle) > 4096:
        raise bad
    try:
        text = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
    except (binascii.Error, ValueError):
        raise bad from None
    parts = text.split(" ", 3)
    if len(parts) != 4 or parts[0] != RECALL_HANDLE_VERSION or not all(parts[1:]):
        raise bad
    return parts[1], parts[2], parts[3]


class TopicCache:
    """DescribeTopic answers, reused for ``ttl_ms`` (routes are asked every 30 s by every client, and every
    send needs its topic's kind). A topic unknown to the commit log is TopicNotFound (never cached)."""

    def __init__(self, lookup: Callable[[str], TopicRecord], clock: Clock, ttl_ms: int):
        self._lookup, self.clock, self.ttl_ms = lookup, clock, ttl_ms
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[int, TopicRecord]] = {}

    def fresh(self, name: str) -> bool:
        """Whether :meth:`get` of ``name`` answers from the cache (no lookup)."""
        with self._lock:
            cached = self._cache.get(name)
        return cached is not None and self.clock.now_ms() - cached[0] < self.ttl_ms

    def get(self, name: str) -> TopicRecord:
        topic_rules.validate_topic_name(name)
        now = self.clock.now_ms()
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and now - cached[0] < self.ttl_ms:
            return cached[1]
        try:
            record = self._lookup(name)
        except NotFound:
            with self._lock:
                self._cache.pop(name, None)
            raise TopicNotFound(f"topic {name!r} does not exist; create it first (mqstore topic create {name})") \
                from None
        if record.kind not in ACCEPTED_TYPES:
            raise TopicNotFound(f"topic {name!r} is a system topic: clients neither send to nor receive from it")
        with self._lock:
            if len(self._cache) >= 100_000:  # bounded: names come from clients
                self._cache.clear()
            self._cache[name] = (now, record)
        return record


def accepted_types(topic: TopicRecord) -> tuple[str, ...]:
    return ACCEPTED_TYPES[topic.kind]


def writable(topic: TopicRecord) -> bool:
    """False for pop consumption's retry and dead-letter topics: clients read them (a DLQ is consumed like
    a topic) but only pop consumption writes them, so their routes are READ only."""
    return not topic_rules.is_pop_owned_topic(topic.name)


def to_message_in(p: Publish) -> MessageIn:
    """The mqstore message of a v2 message (see the module docstring); refusals are raised."""
    if not p.message_id:
        raise IllegalMessageId("system_properties.message_id is empty; the client generates one per message")
    for name in p.user_properties:
        if name in RESERVED_PROPERTIES:
            raise IllegalPropertyKey(f"user property {name[:64]!r} is a name the server sets itself; "
                                     f"reserved: {', '.join(sorted(RESERVED_PROPERTIES))}")
    properties = dict(p.user_properties)
    properties[PROPERTY_UNIQ_KEY] = p.message_id
    if p.message_group:
        properties[PROPERTY_SHARDING_KEY] = p.message_group
    if p.delivery_ms:
        properties[PROPERTY_TIMER_DELIVER_MS] = str(p.delivery_ms)
    return MessageIn(p.body, tags=p.tag, keys=p.keys, properties=properties, born_timestamp_ms=p.born_timestamp_ms,
                     sharding_key=p.message_group, born_host=p.born_host, born_port=p.born_port)


class Publisher:
    """Sends: ``append(topic, messages)`` is CommitLogInternal.Append with writer "gateway" (the record's
    born host is the producer's), or CommitLog.Append when the gateway has no internal token (the born
    host is then the gateway's); ``prepare(topic, message, group)`` is Transaction.Prepare returning
    (transaction id, half queue offset); ``recall(topic, msg_id)`` is CommitLog.RecallTimer (None: no recall
    here, Unsupported)."""

    def __init__(self, topics: TopicCache, max_body_bytes: int,
                 append: Callable[[str, list[MessageIn]], list[AppendResult]],
                 prepare: Callable[[str, MessageIn, str], tuple[str, int]],
                 recall: Callable[[str, str], int] | None = None, clock: Clock | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.topics, self.max_body_bytes, self._append, self._prepare = topics, max_body_bytes, append, prepare
        self._recall, self._clock, self._sleep = recall, clock or SystemClock(), sleep
        self._count_lock = threading.Lock()
        self.sent_again = 0   # appends sent again after a refusal that wrote nothing (an election)

    def sends_at_once(self, p: Publish) -> bool:
        """Whether :meth:`send` of ``p`` returns without waiting when the log's appends do (LogPort.appends_at_once):
        neither a transaction's half (the Transaction service) nor a delayed message (the timer), and its topic
        fresh in the cache (no DescribeTopic)."""
        return p.message_type not in (TRANSACTION, DELAY) and not p.delivery_ms and self.topics.fresh(p.topic)

    def send(self, p: Publish, wait_s: float = 0.0) -> Sent:
        """``p`` sent; an append refused without being written is sent again for up to ``wait_s`` (the module
        docstring)."""
        topic = self.topics.get(p.topic)
        self._check(p, topic)
        message = to_message_in(p)
        if p.message_type == TRANSACTION:  # a Prepare refused unwritten released its id: a new one is no duplicate
            transaction_id, half_offset = self._through_election(
                lambda: self._prepare(p.topic, message, p.topic), p.topic, wait_s)
            return Sent(p.message_id, 0, half_offset, transaction_id)
        try:
            result = self._through_election(lambda: self._append(p.topic, [message])[0], p.topic, wait_s)
        except NotFound as exc:  # deleted since it was cached
            raise TopicNotFound(f"topic {p.topic!r} does not exist (any more): {exc}") from None
        if p.delivery_ms:  # the result names the timer topic's record: what RecallTimer takes
            return Sent(p.message_id, result.queue_id, result.queue_offset,
                        recall_handle=recall_handle(p.topic, result.msg_id, p.message_id))
        return Sent(p.message_id, result.queue_id, result.queue_offset)

    def _through_election(self, send: Callable[[], T], topic: str, wait_s: float) -> T:
        give_up_s = self._clock.monotonic_s() + wait_s
        pause_s = SEND_PAUSE_FIRST_S
        while True:
            try:
                return send()
            except (NotLeader, NotWritten) as exc:  # nothing was written: the same send again is no duplicate
                if self._clock.monotonic_s() + pause_s > give_up_s:
                    raise
                log.info("gateway.send_waits_for_leader", topic=topic[:127], pause_ms=round(pause_s * 1000),
                         refused=str(exc)[:300])
            with waits.waiting():  # the handler pool runs other calls meanwhile
                self._sleep(pause_s)
            with self._count_lock:
                self.sent_again += 1
            pause_s = min(pause_s * 2, SEND_PAUSE_MAX_S)

    def recall(self, topic: str, handle: str) -> str:
        """Cancel the DELAY message of ``topic`` that ``handle`` names; returns its message_id (errors: see the
        module docstring)."""
        handle_topic, timer_msg_id, message_id = parse_recall_handle(handle)
        if handle_topic != topic:
            raise InvalidArgument(f"recall_handle is of topic {handle_topic[:127]!r}, not {topic[:127]!r}: recall "
                                  f"on the topic the message was sent to")
        if self._recall is None:
            raise Unsupported("recall is not available here: the commit log this gateway writes to has no timer")
        self.topics.get(topic)
        try:
            self._recall(topic, timer_msg_id)
        except NotFound:
            raise NotFound(f"message {message_id[:128]} of topic {topic!r}: no delayed message to recall "
                                  f"(this handle names none)") from None
        except NotLeader:
            raise
        except FailedPrecondition:
            raise NotFound(f"message {message_id[:128]} of topic {topic!r} is due already (delivered or "
                                  f"being delivered): too late to recall") from None
        return message_id

    def _check(self, p: Publish, topic: TopicRecord) -> None:
        if len(p.body) > self.max_body_bytes:
            raise BodyTooLarge(f"the message body has {len(p.body)} bytes, the limit is {self.max_body_bytes} "
                               f"(publishing.max_body_size)")
        if p.delivery_ms or p.message_type == DELAY:
            self._check_delay(p, topic)
            return
        if p.message_type in (NORMAL, FIFO, TRANSACTION):
            if p.message_type not in accepted_types(topic):
                raise PropertyConflictsWithType(f"topic {p.topic!r} ({topic.kind}) accepts only "
                                                f"{', '.join(accepted_types(topic))} messages, not {p.message_type}")
            if (p.message_type == FIFO) != bool(p.message_group):
                raise PropertyConflictsWithType("a FIFO message needs a message_group, and only a FIFO message "
                                                f"has one (message_type {p.message_type})")
            return
        raise Unsupported(f"message type {p.message_type} is not supported by this gateway (NORMAL, FIFO, DELAY "
                          f"and TRANSACTION are)")

    @staticmethod
    def _check_delay(p: Publish, topic: TopicRecord) -> None:
        if DELAY not in accepted_types(topic):
            raise PropertyConflictsWithType(f"topic {p.topic!r} ({topic.kind}) accepts only "
                                            f"{', '.join(accepted_types(topic))} messages, not DELAY")
        if not p.delivery_ms:
            raise PropertyConflictsWithType("a DELAY message needs system_properties.delivery_timestamp")
        if p.message_group or p.message_type in (FIFO, TRANSACTION):
            raise PropertyConflictsWithType(f"a message with a delivery_timestamp takes no message_group and is no "
                                            f"transaction (message_type {p.message_type})")
        if p.delivery_ms > ABSURD_DELIVERY_MS:
            raise IllegalDeliveryTime(
                f"delivery_timestamp is {p.delivery_ms // 1000} s after 1970 (the year "
                f"{p.delivery_ms // 31_556_952_000 + 1970}): a time in milliseconds was most likely given as "
                f"seconds. The Python client 5.1.2 copies msg.delivery_timestamp into Timestamp.seconds although "
                f"its docs say milliseconds: give it in seconds (int(time.time()) + delay_s)")
