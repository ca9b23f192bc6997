"""The tier's uploads as the log holds them: records of ``RMQ_SYS_TIER_UPLOADS`` (mqstore.format.tier_upload),
folded into one state per segment in memory (:class:`UploadMap`), read from that topic's consume queue
(:class:`Ledger`), on every node: a replica copies the records with the log, so a new leader knows what the
old one started, finished or discarded without any file of its own.

Per segment (its base offset), in log order:

  record          the map does
  --------------- -------------------------------------------------------------------------------------------
  STARTED u       u is pending (an attempt whose object may or may not exist)
  FINISHED u      the segment is uploaded as u (its object is readable); u is no longer pending. A FINISHED
                  for a segment that has one already is kept out and counted (``conflicts``): the uploader
                  never writes one (it uploads only a segment with none, on the leader, one attempt at a time).
                  The FINISHED of the segment's kept attempt again is a *re-record* (local retention appends
                  it before it deletes the part of the log holding the last one, mqstore.tier.local_retention):
                  it moves the segment's position (:attr:`UploadMap.positions`, where its latest FINISHED
                  lies); a FINISHED whose STARTED is not in the log read (cut below by local retention) is
                  taken as the segment's upload when it has none
  DISCARDED u     u is no longer pending; its object is gone or never was
  DELETED u       the tier's retention deleted u's object: the segment is no longer uploaded (out of
                  :attr:`UploadMap.finished` and its position), listed in :attr:`UploadMap.deleted`; a later
                  FINISHED of u is skipped (the leader re-records only segments still FINISHED)
  anything else   a record that does not decode, or an end without its start: skipped and counted

A consume queue file's records (kind CONSUME_QUEUE, mqstore.format.tier_upload's version 2) fold the same way
into a map of their own per queue (:attr:`UploadMap.queues`, (topic, queue id) -> UploadMap; "segment base" is the
file's first byte in the queue), so a file's base never meets a commit log segment's.

Thread-safety: :meth:`Ledger.catch_up` and reads of the map serialise on the ledger's lock.
"""

from __future__ import annotations

import threading
import uuid
from typing import Callable

import structlog

from mqstore.format import tier_upload
from mqstore.format.tier_upload import CONSUME_QUEUE, DELETED, FINISHED, STARTED, Upload
from mqstore.model import MessageIn
from mqstore.replication.config import SYNC

log = structlog.get_logger("mqstore.tier")

READ_BATCH = 1000
READ_BYTES = 8 << 20
# (queue offset, max records) -> [(queue offset, body, physical offset of the record)]
Read = Callable[[int, int], list[tuple[int, bytes, int]]]


class UploadMap:
    """segment base -> its FINISHED upload; the pending attempts; every attempt's last state. Not thread-safe."""

    def __init__(self):
        self.finished: dict[int, Upload] = {}
        self.positions: dict[int, int] = {}  # segment base -> physical offset of its latest FINISHED record
        self.pending: dict[uuid.UUID, Upload] = {}
        self.deleted: dict[int, Upload] = {}  # segment base -> the upload whose object the tier's retention deleted
        self.states: dict[uuid.UUID, int] = {}
        self.conflicts = 0
        self.skipped = 0
        self.queues: dict[tuple[str, int], UploadMap] = {}  # a consume queue's files: (topic, queue id) -> map

    def apply(self, upload: Upload, position: int = -1) -> None:
        """``position``: the record's physical offset (-1: unknown)."""
        if upload.kind == CONSUME_QUEUE:
            queue = self.queues.get((upload.topic, upload.queue_id))
            if queue is None:
                queue = self.queues[(upload.topic, upload.queue_id)] = UploadMap()
            conflicts, skipped = queue.conflicts, queue.skipped
            queue._apply_one(upload, position)
            self.conflicts += queue.conflicts - conflicts
            self.skipped += queue.skipped - skipped
            return
        self._apply_one(upload, position)

    def _apply_one(self, upload: Upload, position: int) -> None:
        known = self.states.get(upload.upload_id)
        kept = self.finished.get(upload.segment_base)
        if upload.state == DELETED:
            if kept is not None and kept.upload_id == upload.upload_id:
                del self.finished[upload.segment_base]
                self.positions.pop(upload.segment_base, None)
            self.pending.pop(upload.upload_id, None)
            self.states[upload.upload_id] = DELETED
            self.deleted[upload.segment_base] = upload
            return
        if upload.state == FINISHED and kept is not None and kept.upload_id == upload.upload_id:
            self.positions[upload.segment_base] = position  # a re-record
            return
        if upload.state == FINISHED and known is None and kept is None:
            self.states[upload.upload_id] = FINISHED  # a re-record whose STARTED was cut below what was read
            self.finished[upload.segment_base] = upload
            self.positions[upload.segment_base] = position
            return
        if upload.state == STARTED:
            if known is None:
                self.pending[upload.upload_id] = upload
                self.states[upload.upload_id] = STARTED
            return
        if known != STARTED:
            self.skipped += 1  # an end without its start, or a second end
            return
        del self.pending[upload.upload_id]
        self.states[upload.upload_id] = upload.state
        if upload.state == FINISHED:
            if upload.segment_base in self.finished:
                self.conflicts += 1
                log.error("tier.second_finished", segment_base=upload.segment_base, upload_id=str(upload.upload_id),
                          kept=str(self.finished[upload.segment_base].upload_id))
                return
            self.finished[upload.segment_base] = upload
            self.positions[upload.segment_base] = position

    def pending_for(self, segment_base: int) -> list[Upload]:
        return [u for u in self.pending.values() if u.segment_base == segment_base]


class Ledger:
    def __init__(self, append: Callable[[bytes], None], read: Read, bounds: Callable[[], tuple[int, int]]):
        """``append(body)``: one record of the topic, acknowledged by the in-sync replicas (raises as an
        append does: NotLeader on a replica or a deposed leader); ``read``: records from a queue offset;
        ``bounds()``: the topic's consume queue (min offset, max offset)."""
        self._append = append
        self._read = read
        self._bounds = bounds
        self._lock = threading.Lock()
        self._map = UploadMap()
        self._next = 0

    @classmethod
    def of_store(cls, store) -> Ledger:
        """Through the store's public parts (as mqstore.consumer_offsets): ``append_own`` with SYNC replication
        (a record is on every in-sync replica before the upload goes on), ``pull``, the topic's queue."""
        def append(body: bytes) -> None:
            store.append_own(tier_upload.TOPIC, [MessageIn(body=body)], SYNC)

        def read(queue_offset: int, count: int) -> list[tuple[int, bytes]]:
            result = store.pull(tier_upload.TOPIC, 0, queue_offset, count, READ_BYTES)
            return [(m.record.queue_offset, m.record.body, m.record.physical_offset) for m in result.messages]

        def bounds() -> tuple[int, int]:
            cq = store.queues.get(tier_upload.TOPIC, 0)
            return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
        return cls(append, read, bounds)

    def record(self, upload: Upload) -> None:
        """Append ``upload``'s record, then read it back into the map."""
        self._append(tier_upload.encode(upload))
        self.catch_up()

    def catch_up(self) -> UploadMap:
        with self._lock:
            low, high = self._bounds()
            if high < self._next:  # the log was cut below what was read (a replica's divergent tail)
                self._map, self._next = UploadMap(), 0
            self._next = max(self._next, low)
            while self._next < high:
                records = self._read(self._next, READ_BATCH)
                if not records:
                    break
                for record in records:
                    self._apply(record[1], record[2] if len(record) > 2 else -1)
                self._next = records[-1][0] + 1
            return self._map

    def seed(self, bodies) -> None:
        """A replica that starts from the tier (mqstore.tier.replica_join), its log new: the map is its leader's
        FINISHED uploads alone, read again from the new log's first record (the tail that holds them: each then a
        re-record, which only moves the position, -1 meanwhile)."""
        with self._lock:
            self._map, self._next = UploadMap(), 0  # what was read of the old log is gone with it
            for body in bodies:
                self._apply(body, -1)

    def finished_records(self) -> list[bytes]:
        """The FINISHED uploads of segments and consume queue files, as records, as of the last catch-up."""
        with self._lock:
            uploads = list(self._map.finished.values()) + [u for m in self._map.queues.values()
                                                           for u in m.finished.values()]
        return [tier_upload.encode(u) for u in uploads]

    def _apply(self, body: bytes, position: int) -> None:
        try:
            upload = tier_upload.decode(body)
        except ValueError as exc:
            self._map.skipped += 1
            log.error("tier.record_skipped", error=str(exc))
            return
        self._map.apply(upload, position)

    def snapshot(self) -> tuple[dict[int, Upload], list[Upload]]:
        """(segment base -> FINISHED upload, pending attempts), as of the last catch-up."""
        with self._lock:
            return dict(self._map.finished), list(self._map.pending.values())

    def queue_snapshot(self) -> dict[tuple[str, int], tuple[dict[int, Upload], list[Upload]]]:
        """(topic, queue id) -> (file base -> FINISHED upload, pending attempts) of the consume queue files, as of
        the last catch-up."""
        with self._lock:
            return {queue: (dict(m.finished), list(m.pending.values())) for queue, m in self._map.queues.items()}

    def queue_file_upload(self, topic: str, queue_id: int, file_base: int) -> Upload | None:
        """A consume queue file's FINISHED upload as of the last catch-up (no catch-up: cheap for every read)."""
        with self._lock:
            queue = self._map.queues.get((topic, queue_id))
            return queue.finished.get(file_base) if queue is not None else None

    def queue_positions(self) -> dict[tuple[str, int, int], tuple[Upload, int]]:
        """(topic, queue id, file base) -> (its FINISHED upload, physical offset of its latest FINISHED record)."""
        with self._lock:
            return {(topic, queue_id, base): (m.finished[base], at)
                    for (topic, queue_id), m in self._map.queues.items() for base, at in m.positions.items()
                    if base in m.finished}

    def queue_states(self) -> dict[uuid.UUID, int]:
        """Every consume queue file attempt's last state, as of the last catch-up."""
        with self._lock:
            return {uid: state for m in self._map.queues.values() for uid, state in m.states.items()}

    def positions(self) -> dict[int, int]:
        """segment base -> physical offset of its latest FINISHED record (-1: unknown), as of the last catch-up."""
        with self._lock:
            return dict(self._map.positions)

    def finished_upload(self, segment_base: int) -> Upload | None:
        """The segment's FINISHED upload as of the last catch-up (no catch-up: cheap for every read)."""
        with self._lock:
            return self._map.finished.get(segment_base)

    def states(self) -> dict[uuid.UUID, int]:
        """Every attempt's last state, as of the last catch-up."""
        with self._lock:
            return dict(self._map.states)

    def deleted(self) -> dict[int, Upload]:
        """segment base -> the upload whose object the tier's retention deleted, as of the last catch-up."""
        with self._lock:
            return dict(self._map.deleted)

    @property
    def conflicts(self) -> int:
        with self._lock:
            return self._map.conflicts

