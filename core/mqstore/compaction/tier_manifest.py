"""The manifest of one compactor instance's compaction segments in the object storage tier (mqstore.compaction.tier's
module docstring, *Metadata*), kept as changes on top of snapshots so that a change writes the entries it
changes, not every entry. Every object is new (put-if-absent, S3's ``If-None-Match: *``) and never overwritten:

  key (under <root>/manifest/)   body (JSON)
  ------------------------------ -------------------------------------------------------------------------------
  <seq:020d>.json                change ``seq``: {"version": 2, "seq", "kind": "delta", "put": [entries added
                                 or replaced], "drop": [[topic, queue id, base] of entries removed]}. The put of
                                 ``seq`` is the fence: two writers of one instance cannot both write it, and a
                                 writer that lists a newer seq than its own stops (FailedPrecondition)
  <seq:020d>.snapshot.json       every entry after change ``seq``: {"version": 2, "seq", "kind": "snapshot",
                                 "segments": [entries]}, written by the writer of change ``seq`` after it
  <seq:020d>.json, version 1     the whole-manifest versions before (every entry, as a snapshot's
                                 "segments"): read once, as the base of the changes after it (upgrade)

**A load** lists the prefix, reads the newest snapshot and then every change after it in order (a missing one
is DataLoss); with no snapshot, the changes from the oldest listed one (a version 1 object is a whole state).
**A snapshot** is written once the changes since the last one number ``max_deltas``, or ``delta_size_factor``
times its bytes (and at least ``min_deltas``); then every object of a seq below the snapshot before it is
deleted (so a load that listed before the new snapshot still finds its chain). A crash between a snapshot and
those deletes leaves objects a later snapshot or load deletes (``compaction.tier_manifest.snapshot_written``).
Nothing is torn: an object is put whole or not at all. **A put that reported an error may have landed**
(pulsar#17228): the next save reads the object back first, takes it as written when it holds exactly the bytes
put, writes the seq again when there is none, and stops (FailedPrecondition) when it holds other bytes.

Thread-safety: ``_lock`` guards the seq and the entries (replaced whole after each durable write); one
thread writes (the tier's duty), any reads.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import threading
from dataclasses import dataclass
from typing import ClassVar

from mqstore import failpoints
from mqstore.errors import AlreadyExists, DataLoss, FailedPrecondition, Unavailable
from mqstore.tier.objects import READ_CHUNK_BYTES, ObjectInfo, ObjectStore, read_whole

VERSION = 2
OLD_VERSION = 1  # the whole-manifest versions (read as a snapshot)
LOAD_WORKERS = 4  # a load's reads of the changes in flight at once (mqstore.compaction.tier.READ_WORKERS)
STARTED, FINISHED = "STARTED", "FINISHED"
_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")
_ABSENT = object()
_NAME = re.compile(r"/manifest/(\d{20})(\.snapshot)?\.json$")


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
    max_deltas = 32  # a snapshot after this many changes (a load reads at most this many objects and one)
    min_deltas = 8
    delta_size_factor = 1  # or once the changes' bytes reach this many times the snapshot's

    def __init__(self, writes: ObjectStore, reads: ObjectStore, root: str):
        self.writes, self.reads, self.root, self.url = writes, reads, root, writes.url
        self._lock = threading.Lock()
        self._seq, self._segments = 0, {}
        self.loaded = False  # read from the tier (an empty manifest until then)
        self._snapshots: list[int] = []  # seqs of the snapshots known to exist, oldest first
        self._snapshot_bytes = 0  # the newest one's
        self._deltas = self._delta_bytes = 0  # the changes since it (all of them while there is none)
        self._whole = False  # the state came from a version 1 object: the next change writes a snapshot too
        self._unsure: tuple[int, bytes, dict] | None = None  # (seq, bytes, entries) of a put that reported an error

    def _key(self, seq: int, snapshot: bool = False) -> str:
        return f"{self.root}/manifest/{seq:020d}{'.snapshot' if snapshot else ''}.json"

    def _listed(self, store: ObjectStore) -> tuple[dict[int, ObjectInfo], dict[int, ObjectInfo]]:
        """(changes, snapshots): seq -> every object under the prefix."""
        changes, snapshots = {}, {}
        for info in store.list(f"{self.root}/manifest"):
            match = _NAME.search(info.key)
            if match is not None:
                (snapshots if match.group(2) else changes)[int(match.group(1))] = info
        return changes, snapshots

    def _read(self, info: ObjectInfo) -> bytes:
        """One listed object: one ranged GET of its listed size (two requests and more above a chunk)."""
        if info.size > READ_CHUNK_BYTES:
            return read_whole(self.reads, info.key)
        data = self.reads.get_range(info.key, 0, info.size)
        if len(data) != info.size:
            raise Unavailable(f"object storage tier {self.url}: {info.key} gave {len(data)} bytes, its listed size "
                              f"is {info.size}")
        return data

    def load(self) -> None:
        """Read the newest snapshot and the changes after it (Unavailable when the tier does not answer:
        nothing changes; DataLoss when a change of the chain is missing)."""
        # (the reads' store: its deadline is the read timeout, so a stalled tier delays a start by that only)
        changes, snapshots = self._listed(self.reads)
        newest = max([*changes, *snapshots], default=0)
        base = max((s for s in snapshots if s <= newest), default=None)
        segments, whole, snapshot_bytes, delta_bytes = {}, False, 0, 0
        if base is not None:
            data = self._read(snapshots[base])
            segments = self._entries(self._body(data, snapshots[base].key, "snapshot")["segments"])
            snapshot_bytes = len(data)
        first = base + 1 if base is not None else min(changes, default=1)
        chain = range(first, newest + 1)
        missing = [seq for seq in chain if seq not in changes]
        if missing:
            raise DataLoss(f"{self.url}: manifest change {self._key(missing[0])} is missing (the chain runs from "
                           f"{self._key(first)} to {self._key(newest)}): the manifest cannot be read")
        with concurrent.futures.ThreadPoolExecutor(LOAD_WORKERS, thread_name_prefix="tier-manifest") as pool:
            bodies = list(pool.map(lambda seq: self._read(changes[seq]), chain))  # (the reads' workers bound it)
        for seq, data in zip(chain, bodies, strict=True):
            body = self._body(data, changes[seq].key, "delta")
            if body["version"] == OLD_VERSION:
                segments, whole = self._entries(body["segments"]), True
                continue
            if base is None and seq == first != 1:
                raise DataLoss(f"{self.url}: manifest change {changes[seq]} has no snapshot or change before it")
            delta_bytes += len(data)
            _apply(segments, body)
        kept = sorted(snapshots)[-2] if len(snapshots) > 1 else None
        self._delete_below(kept, changes, snapshots)  # (a crash between a snapshot and these deletes)
        with self._lock:
            self._seq, self._segments, self.loaded = newest, segments, True
        self._snapshots = sorted(s for s in snapshots if kept is None or s >= kept)
        self._snapshot_bytes, self._whole = snapshot_bytes, whole
        self._deltas, self._delta_bytes = newest - (base or 0), delta_bytes

    def _body(self, data: bytes, key: str, kind: str) -> dict:
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise DataLoss(f"{self.url}/{key} is not valid JSON ({exc})") from None
        if body.get("version") == OLD_VERSION and kind == "delta":
            return body
        if body.get("version") != VERSION:
            raise FailedPrecondition(f"{self.url}/{key}: manifest version {body.get('version')!r}, this build "
                                     f"reads {VERSION} (and {OLD_VERSION})")
        if body.get("kind") != kind or int(body["seq"]) != int(_NAME.search(key).group(1)):
            raise DataLoss(f"{self.url}/{key}: a {body.get('kind')} of seq {body.get('seq')}, not a {kind} of "
                           f"its key's seq")
        return body

    @staticmethod
    def _entries(raw: list[dict]) -> dict[tuple, TieredSegment]:
        entries = (TieredSegment(**item) for item in raw)
        return {entry.where: entry for entry in entries}

    def save(self, segments: dict[tuple, TieredSegment]) -> None:
        """Write the change from the current entries to ``segments`` (put-if-absent), then adopt them, then a
        snapshot when due; called by the one writer thread."""
        self._settle_unsure()
        seq, before = self._seq + 1, self.segments()
        put = sorted((w, s) for w, s in segments.items() if before.get(w, _ABSENT) is not s and before.get(w) != s)
        body = {"version": VERSION, "seq": seq, "kind": "delta", "put": [_raw(s) for _, s in put],
                "drop": [list(w) for w in sorted(w for w in before if w not in segments)]}
        data = _encoded(body)
        try:
            self.writes.put_if_absent(self._key(seq), data)
        except AlreadyExists:
            self._fenced(self._key(seq))
        except BaseException:
            self._unsure = (seq, data, dict(segments))  # it may have landed (pulsar#17228): the next save looks
            raise
        self._adopt(seq, segments, data)

    def _settle_unsure(self) -> None:
        """After a put of change ``seq`` that reported an error: if the object holds exactly the bytes put, the
        put landed and the change is adopted; if there is none, nothing landed; other bytes are another writer's
        (FailedPrecondition). Unavailable (nothing decided) while the tier does not answer."""
        if self._unsure is None:
            return
        seq, data, segments = self._unsure
        key = self._key(seq)
        size = self.writes.size(key)
        if size is None:
            self._unsure = None
            return
        if size != len(data) or (read_whole(self.writes, key) if size > READ_CHUNK_BYTES
                                 else self.writes.get_range(key, 0, size)) != data:
            self._fenced(key)
        self._unsure = None
        self._adopt(seq, segments, data)

    def _adopt(self, seq: int, segments: dict[tuple, TieredSegment], data: bytes) -> None:
        """Change ``seq`` (``data``, making ``segments``) is durable: take it as the state, then a snapshot when due."""
        self.check_newest(seq)  # (a change deleted since is written again, but the newer ones say who writes)
        with self._lock:
            self._seq, self._segments = seq, dict(segments)
        self._deltas += 1
        self._delta_bytes += len(data)
        if self._whole or self._deltas >= self.max_deltas or (
                self._deltas >= self.min_deltas and self._delta_bytes >= self.delta_size_factor * self._snapshot_bytes):
            self._snapshot(seq, segments)

    def _snapshot(self, seq: int, segments: dict[tuple, TieredSegment]) -> None:
        body = {"version": VERSION, "seq": seq, "kind": "snapshot",
                "segments": [_raw(s) for _, s in sorted(segments.items())]}
        data = _encoded(body)
        try:
            self.writes.put_if_absent(self._key(seq, snapshot=True), data)
        except AlreadyExists:
            self._fenced(self._key(seq, snapshot=True))
        failpoints.hit("compaction.tier_manifest.snapshot_written")
        self._snapshot_bytes, self._whole, self._deltas, self._delta_bytes = len(data), False, 0, 0
        previous = self._snapshots[-1] if self._snapshots else None
        self._snapshots = [s for s in (previous, seq) if s is not None]
        self._delete_below(previous, *self._listed(self.writes))

    def _delete_below(self, seq: int | None, changes: dict[int, ObjectInfo], snapshots: dict[int, ObjectInfo]) -> None:
        """Delete every object of a seq below ``seq`` (None: nothing)."""
        if seq is None:
            return
        for info in [i for s, i in changes.items() if s < seq] + [i for s, i in snapshots.items() if s < seq]:
            self.writes.delete(info.key)

    def check_newest(self, seq: int | None = None) -> None:
        """FailedPrecondition unless change ``seq`` (default: the one read or written last) is the newest:
        another process writes this instance's manifest (before a pass deletes anything, and after each write)."""
        mine = self._seq if seq is None else seq
        changes, snapshots = self._listed(self.writes)
        newer = max((s for s in [*changes, *snapshots] if s > mine), default=None)
        if newer is not None:
            self._fenced((changes.get(newer) or snapshots[newer]).key)

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


def _apply(segments: dict[tuple, TieredSegment], body: dict) -> None:
    """One change (a delta body) applied to ``segments`` in place."""
    for raw in body["drop"]:
        segments.pop(tuple(raw), None)
    for raw in body["put"]:
        entry = TieredSegment(**raw)
        segments[entry.where] = entry


_FIELDS = tuple(f.name for f in dataclasses.fields(TieredSegment))


def _raw(entry: TieredSegment) -> dict:
    return {name: getattr(entry, name) for name in _FIELDS}


def _encoded(body: dict) -> bytes:
    """Compact JSON (json's C encoder; ``indent`` would take its pure-Python one, ~5x the CPU of a snapshot)."""
    return json.dumps(body, separators=(",", ":")).encode()
