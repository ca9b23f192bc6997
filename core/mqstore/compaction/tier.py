"""Compaction log segments in the object storage tier (issue 36): the sealed segments of every queue's
compaction log (qlog.py) are uploaded by the active compactor as immutable objects, their local ``.log`` is
deleted by local retention once the upload FINISHED, and reads and rounds of such a segment go to the tier.

**Keys.** Each attempt is a fresh id: ``compaction/<instance>/segments/<topic>/<queue id>/<base:020d>.<id>``
(put with put-if-absent, S3's ``If-None-Match: *``), so a retried or half-done upload never replaces or is
mistaken for another. A topic name with a character outside ``[A-Za-z0-9._-]`` is written ``x<hex of it>``.

**Metadata: a manifest in the tier, per instance** (mqstore.compaction.tier_manifest).
``compaction/<instance>/manifest/<seq:020d>.json``, each
change a new object holding only what changed, written with put-if-absent, then the changes listed (the conditional
write: two writers of one instance cannot both write change n, and a writer that finds a newer change than its own
stops with FailedPrecondition; a pass checks that its change is the newest before it deletes anything); every few
changes a snapshot of every entry (``<seq:020d>.snapshot.json``), the objects below the snapshot before it deleted;
a load reads the newest snapshot and the changes after it. Why the tier and not records the standby follows: every
compactor follows the commit log into compaction logs of its own (compactor_service.lease: a round is installed
on the instance's own logs only), so a segment at one base holds different bytes on the active and on a standby,
and the records a standby follows (the commit log's) say nothing of them. What an instance uploaded is its own,
kept where its disk is not needed (a restart reads it back, without any local file), and a standby that was
active before still reads its own tiered segments after a takeover; the new active uploads its own logs under
its own instance. Each entry:

  field          meaning
  -------------- ------------------------------------------------------------------------------------------
  topic, queue   the queue; ``base`` the segment's base position
  key, size      the object and its size (the segment file's)
  sha256         of the segment's bytes, computed from the local file before the put (kept for audits)
  index_sha256   of the segment's local ``.cq`` when uploaded: the segment's identity. A round rewrites
                 sealed segments in place (rounds.py), so an entry whose ``.cq`` no longer matches names a
                 replaced segment: it is dropped and its object deleted only then, after the round's install
                 (all or nothing, durable) and under the queue's round lock
  state          STARTED (written before the put: the object may or may not exist) or FINISHED (the put
                 answered and a HEAD saw its size)

**A pass** (:meth:`CompactionTier.run_pass`, the active's TierDuty; each queue under its round lock, so no
round replaces segments meanwhile):
  1. drop the entries of queues no longer held, STARTED ones (an attempt cut short: only this thread
     uploads), and those of replaced segments; save the manifest; then delete their objects;
  2. upload every local sealed segment without a matching FINISHED entry: STARTED saved (failpoint
     ``compaction.tier.started``), put (``compaction.tier.after_put``), HEAD, FINISHED saved
     (``compaction.tier.finished``); a put that failed, or succeeded but reported an error, leaves STARTED
     and the local file: step 1 of the next pass discards it and uploads again under a new key;
  3. local retention: the ``.log`` of a segment whose FINISHED entry matches is deleted (QueueLog.drop_local)
     once its newest record is older than ``local_retention_ms``, or, oldest first, while the queue's local
     sealed segments hold more than ``local_retention_bytes``; never a segment without a FINISHED upload;
  4. delete every object under ``segments/`` the manifest does not name (what a crash between the manifest
     and a delete left).
After steps 2-3 uploaded or deleted any of a queue's segments, its key table checkpoint is written
(mqstore.compaction.key_checkpoint): a start then reads no tiered segment it covers.
A crash anywhere leaves a manifest naming only FINISHED objects that exist, or STARTED ones that the next
pass removes: nothing lost, no orphan after the next pass.

**Reads** (QueueLog's ``remote``): the upload is pinned under the log's lock with the index entries read
(:meth:`CompactionTier.pin`), its object read after it (:meth:`CompactionTier.read`) through
mqstore.tier.reads.TierReader's path: aligned read-ahead blocks, a cache of at most ``tier_cache_bytes``, the
reads ObjectStore's deadline (``tier_read_timeout_ms``), Unavailable naming the tier URL, DataLoss for an
object gone or short (Unavailable, retry, when it is gone because a round replaced the segment meanwhile).

**A start with the tier down** (the manifest's list or read UNAVAILABLE within ``tier_read_timeout_ms``; a
``file://`` tier whose directory is missing is down too, never empty: mqstore.tier.local) goes
on: a sealed segment's lone ``.cq`` is taken as tiered, reads of it answer UNAVAILABLE naming the tier, the key
table is built from the local segments only (CompactionStore: a miss of GetLatest is UNAVAILABLE, not NOT_FOUND,
meanwhile), rounds of such a queue wait, no pass runs; the duty retries :meth:`CompactionTier.load` each
interval, which checks the lone ``.cq`` files against the manifest and completes the key tables.

Thread-safety: thread-safe; the manifest's own lock guards it (mqstore.compaction.tier_manifest), ``_lock`` the
queues' last errors; passes run on one thread (the duty's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import threading
import uuid
from typing import Callable

import structlog

from mqstore import failpoints
from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.errors import DataLoss, FailedPrecondition, MqStoreError, Unavailable
from mqstore.format import compaction_segment as cseg
from mqstore.tier.objects import ObjectStore, check_key
from mqstore.tier.reads import TierReader
from mqstore.tier.urls import open_store

from .qlog import QueueLog
from . import tier_status
from .tier_config import CompactionTierConfig
from .tier_manifest import FINISHED, STARTED, Manifest, TieredSegment, topic_part

log = structlog.get_logger("mqstore.compaction.tier")
PREFIX = "compaction"
READ_WORKERS = 4


class CompactionTier:
    def __init__(self, writes: ObjectStore, reads: ObjectStore, instance: str, config: CompactionTierConfig,
                 clock: Clock):
        self.writes, self.reads, self.config, self.clock = writes, reads, config, clock
        self.url = writes.url
        self.root = check_key(f"{PREFIX}/{instance}", "instance id")
        self._lock = threading.Lock()
        self.load_error, self._load_error_ms = "", 0  # why the manifest could not be read (empty once read)
        self._queue_errors: dict[tuple[str, int], tuple[str, int]] = {}  # (topic, queue) -> its last failed pass
        self.manifest = Manifest(writes, reads, self.root)
        try:
            self.manifest.load()
        except Unavailable as exc:  # the tier is down: start anyway, serve what is local (load() retries)
            self.load_error = str(exc)
            self._load_error_ms = clock.now_ms()
            log.warning("compaction.tier_manifest_unread", tier=self.url, error=str(exc),
                        why="the compactor starts and serves its local segments; tiered ones answer UNAVAILABLE "
                            "until the manifest is read")
        self._index_digests: dict[pathlib.Path, tuple[tuple, str]] = {}  # .cq path -> (stat identity, SHA-256)
        self.reader = TierReader(reads, lambda base: None, 1, read_ahead_bytes=config.tier_read_ahead_bytes,
                                 cache_bytes=config.tier_cache_bytes)
        self.uploaded_bytes = 0
        self.uploads = 0
        self.copy_errors = 0  # queues whose pass failed (each logged; the pass goes on to the others)
        self.lag_segments = 0  # local sealed segments without a FINISHED upload, at the last pass's end

    # ---- the manifest (mqstore.compaction.tier_manifest) ----------------------------------------------
    @property
    def loaded(self) -> bool:
        """Whether the manifest was read (at the start, else by a later :meth:`load`)."""
        return self.manifest.loaded

    def unloaded_error(self, what: str) -> Unavailable:
        return Unavailable(f"object storage tier {self.url} did not answer when the compactor started and its "
                           f"manifest is not read yet ({self.load_error}): {what} is only in the tier; retry")

    def load(self, store) -> bool:
        """Read the manifest the start could not read, then check every queue's tiered segments against it and
        complete their key tables from those segments (CompactionStore.complete_key_tables: retried by the next
        call when the tier fails meanwhile). True once loaded; False (logged) while the tier still fails."""
        if not self.manifest.loaded:
            try:
                self.manifest.load()
            except Unavailable as exc:
                self.load_error, self._load_error_ms = str(exc), self.clock.now_ms()
                log.warning("compaction.tier_manifest_unread", tier=self.url, error=str(exc))
                return False
            for slot in store.slots():
                missing = sorted(b for b in slot.qlog.tiered if not self.holds(slot.qlog, b))
                if missing:
                    log.error("compaction.tier_segment_missing", topic=slot.qlog.topic, queue_id=slot.qlog.queue_id,
                              bases=missing, why="a local .cq without its .log that the tier's manifest does not "
                                                 "name: reads of it answer DATA_LOSS; restore the directory from a "
                                                 "replica")
            self.load_error = ""
            log.info("compaction.tier_manifest_read", tier=self.url, segments=len(self.segments()))
        store.complete_key_tables()  # (nothing to do once done)
        return True

    def segments(self) -> dict[tuple, TieredSegment]:
        """(topic, queue id, base) -> entry, a copy."""
        return self.manifest.segments()

    def finished(self, topic: str, queue_id: int, base: int) -> TieredSegment | None:
        return self.manifest.finished(topic, queue_id, base)

    # ---- QueueLog's remote -------------------------------------------------------------------------------
    def holds(self, qlog: QueueLog, base: int) -> bool:
        if not self.manifest.loaded:  # (a start with the tier down: a sealed segment's lone .cq says it was uploaded;
            return True       # load() checks it against the manifest once read)
        entry = self.finished(qlog.topic, qlog.queue_id, base)
        return entry is not None and entry.index_sha256 == self._index_digest(qlog.directory / cseg.index_name(base))

    def pin(self, qlog: QueueLog, base: int) -> TieredSegment:
        if not self.manifest.loaded:
            raise self.unloaded_error(f"compaction segment {base} of {qlog.topic}/{qlog.queue_id}")
        entry = self.finished(qlog.topic, qlog.queue_id, base)
        if entry is None:  # (a tiered segment's entry is never dropped: only a manifest lost while the tier was down)
            raise DataLoss(f"object storage tier {self.url}: compaction segment {base} of {qlog.topic}/"
                           f"{qlog.queue_id} is not local and the tier's manifest names no FINISHED upload of it")
        return entry

    def read(self, pinned: TieredSegment, position: int, size: int) -> bytes:
        """The pinned upload's bytes; its object deleted meanwhile (a round replaced the segment and the next
        pass dropped it while this read waited) is Unavailable, retried on the new segment; else DataLoss."""
        try:
            return self.reader.read_object(pinned, position, size)
        except DataLoss:
            if self.finished(pinned.topic, pinned.queue_id, pinned.segment_base) == pinned:
                raise
            raise Unavailable(f"object storage tier {self.url}: compaction segment {pinned.segment_base} of "
                              f"{pinned.topic}/{pinned.queue_id} was replaced by a round while read; retry") from None

    def _index_digest(self, path: pathlib.Path) -> str:
        """SHA-256 of a segment's .cq, cached by the file's identity (a round's install renames a new file in)."""
        st = os.stat(path)
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._index_digests.get(path)
        if cached is not None and cached[0] == ident:
            return cached[1]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self._index_digests[path] = (ident, digest)
        return digest

    # ---- a pass (the active's duty) ----------------------------------------------------------------------
    def run_pass(self, store, stopping: Callable[[], bool] = lambda: False) -> None:
        """Steps 1-4 of the module docstring over every queue of ``store`` (a CompactionStore)."""
        if not self.load(store):  # (nothing is uploaded or deleted before the manifest was read)
            raise self.unloaded_error("no upload pass runs")
        self.manifest.check_newest()
        slots = {(s.qlog.topic, s.qlog.queue_id): s for s in store.slots()}
        self._drop([w for w, s in self.segments().items() if w[:2] not in slots])
        failed: MqStoreError | None = None
        lag = 0
        for slot in slots.values():
            if stopping():
                return
            with slot.round_lock:
                if slot.qlog.closed:
                    continue
                where = (slot.qlog.topic, slot.qlog.queue_id)
                try:
                    if self._queue(slot.qlog):
                        store.checkpoint_keys(slot)  # (mqstore.compaction.key_checkpoint: a start reads from here)
                    with self._lock:
                        self._queue_errors.pop(where, None)
                except FailedPrecondition:
                    raise  # fenced: nothing more of this pass
                except MqStoreError as exc:  # the tier failing for this queue: the others go on, then raise
                    self.copy_errors += 1
                    failed = failed or exc
                    with self._lock:
                        self._queue_errors[where] = (str(exc), self.clock.now_ms())
                    log.warning("compaction.tier_pass_failed", topic=slot.qlog.topic, queue_id=slot.qlog.queue_id,
                                error=str(exc))
                lag += sum(1 for b in slot.qlog.bases[:-1]
                           if self.finished(slot.qlog.topic, slot.qlog.queue_id, b) is None)
        self.lag_segments = lag
        self._sweep()
        if failed is not None:
            raise failed

    def _queue(self, qlog: QueueLog) -> bool:
        """Steps 1-3 for one queue; whether a segment was uploaded or left the local disk."""
        uploads, tiered = self.uploads, set(qlog.tiered)
        bases, entries = qlog.sealed()
        sealed = set(bases)
        mine = {w: s for w, s in self.segments().items() if w[:2] == (qlog.topic, qlog.queue_id)}
        self._drop([w for w, s in mine.items() if s.state == STARTED or w[2] not in sealed or
                    (w[2] not in qlog.tiered and  # (a tiered segment's entry is what its reads need)
                     s.index_sha256 != self._index_digest(qlog.directory / cseg.index_name(w[2])))])
        for base in bases:
            if base not in qlog.tiered and self.finished(qlog.topic, qlog.queue_id, base) is None:
                self._upload(qlog, base)
        self._local_retention(qlog, bases, entries)
        return self.uploads != uploads or qlog.tiered != tiered

    def _drop(self, where: list[tuple]) -> None:
        if not where:
            return
        segments = self.segments()
        gone = [segments.pop(w) for w in where]
        self.manifest.save(segments)
        for entry in gone:
            self.writes.delete(entry.key)
        log.info("compaction.tier_dropped", objects=len(gone), why="replaced by a round, an attempt cut short, or "
                 "the topic deleted")

    def _upload(self, qlog: QueueLog, base: int) -> None:
        path = qlog.directory / cseg.log_name(base)
        data_digest, size = _file_digest(path)
        key = (f"{self.root}/segments/{topic_part(qlog.topic)}/{qlog.queue_id}/{base:020d}."
               f"{uuid.uuid4().hex}")
        entry = TieredSegment(qlog.topic, qlog.queue_id, base, key, size, data_digest,
                              self._index_digest(qlog.directory / cseg.index_name(base)), STARTED)
        self.manifest.save({**self.segments(), entry.where: entry})
        failpoints.hit("compaction.tier.started")
        self.writes.put_file(key, path, size)
        failpoints.hit("compaction.tier.after_put")
        stored = self.writes.size(key)
        if stored != size:
            raise Unavailable(f"object storage tier {self.url}: {key} holds {stored} bytes after its put, the "
                              f"segment {size}; it is discarded and uploaded again")
        self.manifest.save({**self.segments(), entry.where: dataclasses.replace(entry, state=FINISHED)})
        failpoints.hit("compaction.tier.finished")
        self.uploads += 1
        self.uploaded_bytes += size
        log.info("compaction.tier_uploaded", topic=qlog.topic, queue_id=qlog.queue_id, base=base, key=key,
                 bytes=size)

    def _local_retention(self, qlog: QueueLog, bases: list[int], entries) -> None:
        ms, limit = self.config.local_retention_ms, self.config.local_retention_bytes
        if not ms and not limit:
            return
        local = [b for b in bases if b not in qlog.tiered]
        local_bytes = sum((qlog.directory / cseg.log_name(b)).stat().st_size for b in local)
        cutoff = self.clock.now_ms() - ms
        for base in local:
            if not self.holds(qlog, base):
                continue  # not uploaded (yet): never deleted
            end = entries.first_at_position(base + qlog.segment_size)
            newest = entries.store_ms[end - 1] if end > entries.first_at_position(base) else 0
            if (ms and newest <= cutoff) or (limit and local_bytes > limit):
                local_bytes -= (qlog.directory / cseg.log_name(base)).stat().st_size
                qlog.drop_local(base)
                log.info("compaction.tier_local_deleted", topic=qlog.topic, queue_id=qlog.queue_id, base=base)

    def _sweep(self) -> None:
        self.manifest.check_newest()
        named = {s.key for s in self.segments().values()}
        for info in self.writes.list(f"{self.root}/segments"):
            if info.key not in named:
                self.writes.delete(info.key)
                log.info("compaction.tier_orphan_deleted", key=info.key)

    def register_metrics(self, metrics) -> None:
        tier_status.register_metrics(self, metrics)

    def queue_error(self, topic: str, queue_id: int) -> tuple[str, int]:
        """(the queue's last failed pass, its time in ms), else why the manifest is not read yet, else ("", 0)."""
        with self._lock:
            found = self._queue_errors.get((topic, queue_id))
        return found or ((self.load_error, self._load_error_ms) if not self.manifest.loaded else ("", 0))

    def close(self) -> None:
        self.reads.close()
        self.writes.close()


def _file_digest(path: pathlib.Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def open_tier(config: CompactionTierConfig, instance: str, clock: Clock) -> CompactionTier | None:
    """The tier a deployment configured (its manifest read), or None."""
    if not config.enabled:
        return None

    def store(timeout_ms: int, workers: int) -> ObjectStore:
        return open_store(config.tier_url, timeout_ms=timeout_ms, endpoint=config.tier_endpoint,
                          region=config.tier_region, credentials=config.credentials, workers=workers)
    writes, reads = store(config.tier_call_timeout_ms, 1), store(config.tier_read_timeout_ms, READ_WORKERS)
    try:
        return CompactionTier(writes, reads, instance, config, clock)
    except BaseException:
        writes.close()
        reads.close()
        raise


class TierDuty(Duty):
    """Thread ``compactor-tier``: every ``tier_upload_interval_ms``, the manifest read if the start could not
    (CompactionTier.load), then a pass (CompactionTier.run_pass) while
    ``active()`` (a standby uploads nothing and deletes nothing: its tiered segments stay readable)."""

    def __init__(self, tier: CompactionTier, store, active: Callable[[], bool] | None = None):
        super().__init__("compactor-tier", interval_s=tier.config.tier_upload_interval_ms / 1000)
        self.tier, self.store, self.active = tier, store, active or (lambda: True)

    def step(self) -> None:
        if not self.tier.load(self.store):  # (every instance: a standby reads its own tiered segments too)
            return
        if self.active():
            self.tier.run_pass(self.store, lambda: self.stopping or not self.active())
