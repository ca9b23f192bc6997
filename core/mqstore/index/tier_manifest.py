"""The index directory's record of which tier object holds which compact file: ``tier-manifest.json``,
replaced whole (mqstore.fs.replace_file: temp file, fsync, rename, fsync the directory) at each change, so
a crash leaves the old or the new manifest, never a torn one.

  field      type                              meaning
  ---------- --------------------------------- ----------------------------------------------------------
  version    int                               1
  url        str                               the tier URL the objects are on (a start with another
                                               URL, or none, while files are on the tier is refused)
  started    {file name: object key}           a move's attempt (STARTED): its object may or may not exist
                                               and is not trusted; the local file is still there
  finished   {file name: {"key": object key,   the file lives on the tier (FINISHED): the object was read
             "size": bytes, "header": hex}}    back and verified; ``header`` is the compact file's 64-byte
                                               header, so a start opens tier files without calling the tier

A file name is ``<first physical offset:020d>.cidx``; an object key ``index/<file name>.<attempt id>``
(mqstore.index.tier). Every object under ``index/`` that ``finished`` does not name is an orphan (an attempt
that never finished, or a file deleted by retention whose object delete did not happen) and is deleted by
lifecycle.tidy_tier.

Cost: a save rewrites every entry (~280 bytes a tiered file; 1,000 files, 360 GB of compact index at the default
sizes, ~0.12 s with its fsyncs), twice a move, against the upload of one file of up to ~360 MB: kept whole
rather than a journal of its own with compaction and recovery.

Thread-safety: none; the IndexStore's maintenance lock is held for every read-modify-save.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

from mqstore import fs
from mqstore.errors import DataLoss, FailedPrecondition
from mqstore.format import compact_index

FILE_NAME = "tier-manifest.json"
VERSION = 1


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


@dataclass
class TierManifest:
    path: pathlib.Path
    url: str = ""
    started: dict[str, str] = field(default_factory=dict)
    finished: dict[str, TierFile] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: pathlib.Path, url: str) -> TierManifest:
        """The manifest of ``directory`` for a tier at ``url`` ("" = no tier): FailedPrecondition when files
        live on another tier (or on one while none is configured)."""
        path = directory / FILE_NAME
        try:
            raw = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls(path, url)
        except ValueError as exc:
            raise DataLoss(f"{path} is not valid JSON ({exc}); it names the index files on the tier: restore it, "
                           f"or remove the index directory to rebuild the index from the commit log") from None
        if raw.get("version") != VERSION:
            raise DataLoss(f"{path}: version {raw.get('version')!r}, this build reads {VERSION}")
        manifest = cls(path, raw["url"], dict(raw["started"]))
        for name, entry in raw["finished"].items():
            reader = _HeaderBytes(f"{path}: {name}", bytes.fromhex(entry["header"]), int(entry["size"]))
            manifest.finished[name] = TierFile(entry["key"], int(entry["size"]), compact_index.read_header(reader))
        if manifest.url != url and (manifest.finished or manifest.started):
            raise FailedPrecondition(
                f"{len(manifest.finished)} index files are on the tier {manifest.url} ({path}), but the index was "
                f"started with {'--tier-url ' + url if url else 'no tier'}: start it with --tier-url {manifest.url}")
        manifest.url = url
        return manifest

    def save(self) -> None:
        body = {"version": VERSION, "url": self.url, "started": dict(sorted(self.started.items())),
                "finished": {name: {"key": f.key, "size": f.size, "header": f.header.encode().hex()}
                             for name, f in sorted(self.finished.items())}}
        fs.replace_file(self.path, json.dumps(body, indent=1).encode())

    def keys(self) -> set[str]:
        """Every object key the manifest names (started or finished)."""
        return set(self.started.values()) | {f.key for f in self.finished.values()}
