"""The timer's message properties: how a delivery time is asked for, what the timer topic's record keeps of its
real destination, and what the delivered copy carries (RocketMQ's names where RocketMQ has one).

  property            on                     meaning
  ------------------- ---------------------- ------------------------------------------------------------
  TIMER_DELAY_SEC     an append              due this many seconds after the store's clock (wins over both below)
  TIMER_DELAY_MS      an append              due this many ms after the store's clock (wins over TIMER_DELIVER_MS)
  TIMER_DELIVER_MS    an append, the copy    due at this epoch ms; the copy: when it was due
  TIMER_OUT_MS        the timer record       when it is due (epoch ms), as computed at the append
  REAL_TOPIC          the timer record       the topic it is delivered to
  REAL_QID            the timer record       the queue asked for (absent: the sharding key or round robin)
  TIMER_SHARDING_KEY  the timer record       the sharding key asked for
  TIMER_ENQUEUE_MS    the copy               when the timer record was stored
  TIMER_DEQUEUE_MS    the copy               when the copy was made
  TIMER_UNIT          the copy               the timer record's queue offset: the unit delivered (idempotence)
  TIMER_ROLL_TIMES    a rolled record, copy  how often a long delay was re-appended to the timer topic
  TIMER_ROLLED_FROM   a rolled record        the queue offset of the record it re-appends (idempotence)
  TIMER_ORIGIN        a rolled record        the queue offset of the first record of the message (recall)
  TIMER_CANCEL_OFFSET a cancel marker        the origin (queue offset of the first record) it cancels

The proto fields MessageInput.deliver_at_ms and delay_ms arrive here as TIMER_DELIVER_MS and TIMER_DELAY_MS.
The names the store sets itself are refused on every append (a client's TIMER_UNIT could hide a delivery).

Thread-safety: stateless.
"""

from __future__ import annotations

import re
import zlib
from typing import Iterable

from mqstore import topics as topic_rules
from mqstore.errors import IllegalDeliveryTime, InvalidArgument
from mqstore.format.record import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from mqstore.format.record_reader import Record, RecordView
from mqstore.model import Copies, Copy, MessageIn

TIMER_TOPIC = topic_rules.SCHEDULE_TOPIC
DELIVER_MS, DELAY_SEC, DELAY_MS = "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS"
OUT_MS, REAL_TOPIC, REAL_QID, SHARDING_KEY = "TIMER_OUT_MS", "REAL_TOPIC", "REAL_QID", "TIMER_SHARDING_KEY"
ENQUEUE_MS, DEQUEUE_MS, UNIT, ROLL_TIMES = "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_UNIT", "TIMER_ROLL_TIMES"
ROLLED_FROM, CANCEL_OFFSET, ORIGIN = "TIMER_ROLLED_FROM", "TIMER_CANCEL_OFFSET", "TIMER_ORIGIN"
ASKING = (DELAY_SEC, DELAY_MS, DELIVER_MS)  # in order of precedence
STORE_SET = frozenset({OUT_MS, REAL_TOPIC, REAL_QID, SHARDING_KEY, ENQUEUE_MS, DEQUEUE_MS, UNIT, ROLL_TIMES,
                       ROLLED_FROM, CANCEL_OFFSET, ORIGIN})
MAX_VALUE_MS = 1 << 62
_ASKING_SET = frozenset(ASKING)
_ENCODER_RESERVED = frozenset({PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY})  # the encoder checks these further
_BAD_KEY_CHARS = re.compile(r"[\x01\x02\t\n\r\f\v]")  # mqstore.log.encoder's check of keys


def asks_timer(message: MessageIn) -> bool:
    props = message.properties
    return bool(props) and any(name in props for name in ASKING)


def check_reserved(messages: Iterable[MessageIn]) -> None:
    for index, message in enumerate(messages):
        for name in message.properties or ():
            if name in STORE_SET:
                raise InvalidArgument(f"messages[{index}].properties: {name!r} is set by the store's timer itself; "
                                      f"reserved: {', '.join(sorted(STORE_SET))}")


def asked_by_fields(properties, deliver_at_ms: int, delay_ms: int) -> dict[str, str]:
    """The properties of a message whose MessageInput.deliver_at_ms or delay_ms is set (not 0): the field as the
    timer's property (delay_ms wins), the asking properties left out, sorted by name; INVALID_ARGUMENT for a
    negative field. mqstore_rpc.convert's (protobuf's messages) and :func:`wire_messages_in`'s."""
    for name, value in (("delay_ms", delay_ms), ("deliver_at_ms", deliver_at_ms)):
        if value < 0:
            raise InvalidArgument(f"{name} is {value}; it must not be negative (0 = none; "
                                  f"delay_ms: milliseconds from the server's clock, deliver_at_ms: epoch milliseconds)")
    props = {k: v for k, v in properties.items() if k not in _ASKING_SET}
    if delay_ms:
        props[DELAY_MS] = str(delay_ms)
    else:
        props[DELIVER_MS] = str(deliver_at_ms)
    return dict(sorted(props.items()))


def wire_messages_in(wire) -> list[MessageIn]:
    """The compiled codec's WireMessages of a timer-marked request as the MessageIn mqstore_rpc.convert.messages_in
    makes of the same request (its delivery fields as properties): for the reference way, where the compiled
    codec's timer_batch declines."""
    converted = wire.to_messages(MessageIn)
    for message, (deliver_at_ms, delay_ms) in zip(converted, wire.delivery_fields(), strict=True):
        if deliver_at_ms or delay_ms:
            message.properties = asked_by_fields(message.properties, deliver_at_ms, delay_ms)
    return converted


def due_ms(message: MessageIn, now_ms: int, max_delay_ms: int, index: int = 0) -> int:
    """When ``message`` (which :func:`asks_timer`) is due; INVALID_ARGUMENT for a value that is not a whole
    number or lies more than ``max_delay_ms`` ahead. A time in the past is due now."""
    props = message.properties
    name = next(n for n in ASKING if n in props)
    text = props[name]
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"messages[{index}].properties[{name}]: {text[:40]!r} is not a whole number") from None
    if value < 0 or value > MAX_VALUE_MS:
        raise InvalidArgument(f"messages[{index}].properties[{name}]: {value} is out of range (0..{MAX_VALUE_MS})")
    due = now_ms + value * 1000 if name == DELAY_SEC else now_ms + value if name == DELAY_MS else value
    if due - now_ms > max_delay_ms:
        raise IllegalDeliveryTime(
            f"messages[{index}]: due in {due - now_ms} ms ({name}={value}), more than the timer's limit of "
            f"{max_delay_ms} ms ({max_delay_ms / 86_400_000:g} days; server setting --timer-max-delay-ms)")
    return max(due, now_ms)


def to_timer(real_topic: str, message: MessageIn, due: int) -> MessageIn:
    """The timer topic's record of a delayed message: the same message with its destination in properties."""
    props = {k: v for k, v in message.properties.items() if k not in ASKING}
    props[OUT_MS] = str(due)
    props[REAL_TOPIC] = real_topic
    if message.queue_id is not None:
        props[REAL_QID] = str(message.queue_id)
    if message.sharding_key:
        props[SHARDING_KEY] = message.sharding_key
    if message.tags:
        props[PROPERTY_TAGS] = message.tags
    if message.keys:
        props[PROPERTY_KEYS] = " ".join(message.keys)
    return MessageIn(body=message.body, properties=dict(sorted(props.items())), flag=message.flag,
                     born_timestamp_ms=message.born_timestamp_ms, queue_id=0, born_host=message.born_host,
                     born_port=message.born_port)


def _due(real_topic: str, message: MessageIn, index: int, now_ms: int, max_delay_ms: int, queue_count: int) -> int:
    """:func:`due_ms` of a message whose queue_id is checked first (:func:`timer_records`)."""
    props, qid = message.properties, message.queue_id
    if qid is not None and not 0 <= qid < queue_count:
        raise InvalidArgument(f"messages[{index}].queue_id: {qid} is outside topic {real_topic!r}'s queues "
                              f"0..{queue_count - 1}")
    name = DELAY_SEC if DELAY_SEC in props else DELAY_MS if DELAY_MS in props else DELIVER_MS
    try:
        value = int(props[name])
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_VALUE_MS:
        due_ms(message, now_ms, max_delay_ms, index)  # raises why
    due = now_ms + value * 1000 if name == DELAY_SEC else now_ms + value if name == DELAY_MS else value
    if due - now_ms > max_delay_ms:
        due_ms(message, now_ms, max_delay_ms, index)  # raises why
    return due if due > now_ms else now_ms


def _timer_copies(real_topic: str, messages, now_ms: int, max_delay_ms: int,
                  queue_count: int) -> tuple[Copies, list[int]] | None:
    """:func:`timer_records` as Copies, or None (see there)."""
    converted, dues = Copies(), []
    asking, reserved = _ASKING_SET, _ENCODER_RESERVED
    for index, message in enumerate(messages):
        props, qid = message.properties, message.queue_id
        due = _due(real_topic, message, index, now_ms, max_delay_ms, queue_count)
        if not reserved.isdisjoint(props):
            return None
        out = {k: v for k, v in props.items() if k not in asking} if len(props) > 1 else {}
        out[OUT_MS] = str(due)
        out[REAL_TOPIC] = real_topic
        if qid is not None:
            out[REAL_QID] = str(qid)
        if message.sharding_key:
            out[SHARDING_KEY] = message.sharding_key
        text = "".join([f"{name}\x01{value}\x02" for name, value in sorted(out.items()) if name and value])
        if len(out) > 2 and (text.count("\x01") != len(out) or text.count("\x02") != len(out)):
            return None  # an empty name or value, or a separator in one
        tags, keys = message.tags, message.keys
        if tags:
            if "\x01" in tags or "\x02" in tags:
                return None
            text += f"TAGS\x01{tags}\x02"
        if keys:
            joined = " ".join(keys)
            if _BAD_KEY_CHARS.search(joined) or joined.count(" ") != len(keys) - 1 or "" in keys:
                return None
            text += f"KEYS\x01{joined}\x02"
        body = message.body
        converted.append(Copy(body, zlib.crc32(body) & 0x7FFFFFFF, text.encode("utf-8"), tags, "", message.flag,
                              message.born_timestamp_ms, message.born_host, message.born_port, 0, ""))
        dues.append(due)
    return converted, dues


def timer_records(real_topic: str, messages, now_ms: int, max_delay_ms: int, queue_count: int,
                  copies: bool = False) -> tuple[list[MessageIn] | Copies, list[int]]:
    """(the timer records, their due times) of a delayed batch for ``real_topic``: :func:`due_ms` and
    :func:`to_timer` of each message in one pass (the same records and errors: tests/unit/core/test_timer_enqueue.py
    holds the two to it), a queue_id outside ``queue_count`` queues INVALID_ARGUMENT. ``copies``: the records as
    :class:`Copies` with their properties written here (the encoder's bytes of the MessageIn, not checked again
    there), unless a message has what the encoder checks further (TAGS, KEYS or UNIQ_KEY among its properties, a
    separator or empty name or value, keys or tags it refuses): then MessageIn, whose encoding says what is wrong."""
    if copies:
        made = _timer_copies(real_topic, messages, now_ms, max_delay_ms, queue_count)
        if made is not None:
            return made
    converted, dues = [], []
    asking, tags_name, keys_name = _ASKING_SET, PROPERTY_TAGS, PROPERTY_KEYS
    for index, message in enumerate(messages):
        props, qid = message.properties, message.queue_id
        due = _due(real_topic, message, index, now_ms, max_delay_ms, queue_count)
        out = {k: v for k, v in props.items() if k not in asking} if len(props) > 1 else {}
        out[OUT_MS] = str(due)
        out[REAL_TOPIC] = real_topic
        if qid is not None:
            out[REAL_QID] = str(qid)
        if message.sharding_key:
            out[SHARDING_KEY] = message.sharding_key
        if message.tags:
            out[tags_name] = message.tags
        if message.keys:
            out[keys_name] = " ".join(message.keys)
        converted.append(MessageIn(message.body, "", (), dict(sorted(out.items())), message.flag,
                                   message.born_timestamp_ms, 0, "", message.born_host, message.born_port))
        dues.append(due)
    return converted, dues


def delivered(record: Record, timer_offset: int, now_ms: int) -> tuple[str, MessageIn]:
    """(real topic, the copy to append) of a timer record due now."""
    props = dict(record.properties)
    topic = props.pop(REAL_TOPIC)
    qid, shard = props.pop(REAL_QID, None), props.pop(SHARDING_KEY, "")
    props.pop(ROLLED_FROM, None)
    props.pop(ORIGIN, None)
    tags, keys = props.pop(PROPERTY_TAGS, ""), props.pop(PROPERTY_KEYS, "")
    props[DELIVER_MS] = props.pop(OUT_MS)
    props.setdefault(ENQUEUE_MS, str(record.store_timestamp_ms))
    props[DEQUEUE_MS] = str(now_ms)
    props[UNIT] = str(timer_offset)
    return topic, MessageIn(body=record.body, tags=tags, keys=tuple(k for k in keys.split(" ") if k),
                            properties=dict(sorted(props.items())), flag=record.flag,
                            born_timestamp_ms=record.born_timestamp_ms,
                            queue_id=int(qid) if qid is not None else None, sharding_key=shard,
                            born_host=record.born_host, born_port=record.born_port)


def delivered_copy(view: RecordView, props: dict[str, str], timer_offset: int, now_ms: int) -> tuple[str, Copy] | None:
    """:func:`delivered` from the timer record's bytes (``view``, its CRC checked; ``props``: its properties):
    the copy's body and its CRC as stored, its properties written as the encoder writes those of
    :func:`delivered`'s MessageIn (the same record bytes: tests/unit/core/test_timer_enqueue.py). None for a
    record without a UNIQ_KEY (the encoder would make one: :func:`delivered` then)."""
    props = dict(props)
    topic = props.pop(REAL_TOPIC)
    qid, shard = props.pop(REAL_QID, None), props.pop(SHARDING_KEY, "")
    props.pop(ROLLED_FROM, None)
    props.pop(ORIGIN, None)
    tags, keys = props.pop(PROPERTY_TAGS, ""), props.pop(PROPERTY_KEYS, "")
    uniq = props.pop(PROPERTY_UNIQ_KEY, None)
    if not uniq:
        return None
    props[DELIVER_MS] = props.pop(OUT_MS)
    if ENQUEUE_MS not in props:
        props[ENQUEUE_MS] = str(view.store_timestamp_ms)
    props[DEQUEUE_MS] = str(now_ms)
    props[UNIT] = str(timer_offset)
    text = "".join([f"{name}\x01{value}\x02" for name, value in sorted(props.items())])
    if tags:
        text += f"TAGS\x01{tags}\x02"
    if keys:
        keys = " ".join(k for k in keys.split(" ") if k)
        if keys:
            text += f"KEYS\x01{keys}\x02"
    text += f"UNIQ_KEY\x01{uniq}\x02"
    return topic, Copy(view.body, view.body_crc, text.encode("utf-8"), tags, uniq, view.flag, view.born_timestamp_ms,
                       view.born_host, view.born_port, int(qid) if qid is not None else None, shard)


def rolled(record: Record, timer_offset: int) -> MessageIn:
    """The timer record of a long delay again, appended when the wheel reaches its parked slot."""
    props = dict(record.properties)
    props[ROLL_TIMES] = str(int(props.get(ROLL_TIMES, "0")) + 1)
    props[ROLLED_FROM] = str(timer_offset)
    props.setdefault(ORIGIN, str(timer_offset))
    props.setdefault(ENQUEUE_MS, str(record.store_timestamp_ms))
    return MessageIn(body=record.body, properties=dict(sorted(props.items())), flag=record.flag,
                     born_timestamp_ms=record.born_timestamp_ms, queue_id=0, born_host=record.born_host,
                     born_port=record.born_port)


def origin(record: Record) -> int:
    """The queue offset of a timer record's first record (itself unless it was rolled)."""
    return int(record.properties.get(ORIGIN, record.queue_offset))


def cancel_marker(target: Record) -> MessageIn:
    """A record of the timer topic cancelling ``target`` (a timer record) in its due slot."""
    return MessageIn(body=b"cancel", properties={CANCEL_OFFSET: str(origin(target)), OUT_MS: target.properties[OUT_MS],
                                           REAL_TOPIC: target.properties[REAL_TOPIC]}, queue_id=0)
