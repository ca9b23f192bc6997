"""The compaction logs of every COMPACTION topic/queue under one directory, and their rounds.

``<data_dir>/<topic>/<queue id>/`` holds one queue's log (qlog.py), and ``<data_dir>/<topic>/topic.incarnation``
which topic of the name they hold (mqstore.format.topic_incarnation; a record of a newer topic of the
name replaces an older one's logs). The follower (apply) appends the records of compaction topics;
rounds run per queue, one at a time per queue (``QueueSlot.round_lock``), from the background duty or
on demand; a failing round quarantines its queue only (policy.py).

A deleted topic's logs go whole (:meth:`CompactionStore.drop_topic`, when the follower meets the
topic's DELETED event): its queues are closed (a read of them then says NotFound, a round waits for
the running one and then finds nothing), the directory is renamed to ``<topic>.deleted`` (one atomic,
fsynced rename: the topic is gone from then on, also after a crash) and then removed. On open a
``*.deleted`` directory is what a crash left between the two and is removed (topic names hold no dot).
"""

from __future__ import annotations

import functools
import pathlib
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import structlog

from mqstore import failpoints, fs
from mqstore.clock import Clock
from mqstore.errors import NotFound, shown
from mqstore.format import topic_incarnation
from mqstore.javahash import java_string_hash
from mqstore.metrics import Registry

from . import key_checkpoint
from .policy import CompactionConfig, Quarantine, due_reason, tombstone_expired
from .qlog import QueueLog, Remote
from .rounds import RoundStats, Sealed, key_and_tombstone, run_round, sealed_records

log = structlog.get_logger("mqstore.compaction")
DELETED_SUFFIX = ".deleted"  # a dropped topic's directory between its rename and its removal


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
        self.keys_partial = False  # the key table lacks the tiered segments' keys (a start with the tier down)
        self.keys_from = 0  # the position the key table was read from at open (its checkpoint's covered end)


class CompactionStore:
    """Thread-safe: ``_lock`` guards the table of queues and the round bookkeeping; each queue its own log."""

    def __init__(self, data_dir: pathlib.Path, config: CompactionConfig, clock: Clock, remote: Remote | None = None):
        self.data_dir, self.config, self.clock = data_dir, config, clock
        self.remote = remote  # the object storage tier of sealed segments (mqstore.compaction.tier), or None
        self._lock = threading.Lock()
        self._slots: dict[tuple[str, int], QueueSlot] = {}
        self._incarnations: dict[str, int] = {}  # topic -> its start_physical_offset (topic.incarnation)
        fs.make_dirs(data_dir)  # the creation rule (mqstore.fs)
        for gone in sorted(data_dir.glob("*" + DELETED_SUFFIX)):
            _remove_tree(gone)  # renamed by a drop_topic that a crash cut short
        for topic_dir in sorted(p for p in data_dir.iterdir() if p.is_dir()):
            self._incarnations[topic_dir.name] = topic_incarnation.load(topic_dir)
            for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                self._open(topic_dir.name, int(queue_dir.name))

    def _open(self, topic: str, queue_id: int) -> QueueSlot:
        qlog = QueueLog(self.data_dir / topic / str(queue_id), self.config.segment_size_bytes, topic, queue_id,
                        self.remote)
        slot = QueueSlot(qlog, self.config)
        table = key_checkpoint.load(qlog)  # (None: every segment is read, as without one)
        if table is not None:
            qlog.latest.update(table.latest)
            slot.keys_from = table.covered_end
        unread = {b for b in qlog.tiered if b + qlog.segment_size > slot.keys_from}  # tiered, not in the checkpoint
        slot.keys_partial = bool(unread) and not self._tier_loaded()
        _fill_latest(qlog, skip=unread if slot.keys_partial else set(), first=table.entry_count if table else 0)
        self._slots[(topic, queue_id)] = slot
        return slot

    def _tier_loaded(self) -> bool:
        return self.remote is None or getattr(self.remote, "loaded", True)

    def tier_waits(self, slot: QueueSlot) -> Exception | None:
        """The error a read of the whole queue (a round) meets now: its tiered segments while the tier's manifest
        is not read yet or their keys not yet in the key table (a start with the tier down;
        mqstore.compaction.tier), else None."""
        if slot.qlog.tiered and (slot.keys_partial or not self._tier_loaded()):
            return self.remote.unloaded_error(f"{len(slot.qlog.tiered)} sealed segment(s) of "
                                              f"{shown(slot.qlog.topic)}/{slot.qlog.queue_id}")
        return None

    def complete_key_tables(self) -> None:
        """Once the tier's manifest is read: add the keys of the tiered segments a start skipped (a key's latest
        offset is the larger one; no round ran on those queues meanwhile, so nothing was removed). A queue whose
        segments the tier fails to give stays partial (Unavailable raised): the next call goes on."""
        for slot in self.slots():
            if not slot.keys_partial:
                continue
            with slot.round_lock:
                qlog, found = slot.qlog, {}
                if not qlog.closed:  # (a segment the tier lost is left out: its reads answer DATA_LOSS)
                    _fill_latest(qlog, only={b for b in qlog.tiered if self.remote.holds(qlog, b) and
                                             b + qlog.segment_size > slot.keys_from}, into=found)
                    with qlog._lock:
                        for key, offset in found.items():
                            if qlog.latest.get(key, -1) < offset:
                                qlog.latest[key] = offset
                slot.keys_partial = False

    def checkpoint_keys(self, slot: QueueSlot) -> None:
        """Write the queue's key table checkpoint (mqstore.compaction.key_checkpoint); the caller holds its round
        lock. Not while the table is partial; a failed write (a full disk) is logged and the next one retries: it
        is derived data, and a start without it reads every segment."""
        if slot.qlog.closed or slot.keys_partial:
            return
        try:
            key_checkpoint.save(slot.qlog, self.clock.now_ms())
        except OSError as exc:
            log.warning("compaction.key_checkpoint_failed", topic=slot.qlog.topic, queue_id=slot.qlog.queue_id,
                        error=str(exc), why="a start reads every segment until the next one is written")

    # ---- the queues ----------------------------------------------------------------------------------
    def slot(self, topic: str, queue_id: int, *, create: bool = False) -> QueueSlot:
        with self._lock:
            slot = self._slots.get((topic, queue_id))
            if slot is None:
                if not create:
                    raise NotFound(f"no compaction log for topic {shown(topic)} queue {queue_id}: the compactor has "
                                   f"seen no record of it (is it a COMPACTION topic? has it been written?)")
                slot = self._open(topic, queue_id)
            return slot

    def slots(self, topic: str | None = None) -> list[QueueSlot]:
        with self._lock:
            return [s for (t, _), s in sorted(self._slots.items()) if topic is None or t == topic]

    def topics(self) -> list[str]:
        with self._lock:
            return sorted({t for t, _ in self._slots})

    def incarnation(self, topic: str) -> int | None:
        """The start_physical_offset of the topic whose logs are held under this name (None: none held)."""
        with self._lock:
            return self._incarnations.get(topic)

    # ---- the follower's side (one thread) -------------------------------------------------------------
    def hold_topic(self, topic: str, incarnation: int) -> bool:
        """Make the logs under ``topic`` those of the topic of the name that starts at ``incarnation`` (the
        logs of an older one are dropped first: its delete was not met here, as on a replica whose primary
        deleted it); False when those of a newer one are held (the record is not theirs)."""
        held = self.incarnation(topic)
        if held == incarnation:
            return True
        if held is not None:
            if incarnation < held:
                return False
            log.warning("compaction.topic_replaced", topic=topic, held_start=held, start=incarnation)
            self.drop_topic(topic)
        topic_dir = self.data_dir / topic
        fs.make_dirs(topic_dir)
        topic_incarnation.save(topic_dir, incarnation)  # durable before any record of it
        with self._lock:
            self._incarnations[topic] = incarnation
        return True

    def append(self, topic: str, queue_id: int, raw: bytes, queue_offset: int, tags: str | None,
               store_timestamp_ms: int, incarnation: int = 0) -> bool:
        """Append a record of the topic of the name that starts at ``incarnation`` (:meth:`hold_topic`);
        False when it is held already (a replay) or belongs to an older topic of the name."""
        if not self.hold_topic(topic, incarnation):
            return False
        key, _ = key_and_tombstone(raw)
        tag_code = java_string_hash(tags) if tags else 0
        return self.slot(topic, queue_id, create=True).qlog.append(raw, queue_offset, tag_code, store_timestamp_ms,
                                                                    key or "")

    def sync(self) -> None:
        for slot in self.slots():
            slot.qlog.sync()

    def drop_topic(self, topic: str) -> int:
        """Remove every compaction log of ``topic`` (deleted from the commit log), crash-safely (the module
        docstring); the number of queues dropped. Idempotent: a topic it does not hold is a no-op."""
        directory = self.data_dir / topic
        with self._lock:
            slots = [self._slots.pop(key) for key in [k for k in self._slots if k[0] == topic]]
            self._incarnations.pop(topic, None)
        for slot in slots:
            with slot.round_lock:  # a running round ends first; a later one finds the queue closed
                slot.qlog.close()
        if directory.is_dir():
            failpoints.hit("compaction.topic.dropping")
            gone = directory.with_name(directory.name + DELETED_SUFFIX)
            fs.rename_durably(directory, gone)
            failpoints.hit("compaction.topic.renamed")
            _remove_tree(gone)
            log.info("compaction.topic_dropped", topic=topic, queues=len(slots))
        return len(slots)

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
            if slot.qlog.closed:
                raise NotFound(f"topic {shown(slot.qlog.topic)} queue {slot.qlog.queue_id} was deleted: its "
                               f"compaction log is gone")
            if (waits := self.tier_waits(slot)) is not None:
                raise waits  # refused before it starts: neither a failure nor a quarantine
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
            if info.stats.passes:
                self.checkpoint_keys(slot)  # (the round changed the key table's records: a start reads from here)
            with self._lock:
                info.ended_ms, slot.running = max(now, self.clock.now_ms()), False
                slot.quarantine.succeeded()
            log.info("compaction.round", topic=slot.qlog.topic, queue_id=slot.qlog.queue_id, engine=engine,
                     trigger=trigger, passes=info.stats.passes, removed=info.stats.records_removed,
                     tombstones_removed=info.stats.tombstones_removed, bytes_reclaimed=info.stats.bytes_reclaimed,
                     seconds=round(time.monotonic() - started, 3))
            return info

    def _local(self, qlog: QueueLog, now_ms: int, info: RoundInfo | None = None) -> RoundStats:
        def progress(stats: RoundStats) -> None:  # a running round's map fillings show in DescribeQueue and metrics
            if info is not None:
                with self._lock:
                    info.stats = stats
        return run_round(qlog, self.config, now_ms, progress)

    def register_metrics(self, metrics: Registry) -> None:
        """Per queue: dirty ratio, whether a round runs and its passes (map fillings) so far, the last round's
        duration; and how many queues are quarantined."""
        labels = ("topic", "queue_id")
        metrics.gauge_fn("mqstore_compactor_dirty_ratio", "dirty bytes / (clean + dirty bytes) of the sealed "
                         "segments", lambda: {_key(s): self.dirt(s).dirty_ratio for s in self.slots()}, labels)
        metrics.gauge_fn("mqstore_compactor_round_running", "1 while a round runs on the queue",
                         lambda: self._per_slot(lambda s: int(s.running)), labels)
        metrics.gauge_fn("mqstore_compactor_round_passes", "offset map fillings of the running (or last) round "
                         "(more than one when its keys did not fit the map)",
                         lambda: self._per_slot(lambda s: s.info.stats.passes), labels)
        metrics.gauge_fn("mqstore_compactor_round_records", "sealed records the last round read (in) and kept "
                         "(out)", self._round_records, (*labels, "direction"))
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
        """Why a background round is due on this queue now ("" if not, or while quarantined). Read-only:
        DescribeQueue asks it, and a read changes nothing (the sweep seals an overdue active segment)."""
        return self._due(slot)[0]

    def _due(self, slot: QueueSlot) -> tuple[str, bool]:
        """(why a round is due, whether the active segment must be sealed for it first)."""
        now = self.clock.now_ms()
        with self._lock:
            if slot.quarantine.blocks(now):
                return "", False
        d = self.dirt(slot)
        if d.oldest_active_ms is not None and now - d.oldest_active_ms >= self.config.max_compaction_lag_ms:
            return "max_compaction_lag", True  # records past the deletion deadline must become cleanable
        return due_reason(d.dirty_bytes, d.clean_bytes, d.oldest_dirty_ms, d.expired_tombstones, now,
                          self.config), False

    def run_due(self, stopping: Callable[[], bool] = lambda: False) -> int:
        """One background sweep: a round on every due queue; failures quarantine that queue only."""
        done = 0
        for slot in self.slots():
            if stopping():
                break
            reason, seal = self._due(slot)
            if not reason or slot.qlog.closed:  # (a topic deleted since the sweep began)
                continue
            if self.tier_waits(slot) is not None:
                continue  # its tiered segments wait for the tier's manifest (a start with the tier down)
            try:
                self.compact(slot, trigger=reason, seal_active=seal)
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


def _remove_tree(directory: pathlib.Path) -> None:
    shutil.rmtree(directory)
    fs.fsync_dir(directory.parent)


def _fill_latest(qlog: QueueLog, skip: set[int] = frozenset(), only: set[int] | None = None,
                 into: dict | None = None, first: int = 0) -> None:
    """key -> latest offset from the records held (on open: the log is its own key table), into ``qlog.latest``
    (or ``into``), segment by segment in order: those in ``skip`` left out, only those in ``only`` if given, and
    only the entries from index ``first`` on (those below are in a key table checkpoint)."""
    e, into = qlog.entries, qlog.latest if into is None else into
    bases = list(qlog.bases)
    src = Sealed(qlog.directory, qlog.segment_size, bases, e, qlog.segment_bytes)
    for n, base in enumerate(bases):
        if base in skip or (only is not None and base not in only):
            continue
        end = bases[n + 1] if n + 1 < len(bases) else None
        lo, hi = max(e.first_at_position(base), first), len(e) if end is None else e.first_at_position(end)
        if lo >= hi:
            continue  # (no read of a segment the checkpoint covers: no GET of a tiered one)
        for i, _, key, _ in sealed_records(src, lo, hi):
            if key is not None:
                into[key] = e.offsets[i]
