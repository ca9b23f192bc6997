"""The hot loops over many commit log records in a buffer, on mqstore.format.record's offset tables.

Small functions over (buffer, position) with ints only, so that issue 10 can compile them (Cython):
:func:`walk` (recovery: check every record of a segment), :func:`index_walk` (the Index: check a
Tail frame and take the fields it needs), :func:`routing_fields` and :func:`routing_records` (the
dispatcher's rebuild),
:func:`frameable` and :func:`next_record_start` (Tail and readers finding their way past damage).

mqstore.format.record_reader.check is the specification of a valid record: the loop in :func:`_scan`
accepts exactly what it accepts (tests compare them, in every host layout) and lets it name the
failure. The loop reads the fields before the first host with one struct call (COMMON_HEADER) and
finds the rest through the flat per-layout tables BODY_AT and STORE_TIMESTAMP_AT.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterator

from mqstore import codec
from mqstore.errors import invariant
from mqstore.format.record import (
    BLANK_SIZE, BODY_AT, FIXED_OVERHEAD, HEADER_SIZE, INT32, INT64, LAYOUT_SHIFT, MAGIC_BLANK,
    IPV4, MAGIC_V1, PHYSICAL_OFFSET_AT, PREFIX, PROPERTIES_LENGTH, PROPERTY_TAGS, STORE_TIMESTAMP_AT, SYSFLAG_HOSTS_V6)
from mqstore.format.record_reader import RecordError, check, find_property, is_blank

_CRC_MASK = 0x7FFFFFFF
# One call reads every field of an IPv4 record's header; for the other layouts the fields from BORNHOST
# on are read again at their offsets (record.BODY_AT, STORE_TIMESTAMP_AT).
IPV4_HEADER = IPV4.header.unpack_from


@dataclass(frozen=True, slots=True)
class Walked:
    """What :func:`walk` found. ``stop`` is the start of the first record that fails (``error`` set),
    of a blank record (``error`` None: the caller jumps to the next file), or the limit."""

    stop: int
    records: int                   # records checked before ``stop``
    last_store_timestamp_ms: int   # of the last of them (0 when there is none)
    error: RecordError | None


@dataclass(frozen=True, slots=True)
class FrameFields:
    """What :func:`index_walk` found: per good record (physical offset, sys flag, store time, topic
    bytes, properties bytes), where it stopped, and why (None at the end of the buffer)."""

    fields: list[tuple[int, int, int, bytes, bytes]]
    stop: int
    error: RecordError | None


def walk(buf, position: int, limit: int, *, verify_crc: bool = True, base: int | None = None) -> Walked:
    """Check records one after another from ``position`` up to ``limit`` (recovery's hot loop).
    With ``base`` (the physical offset of position 0), each record's PHYSICALOFFSET must be its own
    physical offset (no checksum covers the header, but every record names where it lives)."""
    stop, count, last_ts = _scan(buf, position, limit, verify_crc, base, None)
    error = _why_stopped(buf, stop, limit, verify_crc, base, True) if stop < limit else None
    return Walked(stop, count, last_ts, error)


def index_walk(buf, position: int = 0, *, verify_crc: bool = True, base: int | None = None) -> FrameFields:
    """Check the records of ``buf`` from ``position`` (whole records back to back, as a Tail frame
    holds) and take the fields the index needs, in one pass, copying no body. Like :func:`walk` it
    stops at the first record that fails (a blank record in a frame fails too), with the error."""
    out: list[tuple[int, int, int, bytes, bytes]] = []
    limit = len(buf)
    stop, _, _ = _scan(buf, position, limit, verify_crc, base, out)
    return FrameFields(out, stop, _why_stopped(buf, stop, limit, verify_crc, base, False) if stop < limit else None)


def _scan_python(buf, position: int, limit: int, verify_crc: bool, base: int | None,
                 out: list | None) -> tuple[int, int, int]:
    """The loop of walk and index_walk: exactly :func:`check`'s conditions, in one pass per record.
    Returns (stop position, records, store time of the last one); stops at the first record that is
    not a valid V1 record (or a blank one, or fewer than FIXED_OVERHEAD bytes before ``limit``). Appends
    the index fields of each record to ``out`` unless it is None."""
    header, i32, i64, props_len_of, crc32 = (IPV4_HEADER, INT32.unpack_from, INT64.unpack_from,
                                             PROPERTIES_LENGTH.unpack_from, zlib.crc32)
    body_at_of, ts_at_of = BODY_AT, STORE_TIMESTAMP_AT
    count = last_ts = 0
    view = memoryview(buf)
    try:
        while limit - position >= FIXED_OVERHEAD:
            (total, magic, crc, _, _, _, physical_offset, sys_flag, _, _, _, store_ts, _, _, _, _,
             body_len) = header(buf, position)
            end = position + total
            if sys_flag & SYSFLAG_HOSTS_V6:  # the fields after BORNHOST lie further
                layout = (sys_flag & SYSFLAG_HOSTS_V6) >> LAYOUT_SHIFT
                body_at = position + body_at_of[layout]
                if end < body_at + 3 or end > limit:
                    break
                body_len = i32(buf, body_at - 4)[0]
                store_ts = i64(buf, position + ts_at_of[layout])[0]
            else:
                body_at = position + HEADER_SIZE
            topic_at = body_at + body_len
            if (magic != MAGIC_V1 or end > limit or end < body_at + 3 or topic_at < body_at or topic_at >= end
                    or (base is not None and physical_offset != base + position)):
                break
            props_at = topic_at + 1 + buf[topic_at]
            if props_at + 2 > end or props_at + 2 + props_len_of(buf, props_at)[0] != end:
                break
            if verify_crc and crc32(view[body_at:topic_at]) & _CRC_MASK != crc:
                break
            last_ts = store_ts
            if out is not None:
                out.append((physical_offset, sys_flag, store_ts, bytes(view[topic_at + 1:props_at]),
                            bytes(view[props_at + 2:end])))
            count += 1
            position = end
    finally:
        view.release()
    return position, count, last_ts


# The compiled loop (mqstore.codec) when in use: the same results (tests/property/test_codec_scan.py).
_scan = codec.compiled.scan if codec.compiled is not None else _scan_python


def _why_stopped(buf, position: int, limit: int, verify_crc: bool, base: int | None,
                 blank_ends: bool) -> RecordError | None:
    """Why :func:`_scan` stopped at ``position`` before ``limit``, in :func:`check`'s words; None at a
    blank record when ``blank_ends`` (the end of a segment's data)."""
    try:
        check(buf, position, limit, verify_crc=verify_crc, physical_offset=None if base is None else base + position)
    except RecordError as exc:
        return exc
    invariant(is_blank(buf, position), f"the record scan and check disagree about the record at position {position}")
    return None if blank_ends else RecordError("blank", f"blank end-of-file record at position {position}", position)


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


def frameable(buf, position: int, size: int, magic: int, end: int, base: int) -> bool:
    """The record at ``position`` (physical offset ``base + position``; ``size`` and ``magic`` are its
    TOTALSIZE and MAGICCODE) can go into a Tail frame: magic V1, a TOTALSIZE that stays below ``end``,
    its PHYSICALOFFSET is its own, and its TOTALSIZE leads to ``end``, a blank record or a V1 record
    naming its own offset, or else (that successor may be what is damaged) agrees with its own field
    lengths. The body CRC is the reader's to check: checking it here would cost every Tail."""
    i64 = INT64.unpack_from
    if magic != MAGIC_V1 or size < FIXED_OVERHEAD or position + size > end:
        return False
    if i64(buf, position + PHYSICAL_OFFSET_AT)[0] != base + position:
        return False
    nxt = position + size
    if nxt == end:
        return True
    if nxt + HEADER_SIZE <= end:
        next_magic = PREFIX.unpack_from(buf, nxt)[1]
        if next_magic == MAGIC_BLANK or (next_magic == MAGIC_V1
                                         and i64(buf, nxt + PHYSICAL_OFFSET_AT)[0] == base + nxt):
            return True
    elif nxt + BLANK_SIZE <= end and PREFIX.unpack_from(buf, nxt)[1] == MAGIC_BLANK:
        return True
    try:
        check(buf, position, end, verify_crc=False)
        return True
    except RecordError:
        return False


def routing_fields(buf, position: int) -> tuple[int, bytes, int, int, int, str, int]:
    """(size, topic, queue id, queue offset, sys flag, TAGS, store time) of a valid record, without
    copying the body: what the dispatcher needs when it rebuilds consume queues."""
    (size, _, _, queue_id, _, queue_offset, _, sys_flag, _, _, _, store_ts, _, _, _, _,
     body_len) = IPV4_HEADER(buf, position)
    if sys_flag & SYSFLAG_HOSTS_V6:  # the fields after BORNHOST lie further
        layout = (sys_flag & SYSFLAG_HOSTS_V6) >> LAYOUT_SHIFT
        body_at = position + BODY_AT[layout]
        body_len = INT32.unpack_from(buf, body_at - 4)[0]
        store_ts = INT64.unpack_from(buf, position + STORE_TIMESTAMP_AT[layout])[0]
    else:
        body_at = position + HEADER_SIZE
    topic_at = body_at + body_len
    props_at = topic_at + 1 + buf[topic_at]
    props = buf[props_at + 2:props_at + 2 + PROPERTIES_LENGTH.unpack_from(buf, props_at)[0]]
    tags = find_property(props, PROPERTY_TAGS) or ""
    return size, bytes(buf[topic_at + 1:props_at]), queue_id, queue_offset, sys_flag, tags, store_ts


_ROUTING_CHUNK = 4096  # records per call of the compiled walk: bounds the list it builds


def _routing_records_python(buf, position: int, end: int) -> Iterator[tuple[int, bytes, int, int, int, str, int]]:
    """:func:`routing_fields` of each record from ``position`` while it is below ``end``, up to a
    blank record (the end of a segment's data): the dispatcher's rebuild loop over valid records."""
    prefix = PREFIX.unpack_from
    while position < end:
        if prefix(buf, position)[1] == MAGIC_BLANK:
            return
        fields = routing_fields(buf, position)
        yield fields
        position += fields[0]


def _routing_records_compiled(buf, position: int, end: int) -> Iterator[tuple[int, bytes, int, int, int, str, int]]:
    """The same in C, a chunk at a time; from a record it does not take on, the reference goes on."""
    walk = codec.compiled.routing_records
    while position < end:
        chunk, position, blank = walk(buf, position, end, _ROUTING_CHUNK)
        yield from chunk
        if blank:
            return
        if not chunk:
            yield from _routing_records_python(buf, position, end)
            return


routing_records = _routing_records_python if codec.compiled is None else _routing_records_compiled
