"""The in-flight set of pop consumption, in memory: which delivered messages are neither acked nor
redelivered yet, under which CK, until when. It is a view of ``rmq_sys_REVIVE_LOG`` (mqstore.pop.records):
every change is made only after the record that makes it durable is appended, and :meth:`add` and
:meth:`apply_ack` are also how the set is rebuilt from that topic at start.

A message is keyed ``(group, topic, source, queue id, queue offset)`` (``topic`` is the topic received
from; source 2 is its retry topic, 1 its legacy retry topic: mqstore.pop.records). Its entry names the
CK that put it in flight (``ck_id``, the CK record's physical offset): a later CK for the same key
replaces the entry (ChangeInvisibleDuration), and an ACK ends it only when it names the entry's current CK.

Writers claim an entry before they append its record (``busy``): an ack, a change of invisible time and
the revive duty's copy exclude each other, and a failed append releases the claim. Memory is bounded by
reservations against a per-(group, topic) and a total cap, taken before a receive reads.

Entries of an ordered group's CK (``ordered``, mqstore.pop.ordered) stay in the set when they expire
(until ``max_attempts``): the revive duty passes them over (:meth:`claim_expired`) and a receive delivers
them again in place (:meth:`claim_waiting`, then :meth:`add` of its CK); an ordered entry of attempt 0 is
held, never handed out yet. :meth:`queue_entries` gives a queue's entries to the ordering rule.

The revive checkpoint (:meth:`low_water`) is the lowest revive-log queue offset that still matters: that
of the oldest CK with a live entry, or of a CK being appended (registered by :meth:`appending`).

Thread-safe: one lock guards everything; no method does I/O.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import threading
from dataclasses import dataclass
from typing import Iterator

from mqstore.errors import invariant
from mqstore.pop.records import Checkpoint

MsgKey = tuple[str, str, int, int, int]  # group, topic, source, queue id, queue offset

OK, EXPIRED, NOT_IN_FLIGHT = "ok", "expired", "not_in_flight"


@dataclass(slots=True)
class Entry:
    key: MsgKey
    ck_id: int
    physical_offset: int
    attempt: int
    visible_at_ms: int
    max_attempts: int
    busy: bool = False
    ordered: bool = False              # of an ordered group's CK: delivered again in place, never revived
    message_group: str | None = None   # its message's group ("" none); None: not looked up yet (memory only)

    def stays_in_place(self) -> bool:
        """An ordered entry the revive duty leaves to a receive: held (attempt 0) or with attempts left."""
        return self.ordered and self.attempt < self.max_attempts


@dataclass(slots=True)
class Reservation:
    """Room taken by a receive before it reads (:meth:`InFlightTable.reserve`); ``remaining`` shrinks as its
    messages are added and the rest is given back by :meth:`InFlightTable.unreserve`."""
    group: str
    topic: str
    remaining: int


@dataclass(slots=True)
class _Ck:
    prefix: tuple[str, str, int, int]  # group, topic, source, queue id
    revive_offset: int                 # queue offset of the CK record in the revive topic
    live: int                          # entries that still name this CK


class InFlightTable:
    def __init__(self, max_per_group: int, max_total: int):
        self.max_per_group = max_per_group
        self.max_total = max_total
        self._lock = threading.Lock()
        self._entries: dict[MsgKey, Entry] = {}
        self._cks: dict[int, _Ck] = {}
        self._per_group: collections.Counter[tuple[str, str]] = collections.Counter()  # entries + reservations
        self._reserved_total = 0
        self._expiry: list[tuple[int, int, MsgKey, int]] = []  # (visible at, seq, key, ck id), lazily pruned
        self._low: list[tuple[int, int]] = []  # (revive offset, ck id), lazily pruned
        self._appending: collections.Counter[int] = collections.Counter()  # revive offsets at or below a CK in flight
        self._seq = itertools.count()
        self._by_queue: dict[tuple[str, str, int, int], set[int]] = {}  # (group, topic, source, queue) -> offsets

    # ---- sizes -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def count(self, group: str, topic: str) -> int:
        """Entries (and reservations) of ``group`` on ``topic``."""
        with self._lock:
            return self._per_group[(group, topic)]

    def count_queue(self, group: str, topic: str, source: int, queue_id: int) -> int:
        with self._lock:
            return sum(1 for k in self._entries if k[:4] == (group, topic, source, queue_id))

    # ---- receive ---------------------------------------------------------------------------------------
    def reserve(self, group: str, topic: str, wanted: int) -> Reservation:
        """Room for up to ``wanted`` more messages of ``group`` on ``topic`` (``remaining`` 0 when full); the
        caller adds its messages with :meth:`add` and gives back the rest with :meth:`unreserve`."""
        with self._lock:
            used = self._per_group[(group, topic)]
            room = max(0, min(wanted, self.max_per_group - used, self.max_total - len(self._entries)
                              - self._reserved_total))
            self._per_group[(group, topic)] = used + room
            self._reserved_total += room
            return Reservation(group, topic, room)

    def unreserve(self, reservation: Reservation) -> None:
        with self._lock:
            self._unreserve(reservation, reservation.remaining)

    def _unreserve(self, reservation: Reservation, count: int) -> None:
        invariant(0 <= count <= reservation.remaining <= self._reserved_total,
                  f"unreserve {count} of {reservation.remaining} ({self._reserved_total} reserved in all)")
        reservation.remaining -= count
        self._reserved_total -= count
        key = (reservation.group, reservation.topic)
        self._per_group[key] -= count
        if self._per_group[key] <= 0:
            del self._per_group[key]

    @contextlib.contextmanager
    def appending(self, revive_end: int) -> Iterator[None]:
        """Around the append of a CK: its revive offset will be at or above ``revive_end`` (the revive queue's
        max offset read before the append), and the checkpoint must not pass it until the CK's entries are
        in the set."""
        with self._lock:
            self._appending[revive_end] += 1
        try:
            yield
        finally:
            with self._lock:
                self._appending[revive_end] -= 1
                if not self._appending[revive_end]:
                    del self._appending[revive_end]

    def add(self, ck: Checkpoint, ck_id: int, revive_offset: int, *,
            reservation: Reservation | None = None, message_groups: dict[int, str] | None = None) -> list[Entry]:
        """Put the messages of ``ck`` in flight (a receive after its CK append, taking their room from its
        ``reservation``; replay and ChangeInvisibleDuration without one). A key already in flight is
        replaced. ``message_groups``: queue offset -> message group, known to an ordered receive (a replaced
        entry's is kept)."""
        with self._lock:
            if reservation is not None:
                # An ordered receive's CK also names messages in the set already (delivered again in place)
                # and held ones, beyond the room it reserved: those are bounded by the set and by
                # mqstore.pop.ordered.MAX_HELD_PER_QUEUE.
                taken = len(ck.entries)
                if ck.ordered:
                    prefix = (ck.group, ck.topic, ck.source, ck.queue_id)
                    fresh = sum(1 for e in ck.entries if (*prefix, e.queue_offset) not in self._entries)
                    taken = min(fresh, reservation.remaining)
                self._unreserve(reservation, taken)
            ref = self._cks.get(ck_id)
            if ref is None:
                ref = self._cks[ck_id] = _Ck((ck.group, ck.topic, ck.source, ck.queue_id), revive_offset, 0)
                heapq.heappush(self._low, (revive_offset, ck_id))
            added = []
            for e in ck.entries:
                key = (ck.group, ck.topic, ck.source, ck.queue_id, e.queue_offset)
                old = self._entries.get(key)
                known = message_groups.get(e.queue_offset) if message_groups is not None else None
                if old is not None:
                    known = old.message_group if known is None else known
                    self._drop(old)
                entry = Entry(key, ck_id, e.physical_offset, e.attempt, ck.visible_at_ms, ck.max_attempts,
                              ordered=ck.ordered, message_group=known)
                self._entries[key] = entry
                self._by_queue.setdefault(key[:4], set()).add(key[4])
                self._per_group[(ck.group, ck.topic)] += 1
                ref.live += 1
                heapq.heappush(self._expiry, (ck.visible_at_ms, next(self._seq), key, ck_id))
                added.append(entry)
            return added

    # ---- ack, change, forward --------------------------------------------------------------------------
    def claim(self, key: MsgKey, ck_id: int, now_ms: int) -> tuple[str, Entry | None]:
        """Claim the entry a handle names, for an ack, a change of invisible time or a forward:
        (OK, entry), (EXPIRED, None) when its invisible time has passed, (NOT_IN_FLIGHT, None) when no
        entry of that CK is in flight (acked, replaced, redelivered) or another writer holds it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.ck_id != ck_id or entry.busy:
                return NOT_IN_FLIGHT, None
            if now_ms >= entry.visible_at_ms:
                return EXPIRED, None
            entry.busy = True
            return OK, entry

    def release(self, entries: list[Entry]) -> None:
        """Give back claims whose record could not be appended: the entries stay in flight as they were."""
        with self._lock:
            for entry in entries:
                if self._entries.get(entry.key) is entry:
                    entry.busy = False
                    heapq.heappush(self._expiry, (entry.visible_at_ms, next(self._seq), entry.key, entry.ck_id))

    def remove(self, entries: list[Entry]) -> None:
        """End claimed entries whose ACK record is appended."""
        with self._lock:
            for entry in entries:
                if self._entries.get(entry.key) is entry:
                    self._drop(entry)

    # ---- revive ----------------------------------------------------------------------------------------
    def claim_expired(self, now_ms: int, limit: int) -> list[Entry]:
        """Claim up to ``limit`` entries whose invisible time has passed, oldest first."""
        claimed: list[Entry] = []
        with self._lock:
            while self._expiry and self._expiry[0][0] <= now_ms and len(claimed) < limit:
                _, _, key, ck_id = heapq.heappop(self._expiry)
                entry = self._entries.get(key)
                if (entry is not None and entry.ck_id == ck_id and not entry.busy and entry.visible_at_ms <= now_ms
                        and not entry.stays_in_place()):
                    entry.busy = True
                    claimed.append(entry)
        return claimed

    def next_expiry_ms(self) -> int | None:
        """The earliest invisible time still to pass (an upper bound on when revive has work), or None."""
        with self._lock:
            while self._expiry:
                visible_at, _, key, ck_id = self._expiry[0]
                entry = self._entries.get(key)
                if entry is not None and entry.ck_id == ck_id and not entry.busy and not entry.stays_in_place():
                    return visible_at
                heapq.heappop(self._expiry)
            return None

    # ---- replay ----------------------------------------------------------------------------------------
    def apply_ack(self, ck_id: int, queue_offset: int) -> bool:
        """Replay of one ACK entry: ends the message's entry if it still names ``ck_id``."""
        with self._lock:
            ref = self._cks.get(ck_id)
            if ref is None:
                return False
            entry = self._entries.get((*ref.prefix, queue_offset))
            if entry is None or entry.ck_id != ck_id:
                return False
            self._drop(entry)
            return True

    # ---- checkpoint ------------------------------------------------------------------------------------
    def low_water(self, revive_end: int) -> int:
        """Revive-log queue offset below which every CK is resolved: the oldest live CK's, or a CK being
        appended's, else ``revive_end`` (the queue's max offset, read by the caller before this call)."""
        with self._lock:
            while self._low and self._low[0][1] not in self._cks:
                heapq.heappop(self._low)
            candidates = [revive_end]
            if self._low:
                candidates.append(self._low[0][0])
            if self._appending:
                candidates.append(min(self._appending))
            return min(candidates)

    def expired(self, now_ms: int) -> list[Entry]:
        """Entries whose invisible time has passed and that nobody has claimed (the start's reconciliation)."""
        with self._lock:
            return [e for e in self._entries.values()
                    if e.visible_at_ms <= now_ms and not e.busy and not e.stays_in_place()]

    # ---- ordered groups --------------------------------------------------------------------------------
    def queue_entries(self, group: str, topic: str, source: int, queue_id: int) -> list[Entry]:
        """The entries of one queue of ``group``, by queue offset (the ordering rule's view; the entries are
        live objects: read their fields once)."""
        prefix = (group, topic, source, queue_id)
        with self._lock:
            return [self._entries[(*prefix, offset)] for offset in sorted(self._by_queue.get(prefix, ()))]

    def claim_waiting(self, entries: list[Entry], now_ms: int) -> list[Entry]:
        """Claim ordered entries to deliver again in place (an ordered receive, before its CK): those still
        in the set, not claimed, and held or expired; the others are left out."""
        claimed = []
        with self._lock:
            for entry in entries:
                if (self._entries.get(entry.key) is entry and not entry.busy
                        and (entry.attempt == 0 or entry.visible_at_ms <= now_ms)):
                    entry.busy = True
                    claimed.append(entry)
        return claimed

    def unorder(self, group: str) -> int:
        """``group`` is no longer ordered: its ordered entries become ordinary ones (the revive duty copies
        them to the retry topic once expired; held ones at once). Returns how many."""
        with self._lock:
            changed = [e for k, e in self._entries.items() if k[0] == group and e.ordered]
            for entry in changed:
                entry.ordered = False
                if entry.attempt == 0:
                    entry.visible_at_ms = 0
                heapq.heappush(self._expiry, (entry.visible_at_ms, next(self._seq), entry.key, entry.ck_id))
            return len(changed)

    def next_visible_ms(self, group: str, topic: str, now_ms: int) -> int | None:
        """When the first ordered message of ``group`` on ``topic`` in flight now expires (a long poll of an
        ordered group ends then: its message is handed out again in place, no queue grows), or None."""
        with self._lock:
            return min((e.visible_at_ms for prefix, offsets in self._by_queue.items() if prefix[:2] == (group, topic)
                        for e in (self._entries[(*prefix, o)] for o in offsets)
                        if e.ordered and e.attempt > 0 and e.visible_at_ms > now_ms), default=None)

    def ordered_groups(self) -> set[str]:
        with self._lock:
            return {k[0] for k, e in self._entries.items() if e.ordered}

    def entries_of(self, group: str, topic: str) -> list[Entry]:
        with self._lock:
            return [e for k, e in self._entries.items() if k[0] == group and k[1] == topic]

    # ---- internals (lock held) ---------------------------------------------------------------------------
    def _drop(self, entry: Entry) -> None:
        del self._entries[entry.key]
        offsets = self._by_queue[entry.key[:4]]
        offsets.discard(entry.key[4])
        if not offsets:
            del self._by_queue[entry.key[:4]]
        group_topic = entry.key[:2]
        self._per_group[group_topic] -= 1
        if self._per_group[group_topic] <= 0:
            del self._per_group[group_topic]
        ref = self._cks[entry.ck_id]
        ref.live -= 1
        if not ref.live:
            self._forget_ck(entry.ck_id)

    def _forget_ck(self, ck_id: int) -> None:
        del self._cks[ck_id]  # its _low item is pruned lazily
