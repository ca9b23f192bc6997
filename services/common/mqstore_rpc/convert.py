"""Conversions between the mqstore.v1 protos and the core's plain data (mqstore.model), both ways: the
servers convert requests in and results out; the CommitLog client (commitlog_client.py) the reverse.

Enum values must be known ones (proto3 enums are open). Everything else about a request (zero means
"the default", clamps, topic names, limits, offsets) is the core's business: MessageStore checks it.

``messages_in`` is the append hot path (100k+ messages/s through one process): it does no work a message
does not need (no dict copy for empty properties, no tuple for empty keys).
"""

from __future__ import annotations

import functools
import socket
from typing import Iterable, Sequence

from mqstore import model
from mqstore.format.record import (PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, SYSFLAG_TX_COMMIT, SYSFLAG_TX_MASK,
                                   SYSFLAG_TX_NOT, SYSFLAG_TX_PREPARED, SYSFLAG_TX_ROLLBACK)
from mqstore.format.record_reader import Record
from mqstore.errors import InvalidArgument, shown
from mqstore.timer import messages as timer_messages
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2

LOOPBACK_V4 = b"\x7f\x00\x00\x01"

_KIND_TO_PB = {kind: common_pb2.TopicKind.Value(f"TOPIC_KIND_{kind}") for kind in model.TOPIC_KINDS}
_KIND_FROM_PB = {value: kind for kind, value in _KIND_TO_PB.items()}
_KIND_FROM_PB[common_pb2.TOPIC_KIND_UNSPECIFIED] = model.KIND_NORMAL  # "treated as NORMAL on create"
_DURABILITY_TO_PB = {model.DURABILITY_WRITTEN: common_pb2.DURABILITY_WRITTEN,
                     model.DURABILITY_FLUSHED: common_pb2.DURABILITY_FLUSHED}
_DURABILITY_FROM_PB = {value: name for name, value in _DURABILITY_TO_PB.items()}
_TAIL_START_FROM_PB = {commitlog_pb2.TAIL_START_AT_OFFSET: model.TAIL_AT_OFFSET,
                       commitlog_pb2.TAIL_START_EARLIEST: model.TAIL_EARLIEST,
                       commitlog_pb2.TAIL_START_LATEST: model.TAIL_LATEST}
_BOUNDARY_FROM_PB = {commitlog_pb2.TIME_BOUNDARY_LOWER: "lower", commitlog_pb2.TIME_BOUNDARY_UPPER: "upper"}


# ---- peers and hosts ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)  # one peer string per connection, asked on every Append
def peer_address(peer: str) -> tuple[bytes, int]:
    """(IPv4 address, port) of a gRPC peer string such as ``ipv4:127.0.0.1:53211``, for BORNHOST.

    Other peers (IPv6, unix sockets) get 127.0.0.1:0: the record keeps IPv4 born hosts.
    """
    if peer.startswith("ipv4:"):
        host, _, port = peer[5:].rpartition(":")
        try:
            return socket.inet_aton(host), int(port)
        except (OSError, ValueError):
            pass  # not a dotted quad after all; fall through to the placeholder
    return LOOPBACK_V4, 0


def host_text(address: bytes, port: int) -> str:
    """``ip:port`` (``[ip]:port`` for IPv6) of a record's born or store host."""
    if len(address) == 16:
        return f"[{socket.inet_ntop(socket.AF_INET6, address)}]:{port}"
    return f"{socket.inet_ntop(socket.AF_INET, address)}:{port}"


_host_text_cached = functools.lru_cache(maxsize=4096)(host_text)  # a few producers' born hosts, every message


def host_bytes(text: str) -> tuple[bytes, int]:
    """The inverse of :func:`host_text`: ``ip:port`` or ``[ip]:port`` -> (address bytes, port)."""
    host, _, port = text.rpartition(":")
    try:
        if host.startswith("["):
            return socket.inet_pton(socket.AF_INET6, host[1:-1]), int(port)
        return socket.inet_aton(host), int(port)
    except (OSError, ValueError):
        raise InvalidArgument(f"not a host ip:port: {shown(text)}") from None


# ---- messages -----------------------------------------------------------------------------------------

def messages_in(messages: Iterable[common_pb2.MessageInput], peer: str) -> list[model.MessageIn]:
    """The append hot path of the pure-Python codec: one comprehension, each field read once, no
    copies of empty containers. ``WhichOneof("_queue_id")`` tells whether the proto3 optional is set
    at a tenth of the cost of ``HasField`` (measured: 0.18 us against 1.7 us).

    Properties are taken in order of name: a protobuf map has no order (upb iterates it in an order of
    its hash table that changes from process to process), so the same request is stored as the same
    bytes every time, and by both codecs (mqstore.codec's WireMessages sorts them the same way)."""
    born_host, born_port = peer_address(peer)
    new = model.MessageIn
    return [new(m.body, m.tags, tuple(keys) if (keys := m.keys) else (), _by_name(m.properties, m), m.flag,
                m.born_timestamp_ms, m.queue_id if m.WhichOneof("_queue_id") else None, m.sharding_key, born_host,
                born_port)
            for m in messages]


def _by_name(properties, message=None) -> dict[str, str]:
    """The properties sorted by name; a delivery field (MessageInput.delay_ms, deliver_at_ms) becomes the timer's
    property (mqstore.timer.messages), winning over the properties that ask for a time."""
    if message is not None and (message.delay_ms or message.deliver_at_ms):
        return _timed(properties, message)
    if not properties:
        return {}
    return dict(sorted(properties.items())) if len(properties) > 1 else dict(properties)


def _timed(properties, message) -> dict[str, str]:
    return timer_messages.asked_by_fields(properties, message.deliver_at_ms, message.delay_ms)


def stored_message(message: model.StoredMessage, into: common_pb2.StoredMessage | None = None):
    """The proto of a stored message; with ``into`` (a container's ``add``), built in place."""
    r = message.record
    props = r.properties
    keys = props.get(PROPERTY_KEYS)
    return (into or common_pb2.StoredMessage)(
        topic=r.topic, queue_id=r.queue_id, queue_offset=r.queue_offset, physical_offset=r.physical_offset,
        size_bytes=r.size, msg_id=message.msg_id, uniq_key=props.get(PROPERTY_UNIQ_KEY, ""), body=r.body,
        tags=props.get(PROPERTY_TAGS, ""), keys=[k for k in keys.split(" ") if k] if keys else (),
        properties=props, flag=r.flag, sys_flag=r.sys_flag,
        born_timestamp_ms=r.born_timestamp_ms, store_timestamp_ms=r.store_timestamp_ms,
        born_host=host_text(r.born_host, r.born_port), store_host=host_text(r.store_host, r.store_port),
        reconsume_times=r.reconsume_times, prepared_transaction_offset=r.prepared_transaction_offset,
        body_crc=r.body_crc)


def stored_message_out(m: common_pb2.StoredMessage) -> model.StoredMessage:
    """The inverse of :func:`stored_message` (a client's view of a message another service stored)."""
    born_host, born_port = host_bytes(m.born_host)
    store_host, store_port = host_bytes(m.store_host)
    r = Record(m.size_bytes, m.body_crc, m.queue_id, m.flag, m.queue_offset, m.physical_offset, m.sys_flag,
               m.born_timestamp_ms, born_host, born_port, m.store_timestamp_ms, store_host, store_port,
               m.reconsume_times, m.prepared_transaction_offset, m.body, m.topic, dict(m.properties))
    return model.StoredMessage(r, m.msg_id)


def message_input(m: model.MessageIn) -> common_pb2.MessageInput:
    """A message to append, as the CommitLog API takes it. The born host is the caller's address and
    the system flag and prepared offset are the server's to set: a message that sets them is refused
    rather than sent without them."""
    if m.sys_flag or m.prepared_transaction_offset:
        raise InvalidArgument("sys_flag and prepared_transaction_offset cannot be sent through the CommitLog API")
    return common_pb2.MessageInput(body=m.body, tags=m.tags, keys=m.keys, properties=m.properties, flag=m.flag,
                                   born_timestamp_ms=m.born_timestamp_ms, queue_id=m.queue_id,
                                   sharding_key=m.sharding_key)


def append_result_out(r: commitlog_pb2.AppendResult) -> model.AppendResult:
    return model.AppendResult(r.msg_id, r.uniq_key, r.queue_id, r.queue_offset, r.physical_offset, r.size_bytes,
                              r.store_timestamp_ms, _DURABILITY_FROM_PB.get(r.durability, ""), r.replicas, r.epoch)


def append_response(batches: Iterable[model.AppendResults]) -> commitlog_pb2.AppendResponse:
    """Hot path (one result per appended message), from the store's columns: ``results.add(...)``
    builds each result in place (passing ready messages to the constructor would copy each again)."""
    response = commitlog_pb2.AppendResponse()
    append_results_into(response, batches)
    return response


def append_results_into(response: commitlog_pb2.AppendResponse, batches: Iterable[model.AppendResults]) -> None:
    """:func:`append_response` into a response that is part of another message (AppendBatchResult)."""
    add = response.results.add
    for batch in batches:
        prefix, ts, durability = batch.msg_id_prefix, batch.store_timestamp_ms, _DURABILITY_TO_PB[batch.durability]
        replicas, epoch = batch.replicas, batch.epoch
        for (phys, size, qid, qoff, _, _), uniq in zip(batch.entries, batch.uniq_keys, strict=True):
            add(msg_id=f"{prefix}{phys:016X}", uniq_key=uniq, queue_id=qid, queue_offset=qoff, physical_offset=phys,
                size_bytes=size, store_timestamp_ms=ts, durability=durability, replicas=replicas, epoch=epoch)


_REPLICATION_FROM_PB = {commitlog_pb2.REPLICATION_MODE_UNSPECIFIED: None,
                        commitlog_pb2.REPLICATION_MODE_ASYNC: "ASYNC",
                        commitlog_pb2.REPLICATION_MODE_SYNC: "SYNC"}


def replication_mode_in(value: int) -> str | None:
    """AppendRequest.replication -> "ASYNC", "SYNC" or None (the server's default)."""
    try:
        return _REPLICATION_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(f"replication: unknown ReplicationMode {value}; use REPLICATION_MODE_ASYNC or "
                              f"REPLICATION_MODE_SYNC (or leave it unset for the server's default)") from None


_FILTER_FROM_PB = {common_pb2.FILTER_TYPE_TAG: "TAG", common_pb2.FILTER_TYPE_SQL92: "SQL92"}
_FILTER_TO_PB = {name: value for value, name in _FILTER_FROM_PB.items()}


def filter_type_in(value: int) -> str:
    """FilterType -> mqstore.filters' TAG or SQL92."""
    try:
        return _FILTER_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(f"filter_type: unknown FilterType {value}; use FILTER_TYPE_TAG (0) or "
                              f"FILTER_TYPE_SQL92 (1)") from None


def filter_type_out(name: str) -> int:
    return _FILTER_TO_PB[name]


def pull_result(response: commitlog_pb2.PullResponse) -> model.PullResult:
    return model.PullResult([stored_message_out(m) for m in response.messages], response.next_offset,
                            response.min_offset, response.max_offset)


def pull_response(result: model.PullResult) -> commitlog_pb2.PullResponse:
    response = commitlog_pb2.PullResponse(next_offset=result.next_offset, min_offset=result.min_offset,
                                          max_offset=result.max_offset)
    add = response.messages.add
    for m in result.messages:
        stored_message(m, add)
    return response


# ---- topics, queues, store ----------------------------------------------------------------------------

def topic_kind_in(kind: int) -> str:
    try:
        return _KIND_FROM_PB[kind]
    except KeyError:
        raise InvalidArgument(f"kind: {kind} is not a TopicKind (NORMAL = 1, COMPACTION = 2)") from None


def topic_kind_out(kind: str) -> int:
    return _KIND_TO_PB.get(kind, common_pb2.TOPIC_KIND_UNSPECIFIED)


def topic(t: model.TopicRecord) -> commitlog_pb2.Topic:
    return commitlog_pb2.Topic(name=t.name, queue_count=t.queue_count, kind=topic_kind_out(t.kind),
                               retention_ms=t.retention_ms, created_ms=t.created_ms,
                               start_physical_offset=t.start_physical_offset)


def topic_out(t: commitlog_pb2.Topic) -> model.TopicRecord:
    return model.TopicRecord(t.name, t.queue_count, topic_kind_in(t.kind), t.retention_ms, t.created_ms,
                             t.start_physical_offset)


def queue_info(q: model.QueueInfo) -> commitlog_pb2.QueueInfo:
    return commitlog_pb2.QueueInfo(topic=q.topic, queue_id=q.queue_id, min_offset=q.min_offset,
                                   max_offset=q.max_offset)


def tier_status(status) -> commitlog_pb2.TierStatus:
    """mqstore.tier.status.TierStatus on the wire (the same field names)."""
    segments = [commitlog_pb2.TierSegment(base=s.base, size=s.size, local=s.local, tiered=s.tiered, sealed=s.sealed,
                                          key=s.key) for s in status.segments]
    topics = [commitlog_pb2.TierTopic(**{name: getattr(t, name) for name in
                                         commitlog_pb2.TierTopic.DESCRIPTOR.fields_by_name}) for t in status.topics]
    fields = {name: getattr(status, name) for name in commitlog_pb2.TierStatus.DESCRIPTOR.fields_by_name
              if name not in ("segments", "topics")}
    return commitlog_pb2.TierStatus(segments=segments, topics=topics, **fields)


def queue_info_out(q: commitlog_pb2.QueueInfo) -> model.QueueInfo:
    return model.QueueInfo(q.topic, q.queue_id, q.min_offset, q.max_offset)


def topic_description(t: model.TopicRecord, queues: Sequence[model.QueueInfo]) -> commitlog_pb2.TopicDescription:
    return commitlog_pb2.TopicDescription(topic=topic(t), queues=[queue_info(q) for q in queues])


def store_info(s: model.StoreInfo) -> commitlog_pb2.StoreInfo:
    return commitlog_pb2.StoreInfo(
        min_physical_offset=s.min_physical_offset, max_physical_offset=s.max_physical_offset,
        flushed_physical_offset=s.flushed_physical_offset, visible_physical_offset=s.visible_physical_offset,
        flush_mode=s.flush_mode, read_only=s.read_only, read_only_reason=s.read_only_reason or "",
        segment_count=s.segment_count, segment_size_bytes=s.segment_size_bytes, store_host=s.store_host,
        codec=s.codec)


def store_info_out(s: commitlog_pb2.StoreInfo) -> model.StoreInfo:
    return model.StoreInfo(s.min_physical_offset, s.max_physical_offset, s.flushed_physical_offset,
                           s.visible_physical_offset, s.flush_mode, s.read_only, s.read_only_reason or None,
                           s.segment_count, s.segment_size_bytes, s.store_host, s.codec)


# ---- tail ---------------------------------------------------------------------------------------------

def tail_start(start: int) -> str:
    try:
        return _TAIL_START_FROM_PB[start]
    except KeyError:
        raise InvalidArgument(f"start: {start} is not a TailStart (AT_OFFSET = 0, EARLIEST = 1, LATEST = 2)") from None


def tail_frame(f: model.TailFrame) -> commitlog_pb2.TailFrame:
    return commitlog_pb2.TailFrame(records=f.records, record_count=f.record_count,
                                   next_physical_offset=f.next_physical_offset,
                                   log_end_physical_offset=f.log_end_physical_offset)


def tail_frame_out(f: commitlog_pb2.TailFrame) -> model.TailFrame:
    return model.TailFrame(f.records, f.record_count, f.next_physical_offset, f.log_end_physical_offset)


def time_boundary(boundary: int) -> str:
    try:
        return _BOUNDARY_FROM_PB[boundary]
    except KeyError:
        raise InvalidArgument(f"boundary: {boundary} is not a TimeBoundary (LOWER = 0, UPPER = 1)") from None


# ---- transactions and the internal way in ---------------------------------------------------------------

_TX_TYPE_FROM_PB = {commitlog_pb2.TRANSACTION_TYPE_NOT: SYSFLAG_TX_NOT,
                    commitlog_pb2.TRANSACTION_TYPE_PREPARED: SYSFLAG_TX_PREPARED,
                    commitlog_pb2.TRANSACTION_TYPE_COMMIT: SYSFLAG_TX_COMMIT,
                    commitlog_pb2.TRANSACTION_TYPE_ROLLBACK: SYSFLAG_TX_ROLLBACK}
_TX_TYPE_TO_PB = {flag: value for value, flag in _TX_TYPE_FROM_PB.items()}


def tx_type_in(value: int) -> int:
    """A TransactionType -> its SYSFLAG bits."""
    try:
        return _TX_TYPE_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(f"transaction type {value} is not a TransactionType (NOT = 0, PREPARED = 1, "
                              f"COMMIT = 2, ROLLBACK = 3)") from None


def tx_type_out(sys_flag_tx: int) -> int:
    return _TX_TYPE_TO_PB[sys_flag_tx]


def internal_messages_in(messages: Iterable[commitlog_pb2.InternalMessage], peer: str) -> list[model.MessageIn]:
    """InternalMessage -> MessageIn, with what the public MessageInput lacks (transaction type, the
    half's offset, the producer's born host)."""
    for index, m in enumerate(messages):
        if m.message.delay_ms or m.message.deliver_at_ms:
            raise InvalidArgument(f"messages[{index}].message: delay_ms and deliver_at_ms are CommitLog.Append's (the "
                                  f"timer takes them there); the internal door stores records as they are")
    out = messages_in([m.message for m in messages], peer)
    for m, item in zip(messages, out, strict=True):
        item.sys_flag = tx_type_in(m.transaction_type)
        item.prepared_transaction_offset = m.prepared_transaction_offset
        item.reconsume_times = m.reconsume_times
        if m.born_host:
            item.born_host, item.born_port = host_bytes(m.born_host)
    return out


def internal_message(m: model.MessageIn) -> commitlog_pb2.InternalMessage:
    """The inverse, for one message apart (a request of many: :func:`add_internal_messages`)."""
    plain = common_pb2.MessageInput(body=m.body, tags=m.tags, keys=m.keys, properties=m.properties, flag=m.flag,
                                    born_timestamp_ms=m.born_timestamp_ms, queue_id=m.queue_id,
                                    sharding_key=m.sharding_key)
    return commitlog_pb2.InternalMessage(
        message=plain, transaction_type=tx_type_out(m.sys_flag & SYSFLAG_TX_MASK),
        prepared_transaction_offset=m.prepared_transaction_offset, reconsume_times=m.reconsume_times,
        born_host=host_text(m.born_host, m.born_port) if m.born_port else "")


def internal_batches_request(writer: str, batches: Sequence[tuple[str, Sequence[model.MessageIn]]]) -> bytes:
    """The serialized InternalAppendBatchesRequest of ``batches`` ((topic, messages) pairs) written straight from
    the MessageIn: the bytes protobuf would parse into the request that :func:`internal_message` builds, without
    a MessageInput and an InternalMessage object per message (the gateway's sends, issue 37: ~3x cheaper).
    tests/unit/test_internal_batches_bytes.py holds it to that reference."""
    parts = [b"\x0a", _varint(len(w := writer.encode())), w] if writer else []
    for topic, messages in batches:
        batch = [b"\x0a", _varint(len(t := topic.encode())), t] if topic else []
        for m in messages:
            one = _internal_message_bytes(m)
            batch += (b"\x12", _varint(len(one)), one)
        joined = b"".join(batch)
        parts += (b"\x12", _varint(len(joined)), joined)
    return b"".join(parts)


def _internal_message_bytes(m: model.MessageIn) -> bytes:
    """One InternalMessage's bytes: fields in number order, zero values left out (proto3), queue_id when set."""
    body = m.body
    out = [b"\x0a", _varint(len(body)), body] if body else []
    if m.tags:
        out += (b"\x12", _varint(len(tags := m.tags.encode())), tags)
    for key in m.keys:
        out += (b"\x1a", _varint(len(k := key.encode())), k)
    for name, value in m.properties.items():
        entry = _string_field(b"\x0a", name) + _string_field(b"\x12", value)
        out += (b"\x22", _varint(len(entry)), entry)
    if m.flag:
        out += (b"\x28", _varint(m.flag))
    if m.born_timestamp_ms:
        out += (b"\x30", _varint(m.born_timestamp_ms))
    if m.queue_id is not None:
        out += (b"\x38", _varint(m.queue_id))
    if m.sharding_key:
        out += (b"\x42", _varint(len(shard := m.sharding_key.encode())), shard)
    plain = b"".join(out)
    head = [b"\x0a", _varint(len(plain)), plain]
    if tx_type := tx_type_out(m.sys_flag & SYSFLAG_TX_MASK):
        head += (b"\x10", _varint(tx_type))
    if m.prepared_transaction_offset:
        head += (b"\x18", _varint(m.prepared_transaction_offset))
    if m.born_port:
        head.append(_born_host_field(m.born_host, m.born_port))
    if m.reconsume_times:
        head += (b"\x28", _varint(m.reconsume_times))
    return b"".join(head)


@functools.lru_cache(maxsize=4096)  # one producer address per connection, on every send
def _born_host_field(address: bytes, port: int) -> bytes:
    return _string_field(b"\x22", host_text(address, port))


def _string_field(tag: bytes, text: str) -> bytes:
    """A map entry's key or value (written even when empty, as protobuf writes map entries)."""
    data = text.encode()
    return tag + _varint(len(data)) + data


_SMALL_VARINTS = [bytes([n]) for n in range(128)]


def _varint(value: int) -> bytes:
    """A protobuf varint; a negative value as its 64-bit two's complement (10 bytes), as int32/int64 fields."""
    if 0 <= value < 128:
        return _SMALL_VARINTS[value]
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def add_internal_messages(into, messages: Iterable[model.MessageIn]) -> None:
    """Each of ``messages`` as :func:`internal_message` would convert it, added to ``into`` (a repeated
    InternalMessage field of the request being built: a batch's ``messages``, an InternalAppendRequest's).
    Filled in place: a message built apart is copied into each message that encloses it, twice for a
    message of an AppendBatches request (~13 us a message against ~5.5 in place; bench/README.md,
    *Answered transactions*, third session). Only what differs from the default is set, as the
    constructor's keywords would leave it (``queue_id`` None: absent)."""
    add = into.add
    for m in messages:
        item = add(transaction_type=_TX_TYPE_TO_PB[m.sys_flag & SYSFLAG_TX_MASK],
                   prepared_transaction_offset=m.prepared_transaction_offset, reconsume_times=m.reconsume_times,
                   born_host=_host_text_cached(m.born_host, m.born_port) if m.born_port else "")
        plain = item.message
        plain.SetInParent()  # present even when every field is the default, as internal_message's
        plain.body = m.body
        if m.tags:
            plain.tags = m.tags
        if m.keys:
            plain.keys.extend(m.keys)
        if m.properties:
            plain.properties.update(m.properties)
        if m.flag:
            plain.flag = m.flag
        if m.born_timestamp_ms:
            plain.born_timestamp_ms = m.born_timestamp_ms
        if m.queue_id is not None:
            plain.queue_id = m.queue_id
        if m.sharding_key:
            plain.sharding_key = m.sharding_key


def internal_append_batches_request(writer: str, batches: Iterable[tuple[str, Iterable[model.MessageIn]]]
                                    ) -> commitlog_pb2.InternalAppendBatchesRequest:
    """CommitLogInternal.AppendBatches' request of ``batches`` ((topic, messages), in order), built in place
    (:func:`add_internal_messages`)."""
    request = commitlog_pb2.InternalAppendBatchesRequest(writer=writer)
    add_batch = request.batches.add
    for topic, messages in batches:
        add_internal_messages(add_batch(topic=topic).messages, messages)
    return request


def get_messages_response(lookups: Sequence[model.MessageLookup]) -> commitlog_pb2.GetMessagesResponse:
    response = commitlog_pb2.GetMessagesResponse()
    for lookup in lookups:
        entry = response.messages.add(found=lookup.message is not None, missing_reason=lookup.missing,
                                      damaged=lookup.damaged, beyond_log_end=lookup.beyond_end)
        if lookup.message is not None:
            entry.message.CopyFrom(stored_message(lookup.message))
    return response


def get_messages_out(response: commitlog_pb2.GetMessagesResponse) -> list[model.MessageLookup]:
    return [model.MessageLookup(stored_message_out(e.message) if e.found else None, e.missing_reason, e.damaged,
                                e.beyond_log_end) for e in response.messages]
