"""Golden bytes and hand-checked fields for the record, blank record, consume queue entry, checkpoint."""

from __future__ import annotations

import struct
import zlib

import pytest

from mqstore.errors import DataLoss
from mqstore.config import StoreConfig
from mqstore.format import checkpoint, cq_unit, record, record_reader, record_scan, segment_name, topic_event
from mqstore.javahash import java_string_hash
from mqstore.log.encoder import MessageEncoder
from mqstore.model import KIND_NORMAL, MessageIn, TopicRecord
from tests.conftest import GOLDEN, golden_bytes
from tests.support import records

UNIQ_KEY = "7F00000100002A9F0000000000000001"
BORN_MS, STORE_MS, QUEUE_OFFSET, PHYSICAL_OFFSET = 1_700_000_000_123, 1_700_000_000_456, 42, 1_073_741_824
PROPERTIES = record.encode_properties({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ_KEY})
FIXED = dict(topic=b"TopicTest", body=b"Hello RocketMQ", properties=PROPERTIES, queue_id=3, flag=7, sys_flag=0,
             born_timestamp_ms=BORN_MS, born_host=bytes([10, 0, 0, 7]), born_port=53001,
             store_host=bytes([127, 0, 0, 1]), store_port=50051, prepared_transaction_offset=99,
             queue_offset=QUEUE_OFFSET, physical_offset=PHYSICAL_OFFSET, store_timestamp_ms=STORE_MS)
IPV6_BORN = bytes.fromhex("20010db8000000000000000000000007")
IPV6_STORE = bytes.fromhex("20010db8000000000000000000000001")


def _stored_by_the_store(tmp_path) -> bytes:
    """The record as the append path writes it: MessageEncoder.encode_batch, then stamp (as CommitLog
    does inside its lock), from fixed inputs."""
    encoder = MessageEncoder(StoreConfig(data_dir=tmp_path, store_host="127.0.0.1", store_port=50051))
    message = MessageIn(body=b"Hello RocketMQ", tags="TagA", keys=("k1", "k2"), properties={"UNIQ_KEY": UNIQ_KEY},
                        flag=7, born_timestamp_ms=BORN_MS, queue_id=3, born_host=bytes([10, 0, 0, 7]),
                        born_port=53001, prepared_transaction_offset=99)
    batch = encoder.encode_batch(TopicRecord("TopicTest", 4, KIND_NORMAL, 0, 0), [message], now_ms=STORE_MS)
    record.stamp(batch.buf, 0, QUEUE_OFFSET, PHYSICAL_OFFSET, STORE_MS)
    assert batch.sizes == [len(batch.buf)]
    return bytes(batch.buf)


def test_record_golden(request, tmp_path):
    data = _stored_by_the_store(tmp_path)
    assert data == golden_bytes("record_v1.bin", data, request)
    assert data == records.encode(**FIXED)  # the tests' helper writes the same bytes


def test_record_ipv6_golden(request):
    # Both hosts IPv6 (SYSFLAG 0x30), through the store's encoder functions (encode_parts + stamp).
    data = records.encode(**{**FIXED, "born_host": IPV6_BORN, "store_host": IPV6_STORE})
    assert data == golden_bytes("record_v1_ipv6.bin", data, request)


def test_record_fields_by_hand(tmp_path):
    data = _stored_by_the_store(tmp_path)
    props = PROPERTIES
    assert len(data) == 91 + 14 + 9 + len(props)
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    assert data[4:8] == bytes.fromhex("DAA320A7")
    assert struct.unpack_from(">i", data, 8)[0] == zlib.crc32(b"Hello RocketMQ") & 0x7FFFFFFF
    assert struct.unpack_from(">iiqqi", data, 12) == (3, 7, 42, 1_073_741_824, 0)
    assert data[48:52] == bytes([10, 0, 0, 7]) and struct.unpack_from(">i", data, 52)[0] == 53001
    assert struct.unpack_from(">q", data, 56)[0] == 1_700_000_000_456
    assert data[64:68] == bytes([127, 0, 0, 1]) and struct.unpack_from(">i", data, 68)[0] == 50051
    assert struct.unpack_from(">iq", data, 72) == (0, 99)
    assert struct.unpack_from(">i", data, 84)[0] == 14 and data[88:102] == b"Hello RocketMQ"
    assert data[102] == 9 and data[103:112] == b"TopicTest"
    assert struct.unpack_from(">h", data, 112)[0] == len(props) and data[114:] == props
    assert props.endswith(b"\x02") and b"TAGS\x01TagA\x02" in props


def test_ipv6_record_fields_by_hand():
    data = records.encode(**{**FIXED, "born_host": IPV6_BORN, "store_host": IPV6_STORE})
    assert len(data) == 91 + 24 + 14 + 9 + len(PROPERTIES)
    assert struct.unpack_from(">i", data, 36)[0] == 0x30  # both host bits set by the encoder
    assert data[48:64] == IPV6_BORN and struct.unpack_from(">i", data, 64)[0] == 53001
    assert struct.unpack_from(">q", data, 68)[0] == 1_700_000_000_456
    assert data[76:92] == IPV6_STORE and struct.unpack_from(">i", data, 92)[0] == 50051
    assert struct.unpack_from(">iqi", data, 96) == (0, 99, 14) and data[112:126] == b"Hello RocketMQ"
    born_only = records.encode(**{**FIXED, "born_host": IPV6_BORN})
    assert struct.unpack_from(">i", born_only, 36)[0] == 0x10 and struct.unpack_from(">q", born_only, 68)[0] == STORE_MS
    store_only = records.encode(**{**FIXED, "store_host": IPV6_STORE, "sys_flag": 0x10 | 0x8})
    assert struct.unpack_from(">i", store_only, 36)[0] == 0x28  # the host bits follow the hosts, tx bits stay
    assert store_only[64:80] == IPV6_STORE and struct.unpack_from(">q", store_only, 56)[0] == STORE_MS


def test_record_decode_round_trip():
    rec = record_reader.decode(records.encode(**FIXED))
    assert (rec.topic, rec.body, rec.queue_id, rec.queue_offset, rec.physical_offset) == (
        "TopicTest", b"Hello RocketMQ", 3, 42, 1_073_741_824)
    assert rec.properties["KEYS"] == "k1 k2" and rec.prepared_transaction_offset == 99
    assert rec.born_host == bytes([10, 0, 0, 7]) and rec.store_port == 50051


def test_stamp_fills_lock_time_fields():
    for hosts in ({}, {"born_host": IPV6_BORN}, {"store_host": IPV6_STORE}):
        buf = bytearray(records.encode(**{**FIXED, **hosts, "queue_offset": 0, "physical_offset": 0,
                                          "store_timestamp_ms": 0}))
        record.stamp(buf, 0, 42, 1_073_741_824, 1_700_000_000_456)
        assert bytes(buf) == records.encode(**{**FIXED, **hosts})


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
    data = bad(records.encode(**FIXED))
    with pytest.raises(record_reader.RecordError) as info:
        record_reader.check(data, 0, len(data))
    assert info.value.reason == reason


def test_properties_and_names():
    assert record_reader.decode_properties(b"a\x01b\x02\x01x\x02c\x01\x02") == {"a": "b"}
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
    rec = records.encode(**{**FIXED, "body": b"b" * (8184 - 91 - 9 - len(FIXED["properties"]))})
    assert len(rec) == 8184
    seg[:8184] = rec
    walked = record_scan.walk(seg, 0, len(seg))
    assert (walked.stop, walked.records, walked.last_store_timestamp_ms) == (8184, 1, FIXED["store_timestamp_ms"])
    assert walked.error is not None and walked.error.reason == "magic"  # zeros: the caller decides: a clean end
    seg[8184:] = record.encode_blank(8)
    walked = record_scan.walk(seg, 0, len(seg))
    assert (walked.stop, walked.records, walked.error) == (8184, 1, None)


def test_walk_agrees_with_check_on_damage():
    recs = b"".join(records.encode(**{**FIXED, "body": bytes([i]) * (50 + i)}) for i in range(5))
    walked = record_scan.walk(recs, 0, len(recs))
    assert (walked.stop, walked.records, walked.error) == (len(recs), 5, None)
    damaged = bytearray(recs)
    second = len(records.encode(**{**FIXED, "body": bytes([0]) * 50}))
    damaged[second + 95] ^= 0xFF  # inside the second record's body
    walked = record_scan.walk(damaged, 0, len(damaged))
    assert (walked.stop, walked.records, walked.error.reason) == (second, 1, "crc")


def test_topic_event_golden_and_fields(request):
    event = topic_event.TopicEvent(topic_event.DELETED, "orders|eu", 1_073_741_824)
    data = topic_event.encode(event)
    assert data == golden_bytes("topic_event.bin", data, request)
    assert data == bytes.fromhex("4D515445" "01" "01" "0000000040000000" "0009") + b"orders|eu"
    assert topic_event.decode(data) == event
    for bad in (data[:15], data[:-1], data + b"x", b"XXXX" + data[4:], data[:4] + b"\2" + data[5:],
                data[:5] + b"\7" + data[6:]):
        with pytest.raises(ValueError):
            topic_event.decode(bad)
    for wrong in (topic_event.TopicEvent(9, "t", 0), topic_event.TopicEvent(topic_event.DELETED, "", 0),
                  topic_event.TopicEvent(topic_event.DELETED, "t", -1)):
        with pytest.raises(ValueError):
            topic_event.encode(wrong)
