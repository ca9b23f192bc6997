"""The compiled record walk and topic#key hashes against the pure-Python references (mqstore.codec).

The same random logs go to both walks: valid records in all four host layouts (tests/support/records,
the store's own encoder), then damaged (a byte changed, bytes cut or inserted, a TOTALSIZE, CRC,
PHYSICALOFFSET or properties length overwritten), from any position, to any limit, with and without the
CRC and PHYSICALOFFSET checks. They must stop at the same position with the same count, last store
time and index fields. The hashes of topic#key (ASCII, accented, astral, lone surrogates) must equal
index_file's reference. The compiled modules are imported directly, so these run under
MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.format import index_file, record, record_scan
from mqstore.javahash import java_hash_continue, java_hash_prefix
from tests.support import compiled as support_compiled
from tests.support import records

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_scan")

SETTINGS = support_compiled.examples(300)
BASE = 1 << 20
HOSTS = (records.LOOPBACK_V4, records.LOOPBACK_V6)

one_record = st.fixed_dictionaries({
    "body": st.binary(max_size=300), "topic": st.sampled_from([b"t", b"orders", "é".encode(), b"x" * 127]),
    "properties": st.dictionaries(st.sampled_from(["KEYS", "UNIQ_KEY", "TAGS", "a"]),
                                  st.text("ab é", min_size=1, max_size=8), max_size=3),
    "sys_flag": st.sampled_from([0, 0x4, 0x8, 0xC]), "born_host": st.sampled_from(HOSTS),
    "store_host": st.sampled_from(HOSTS), "store_timestamp_ms": st.integers(0, 1 << 62),
})


def build_log(specs: list[dict]) -> bytearray:
    data = bytearray()
    for spec in specs:
        spec["body_at"] = len(data) + record.BODY_AT[(spec["born_host"] != records.LOOPBACK_V4)
                                                     | (spec["store_host"] != records.LOOPBACK_V4) << 1]
        data += records.encode(topic=spec["topic"], body=spec["body"],
                               properties=record.encode_properties(spec["properties"]), sys_flag=spec["sys_flag"],
                               born_host=spec["born_host"], store_host=spec["store_host"],
                               physical_offset=BASE + len(data), store_timestamp_ms=spec["store_timestamp_ms"])
    return data


@st.composite
def damaged(draw, data: bytearray) -> bytearray:
    data = bytearray(data)
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "int32", "int64"]))
        if how == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif how == "cut":
            del data[at:]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif how == "int32" and at + 4 <= len(data):  # e.g. a TOTALSIZE, CRC, BODYLENGTH
            data[at:at + 4] = draw(st.sampled_from([0, 91, 100, 0x7FFFFFFF, 0xFFFFFFFF, 0xDAA320A7,
                                                    0xCBD43194])).to_bytes(4, "big")
        elif how == "int64" and at + 8 <= len(data):  # e.g. a PHYSICALOFFSET
            data[at:at + 8] = draw(st.sampled_from([0, BASE, BASE + 91, 1 << 63])).to_bytes(8, "big")
    return data


@st.composite
def logs(draw):
    specs = draw(st.lists(one_record, max_size=5))
    data = build_log(specs)
    bodies = [spec for spec in specs if spec["body"]]
    if bodies and draw(st.booleans()):  # a changed body byte: only the CRC can tell
        spec = draw(st.sampled_from(bodies))
        data[spec["body_at"] + draw(st.integers(0, len(spec["body"]) - 1))] ^= draw(st.integers(1, 255))
    data = draw(damaged(data)) if draw(st.booleans()) else data
    position = draw(st.sampled_from([0, 0, 1, 88, len(data)]))
    limit = draw(st.sampled_from([len(data), len(data), max(len(data) - 1, 0), min(len(data), 200)]))
    return bytes(data), min(position, len(data)), limit


@SETTINGS
@given(logs(), st.booleans(), st.sampled_from([None, BASE, 0]), st.booleans())
def test_the_compiled_walk_stops_where_the_reference_stops(log, verify_crc, base, collect):
    data, position, limit = log
    expected_out, out = ([], []) if collect else (None, None)
    expected = record_scan._scan_python(data, position, limit, verify_crc, base, expected_out)
    assert compiled.scan(data, position, limit, verify_crc, base, out) == expected
    assert out == expected_out
    # The same over the buffers the store walks: a bytearray and an mmap-like memoryview.
    assert compiled.scan(bytearray(data), position, limit, verify_crc, base, None) == expected
    assert compiled.scan(memoryview(data), position, limit, verify_crc, base, None) == expected


def test_a_limit_past_the_buffer_is_refused():
    with pytest.raises(ValueError, match="past the buffer"):
        compiled.scan(b"x" * 10, 0, 11, True, None, None)


keys = st.text(st.sampled_from(["a", "Z", "#", " ", "é", "中", "😀", "\ud800", "\udfff", "\x00"]), max_size=12)


@SETTINGS
@given(st.text(st.sampled_from(["t", "é", "😀", "%"]), max_size=6), st.lists(keys, max_size=5))
def test_the_compiled_key_hashes_are_the_reference(topic, suffixes):
    prefix = java_hash_prefix(f"{topic}#")
    expected = index_file._key_hashes_python(prefix, suffixes)
    assert compiled.key_hashes(prefix, suffixes, java_hash_continue) == expected
    assert expected == [index_file.key_hash(f"{topic}#{s}") for s in suffixes]


def test_integer_min_value_hashes_to_zero_in_both():
    # "polygenelubricants" has the Java hash Integer.MIN_VALUE.
    assert compiled.key_hashes(0, ["polygenelubricants"], java_hash_continue) == [0] == \
        index_file._key_hashes_python(0, ["polygenelubricants"])


def _routing_compiled(buf, position: int, end: int, chunk: int) -> list:
    """record_scan's compiled routing walk with a chosen chunk size, to a list."""
    out = []
    while position < end:
        got, position, blank = compiled.routing_records(buf, position, end, chunk)
        out += got
        if blank:
            return out
        if not got:
            return out + list(record_scan._routing_records_python(buf, position, end))
    return out


@SETTINGS
@given(st.lists(one_record, max_size=6), st.sampled_from(["none", "blank", "garbage-magic"]), st.integers(1, 4),
       st.data())
def test_the_compiled_routing_walk_gives_the_reference_fields(specs, tail, chunk, data):
    """Valid records (a TAGS property among others, or none), then the end, a blank record (the end of a
    segment's data) or a record the C walk leaves to the reference; any chunk size."""
    for spec in specs:
        if data.draw(st.booleans()):
            spec["properties"] = {**spec["properties"], "TAGS": data.draw(st.sampled_from(["t", "é", "a b"]))}
    log = build_log(specs)
    if tail == "blank":
        log += record.encode_blank(64) + bytes(56)
    elif tail == "garbage-magic" and specs:
        extra = build_log(specs[:1])
        extra[4:8] = b"\x00\x00\x00\x01"
        log += extra
    end = data.draw(st.sampled_from([len(log), max(len(log) - 1, 0)]))
    # The reference reads a record with another magic as it stands; the C walk hands it back to it.
    expected = list(record_scan._routing_records_python(bytes(log), 0, end))
    assert _routing_compiled(bytes(log), 0, end, chunk) == expected


def test_routing_tags_follow_find_property():
    """Whole-name matches only, the last non-empty entry wins, no trailing separator needed."""
    for raw in (b"MYTAGS\x01v\x02TAGS\x01a\x02", b"TAGS\x01a\x02TAGS\x01\x02", b"TAGS\x01a\x02TAGS\x01b",
                b"XTAGS\x01a\x02", b"TAGS\x01\xff\x02", b"a\x01TAGS\x01b\x02", b""):
        log = records.encode(topic=b"t", body=b"x", properties=raw)
        [fields] = compiled.routing_records(log, 0, len(log), 10)[0]
        assert fields == record_scan.routing_fields(log, 0), raw


def test_a_position_before_the_buffer_is_refused_not_read():
    data = build_log([{"body": b"x", "topic": b"t", "properties": {}, "sys_flag": 0, "born_host": HOSTS[0],
                       "store_host": HOSTS[0], "store_timestamp_ms": 1}])
    with pytest.raises(ValueError, match="before the buffer"):
        compiled.routing_records(data, -8, len(data), 10)
    with pytest.raises(ValueError, match="before the buffer"):
        compiled.scan(data, -8, len(data), True, None, [])
