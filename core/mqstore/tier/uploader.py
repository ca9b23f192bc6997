"""The duty that uploads sealed commit log segments to the object storage tier, on the leader only
(``tier-uploader``; a single node is its own leader).

A segment is sealed when the log is written, flushed and visible past its end (every byte of the file is
final, and on a leader every in-sync replica holds them). Each step, after reading the ledger
(mqstore.tier.ledger) from the log:

  1. **Resolve what an earlier attempt left** (this leader's, before a crash, or the old leader's): a pending
     attempt (STARTED, no end) whose object exists, has the recorded size and reads back with the recorded
     digest is FINISHED; otherwise its object (if any) is deleted and the attempt DISCARDED. A store that
     does not answer decides nothing: the step fails and the next retries. So a put that succeeded but
     reported an error (pulsar#17228) ends FINISHED, never deleted: only an object that does not match is.
     A segment that was FINISHED meanwhile (never, see the ledger) has its pending attempts discarded.
  2. **Upload every sealed segment that has no FINISHED attempt**, in order: STARTED (a fresh upload id,
     the key ``commitlog/<base:020d>/<upload id>`` unique per attempt, the leader's epoch, size, digest of the
     file's memory map: its CRC-64/NVME where the compiled codec computes it, ~0.1 CPU s a GB, else its SHA-256,
     ~0.6, mqstore.format.tier_upload's version 4) appended with SYNC replication; the object put if absent,
     streamed from the file
     (ObjectStore.put_file: a multipart upload above ``--tier-multipart-bytes`` on S3, which mqstore.tier.s3
     keeps create-only), paced by the upload quota (``--tier-upload-max-bytes-per-second``, mqstore.tier.quota:
     never below the lag over 60 s, which this sets before each upload); its size checked (HEAD); FINISHED
     appended. A put that answered needs no read-back:
     S3 checks every PUT's and UploadPart's body against the CRC-64/NVME its ``x-amz-checksum-crc64nvme``
     header carries (computed by obstore from the memory map the body is sent from, mqstore.tier.s3) and refuses
     one that differs, and file:// wrote and
     fsynced the bytes itself. A put that failed, or a crash after it, leaves the attempt pending: the step
     after resolves it with the full read-back of 1.
     A deposed leader cannot append (the gate refuses it), so it never finishes anything.
     Then **every sealed consume queue file** (``queue_files``, mqstore.tier.sealed.sealed_queue_files: not a
     queue's last file, every entry written and flushed) whose entries all point into commit log segments
     FINISHED in the tier (or already past the total retention, below ``logical_min()``), with no FINISHED
     upload of its own:
     the same two records (kind CONSUME_QUEUE, mqstore.format.tier_upload's version 3: the topic, queue id, the
     file's base in the queue and the topic's incarnation), the key
     ``consumequeue/<topic>/<queue id>/<base:020d>/<upload id>``, the same put, check and resolution (1
     resolves a file's pending attempt as a segment's). The queues of the topics kept local (Retention's
     LOCAL_ONLY_TOPICS: the consumer offsets, this ledger) are not uploaded.
  3. **The tier's own retention**: the object of every FINISHED segment that ends at or below the logical
     log's start (``logical_min()``: local retention's logical minimum, which the total retention
     ``--retention-ms`` moves past tiered segments; without local retention the local log's start, which the
     store's retention moves) is deleted, then DELETED is recorded. A crash between the two leaves a FINISHED
     upload whose object is gone: the next pass deletes again (absent is no error) and records DELETED. Reads
     of those offsets answer as below the log (mqstore.tier.reads: OUT_OF_RANGE), as expired local data.
  4. **Sweep orphans**: an object under ``commitlog/`` whose attempt the ledger holds as DISCARDED (a
     deposed leader's put that landed after its successor discarded it) is deleted, and so is one whose
     attempt the ledger does not hold (its STARTED was cut from the log with a diverged tail) when its
     segment is still in the local log: an attempt's records lie after its segment in the log, so for a
     segment retention deleted locally they may be gone too, and that object is kept, unless its segment is
     past the total retention (below ``logical_min()``) or its attempt is DELETED: then it goes too.

Retention: while the tier is on, the store deletes no segment at or above :meth:`Uploader.retention_floor`
(the oldest sealed segment without a FINISHED upload), so local retention never loses what was not uploaded.

Consume queue files in 3 and 4: a file's object is deleted (then DELETED recorded) once every entry of the file is
below its queue's minimum (``queue_min(topic, queue id)``, the total retention's; None: the queue is gone, a
deleted topic's), and every file's of a topic deleted since (its record's incarnation older than the topic
holding the name now: mqstore.tier.ledger), whose files never stand for the new topic's, which are uploaded at
once under its own incarnation; an object under ``consumequeue/`` whose attempt the ledger holds as DISCARDED or
DELETED is swept; one of an attempt the ledger does not hold is kept (its records may have gone with local
retention).

Crash points: ``tier.upload.started`` (STARTED appended, nothing put), ``tier.upload.after_put`` (the object
put, not yet verified nor FINISHED), the same for a consume queue file (``tier.upload.queue_file.started``,
``tier.upload.queue_file.after_put``); "raise" there stands for a put that succeeded but reported an error;
``tier.retention.after_delete`` (an expired segment's object deleted, DELETED not yet recorded).

Counters for ``mqstore tier status`` and the metrics (mqstore.tier.status), the commit log's: ``copy_bytes`` (its
segments FINISHED), ``copy_errors`` (failed steps), ``last_error`` (its message and time, kept until the next
error: the status shows the last one), ``expired`` / ``expired_bytes`` (objects deleted by the tier's retention);
a topic's consume queue files': the same in ``topics[topic]`` (:class:`TopicCounters`). A step that fails while
it handles a topic's file (its upload, resolution, expiry or sweep) counts for that topic, any other for the log.

Thread-safety: ``step`` runs on the duty's thread only; ``status()`` from any thread.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore import failpoints
from mqstore.background import Duty
from mqstore.format import cq_unit, tier_upload
from mqstore.format.tier_upload import CONSUME_QUEUE, DELETED, DISCARDED, FINISHED, STARTED, Digest, Upload
from mqstore.tier.ledger import Ledger, same_topic
from mqstore.tier.objects import ObjectStore
from mqstore.tier.quota import UploadQuota
from mqstore.tier.sealed import SealedQueueFile, SealedSegment

log = structlog.get_logger("mqstore.tier")

PREFIX = "commitlog"
QUEUE_PREFIX = "consumequeue"
READ_BACK_BYTES = 8 << 20  # the verification reads the object back in ranges of this size


def object_key(segment_base: int, upload_id: uuid.UUID) -> str:
    return f"{PREFIX}/{segment_base:020d}/{upload_id.hex}"


def queue_object_key(topic: str, queue_id: int, file_base: int, upload_id: uuid.UUID) -> str:
    return f"{QUEUE_PREFIX}/{topic}/{queue_id}/{file_base:020d}/{upload_id.hex}"


@dataclass(slots=True)
class TopicCounters:
    """What this node did with one topic's consume queue files (mutated by the duty's thread only)."""
    copy_bytes: int = 0        # bytes of its files this node FINISHED
    copy_errors: int = 0       # steps that failed on one of its files
    last_error: tuple[int, str] | None = None  # (ms since the epoch, message) of the last of them
    expired_files: int = 0     # its files' objects this node deleted by the tier's retention
    expired_bytes: int = 0


class Uploader(Duty):
    def __init__(self, tier: ObjectStore, ledger: Ledger, segments: Callable[[], list[SealedSegment]], *,
                 leader_epoch: Callable[[], int | None], ready: Callable[[], bool], log_min: Callable[[], int],
                 interval_ms: int, logical_min: Callable[[], int] | None = None,
                 queue_files: Callable[[], list[SealedQueueFile]] | None = None, segment_size: int = 0,
                 queue_min: Callable[[str, int], int | None] | None = None, quota: UploadQuota | None = None,
                 read_done: Callable[[int, int], None] | None = None):
        """``leader_epoch()``: the epoch this node leads (0 for a single node), None when it does not lead;
        ``ready()``: a new leader's log is visible as far as it copied it (the ledger is complete);
        ``log_min()``: the log's oldest physical offset kept locally; ``logical_min()``: the logical log's
        start (local retention's, mqstore.tier.local_retention; default ``log_min``): the tier's retention;
        ``queue_files()``: the sealed consume queue files (mqstore.tier.sealed.sealed_queue_files; None: none
        uploaded), whose entries' commit log segments (of ``segment_size`` bytes) must be FINISHED first;
        ``queue_min(topic, queue id)``: the queue's minimum offset (None: no such queue), the files' retention in
        the tier; ``quota``: the upload quota (mqstore.tier.quota; None: no limit), whose lag this sets before each
        upload; ``read_done(start, end)``: told the log's physical range an upload has read, once done with it (the
        segment warmer gives back the pages the reads brought into the page cache: SegmentWarmer.drop_read_back)."""
        super().__init__("tier-uploader", interval_s=interval_ms / 1000, backoff_initial_s=0.1, backoff_max_s=5.0)
        self.tier = tier
        self.ledger = ledger
        self.segments = segments
        self.leader_epoch = leader_epoch
        self.ready = ready
        self.log_min = log_min
        self.logical_min = logical_min or log_min
        self.queue_files = queue_files
        self.segment_size = segment_size
        self.queue_min = queue_min
        self.quota = quota or UploadQuota(0)
        self.read_done = read_done
        self.copy_bytes = 0  # bytes of the commit log segments this node FINISHED
        self.copy_errors = 0  # steps that failed (the tier or the log said no) outside a topic's file
        self.topics: dict[str, TopicCounters] = {}  # a topic's consume queue files' counters (TopicCounters)
        self._handling: str | None = None  # the topic whose file the step handles now (errors count for it)
        self._differs: dict[tuple[uuid.UUID, int], bool] = {}  # _other_bytes' answers
        self.last_error: tuple[int, str] | None = None  # (ms since the epoch, message) of the last failed step
        self.expired = 0  # objects deleted by the tier's retention (DELETED recorded)
        self.expired_bytes = 0
        self.uploaded = 0    # segments and consume queue files FINISHED by this node (tests, status)
        self.queue_files_uploaded = 0  # of which consume queue files
        self.queue_files_expired = 0  # consume queue files' objects deleted by the tier's retention
        self.discarded = 0   # attempts DISCARDED by this node
        self.swept = 0       # orphan objects deleted

    def step(self) -> None:
        epoch = self.leader_epoch()
        if epoch is None or not self.ready():
            return
        self._handling = None
        try:
            self._step(epoch)
        except Exception as exc:
            error = (int(time.time() * 1000), f"{type(exc).__name__}: {exc}")
            if self._handling is None:
                self.copy_errors += 1
                self.last_error = error
            else:
                counters = self.topic_counters(self._handling)
                counters.copy_errors += 1
                counters.last_error = error
            raise

    def on_stop(self) -> None:
        self.quota.stop()  # a put waiting for the quota is cut (its attempt stays pending: the next start resolves it)

    def topic_counters(self, topic: str) -> TopicCounters:
        counters = self.topics.get(topic)
        if counters is None:
            counters = self.topics[topic] = TopicCounters()
        return counters

    def _step(self, epoch: int) -> None:
        self.ledger.catch_up()
        finished, pending = self.ledger.snapshot()
        for attempt in pending:
            if self.stopping:
                return
            self._resolve(attempt, finished)
        for segment in self.segments():
            if self.stopping:
                return
            if segment.base not in self.ledger.snapshot()[0]:
                self._upload(segment, epoch)
        if self.queue_files is not None:
            self._upload_queue_files(epoch)
        self._expire()
        self._expire_queue_files()
        self._sweep()
        self._sweep_queue_files()

    def retention_floor(self) -> int:
        """The base of the oldest sealed segment without a FINISHED upload, else the end of the last sealed one
        (none: the local log's start):
        the store's retention deletes no segment from there (Retention.add_floor("tier", ...)), on every node (a replica
        keeps what its leader has not uploaded: it may lead next). Called by the maintenance duty."""
        self.ledger.catch_up()
        finished, _ = self.ledger.snapshot()
        floor = self.log_min()  # none sealed: nothing below the local log's start is held (local retention's)
        for segment in self.segments():
            if segment.base not in finished:
                return segment.base
            floor = segment.base + segment.size
        return floor

    # ---- 1. what an earlier attempt left ------------------------------------------------------------------
    def _resolve(self, attempt: Upload, finished: dict[int, Upload]) -> None:
        if attempt.segment_base not in finished and self._verified(attempt):
            self._finish(attempt, by="resolving an attempt left pending")
            return
        self.tier.delete(attempt.key)
        self.ledger.record(attempt.but(DISCARDED))
        self.discarded += 1
        log.warning("tier.upload_discarded", segment_base=attempt.segment_base, key=attempt.key,
                    why="its object is absent or does not match what was recorded")

    def _finish(self, attempt: Upload, by: str) -> None:
        self.ledger.record(attempt.but(FINISHED))
        self.uploaded += 1
        if attempt.kind == CONSUME_QUEUE:
            self.queue_files_uploaded += 1
            self.topic_counters(attempt.topic).copy_bytes += attempt.segment_size
        else:
            self.copy_bytes += attempt.segment_size
        log.info("tier.upload_finished", segment_base=attempt.segment_base, key=attempt.key, by=by)

    def _verified(self, attempt: Upload) -> bool:
        """The object exists with the recorded size and digest (SHA-256 or CRC-64/NVME: the record's kind;
        Unavailable when the store does not say)."""
        if self.tier.size(attempt.key) != attempt.segment_size:
            return False
        digest = Digest(attempt.digest_kind)
        for start in range(0, attempt.segment_size, READ_BACK_BYTES):
            digest.update(self.tier.get_range(attempt.key, start, min(READ_BACK_BYTES, attempt.segment_size - start)))
        return digest.value() == attempt.digest

    # ---- 2. upload ----------------------------------------------------------------------------------------
    def _upload(self, segment: SealedSegment, epoch: int, queue_file: SealedQueueFile | None = None) -> None:
        upload_id = uuid.uuid4()
        digest_kind, digest = segment.checksum()
        if queue_file is None:
            attempt = Upload(STARTED, upload_id, segment.base, segment.size, digest, epoch,
                             object_key(segment.base, upload_id), digest_kind=digest_kind)
        else:
            attempt = Upload(STARTED, upload_id, segment.base, segment.size, digest, epoch,
                             queue_object_key(queue_file.topic, queue_file.queue_id, segment.base, upload_id),
                             CONSUME_QUEUE, queue_file.topic, queue_file.queue_id, queue_file.incarnation, digest_kind)
        self.ledger.record(attempt)
        failpoints.hit("tier.upload.started" if queue_file is None else "tier.upload.queue_file.started")
        self.quota.lag_bytes = self._lag_bytes()
        if segment.path is not None:  # a memory map; multipart above its size (s3); paced by the quota
            self.tier.put_file(attempt.key, segment.path, segment.size, self.quota if self.quota.limited else None)
        else:
            self.quota.take(segment.size)
            self.tier.put_if_absent(attempt.key, segment.read())
        failpoints.hit("tier.upload.after_put" if queue_file is None else "tier.upload.queue_file.after_put")
        if queue_file is None and self.read_done is not None:
            self.read_done(segment.base, segment.base + segment.size)
        if self.tier.size(attempt.key) == attempt.segment_size:  # the put answered: its bytes were checked (above)
            self._finish(attempt, by="its put")
        else:
            self._resolve(attempt, {})

    def _lag_bytes(self) -> int:
        """The sealed commit log segments' bytes not FINISHED yet (the quota's floor)."""
        if not self.quota.limited:
            return 0
        finished, _ = self.ledger.snapshot()
        return sum(segment.size for segment in self.segments() if segment.base not in finished)

    def _upload_queue_files(self, epoch: int) -> None:
        self.ledger.catch_up()
        for (_topic, _queue_id, _incarnation), (finished, pending, _) in self.ledger.queue_maps().items():
            for attempt in pending:
                if self.stopping:
                    return
                self._handling = attempt.topic
                self._resolve(attempt, finished)
                self._handling = None
        self.ledger.catch_up()
        segments, _ = self.ledger.snapshot()
        floor = self.logical_min()
        queues = self.ledger.queue_snapshot()
        for sealed in self.queue_files():
            if self.stopping:
                return
            finished = queues.get((sealed.topic, sealed.queue_id), ({}, []))[0]
            if not same_topic(sealed.incarnation, self.ledger.incarnation(sealed.topic)):
                continue  # a deleted topic's file, listed before its delete
            held = finished.get(sealed.file.base)
            if (held is not None and not self._other_bytes(sealed, held)) or not self._log_uploaded(sealed, segments,
                                                                                                      floor):
                continue
            low = self.queue_min(sealed.topic, sealed.queue_id) if self.queue_min is not None else None
            if low is not None and sealed.file.base + sealed.file.size <= low * cq_unit.ENTRY_SIZE:
                continue  # every entry below the queue's minimum: past the total retention (its object expired)
            self._handling = sealed.topic
            self._upload(sealed.file, epoch, sealed)
            self._handling = None

    def _other_bytes(self, sealed: SealedQueueFile, held: Upload) -> bool:
        """An upload of an unknown incarnation (a version 2 record, which a deleted topic of the name may have
        written) holds the file's base, and the local file's bytes are not its: the file is uploaded under its own
        incarnation, which reads and local retention take over the other (mqstore.tier.ledger). Hashed once per
        upload and incarnation."""
        if held.incarnation >= 0:
            return False
        key = (held.upload_id, sealed.incarnation)
        differs = self._differs.get(key)
        if differs is None:
            differs = self._differs[key] = sealed.file.digest(held.digest_kind) != held.digest
        return differs

    def _log_uploaded(self, sealed: SealedQueueFile, segments: dict[int, Upload], floor: int) -> bool:
        """Every commit log segment the file's entries point into is FINISHED (or past the total retention)."""
        span = sealed.log_span()
        if span is None:
            return False  # the queue went meanwhile (a deleted topic)
        log_from, log_to = span
        if log_to <= log_from:
            return True
        size = self.segment_size
        first = log_from - log_from % size
        return all(base in segments or base + size <= floor for base in range(first, log_to, size))

    # ---- 3. the tier's retention ----------------------------------------------------------------------------
    def _expire(self) -> None:
        self.ledger.catch_up()
        floor = self.logical_min()
        finished, _ = self.ledger.snapshot()
        for base, upload in sorted(finished.items()):
            if base + upload.segment_size > floor or self.stopping:
                return
            self.tier.delete(upload.key)
            failpoints.hit("tier.retention.after_delete")
            self.ledger.record(upload.but(DELETED))
            self.expired += 1
            self.expired_bytes += upload.segment_size
            log.info("tier.object_expired", segment_base=base, key=upload.key, logical_min=floor,
                     why="its segment is past the total retention")

    def _expire_queue_files(self) -> None:
        if self.queue_files is None:
            return
        self.ledger.catch_up()
        for (topic, queue_id, _), (finished, _, current) in sorted(self.ledger.queue_maps().items()):
            if current and self.queue_min is None:
                continue  # no retention of the files in the tier (tests)
            low = self.queue_min(topic, queue_id) if current else None  # a deleted topic's files: every one
            for base, upload in sorted(finished.items()):
                if self.stopping or (low is not None and base + upload.segment_size > low * cq_unit.ENTRY_SIZE):
                    break
                self._handling = topic
                self.tier.delete(upload.key)
                failpoints.hit("tier.retention.after_delete")
                self.ledger.record(upload.but(DELETED))
                self._handling = None
                self.queue_files_expired += 1
                counters = self.topic_counters(topic)
                counters.expired_files += 1
                counters.expired_bytes += upload.segment_size
                log.info("tier.object_expired", topic=topic, queue_id=queue_id, file_base=base, key=upload.key,
                         queue_min=low, why="every entry of the file is below its queue's minimum"
                         if low is not None else "its queue is gone")

    def _sweep_queue_files(self) -> None:
        if self.queue_files is None:
            return
        self.ledger.catch_up()
        states = self.ledger.queue_states()
        for info in self.tier.list(QUEUE_PREFIX):
            upload_id, _ = _parsed(info.key)
            state = states.get(upload_id) if upload_id is not None else None
            if state not in (DISCARDED, DELETED):
                continue  # live, or an attempt the log does not hold (its records may have gone): kept
            self._handling = info.key.split("/")[1]  # consumequeue/<topic>/...
            self.tier.delete(info.key)
            self._handling = None
            self.swept += 1
            log.warning("tier.orphan_deleted", key=info.key, state=tier_upload.STATE_NAMES.get(state, str(state)))

    # ---- 4. orphans ---------------------------------------------------------------------------------------
    def _sweep(self) -> None:
        self.ledger.catch_up()
        states = self.ledger.states()
        log_min, floor = self.log_min(), self.logical_min()
        for info in self.tier.list(PREFIX):
            upload_id, base = _parsed(info.key)
            state = states.get(upload_id) if upload_id is not None else None
            expired = base is not None and base + info.size <= floor
            if state in (STARTED, FINISHED) or (state is None and not expired and (base is None or base < log_min)):
                continue  # an unknown attempt below the local log: its records may have gone with retention
            self.tier.delete(info.key)
            self.swept += 1
            log.warning("tier.orphan_deleted", key=info.key, state="unknown" if state is None else
                        tier_upload.STATE_NAMES.get(state, str(state)), expired=expired)


def _parsed(key: str) -> tuple[uuid.UUID | None, int | None]:
    """(upload id, segment base) of an object key of :func:`object_key`; None for a part that is not one."""
    parts = key.split("/")
    try:
        upload_id = uuid.UUID(hex=parts[-1])
    except ValueError:
        upload_id = None
    base = int(parts[-2]) if len(parts) >= 2 and parts[-2].isdigit() else None
    return upload_id, base
