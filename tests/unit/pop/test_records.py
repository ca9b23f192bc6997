"""The CK and ACK bodies of rmq_sys_REVIVE_LOG (mqstore.pop.records): golden bytes, round trips, and bodies
that do not decode."""

from __future__ import annotations

import pytest

from mqstore.errors import InvariantViolation
from mqstore.pop import records
from mqstore.pop.records import AckEntry, BadRecord, Checkpoint, CkEntry
from tests.conftest import golden_bytes

# Source 1, the legacy retry topic: the golden bytes are those earlier versions wrote, still decoded alike.
CK = Checkpoint(group="g1", topic="orders", source=records.SOURCE_RETRY_LEGACY, queue_id=3, max_attempts=17,
                pop_time_ms=1_700_000_000_000, visible_at_ms=1_700_000_060_000, pop_offset_after=42,
                entries=(CkEntry(40, 4096, 1), CkEntry(41, 8192, 2)))
ACKS = [AckEntry(4096, 40, records.REASON_ACKED), AckEntry(12_288, 7, records.REASON_DEAD)]


def test_ck_golden_and_layout(request):
    body = records.encode_ck(CK)
    assert body == golden_bytes("pop_ck.bin", body, request)
    assert len(body) == records.CK_HEADER.size + len("g1") + len("orders") + 2 * records.CK_ENTRY.size == 84
    assert body[0] == records.KIND_CK and body[1] == records.SOURCE_RETRY_LEGACY == 1
    assert body[36:38] == b"g1" and body[38:44] == b"orders"
    assert records.decode_ck(body) == CK


def test_a_ck_of_the_retry_topic_says_source_2_and_no_other_source_decodes():
    ck = Checkpoint(**{**{f: getattr(CK, f) for f in CK.__slots__}, "source": records.SOURCE_RETRY})
    body = records.encode_ck(ck)
    assert body[1] == 2 and records.decode_ck(body) == ck
    with pytest.raises(BadRecord, match="source 3"):
        records.decode_ck(body[:1] + b"\x03" + body[2:])


def test_ack_golden_and_layout(request):
    body = records.encode_ack(ACKS)
    assert body == golden_bytes("pop_ack.bin", body, request)
    assert len(body) == 4 + 2 * 17 and body[:4] == b"\x02\x00\x00\x02"
    assert records.decode_ack(body) == ACKS
    assert records.kind_of(body) == records.KIND_ACK and records.kind_of(records.encode_ck(CK)) == records.KIND_CK


@pytest.mark.parametrize("body, match", [
    (b"", "kind 1"),
    (b"\x07rest", "kind 1"),
])
def test_unknown_kinds_are_refused(body, match):
    with pytest.raises(BadRecord, match=match):
        records.kind_of(body)


def test_truncated_or_padded_bodies_are_refused():
    ck, ack = records.encode_ck(CK), records.encode_ack(ACKS)
    for bad in (ck[:-1], ck + b"\x00", ck[:10]):
        with pytest.raises(BadRecord):
            records.decode_ck(bad)
    for bad in (ack[:-1], ack + b"\x00", ack[:3]):
        with pytest.raises(BadRecord):
            records.decode_ack(bad)
    with pytest.raises(BadRecord, match="reason"):
        records.decode_ack(ack[:-1] + b"\x09")
    with pytest.raises(BadRecord, match="UTF-8"):
        records.decode_ck(ck[:36] + b"\xff\xfe" + ck[38:])


def test_encoding_checks_its_own_inputs():
    with pytest.raises(InvariantViolation):
        records.encode_ck(Checkpoint("g", "t", 0, 0, 1, 0, 0, 0, ()))
    with pytest.raises(InvariantViolation):
        records.encode_ack([AckEntry(1, 1, 9)])


def test_an_ordered_ck_is_kind_3_with_the_same_layout_and_held_entries_of_attempt_0(request):
    ck = Checkpoint("g1", "orders", records.SOURCE_TOPIC, 3, 17, 1_700_000_000_000, 1_700_000_060_000, 42,
                    (CkEntry(40, 4096, 1), CkEntry(41, 8192, 0)), ordered=True)
    body = records.encode_ck(ck)
    assert body == golden_bytes("pop_ck_ordered.bin", body, request)
    assert body[0] == records.KIND_CK_ORDERED == 3 and body[1:] == records.encode_ck(
        Checkpoint(**{**{f: getattr(ck, f) for f in ck.__slots__}, "ordered": False}))[1:]
    assert records.kind_of(body) in records.CK_KINDS and records.decode_ck(body) == ck
    assert records.decode_ck(records.encode_ck(CK)).ordered is False
