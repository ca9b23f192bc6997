"""The compaction logs of every COMPACTION topic/queue under one directory, and their rounds.

``<data_dir>/<topic>/<queue id>/`` holds one queue's log (qlog.py). The follower (apply) appends the
records of compaction topics; rounds run per queue, one at a time per queue (``QueueSlot.round_lock``),
from the background duty or on demand; a failing round quarantines its queue only (policy.py).
"""

from __future__ import annotations

import functools
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import structlog

from mqstore import fs
from mqstore.clock import Clock
from mqstore.errors import NotFound
from mqstore.javahash import java_string_hash
from mqstore.metrics import Registry

from .policy import CompactionConfig, Quarantine, due_reason, tombstone_expired
from .qlog import QueueLog
from .rounds import RoundStats, Sealed, key_and_tombstone, run_round, sealed_records

log = structlog.get_logger("mqstore.compaction")


@dataclass
class RoundInfo:
    """The last (or the running) round of a queue, for DescribeQueue."""

    started_ms: int = 0
    ended_ms: int = 0          # 0 while running
    engine: str = ""
    trigger: str = ""
    result: str = ""           # "ok", "nothing to do", or the error
    stats: RoundStats = field(default_factory=RoundStats)


class QueueSlot:
    """A queue's log with its round bookkeeping. ``round_lock`` serialises its rounds; ``info`` and
    ``quarantine`` are guarded by the store's lock."""

    def __init__(self, qlog: QueueLog, config: CompactionConfig):
        self.qlog = qlog
        self.round_lock = threading.Lock()
        self.quarantine = Quarantine(config)
        self.info = RoundInfo()
        self.running = False


class CompactionStore:
    """Thread-safe: ``_lock`` guards the table of queues and the round bookkeeping; each queue its own log."""

    def __init__(self, data_dir: pathlib.Path, config: CompactionConfig, clock: Clock):
        self.data_dir, self.config, self.clock = data_dir, config, clock
        self._lock = threading.Lock()
        self._slots: dict[tuple[str, int], QueueSlot] = {}
        fs.make_dirs(data_dir)  # the creation rule (mqstore.fs)
        for topic_dir in sorted(p for p in data_dir.iterdir() if p.is_dir()):
            for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                self._open(topic_dir.name, int(queue_dir.name))

    def _open(self, topic: str, queue_id: int) -> QueueSlot:
        qlog = QueueLog(self.data_dir / topic / str(queue_id), self.config.segment_size_bytes, topic, queue_id)
        _fill_latest(qlog)
        slot = self._slots[(topic, queue_id)] = QueueSlot(qlog, self.config)
        return slot

    # ---- the queues ----------------------------------------------------------------------------------
    def slot(self, topic: str, queue_id: int, *, create: bool = False) -> QueueSlot:
        with self._lock:
            slot = self._slots.get((topic, queue_id))
            if slot is None:
                if not create:
                    raise NotFound(f"no compaction log for topic {topic!r} queue {queue_id}: the compactor has "
                                   f"seen no record of it (is it a COMPACTION topic? has it been written?)")
                slot = self._open(topic, queue_id)
            return slot

    def slots(self, topic: str | None = None) -> list[QueueSlot]:
        with self._lock:
            return [s for (t, _), s in sorted(self._slots.items()) if topic is None or t == topic]

    def topics(self) -> list[str]:
        with self._lock:
            return sorted({t for t, _ in self._slots})

    # ---- the follower's side -------------------------------------------------------------------------
    def append(self, topic: str, queue_id: int, raw: bytes, queue_offset: int, tags: str | None,
               store_timestamp_ms: int) -> bool:
        key, _ = key_and_tombstone(raw)
        tag_code = java_string_hash(tags) if tags else 0
        return self.slot(topic, queue_id, create=True).qlog.append(raw, queue_offset, tag_code, store_timestamp_ms,
                                                                    key or "")

    def sync(self) -> None:
        for slot in self.slots():
            slot.qlog.sync()

    def close(self) -> None:
        for slot in self.slots():
            with slot.round_lock:
                slot.qlog.close()

    # ---- rounds --------------------------------------------------------------------------------------
    def compact(self, slot: QueueSlot, *, engine: str = "local", trigger: str = "on demand",
                seal_active: bool = False, runner: Callable[[QueueLog, int], RoundStats] | None = None) -> RoundInfo:
        """Run a round on one queue now (waits for a running one); raises what the round raised.
        ``runner(qlog, now_ms)`` is the engine (the local passes by default; the Spark job's)."""
        with slot.round_lock:
            now = self.clock.now_ms()
            info = RoundInfo(started_ms=now, engine=engine, trigger=trigger)
            with self._lock:
                slot.info, slot.running = info, True
            started = time.monotonic()
            try:
                if seal_active:
                    slot.qlog.seal_active()
                info.stats = (runner or functools.partial(self._local, info=info))(slot.qlog, now)
            except Exception as exc:
                self._round_failed(slot, info, exc)
                raise
            info.result = "ok" if info.stats.passes else "nothing to do"
            with self._lock:
                info.ended_ms, slot.running = max(now, self.clock.now_ms()), False
                slot.quarantine.succeeded()
            log.info("compaction.round", topic=slot.qlog.topic, queue_id=slot.qlog.queue_id, engine=engine,
                     trigger=trigger, passes=info.stats.passes, removed=info.stats.records_removed,
                     tombstones_removed=info.stats.tombstones_removed, bytes_reclaimed=info.stats.bytes_reclaimed,
                     seconds=round(time.monotonic() - started, 3))
            return info

    def _local(self, qlog: QueueLog, now_ms: int, info: RoundInfo | None = None) -> RoundStats:
        def progress(stats: RoundStats) -> None:  # a running round's passes show in DescribeQueue and metrics
            if info is not None:
                with self._lock:
                    info.stats = stats
        return run_round(qlog, self.config, now_ms, progress)

    def register_metrics(self, metrics: Registry) -> None:
        """Per queue: dirty ratio, whether a round runs and its passes so far (of at most max_passes), the
        last round's duration; and how many queues are quarantined."""
        labels = ("topic", "queue_id")
        metrics.gauge_fn("mqstore_compactor_dirty_ratio", "dirty bytes / (clean + dirty bytes) of the sealed "
                         "segments", lambda: {_key(s): self.dirt(s).dirty_ratio for s in self.slots()}, labels)
        metrics.gauge_fn("mqstore_compactor_round_running", "1 while a round runs on the queue",
                         lambda: self._per_slot(lambda s: int(s.running)), labels)
        metrics.gauge_fn("mqstore_compactor_round_passes", "passes done by the running (or last) round, of at most "
                         "max_passes", lambda: self._per_slot(lambda s: s.info.stats.passes), labels)
        metrics.gauge_fn("mqstore_compactor_round_records", "records the running (or last) round's latest pass read "
                         "(in) and wrote (out)", self._round_records, (*labels, "direction"))
        metrics.gauge_fn("mqstore_compactor_round_max_passes", "the most passes a round makes",
                         lambda: self.config.max_passes)
        metrics.gauge_fn("mqstore_compactor_last_round_seconds", "duration of the queue's last finished round",
                         lambda: self._per_slot(_round_seconds), labels)
        metrics.gauge_fn("mqstore_compactor_quarantined_queues", "queues whose rounds are held back after a "
                         "failure", lambda: sum(self._per_slot(lambda s: int(s.quarantine.failures > 0)).values()))

    def _round_records(self) -> dict[tuple[str, int, str], int]:
        out = {}
        for (topic, queue_id), stats in self._per_slot(lambda s: s.info.stats).items():
            out[(topic, queue_id, "in")], out[(topic, queue_id, "out")] = stats.records_in, stats.records_out
        return out

    def _per_slot(self, read: Callable[[QueueSlot], float]) -> dict[tuple[str, int], float]:
        slots = self.slots()
        with self._lock:
            return {_key(s): read(s) for s in slots}

    def _round_failed(self, slot: QueueSlot, info: RoundInfo, exc: Exception) -> None:
        with self._lock:
            now = self.clock.now_ms()
            info.result, info.ended_ms, slot.running = f"{type(exc).__name__}: {exc}", max(now, info.started_ms), False
            slot.quarantine.failed(now, info.result)
            until = slot.quarantine.until_ms
        log.error("compaction.round_failed", topic=slot.qlog.topic, queue_id=slot.qlog.queue_id, error=info.result,
                  quarantined_until_ms=until, why="the queue is quarantined with backoff; the others go on")

    def due(self, slot: QueueSlot) -> str:
        """Why a background round is due on this queue now ("" if not, or while quarantined)."""
        now = self.clock.now_ms()
        with self._lock:
            if slot.quarantine.blocks(now):
                return ""
        d = self.dirt(slot)
        if d.oldest_active_ms is not None and now - d.oldest_active_ms >= self.config.max_compaction_lag_ms:
            slot.qlog.seal_active()  # records past the deletion deadline must become cleanable
            d = self.dirt(slot)
        return due_reason(d.dirty_bytes, d.clean_bytes, d.oldest_dirty_ms, d.expired_tombstones, now, self.config)

    def run_due(self, stopping: Callable[[], bool] = lambda: False) -> int:
        """One background sweep: a round on every due queue; failures quarantine that queue only."""
        done = 0
        for slot in self.slots():
            if stopping():
                break
            reason = self.due(slot)
            if not reason:
                continue
            try:
                self.compact(slot, trigger=reason)
                done += 1
            except Exception as exc:  # noqa: BLE001 - whatever failed (a damaged file, a bug) is this queue's:
                # compact() quarantined it with backoff and logged it; the others go on (Kafka's KIP-346)
                log.warning("compaction.queue_quarantined", topic=slot.qlog.topic, error=str(exc))
        return done

    def dirt(self, slot: QueueSlot) -> "Dirt":
        return measure(slot.qlog, self.clock.now_ms(), self.config)


def _key(slot: QueueSlot) -> tuple[str, int]:
    return (slot.qlog.topic, slot.qlog.queue_id)


def _round_seconds(slot: QueueSlot) -> float:
    info = slot.info
    return (info.ended_ms - info.started_ms) / 1000 if info.ended_ms else 0.0


@dataclass(frozen=True)
class Dirt:
    clean_bytes: int
    dirty_bytes: int            # sealed, after the cleaned offset, older than min_compaction_lag_ms: cleanable
    young_bytes: int            # sealed, after the cleaned offset, younger than that: not cleanable yet
    active_bytes: int
    oldest_dirty_ms: int | None
    oldest_active_ms: int | None
    tombstones_kept: int
    expired_tombstones: int
    dirty_records: int = 0

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def measure(qlog: QueueLog, now_ms: int, config: CompactionConfig) -> Dirt:
    """Clean/dirty bytes of the sealed segments (dirty: after the cleaned offset), the active bytes."""
    cutoff = now_ms - config.min_compaction_lag_ms
    with qlog._lock:  # a consistent snapshot of the columns (read-only)
        e, cleaned, active = qlog.entries, qlog.cleaned_offset, qlog.active_base
        clean = dirty = young = act = kept = expired = dirty_records = 0
        oldest_dirty = oldest_active = None
        for i in range(len(e)):
            if e.positions[i] >= active:
                act += e.sizes[i]
                oldest_active = e.store_ms[i] if oldest_active is None else oldest_active
            elif e.offsets[i] <= cleaned:
                clean += e.sizes[i]
            elif e.store_ms[i] > cutoff:
                young += e.sizes[i]
            else:
                dirty += e.sizes[i]
                dirty_records += 1
                oldest_dirty = e.store_ms[i] if oldest_dirty is None else oldest_dirty
            if e.seen[i]:
                kept += 1
                expired += tombstone_expired(e.seen[i], now_ms, config.delete_retention_ms)
    return Dirt(clean, dirty, young, act, oldest_dirty, oldest_active, kept, expired, dirty_records)


def _fill_latest(qlog: QueueLog) -> None:
    """key -> latest offset from the records held (on open: the log is its own key table)."""
    e = qlog.entries
    for i, _, key, _ in sealed_records(Sealed(qlog.directory, qlog.segment_size, qlog.bases, e), 0, len(e)):
        if key is not None:
            qlog.latest[key] = e.offsets[i]
