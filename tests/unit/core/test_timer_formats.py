"""Golden bytes of the timer's four formats (mqstore.format.timer_unit, timer_slot, timer_cancels,
timer_checkpoint), and what each decoder refuses."""

from __future__ import annotations

import pytest

from mqstore.errors import DataLoss
from mqstore.format import timer_cancels, timer_checkpoint, timer_slot, timer_unit
from tests.conftest import golden_bytes

UNIT = timer_unit.Unit(deliver_ms=1_700_000_001_234, slot_ms=1_700_000_001_000, timer_offset=42,
                       physical_offset=1_073_741_824, prev_position=80, kind=timer_unit.KIND_DELIVER)
SLOT = timer_slot.Slot(slot_ms=1_700_000_001_000, first_position=0, last_position=120, count=4)
CHECKPOINT = timer_checkpoint.TimerCheckpoint(enqueue_offset=43, log_end_position=160, read_ms=1_700_000_001_000,
                                              read_log_end=2_000_000, precision_ms=1000, slots=172_800,
                                              written_at_ms=1_700_000_001_500)


def test_timer_unit_golden(request):
    data = timer_unit.encode(UNIT)
    assert len(data) == timer_unit.UNIT_SIZE == 48
    assert data == golden_bytes("timer_unit.bin", data, request)
    assert data[:8] == (1_700_000_001_234).to_bytes(8, "big") and data[40:42] == b"\x00\x01"
    assert timer_unit.decode(data, 0) == UNIT


def test_timer_unit_refuses_damage():
    data = bytearray(timer_unit.encode(UNIT))
    assert timer_unit.decode(bytes(data[:47]), 0) is None  # torn
    data[9] ^= 1
    assert timer_unit.decode(bytes(data), 0) is None  # CRC
    assert timer_unit.decode(bytes(48), 0) is None  # zeros: CRC fails, kind 0


def test_timer_slot_golden(request):
    data = timer_slot.encode(SLOT)
    assert len(data) == timer_slot.SLOT_SIZE == 32
    assert data == golden_bytes("timer_slot.bin", data, request)
    assert timer_slot.decode(data, 0, SLOT.slot_ms) == SLOT
    assert timer_slot.decode(data, 0, SLOT.slot_ms + 1000 * 172_800) is None  # an earlier turn: empty
    assert timer_slot.decode(bytes(32), 0, 0) is None


def test_timer_checkpoint_golden(request):
    data = timer_checkpoint.encode(CHECKPOINT)
    assert len(data) == timer_checkpoint.SIZE == 64
    assert data == golden_bytes("timer_checkpoint.bin", data, request)
    assert timer_checkpoint.decode(data) == CHECKPOINT
    with pytest.raises(DataLoss, match="CRC"):
        timer_checkpoint.decode(data[:20] + bytes([data[20] ^ 1]) + data[21:])
    with pytest.raises(DataLoss, match="64"):
        timer_checkpoint.decode(data[:63])


def test_timer_cancels_golden(request):
    cancels = {42: 1_700_000_001_234, 7: 1_700_000_009_000}
    data = timer_cancels.encode(cancels)
    assert len(data) == 12 + 2 * 16 + 4
    assert data == golden_bytes("timer_cancels.bin", data, request)
    assert data[12:20] == (7).to_bytes(8, "big")  # sorted by origin
    assert timer_cancels.decode(data) == cancels
    assert timer_cancels.decode(timer_cancels.encode({})) == {}
    with pytest.raises(DataLoss, match="CRC"):
        timer_cancels.decode(data[:13] + bytes([data[13] ^ 1]) + data[14:])
    with pytest.raises(DataLoss, match="entries"):
        timer_cancels.decode(data[:-5] + data[-4:])
