"""Pop offsets: per (group, topic, queue) the next queue offset a receive reads, owned by the server.

They are consumer offsets of the store (the offsets topic CommitOffset writes, mqstore.consumer_offsets:
QueryOffset shows a pop group's progress), loaded on first use and written back in batches by the revive duty
(:meth:`PopOffsets.take_dirty`). A receive advances an offset in memory after its CK record is
appended; the CK also carries the offset (POP_OFFSET_AFTER), so an offset not yet written back is
recovered at start from the revive log (:meth:`raise_floor`, :meth:`settle`).

Two rules keep a crash from losing a message:
  * an offset is written back only once the CK that advanced it is flushed (``ck_end``): the stored
    offset never passes a message whose CK a power cut could take back;
  * the revive checkpoint never passes the CK behind an offset not yet written back
    (:meth:`take_dirty`'s second result), so the replay at start still finds that CK.

A topic deleted and created again (CommitLog.DeleteTopic) is another topic of the same name, starting at
queue offset 0: the offsets kept in memory for a name belong to the topic whose start_physical_offset
they were taken under (``start_of``), and are forgotten, written back or not, once the name has another
start or none (the delete removed the stored ones with the topic's consumer offsets).

Thread-safe: one lock; the callers serialise receives of one queue themselves (PopService's queue locks).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from mqstore.errors import NotFound

QueueKey = tuple[str, str, int]  # group, topic name (a retry topic's own name for its queue), queue id


@dataclass(slots=True)
class _Dirty:
    offset: int
    ck_end: int          # physical end of the newest CK behind the offset (0: none, e.g. only filtered messages)
    first_revive: int    # revive offset of the oldest CK behind an unwritten advance (-1: none)


class PopOffsets:
    def __init__(self, load: Callable[[str, str, int], int | None],
                 start_of: Callable[[str], int | None] = lambda topic: 0):
        """``load(group, topic, queue id)``: the stored offset, None when the group never stored one;
        ``start_of(topic)``: the topic's start_physical_offset, None when there is no such topic."""
        self._load = load
        self._start_of = start_of
        self._starts: dict[str, int | None] = {}  # topic -> the start the offsets kept of it were taken under
        self._lock = threading.Lock()
        self._offsets: dict[QueueKey, int] = {}
        self._floors: dict[QueueKey, int] = {}
        self._dirty: dict[QueueKey, _Dirty] = {}

    def raise_floor(self, key: QueueKey, offset: int) -> None:
        """Replay: a CK says the offset of ``key`` was at least ``offset``; :meth:`settle` applies it."""
        with self._lock:
            if offset > self._floors.get(key, -1):
                self._floors[key] = offset

    def settle(self, replay_from: int) -> None:
        """After the replay: each raised offset above the stored one becomes the offset, to be written
        back, holding the revive checkpoint at ``replay_from`` (where the replay began) until it is: the
        CKs it came from are needed again until then. A queue whose topic is gone is skipped."""
        with self._lock:
            floors, self._floors = self._floors, {}
        for key, floor in floors.items():
            try:
                stored = self._load(*key)
            except NotFound:
                continue
            with self._lock:
                if stored is not None and stored >= floor:
                    self._offsets.setdefault(key, stored)
                else:
                    self._offsets[key] = floor
                    self._dirty[key] = _Dirty(floor, 0, replay_from)

    def _forget_if_replaced(self, topic: str) -> None:
        """Under the lock: drop what is kept of ``topic`` if the name is now another topic, or none."""
        now = self._start_of(topic)
        if topic not in self._starts:
            self._starts[topic] = now
            return
        if self._starts[topic] == now:
            return
        for table in (self._offsets, self._dirty, self._floors):
            for key in [k for k in table if k[1] == topic]:
                del table[key]
        if now is None:
            del self._starts[topic]
        else:
            self._starts[topic] = now

    def get(self, key: QueueKey, initial: Callable[[], int]) -> int:
        """The offset of ``key``: in memory, else stored, else ``initial()`` (the receive's start rule). A
        first value that was not stored is marked to be written back."""
        with self._lock:
            self._forget_if_replaced(key[1])
            found = self._offsets.get(key)
            if found is not None:
                return found
        stored = self._load(*key)
        offset = initial() if stored is None else stored
        with self._lock:
            found = self._offsets.setdefault(key, offset)
            if stored is None and found == offset:
                self._dirty.setdefault(key, _Dirty(offset, 0, -1))
            return found

    def peek(self, key: QueueKey) -> int | None:
        with self._lock:
            return self._offsets.get(key)

    def advance(self, key: QueueKey, offset: int, ck_end: int = 0, revive_offset: int = -1) -> None:
        """After a receive: the next offset of ``key``; ``ck_end`` / ``revive_offset`` of its CK, if any."""
        with self._lock:
            if offset <= self._offsets.get(key, -1):
                return
            self._offsets[key] = offset
            dirty = self._dirty.get(key)
            if dirty is None:
                self._dirty[key] = _Dirty(offset, ck_end, revive_offset)
                return
            dirty.offset = offset
            dirty.ck_end = max(dirty.ck_end, ck_end)
            if dirty.first_revive < 0:
                dirty.first_revive = revive_offset

    def reset(self, key: QueueKey, offset: int) -> None:
        """The offset of ``key`` is ``offset`` even if lower (its queue was removed by retention or its topic
        created again); to be written back."""
        with self._lock:
            self._offsets[key] = offset
            dirty = self._dirty.get(key)
            if dirty is None:
                self._dirty[key] = _Dirty(offset, 0, -1)
            else:
                dirty.offset = offset

    def dirty_rows(self, flushed_physical: int) -> tuple[list[tuple[str, str, int, int]], int | None]:
        """The offsets to write back now (their CKs are flushed up to ``flushed_physical``) as rows
        (group, topic, queue id, offset), and the lowest revive offset behind an offset left unwritten
        (None: none), which caps the revive checkpoint. Nothing changes until :meth:`written`."""
        rows, held = [], None
        with self._lock:
            for topic in {key[1] for key in self._dirty}:
                self._forget_if_replaced(topic)
            for key, dirty in self._dirty.items():
                if dirty.ck_end <= flushed_physical:
                    rows.append((*key, dirty.offset))
                elif dirty.first_revive >= 0:
                    held = dirty.first_revive if held is None else min(held, dirty.first_revive)
        return rows, held

    def written(self, rows: list[tuple[str, str, int, int]]) -> None:
        """The rows of :meth:`dirty_rows` are stored: those not advanced since are clean. One advanced
        since stays dirty with its older revive offset (it holds the checkpoint back a little longer)."""
        with self._lock:
            for group, topic, queue_id, offset in rows:
                key = (group, topic, queue_id)
                dirty = self._dirty.get(key)
                if dirty is not None and dirty.offset == offset:
                    del self._dirty[key]
