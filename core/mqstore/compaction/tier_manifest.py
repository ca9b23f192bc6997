"""The manifest of one compactor instance's compaction segments in the object storage tier (mqstore.compaction.tier's
module docstring, *Metadata*): ``<root>/manifest/<seq:020d>.json``, each version a new object written with
put-if-absent, the newest one the truth, the one before it kept, older ones deleted; a writer that finds a newer
version than its own is fenced (FailedPrecondition: two processes run with one instance id).

Thread-safety: ``_lock`` guards the version and the entries (replaced whole after each durable write); one
thread writes (the tier's duty), any reads.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from dataclasses import dataclass
from typing import ClassVar

from mqstore.errors import AlreadyExists, FailedPrecondition
from mqstore.tier.objects import ObjectStore, read_whole

VERSION = 1
STARTED, FINISHED = "STARTED", "FINISHED"
_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class TieredSegment:
    """One manifest entry (the module docstring). ``segment_base``/``segment_size`` as TierReader reads them."""

    topic: str
    queue_id: int
    segment_base: int
    key: str
    segment_size: int
    sha256: str
    index_sha256: str
    state: str
    # TierReader reads ``kind`` to count a consume queue file's fetches per topic; a compaction segment is
    # neither kind of the commit log's uploads (mqstore.format.tier_upload), so it counts in the totals only
    kind: ClassVar[int] = 0

    @property
    def where(self) -> tuple[str, int, int]:
        return (self.topic, self.queue_id, self.segment_base)


def topic_part(topic: str) -> str:
    return topic if _SAFE.match(topic) else "x" + topic.encode().hex()


class Manifest:
    def __init__(self, writes: ObjectStore, reads: ObjectStore, root: str):
        self.writes, self.reads, self.root, self.url = writes, reads, root, writes.url
        self._lock = threading.Lock()
        self._seq, self._segments = 0, {}
        self.loaded = False  # read from the tier (an empty manifest until then)

    def _key(self, seq: int) -> str:
        return f"{self.root}/manifest/{seq:020d}.json"

    def load(self) -> None:
        """Read the newest version (Unavailable when the tier does not answer: nothing changes)."""
        # (the reads' store: its deadline is the read timeout, so a stalled tier delays a start by that only)
        versions = sorted(info.key for info in self.reads.list(f"{self.root}/manifest"))
        seq, segments = 0, {}
        if versions:
            body = json.loads(read_whole(self.reads, versions[-1]))
            if body.get("version") != VERSION:
                raise FailedPrecondition(f"{self.url}/{versions[-1]}: manifest version {body.get('version')!r}, "
                                         f"this build reads {VERSION}")
            for old in versions[:-2]:  # (a crash between a write and the delete of the older one)
                self.writes.delete(old)
            for raw in body["segments"]:
                entry = TieredSegment(**raw)
                segments[entry.where] = entry
            seq = int(body["seq"])
        with self._lock:
            self._seq, self._segments, self.loaded = seq, segments, True

    def save(self, segments: dict[tuple, TieredSegment]) -> None:
        """Write the next version (put-if-absent), then adopt ``segments``; called by the one writer thread."""
        seq = self._seq + 1
        body = {"version": VERSION, "seq": seq,
                "segments": [dataclasses.asdict(s) for _, s in sorted(segments.items())]}
        try:
            self.writes.put_if_absent(self._key(seq), json.dumps(body, indent=1).encode())
        except AlreadyExists:
            self._fenced(self._key(seq))
        self.check_newest(seq)  # (a version deleted since is written again, but the newer ones say who writes)
        with self._lock:
            self._seq, self._segments = seq, segments
        if seq > 2:
            self.writes.delete(self._key(seq - 2))

    def check_newest(self, seq: int | None = None) -> None:
        """FailedPrecondition unless version ``seq`` (default: the one read or written last) is the newest:
        another process writes this instance's manifest (before a pass deletes anything, and after each write)."""
        mine = self._key(self._seq if seq is None else seq)
        newer = [i.key for i in self.writes.list(f"{self.root}/manifest") if i.key > mine]
        if newer:
            self._fenced(newer[-1])

    def _fenced(self, key: str) -> None:
        raise FailedPrecondition(f"manifest version {key} of {self.url} was written by another process: two "
                                 f"compactors run with one instance id (give each its own --instance-id); this "
                                 f"one stops uploading and deleting")

    def segments(self) -> dict[tuple, TieredSegment]:
        """(topic, queue id, base) -> entry, a copy."""
        with self._lock:
            return dict(self._segments)

    def finished(self, topic: str, queue_id: int, base: int) -> TieredSegment | None:
        with self._lock:
            entry = self._segments.get((topic, queue_id, base))
        return entry if entry is not None and entry.state == FINISHED else None
