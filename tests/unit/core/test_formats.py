"""Golden bytes and hand-checked fields for the record, blank record, consume queue entry, checkpoint."""

from __future__ import annotations

import struct
import zlib

import pytest

from mqstore.errors import DataLoss
from mqstore.format import checkpoint, cq_unit, record, segment_name
from mqstore.javahash import java_string_hash
from tests.conftest import GOLDEN, golden_bytes

FIXED = dict(topic=b"TopicTest", body=b"Hello RocketMQ", properties=record.encode_properties(
    {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "7F00000100002A9F0000000000000001"}),
    queue_id=3, flag=7, sys_flag=0, born_timestamp_ms=1_700_000_000_123, born_host=bytes([10, 0, 0, 7]),
    born_port=53001, store_host=bytes([127, 0, 0, 1]), store_port=50051, reconsume_times=2,
    prepared_transaction_offset=99, queue_offset=42, physical_offset=1_073_741_824,
    store_timestamp_ms=1_700_000_000_456)


def test_record_golden(request):
    data = record.encode(**FIXED)
    assert data == golden_bytes("record_v1.bin", data, request)


def test_record_fields_by_hand():
    data = record.encode(**FIXED)
    props = FIXED["properties"]
    assert len(data) == 91 + 14 + 9 + len(props)
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    assert data[4:8] == bytes.fromhex("DAA320A7")
    assert struct.unpack_from(">i", data, 8)[0] == zlib.crc32(b"Hello RocketMQ") & 0x7FFFFFFF
    assert struct.unpack_from(">iiqq", data, 12) == (3, 7, 42, 1_073_741_824)
    assert data[48:52] == bytes([10, 0, 0, 7]) and struct.unpack_from(">i", data, 52)[0] == 53001
    assert struct.unpack_from(">q", data, 56)[0] == 1_700_000_000_456
    assert struct.unpack_from(">iq", data, 72) == (2, 99)
    assert struct.unpack_from(">i", data, 84)[0] == 14 and data[88:102] == b"Hello RocketMQ"
    assert data[102] == 9 and data[103:112] == b"TopicTest"
    assert struct.unpack_from(">h", data, 112)[0] == len(props) and data[114:] == props
    assert props.endswith(b"\x02") and b"TAGS\x01TagA\x02" in props


def test_record_decode_round_trip():
    rec = record.decode(record.encode(**FIXED))
    assert (rec.topic, rec.body, rec.queue_id, rec.queue_offset, rec.physical_offset) == (
        "TopicTest", b"Hello RocketMQ", 3, 42, 1_073_741_824)
    assert rec.properties["KEYS"] == "k1 k2" and rec.reconsume_times == 2
    assert rec.born_host == bytes([10, 0, 0, 7]) and rec.store_port == 50051


def test_stamp_fills_lock_time_fields():
    buf = bytearray(record.encode(**{**FIXED, "queue_offset": 0, "physical_offset": 0, "store_timestamp_ms": 0}))
    record.stamp(buf, 0, 42, 1_073_741_824, 1_700_000_000_456)
    assert bytes(buf) == record.encode(**FIXED)


def test_blank_golden(request):
    blank = record.encode_blank(4096)
    assert blank == bytes.fromhex("00001000CBD43194")
    assert blank == golden_bytes("blank.bin", blank, request)


def test_cq_entry_golden(request):
    entry = cq_unit.encode(1_073_741_824, 1150, java_string_hash("TagA"))
    assert entry == bytes.fromhex("0000000040000000" "0000047E" "000000000027A807")
    assert entry == golden_bytes("cq_entry.bin", entry, request)
    negative = cq_unit.encode(5, 6, -2147483648)
    assert negative[12:] == bytes.fromhex("FFFFFFFF80000000")  # sign-extended like Java's long


def test_checkpoint_golden_and_corruption(request):
    cp = checkpoint.Checkpoint(123456, 120000, 1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002,
                               65536, 123456)
    data = checkpoint.encode(cp)
    assert len(data) == 80 and data[4:8] == b"\0\0\0\2"
    assert struct.unpack_from(">qq", data, 48) == (65536, 123456) and data[64:76] == bytes(12)
    assert data == golden_bytes("checkpoint_v2.bin", data, request)
    assert checkpoint.decode(data) == cp
    for bad in (data[:-1], data[:10] + b"\xff" + data[11:], b"XXXX" + data[4:], data[:4] + b"\0\0\0\3" + data[8:],
                data[:64]):
        with pytest.raises(DataLoss):
            checkpoint.decode(bad)


def test_checkpoint_version_1_is_still_read():
    # Written by the previous build (64 bytes, 12 reserved bytes, CRC at 60): no checked range.
    data = (GOLDEN / "checkpoint_v1.bin").read_bytes()
    assert len(data) == 64
    assert checkpoint.decode(data) == checkpoint.Checkpoint(123456, 120000, 1_700_000_000_000, 1_700_000_000_001,
                                                            1_700_000_000_002, 0, 0)
    with pytest.raises(DataLoss):
        checkpoint.decode(data[:20] + b"\1" + data[21:])


@pytest.mark.parametrize("text, expected", [
    ("", 0), ("hello", 99162322), ("polygenelubricants", -2147483648), ("GydZG_", -2147483648),
    ("Aa", 2112), ("BB", 2112), ("TagA", 2598919), ("ä", 228), ("中文", 646394),
    ("\U0001F600", 1772899), ("a\U0001F600b", 57849694), ("topic#key-1", -1818553361),
    ("DESIGN#ünïcode", 951665125),
])
def test_java_string_hash_matches_java(text, expected):
    # Values printed by `String.hashCode()` on OpenJDK 17.
    assert java_string_hash(text) == expected


@pytest.mark.parametrize("bad, reason", [
    (lambda d: d[:50], "short"),
    (lambda d: d[:4] + b"\0\0\0\0" + d[8:], "magic"),
    (lambda d: d[:90] + bytes([d[90] ^ 0xFF]) + d[91:], "crc"),
    (lambda d: struct.pack(">i", len(d) - 1) + d[4:-1], "length"),
])
def test_check_rejects_damage(bad, reason):
    data = bad(record.encode(**FIXED))
    with pytest.raises(record.RecordError) as info:
        record.check(data, 0, len(data))
    assert info.value.reason == reason


def test_properties_and_names():
    assert record.decode_properties(b"a\x01b\x02\x01x\x02c\x01\x02") == {"a": "b"}
    assert segment_name.name_for(1073741824) == "00000000001073741824"
    assert segment_name.parse("00000000001073741824") == 1073741824
    with pytest.raises(ValueError):
        segment_name.parse("00000000001073741824.broken")


def test_offset_msg_id_round_trip():
    msg_id = record.offset_msg_id(bytes([127, 0, 0, 1]), 50051, 0x1234)
    assert msg_id == "7F0000010000C3830000000000001234"
    assert record.parse_offset_msg_id(msg_id) == (bytes([127, 0, 0, 1]), 50051, 0x1234)
    with pytest.raises(ValueError):
        record.parse_offset_msg_id("XYZ")


def test_walk_stops_cleanly_eight_bytes_before_the_end():
    # A record that leaves exactly 8 bytes (room for a blank not yet written) before the file end.
    seg = bytearray(8192)
    rec = record.encode(**{**FIXED, "body": b"b" * (8184 - 91 - 9 - len(FIXED["properties"]))})
    assert len(rec) == 8184
    seg[:8184] = rec
    stop, count, last_ts, error = record.walk(seg, 0, len(seg))
    assert (stop, count, last_ts) == (8184, 1, FIXED["store_timestamp_ms"])
    assert error is not None and error.reason == "magic"  # zeros: the caller decides it is a clean end
    seg[8184:] = record.encode_blank(8)
    assert record.walk(seg, 0, len(seg))[:2] == (8184, 1) and record.walk(seg, 0, len(seg))[3] is None


def test_walk_agrees_with_check_on_damage():
    recs = b"".join(record.encode(**{**FIXED, "body": bytes([i]) * (50 + i)}) for i in range(5))
    stop, count, _, error = record.walk(recs, 0, len(recs))
    assert (stop, count, error) == (len(recs), 5, None)
    damaged = bytearray(recs)
    second = len(record.encode(**{**FIXED, "body": bytes([0]) * 50}))
    damaged[second + 95] ^= 0xFF  # inside the second record's body
    stop, count, _, error = record.walk(damaged, 0, len(damaged))
    assert (stop, count, error.reason) == (second, 1, "crc")
