"""Local retention of the commit log with the object storage tier on (``--local-retention-ms/-bytes``, issue 36):
the duty ``tier-local-retention``, on every node, deletes the oldest local segments whose upload FINISHED once
they are older than ``local_retention_ms`` or the local log is larger than ``local_retention_bytes``; their
records are then read from the tier (mqstore.tier.reads). The consume queues keep their entries: the store's
logical minimum stays the total retention's (``retention_ms``), which this duty applies to the part of the log
only in the tier too.

A local segment goes only when, oldest first and never the last one:
  - its upload is FINISHED in the ledger (a segment not uploaded, or whose upload failed, stays local: the
    uploader's floor, Retention.add_floor("tier"), holds it too), with the segment's size;
  - it is due: older (file mtime) than ``local_retention_ms``, or the local log beyond ``local_retention_bytes``;
  - it ends at or below the store's retention limit without the followers' holds (Retention.limit(holds=False):
    flushed and dispatched, the consumer offsets' floor, the timer's floor). A follower's hold (the compactor's,
    the Transaction service's, an administrator's Tail) never keeps a FINISHED segment local: its Tail reads
    below the local log from the tier (CommitLog.frame, a segment deleted while a frame is read included), so a
    follower that lags or is down for days costs tier GETs, not local disk; the holds stop the total retention
    (below), in the tier as locally;
  - it holds no record the node reads from the local log only: the latest FINISHED record of a segment still
    in the log (the ledger maps segments to objects, so it must stay readable) and the consumer offsets'
    live records. Before a pass deletes, the leader re-appends both (the FINISHED records again,
    ``offsets.rewrite_below``), and a replica waits until those copies reached it. Those topics' consume queues
    then start at the local log (Retention.correct_local_only), at every start too.

Consume queue files (issue 36's whole topic; with ``reader``, the tier's reads): each pass then deletes, on every
node, a queue's oldest local files (never its last) whose upload FINISHED with the file's bytes (its record's
digest, once per upload: a topic created again under the same name, or a queue rebuilt with blanks, may hold
another file at an uploaded base; it stays) (mqstore.tier.uploader uploads a sealed file once the segments its
entries point into did) and whose last entry's record lies below the local log's start (so every record they
point at is read from the tier anyway); their entries are then read from the tier (ConsumeQueue.remote,
TierReader.read_queue_file) and the queue's minimum stays the total retention's. Their FINISHED records are kept
readable as the segments' (re-appended below a deletion, the ledger's floor), as long as the file holds entries
at or above its queue's minimum. At a start (:meth:`open`) every queue reaches down again
through the files FINISHED right below its first local one, then the total retention raises its minimum.

Total retention of the tiered part: a segment only in the tier goes from the logical log (every consume
queue's minimum past it, Retention.before_segment_delete) once the first record after it (the next segment's
first, local or in the tier) is older than ``retention_ms``. Its object is then deleted by the tier's own retention
(the uploader on the leader, below :attr:`LocalRetention.logical_min`; mqstore.tier.uploader).

Thread-safety: ``step`` runs on the duty's thread; ``logical_min`` is a plain int, replaced whole.
"""

from __future__ import annotations

from typing import Callable

import structlog

from mqstore import failpoints
from mqstore.background import Duty
from mqstore.errors import MqStoreError
from mqstore.format import cq_unit
from mqstore.store_retention import LOCAL_ONLY_TOPICS
from mqstore.tier.ledger import Ledger
from mqstore.tier.sealed import SealedSegment

log = structlog.get_logger("mqstore.tier")


class LocalRetention(Duty):
    def __init__(self, store, ledger: Ledger, *, local_retention_ms: int, local_retention_bytes: int,
                 writable: Callable[[], bool], interval_ms: int, reader=None):
        """``writable()``: this node appends (the leader, or a single node): it re-appends what must stay local;
        ``reader``: the tier's reads (mqstore.tier.reads.TierReader): with it, consume queue files go too."""
        super().__init__("tier-local-retention", interval_s=interval_ms / 1000, backoff_initial_s=0.1,
                         backoff_max_s=5.0)
        self.store = store
        self.ledger = ledger
        self.local_retention_ms = local_retention_ms
        self.local_retention_bytes = local_retention_bytes
        self.writable = writable
        self.logical_min = store.segments.min_offset  # the log's oldest byte kept, locally or in the tier
        self.deleted = 0        # local segments deleted (tests, status)
        self.rerecorded = 0     # FINISHED records appended again
        self.reader = reader
        self.queue_files_deleted = 0  # local consume queue files deleted (tests, status)
        # (upload id, the topic's incarnation) whose local file was found identical (_same_bytes)
        self._matched: set[tuple] = set()
        self._uncorrected: set[tuple[str, int]] = set()  # queues extended down whose minimum is not corrected yet

    def open(self) -> None:
        """At start, before serving: the logical log reaches down through every segment FINISHED in the tier
        right below the local one, and every consume queue starts there."""
        self.ledger.catch_up()
        finished, _ = self.ledger.snapshot()
        size, low = self.store.segments.segment_size, self.store.segments.min_offset
        while low - size >= 0 and low - size in finished:
            low -= size
        self.logical_min = low
        self.store.retention.before_segment_delete(low)  # the local entries only: no tier read
        if self.reader is not None:
            queues = self.ledger.queue_snapshot()
            for (topic, queue_id), cq in self._tiered_queues():
                finished = queues.get((topic, queue_id), ({}, []))[0]
                size, base = cq.files.segment_size, cq.files.min_offset
                while base - size >= 0 and base - size in finished:
                    base -= size
                with self.store.dispatcher.lock:
                    cq.extend_down(base // cq_unit.ENTRY_SIZE)
                if base < cq.files.min_offset:
                    self._uncorrected.add((topic, queue_id))
            self._correct_extended()

    def _correct_extended(self) -> None:
        """The total retention's minimum of the queues extended down at the start, read in the tier: a tier that
        does not answer does not stop the start (the queue's minimum stays its lowest tiered file's meanwhile,
        and entries below the logical log answer OUT_OF_RANGE from the log); the next pass tries again."""
        for key in sorted(self._uncorrected):
            cq = self.store.queues.get(*key)
            try:
                if cq is not None:
                    with self.store.dispatcher.lock:
                        cq.correct_min_offset(self.logical_min)
            except MqStoreError as exc:
                log.warning("tier.queue_min_deferred", topic=key[0], queue_id=key[1], error=type(exc).__name__,
                            message=str(exc))
                continue
            self._uncorrected.discard(key)

    def step(self) -> None:
        self.ledger.catch_up()
        if self._uncorrected:
            self._correct_extended()
        self._expire_tiered(self.store.clock.now_ms())
        due = self._due(self.store.clock.now_ms())
        if not due:
            self._delete_queue_files()
            return
        end = due[-1][1]
        if self.writable():
            self._keep_readable(end)
        self.ledger.catch_up()
        # No follower's hold: a due segment's upload FINISHED, so a Tail below the local log reads it from the tier
        # (CommitLog.frame, also when the segment goes while a frame is read); holds stop the total retention only.
        limit = min(self.store.retention.limit(holds=False), self._ledger_floor(), self.store.flushed_offset(),
                    self.store.visible_offset())
        for start, seg_end in due:
            if seg_end > limit or self.stopping:
                break
            failpoints.hit("tier.local_retention.before_delete")
            if not self.store.segments.delete_first_at(start):
                break
            self.store.retention.correct_local_only(self.store.segments.min_offset)
            self.deleted += 1
            log.info("tier.local_segment_deleted", start=start, end=seg_end, local_min=self.store.segments.min_offset,
                     logical_min=self.logical_min)
        self._delete_queue_files()

    def _tiered_queues(self) -> list:
        """((topic, queue id), queue) of the queues whose files may be in the tier, each reading it (``remote``)."""
        found = []
        for (topic, queue_id), cq in list(self.store.queues.queues.items()):
            if topic in LOCAL_ONLY_TOPICS:
                continue
            if cq.remote is None:
                cq.remote = self._remote(topic, queue_id, cq.files.segment_size)
            found.append(((topic, queue_id), cq))
        return found

    def attach(self, cq) -> None:
        """Let ``cq`` read its files only in the tier (a queue a replica starts from the tier,
        mqstore.replication.tier_join)."""
        if cq.remote is None:
            cq.remote = self._remote(cq.topic, cq.queue_id, cq.files.segment_size)

    def _remote(self, topic: str, queue_id: int, file_size: int):
        def read(byte_at: int, size: int) -> bytes:
            return self.reader.read_queue_file(topic, queue_id, file_size, byte_at, size)
        return read

    def _delete_queue_files(self) -> None:
        """Each queue's oldest local files FINISHED in the tier whose records all lie below the local log."""
        if self.reader is None:
            return
        self.ledger.catch_up()
        local_min = self.store.segments.min_offset
        for (topic, queue_id), cq in self._tiered_queues():
            while not self.stopping:
                files = cq.files.segments
                if len(files) < 2:
                    break
                first = files[0]
                upload = self.ledger.queue_file_upload(topic, queue_id, first.start)
                if upload is None or upload.segment_size != first.size or not self._same_bytes(first, upload, topic):
                    break
                phys, size, _ = cq.entry(first.end // cq_unit.ENTRY_SIZE - 1)
                if size != cq_unit.BLANK_SIZE_FIELD and phys + size > local_min:
                    break
                failpoints.hit("tier.local_retention.before_delete")
                with self.store.dispatcher.lock:
                    if cq.files.segments[:1] != (first,):
                        break  # the total retention deleted it meanwhile
                    cq.delete_tiered_file()
                self.queue_files_deleted += 1
                log.info("tier.local_queue_file_deleted", topic=topic, queue_id=queue_id, start=first.start,
                         local_min=local_min)

    def _same_bytes(self, file, upload, topic: str) -> bool:
        """The local file is the uploaded one (its record's digest, once per upload): not a file of a topic created
        again under the same name, or of a queue rebuilt with blanks, whose base an older upload holds; that file
        stays."""
        # Once per upload and topic incarnation: a file of the topic created again under the name (at the base of
        # an upload of an unknown incarnation, a version 2 record) is hashed again, never taken as matched.
        matched = (upload.upload_id, self.store.topics.start_of(topic))
        if matched in self._matched:
            return True
        if SealedSegment(file.start, file.size, lambda: b"", file.path).digest(upload.digest_kind) != upload.digest:
            log.warning("tier.queue_file_differs", path=str(file.path), key=upload.key,
                        why="the local file is not the uploaded one: it stays local")
            return False
        self._matched.add(matched)
        return True

    def _live_queue_positions(self) -> list[tuple[int, object]]:
        """(position, upload) of the latest FINISHED records of the queue files still holding live entries."""
        found = []
        current = self.ledger.queue_snapshot()
        for (topic, queue_id, _, base), (upload, at) in self.ledger.queue_positions().items():
            cq = self.store.queues.get(topic, queue_id)
            if current.get((topic, queue_id), ({}, []))[0].get(base) is not upload:
                found.append((max(at, 0), upload))  # a deleted topic's: readable until the uploader expires it
            elif cq is not None and base + upload.segment_size > cq.min_offset * cq_unit.ENTRY_SIZE:
                found.append((max(at, 0), upload))
        return found

    def _due(self, now_ms: int) -> list[tuple[int, int]]:
        """(start, end) of the oldest local segments due for deletion whose upload FINISHED, oldest first."""
        segments = self.store.segments.segments
        size = self.store.segments.segment_size
        local_bytes = len(segments) * size
        due = []
        for seg in segments[:-1]:
            upload = self.ledger.finished_upload(seg.start)
            if upload is None or upload.segment_size != seg.size:
                break
            mtime_ms = int(seg.path.stat().st_mtime * 1000)
            old = self.local_retention_ms > 0 and mtime_ms + self.local_retention_ms <= now_ms
            big = self.local_retention_bytes > 0 and local_bytes - len(due) * size > self.local_retention_bytes
            if not (old or big):
                break
            due.append((seg.start, seg.end))
        return due

    def _ledger_floor(self) -> int:
        """The lowest latest FINISHED record of a segment still in the log: the local log keeps it."""
        positions = self.ledger.positions()
        return min([max(at, 0) for base, at in positions.items() if base >= self.logical_min]
                   + [at for at, _ in self._live_queue_positions()], default=1 << 62)

    def _keep_readable(self, end: int) -> None:
        """The leader: re-append the FINISHED records and the live consumer offsets that lie below ``end``."""
        positions = self.ledger.positions()
        finished, _ = self.ledger.snapshot()
        for base, at in sorted(positions.items()):
            if base >= self.logical_min and at < end and base in finished:
                self.ledger.record(finished[base])
                self.rerecorded += 1
        for at, upload in self._live_queue_positions():
            if at < end:
                self.ledger.record(upload)
                self.rerecorded += 1
        try:
            self.store.offsets.rewrite_below(end)
        except (MqStoreError, OSError) as exc:
            log.warning("offsets.rewrite_failed", below=end, error=type(exc).__name__, message=str(exc),
                        why="the segments holding live offsets stay local until a rewrite succeeds")

    def _expire_tiered(self, now_ms: int) -> None:
        """Total retention of the segments only in the tier, oldest first (the module docstring)."""
        size = self.store.segments.segment_size
        retention_ms = self.store.config.retention_ms
        limit = self.store.retention.limit()
        while self.logical_min < self.store.segments.min_offset and not self.stopping:
            end = self.logical_min + size
            if end > limit:
                return
            try:
                newest_ms = self.store.commitlog.store_timestamp_at(end)
            except MqStoreError as exc:  # the tier does not answer: the next pass tries again
                log.warning("tier.expiry_deferred", segment=self.logical_min, error=type(exc).__name__,
                            message=str(exc))
                return
            if newest_ms + retention_ms > now_ms:
                return
            self.store.retention.before_segment_delete(end)
            log.info("tier.segment_expired", start=self.logical_min, end=end, why="older than retention_ms")
            self.logical_min = end
