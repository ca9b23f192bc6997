"""Reads of commit log bytes that are only in the object storage tier (issue 36): a segment deleted locally by
local retention (mqstore.tier.local_retention) is read from its FINISHED object (the ledger maps the segment's
base to the object's key), so Pull and GetMessage(s) serve it as if it were local (CommitLog.read's
``remote``). The records read are checked by the caller exactly as local ones (CRC, length, own offset).

- **Read-ahead**: a read GETs whole aligned blocks of ``read_ahead_bytes`` of the object (the last one of an
  object shorter), so the requested span is rounded up to blocks and the next reads of a consumer are hits.
- **Cache**: the blocks read, least recently used evicted first, at most ``cache_bytes`` in all (0: none kept;
  a read still GETs whole blocks, each used once).
- **Deadline and isolation**: every GET runs on the tier's own executor with its deadline (ObjectStore; a
  ``file://`` tier's on the caller's thread, a directory of this machine read as local files are); a
  failure, a stalled store or a segment with no FINISHED upload is Unavailable naming the tier URL, and the
  caller's thread says it waits (mqstore.waits), so a capped gRPC pool runs local reads meanwhile.
- **Below the logical log**: an offset below ``floor()`` (the logical log's start: the total retention moved
  past it and the tier's retention deletes its object, mqstore.tier.uploader) is OutOfRange, as expired local
  data is, never Unavailable.
- **Counters** (mqstore.tier.status): ``fetched_bytes`` and ``gets``, ``fetch_errors`` (reads that failed:
  Unavailable or DataLoss), of every kind of file; of which a topic's consume queue files'
  ``queue_fetched_bytes[topic]`` and ``queue_fetch_errors[topic]``; the cache's ``hits`` and ``misses``.
- **Consume queue files** (:meth:`TierReader.read_queue_file`): entries of a queue's file only in the tier are read
  the same way from its FINISHED object (``queue_file(topic, queue id, file base)``: the ledger's), blocks,
  cache, deadline and errors as above (a file with no FINISHED upload is Unavailable); mqstore.queue.consume_queue
  reads below its first local file through it, then the records as above.
- **Other objects** (:meth:`TierReader.read_object`): compaction log segments (mqstore.compaction.tier) are read the
  same way from their manifest entry.
- **Short objects**: a block shorter than the recorded segment size says it must be is DataLoss naming the
  object and the tier; nothing of it is served.

Thread-safety: thread-safe; the cache under its own lock, never held during a GET.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

from mqstore import waits
from mqstore.errors import DataLoss, NotFound, OutOfRange, Unavailable
from mqstore.format.tier_upload import CONSUME_QUEUE, Upload
from mqstore.tier.objects import ObjectStore

FinishedUpload = Callable[[int], Upload | None]  # segment base -> its FINISHED upload, None when none
QueueFileUpload = Callable[[str, int, int], Upload | None]  # (topic, queue id, file base) -> its FINISHED upload


class BlockCache:
    """(key, block index) -> bytes, least recently used evicted beyond ``limit_bytes``. Thread-safe."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._blocks: collections.OrderedDict[tuple[str, int], bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> bytes | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                self.misses += 1
                return None
            self._blocks.move_to_end(key)
            self.hits += 1
            return block

    def put(self, key: tuple[str, int], block: bytes) -> None:
        if len(block) > self.limit_bytes:
            return
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self.bytes -= len(old)
            self._blocks[key] = block
            self.bytes += len(block)
            while self.bytes > self.limit_bytes:
                _, evicted = self._blocks.popitem(last=False)
                self.bytes -= len(evicted)

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)


class TierReader:
    def __init__(self, objects: ObjectStore, finished: FinishedUpload, segment_size: int, *,
                 read_ahead_bytes: int, cache_bytes: int, floor: Callable[[], int] | None = None,
                 queue_file: QueueFileUpload | None = None):
        self.objects = objects
        self.finished = finished
        self.segment_size = segment_size
        self.read_ahead_bytes = read_ahead_bytes
        self.cache = BlockCache(cache_bytes)
        self.fetched_bytes = 0  # bytes GET from the tier (tests, bench)
        self.gets = 0
        self.fetch_errors = 0
        self.queue_fetched_bytes: dict[str, int] = {}  # topic -> of fetched_bytes, its consume queue files'
        self.queue_fetch_errors: dict[str, int] = {}  # topic -> of fetch_errors, reads of its consume queue files
        self.floor = floor
        self.queue_file = queue_file

    def read(self, physical_offset: int, size: int) -> bytes:
        """``size`` bytes of the log from ``physical_offset`` (inside one segment, as every record is)."""
        floor = self.floor() if self.floor is not None else 0
        if physical_offset < floor:
            raise OutOfRange(f"physical offset {physical_offset} is below the log's start {floor} (past the total "
                             f"retention; the tier's copy is deleted)", min_value=floor)
        try:
            return self._read(physical_offset, size)
        except (Unavailable, DataLoss):
            self.fetch_errors += 1
            raise

    def read_queue_file(self, topic: str, queue_id: int, file_size: int, byte_at: int, size: int) -> bytes:
        """``size`` bytes of consume queue ``topic``/``queue_id`` from ``byte_at`` (inside one file of
        ``file_size`` bytes) from the file's FINISHED object."""
        base = byte_at - byte_at % file_size
        upload = self.queue_file(topic, queue_id, base) if self.queue_file is not None else None
        try:
            if upload is None:
                raise Unavailable(f"object storage tier {self.objects.url}: consume queue {topic}/{queue_id}'s file "
                                  f"at byte {base} is not local and has no FINISHED upload (yet); retry")
            return self._read_object(upload, byte_at - base, size)
        except (Unavailable, DataLoss):
            self.fetch_errors += 1
            self.queue_fetch_errors[topic] = self.queue_fetch_errors.get(topic, 0) + 1
            raise

    def read_object(self, upload, position: int, size: int) -> bytes:
        """``size`` bytes from byte ``position`` of ``upload``'s object (anything with ``key``, ``segment_size``
        and ``segment_base``: a compaction log segment's manifest entry, mqstore.compaction.tier), fewer at its
        end; the same blocks, cache, deadline and errors as a segment's."""
        try:
            return self._read_object(upload, position, size)
        except (Unavailable, DataLoss):
            self.fetch_errors += 1
            raise

    def _read(self, physical_offset: int, size: int) -> bytes:
        base = physical_offset - physical_offset % self.segment_size
        upload = self.finished(base)
        if upload is None:
            raise Unavailable(f"object storage tier {self.objects.url}: the segment at physical offset {base} is "
                              f"not in the local log and has no FINISHED upload (yet); retry")
        return self._read_object(upload, physical_offset - base, size)

    def _read_object(self, upload: Upload, position: int, size: int) -> bytes:
        end = min(position + size, upload.segment_size)
        block = self.read_ahead_bytes
        pieces = [self._block(upload, index)[max(position - index * block, 0):end - index * block]
                  for index in range(position // block, max(end - 1, position) // block + 1)]
        return b"".join(pieces)

    def _block(self, upload: Upload, index: int) -> bytes:
        cached = self.cache.get((upload.key, index))
        if cached is not None:
            return cached
        start = index * self.read_ahead_bytes
        want = min(self.read_ahead_bytes, upload.segment_size - start)
        try:
            with waits.waiting():  # a capped handler pool runs other calls (local reads) meanwhile
                data = self.objects.get_range(upload.key, start, want)
        except NotFound:
            raise DataLoss(f"object storage tier {self.objects.url}: object {upload.key} of the FINISHED upload of "
                           f"segment {upload.segment_base} is gone; its records are not served") from None
        self.gets += 1
        self.fetched_bytes += len(data)
        if upload.kind == CONSUME_QUEUE:
            self.queue_fetched_bytes[upload.topic] = self.queue_fetched_bytes.get(upload.topic, 0) + len(data)
        if len(data) != want:
            raise DataLoss(f"object storage tier {self.objects.url}: object {upload.key} is short: {len(data)} bytes "
                           f"at {start} where its upload recorded {want} (a torn object); nothing of it is served")
        self.cache.put((upload.key, index), data)
        return data
