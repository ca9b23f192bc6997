"""What is sealed in a commit log store and may go to the object storage tier (the uploader's inputs,
mqstore.tier.uploader; local retention's too): the commit log segments whose every byte is final
(:func:`sealed_segments`) and every consume queue's sealed files (:func:`sealed_queue_files`) with the commit log
span their entries point into, read on first use.

Thread-safety: the lists are snapshots of the store's tables; a file closed meanwhile (a topic's delete) gives
no span (None), never an error.
"""

from __future__ import annotations

import mmap
import pathlib
from typing import Callable

from mqstore.errors import OutOfRange
from mqstore.format import cq_unit, crc64
from mqstore.format.tier_upload import CRC64NVME, SHA256, Digest


class SealedSegment:
    """What the uploader needs of a local segment: its base, its size, its file (``path``: streamed by the put
    and hashed in chunks, never whole in memory; None: ``read()`` gives its bytes, for tests)."""

    def __init__(self, base: int, size: int, read: Callable[[], bytes], path: pathlib.Path | None = None):
        self.base, self.size, self.read, self.path = base, size, read, path

    def checksum(self) -> tuple[int, bytes]:
        """(digest kind, digest) of the segment's bytes for its STARTED record (mqstore.format.tier_upload):
        CRC-64/NVME where the compiled codec computes it (~0.1 CPU s a GB), else SHA-256 (~0.6; the pure-Python
        CRC would be far slower)."""
        kind = CRC64NVME if crc64.FAST else SHA256
        return kind, self.digest(kind)

    def digest(self, kind: int = SHA256) -> bytes:
        """The digest of ``kind`` (mqstore.format.tier_upload's SHA256 or CRC64NVME) of the segment's bytes: of the
        file as a read-only memory map (no copy; hashlib and the compiled CRC release the GIL meanwhile: the commit
        log's threads run)."""
        digest = Digest(kind)
        if self.path is None:
            digest.update(self.read())
            return digest.value()
        with open(self.path, "rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if len(mapped) < self.size:
                raise OSError(f"{self.path} holds {len(mapped)} bytes, fewer than its {self.size}")
            with memoryview(mapped) as view, view[:self.size] as part:
                digest.update(part)
        return digest.value()


def sealed_segments(store) -> list[SealedSegment]:
    """The store's segments whose every byte is final: written, flushed and visible past their end."""
    limit = min(store.flushed_offset(), store.visible_offset())
    found = []
    for segment in list(store.segments.segments):
        if segment.end <= limit:
            found.append(SealedSegment(segment.start, segment.size, _reader(segment.path), segment.path))
    return found


class SealedQueueFile:
    """A sealed consume queue file: ``file`` (a SealedSegment: its base is its first byte in the queue's address
    space), ``incarnation`` (its topic's start_physical_offset, read before the queue was listed: a topic deleted
    and created again meanwhile makes it the older one, never a newer topic's for an older file) and
    :meth:`log_span`, the commit log span its entries point into (read on first use: the uploader asks only for
    files it has not uploaded)."""

    def __init__(self, topic: str, queue_id: int, file: SealedSegment, span: Callable[[], tuple[int, int] | None],
                 incarnation: int = -1):
        self.topic, self.queue_id, self.file, self.incarnation = topic, queue_id, file, incarnation
        self._span, self._known = span, None

    def log_span(self) -> tuple[int, int] | None:
        """[first record's physical offset, last record's end) ((0, 0): blanks only; None: the file went)."""
        if self._known is None:
            self._known = (self._span(),)
        return self._known[0]


def sealed_queue_files(store) -> list[SealedQueueFile]:
    """Every consume queue's files whose every entry is final: not its last file, written and flushed to the
    file's end (the topics kept local, Retention's LOCAL_ONLY_TOPICS, left out)."""
    from mqstore.store_retention import LOCAL_ONLY_TOPICS  # the store's module; this one is imported by it
    # The topics' incarnations before the queues they are listed with: a topic's delete drops its queues before
    # its name is free, so a queue listed after is of that incarnation or an older one (never a newer).
    starts = {topic: store.topics.start_of(topic) for topic, _ in list(store.queues.queues)}
    found = []
    for (topic, queue_id), cq in list(store.queues.queues.items()):
        if topic in LOCAL_ONLY_TOPICS or starts.get(topic) is None:
            continue  # kept local; a topic deleted, or created since the incarnations were read (the next pass)
        for file in list(cq.files.segments)[:-1]:
            if cq.flushed_offset * cq_unit.ENTRY_SIZE < file.end:
                break
            first, end = file.start // cq_unit.ENTRY_SIZE, file.end // cq_unit.ENTRY_SIZE
            found.append(SealedQueueFile(topic, queue_id, SealedSegment(file.start, file.size, _reader(file.path),
                                                                        file.path),
                                         lambda cq=cq, first=first, end=end: _log_span(cq, first, end),
                                         starts[topic]))
    return found


def queue_min(store, topic: str, queue_id: int) -> int | None:
    """The queue's minimum offset (the total retention's), None when the store has no such queue."""
    cq = store.queues.get(topic, queue_id)
    return cq.min_offset if cq is not None else None


def _log_span(cq, first: int, end: int) -> tuple[int, int] | None:
    """[first record's physical offset, last record's end) of entries [first, end): blanks form a prefix."""
    try:
        lo, hi = first, end
        while lo < hi:  # the first entry that is not a blank
            mid = (lo + hi) // 2
            if cq.entry(mid)[1] == cq_unit.BLANK_SIZE_FIELD:
                lo = mid + 1
            else:
                hi = mid
        if lo == end:
            return 0, 0
        last_phys, last_size, _ = cq.entry(end - 1)
        return cq.entry(lo)[0], last_phys + last_size
    except OutOfRange:  # SegmentClosed included: a file closed by a topic's delete meanwhile
        return None


def _reader(path) -> Callable[[], bytes]:
    def read() -> bytes:
        with open(path, "rb") as source:
            return source.read()
    return read
