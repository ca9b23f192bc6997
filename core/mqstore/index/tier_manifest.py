"""The index directory's record of which tier object holds which compact file: an append-only log of fixed,
checksummed records on top of a snapshot (layout: mqstore.format.tier_manifest_log), so a change costs one
112-byte append and its fsync whatever the number of tiered files, not a rewrite of every entry.

  file                     what
  ------------------------ ------------------------------------------------------------------------------
  tier-manifest.snapshot   the whole manifest at one seq, and the tier URL the objects are on (a start with
                           another URL, or none, while files are on the tier is refused); replaced whole
                           (mqstore.fs.replace_file)
  tier-manifest.log        the changes after it, each appended and fsynced before it is relied on
  tier-manifest.json       the whole-file manifest of the versions before: read once (upgrade), then a
                           snapshot of it is written and it is deleted

The state: ``started`` {file name: object key}, a move's attempt (STARTED): its object may or may not exist
and is not trusted, the local file is still there; ``finished`` {file name: TierFile}, the file lives on the
tier (FINISHED): the object was read back and verified; its ``header`` (the compact file's 64-byte header) lets
a start open tier files without calling the tier. A file name is ``<first physical offset:020d>.cidx``; an
object key ``index/<file name>.<attempt id>`` (mqstore.index.tier). Every object under ``index/`` that
``finished`` does not name is an orphan (an attempt that never finished, or a file deleted by retention whose
object delete did not happen) and is deleted by lifecycle.tidy_tier.

**Compaction** (:meth:`TierManifest._compact`): once the log holds ``max_log_records`` records, or
``log_size_factor`` times the snapshot's bytes (and at least ``min_log_records``), the state is written as a
new snapshot at the last seq, then the log is truncated. Amortised, a change writes ~112 / factor bytes of
snapshot; a start reads at most the snapshot and ``max_log_records`` records.

**Recovery** (:meth:`TierManifest.load`, then :meth:`TierManifest.settle` by the index's start):

  found                                    meaning                                   action
  ---------------------------------------- ----------------------------------------- ------------------------
  a torn tail in the log                   a crash during an append (the change was   cut (logged), never
                                           not relied on: its fsync had not returned) served
  a record that checks after one that      damage                                    DataLoss: the start stops
  does not, a gap in the seqs
  records of seq <= the snapshot's         a crash between a snapshot and the log's  skipped; the log is
                                           truncation                                truncated
  tier-manifest.json and no snapshot       the manifest of a version before          read; a snapshot of it
                                                                                     written, then it goes
  tier-manifest.json and a snapshot        a crash during the upgrade                the snapshot; it goes
  tier-manifest.snapshot.tmp               a crash before a snapshot's rename        deleted (mqstore.fs)

Thread-safety: none; the IndexStore's maintenance lock is held for every read and change (a reader in another
thread or process may call :meth:`load`, which writes nothing).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from dataclasses import dataclass, field

import structlog

from mqstore import failpoints, fs
from mqstore.errors import DataLoss, FailedPrecondition
from mqstore.format import compact_index
from mqstore.format import tier_manifest_log as L

from .tier import PREFIX

log = structlog.get_logger("index.tier_manifest")

SNAPSHOT_NAME = "tier-manifest.snapshot"
LOG_NAME = "tier-manifest.log"
OLD_NAME = "tier-manifest.json"  # the whole-file manifest before the log: read once, for the upgrade
OLD_VERSION = 1
_KEY = re.compile(rf"^{PREFIX}/(\d{{20}})\.cidx\.([0-9a-f]{{32}})$")  # (IndexTier.new_key's keys)


@dataclass(frozen=True, slots=True)
class TierFile:
    key: str
    size: int
    header: compact_index.CompactHeader


class _HeaderBytes:
    """A RangeReader over the recorded header, so compact_index.read_header checks its CRC and size."""

    def __init__(self, name: str, data: bytes, size_bytes: int):
        self.name, self._data, self.size_bytes = name, data, size_bytes

    def read(self, position: int, length_bytes: int) -> bytes:
        return self._data[position:position + length_bytes]


def _name(first: int) -> str:
    return f"{first:020d}.cidx"


def _key(first: int, attempt: bytes) -> str:
    return f"{PREFIX}/{_name(first)}.{attempt.hex()}"


def _split(name: str, key: str, where: str) -> tuple[int, bytes]:
    """(first physical offset, attempt id) of an object key; DataLoss when it is not the index's."""
    match = _KEY.match(key)
    if match is None or f"{match.group(1)}.cidx" != name:
        raise DataLoss(f"{where}: the object key {key!r} of {name} is not index/<file name>.<32 hex digits>; "
                       f"to rebuild, stop the index, delete its directory and start it again")
    return int(match.group(1)), bytes.fromhex(match.group(2))


def _tier_file(first: int, record: L.Record, where: str) -> TierFile:
    """The FINISHED record's entry; its header checked (CRC, and the size it states against the record's)."""
    header = compact_index.read_header(_HeaderBytes(f"{where}: {_name(first)}", record.header, record.size))
    return TierFile(_key(first, record.attempt), record.size, header)


@dataclass
class TierManifest:
    directory: pathlib.Path
    url: str = ""
    started: dict[str, str] = field(default_factory=dict)
    finished: dict[str, TierFile] = field(default_factory=dict)
    seq: int = 0  # the last change applied
    max_log_records: int = 4096  # compaction (the module docstring)
    min_log_records: int = 64
    log_size_factor: int = 2
    _snapshot: tuple[int, str, int] | None = None  # (seq, url, bytes) of the snapshot on disk; None: none yet
    _log_records: int = 0  # records in the log's valid prefix (stale ones too)
    _log_bytes: int = 0  # its length
    _torn: bool = False  # bytes after the valid prefix: cut before the next append
    _stale: bool = False  # records the snapshot holds: truncate before the next append
    _old_left: bool = False  # tier-manifest.json to delete once a snapshot holds its state

    @classmethod
    def load(cls, directory: pathlib.Path, url: str) -> TierManifest:
        """The manifest of ``directory`` for a tier at ``url`` ("" = no tier): FailedPrecondition when files
        live on another tier (or on one while none is configured); DataLoss when its files are damaged.
        Writes nothing (:meth:`settle` repairs what a crash left)."""
        manifest = cls(directory)
        manifest._read_base()
        manifest._read_log()
        if manifest.url != url and (manifest.finished or manifest.started):
            where = directory / (SNAPSHOT_NAME if manifest._snapshot else OLD_NAME)
            raise FailedPrecondition(
                f"{len(manifest.finished)} index files are on the tier {manifest.url} ({where}), but the index was "
                f"started with {'--tier-url ' + url if url else 'no tier'}: start it with --tier-url {manifest.url}")
        manifest.url = url
        return manifest

    def _read_base(self) -> None:
        path = self.directory / SNAPSHOT_NAME
        self._old_left = (self.directory / OLD_NAME).exists()
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            if self._old_left:
                self._read_old()
            return
        snapshot = L.decode_snapshot(data, str(path))
        self.url, self.seq, self._snapshot = snapshot.url, snapshot.seq, (snapshot.seq, snapshot.url, len(data))
        for record in snapshot.records:  # a state, not changes: a FINISHED record ends no STARTED one here (a
            name = _name(record.first_phy_offset)  # file can be both: moved, then a new attempt of it begun)
            if record.kind == L.STARTED:
                self.started[name] = _key(record.first_phy_offset, record.attempt)
            else:
                self.finished[name] = _tier_file(record.first_phy_offset, record, str(path))

    def _read_old(self) -> None:
        path = self.directory / OLD_NAME
        try:
            raw = json.loads(path.read_bytes())
        except ValueError as exc:
            raise DataLoss(f"{path} is not valid JSON ({exc}); it names the index files on the tier: restore it, "
                           f"or remove the index directory to rebuild the index from the commit log") from None
        if raw.get("version") != OLD_VERSION:
            raise DataLoss(f"{path}: version {raw.get('version')!r}, this build reads {OLD_VERSION}")
        self.url = raw["url"]
        for name, key in raw["started"].items():
            _split(name, key, str(path))
            self.started[name] = key
        for name, entry in raw["finished"].items():
            _split(name, entry["key"], str(path))
            reader = _HeaderBytes(f"{path}: {name}", bytes.fromhex(entry["header"]), int(entry["size"]))
            self.finished[name] = TierFile(entry["key"], int(entry["size"]), compact_index.read_header(reader))

    def _read_log(self) -> None:
        path = self.directory / LOG_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        records, valid = L.decode_log(data, str(path))
        self._log_records, self._log_bytes, self._torn = len(records), valid, valid < len(data)
        if self._torn:
            log.warning("index.tier_manifest_torn_tail", path=str(path), cut_at=valid, size=len(data),
                        why="a crash during an append: the change was never relied on")
        previous = None
        for record in records:
            if previous is not None and record.seq != previous + 1:
                raise DataLoss(f"{path}: record seq {record.seq} after {previous}: damage, not a torn tail")
            previous = record.seq
            if record.seq <= self.seq:
                self._stale = True  # a crash between a snapshot and the log's truncation
                continue
            if record.seq != self.seq + 1:
                raise DataLoss(f"{path}: the log starts at seq {record.seq}, the snapshot holds up to {self.seq}: "
                               f"changes are missing")
            self._apply(record, str(path))
            self.seq = record.seq

    def _apply(self, record: L.Record, where: str) -> None:
        name = _name(record.first_phy_offset)
        if record.kind == L.STARTED:
            self.started[name] = _key(record.first_phy_offset, record.attempt)
        elif record.kind == L.FINISHED:
            self.started.pop(name, None)
            self.finished[name] = _tier_file(record.first_phy_offset, record, where)
        elif record.kind == L.DISCARDED:
            self.started.pop(name, None)
        else:
            self.finished.pop(name, None)

    # ---- changes (each durable before it returns) ------------------------------------------------------
    def start(self, name: str, key: str) -> None:
        """STARTED: the attempt ``key`` of the file ``name`` (before its put)."""
        first, attempt = _split(name, key, "a move")
        self._append([L.Record(L.STARTED, 0, first, attempt)])

    def finish(self, name: str, entry: TierFile) -> None:
        """FINISHED: the file lives on the tier (its STARTED attempt ends)."""
        first, attempt = _split(name, entry.key, "a move")
        self._append([L.Record(L.FINISHED, 0, first, attempt, entry.size, entry.header.encode())])

    def discard(self, name: str) -> None:
        """Forget the file's STARTED attempt."""
        self._append([L.Record(L.DISCARDED, 0, _first(name))])

    def discard_all(self) -> None:
        """Forget every STARTED attempt (one append)."""
        if self.started:
            self._append([L.Record(L.DISCARDED, 0, _first(name)) for name in sorted(self.started)])

    def forget(self, name: str) -> TierFile:
        """Forget the FINISHED file ``name`` (KeyError when it is not); its entry."""
        entry = self.finished[name]
        self._append([L.Record(L.FORGOTTEN, 0, _first(name))])
        return entry

    def keys(self) -> set[str]:
        """Every object key the manifest names (started or finished)."""
        return set(self.started.values()) | {f.key for f in self.finished.values()}

    # ---- the files ----------------------------------------------------------------------------------------
    def settle(self) -> None:
        """Repair what a crash left (the module docstring's table): the start calls it after :meth:`load`."""
        if self._old_left and self._snapshot is None:
            self._compact()  # the upgrade: the whole-file manifest's state as the first snapshot
        elif self._stale:
            self._truncate_log()
        elif self._torn:
            path = self.directory / LOG_NAME
            os.truncate(path, self._log_bytes)
            fs.fsync_file(path)
            self._torn = False
            log.warning("index.tier_manifest_torn_tail_cut", path=str(path), size=self._log_bytes)
        if self._old_left:
            (self.directory / OLD_NAME).unlink(missing_ok=True)
            fs.fsync_dir(self.directory)
            self._old_left = False
            log.info("index.tier_manifest_upgraded", path=str(self.directory / SNAPSHOT_NAME),
                     files=len(self.finished))

    def _append(self, records: list[L.Record]) -> None:
        if self._old_left or self._stale or self._torn:
            self.settle()
        if self._snapshot is None or self._snapshot[1] != self.url:
            self._compact()  # the URL goes in a snapshot first
        numbered = [dataclasses.replace(r, seq=self.seq + 1 + n) for n, r in enumerate(records)]
        data = b"".join(L.encode_record(r) for r in numbered)
        path = self.directory / LOG_NAME
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            created = os.fstat(fd).st_size == 0 and self._log_bytes == 0
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            self._torn = True  # (a full disk, a failed fsync: part of it may be there; cut before the next append)
            raise
        finally:
            os.close(fd)
        if created:
            fs.fsync_dir(self.directory)  # the creation rule (mqstore.fs): its entry durable before relied on
        for record in numbered:
            self._apply(record, str(path))
        self.seq = numbered[-1].seq
        self._log_records += len(numbered)
        self._log_bytes += len(data)
        if self._log_records >= self.max_log_records or (
                self._log_records >= self.min_log_records
                and self._log_bytes >= self.log_size_factor * self._snapshot[2]):
            self._compact()

    def _compact(self) -> None:
        """The state as a snapshot at the last seq, then the log truncated."""
        records = [L.Record(L.STARTED, 0, *_split(name, key, "the manifest")) for name, key in self.started.items()]
        records += [L.Record(L.FINISHED, 0, *_split(name, f.key, "the manifest"), f.size, f.header.encode())
                    for name, f in self.finished.items()]
        data = L.encode_snapshot(L.Snapshot(self.seq, self.url, tuple(records)))
        fs.replace_file(self.directory / SNAPSHOT_NAME, data)
        self._snapshot = (self.seq, self.url, len(data))
        failpoints.hit("index.tier_manifest.snapshot_written")
        self._truncate_log()

    def _truncate_log(self) -> None:
        path = self.directory / LOG_NAME
        if path.exists():  # (later appends count on the records being gone, so the fsync; a power cut that
            os.truncate(path, 0)  # undid it anyway leaves records of seq <= the snapshot's, skipped by a load)
            fs.fsync_file(path)
        self._log_records = self._log_bytes = 0
        self._stale = self._torn = False


def _first(name: str) -> int:
    return int(name.removesuffix(".cidx"))

