"""Golden bytes and hand-checked fields of the compaction log formats; the one compaction key."""

from __future__ import annotations

import struct

import pytest

from mqstore import message_keys as ckey
from mqstore.config import StoreConfig
from mqstore.errors import DataLoss, InvalidArgument
from mqstore.format import compaction_segment as cseg, record, record_reader, sparse_queue, topic_incarnation
from mqstore.javahash import java_string_hash
from mqstore.log.encoder import MessageEncoder
from mqstore.model import KIND_COMPACTION, MessageIn, TopicRecord
from tests.conftest import golden_bytes
from tests.support import records

SEGMENT = 512


def _raw(key: str, body: bytes, queue_offset: int, physical_offset: int) -> bytes:
    props = record.encode_properties({"KEYS": key, "UNIQ_KEY": f"U{queue_offset}"})
    return records.encode(topic=b"prices", body=body, properties=props, queue_id=1, queue_offset=queue_offset,
                          physical_offset=physical_offset, store_timestamp_ms=1_700_000_000_000 + queue_offset)


def _segment() -> bytes:
    """Records placed as the compaction log places them: relocated, then a blank when the next does not fit."""
    out, position = bytearray(), 0
    for offset, body in enumerate((b"a" * 100, b"b" * 100, b"c" * 200)):
        raw = _raw(f"k{offset}", body, offset, 9_000_000 + offset * 1000)
        if not cseg.fits(position, len(raw), SEGMENT):
            out += cseg.blank_for(position, SEGMENT)
            break
        out += cseg.relocate(raw, position)
        position += len(raw)
    return bytes(out) + bytes(SEGMENT - len(out))


def test_segment_golden_and_fields(request):
    data = _segment()
    assert data == golden_bytes("compaction_segment.bin", data, request)
    views = list(record_reader.records(data, 0, base=0))  # PHYSICALOFFSET == position in the compaction log
    assert [v.queue_offset for v in views] == [0, 1]
    assert [v.body for v in views] == [b"a" * 100, b"b" * 100]
    end = sum(v.size for v in views)
    assert record_reader.is_blank(data, end) and struct.unpack_from(">i", data, end)[0] == SEGMENT - end
    assert cseg.log_name(1024) == "00000000000000001024.log" and cseg.parse_log_name("00000000000000001024.log") == 1024
    assert cseg.parse_log_name("00000000000000001024.cq") is None and cseg.segment_base(1500, 1024) == 1024


def test_sparse_entry_golden_and_fields(request):
    entry = sparse_queue.SparseEntry(position=4096, size=211, tag_code=java_string_hash("TagA"),
                                     store_timestamp_ms=1_700_000_000_456, queue_offset=42,
                                     tombstone_seen_ms=1_700_000_001_789)
    data = sparse_queue.encode(entry)
    assert data == golden_bytes("sparse_queue_entry.bin", data, request)
    assert len(data) == 46
    assert struct.unpack_from(">qiqqqhq", data) == (4096, 211, java_string_hash("TagA"), 1_700_000_000_456, 42, 1,
                                                     1_700_000_001_789)
    assert sparse_queue.decode(data, 0) == entry
    entries, valid = sparse_queue.decode_all(data * 2 + data[:20])  # a torn third entry
    assert entries == [entry, entry] and valid == 92
    assert sparse_queue.decode(bytes(46), 0) is None  # size 0, batch 0: the end of the valid data
    plain = sparse_queue.SparseEntry(0, 100, 0, 1_700_000_000_000, 7)
    assert sparse_queue.encode(plain)[38:] == bytes(8)  # not a tombstone: 0, not RocketMQ's -1 any more


def test_a_layout_1_entry_reads_its_seconds_as_ms():
    """Entries written before milliseconds hold -1 (compacted offset) in 38..42 and seconds in 42..46."""
    old = struct.pack(">qiqqqhiI", 4096, 211, 7, 1_700_000_000_456, 42, 1, -1, 1_700_000_001)
    assert sparse_queue.decode(old, 0).tombstone_seen_ms == 1_700_000_001_000
    never = struct.pack(">qiqqqhiI", 4096, 211, 7, 1_700_000_000_456, 42, 1, -1, 0)
    assert sparse_queue.decode(never, 0).tombstone_seen_ms == 0  # not a tombstone, or not yet seen


def test_compaction_key_is_the_first_key():
    assert ckey.first_key("a b") == "a" and ckey.first_key("") is None and ckey.first_key(None) is None
    assert ckey.message_key(("x", "y"), {}) == "x"
    assert ckey.message_key((), {"KEYS": "p q"}) == "p"
    assert ckey.key_queue("user-1", 4) == java_string_hash("user-1") % 4
    assert ckey.is_tombstone(0, b"") and not ckey.is_tombstone(1, b"KEYS\x01a\x02")
    assert ckey.is_tombstone(1, b"DELETE\x01true\x02") and not ckey.is_tombstone(1, b"DELETE\x01no\x02")


def _encode(tmp_path, *messages):
    encoder = MessageEncoder(StoreConfig(data_dir=tmp_path))
    return encoder.encode_batch(TopicRecord("c", 4, KIND_COMPACTION, 0, 0), list(messages), now_ms=1)


def test_routing_uses_the_compaction_key_and_refuses_disagreeing_overrides(tmp_path):
    queue = ckey.key_queue("user-1", 4)
    by_field = _encode(tmp_path, MessageIn(body=b"v", keys=("user-1", "other")))
    by_property = _encode(tmp_path, MessageIn(body=b"v", properties={"KEYS": "user-1 zz"}))
    agreeing = _encode(tmp_path, MessageIn(body=b"v", keys=("user-1",), queue_id=queue))
    assert by_field.queue_ids == by_property.queue_ids == agreeing.queue_ids == [queue]
    other = (queue + 1) % 4
    with pytest.raises(InvalidArgument, match="needs a key"):
        _encode(tmp_path, MessageIn(body=b"v", queue_id=1))
    with pytest.raises(InvalidArgument, match=r"messages\[1\].queue_id"):
        _encode(tmp_path, MessageIn(body=b"v", keys=("user-1",)),
                MessageIn(body=b"v", keys=("user-1",), queue_id=other))
    sharding = next(s for s in (f"s{i}" for i in range(100)) if ckey.key_queue(s, 4) != queue)
    with pytest.raises(InvalidArgument, match="sharding_key"):
        _encode(tmp_path, MessageIn(body=b"v", keys=("user-1",), sharding_key=sharding))
    same = next(s for s in (f"s{i}" for i in range(100)) if ckey.key_queue(s, 4) == queue)
    assert _encode(tmp_path, MessageIn(body=b"v", keys=("user-1",), sharding_key=same)).queue_ids == [queue]


def test_topic_incarnation_golden_and_checks(request, tmp_path):
    data = topic_incarnation.encode(1_073_741_824)
    assert data == golden_bytes("topic_incarnation.bin", data, request)
    assert data[:16] == bytes.fromhex("4D515449" "00000001" "0000000040000000") and len(data) == 20
    assert topic_incarnation.decode(data, tmp_path) == 1_073_741_824
    for bad in (data[:-1], data[:8] + b"\x01" + data[9:], b"XXXX" + data[4:]):
        with pytest.raises(DataLoss):
            topic_incarnation.decode(bad, tmp_path)
    assert topic_incarnation.load(tmp_path) == 0  # a directory of a topic older than the file
    topic_incarnation.save(tmp_path, 77)
    assert topic_incarnation.load(tmp_path) == 77
