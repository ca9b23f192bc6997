"""The follower checkpoint format (mqstore.format.follower_checkpoint): layout, round trip, every damage.
The index's use of it is held to its golden bytes in tests/unit/index/test_index_golden.py."""

from __future__ import annotations

import struct
import zlib

import pytest

from mqstore.errors import DataLoss
from mqstore.format import follower_checkpoint as fcp

PAYLOAD = struct.Struct(">qqH")
FORMAT = fcp.CheckpointFormat("test checkpoint", 0x54455354, 3, PAYLOAD)


def test_layout_is_the_head_then_the_payload_then_the_crc():
    cp = fcp.FollowerCheckpoint(0x0102030405060708, 99, (-1, 7, 65535))
    data = FORMAT.encode(cp)
    assert FORMAT.size == len(data) == 24 + PAYLOAD.size + 4
    assert data[:24] == struct.pack(">IIqq", 0x54455354, 3, 0x0102030405060708, 99)
    assert data[24:-4] == PAYLOAD.pack(-1, 7, 65535)
    assert data[-4:] == struct.pack(">I", zlib.crc32(data[:-4]))
    assert FORMAT.decode(data, "x") == cp


def test_save_and_load(tmp_path):
    path = tmp_path / "follower.checkpoint"
    assert FORMAT.load(path) is None  # nothing applied yet: resume from the earliest record
    hits = []
    FORMAT.save(path, fcp.FollowerCheckpoint(0, 1, (2, 3, 4)), before_rename=lambda: hits.append(path.exists()))
    assert hits == [False] and FORMAT.load(path) == fcp.FollowerCheckpoint(0, 1, (2, 3, 4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["follower.checkpoint"]  # no temp file left


def _resealed(data: bytes, position: int, value: bytes) -> bytes:
    body = data[:position] + value + data[position + len(value):-4]
    return body + struct.pack(">I", zlib.crc32(body))


@pytest.mark.parametrize("damage, expect", [
    (lambda d: d[:-1], "45 bytes, expected 46"),
    (lambda d: d + b"\0", "47 bytes, expected 46"),
    (lambda d: d[:9] + bytes([d[9] ^ 1]) + d[10:], "CRC mismatch"),
    (lambda d: _resealed(d, 0, b"XXXX"), "magic 0x58585858, expected 0x54455354"),
    (lambda d: _resealed(d, 4, struct.pack(">I", 4)), "version 4, this build reads 3"),
    (lambda d: _resealed(d, 8, struct.pack(">q", -5)), "negative physical offset -5"),
])
def test_every_damage_is_refused_naming_the_file(tmp_path, damage, expect):
    path = tmp_path / "follower.checkpoint"
    path.write_bytes(damage(FORMAT.encode(fcp.FollowerCheckpoint(5, 6, (1, 2, 3)))))
    with pytest.raises(fcp.CorruptCheckpoint, match=expect) as info:
        FORMAT.load(path)
    assert isinstance(info.value, DataLoss) and str(path) in str(info.value)
    assert info.value.path == str(path) and "test checkpoint" in str(info.value)
