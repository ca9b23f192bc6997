"""Index checkpoint format: round trip and every kind of damage."""

from __future__ import annotations

import pytest

from mqstore.index import checkpoint as ckpt
from mqstore.errors import DataLoss


def test_round_trip(tmp_path):
    cp = ckpt.IndexCheckpoint(123, 456, 789, 10)
    path = tmp_path / ckpt.FILE_NAME
    assert ckpt.load(path) is None
    ckpt.save(path, cp)
    assert ckpt.load(path) == cp and len(path.read_bytes()) == ckpt.SIZE == 40


@pytest.mark.parametrize("damage, expect", [
    (lambda b: b[:-1], "39 bytes"),
    (lambda b: b[:12] + bytes([b[12] ^ 1]) + b[13:], "CRC"),
])
def test_damage_detected(tmp_path, damage, expect):
    path = tmp_path / ckpt.FILE_NAME
    path.write_bytes(damage(ckpt.encode(ckpt.IndexCheckpoint(5, 6))))
    with pytest.raises(ckpt.CorruptIndexCheckpoint, match=expect) as info:
        ckpt.load(path)
    assert isinstance(info.value, DataLoss) and str(path) in str(info.value)


@pytest.mark.parametrize("magic, version, expect", [(0x1234, 1, "magic"), (ckpt.MAGIC, 9, "version")])
def test_wrong_magic_or_version(tmp_path, magic, version, expect):
    import zlib
    body = ckpt.BODY.pack(magic, version, 1, 2, 3, 4)
    path = tmp_path / ckpt.FILE_NAME
    path.write_bytes(body + ckpt.CRC.pack(zlib.crc32(body)))
    with pytest.raises(ckpt.CorruptIndexCheckpoint, match=expect):
        ckpt.load(path)
