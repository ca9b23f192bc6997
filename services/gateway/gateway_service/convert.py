"""apache.rocketmq.v2 messages <-> the gateway domain's plain types (mqstore.gateway, mqstore.model).

What the official clients require of a message they receive (reference: rocketmq-v2-gateway.md §2):
``system_properties.message_id`` (the UNIQ_KEY, the id the producer got back), ``receipt_handle``, an
MD5 ``body_digest`` (upper-case hex: Node dereferences the digest unconditionally and computes CRC32 as
a decimal string, so CRC32 would not do), ``body_encoding`` IDENTITY, and ``delivery_attempt``.
"""

from __future__ import annotations

import hashlib

from google.protobuf import duration_pb2, timestamp_pb2
from mqstore.gateway.publishing import (DELAY, FIFO, NORMAL, PROPERTY_SHARDING_KEY, PROPERTY_TIMER_DELIVER_MS,
                                        RESERVED_PROPERTIES, TRANSACTION, Publish)
from mqstore.timer import messages as timer_messages
from mqstore.model import StoredMessage, TopicRecord

from mqstore_rpc.convert import host_text, peer_address
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d

TYPE_NAMES = {d.NORMAL: NORMAL, d.FIFO: FIFO, d.DELAY: DELAY, d.TRANSACTION: TRANSACTION}
TYPE_VALUES = {name: value for value, name in TYPE_NAMES.items()}
TRANSACTION_PROPERTY = "TRAN_MSG"
# Properties of a stored message that are not the user's: the system properties carry them instead.
_NOT_USER = RESERVED_PROPERTIES | {"TRAN_MSG", "PGROUP"} | timer_messages.STORE_SET


def type_name(value: int) -> str:
    """NORMAL, FIFO, DELAY, TRANSACTION, or the v2 name of another type (refused by the publisher)."""
    if value in TYPE_NAMES:
        return TYPE_NAMES[value]
    return d.MessageType.Name(value) if value in d.MessageType.values() else f"message type {value}"


def duration_ms(duration: duration_pb2.Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def duration(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def publish_in(message: d.Message, peer: str) -> Publish:
    """The send hot path: each field read once; empty maps and lists are not copied (dict() of a protobuf
    map goes through the generic Mapping path, the costliest step here when it is empty). ``peer``: the
    producer's gRPC peer string (its born host; an IPv6 peer is unknown, port 0)."""
    sp = message.system_properties
    born_host, born_port = peer_address(peer)
    born = sp.born_timestamp
    properties = message.user_properties
    keys = sp.keys
    delivery = sp.delivery_timestamp if sp.HasField("delivery_timestamp") else None
    return Publish(message.topic.name, message.body, sp.message_id, type_name(sp.message_type),
                   sp.tag, tuple(keys) if keys else (), sp.message_group,
                   dict(properties) if properties else {}, born.seconds * 1000 + born.nanos // 1_000_000,
                   born_host, born_port,
                   max(1, delivery.seconds * 1000 + delivery.nanos // 1_000_000) if delivery is not None else 0)


def message_out(m: StoredMessage, *, topic: str = "", receipt_handle: str = "", delivery_attempt: int = 0,
                invisible_ms: int = 0) -> d.Message:
    """A stored message as a v2 Message (for ReceiveMessage and RecoverOrphanedTransactionCommand)."""
    record = m.record
    properties = record.properties
    out = d.Message(topic=d.Resource(name=topic or record.topic), body=record.body)
    for name, value in properties.items():
        if name not in _NOT_USER:
            out.user_properties[name] = value
    sp = out.system_properties
    sp.message_id = m.uniq_key or m.msg_id
    if m.tags:
        sp.tag = m.tags
    sp.keys.extend(m.keys)
    sp.body_digest.type = d.MD5
    sp.body_digest.checksum = hashlib.md5(record.body).hexdigest().upper()
    sp.body_encoding = d.IDENTITY
    group = properties.get(PROPERTY_SHARDING_KEY, "")
    delivered_at = properties.get(PROPERTY_TIMER_DELIVER_MS)
    if properties.get(TRANSACTION_PROPERTY) == "true":
        sp.message_type = d.TRANSACTION
    elif delivered_at is not None:  # a copy the timer delivered (mqstore.timer)
        sp.message_type = d.DELAY
        sp.delivery_timestamp.CopyFrom(timestamp(int(delivered_at)))
    else:
        sp.message_type = d.FIFO if group else d.NORMAL
    if group:
        sp.message_group = group
    sp.born_timestamp.CopyFrom(timestamp(record.born_timestamp_ms))
    sp.born_host = host_text(record.born_host, record.born_port)
    sp.store_timestamp.CopyFrom(timestamp(record.store_timestamp_ms))
    sp.store_host = host_text(record.store_host, record.store_port)
    sp.queue_id = record.queue_id
    sp.queue_offset = record.queue_offset
    if receipt_handle:
        sp.receipt_handle = receipt_handle
    if delivery_attempt:
        sp.delivery_attempt = delivery_attempt
    if invisible_ms:
        sp.invisible_duration.CopyFrom(duration(invisible_ms))
    return out


def message_queues(topic: TopicRecord, endpoints: d.Endpoints, accepted: tuple[str, ...], broker_name: str,
                   writable: bool = True) -> list[d.MessageQueue]:
    """The route of a topic: one READ_WRITE queue (READ when not ``writable``) per mqstore queue (ids
    0..n-1, so queue 0 always exists: the Node client only ever uses queue 0), all on one broker (id 0,
    the master) whose endpoints are the ones the client reached the gateway by."""
    broker = d.Broker(name=broker_name, id=0, endpoints=endpoints)
    types = [TYPE_VALUES[t] for t in accepted]
    permission = d.READ_WRITE if writable else d.READ
    return [d.MessageQueue(topic=d.Resource(name=topic.name), id=queue_id, permission=permission, broker=broker,
                           accept_message_types=types) for queue_id in range(topic.queue_count)]
