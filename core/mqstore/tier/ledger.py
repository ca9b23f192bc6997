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

A consume queue file's records (kind CONSUME_QUEUE, mqstore.format.tier_upload's version 2 and 3) fold the same
way into a map of their own per queue and topic incarnation (:attr:`UploadMap.queues`, (topic, queue id,
incarnation) -> UploadMap; "segment base" is the file's first byte in the queue), so a file's base never meets a
commit log segment's, nor a file of a topic deleted and created again under the same name (each topic has its
own start_physical_offset, which only grows: ``incarnation``).

The files' reads (:meth:`Ledger.queue_snapshot`, :meth:`Ledger.queue_file_upload`, :meth:`Ledger.queue_deleted`)
answer for the topic that holds the name now (``incarnation(topic)``: its start_physical_offset, the store's
topic registry): the uploads of its incarnation or a later one (a registry that lags), and those of an unknown
incarnation (-1: version 2 records, written before the field; local retention deletes a local file only when
its bytes are the uploaded ones, so such an upload of a deleted topic never costs a file); where several stand
for one base, the latest incarnation's. An upload of an earlier incarnation belongs to a deleted topic
(:func:`same_topic`): it is read by nobody, and the uploader deletes its object (:meth:`Ledger.queue_maps`).

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


def same_topic(incarnation: int, current: int | None) -> bool:
    """An upload of a file of the topic ``incarnation`` stands for the topic holding the name now (``current``:
    its start_physical_offset, None when the name holds none: nothing says otherwise)."""
    return incarnation < 0 or current is None or incarnation >= current


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
        # a consume queue's files: (topic, queue id, incarnation) -> map; (topic, queue id) -> its incarnations
        self.queues: dict[tuple[str, int, int], UploadMap] = {}
        self.incarnations: dict[tuple[str, int], list[int]] = {}

    def apply(self, upload: Upload, position: int = -1) -> None:
        """``position``: the record's physical offset (-1: unknown)."""
        if upload.kind == CONSUME_QUEUE:
            key = (upload.topic, upload.queue_id, upload.incarnation)
            queue = self.queues.get(key)
            if queue is None:
                queue = self.queues[key] = UploadMap()
                known = self.incarnations.setdefault((upload.topic, upload.queue_id), [])
                known.append(upload.incarnation)
                known.sort(reverse=True)  # the latest first: it wins a base several hold
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
    def __init__(self, append: Callable[[bytes], None], read: Read, bounds: Callable[[], tuple[int, int]],
                 incarnation: Callable[[str], int | None] = lambda topic: None):
        """``append(body)``: one record of the topic, acknowledged by the in-sync replicas (raises as an
        append does: NotLeader on a replica or a deposed leader); ``read``: records from a queue offset;
        ``bounds()``: the topic's consume queue (min offset, max offset); ``incarnation(topic)``: the
        start_physical_offset of the topic holding the name now (None: none, or not known)."""
        self.incarnation = incarnation
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
        return cls(append, read, bounds, store.topics.start_of)

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
        """A replica that starts from the tier (mqstore.replication.tier_join), its log new: the map is its leader's
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

    def _current(self, topic: str, queue_id: int) -> list[UploadMap]:
        """The maps of the queue's uploads that stand for the topic holding the name now, the latest first.
        The caller holds the lock."""
        current = self.incarnation(topic)
        return [self._map.queues[(topic, queue_id, incarnation)]
                for incarnation in self._map.incarnations.get((topic, queue_id), ())
                if same_topic(incarnation, current)]

    def queue_snapshot(self) -> dict[tuple[str, int], tuple[dict[int, Upload], list[Upload]]]:
        """(topic, queue id) -> (file base -> FINISHED upload, pending attempts) of the consume queue files of the
        topics holding their names now, as of the last catch-up."""
        with self._lock:
            found = {}
            for topic, queue_id in self._map.incarnations:
                maps = self._current(topic, queue_id)
                if maps:
                    found[(topic, queue_id)] = ({base: u for m in reversed(maps) for base, u in m.finished.items()},
                                                [u for m in maps for u in m.pending.values()])
            return found

    def queue_maps(self) -> dict[tuple[str, int, int], tuple[dict[int, Upload], list[Upload], bool]]:
        """(topic, queue id, incarnation) -> (file base -> FINISHED upload, pending attempts, whether it stands for
        the topic holding the name now: False for a deleted topic's) of every consume queue file's upload."""
        with self._lock:
            return {(topic, queue_id, incarnation): (dict(m.finished), list(m.pending.values()),
                                                     same_topic(incarnation, self.incarnation(topic)))
                    for (topic, queue_id, incarnation), m in self._map.queues.items()}

    def queue_deleted(self) -> dict[tuple[str, int], dict[int, Upload]]:
        """(topic, queue id) -> (file base -> the upload whose object the tier's retention deleted), of the topics
        holding their names now."""
        with self._lock:
            found = {}
            for topic, queue_id in self._map.incarnations:
                deleted = {base: u for m in reversed(self._current(topic, queue_id)) for base, u in m.deleted.items()}
                if deleted:
                    found[(topic, queue_id)] = deleted
            return found

    def queue_file_upload(self, topic: str, queue_id: int, file_base: int) -> Upload | None:
        """A consume queue file's FINISHED upload as of the last catch-up, of the topic holding the name now (no
        catch-up: cheap for every read)."""
        with self._lock:
            for m in self._current(topic, queue_id):
                upload = m.finished.get(file_base)
                if upload is not None:
                    return upload
            return None

    def queue_positions(self) -> dict[tuple[str, int, int, int], tuple[Upload, int]]:
        """(topic, queue id, incarnation, file base) -> (its FINISHED upload, physical offset of its latest FINISHED
        record), of every incarnation."""
        with self._lock:
            return {(topic, queue_id, incarnation, base): (m.finished[base], at)
                    for (topic, queue_id, incarnation), m in self._map.queues.items()
                    for base, at in m.positions.items() if base in m.finished}

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

