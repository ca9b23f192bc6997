"""The one round writer: both engines (local, Spark) hand it the surviving records in log order and
get byte-identical files (positions, PHYSICALOFFSET, blank records and padding, the sparse index).

Output segments are numbered from ``start`` (the base of the first sealed segment a round rewrites;
the ones below it are kept, and RocketMQ's and the former rounds' start of 0 is the case of none kept);
each is sealed (a blank record, then zeros to ``segment_size_bytes``), so it never collides with the
active segment: a subsequence of the input packs into no more segments than the input (the greedy
packing of a subsequence never ends a segment earlier), and the input's sealed segments all lie below
the active one.

Memory: one segment's bytes at a time. The manifest lists every output file with its size and CRC32
and a SHA-256 digest over them all, and ``rewritten_from`` (``start``: the sealed segments from there on
are the ones the output replaces); the Spark job writes it, the compactor checks it before install.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import zlib

from mqstore.errors import invariant
from mqstore.format import compaction_segment as cseg, record, sparse_queue
from mqstore.format.sparse_queue import SparseEntry

from .qlog import STATE, Entries

MANIFEST = "round.manifest"


class RoundWriter:
    """Not thread-safe: one round's output, in ``staging`` (created empty by the caller)."""

    def __init__(self, staging: pathlib.Path, segment_size_bytes: int, start: int = 0):
        self.staging, self.segment_size, self.start = staging, segment_size_bytes, start
        self.entries = Entries()
        self.files: list[pathlib.Path] = []
        self._position = start
        self._log = bytearray()
        self._cq = bytearray()

    def add(self, raw, queue_offset: int, tag_code: int, store_timestamp_ms: int, tombstone_seen_ms: int) -> None:
        size = len(raw)
        if not cseg.fits(self._position, size, self.segment_size):
            self._seal()
        entry = SparseEntry(self._position, size, tag_code, store_timestamp_ms, queue_offset, tombstone_seen_ms)
        self._log += cseg.relocate(raw, self._position)
        self._cq += sparse_queue.encode(entry)
        self.entries.add(entry)
        self._position += size

    @property
    def position(self) -> int:
        """Where the next record goes."""
        return self._position

    def room(self) -> int:
        """The bytes of records the current segment still takes (its blank record's room kept): :meth:`add`
        puts a record of at most this size here, a larger one in the next segment."""
        return self.segment_size - self._position % self.segment_size - record.BLANK_SIZE

    def add_relocated(self, log, cq, columns: dict) -> None:
        """The bulk form of :meth:`add`, for a caller that packs and relocates records itself (the Spark job's
        driver, on numpy columns): ``log`` the records' bytes, relocated to :attr:`position` on and at most
        :meth:`room` long, ``cq`` their encoded index entries, ``columns`` the entries' columns as native
        machine-order bytes, by Entries' names (offsets, positions, store_ms, sizes, tags, seen). The files
        are the same as :meth:`add` of each record would write."""
        invariant(len(log) <= self.room(), f"{len(log)} bytes of records fit in the segment at {self._position}")
        self._log += log
        self._cq += cq
        for name, data in columns.items():
            getattr(self.entries, name).frombytes(data)
        self._position += len(log)

    def seal(self) -> None:
        """End the current segment (a blank record, then zeros): the next record goes into the next one."""
        self._seal()

    def _seal(self) -> None:
        base = cseg.segment_base(self._position, self.segment_size)
        if self._position == base:
            return  # nothing in this segment
        self._log += cseg.blank_for(self._position, self.segment_size)
        self._log += bytes(self.segment_size - len(self._log))
        self._write(cseg.log_name(base), self._log)
        self._write(cseg.index_name(base), self._cq)
        self._log, self._cq = bytearray(), bytearray()
        self._position = base + self.segment_size

    def _write(self, name: str, data) -> None:
        path = self.staging / name
        with open(path, "wb") as f:
            f.write(data)
        self.files.append(path)

    def finish(self, state: dict) -> tuple[list[pathlib.Path], dict]:
        """Seal the last segment, write the round state; the staged files and the manifest."""
        self._seal()
        self._write(STATE, json.dumps(state, sort_keys=True).encode())
        return list(self.files), {**manifest_of(self.files), "rewritten_from": self.start}


def manifest_of(files: list[pathlib.Path]) -> dict:
    outputs, digest = [], hashlib.sha256()
    for path in files:
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + data)
        outputs.append({"name": path.name, "size": len(data), "crc32": zlib.crc32(data)})
    return {"version": 1, "outputs": outputs, "digest": digest.hexdigest()}


def write_manifest(staging: pathlib.Path, manifest: dict) -> None:
    with open(staging / MANIFEST, "w") as f:
        json.dump(manifest, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
