"""Golden bytes of the index formats: fixed inputs, compared byte for byte with tests/golden.

Regenerate on purpose only: MQSTORE_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/index
"""

from __future__ import annotations

import pytest

from index_testing import BASE_MS, GOLDEN_DIR, REGENERATE
from mqstore.index import checkpoint as ckpt
from mqstore.format import compact_index as CI
from mqstore.format import index_file as IF


def _check(name: str, data: bytes) -> None:
    path = GOLDEN_DIR / name
    if REGENERATE:
        path.write_bytes(data)
    assert path.exists(), f"{path} missing: run with MQSTORE_REGENERATE_GOLDEN=1 once, on purpose"
    assert data == path.read_bytes(), f"{name} differs from its golden bytes"


def _small_file(tmp_path) -> IF.IndexFile:
    """3 slots, 8 entries; keys chosen so one bucket holds three entries and one holds the
    Integer.MIN_VALUE key (hash 0)."""
    file = IF.IndexFile.create(tmp_path / "golden.idx", 3, 8)
    puts = [("T#a", 4096, 0), ("T#polygenelubricants", 4096, 0), ("T#b", 4300, 1500),
            ("T#a", 4500, 2000), ("T#c", 4700, 3999), ("polygenelubricants", 4900, 5000)]
    for key, phy, dt_ms in puts:
        file.put(key, phy, BASE_MS + dt_ms)
    return file


def test_header_golden():
    header = IF.Header(BASE_MS, BASE_MS + 5000, 4096, 4900, 2, 7)
    _check("index_file_header.bin", header.encode())
    assert IF.Header.decode(header.encode()) == header


def test_entry_golden():
    entry = IF.Entry(IF.key_hash("T#order-1"), 123_456_789_012, 42, 3)
    _check("index_file_entry.bin", entry.encode())


@pytest.mark.parametrize("layout", ["unsealed", "compact"])
def test_small_file_golden(tmp_path, layout):
    file = _small_file(tmp_path)
    try:
        if layout == "unsealed":
            file.flush()
            _check("index_file_small.bin", (tmp_path / "golden.idx").read_bytes())
        else:
            _check("compact_index_small.bin", CI.compact_bytes(file))
    finally:
        file.close()


def test_checkpoint_golden():
    cp = ckpt.IndexCheckpoint(next_physical_offset=987_654, written_at_ms=BASE_MS,
                              file_physical_offset=4096, file_index_count=7)
    _check("index_checkpoint.bin", ckpt.encode(cp))
