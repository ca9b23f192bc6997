"""Commit log record, RocketMQ message format V1, byte for byte (source of truth).

All integers big-endian. Layout of one record with IPv4 born and store hosts (sysflag bits 0x10 and
0x20 clear; the decoder also reads IPv6 hosts, 16-byte address + 4-byte port, when they are set):

  offset size field                        meaning
  ------ ---- ---------------------------- ------------------------------------------------------------
       0    4 TOTALSIZE                    whole record length, this field included
       4    4 MAGICCODE                    0xDAA320A7 (V1). A blank end-of-file record has 0xCBD43194
       8    4 BODYCRC                      zlib CRC32 of BODY & 0x7FFFFFFF (31 bits, never negative)
      12    4 QUEUEID
      16    4 FLAG                         producer's flag
      20    8 QUEUEOFFSET                  logical offset in topic/queue (0 for PREPARED/ROLLBACK tx)
      28    8 PHYSICALOFFSET               commit log offset of this record
      36    4 SYSFLAG                      see SYSFLAG_* below
      40    8 BORNTIMESTAMP                ms, producer clock
      48    8 BORNHOST                     4-byte IPv4 address + 4-byte port
      56    8 STORETIMESTAMP               ms, taken inside the append lock (monotonic in log order)
      64    8 STOREHOST                    4-byte IPv4 address + 4-byte port
      72    4 RECONSUMETIMES
      76    8 PREPAREDTRANSACTIONOFFSET    for a committed tx message: physical offset of its half message
      84    4 BODYLENGTH  n
      88    n BODY
    88+n    1 TOPICLENGTH t                (V1: one unsigned byte, so topics are at most 127 here)
    89+n    t TOPIC                        UTF-8
  89+n+t    2 PROPERTIESLENGTH p           signed short, p <= 32767
  91+n+t    p PROPERTIES                   UTF-8 "key\\x01value\\x02" repeated (always a trailing \\x02)

Fixed overhead: 91 bytes. The CRC covers the body only (as in RocketMQ); the decoder also rejects a
record whose TOTALSIZE disagrees with the sum of its field lengths.

Blank record (end of file): 8 bytes, TOTALSIZE = bytes left in the file, MAGICCODE = 0xCBD43194; the
rest of the file stays zero and readers jump to the next file.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from mqstore.errors import DataLoss

MAGIC_V1 = 0xDAA320A7
MAGIC_BLANK = 0xCBD43194

# Header up to and including BODYLENGTH; one line per field.
HEADER = struct.Struct(
    ">"
    "i"   # 0   TOTALSIZE
    "I"   # 4   MAGICCODE
    "i"   # 8   BODYCRC
    "i"   # 12  QUEUEID
    "i"   # 16  FLAG
    "q"   # 20  QUEUEOFFSET
    "q"   # 28  PHYSICALOFFSET
    "i"   # 36  SYSFLAG
    "q"   # 40  BORNTIMESTAMP
    "4s"  # 48  BORNHOST address
    "i"   # 52  BORNHOST port
    "q"   # 56  STORETIMESTAMP
    "4s"  # 64  STOREHOST address
    "i"   # 68  STOREHOST port
    "i"   # 72  RECONSUMETIMES
    "q"   # 76  PREPAREDTRANSACTIONOFFSET
    "i"   # 84  BODYLENGTH
)
HEADER_SIZE = HEADER.size  # 88
FIXED_OVERHEAD = HEADER_SIZE + 1 + 2  # 91
BLANK = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE
BLANK_SIZE = BLANK.size  # 8
PREFIX = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE of any record
# Fields stamped inside the append lock, after the record was encoded outside it.
OFFSETS_AT = 20
OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET
STORE_TIMESTAMP_AT = 56
STORE_TIMESTAMP = struct.Struct(">q")
QUEUE_ID_AT = 12
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
PROPERTIES_LENGTH = struct.Struct(">h")

MAX_TOPIC_BYTES_V1 = 127
MAX_PROPERTIES_BYTES = 32767

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TX_MASK = 0xC
SYSFLAG_TX_NOT = 0x0
SYSFLAG_TX_PREPARED = 0x4
SYSFLAG_TX_COMMIT = 0x8
SYSFLAG_TX_ROLLBACK = 0xC
SYSFLAG_BORN_HOST_V6 = 0x10
SYSFLAG_STORE_HOST_V6 = 0x20

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def record_size(body_bytes: int, topic_bytes: int, properties_bytes: int) -> int:
    return FIXED_OVERHEAD + body_bytes + topic_bytes + properties_bytes


def encode_properties(properties: dict[str, str]) -> bytes:
    """Encode as RocketMQ does; entries with an empty name or value are skipped (they would not decode)."""
    parts = [f"{name}\x01{value}\x02" for name, value in properties.items() if name and value]
    return "".join(parts).encode("utf-8")


def decode_properties(data: bytes) -> dict[str, str]:
    result: dict[str, str] = {}
    if not data:
        return result
    for item in data.decode("utf-8", "replace").split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            result[name] = value
    return result


def find_property(raw, name: str) -> str | None:
    """The value of property ``name`` in raw ``name\\x01value\\x02`` bytes, without decoding them all:
    what :func:`decode_properties` gives for it (None if absent). Only whole names match: ``TAGS``
    is not found inside ``MYTAGS``, since an entry starts at byte 0 or right after a 0x02 (names and
    values cannot hold 0x01 or 0x02). Like decode_properties, an empty value does not count and the
    last entry of a name wins."""
    marker = name.encode("utf-8") + b"\x01"
    found = None
    at = raw.find(marker)
    while at >= 0:
        start = at + len(marker)
        end = raw.find(b"\x02", start)
        end = len(raw) if end < 0 else end
        if (at == 0 or raw[at - 1] == 2) and end > start:
            found = bytes(raw[start:end]).decode("utf-8", "replace")
        at = raw.find(marker, end)
    return found


def encode(*, topic: bytes, body: bytes, properties: bytes, queue_id: int, flag: int, sys_flag: int,
           born_timestamp_ms: int, born_host: bytes, born_port: int, store_host: bytes, store_port: int,
           reconsume_times: int = 0, prepared_transaction_offset: int = 0, queue_offset: int = 0,
           physical_offset: int = 0, store_timestamp_ms: int = 0) -> bytes:
    """Encode one V1 record. Queue offset, physical offset and store time are usually stamped later
    with :func:`stamp` inside the append lock. The caller has validated sizes and charset."""
    total = FIXED_OVERHEAD + len(body) + len(topic) + len(properties)
    head = HEADER.pack(total, MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset,
                       physical_offset, sys_flag, born_timestamp_ms, born_host, born_port,
                       store_timestamp_ms, store_host, store_port, reconsume_times,
                       prepared_transaction_offset, len(body))
    return b"".join((head, body, bytes((len(topic),)), topic, PROPERTIES_LENGTH.pack(len(properties)),
                     properties))


def topic_part(topic: bytes) -> bytes:
    """TOPICLENGTH + TOPIC, shared by every record of a batch."""
    return bytes((len(topic),)) + topic


def encode_parts(parts: list, topic_part_bytes: bytes, body: bytes, properties: bytes, queue_id: int,
                 flag: int, sys_flag: int, born_timestamp_ms: int, born_host: bytes, born_port: int,
                 store_host: bytes, store_port: int, prepared_transaction_offset: int) -> int:
    """Append one record's pieces to ``parts`` (for one ``b"".join`` per batch); returns its size.
    Queue offset, physical offset, store time and reconsume times are zero, stamped later."""
    body_len = len(body)
    total = FIXED_OVERHEAD - 1 + len(topic_part_bytes) + body_len + len(properties)
    parts += (HEADER.pack(total, MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, 0, 0, sys_flag,
                          born_timestamp_ms, born_host, born_port, 0, store_host, store_port, 0,
                          prepared_transaction_offset, body_len),
              body, topic_part_bytes, PROPERTIES_LENGTH.pack(len(properties)), properties)
    return total


def stamp(buf: bytearray, position: int, queue_offset: int, physical_offset: int,
          store_timestamp_ms: int) -> None:
    """Fill the fields known only inside the append lock."""
    OFFSETS.pack_into(buf, position + OFFSETS_AT, queue_offset, physical_offset)
    STORE_TIMESTAMP.pack_into(buf, position + STORE_TIMESTAMP_AT, store_timestamp_ms)


def encode_blank(size_bytes: int) -> bytes:
    return BLANK.pack(size_bytes, MAGIC_BLANK)


@dataclass(slots=True)
class Record:
    """A decoded record. ``size`` is TOTALSIZE. Not frozen: one is built per message read, and a
    frozen dataclass costs several times as much to construct; treat it as immutable."""

    size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    born_port: int
    store_timestamp_ms: int
    store_host: bytes
    store_port: int
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def tx_type(self) -> int:
        return self.sys_flag & SYSFLAG_TX_MASK


class RecordError(DataLoss):
    """Bytes at a position are not a valid record. ``reason`` is machine-readable."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _host_sizes(sys_flag: int) -> tuple[int, int]:
    born = 20 if sys_flag & SYSFLAG_BORN_HOST_V6 else 8
    store = 20 if sys_flag & SYSFLAG_STORE_HOST_V6 else 8
    return born, store


def check(buf, position: int, limit: int, *, verify_crc: bool = True, physical_offset: int | None = None) -> int:
    """Validate the record or blank at ``position`` (reading no further than ``limit``).

    Returns TOTALSIZE; a blank record returns its size too (use :func:`is_blank`). Raises RecordError
    with reason ``short`` (fewer bytes than the record claims), ``magic``, ``length``, ``offset`` (its
    PHYSICALOFFSET is not ``physical_offset``, when given) or ``crc``.
    """
    if limit - position < BLANK_SIZE:
        raise RecordError("short", f"{limit - position} bytes left at position {position}")
    total, magic = PREFIX.unpack_from(buf, position)
    if magic == MAGIC_BLANK:
        if total < BLANK_SIZE:
            raise RecordError("length", f"blank record of size {total} at position {position}")
        return total
    if magic != MAGIC_V1:
        raise RecordError("magic", f"magic 0x{magic:08X} at position {position}")
    if total < FIXED_OVERHEAD or total > limit - position:
        reason = "short" if total > limit - position else "length"
        raise RecordError(reason, f"TOTALSIZE {total} at position {position}, {limit - position} bytes left")
    sys_flag = INT32.unpack_from(buf, position + 36)[0]
    born_size, store_size = _host_sizes(sys_flag)
    body_at = position + HEADER_SIZE + (born_size - 8) + (store_size - 8)
    body_len = INT32.unpack_from(buf, body_at - 4)[0]
    end = position + total
    if body_len < 0 or body_at + body_len + 1 > end:
        raise RecordError("length", f"BODYLENGTH {body_len} at position {position}")
    topic_len = buf[body_at + body_len]
    props_at = body_at + body_len + 1 + topic_len
    if props_at + 2 > end:
        raise RecordError("length", f"TOPICLENGTH {topic_len} at position {position}")
    props_len = PROPERTIES_LENGTH.unpack_from(buf, props_at)[0]
    if props_len < 0 or props_at + 2 + props_len != end:
        raise RecordError("length", f"field lengths disagree with TOTALSIZE {total} at position {position}")
    if physical_offset is not None:
        stored_offset = INT64.unpack_from(buf, position + OFFSETS_AT + 8)[0]
        if stored_offset != physical_offset:
            raise RecordError("offset", f"PHYSICALOFFSET {stored_offset} at position {position}, which is "
                                        f"physical offset {physical_offset}")
    if verify_crc:
        stored = INT32.unpack_from(buf, position + 8)[0]
        actual = zlib.crc32(buf[body_at:body_at + body_len]) & 0x7FFFFFFF
        if stored != actual:
            raise RecordError("crc", f"body CRC 0x{stored:08X} != 0x{actual:08X} at position {position}")
    return total


def is_blank(buf, position: int) -> bool:
    return PREFIX.unpack_from(buf, position)[1] == MAGIC_BLANK


def decode(buf, position: int = 0, *, verify_crc: bool = True) -> Record:
    """Decode the record at ``position`` after validating it with :func:`check`."""
    total = check(buf, position, len(buf), verify_crc=verify_crc)
    if is_blank(buf, position):
        raise RecordError("blank", f"blank end-of-file record at position {position}")
    sys_flag = INT32.unpack_from(buf, position + 36)[0]
    if sys_flag & (SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6):
        return _decode_v6(buf, position, total, sys_flag)
    (_, _, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts, born_host, born_port,
     store_ts, store_host, store_port, reconsume, prepared, body_len) = HEADER.unpack_from(buf, position)
    at = position + HEADER_SIZE
    return _finish(buf, at, body_len, total, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
                   born_ts, born_host, born_port, store_ts, store_host, store_port, reconsume, prepared)


def _decode_v6(buf, position: int, total: int, sys_flag: int) -> Record:
    crc, queue_id, flag, queue_offset, physical_offset = struct.unpack_from(">iiiqq", buf, position + 8)
    at = position + 40
    born_ts = INT64.unpack_from(buf, at)[0]
    at += 8
    born_len = 16 if sys_flag & SYSFLAG_BORN_HOST_V6 else 4
    born_host = bytes(buf[at:at + born_len])
    born_port = INT32.unpack_from(buf, at + born_len)[0]
    at += born_len + 4
    store_ts = INT64.unpack_from(buf, at)[0]
    at += 8
    store_len = 16 if sys_flag & SYSFLAG_STORE_HOST_V6 else 4
    store_host = bytes(buf[at:at + store_len])
    store_port = INT32.unpack_from(buf, at + store_len)[0]
    at += store_len + 4
    reconsume, prepared, body_len = struct.unpack_from(">iqi", buf, at)
    at += 16
    return _finish(buf, at, body_len, total, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
                   born_ts, born_host, born_port, store_ts, store_host, store_port, reconsume, prepared)


def _finish(buf, body_at, body_len, total, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
            born_ts, born_host, born_port, store_ts, store_host, store_port, reconsume, prepared) -> Record:
    body = bytes(buf[body_at:body_at + body_len])
    at = body_at + body_len
    topic_len = buf[at]
    topic = bytes(buf[at + 1:at + 1 + topic_len]).decode("utf-8", "replace")
    at += 1 + topic_len
    props_len = PROPERTIES_LENGTH.unpack_from(buf, at)[0]
    properties = decode_properties(bytes(buf[at + 2:at + 2 + props_len]))
    return Record(total, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts,
                  bytes(born_host), born_port, store_ts, bytes(store_host), store_port, reconsume, prepared,
                  body, topic, properties)


def peek_topic(buf, position: int) -> bytes:
    """Topic bytes of a valid IPv4 record without decoding the rest (for Tail's topic filter)."""
    sys_flag = INT32.unpack_from(buf, position + 36)[0]
    born_size, store_size = _host_sizes(sys_flag)
    body_at = position + HEADER_SIZE + (born_size - 8) + (store_size - 8)
    body_len = INT32.unpack_from(buf, body_at - 4)[0]
    at = body_at + body_len
    return bytes(buf[at + 1:at + 1 + buf[at]])


def offset_msg_id(store_host: bytes, store_port: int, physical_offset: int) -> str:
    """RocketMQ's offset message id: uppercase hex of host address, 4-byte port, 8-byte offset."""
    return (store_host + INT32.pack(store_port) + INT64.pack(physical_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[bytes, int, int]:
    """Returns (host address, port, physical offset); raises ValueError when it is not one."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"an offset message id has 32 (IPv4) or 56 (IPv6) hex characters, not {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    host_len = len(raw) - 12
    port = INT32.unpack_from(raw, host_len)[0]
    physical_offset = INT64.unpack_from(raw, host_len + 4)[0]
    return raw[:host_len], port, physical_offset


def routing_fields(buf, position: int) -> tuple[int, bytes, int, int, int, str, int]:
    """(size, topic, queue id, queue offset, sys flag, TAGS, store time) of a valid record, without
    copying the body: what the dispatcher needs when it rebuilds consume queues."""
    (size, _, _, queue_id, _, queue_offset, _, sys_flag, _, _, _, store_ts, _, _, _, _,
     body_len) = HEADER.unpack_from(buf, position)
    if sys_flag & (SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6):
        born_size, store_size = _host_sizes(sys_flag)
        body_at = position + HEADER_SIZE + (born_size - 8) + (store_size - 8)
        body_len = INT32.unpack_from(buf, body_at - 4)[0]
        store_ts = INT64.unpack_from(buf, position + STORE_TIMESTAMP_AT + (born_size - 8))[0]
    else:
        body_at = position + HEADER_SIZE
    at = body_at + body_len
    topic_len = buf[at]
    topic = buf[at + 1:at + 1 + topic_len]
    at += 1 + topic_len
    props = buf[at + 2:at + 2 + PROPERTIES_LENGTH.unpack_from(buf, at)[0]]
    tags = find_property(props, PROPERTY_TAGS) or ""
    return size, bytes(topic), queue_id, queue_offset, sys_flag, tags, store_ts


def walk(buf, position: int, limit: int, *, verify_crc: bool = True,
         base: int | None = None) -> tuple[int, int, int, RecordError | None]:
    """Check records one after another from ``position`` up to ``limit`` (recovery's hot loop).

    Returns (stop position, records checked, store time of the last one, error). The stop position
    is the start of the first record that fails (error set), of a blank record (error None, the
    caller jumps to the next file), or ``limit``. With ``base`` (the physical offset of position 0),
    each record's PHYSICALOFFSET must be its own physical offset (no checksum covers the header, but
    every record names where it lives). IPv4 records take a fast path; anything else goes through
    :func:`check`.
    """
    head, i32, i64, crc32 = PREFIX.unpack_from, INT32.unpack_from, INT64.unpack_from, zlib.crc32
    count = 0
    last_ts = 0
    view = memoryview(buf)
    try:
        while position + BLANK_SIZE <= limit:
            total, magic = head(buf, position)
            if magic == MAGIC_BLANK:
                return position, count, last_ts, None
            end = position + total
            if (magic != MAGIC_V1 or total < FIXED_OVERHEAD or end > limit
                    or i32(buf, position + 36)[0] & (SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6)):
                try:
                    check(buf, position, limit, verify_crc=verify_crc,
                          physical_offset=None if base is None else base + position)
                except RecordError as exc:
                    return position, count, last_ts, exc
                last_ts = i64(buf, position + STORE_TIMESTAMP_AT)[0]
                count += 1
                position = end
                continue
            body_len = i32(buf, position + 84)[0]
            topic_at = position + HEADER_SIZE + body_len
            props_at = topic_at + 1 + (buf[topic_at] if 0 <= body_len and topic_at < end else 0)
            if (body_len < 0 or topic_at >= end or props_at + 2 > end
                    or props_at + 2 + PROPERTIES_LENGTH.unpack_from(buf, props_at)[0] != end
                    or (base is not None and i64(buf, position + 28)[0] != base + position)
                    or (verify_crc and crc32(view[position + HEADER_SIZE:topic_at]) & 0x7FFFFFFF
                        != i32(buf, position + 8)[0])):
                try:
                    check(buf, position, limit, verify_crc=verify_crc,
                          physical_offset=None if base is None else base + position)
                except RecordError as exc:
                    return position, count, last_ts, exc
            last_ts = i64(buf, position + STORE_TIMESTAMP_AT)[0]
            count += 1
            position = end
        if position < limit:
            try:
                check(buf, position, limit, verify_crc=verify_crc)
            except RecordError as exc:
                return position, count, last_ts, exc
        return position, count, last_ts, None
    finally:
        view.release()


_MAGIC_V1_BYTES = MAGIC_V1.to_bytes(4, "big")
_MAGIC_BLANK_BYTES = MAGIC_BLANK.to_bytes(4, "big")


def next_record_start(buf, position: int, limit: int, base: int) -> int:
    """The first position after ``position`` (and before ``limit``) where a record starts that names
    itself: magic V1, field lengths that agree with TOTALSIZE, and PHYSICALOFFSET = ``base`` + its
    position (the body CRC is not needed to find it); or where a blank record claims exactly the
    rest up to ``limit``. ``limit`` if there is none. This is how a reader finds its way past a
    damaged record whose TOTALSIZE cannot be trusted: a false match needs 12 bytes to agree by chance.
    """
    at = position + 1
    while at + BLANK_SIZE <= limit:
        hits = [h - 4 for h in (buf.find(_MAGIC_V1_BYTES, at + 4, limit), buf.find(_MAGIC_BLANK_BYTES, at + 4, limit))
                if h >= 0]
        if not hits:
            break
        start = min(hits)
        total, magic = PREFIX.unpack_from(buf, start)
        if magic == MAGIC_BLANK:
            if total == limit - start:
                return start
        else:
            try:
                check(buf, start, limit, verify_crc=False, physical_offset=base + start)
                return start
            except RecordError:
                pass
        at = start + 1
    return limit


def index_fields(buf, position: int) -> tuple[int, int, int, int, bytes, bytes]:
    """(size, physical offset, sys flag, store time, topic, properties bytes) of a record already
    validated (by :func:`walk` or :func:`check`), without copying the body: what the index follower
    needs from each Tail record. Handles IPv6 hosts like :func:`check`."""
    size = INT32.unpack_from(buf, position)[0]
    physical_offset = INT64.unpack_from(buf, position + 28)[0]
    sys_flag = INT32.unpack_from(buf, position + 36)[0]
    born_size, store_size = _host_sizes(sys_flag)
    store_ts = INT64.unpack_from(buf, position + STORE_TIMESTAMP_AT + (born_size - 8))[0]
    body_at = position + HEADER_SIZE + (born_size - 8) + (store_size - 8)
    at = body_at + INT32.unpack_from(buf, body_at - 4)[0]
    topic = bytes(buf[at + 1:at + 1 + buf[at]])
    at += 1 + buf[at]
    props_len = PROPERTIES_LENGTH.unpack_from(buf, at)[0]
    return size, physical_offset, sys_flag, store_ts, topic, bytes(buf[at + 2:at + 2 + props_len])


def index_walk(buf, position: int = 0, *, verify_crc: bool = True,
               base: int | None = None) -> tuple[list[tuple[int, int, int, bytes, bytes]], int, RecordError | None]:
    """Check the records of ``buf`` from ``position`` (whole records back to back, as a Tail frame
    holds) and return (physical offset, sys flag, store time, topic, properties bytes) of each, in one
    pass: what the index needs, without copying bodies. Returns (those fields, stop position, error):
    like :func:`walk`, it stops at the first record that fails (a blank record in a frame fails too),
    with the error, or at the end of ``buf`` with None. With ``base`` (the physical offset of byte 0)
    each record's PHYSICALOFFSET must be its own."""
    out = []
    limit = len(buf)
    unpack, props_len_of, crc32 = HEADER.unpack_from, PROPERTIES_LENGTH.unpack_from, zlib.crc32
    hosts_v6 = SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6
    view = memoryview(buf)
    try:
        while position < limit:
            try:
                if limit - position < HEADER_SIZE:
                    check(buf, position, limit, verify_crc=verify_crc)  # raises: too short for a record,
                    raise RecordError("blank", f"blank end-of-file record at position {position}")  # or blank
                (total, magic, crc, _, _, _, physical_offset, sys_flag, _, _, _, store_ts, _, _, _, _,
                 body_len) = unpack(buf, position)
                end = position + total
                topic_at = position + HEADER_SIZE + body_len
                expected = None if base is None else base + position
                if (magic != MAGIC_V1 or sys_flag & hosts_v6 or total < FIXED_OVERHEAD or end > limit
                        or body_len < 0 or topic_at >= end):
                    check(buf, position, limit, verify_crc=verify_crc, physical_offset=expected)  # raises, or IPv6
                    if is_blank(buf, position):
                        raise RecordError("blank", f"blank end-of-file record at position {position}")
                    size, physical_offset, sys_flag, store_ts, topic, props = index_fields(buf, position)
                    out.append((physical_offset, sys_flag, store_ts, topic, props))
                    position = end
                    continue
                props_at = topic_at + 1 + buf[topic_at]
                if (props_at + 2 > end or props_at + 2 + props_len_of(buf, props_at)[0] != end
                        or (expected is not None and physical_offset != expected)
                        or (verify_crc and crc32(view[position + HEADER_SIZE:topic_at]) & 0x7FFFFFFF != crc)):
                    check(buf, position, limit, verify_crc=verify_crc, physical_offset=expected)  # raises
            except RecordError as exc:
                return out, position, exc
            out.append((physical_offset, sys_flag, store_ts, bytes(view[topic_at + 1:props_at]),
                        bytes(view[props_at + 2:end])))
            position = end
        return out, position, None
    finally:
        view.release()
