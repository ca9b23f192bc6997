"""One topic/queue's compaction log: segments (format/compaction_segment.py), their sparse index
(format/sparse_queue.py), the round state, and the latest queue offset of every key.

Directory ``<data>/<topic>/<queue id>/``: ``<base>.log`` + ``<base>.cq`` per segment, ``round.state``
(JSON: the offset the log is cleaned up to; replaced only inside a round's install, so it always
matches the segments), ``keys.checkpoint`` (the key table checkpoint: mqstore.compaction.key_checkpoint;
derived data, checked against the index at open) and ``staging/`` (a round's output before its install).

Appends go to the active (last) segment and are made durable by :meth:`QueueLog.sync` (the follower
calls it before its checkpoint). Reads see the in-memory copy of the index, a few arrays.

With an object storage tier (``remote``: mqstore.compaction.tier.CompactionTier) a sealed segment may be
only in the tier: its ``.cq`` stays local, its ``.log`` was deleted by local retention once its upload
FINISHED (:meth:`QueueLog.drop_local`; ``tiered`` holds those bases, rebuilt on open from what the tier's
manifest names). Reads of such a segment go to the tier outside ``_lock`` (a slow tier never holds up the
appender or reads of local segments), rounds read it whole through :meth:`QueueLog.segment_bytes`, and a
round's output replacing it is local again.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import pathlib
import threading
from array import array
from dataclasses import dataclass
from typing import Protocol

from mqstore import failpoints, fs
from mqstore.errors import NotFound, invariant, shown
from mqstore.format import compaction_segment as cseg, sparse_queue
from mqstore.format.sparse_queue import SparseEntry

from . import qlog_files

STATE = "round.state"


@dataclass(frozen=True, slots=True)
class Stored:
    """One record read back: its index entry and its bytes (PHYSICALOFFSET = its position here)."""

    entry: SparseEntry
    raw: bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    """Records of one segment side by side (``data``, its first byte at position ``start``) and their index
    columns (copies: the log goes on appending to its own)."""

    data: bytes
    start: int
    positions: array
    sizes: array
    offsets: array
    store_ms: array
    tags: array
    seen: array

    def stored(self, i: int) -> Stored:
        at = self.positions[i] - self.start
        return Stored(SparseEntry(self.positions[i], self.sizes[i], self.tags[i], self.store_ms[i], self.offsets[i],
                                  self.seen[i]), self.data[at:at + self.sizes[i]])


class Entries:
    """The index in columns (compact: a few tens of bytes per record). Not thread-safe: QueueLog's lock."""

    def __init__(self, entries=()):
        self.offsets, self.positions, self.store_ms = array("q"), array("q"), array("q")
        self.sizes, self.tags, self.seen = array("i"), array("q"), array("q")  # seen: tombstone seen-at ms
        self.limit: int | None = None  # a view: only the first ``limit`` entries count
        for entry in entries:
            self.add(entry)

    def prefix(self, n: int) -> Entries:
        """A read-only view of the first ``n`` entries, sharing the columns (no copy: appends after them do
        not change them, and only the round holding the queue's round lock replaces them)."""
        view = Entries()
        view.offsets, view.positions, view.store_ms = self.offsets, self.positions, self.store_ms
        view.sizes, view.tags, view.seen = self.sizes, self.tags, self.seen
        view.limit = n
        return view

    def spliced(self, lo: int, hi: int, middle: Entries) -> Entries:
        """A new index: entries [0, lo) of this one, then ``middle``'s, then [hi, len) of this one."""
        out, n = Entries(), len(self)
        for name in ("offsets", "positions", "store_ms", "sizes", "tags", "seen"):
            mine, theirs = getattr(self, name), getattr(middle, name)
            setattr(out, name, mine[:lo] + theirs[:len(middle)] + mine[hi:n])
        return out

    def add(self, e: SparseEntry) -> None:
        self.offsets.append(e.queue_offset)
        self.positions.append(e.position)
        self.store_ms.append(e.store_timestamp_ms)
        self.sizes.append(e.size)
        self.tags.append(e.tag_code)
        self.seen.append(e.tombstone_seen_ms)

    def __len__(self) -> int:
        return len(self.offsets) if self.limit is None else self.limit

    def entry(self, i: int) -> SparseEntry:
        return SparseEntry(self.positions[i], self.sizes[i], self.tags[i], self.store_ms[i], self.offsets[i],
                           self.seen[i])

    def first_at_position(self, position: int) -> int:
        return bisect.bisect_left(self.positions, position, 0, len(self))


class Remote(Protocol):
    """The object storage tier's side of a queue's segments (mqstore.compaction.tier.CompactionTier)."""

    def holds(self, qlog: "QueueLog", base: int) -> bool:
        """Whether the tier holds a FINISHED upload of the sealed segment ``base`` as its local index has it."""
        ...

    def pin(self, qlog: "QueueLog", base: int) -> object:
        """The upload of tiered segment ``base`` as it is now (called under the log's lock, so a round's
        install and the next upload cannot slip between the index read and the object read)."""
        ...

    def read(self, pinned: object, position: int, size: int) -> bytes:
        """``size`` bytes from byte ``position`` of a pinned upload's object (fewer at its end)."""
        ...


class QueueLog:
    """Thread-safe: ``_lock`` guards the files, the index and ``latest``; the follower appends, readers
    read, and one round at a time (the caller serialises them) replaces the sealed segments."""

    def __init__(self, directory: pathlib.Path, segment_size_bytes: int, topic: str, queue_id: int,
                 remote: Remote | None = None):
        self.directory, self.segment_size, self.topic, self.queue_id = directory, segment_size_bytes, topic, queue_id
        self._lock = threading.RLock()
        self._read_fds: dict[int, int] = {}
        self.closed = False
        self.remote = remote
        self.tiered: set[int] = set()  # sealed segments whose .log is only in the tier
        qlog_files.clean_directory(directory)
        self.state = self._load_state()
        bases = qlog_files.segment_bases(directory, self._held_by_tier) or [0]
        self.entries = Entries()
        self.latest: dict[str, int] = {}  # key -> queue offset of its latest record (filled by the owner)
        for base in bases:
            if base in self.tiered:
                pass
            elif not (directory / cseg.log_name(base)).exists():
                (directory / cseg.log_name(base)).touch()
                (directory / cseg.index_name(base)).touch()
                fs.fsync_dir(directory)  # the creation rule (mqstore.fs)
            for entry in qlog_files.load_index(directory, base, active=base == bases[-1]):
                self.entries.add(entry)
        self.bases = bases
        self._open_active(bases[-1])

    def _held_by_tier(self, base: int) -> bool:
        if self.remote is None or not self.remote.holds(self, base):
            return False
        self.tiered.add(base)
        return True

    # ---- state ---------------------------------------------------------------------------------------
    def _load_state(self) -> dict:
        path = self.directory / STATE
        return json.loads(path.read_bytes()) if path.exists() else {"cleaned_offset": -1}

    @property
    def cleaned_offset(self) -> int:
        """Every record at or below this queue offset has been cleaned by a round (-1: none)."""
        return int(self.state["cleaned_offset"])

    def next_offset(self) -> int:
        """The queue offset after the last record applied (0 when none; a round may have removed it)."""
        with self._lock:
            last = self.entries.offsets[-1] + 1 if len(self.entries) else 0
            return max(last, int(self.state.get("next_offset", 0)))

    def min_offset(self) -> int:
        with self._lock:
            return self.entries.offsets[0] if len(self.entries) else self.next_offset()

    @property
    def active_base(self) -> int:
        return self.bases[-1]

    @property
    def end_position(self) -> int:
        return self._end

    # ---- appending (the follower's thread) ------------------------------------------------------------
    def _open_active(self, base: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT
        self._log_fd = os.open(self.directory / cseg.log_name(base), flags, 0o644)
        self._cq_fd = os.open(self.directory / cseg.index_name(base), flags | os.O_APPEND, 0o644)
        self._end = base + os.fstat(self._log_fd).st_size

    def append(self, raw: bytes, queue_offset: int, tag_code: int, store_timestamp_ms: int, key: str) -> bool:
        """Append one commit log record; False when its queue offset is already held (a replay)."""
        with self._lock:
            if queue_offset < self.next_offset():
                return False
            if not cseg.fits(self._end, len(raw), self.segment_size):
                self._roll()
            position = self._end
            os.pwrite(self._log_fd, cseg.relocate(raw, position), position - self.active_base)
            entry = SparseEntry(position, len(raw), tag_code, store_timestamp_ms, queue_offset)
            os.write(self._cq_fd, sparse_queue.encode(entry))
            self.entries.add(entry)
            self.latest[key] = queue_offset
            self._end = position + len(raw)
            return True

    def seal_active(self) -> bool:
        """Seal the active segment if it holds records (a round may then clean it); False if empty."""
        with self._lock:
            if self._end == self.active_base:
                return False
            self._roll()
            return True

    def _roll(self) -> None:
        """End the active segment with a blank record, make it durable, start the next one."""
        base = self.active_base
        os.pwrite(self._log_fd, cseg.blank_for(self._end, self.segment_size), self._end - base)
        os.ftruncate(self._log_fd, self.segment_size)
        self.sync()
        failpoints.hit("compaction.roll.sealed")
        os.close(self._log_fd)
        os.close(self._cq_fd)
        self.bases.append(base + self.segment_size)
        self._open_active(self.bases[-1])
        fs.fsync_dir(self.directory)

    def sync(self) -> None:
        """fsync the active segment, then its index (sealed segments were synced when sealed)."""
        with self._lock:
            os.fsync(self._log_fd)
            os.fsync(self._cq_fd)

    # ---- reading -------------------------------------------------------------------------------------
    def index_of(self, queue_offset: int) -> int:
        """Index of the first record at or after ``queue_offset`` ("or next": holes read the next one)."""
        with self._lock:
            return bisect.bisect_left(self.entries.offsets, queue_offset)

    def read(self, first: int, count: int, max_bytes: int = 1 << 62) -> list[Stored]:
        """Records ``first`` .. ``first + count - 1`` of the index (at least one if any, then up to max_bytes);
        one pread per segment for the lot (the records of a segment lie side by side)."""
        out: list[Stored] = []
        spans = []  # (i, j, first position, bytes, or the pinned upload: in the tier, read after the lock)
        with self._lock:
            self._check_open()
            e = self.entries  # (columns only appended to while held: [first, end) stays as it is)
            positions, sizes, end, total = e.positions, e.sizes, min(first + count, len(e)), 0
            for i in range(first, end):
                if i > first and total + sizes[i] > max_bytes:
                    end = i
                    break
                total += sizes[i]
            i = first
            while i < end:
                base = cseg.segment_base(positions[i], self.segment_size)
                j = bisect.bisect_left(positions, base + self.segment_size, i, end)
                size = positions[j - 1] + sizes[j - 1] - positions[i]
                spans.append((i, j, positions[i], self.remote.pin(self, base) if base in self.tiered else
                               self._pread(positions[i], size)))
                i = j
        for i, j, start, data in spans:
            if not isinstance(data, bytes):
                data = self._remote_read(data, start, positions[j - 1] + sizes[j - 1] - start)
            for k in range(i, j):
                at = positions[k] - start
                out.append(Stored(SparseEntry(positions[k], sizes[k], e.tags[k], e.store_ms[k], e.offsets[k],
                                              e.seen[k]), data[at:at + sizes[k]]))
        return out

    def _check_open(self) -> None:
        if self.closed:
            raise NotFound(f"topic {shown(self.topic)} queue {self.queue_id} was deleted: its compaction log is gone")

    def _remote_read(self, pinned: object, position: int, size: int) -> bytes:
        """Bytes of a segment only in the tier (called without ``_lock``), checked to be whole."""
        base = cseg.segment_base(position, self.segment_size)
        data = self.remote.read(pinned, position - base, size)
        invariant(len(data) == size, f"the tier's object of {self.directory / cseg.log_name(base)} holds the "
                                     f"{size} bytes at {position}")
        return data

    def segment_bytes(self, base: int) -> bytes:
        """The whole sealed segment ``base`` (a round's input): the local file, else its object in the tier."""
        with self._lock:
            pinned = self.remote.pin(self, base) if base in self.tiered else None
        if pinned is None:
            return (self.directory / cseg.log_name(base)).read_bytes()
        return self.remote.read(pinned, 0, self.segment_size)

    def drop_local(self, base: int) -> None:
        """Delete the local .log of sealed segment ``base``, whose upload FINISHED (local retention; the
        caller checked): reads of it go to the tier from now on. Its .cq stays."""
        with self._lock:
            invariant(self.remote is not None and base in self.bases[:-1] and base not in self.tiered,
                      "only a local sealed segment leaves the local disk, to the tier")
            fd = self._read_fds.pop(base, None)
            if fd is not None:
                os.close(fd)
            self.tiered.add(base)
            (self.directory / cseg.log_name(base)).unlink()
            fs.fsync_dir(self.directory)

    def read_chunk(self, first: int, count: int) -> Chunk:
        """Records ``first`` .. ``first + count - 1`` of the index that lie in the segment of the first one, as
        one buffer and copies of their index columns (one pread; no object per record: Scan's walk)."""
        with self._lock:
            self._check_open()
            e = self.entries
            end = min(first + count, len(e))
            if first >= end:
                return Chunk(b"", 0, array("q"), array("i"), array("q"), array("q"), array("q"), array("q"))
            positions, sizes = e.positions, e.sizes
            base = cseg.segment_base(positions[first], self.segment_size)
            end = bisect.bisect_left(positions, base + self.segment_size, first, end)
            start, size = positions[first], positions[end - 1] + sizes[end - 1] - positions[first]
            pinned = self.remote.pin(self, base) if base in self.tiered else None
            data = None if pinned is not None else self._pread(start, size)
            chunk = Chunk(data, start, positions[first:end], sizes[first:end], e.offsets[first:end],
                          e.store_ms[first:end], e.tags[first:end], e.seen[first:end])
        if pinned is not None:
            chunk = dataclasses.replace(chunk, data=self._remote_read(pinned, start, size))
        return chunk

    def _pread(self, position: int, size: int) -> bytes:
        base = cseg.segment_base(position, self.segment_size)
        fd = self._read_fds.get(base)
        if fd is None:
            fd = self._read_fds[base] = os.open(self.directory / cseg.log_name(base), os.O_RDONLY)
        data = os.pread(fd, size, position - base)
        if len(data) != size:  # (the message is built only then: this is the read path)
            invariant(False, f"{self.directory / cseg.log_name(base)} holds the {size} bytes at {position}")
        return data

    def by_time(self, timestamp_ms: int) -> int:
        """Queue offset of the first record stored at or after ``timestamp_ms`` (the next offset if none)."""
        with self._lock:
            i = bisect.bisect_left(self.entries.store_ms, timestamp_ms)
            return self.entries.offsets[i] if i < len(self.entries) else self.next_offset()

    # ---- rounds ----------------------------------------------------------------------------------------
    def sealed(self) -> tuple[list[int], Entries]:
        """The sealed segments' bases and entries (a view: a round works on it without the lock)."""
        with self._lock:
            bases = self.bases[:-1]
            return bases, self.entries.prefix(self.entries.first_at_position(self.active_base))

    def install(self, staged: list[pathlib.Path], new_entries: Entries, state: dict, replaced_bases: list[int],
                removed_keys: dict[str, int]) -> None:
        """Swap a round's output in for the sealed segments ``replaced_bases`` (consecutive ones; none: the
        state only) with fs.install (all or nothing). The segments below them are kept as they are, and so
        are those sealed since the round began (they lie above every replaced one)."""
        with self._lock:
            at = self.bases.index(replaced_bases[0]) if replaced_bases else len(self.bases) - 1
            upto = at + len(replaced_bases)
            invariant(self.bases[at:upto] == replaced_bases and upto < len(self.bases),
                      "a round replaces consecutive sealed segments")
            invariant(not len(new_entries) or (new_entries.positions[0] >= self.bases[at] and
                                               new_entries.positions[-1] < self.bases[upto]),
                      "a round's output lies where the segments it replaces were")
            replaced = [n for b in replaced_bases for n in (cseg.log_name(b), cseg.index_name(b))
                        if b not in self.tiered or n != cseg.log_name(b)]  # (a tiered one's .log is not here)
            if (self.directory / STATE).exists():
                replaced.append(STATE)
            fs.install(self.directory, staged, replaced)
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
            new_bases = sorted({cseg.segment_base(p, self.segment_size) for p in new_entries.positions})
            old = self.entries
            self.entries = old.spliced(old.first_at_position(self.bases[at]), old.first_at_position(self.bases[upto]),
                                       new_entries)
            self.bases, self.state = self.bases[:at] + new_bases + self.bases[upto:], state
            self.tiered -= set(replaced_bases) | set(new_bases)  # the output is local
            for key, offset in removed_keys.items():
                if self.latest.get(key) == offset:
                    del self.latest[key]

    def close(self) -> None:
        """Sync and close the files; later reads say NotFound (the topic was deleted). Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.sync()
            for fd in (self._log_fd, self._cq_fd, *self._read_fds.values()):
                os.close(fd)
            self._read_fds.clear()
            self.closed = True
