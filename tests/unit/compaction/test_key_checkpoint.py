"""The key table checkpoint of a compaction log (mqstore.compaction.key_checkpoint, layout
mqstore.format.key_table) on a file:// tier: its bytes pinned by a golden file; a restart with it reads no
tiered segment it covers (the tier's GETs counted) and only those after its position, and its key table is
the full rebuild's and the model's; a checkpoint with damaged bytes, cut short, or older than a round is not
used: the start reads every segment and answers as a full rebuild.
"""

from __future__ import annotations

import hashlib
import struct
from array import array

import pytest

from mqstore.compaction import reads
from mqstore.compaction.store import CompactionStore
from mqstore.errors import DataLoss
from mqstore.format import key_table
from mqstore.format.key_table import FILE_NAME, KeyTable
from mqstore.tier.objects import ObjectStore
from tests.conftest import golden_bytes
from tests.support.compaction import put
from tests.support.compaction_tier import Rig


# ---- the format ------------------------------------------------------------------------------------------------

def test_key_table_golden_and_checks(request):
    table = KeyTable(covered_end=8192, entry_count=3, entries_digest=bytes(range(32)), written_at_ms=1_700_000_000_000,
                     latest={"b": 7, "a": 2, "é": 1 << 40})
    data = key_table.encode(table)
    assert data == golden_bytes("key_table.bin", data, request)
    assert data[:24] == bytes.fromhex("4D514B54" "00000001" "0000000000002000" "0000000000000003")
    assert data[64:68] == b"\x00\x00\x00\x03" and data[68:81] == b"\x00\x00\x00\x01a" + (2).to_bytes(8, "big")
    assert len(data) == 68 + 13 + 13 + 14 + 4
    assert key_table.decode(data) == table
    for bad in (data[:-1], data[:40], data[:30] + bytes([data[30] ^ 1]) + data[31:], b"XXXX" + data[4:],
                data + b"\x00"):
        with pytest.raises(DataLoss):
            key_table.decode(bad)
    body = struct.pack(">qqiiqq", 0, 10, 10, 20, 5, 6)  # positions, then sizes, then offsets
    assert key_table.entries_digest(array("q", [0, 10, 99]), array("i", [10, 20, 1]), array("q", [5, 6, 7]), 2) == \
        hashlib.sha256(body).digest()


# ---- restarts ---------------------------------------------------------------------------------------------------

@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path, local_retention_bytes=1)  # every uploaded segment leaves the local disk
    r.open()
    yield r
    r.close()


def _model(written: dict[int, str]) -> dict[str, int]:
    """key -> the offset of its latest record among those written (no round ran: every record is there)."""
    latest = {}
    for offset in sorted(written):
        latest[written[offset]] = offset
    return latest


def _fill(rig, first: int, count: int) -> dict[int, str]:
    written = {}
    for offset in range(first, first + count):
        key = f"k{offset % 17}" if offset % 5 else f"new{offset}"
        put(rig.store, key, None if offset % 23 == 0 else f"{key}@{offset}".encode() * 8, offset, rig.clock.now_ms())
        written[offset] = key
    return written


class _Gets:
    """The tier's GETs (ObjectStore.get_range), as the segment bases they read."""

    def __init__(self, monkeypatch):
        self.bases: list[int] = []
        real = ObjectStore.get_range

        def counted(store, key, start, length):
            if "/segments/" in key:
                self.bases.append(int(key.rsplit("/", 1)[1].split(".")[0]))
            return real(store, key, start, length)
        monkeypatch.setattr(ObjectStore, "get_range", counted)


def _restart(rig) -> dict[str, int]:
    rig.close()
    rig.open()
    return dict(rig.qlog.latest)


def _full_rebuild(rig) -> dict[str, int]:
    (rig.qlog.directory / FILE_NAME).unlink(missing_ok=True)
    return _restart(rig)


def test_a_restart_reads_no_tiered_segment_the_checkpoint_covers_and_answers_as_a_full_rebuild(rig, monkeypatch):
    written = _fill(rig, 0, 300)
    rig.qlog.seal_active()
    rig.tier.run_pass(rig.store)  # uploads, deletes the local .log files, writes the checkpoint
    covered = sorted(rig.qlog.tiered)
    assert len(covered) >= 3 and (rig.qlog.directory / FILE_NAME).exists()
    written |= _fill(rig, 300, 40)  # after the checkpoint, local
    gets = _Gets(monkeypatch)
    restarted = _restart(rig)
    assert gets.bases == []  # (before: every tiered segment was read back whole)
    assert restarted == _model(written)
    answers = {k: reads.get_latest(rig.store, "kv", k).stored.raw for k in set(written.values())}
    assert _full_rebuild(rig) == restarted and set(gets.bases) == set(covered)  # the rebuild reads them all
    assert {k: reads.get_latest(rig.store, "kv", k).stored.raw for k in answers} == answers


def test_a_restart_reads_only_the_tiered_segments_after_the_checkpoints_position(rig, monkeypatch):
    written = _fill(rig, 0, 200)
    rig.qlog.seal_active()
    rig.tier.run_pass(rig.store)
    covered = set(rig.qlog.tiered)
    written |= _fill(rig, 200, 200)
    rig.qlog.seal_active()
    monkeypatch.setattr(CompactionStore, "checkpoint_keys", lambda self, slot: None)  # this pass writes none
    rig.tier.run_pass(rig.store)
    monkeypatch.undo()
    after = set(rig.qlog.tiered) - covered
    assert after and covered
    gets = _Gets(monkeypatch)
    assert _restart(rig) == _model(written)
    assert gets.bases and set(gets.bases) == after  # tiered, but past the checkpoint: read; the rest not


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "older than a round"])
def test_a_damaged_or_stale_checkpoint_falls_back_to_the_full_read(rig, monkeypatch, damage):
    _fill(rig, 0, 300)
    rig.qlog.seal_active()
    rig.tier.run_pass(rig.store)
    path = rig.qlog.directory / FILE_NAME
    data = path.read_bytes()
    if damage == "older than a round":  # the round removes the tombstoned keys (delete_retention_ms 0)
        rig.store.compact(rig.store.slot("kv", 0), seal_active=True)
        assert set(rig.qlog.latest) < set(key_table.decode(data).latest)
        assert path.read_bytes() != data  # the round wrote its own; the older one is put back
    expected = _full_rebuild(rig)
    if damage == "corrupt":
        data = data[:100] + bytes([data[100] ^ 0x40]) + data[101:]
    elif damage == "truncated":
        data = data[:len(data) // 2]
    path.write_bytes(data)
    gets = _Gets(monkeypatch)
    assert _restart(rig) == expected  # (a stale one used: the keys the round removed would be back)
    assert rig.store.slot("kv", 0).keys_from == 0  # not used: every segment read
    assert set(gets.bases) == set(rig.qlog.tiered)
    if damage != "older than a round":
        assert gets.bases
