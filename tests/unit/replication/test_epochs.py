"""The epoch file (mqstore.replication.epochs): golden bytes, round trip, damage refused, crash-safe replace."""

from __future__ import annotations

import pytest

from mqstore import failpoints
from mqstore.errors import DataLoss, InvalidArgument
from mqstore.replication import epochs
from mqstore.replication.epochs import EpochEntry, EpochHistory
from tests.conftest import golden_bytes

SAMPLE = EpochHistory((EpochEntry(1, 0), EpochEntry(2, 4096), EpochEntry(5, 1 << 33)))


def test_epoch_file_golden(request):
    data = epochs.encode(SAMPLE)
    assert len(data) == epochs.HEADER.size + 3 * epochs.ENTRY.size + epochs.CRC.size
    assert data == golden_bytes("epochs_v1.bin", data, request)
    assert epochs.decode(data) == SAMPLE


def test_empty_history_round_trips():
    assert epochs.decode(epochs.encode(EpochHistory())) == EpochHistory()


@pytest.mark.parametrize("damage", ["flip", "short", "long", "magic"])
def test_damaged_file_is_refused(damage):
    data = bytearray(epochs.encode(SAMPLE))
    if damage == "flip":
        data[12] ^= 1
    elif damage == "short":
        data = data[:-1]
    elif damage == "long":
        data += b"\0"
    else:
        data[0] ^= 0xFF
    with pytest.raises(DataLoss):
        epochs.decode(bytes(data))


def test_out_of_order_entries_are_refused():
    with pytest.raises(InvalidArgument):
        EpochHistory((EpochEntry(2, 10), EpochEntry(1, 20)))
    with pytest.raises(InvalidArgument):
        EpochHistory((EpochEntry(1, 20), EpochEntry(2, 10)))


def test_history_operations():
    h = EpochHistory().with_entry(1, 0).with_entry(3, 100).with_entry(3, 150)
    assert h.entries == (EpochEntry(1, 0), EpochEntry(3, 100))
    assert h.end_of(1, 500) == 100 and h.end_of(3, 500) == 500 and h.end_of(0, 500) == 0
    assert h.cut_at(100).entries == h.entries and h.cut_at(99).entries == (EpochEntry(1, 0),)
    assert h.below(100).entries == (EpochEntry(1, 0),) and h.below(101).entries == h.entries


def test_save_is_crash_safe(tmp_path):
    """A crash before the rename leaves the old file whole: the new history is not half written."""
    path = tmp_path / "epochs"
    epochs.save(path, SAMPLE)
    newer = SAMPLE.with_entry(6, 1 << 34)
    failpoints.arm("replication.epochs.before_rename", "raise")
    try:
        with pytest.raises(failpoints.FailpointHit):
            epochs.save(path, newer)
    finally:
        failpoints.disarm_all()
    assert epochs.load(path) == SAMPLE
    epochs.save(path, newer)
    assert epochs.load(path) == newer
    assert epochs.load(tmp_path / "missing") == EpochHistory()
