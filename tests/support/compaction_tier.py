"""A compaction store with a file:// object storage tier (mqstore.compaction.tier), for tests."""

from __future__ import annotations

import pathlib

from mqstore.clock import FakeClock
from mqstore.compaction import reads
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.compaction.tier import CompactionTier, open_tier
from mqstore.compaction.tier_config import CompactionTierConfig
from mqstore.format import compaction_segment as cseg
from tests.support.compaction import BASE_MS, put

CONFIG = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=3 * 128, delete_retention_ms=0)


class Rig:
    """A compaction store on ``tmp/logs`` with a file:// tier at ``tmp/tier`` (instance "a")."""

    def __init__(self, tmp: pathlib.Path, **tier_config):
        self.tmp, self.clock = tmp, FakeClock(BASE_MS)
        self.config = CompactionTierConfig(**{"tier_url": f"file://{tmp / 'tier'}", **tier_config})
        (tmp / "tier").mkdir(parents=True, exist_ok=True)
        self.tier: CompactionTier | None = None
        self.store: CompactionStore | None = None

    def open(self) -> CompactionStore:
        self.tier = open_tier(self.config, "a", self.clock)
        self.store = CompactionStore(self.tmp / "logs", CONFIG, self.clock, remote=self.tier)
        return self.store

    def close(self) -> None:
        self.store.close()
        self.tier.close()

    @property
    def qlog(self):
        return self.store.slot("kv", 0).qlog

    def objects(self) -> dict[str, bytes]:
        root = self.tmp / "tier"
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
                if p.is_file() and "/segments/" in str(p) and not p.name.startswith(".")}  # no put's temp file


def fill(store: CompactionStore, clock, count: int = 240) -> None:
    """Several sealed segments of 12 keys written over and over (and two tombstones), the active one sealed."""
    for offset in range(count):
        key = f"k{offset % 12}"
        put(store, key, None if offset in (200, 213) else f"{key}@{offset}".encode() * 8, offset, clock.now_ms())
    store.slot("kv", 0).qlog.seal_active()


def everything(store: CompactionStore) -> list[tuple[int, bytes]]:
    qlog = store.slot("kv", 0).qlog
    pulled = reads.pull(qlog, 0, 1_000, 4 << 20)
    chunked, at = [], 0
    while (chunk := qlog.read_chunk(qlog.index_of(at), 1_000)).offsets:
        chunked += [(chunk.offsets[i], chunk.stored(i).raw) for i in range(len(chunk.offsets))]
        at = chunk.offsets[-1] + 1
    out = [(s.entry.queue_offset, s.raw) for s in qlog.read(0, 100_000)]
    assert out == [(s.entry.queue_offset, s.raw) for s in pulled.records] == chunked
    return out


def sealed_files(store: CompactionStore) -> dict[int, bytes]:
    qlog = store.slot("kv", 0).qlog
    return {b: (qlog.directory / cseg.log_name(b)).read_bytes() for b in qlog.bases[:-1]}
