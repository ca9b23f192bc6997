"""A second storage tier for sealed compact index files, queried with ranged reads.

``Tier`` is the small storage interface (put / get_range / size / delete / list); ``DirectoryTier``
is the default implementation, a directory (for example on another disk or a network mount). An
object store fits the same interface (any fsspec filesystem, see the open points of issue 3).

A move (IndexStore.move_to_tier) is: ``put`` (durable when it returns), verify the copy through
ranged reads, then delete the local file. A crash between the put and the delete leaves both
copies; start-up verifies the tier copy and deletes the local one (see recovery.py).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
from typing import Protocol

from mqstore import fs
from mqstore.errors import NotFound


class Tier(Protocol):
    """Storage of whole immutable files by name. Implementations are thread-safe."""

    name: str

    def put(self, name: str, source: pathlib.Path) -> None:
        """Store a copy of ``source``; durable once this returns; replaces any older copy."""

    def get_range(self, name: str, position: int, length_bytes: int) -> bytes: ...

    def size_bytes(self, name: str) -> int: ...

    def delete(self, name: str) -> None: ...

    def list(self) -> list[str]: ...


class DirectoryTier:
    """A directory as the second tier. Thread-safe: every read opens its own descriptor; ``put``
    writes ``name.tmp`` and renames it through mqstore.fs. Counts reads and bytes read."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.name = f"dir:{root}"
        root.mkdir(parents=True, exist_ok=True)
        fs.remove_leftovers(root)
        self._lock = threading.Lock()
        self.reads_total = 0
        self.read_bytes_total = 0

    def _path(self, name: str) -> pathlib.Path:
        if "/" in name or name.startswith("."):
            raise NotFound(f"tier {self.name}: bad file name {name!r}")
        return self.root / name

    def put(self, name: str, source: pathlib.Path) -> None:
        tmp = self._path(name + fs.TMP_SUFFIX)
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
        fs.rename_durably(tmp, self._path(name))

    def get_range(self, name: str, position: int, length_bytes: int) -> bytes:
        try:
            fd = os.open(self._path(name), os.O_RDONLY)
        except FileNotFoundError:
            raise NotFound(f"tier {self.name}: no file {name!r}") from None
        try:
            data = os.pread(fd, length_bytes, position)
        finally:
            os.close(fd)
        with self._lock:
            self.reads_total += 1
            self.read_bytes_total += len(data)
        return data

    def size_bytes(self, name: str) -> int:
        try:
            return self._path(name).stat().st_size
        except FileNotFoundError:
            raise NotFound(f"tier {self.name}: no file {name!r}") from None

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)
        fs.fsync_dir(self.root)

    def list(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_file() and not p.name.endswith(fs.TMP_SUFFIX))


class TierReader:
    """A compact_index.RangeReader over one file of a tier. Thread-safe."""

    def __init__(self, tier: Tier, name: str):
        self.tier = tier
        self.name = f"{tier.name}/{name}"
        self.file_name = name
        self.size_bytes = tier.size_bytes(name)

    def read(self, position: int, length_bytes: int) -> bytes:
        return self.tier.get_range(self.file_name, position, length_bytes)

    def close(self) -> None:
        """Nothing is held open between reads."""
