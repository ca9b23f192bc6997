"""The record codec's scanning helpers: find_property (one copy for the dispatcher and the index),
walk's PHYSICALOFFSET check, next_record_start (resynchronising after a damaged TOTALSIZE) and the
partial results of index_walk."""

from __future__ import annotations

import pytest

from mqstore.format import record

HOST = b"\x7f\x00\x00\x01"


def _record(physical_offset: int, body: bytes, properties: dict[str, str] | None = None) -> bytes:
    return record.encode(topic=b"t", body=body, properties=record.encode_properties(properties or {}),
                         queue_id=0, flag=0, sys_flag=0, born_timestamp_ms=1, born_host=HOST, born_port=1,
                         store_host=HOST, store_port=2, physical_offset=physical_offset, store_timestamp_ms=5)


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
    assert record.find_property(raw, name) == expected
    assert record.decode_properties(raw).get(name) == expected


def test_routing_fields_find_tags_after_a_longer_name_ending_in_tags():
    data = record.encode(topic=b"t", body=b"x", properties=record.encode_properties({"MYTAGS": "v", "TAGS": "a"}),
                         queue_id=0, flag=0, sys_flag=0, born_timestamp_ms=1, born_host=HOST, born_port=1,
                         store_host=HOST, store_port=2)
    assert record.routing_fields(data, 0)[5] == "a"


def test_walk_checks_that_every_record_names_its_own_physical_offset():
    data, starts = _log([b"a" * 100, b"b" * 100, b"c" * 100], base=4096)
    assert record.walk(data, 0, len(data), base=4096)[:2] == (len(data), 3)
    record.OFFSETS.pack_into(data, starts[1] - 4096 + record.OFFSETS_AT, 0, 12345)  # the header says elsewhere
    stop, count, _, error = record.walk(data, 0, len(data), base=4096)
    assert (stop, count, error.reason) == (starts[1] - 4096, 1, "offset")
    assert record.walk(data, 0, len(data))[3] is None  # without a base nothing is checked


def test_next_record_start_skips_a_damaged_totalsize():
    data, starts = _log([bytes([i]) * 300 for i in range(5)])
    record.INT32.pack_into(data, starts[1], 100_000)  # TOTALSIZE of the second record
    assert record.next_record_start(data, starts[1], len(data), 0) == starts[2]
    data[starts[2] + 30] ^= 0xFF  # the third one's PHYSICALOFFSET: it no longer names itself
    assert record.next_record_start(data, starts[1], len(data), 0) == starts[3]
    assert record.next_record_start(data, starts[4], len(data), 0) == len(data)  # nothing after the last


def test_next_record_start_accepts_a_blank_that_claims_the_rest():
    data, starts = _log([b"a" * 200, b"b" * 200])
    data += record.encode_blank(64) + bytes(56)
    data[starts[1] + 100] ^= 0xFF
    record.INT32.pack_into(data, starts[1], 7)
    assert record.next_record_start(data, starts[1], len(data), 0) == len(data) - 64


def test_index_walk_returns_the_records_before_a_failure_and_where_it_stopped():
    data, starts = _log([bytes([i]) * 150 for i in range(4)])
    data[starts[2] + record.HEADER_SIZE + 3] ^= 0xFF  # a body byte of the third record
    fields, stop, error = record.index_walk(bytes(data))
    assert [f[0] for f in fields] == starts[:2] and stop == starts[2] and error.reason == "crc"
    fields, stop, error = record.index_walk(bytes(data), starts[3])
    assert [f[0] for f in fields] == [starts[3]] and stop == len(data) and error is None
    blank_frame = bytes(data[:starts[1]]) + record.encode_blank(16) + bytes(8)
    fields, stop, error = record.index_walk(blank_frame)
    assert len(fields) == 1 and stop == starts[1] and error.reason == "blank"
