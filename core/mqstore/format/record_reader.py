"""The one reader of a commit log record (layout: mqstore.format.record, whose LAYOUTS give every offset).

:func:`check` is the specification of a valid record (every host layout: IPv4 or IPv6 born and store
hosts). :func:`decode` builds a whole :class:`Record` (the copy a Pull serves); :func:`records` iterates
over the checked records of a buffer, yielding a lazy :class:`RecordView` (size, CRC check, each field
on demand); :func:`find_property` reads one property without decoding the others. A few single-field
readers (:func:`peek_topic`, :func:`store_timestamp`, ...) serve the paths that need one field.
The loops over many records that must be fast live in mqstore.format.record_scan, on the same offsets.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterator

from mqstore.errors import DataLoss
from mqstore.format.record import (
    BLANK_SIZE, BODY_AT_BY_HOST_BYTE, BODY_CRC_AT, BORN_HOST_AT, BORN_TIMESTAMP_AT, FIXED_OVERHEAD, FLAG_AT,
    INT32, INT64, LAYOUT_SHIFT, LAYOUTS, MAGIC_BLANK, MAGIC_V1, NAME_VALUE_SEPARATOR, PHYSICAL_OFFSET_AT,
    PREFIX, PROPERTIES_LENGTH, PROPERTY_SEPARATOR, QUEUE_ID_AT, QUEUE_OFFSET_AT, STORE_TIMESTAMP_AT,
    SYS_FLAG_AT, SYS_FLAG_HOST_BYTE_AT, SYSFLAG_HOSTS_V6, SYSFLAG_TX_MASK, Layout)

_CRC_MASK = 0x7FFFFFFF


class RecordError(DataLoss):
    """Bytes at ``position`` are not a valid record. ``reason`` is machine-readable: short, magic,
    length, offset, crc or blank (a blank record where a record was needed)."""

    def __init__(self, reason: str, detail: str, position: int):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.position = position


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


# ---- properties ------------------------------------------------------------------------------------------

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


# ---- the specification: check, decode --------------------------------------------------------------------

def layout_index(buf, position: int) -> int:
    """Index into record.LAYOUTS / BODY_AT / STORE_TIMESTAMP_AT of the record at ``position``."""
    return (buf[position + SYS_FLAG_HOST_BYTE_AT] & SYSFLAG_HOSTS_V6) >> LAYOUT_SHIFT


def is_blank(buf, position: int) -> bool:
    return PREFIX.unpack_from(buf, position)[1] == MAGIC_BLANK


def check(buf, position: int, limit: int, *, verify_crc: bool = True, physical_offset: int | None = None) -> int:
    """Validate the record or blank at ``position`` (reading no further than ``limit``).

    Returns TOTALSIZE; a blank record returns its size too (use :func:`is_blank`). Raises RecordError
    with reason ``short`` (fewer bytes than the record claims), ``magic``, ``length``, ``offset`` (its
    PHYSICALOFFSET is not ``physical_offset``, when given) or ``crc``.
    """
    left = limit - position
    if left < BLANK_SIZE:
        raise RecordError("short", f"{left} bytes left at position {position}", position)
    total, magic = PREFIX.unpack_from(buf, position)
    if magic == MAGIC_BLANK:
        if total < BLANK_SIZE:
            raise RecordError("length", f"blank record of size {total} at position {position}", position)
        return total
    if magic != MAGIC_V1:
        raise RecordError("magic", f"magic 0x{magic:08X} at position {position}", position)
    if total < FIXED_OVERHEAD or total > left:
        reason = "short" if total > left else "length"
        raise RecordError(reason, f"TOTALSIZE {total} at position {position}, {left} bytes left", position)
    body_at = BODY_AT_BY_HOST_BYTE[buf[position + SYS_FLAG_HOST_BYTE_AT]]
    if total < body_at + 3:
        raise RecordError("length", f"TOTALSIZE {total} at position {position} is below the fixed fields of "
                                    f"its IPv6 host layout", position)
    body_at += position
    body_len = INT32.unpack_from(buf, body_at - 4)[0]
    end = position + total
    if body_len < 0 or body_at + body_len + 1 > end:
        raise RecordError("length", f"BODYLENGTH {body_len} at position {position}", position)
    topic_len = buf[body_at + body_len]
    props_at = body_at + body_len + 1 + topic_len
    if props_at + 2 > end:
        raise RecordError("length", f"TOPICLENGTH {topic_len} at position {position}", position)
    props_len = PROPERTIES_LENGTH.unpack_from(buf, props_at)[0]
    if props_len < 0 or props_at + 2 + props_len != end:
        raise RecordError("length", f"field lengths disagree with TOTALSIZE {total} at position {position}",
                          position)
    if physical_offset is not None:
        stored_offset = stored_physical_offset(buf, position)
        if stored_offset != physical_offset:
            raise RecordError("offset", f"PHYSICALOFFSET {stored_offset} at position {position}, which is "
                                        f"physical offset {physical_offset}", position)
    if verify_crc:
        stored = INT32.unpack_from(buf, position + BODY_CRC_AT)[0]
        actual = zlib.crc32(buf[body_at:body_at + body_len]) & _CRC_MASK
        if stored != actual:
            raise RecordError("crc", f"body CRC 0x{stored:08X} != 0x{actual:08X} at position {position}", position)
    return total


def decode(buf, position: int = 0, *, verify_crc: bool = True, physical_offset: int | None = None) -> Record:
    """Decode the record at ``position`` after validating it with :func:`check` (a blank record fails)."""
    check(buf, position, len(buf), verify_crc=verify_crc, physical_offset=physical_offset)
    if is_blank(buf, position):
        raise RecordError("blank", f"blank end-of-file record at position {position}", position)
    return _record(buf, position, LAYOUTS[layout_index(buf, position)])


def _record(buf, position: int, layout: Layout) -> Record:
    (total, _, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts, born_host, born_port,
     store_ts, store_host, store_port, reconsume, prepared, body_len) = layout.header.unpack_from(buf, position)
    at = position + layout.body_at
    body = bytes(buf[at:at + body_len])
    at += body_len
    topic_len = buf[at]
    topic = bytes(buf[at + 1:at + 1 + topic_len]).decode("utf-8", "replace")
    at += 1 + topic_len
    props_len = PROPERTIES_LENGTH.unpack_from(buf, at)[0]
    properties = decode_properties(bytes(buf[at + 2:at + 2 + props_len]))
    return Record(total, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts, born_host, born_port,
                  store_ts, store_host, store_port, reconsume, prepared, body, topic, properties)


# ---- the lazy view and the iterator -----------------------------------------------------------------------

class RecordView:
    """One checked record inside a buffer; each field is read when asked, nothing is copied before.
    Valid as long as the buffer is (a segment's mapping may be closed: copy what you keep).
    Not thread-safe to share while the buffer changes (log bytes below the written offset do not)."""

    __slots__ = ("buf", "position", "size", "sys_flag", "layout", "_topic_at")

    def __init__(self, buf, position: int):
        self.buf = buf
        self.position = position
        self.size = INT32.unpack_from(buf, position)[0]
        self.sys_flag = INT32.unpack_from(buf, position + SYS_FLAG_AT)[0]
        self.layout = LAYOUTS[(self.sys_flag & SYSFLAG_HOSTS_V6) >> LAYOUT_SHIFT]
        self._topic_at = position + self.layout.body_at + self._i32(self.layout.body_length_at)

    def _i32(self, at: int) -> int:
        return INT32.unpack_from(self.buf, self.position + at)[0]

    def _i64(self, at: int) -> int:
        return INT64.unpack_from(self.buf, self.position + at)[0]

    def _host(self, at: int, size: int) -> bytes:
        return bytes(self.buf[self.position + at:self.position + at + size])

    body_crc = property(lambda self: self._i32(BODY_CRC_AT))
    queue_id = property(lambda self: self._i32(QUEUE_ID_AT))
    flag = property(lambda self: self._i32(FLAG_AT))
    queue_offset = property(lambda self: self._i64(QUEUE_OFFSET_AT))
    physical_offset = property(lambda self: self._i64(PHYSICAL_OFFSET_AT))
    born_timestamp_ms = property(lambda self: self._i64(BORN_TIMESTAMP_AT))
    born_host = property(lambda self: self._host(BORN_HOST_AT, self.layout.born_host_bytes))
    born_port = property(lambda self: self._i32(self.layout.born_port_at))
    store_timestamp_ms = property(lambda self: self._i64(self.layout.store_timestamp_at))
    store_host = property(lambda self: self._host(self.layout.store_host_at, self.layout.store_host_bytes))
    store_port = property(lambda self: self._i32(self.layout.store_port_at))
    reconsume_times = property(lambda self: self._i32(self.layout.reconsume_times_at))
    prepared_transaction_offset = property(lambda self: self._i64(self.layout.prepared_transaction_offset_at))
    tx_type = property(lambda self: self.sys_flag & SYSFLAG_TX_MASK)

    @property
    def body(self) -> bytes:
        return bytes(self.buf[self.position + self.layout.body_at:self._topic_at])

    @property
    def topic_bytes(self) -> bytes:
        return bytes(self.buf[self._topic_at + 1:self._topic_at + 1 + self.buf[self._topic_at]])

    @property
    def topic(self) -> str:
        return self.topic_bytes.decode("utf-8", "replace")

    @property
    def properties_raw(self) -> bytes:
        return bytes(self.buf[self._topic_at + 3 + self.buf[self._topic_at]:self.position + self.size])

    @property
    def properties(self) -> dict[str, str]:
        return decode_properties(self.properties_raw)

    def property(self, name: str) -> str | None:
        return find_property(self.properties_raw, name)

    def crc_ok(self) -> bool:
        body = memoryview(self.buf)[self.position + self.layout.body_at:self._topic_at]
        try:
            return zlib.crc32(body) & _CRC_MASK == self.body_crc
        finally:
            body.release()

    def decode(self) -> Record:
        return _record(self.buf, self.position, self.layout)


def records(buf, position: int = 0, limit: int | None = None, *, verify_crc: bool = True,
            base: int | None = None) -> Iterator[RecordView]:
    """The records of ``buf`` from ``position`` up to ``limit`` (its end by default), each checked
    (:func:`check`; with ``base``, the physical offset of byte 0, each must name its own physical
    offset). Stops at the limit or at a blank record; raises RecordError, whose ``position`` says
    where, at the first record that fails."""
    limit = len(buf) if limit is None else limit
    while position < limit:
        size = check(buf, position, limit, verify_crc=verify_crc,
                     physical_offset=None if base is None else base + position)
        if is_blank(buf, position):
            return
        yield RecordView(buf, position)
        position += size


# ---- single fields of a record already checked --------------------------------------------------------------

def stored_physical_offset(buf, position: int) -> int:
    """PHYSICALOFFSET of the record at ``position`` (at least 36 bytes must be there)."""
    return INT64.unpack_from(buf, position + PHYSICAL_OFFSET_AT)[0]


def store_timestamp(buf, position: int) -> int:
    return INT64.unpack_from(buf, position + STORE_TIMESTAMP_AT[layout_index(buf, position)])[0]


def body_length_and_properties(buf, position: int = 0) -> tuple[int, bytes]:
    """BODYLENGTH and the raw properties of a valid record, without decoding the rest (the compactor's
    key and tombstone test on every record of a round)."""
    body_at = position + BODY_AT_BY_HOST_BYTE[buf[position + SYS_FLAG_HOST_BYTE_AT]]
    body_len = INT32.unpack_from(buf, body_at - 4)[0]
    topic_at = body_at + body_len
    props_at = topic_at + 3 + buf[topic_at]
    props_len = PROPERTIES_LENGTH.unpack_from(buf, props_at - 2)[0]
    return body_len, bytes(buf[props_at:props_at + props_len])


def body_of(buf, position: int = 0) -> bytes:
    """BODY of a valid record, without decoding the rest (the compactor's GetLatest and Scan values)."""
    body_at = position + BODY_AT_BY_HOST_BYTE[buf[position + SYS_FLAG_HOST_BYTE_AT]]
    return bytes(buf[body_at:body_at + INT32.unpack_from(buf, body_at - 4)[0]])


def peek_sys_flag(buf, position: int) -> int:
    """SYSFLAG of a valid record without decoding the rest (for Tail's transaction-type filter)."""
    return INT32.unpack_from(buf, position + SYS_FLAG_AT)[0]


def peek_topic(buf, position: int) -> bytes:
    """Topic bytes of a valid record without decoding the rest (for Tail's topic filter)."""
    topic_at = position + BODY_AT_BY_HOST_BYTE[buf[position + SYS_FLAG_HOST_BYTE_AT]]
    topic_at += INT32.unpack_from(buf, topic_at - 4)[0]
    return bytes(buf[topic_at + 1:topic_at + 1 + buf[topic_at]])
