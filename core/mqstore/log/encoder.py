"""Validate and encode a batch of messages into commit log records, outside the append lock.

Everything that can reject a message happens here, before anything is written, so a batch is all or
nothing. The records are encoded with queue offset, physical offset and store time left zero; the
CommitLog stamps them inside its lock.

The messages come as a list of MessageIn (this module's Python code: the reference) or, when the
compiled codec is active (mqstore.codec), as its WireMessages parsed from the request's bytes, which
its AppendEncoder encodes to the same bytes; a batch it would refuse is handed to the reference,
which raises the error that says why.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass

from mqstore import codec, javahash
from mqstore.config import StoreConfig
from mqstore.message_keys import compaction_queue, message_key
from mqstore.errors import InvalidArgument, invariant, shown
from mqstore.format import codec_layout  # noqa: F401  (checks the compiled codec's layouts, at import)
from mqstore.format import record
from mqstore.model import KIND_COMPACTION, Copies, MessageIn, TopicRecord

_RESERVED = frozenset({record.PROPERTY_TAGS, record.PROPERTY_KEYS, record.PROPERTY_UNIQ_KEY})
_RESERVED_TAGS, _RESERVED_KEYS, _RESERVED_UNIQ = record.PROPERTY_TAGS, record.PROPERTY_KEYS, record.PROPERTY_UNIQ_KEY
_BAD_TEXT = re.compile("[\x01\x02]")
_BAD_KEY_CHARS = re.compile(r"[\x01\x02\t\n\r\f\v]")
_TAG_CACHE_LIMIT = 10_000
MAX_RECONSUME_TIMES = 0x7FFFFFFF  # RECONSUMETIMES is a signed 32-bit field
# "NAME\x01" of the properties the encoder writes itself (each entry ends in \x02).
_TAGS_ENTRY = record.PROPERTY_TAGS + record.NAME_VALUE_SEPARATOR
_KEYS_ENTRY = record.PROPERTY_KEYS + record.NAME_VALUE_SEPARATOR
_UNIQ_KEY_ENTRY = record.PROPERTY_UNIQ_KEY + record.NAME_VALUE_SEPARATOR


@dataclass(slots=True)
class EncodedBatch:
    """Records back to back in ``buf``; per record its size, queue id, tag code, tx type, UNIQ_KEY."""

    topic: str
    buf: bytearray
    sizes: list[int]
    queue_ids: list[int]
    tag_codes: list[int]
    sys_flags: list[int]
    uniq_keys: list[str]
    incarnation: int = 0  # the topic's start_physical_offset when it was encoded (the append checks it)


class UniqKeyGenerator:
    """RocketMQ-style client message ids: hex of ip(4) pid(2) random(4) ms-since-month-start(4)
    counter(2). ``random`` and ``counter`` may be given (tests give two encoders the same keys).
    Thread-safe: the counter is taken under a lock, a block per batch."""

    def __init__(self, host: bytes, *, random: bytes | None = None, counter: int = 0):
        random = os.urandom(4) if random is None else random
        self._prefix = (host[-4:] + (os.getpid() & 0xFFFF).to_bytes(2, "big") + random).hex().upper()
        self._counter = counter
        self._lock = threading.Lock()
        self.key_length = len(self._prefix) + 12  # characters of every key

    def take(self, count: int, now_ms: int) -> tuple[str, int]:
        """A block of ``count`` keys: (their common prefix, the counter of the first). Key i of the
        block is the prefix and the 4 hex digits of (counter + i) & 0xFFFF."""
        since_month = _ms_since_month_start(now_ms) & 0xFFFFFFFF
        with self._lock:
            first = self._counter
            self._counter += count
        return f"{self._prefix}{since_month:08X}", first

    def next_keys(self, count: int, now_ms: int) -> list[str]:
        prefix, first = self.take(count, now_ms)
        return [f"{prefix}{(first + i) & 0xFFFF:04X}" for i in range(count)]


def _month_start_ms(now_ms: int) -> int:
    import datetime as _dt
    now = _dt.datetime.fromtimestamp(now_ms / 1000, tz=_dt.timezone.utc)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


# [start, end) in ms of the month last asked for: the datetime arithmetic was 4% of a batched append's
# server time (bench profile). One tuple, replaced whole, so threads never see half of it.
_month_cache = (0, 0)


def _ms_since_month_start(now_ms: int) -> int:
    global _month_cache
    start, end = _month_cache
    if not start <= now_ms < end:
        start = _month_start_ms(now_ms)
        end = _month_start_ms(start + 32 * 86_400_000)  # the first of the next month
        _month_cache = (start, end)
    return now_ms - start


class MessageEncoder:
    """Thread-safe: the round-robin counters and tag cache tolerate concurrent use."""

    def __init__(self, config: StoreConfig, uniq: UniqKeyGenerator | None = None):
        self.config = config
        self.store_host = socket.inet_aton(config.store_host) if _is_ipv4(config.store_host) else b"\x7f\0\0\1"
        self.store_port = config.store_port
        self.uniq = uniq or UniqKeyGenerator(self.store_host)
        self._round_robin: dict[str, int] = {}
        self._rr_lock = threading.Lock()
        self._tag_codes: dict[str, int] = {}
        codec.announce()
        self._compiled = None if codec.compiled is None else codec.compiled.AppendEncoder(
            config.max_batch_messages, config.max_body_bytes, config.max_batch_body_bytes, config.segment_size_bytes,
            self.store_host, self.store_port)

    def encode_batch(self, topic: TopicRecord, messages, now_ms: int) -> EncodedBatch:
        """``messages``: a sequence of MessageIn, or the compiled codec's WireMessages."""
        if codec.is_wire_messages(messages):
            return self._encode_wire(topic, messages, now_ms)
        if type(messages) is Copies:
            return self._encode_copies(topic, messages, now_ms)
        self._check_batch(messages)
        uniq_needed = sum(1 for m in messages if not m.properties or not m.properties.get(record.PROPERTY_UNIQ_KEY))
        fresh = iter(self.uniq.next_keys(uniq_needed, now_ms))
        topic_bytes = topic.name.encode("utf-8")
        topic_part = record.topic_part(topic_bytes)
        # The hosts' address sizes choose the layout (encode_parts): 4 bytes each in the smallest one.
        fixed = record.FIXED_OVERHEAD + len(topic_bytes) + len(self.store_host) - 2 * record.IPV4_BYTES
        room = self.config.segment_size_bytes - record.BLANK_SIZE
        qids = self._queues_for(topic, messages)
        parts: list[bytes] = []
        sizes, tags, flags, uniqs = [], [], [], []
        encode_parts, host, port, props_of = record.encode_parts, self.store_host, self.store_port, self._properties
        for index, msg in enumerate(messages):
            props, tag_code, uniq = props_of(index, msg, fresh)
            body = msg.body
            size = fixed + len(body) + len(props) + len(msg.born_host)
            if (size > room or not body or len(props) > record.MAX_PROPERTIES_BYTES or msg.born_timestamp_ms < 0
                    or not 0 <= msg.reconsume_times <= MAX_RECONSUME_TIMES):
                self._reject(index, topic, msg, props, size)
            # born_timestamp_ms 0 means "server time" (the proto says so): the batch's time, not 1970.
            sizes.append(encode_parts(parts, topic_part, body, props, qids[index], msg.flag, msg.sys_flag,
                                      msg.born_timestamp_ms or now_ms, msg.born_host, msg.born_port, host, port,
                                      msg.prepared_transaction_offset, msg.reconsume_times))
            tags.append(tag_code)
            flags.append(msg.sys_flag)
            uniqs.append(uniq)
        return EncodedBatch(topic.name, bytearray(b"".join(parts)), sizes, qids, tags, flags, uniqs,
                            topic.start_physical_offset)

    def _check_batch(self, items) -> None:
        """The batch limits every batch is held to, in this order (messages or copies: each has a ``body``):
        not empty, at most max_batch_messages, each body at most max_body_bytes, their sum at most
        max_batch_body_bytes."""
        cfg = self.config
        if not items:
            raise InvalidArgument("messages: a batch needs at least one message")
        if len(items) > cfg.max_batch_messages:
            raise InvalidArgument(
                f"messages: {len(items)} in one batch, the limit is {cfg.max_batch_messages}; split the batch")
        total_body = 0
        for index, item in enumerate(items):
            total_body += len(item.body)
            if len(item.body) > cfg.max_body_bytes:
                raise InvalidArgument(
                    f"messages[{index}].body: {len(item.body)} bytes, the limit is {cfg.max_body_bytes}")
        if total_body > cfg.max_batch_body_bytes:
            raise InvalidArgument(
                f"messages: {total_body} bytes of bodies in one batch, the limit is {cfg.max_batch_body_bytes} "
                f"({_size_text(cfg.max_batch_body_bytes)}, server setting max_batch_body_bytes); split the batch")

    def _encode_wire(self, topic: TopicRecord, wire, now_ms: int) -> EncodedBatch:
        """The compiled path; a batch it refuses goes through the reference above, which raises why."""
        encoded = self._compiled.encode(wire, topic.name, topic.queue_count, topic.kind == KIND_COMPACTION, now_ms,
                                        self.uniq, self._take_round_robin)
        if encoded is None:
            return self.encode_batch(topic, wire.to_messages(MessageIn), now_ms)
        return EncodedBatch(topic.name, *encoded, topic.start_physical_offset)

    def _encode_copies(self, topic: TopicRecord, copies: Copies, now_ms: int) -> EncodedBatch:
        """A batch of model.Copy: the bytes :meth:`encode_batch` gives the MessageIn of each, whose properties were
        checked already (the timer's records and copies), the body's CRC as given; a Copy without a uniq key gets a
        fresh one as a MessageIn without UNIQ_KEY does. The same limits, checked in the same order. The compiled
        codec's AppendEncoder.encode_copies gives the same where it answers (tests/property/test_codec_copies.py);
        this is its reference."""
        cfg = self.config
        invariant(topic.kind != KIND_COMPACTION, "a compaction topic's copies are MessageIn (its queue is its key's)")
        if self._compiled is not None:  # the same bytes in C (the timer's copies); None: this way says why
            encoded = self._compiled.encode_copies(copies, topic.name, topic.queue_count, now_ms,
                                                   self._take_round_robin, self.uniq)
            if encoded is not None:
                return EncodedBatch(topic.name, *encoded, topic.start_physical_offset)
        self._check_batch(copies)
        fresh = iter(self.uniq.next_keys(sum(1 for c in copies if not c.uniq_key), now_ms))
        topic_bytes = topic.name.encode("utf-8")
        topic_part = record.topic_part(topic_bytes)
        fixed = record.FIXED_OVERHEAD + len(topic_bytes) + len(self.store_host) - 2 * record.IPV4_BYTES
        room = cfg.segment_size_bytes - record.BLANK_SIZE
        qids = self._queues_for(topic, copies)
        parts: list[bytes] = []
        sizes, tags, uniqs = [], [], []
        encode_parts, host, port = record.encode_parts, self.store_host, self.store_port
        for index, c in enumerate(copies):
            body, props, uniq = c.body, c.properties, c.uniq_key
            if not uniq:
                uniq = next(fresh)
                props += f"{_UNIQ_KEY_ENTRY}{uniq}\x02".encode("ascii")
            size = fixed + len(body) + len(props) + len(c.born_host)
            if size > room or not body or len(props) > record.MAX_PROPERTIES_BYTES or c.born_timestamp_ms < 0:
                self._reject(index, topic, MessageIn(body, born_timestamp_ms=c.born_timestamp_ms), props, size)
            sizes.append(encode_parts(parts, topic_part, body, props, qids[index], c.flag, 0,
                                      c.born_timestamp_ms or now_ms, c.born_host, c.born_port, host, port, 0, 0,
                                      c.body_crc))
            tags.append(self.tag_code(c.tags))
            uniqs.append(uniq)
        return EncodedBatch(topic.name, bytearray(b"".join(parts)), sizes, qids, tags, [0] * len(sizes), uniqs,
                            topic.start_physical_offset)

    def _reject(self, index: int, topic: TopicRecord, msg: MessageIn, props: bytes, size: int) -> None:
        """Raise the error that explains why message ``index`` cannot be stored (or return if it can)."""
        if not msg.body and topic.kind != KIND_COMPACTION:
            raise InvalidArgument(
                f"messages[{index}].body is empty; only COMPACTION topics accept an empty body (a tombstone)")
        if len(props) > record.MAX_PROPERTIES_BYTES:
            raise InvalidArgument(
                f"messages[{index}].properties: {len(props)} bytes encoded, the limit is {record.MAX_PROPERTIES_BYTES}")
        if size + record.BLANK_SIZE > self.config.segment_size_bytes:
            raise InvalidArgument(
                f"messages[{index}]: record of {size} bytes does not fit a segment of "
                f"{self.config.segment_size_bytes} bytes")
        if msg.born_timestamp_ms < 0:
            raise InvalidArgument(f"messages[{index}].born_timestamp_ms must not be negative")
        if not 0 <= msg.reconsume_times <= MAX_RECONSUME_TIMES:
            raise InvalidArgument(f"messages[{index}].reconsume_times {msg.reconsume_times} is outside "
                                  f"[0, {MAX_RECONSUME_TIMES}]")

    def _properties(self, index: int, msg: MessageIn, fresh) -> tuple[bytes, int, str]:
        user = msg.properties
        tags, keys, uniq = msg.tags, msg.keys, None
        pieces = []
        if user:
            empty = False
            for name, value in user.items():
                if name not in _RESERVED:
                    empty = empty or not name or not value
                    pieces.append(f"{name}\x01{value}\x02")
            if pieces:
                # One look at the whole for the separators (a name or value holding one adds to its count); the
                # loop over each says which property, when one is wrong.
                text = "".join(pieces)
                if empty or text.count("\x01") != len(pieces) or text.count("\x02") != len(pieces):
                    _check_properties(index, user)
                pieces = [text]
            if _RESERVED_TAGS in user or _RESERVED_KEYS in user or _RESERVED_UNIQ in user:
                tags, keys, uniq = _reserved_properties(index, user, tags, keys)
        if tags:
            if _BAD_TEXT.search(tags):
                raise InvalidArgument(f"messages[{index}].tags contains the reserved characters \\x01 or \\x02")
            pieces.append(f"{_TAGS_ENTRY}{tags}\x02")
        if keys:
            _check_keys(index, "keys", keys)
            pieces.append(f"{_KEYS_ENTRY}{' '.join(keys)}\x02")
        uniq = uniq or next(fresh)
        pieces.append(f"{_UNIQ_KEY_ENTRY}{uniq}\x02")
        return "".join(pieces).encode("utf-8"), self.tag_code(tags), uniq

    def tag_code(self, tags: str) -> int:
        if not tags:
            return 0
        code = self._tag_codes.get(tags)
        if code is None:
            code = javahash.java_string_hash(tags)
            if len(self._tag_codes) < _TAG_CACHE_LIMIT:
                self._tag_codes[tags] = code
        return code

    def _queues_for(self, topic: TopicRecord, messages) -> list[int]:
        """Queue id per message; round-robin ids are taken as one block per batch."""
        count = topic.queue_count
        result = []
        pending_rr = []
        for index, msg in enumerate(messages):
            if topic.kind == KIND_COMPACTION:  # routed by its compaction key, overrides must agree
                result.append(compaction_queue(index, topic.name, count, message_key(msg.keys, msg.properties),
                                               msg.queue_id, msg.sharding_key))
                continue
            if msg.queue_id is not None:
                if not 0 <= msg.queue_id < count:
                    raise InvalidArgument(f"messages[{index}].queue_id {msg.queue_id} is outside [0, {count}) for "
                                          f"topic {topic.name}")
                result.append(msg.queue_id)
                continue
            if msg.sharding_key:
                result.append(javahash.java_string_hash(msg.sharding_key) % count)
            else:
                pending_rr.append(index)
                result.append(0)
        if pending_rr:
            start = self._take_round_robin(topic.name, len(pending_rr))
            for i, index in enumerate(pending_rr):
                result[index] = (start + i) % count
        return result

    def _take_round_robin(self, topic_name: str, count: int) -> int:
        """The first of ``count`` consecutive round-robin slots of the topic (taken as one block)."""
        with self._rr_lock:
            start = self._round_robin.get(topic_name, 0)
            self._round_robin[topic_name] = start + count
        return start


def _check_properties(index: int, user: dict) -> None:
    """INVALID_ARGUMENT naming the first user property that is empty or holds a separator."""
    for name, value in user.items():
        if name not in _RESERVED and (not name or not value or _BAD_TEXT.search(name) or _BAD_TEXT.search(value)):
            raise InvalidArgument(f"messages[{index}].properties[{shown(name)}]: names and values must be "
                                  f"non-empty and must not contain the reserved characters \\x01 \\x02")
    invariant(False, "a property's separators were miscounted")


def _reserved_properties(index: int, user: dict, tags: str, keys: tuple) -> tuple[str, tuple, str | None]:
    """TAGS, KEYS and UNIQ_KEY given as properties: checked like the fields they stand for. A field and
    its property mean the same thing, so when both are given they must agree (else neither could win
    silently). Returns (tags, keys, uniq key); the uniq key is None when not given."""
    where = f"messages[{index}].properties"
    tags_at, keys_at = f"{where}[{record.PROPERTY_TAGS!r}]", f"{where}[{record.PROPERTY_KEYS!r}]"
    prop_tags = user.get(record.PROPERTY_TAGS)
    if prop_tags is not None:
        if not prop_tags:
            raise InvalidArgument(f"{tags_at} is empty; leave it out or give a tag")
        if tags and tags != prop_tags:
            raise InvalidArgument(f"messages[{index}]: tags {shown(tags)} and {tags_at} {shown(prop_tags)} differ; "
                                  f"give the tag once (the field and the property mean the same)")
        tags = prop_tags
    prop_keys = user.get(record.PROPERTY_KEYS)
    if prop_keys is not None:
        # The property is the stored form: keys separated by single spaces (as RocketMQ's KEYS).
        split = tuple(prop_keys.split(" "))
        _check_keys(index, f"properties[{record.PROPERTY_KEYS!r}]", split)
        if keys and tuple(keys) != split:
            raise InvalidArgument(f"messages[{index}]: keys {shown(list(keys))} and {keys_at} {shown(prop_keys)} "
                                  f"differ; give the keys once (the field and the property mean the same)")
        keys = split
    uniq = user.get(record.PROPERTY_UNIQ_KEY)
    if uniq is not None:
        _check_keys(index, f"properties[{record.PROPERTY_UNIQ_KEY!r}]", (uniq,))
    return tags, keys, uniq or None


def _check_keys(index: int, field: str, keys) -> None:
    """Keys are stored joined by single spaces and indexed one by one: each must be non-empty and hold
    no whitespace (which would split it) and no \\x01 \\x02 (the property separators)."""
    joined = " ".join(keys)
    if _BAD_KEY_CHARS.search(joined) or joined.count(" ") != len(keys) - 1 or "" in keys:
        raise InvalidArgument(f"messages[{index}].{field}: {shown(list(keys))}: each key must be non-empty and "
                              f"contain no whitespace and no \\x01 \\x02 (the KEYS property separates keys "
                              f"with single spaces)")


def _size_text(size_bytes: int) -> str:
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if size_bytes >= unit and size_bytes % unit == 0:
            return f"{size_bytes // unit} {name}"
    return f"{size_bytes} bytes"


def _is_ipv4(host: str) -> bool:
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return host.count(".") == 3
