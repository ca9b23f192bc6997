"""A round over one queue's compaction log: passes until the sealed segments are clean.

One pass (reference §6.4, without its cliffs):
  1. take the sealed segments (never the active one) and the dirty range: records after the cleaned
     offset and older than min_compaction_lag_ms;
  2. map key digest -> latest queue offset over a *prefix* of the dirty range, as many keys as the
     budget holds (a full map ends the prefix; it always holds one key, so a pass always advances);
  3. rewrite every sealed record with the one writer (writer.py) into ``staging/``, keeping a record
     unless a later record of its key is mapped, or it is a tombstone past seen-at + delete_retention_ms
     (a tombstone is stamped seen-at by the pass that first maps it);
  4. install the output and the new round state with mqstore.fs.install (all or nothing, crash-safe),
     the cleaned offset now being the last mapped one.
A round repeats passes while the dirty range is not empty (multi-round when the keys do not fit),
at most max_passes. The mapping step is the engine's: the local one here (a budgeted prefix), or the
Spark job's (spark/mqstore_spark: key digest -> latest offset over the whole dirty range, one pass);
both then call :func:`write_pass`, so their files are byte-identical once all passes are done.
"""

from __future__ import annotations

import bisect
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Callable, Iterator

from mqstore import failpoints
from mqstore.errors import invariant
from mqstore.format import compaction_segment as cseg
from mqstore.format.record import PROPERTY_KEYS
from mqstore.format.record_reader import body_length_and_properties, find_property

from mqstore import message_keys as ckey
from .offset_map import OffsetMap, digest
from .policy import CompactionConfig, tombstone_expired
from .qlog import Entries, QueueLog
from .qlog_files import STAGING
from .writer import RoundWriter


@dataclass
class RoundStats:
    passes: int = 0
    records_in: int = 0            # sealed records read by the last pass
    records_out: int = 0
    bytes_reclaimed: int = 0       # over all passes
    keys_mapped: int = 0           # over all passes
    records_removed: int = 0       # superseded records removed, over all passes
    tombstones_removed: int = 0
    tombstones_pending: int = 0    # kept tombstones after the last pass (within their retention)
    removed_keys: dict = field(default_factory=dict)  # key -> offset of the tombstone removed with it
    last_entries: Entries | None = None  # the index and state the last pass wrote
    last_state: dict | None = None


@dataclass(frozen=True)
class Sealed:
    """The sealed segments a pass works on: read-only, immutable while the queue's round lock is held."""

    directory: pathlib.Path
    segment_size: int
    bases: list[int]
    entries: Entries


def sealed_records(src: Sealed, lo: int, hi: int) -> Iterator[tuple]:
    """(index, raw record, key, is tombstone) of entries [lo, hi), one segment in memory at a time."""
    entries, i = src.entries, lo
    for base in src.bases:
        end = base + src.segment_size
        if i >= hi or entries.positions[i] >= end:
            continue
        data = (src.directory / cseg.log_name(base)).read_bytes()
        while i < hi and entries.positions[i] < end:
            at = entries.positions[i] - base
            raw = memoryview(data)[at:at + entries.sizes[i]]
            yield i, raw, *key_and_tombstone(raw)
            i += 1
    invariant(i >= hi, f"the segments of {src.directory} hold the entries of their index")


def dirty_range(entries: Entries, cleaned: int, now_ms: int, config: CompactionConfig) -> tuple[int, int]:
    """[lo, hi): the entries after the cleaned offset and older than min_compaction_lag_ms."""
    n = len(entries)
    lo = bisect.bisect_right(entries.offsets, cleaned, 0, n)
    return lo, max(lo, bisect.bisect_right(entries.store_ms, now_ms - config.min_compaction_lag_ms, lo, n))


def key_and_tombstone(raw) -> tuple[str | None, bool]:
    """The compaction key of one record and whether it is a tombstone."""
    body_length, props = body_length_and_properties(raw)
    return ckey.first_key(find_property(props, PROPERTY_KEYS)), ckey.is_tombstone(body_length, props)


def local_map(src: Sealed, lo: int, hi: int, budget: int) -> OffsetMap:
    """Map keys from ``lo`` while they fit the budget (a prefix of [lo, hi))."""
    omap = OffsetMap(budget)
    for i, _, key, _ in sealed_records(src, lo, hi):
        if key is None:
            continue  # a keyless record (written before keys were required) is kept as it is
        d = digest(key)
        if not omap.can_put(d):
            break
        omap.put(d, src.entries.offsets[i])
    return omap


def run_round(qlog: QueueLog, config: CompactionConfig, now_ms: int,
              progress: Callable[[RoundStats], None] = lambda stats: None) -> RoundStats:
    """Local passes until nothing in the sealed segments is left to clean (or max_passes)."""
    stats = RoundStats()
    while stats.passes < config.max_passes:
        bases, entries = qlog.sealed()
        src = Sealed(qlog.directory, qlog.segment_size, bases, entries)
        lo, hi = dirty_range(entries, qlog.cleaned_offset, now_ms, config)
        if hi <= lo and not any_expired(entries, now_ms, config):
            break
        omap = local_map(src, lo, hi, config.offset_map_memory_bytes)
        files, _ = write_pass(src, lo, hi, qlog.cleaned_offset, qlog.next_offset(), omap, now_ms, config, stats)
        failpoints.hit("compaction.round.staged")
        qlog.install(files, stats.last_entries, stats.last_state, bases, stats.removed_keys)
        shutil.rmtree(qlog.directory / STAGING, ignore_errors=True)
        progress(stats)
        if hi <= lo:
            break  # a tombstone-only pass is the last: nothing dirty is left
    return stats


def any_expired(entries: Entries, now_ms: int, config: CompactionConfig) -> bool:
    return any(tombstone_expired(entries.seen[i], now_ms, config.delete_retention_ms) for i in range(len(entries))
               if entries.seen[i])


def write_pass(src: Sealed, lo: int, hi: int, cleaned: int, next_offset: int, omap: OffsetMap, now_ms: int,
               config: CompactionConfig, stats: RoundStats, staging: pathlib.Path | None = None) -> tuple[list, dict]:
    """Rewrite every sealed record against ``omap`` into ``staging`` (the queue's staging/ by default) with the
    one writer; the staged files and their manifest. ``stats.last_entries`` / ``last_state`` are the new
    index and round state. Both engines call this."""
    if len(omap) == 0:
        omap.last_offset = max(cleaned, src.entries.offsets[hi - 1] if hi > lo else cleaned)
    invariant(hi <= lo or omap.last_offset > cleaned, "a pass with dirty records advances the cleaned offset")
    staging = staging or src.directory / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    writer = RoundWriter(staging, src.segment_size)
    _rewrite(src, omap, writer, now_ms, config, stats)
    state = {"cleaned_offset": omap.last_offset, "next_offset": next_offset}
    files, manifest = writer.finish(state)
    stats.passes += 1
    stats.keys_mapped += len(omap)
    stats.last_entries, stats.last_state = writer.entries, state
    return files, manifest


KEEP, PENDING, SUPERSEDED, EXPIRED = "keep", "pending", "superseded", "expired"


def fate(mapped: bool, superseded: bool, tombstone: bool, seen: int, now_ms: int,
         config: CompactionConfig) -> tuple[str, int]:
    """What a pass does with one sealed record, and its tombstone seen-at ms. ``mapped``: the record has a
    key and lies within the pass's map (offset <= its last offset); ``superseded``: a later record of its
    key is mapped. Both engines decide with this (the Spark job on its executors, one segment a task):
    KEEP, PENDING (a tombstone kept within its retention), SUPERSEDED or EXPIRED (both removed)."""
    if not mapped:
        return KEEP, seen  # a keyless record (written before keys were required) is kept as it is
    if superseded:
        return SUPERSEDED, seen
    if not tombstone:
        return KEEP, seen
    seen = seen or now_ms  # stamped by the pass that first maps it (the round's one clock, ms)
    return (EXPIRED if tombstone_expired(seen, now_ms, config.delete_retention_ms) else PENDING), seen


def count(stats: RoundStats, what: str, size: int, key: str | None, offset: int) -> bool:
    """Add one record's fate to ``stats``; whether the record is kept."""
    stats.records_in += 1
    if what == SUPERSEDED:
        stats.records_removed += 1
    elif what == EXPIRED:
        stats.tombstones_removed += 1
        stats.removed_keys[key] = offset
    else:
        stats.tombstones_pending += what == PENDING
        stats.records_out += 1
        return True
    stats.bytes_reclaimed += size
    return False


def _rewrite(src: Sealed, omap: OffsetMap, writer: RoundWriter, now_ms: int, config: CompactionConfig,
             stats: RoundStats) -> None:
    sealed = src.entries
    stats.records_in = stats.records_out = stats.tombstones_pending = 0
    for i, raw, key, tombstone in sealed_records(src, 0, len(sealed)):
        offset = sealed.offsets[i]
        mapped = key is not None and offset <= omap.last_offset
        latest = omap.get(digest(key)) if mapped else None
        what, seen = fate(mapped, latest is not None and offset < latest, tombstone, sealed.seen[i], now_ms, config)
        if count(stats, what, len(raw), key, offset):
            writer.add(raw, offset, sealed.tags[i], sealed.store_ms[i], seen)
