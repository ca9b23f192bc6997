"""bench/index_bench.py's set-up: its index moves files to a file:// tier whose directory it creates first (a
file:// tier's missing root is refused, never made: mqstore.tier.local; the index-query group failed on it)."""

from __future__ import annotations

import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import index_bench  # noqa: E402 - bench/ is a folder of scripts, not a package


def test_the_bench_index_moves_its_files_to_its_tier(tmp_path):
    store, _seconds = index_bench._build_index(tmp_path / "idx", messages=2_000, user_keys=10, file_entries=1_000)
    try:
        assert store.convert_sealed(10**6) >= 1
        moved = store.move_to_tier(10**6)
        assert moved >= 1 and any((tmp_path / "idx" / "tier").rglob("*.cidx.*"))
    finally:
        store.close()
