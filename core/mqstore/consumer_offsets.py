"""Consumer offsets in the commit log: the system topic ``RMQ_SYS_CONSUMER_OFFSETS`` (mqstore.format.offset_commit)
holds every commit as a record, and every node keeps the map key (group, topic, queue id) -> committed offset
in memory, built from that topic's consume queue. There is no other copy (the SQL table consumer_offsets of
earlier versions is read once, by :meth:`ConsumerOffsets.import_rows` at start, when the topic is empty:
mqstore.store_offsets, which also holds CommitOffset's and QueryOffset's rules around this map).

* **A commit is an append** through the store's own write path (MessageStore, as its topic events): the
  node's flush mode and its default replication apply (SYNC replication: acknowledged once the in-sync
  replicas hold it), a replica refuses it naming its leader. The rows of one call go in one record (the unit
  recovery keeps or cuts whole), so pop's offsets and its revive checkpoint are stored together or not at
  all; a call of more than MAX_ROWS rows is cut into records in order (pop puts its checkpoint last, so a
  torn tail can only lose the checkpoint's advance, never keep it without the offsets before it).
* **Reads come from the map**, caught up first with the consume queue (:meth:`catch_up`): on the leader a
  commit's own record is dispatched before its append returns, so a QueryOffset after a CommitOffset sees
  it; a replica dispatches what it copies from its leader, so its map is the leader's as of the committed
  offset, and a failover needs nothing: the new leader's map is read from its own log. The maintenance duty
  catches up every round too, so a replica's map stays warm without readers.
* **Start**: the consume queue is rebuilt by the store's recovery like any other; the map is read from its
  min offset (:meth:`catch_up` from 0).
* **Retention never loses a live offset**, by two rules (mqstore.store_retention): the map's lowest record
  still holding the latest row of a key (:meth:`floor`) is a retention floor, so no segment holding one is
  deleted (safety, on every node); and before retention deletes the expired segments, the leader re-appends
  the live rows they hold (:meth:`rewrite_below`), so the floor moves past them and the log does not grow
  without bound (progress). A retention hold alone would keep the whole log behind one idle group's commit.
  The topic is a system topic (kind SYSTEM), not a COMPACTION one: the writers' registry lets anybody write
  a topic that is not of kind SYSTEM, and the Compactor would serve its keys to readers; the rewrite is this
  topic's compaction, done where the map is.
* **DeleteTopic** appends tombstones for the deleted topic's keys (:meth:`delete_topic`).

Thread-safety: :meth:`catch_up` and the map serialise on ``_lock``, a deferred import on ``_deferred_lock``.
Appends (commits, tombstones) run concurrently with each other; :meth:`rewrite_below` excludes them while it
reads the live rows and appends them, so no commit lands between its read of a key and its re-append of the
older value.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable, Sequence

import structlog

from mqstore.format import offset_commit
from mqstore.format.offset_commit import TOMBSTONE, Row
from mqstore.model import MessageIn

log = structlog.get_logger()

Key = tuple[str, str, int]  # group, topic, queue id
READ_BATCH = 1000
READ_BYTES = 8 << 20  # a read's byte bound (the store's largest Pull)
# read(queue offset, max records) -> [(queue offset, physical offset, body)], in queue order
Read = Callable[[int, int], list[tuple[int, int, bytes]]]


class OffsetMap:
    """key -> (committed offset, physical offset of the record holding it): the latest row of each key in log
    order. Not thread-safe (ConsumerOffsets holds its lock)."""

    def __init__(self):
        self._entries: dict[Key, tuple[int, int]] = {}

    def apply(self, physical_offset: int, rows: Iterable[Row]) -> None:
        for row in rows:
            if row.offset == TOMBSTONE:
                self._entries.pop(row.key, None)
            else:
                self._entries[row.key] = (row.offset, physical_offset)

    def get(self, key: Key) -> int | None:
        found = self._entries.get(key)
        return None if found is None else found[0]

    def __len__(self) -> int:
        return len(self._entries)

    def rows(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, queue id, offset), sorted."""
        return sorted((*key, value[0]) for key, value in self._entries.items())

    def floor(self) -> int | None:
        """The lowest physical offset of a record holding a live row (None: no live row)."""
        return min((value[1] for value in self._entries.values()), default=None)

    def live_below(self, physical_offset: int) -> list[Row]:
        """The live rows whose record lies below ``physical_offset``, sorted by key."""
        return sorted((Row(*key, value[0]) for key, value in self._entries.items() if value[1] < physical_offset),
                      key=lambda row: row.key)

    def keys_of(self, topic: str) -> list[Key]:
        return sorted(key for key in self._entries if key[1] == topic)


class _Exclusion:
    """Many appenders at once, or one rewriter alone (a readers-writer lock, writer first)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._alone = False
        self._waiting_alone = 0

    def enter_shared(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._shared += 1

    def leave_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            self._cond.notify_all()

    def enter_alone(self) -> None:
        with self._cond:
            self._waiting_alone += 1
            self._cond.wait_for(lambda: not self._alone and not self._shared)
            self._waiting_alone -= 1
            self._alone = True

    def leave_alone(self) -> None:
        with self._cond:
            self._alone = False
            self._cond.notify_all()


class ConsumerOffsets:
    def __init__(self, append: Callable[[bytes, str | None], None], read: Read,
                 bounds: Callable[[], tuple[int, int]]):
        """``append(body, replication)``: one record of the offsets topic, acknowledged (the store's write
        path, with ``replication`` as an append's, None the node's default; raises as an append does);
        ``read``: the topic's records from a queue offset (:data:`Read`); ``bounds()``: the topic's consume
        queue (min offset, max offset)."""
        self._append = append
        self._read = read
        self._bounds = bounds
        self._lock = threading.Lock()
        self._map = OffsetMap()
        self._next = 0  # the next queue offset of the topic to apply
        self._writes = _Exclusion()
        self._deferred: Callable[[], bool] | None = None  # an import left to the first leader (:meth:`defer`)
        self._deferred_lock = threading.Lock()

    @classmethod
    def of_store(cls, store) -> ConsumerOffsets:
        """The offsets of ``store`` (a MessageStore, which composes this module: not imported), through its
        public parts: a commit is ``append_own`` (the store's write path, as its topic events), records are
        read with ``pull``, the topic's bounds are its consume queue's (``queues``)."""
        def append(body: bytes, replication: str | None) -> None:
            store.append_own(offset_commit.TOPIC, [MessageIn(body=body)], replication)

        def read(queue_offset: int, count: int) -> list[tuple[int, int, bytes]]:
            result = store.pull(offset_commit.TOPIC, 0, queue_offset, count, READ_BYTES)
            return [(m.record.queue_offset, m.record.physical_offset, m.record.body) for m in result.messages]

        def bounds() -> tuple[int, int]:
            cq = store.queues.get(offset_commit.TOPIC, 0)
            return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
        return cls(append, read, bounds)

    # ---- an import deferred (mqstore.store_offsets: a node of a replication group imports once it leads)
    def defer(self, run: Callable[[], bool]) -> None:
        """Keep ``run`` for :meth:`run_deferred`; it returns whether it is done (False: try again later)."""
        self._deferred = run

    def run_deferred(self) -> None:
        """The deferred import, if one is left, until it says it is done; one caller at a time."""
        if self._deferred is None:
            return
        with self._deferred_lock:
            if self._deferred is not None and self._deferred():
                self._deferred = None

    # ---- reads
    def catch_up(self) -> None:
        """Apply the topic's records the map has not seen yet."""
        low, high = self._bounds()
        if low <= self._next == high:
            return
        with self._lock:
            low, high = self._bounds()  # again: another thread may have read past what was seen above
            if high < self._next:  # the log was cut below what the map read (a replica's divergent tail)
                log.warning("offsets.map_rebuilt", next_offset=self._next, max_offset=high)
                self._map, self._next = OffsetMap(), 0
            if self._next < low:
                if self._next:
                    log.error("offsets.records_lost", next_offset=self._next, min_offset=low,
                              why="the offsets topic's oldest records went before the map read them")
                self._next = low
            while self._next < high:
                records = self._read(self._next, READ_BATCH)
                if not records:
                    break
                for queue_offset, physical_offset, body in records:
                    self._apply(queue_offset, physical_offset, body)
                self._next = records[-1][0] + 1

    def _apply(self, queue_offset: int, physical_offset: int, body: bytes) -> None:
        try:
            rows = offset_commit.decode(body)
        except ValueError as exc:  # not written by this code: the record stays in the log, the map skips it
            log.error("offsets.record_undecodable", queue_offset=queue_offset, physical_offset=physical_offset,
                      error=str(exc))
            return
        self._map.apply(physical_offset, rows)

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        self.catch_up()
        with self._lock:
            return self._map.get((group, topic, queue_id))

    def rows(self) -> list[tuple[str, str, int, int]]:
        self.catch_up()
        with self._lock:
            return self._map.rows()

    def floor(self) -> int | None:
        """The retention floor: the lowest record holding a live row (None: nothing to keep)."""
        self.catch_up()
        with self._lock:
            return self._map.floor()

    # ---- writes
    def commit(self, rows: Sequence[tuple[str, str, int, int]], replication: str | None = None) -> None:
        """Store the rows (checked by the caller), in one record per MAX_ROWS, in order; ``replication`` as
        an append's (None: the node's default)."""
        self._write([Row(*row) for row in rows], replication)

    def delete_topic(self, topic: str) -> int:
        """Tombstones for every key of ``topic``; returns how many."""
        self.catch_up()
        with self._lock:
            keys = self._map.keys_of(topic)
        self._write([Row(*key, TOMBSTONE) for key in keys])
        return len(keys)

    def import_rows(self, rows: Sequence[tuple[str, str, int, int]]) -> bool:
        """The rows of the SQL table of earlier versions, appended once: only while the topic has never held a
        record (returns whether they were)."""
        self.catch_up()
        if not rows or self.holds_records():
            return False
        self.commit(rows)
        return True

    def holds_records(self) -> bool:
        """Whether the offsets topic has ever held a record (retention never empties its queue's count)."""
        return self._bounds()[1] > 0

    def rewrite_below(self, physical_offset: int) -> int:
        """Re-append the live rows whose record lies below ``physical_offset`` (retention is about to delete
        it); returns how many. Commits wait meanwhile (the module docstring)."""
        self._writes.enter_alone()
        try:
            self.catch_up()
            with self._lock:
                rows = self._map.live_below(physical_offset)
            for start in range(0, len(rows), offset_commit.MAX_ROWS):
                self._append(offset_commit.encode(rows[start:start + offset_commit.MAX_ROWS]), None)
            self.catch_up()
        finally:
            self._writes.leave_alone()
        if rows:
            log.info("offsets.rewritten", rows=len(rows), below=physical_offset)
        return len(rows)

    def _write(self, rows: list[Row], replication: str | None = None) -> None:
        if not rows:
            return
        self._writes.enter_shared()
        try:
            for start in range(0, len(rows), offset_commit.MAX_ROWS):
                self._append(offset_commit.encode(rows[start:start + offset_commit.MAX_ROWS]), replication)
        finally:
            self._writes.leave_shared()
        self.catch_up()
