"""The record codec's scanning helpers: find_property (one copy for the dispatcher and the index),
walk's PHYSICALOFFSET check, next_record_start (resynchronising after a damaged TOTALSIZE) and the
partial results of index_walk."""

from __future__ import annotations

import pytest

from mqstore.format import record, record_reader, record_scan
from tests.support import records

def _record(physical_offset: int, body: bytes, properties: dict[str, str] | None = None) -> bytes:
    return records.encode(topic=b"t", body=body, properties=record.encode_properties(properties or {}),
                          physical_offset=physical_offset, store_timestamp_ms=5)


def _log(bodies: list[bytes], base: int = 0) -> tuple[bytearray, list[int]]:
    data, starts = bytearray(), []
    for body in bodies:
        starts.append(base + len(data))
        data += _record(base + len(data), body)
    return data, starts


@pytest.mark.parametrize("raw, name, expected", [
    (b"MYTAGS\x01v\x02TAGS\x01a\x02", "TAGS", "a"),       # the bug: TAGS inside MYTAGS came first
    (b"TAGS\x01a\x02MYTAGS\x01v\x02", "TAGS", "a"),
    (b"MYTAGS\x01v\x02", "TAGS", None),
    (b"MYTAGS\x01v\x02", "MYTAGS", "v"),
    (b"KEYS\x01k1 k2\x02", "KEYS", "k1 k2"),
    (b"XKEYS\x01a\x02KEYSX\x01b\x02", "KEYS", None),
    (b"", "TAGS", None),
    (b"TAGS\x01\x02", "TAGS", None),                         # an empty value does not count
    (b"TAGS\x01a\x02TAGS\x01b\x02", "TAGS", "b"),             # the last one wins, as in a dict
    (b"TAGS\x01a", "TAGS", "a"),                              # no trailing separator
    ("TAGS\x01ü\x02".encode(), "TAGS", "ü"),
])
def test_find_property_matches_whole_names_like_decode_properties(raw, name, expected):
    assert record_reader.find_property(raw, name) == expected
    assert record_reader.decode_properties(raw).get(name) == expected


def test_routing_fields_find_tags_after_a_longer_name_ending_in_tags():
    data = records.encode(topic=b"t", body=b"x", properties=record.encode_properties({"MYTAGS": "v", "TAGS": "a"}))
    assert record_scan.routing_fields(data, 0)[5] == "a"


def test_walk_checks_that_every_record_names_its_own_physical_offset():
    data, starts = _log([b"a" * 100, b"b" * 100, b"c" * 100], base=4096)
    walked = record_scan.walk(data, 0, len(data), base=4096)
    assert (walked.stop, walked.records) == (len(data), 3)
    record.OFFSETS.pack_into(data, starts[1] - 4096 + record.QUEUE_OFFSET_AT, 0, 12345)  # the header says elsewhere
    walked = record_scan.walk(data, 0, len(data), base=4096)
    assert (walked.stop, walked.records, walked.error.reason) == (starts[1] - 4096, 1, "offset")
    assert record_scan.walk(data, 0, len(data)).error is None  # without a base nothing is checked


def test_next_record_start_skips_a_damaged_totalsize():
    data, starts = _log([bytes([i]) * 300 for i in range(5)])
    record.INT32.pack_into(data, starts[1], 100_000)  # TOTALSIZE of the second record
    assert record_scan.next_record_start(data, starts[1], len(data), 0) == starts[2]
    data[starts[2] + 30] ^= 0xFF  # the third one's PHYSICALOFFSET: it no longer names itself
    assert record_scan.next_record_start(data, starts[1], len(data), 0) == starts[3]
    assert record_scan.next_record_start(data, starts[4], len(data), 0) == len(data)  # nothing after the last


def test_next_record_start_accepts_a_blank_that_claims_the_rest():
    data, starts = _log([b"a" * 200, b"b" * 200])
    data += record.encode_blank(64) + bytes(56)
    data[starts[1] + 100] ^= 0xFF
    record.INT32.pack_into(data, starts[1], 7)
    assert record_scan.next_record_start(data, starts[1], len(data), 0) == len(data) - 64


def test_index_walk_returns_the_records_before_a_failure_and_where_it_stopped():
    data, starts = _log([bytes([i]) * 150 for i in range(4)])
    data[starts[2] + record.HEADER_SIZE + 3] ^= 0xFF  # a body byte of the third record
    walked = record_scan.index_walk(bytes(data))
    assert [f[0] for f in walked.fields] == starts[:2] and walked.stop == starts[2] and walked.error.reason == "crc"
    walked = record_scan.index_walk(bytes(data), starts[3])
    assert [f[0] for f in walked.fields] == [starts[3]] and walked.stop == len(data) and walked.error is None
    blank_frame = bytes(data[:starts[1]]) + record.encode_blank(16) + bytes(8)
    walked = record_scan.index_walk(blank_frame)
    assert len(walked.fields) == 1 and walked.stop == starts[1] and walked.error.reason == "blank"
