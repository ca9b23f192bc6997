"""Tail frame bytes -> IndexRecords, with the shared record reader (mqstore.format.record_reader and
record_scan).

A frame is checked and read in one pass with ``record_scan.index_walk`` (TOTALSIZE chain, magic, field
lengths and the body CRC; then the few fields the index needs, copying no body). Measured on 1 KiB records
with three properties on the 2-core development machine: about 5-7 us per record, against 9-18 us for
``record_reader.decode(verify_crc=True)`` (which copies the body and builds a Record); bench/index_bench.py
measures the whole build rate.

A record that fails its checks is not indexed; :func:`decode_frame` reports it as a damaged range and
goes on with the first record after it that verifiably starts (see there), so one bad record in the
log never stops the index.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.errors import DataLoss
from mqstore.format import record, record_reader, record_scan

from .records import IndexRecord


class BadFrame(DataLoss):
    """Tail sent bytes that are not whole valid records; ``physical_offset`` is where they start."""

    def __init__(self, message: str, physical_offset: int):
        super().__init__(message)
        self.physical_offset = physical_offset


@dataclass(frozen=True, slots=True)
class DamagedRange:
    """Log bytes [start, end) that a frame carried but that fail their checks; ``reason`` says how."""

    start_physical_offset: int
    end_physical_offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class DecodedFrame:
    records: list[IndexRecord]
    damaged: list[DamagedRange]


def decode_frame(data: bytes, next_physical_offset: int) -> DecodedFrame:
    """Every record of one frame of an unfiltered Tail that passes its checks, in log order, and the
    ranges that do not.

    Such a frame is contiguous (CommitLog.frame): byte 0 is at physical offset
    ``next_physical_offset - len(data)``, so every record must name its own physical offset too.
    Where a record fails at position x, decoding goes on at x + TOTALSIZE if only its body CRC
    fails (its TOTALSIZE agrees with its field lengths), else at the first record after x that names
    itself (magic V1, field lengths that agree with its TOTALSIZE, PHYSICALOFFSET = its own;
    record_scan.next_record_start), or at the frame's end if there is none: a damaged TOTALSIZE must not
    swallow the good records that follow it.
    """
    limit = len(data)
    base = next_physical_offset - limit
    fields: list[tuple[int, int, int, bytes, bytes]] = []
    damaged: list[DamagedRange] = []
    position = 0
    while position < limit:
        walked = record_scan.index_walk(data, position, verify_crc=True, base=base)
        fields += walked.fields
        if walked.error is None:
            break
        position = _after_damaged(data, walked.stop, base)
        damaged.append(DamagedRange(base + walked.stop, base + position, str(walked.error)))
    return DecodedFrame(_index_records(fields), damaged)


def _after_damaged(data: bytes, position: int, base: int) -> int:
    limit = len(data)
    try:
        total = record_reader.check(data, position, limit, verify_crc=False, physical_offset=base + position)
        return min(position + total, limit)  # only the CRC fails: its TOTALSIZE holds
    except record_reader.RecordError:
        return record_scan.next_record_start(data, position, limit, base)


def index_records(data: bytes, first_physical_offset: int = -1) -> list[IndexRecord]:
    """Every record of one frame, in log order; raises BadFrame if any fails its checks
    (``first_physical_offset`` is only used in the message). For callers that expect no damage."""
    walked = record_scan.index_walk(data, verify_crc=True)
    if walked.error is not None:
        raise BadFrame(f"Tail frame from physical offset {first_physical_offset} fails its checks: {walked.error}",
                       first_physical_offset)
    return _index_records(walked.fields)


def _index_records(fields: list[tuple[int, int, int, bytes, bytes]]) -> list[IndexRecord]:
    rollback, tx_mask, find_property = record.SYSFLAG_TX_ROLLBACK, record.SYSFLAG_TX_MASK, record_reader.find_property
    out: list[IndexRecord] = []
    topics: dict[bytes, str] = {}
    for physical_offset, sys_flag, store_ts, topic, raw_properties in fields:
        keys = find_property(raw_properties, record.PROPERTY_KEYS)
        split = tuple(keys.split(" ")) if keys else ()
        if "" in split:
            split = tuple(k for k in split if k)
        name = topics.get(topic)
        if name is None:
            name = topics[topic] = topic.decode("utf-8", "replace")
        out.append(IndexRecord(physical_offset, store_ts, name, split,
                               find_property(raw_properties, record.PROPERTY_UNIQ_KEY) or "",
                               sys_flag & tx_mask == rollback))
    return out
