"""A second storage tier for sealed compact index files, queried with ranged reads.

``Tier`` is the small storage interface (put / get_range / size / delete / list); ``DirectoryTier``
is the default implementation, a directory (for example on another disk or a network mount);
``FsspecTier`` puts the files on any fsspec filesystem (``s3://bucket/prefix``, ``gcs://…``,
``memory://…``, ``file://…``) and reads them with ranged reads.

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

    def reader(self, name: str) -> "TierFile":
        """A handle for many ranged reads of one file (what a query holds while the file is in use)."""

    def size_bytes(self, name: str) -> int: ...

    def delete(self, name: str) -> None: ...

    def list(self) -> list[str]: ...


class DirectoryTier:
    """A directory as the second tier. Thread-safe: every read opens its own descriptor; ``put``
    writes ``name.tmp`` and renames it through mqstore.fs. Counts reads and bytes read."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.name = f"dir:{root}"
        fs.make_dirs(root)  # the creation rule (mqstore.fs)
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

    def reader(self, name: str) -> "TierFile":
        """Keeps one descriptor open for the reader's life: opening the file for each of a query's
        one or two reads cost as much as the read itself."""
        try:
            fd = os.open(self._path(name), os.O_RDONLY)
        except FileNotFoundError:
            raise NotFound(f"tier {self.name}: no file {name!r}") from None
        return TierFile(lambda position, length: os.pread(fd, length, position), lambda: os.close(fd),
                        self._count)

    def _count(self, read_bytes: int) -> None:
        with self._lock:
            self.reads_total += 1
            self.read_bytes_total += read_bytes

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


class FsspecTier:
    """Any fsspec filesystem as the second tier, addressed by a URL (the bucket or folder to use).

    ``put`` uploads to ``name.tmp`` and then moves it to ``name``: on an object store the object
    appears whole at the move; on a local filesystem the move is a rename. ``get_range`` is one
    ranged read (``cat_file`` with start and end), the only read a query makes. Thread-safe as far
    as the fsspec filesystem is (they are designed to be); the counters take a lock."""

    def __init__(self, url: str, **storage_options):
        import fsspec  # imported here: only deployments that ask for an fsspec tier need it

        self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        self.name = url
        self.fs.makedirs(self.root, exist_ok=True)
        self._lock = threading.Lock()
        self.reads_total = 0
        self.read_bytes_total = 0
        for leftover in [n for n in self._names() if n.endswith(fs.TMP_SUFFIX)]:
            self.fs.rm_file(self._path(leftover))

    def _path(self, name: str) -> str:
        if "/" in name or name.startswith("."):
            raise NotFound(f"tier {self.name}: bad file name {name!r}")
        return f"{self.root.rstrip('/')}/{name}"

    def _names(self) -> list[str]:
        return [entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.root, detail=False)]

    def put(self, name: str, source: pathlib.Path) -> None:
        tmp = self._path(name + fs.TMP_SUFFIX)
        self.fs.put_file(str(source), tmp)
        self.fs.mv(tmp, self._path(name))

    def get_range(self, name: str, position: int, length_bytes: int) -> bytes:
        try:
            data = self.fs.cat_file(self._path(name), start=position, end=position + length_bytes)
        except FileNotFoundError:
            raise NotFound(f"tier {self.name}: no file {name!r}") from None
        with self._lock:
            self.reads_total += 1
            self.read_bytes_total += len(data)
        return data

    def reader(self, name: str) -> "TierFile":
        return TierFile(lambda position, length: self.get_range(name, position, length), lambda: None,
                        lambda read_bytes: None)  # get_range counts

    def size_bytes(self, name: str) -> int:
        try:
            return int(self.fs.size(self._path(name)))
        except FileNotFoundError:
            raise NotFound(f"tier {self.name}: no file {name!r}") from None

    def delete(self, name: str) -> None:
        try:
            self.fs.rm_file(self._path(name))
        except FileNotFoundError:
            pass

    def list(self) -> list[str]:
        return sorted(n for n in self._names() if not n.endswith(fs.TMP_SUFFIX))


def open_tier(directory: pathlib.Path | None, url: str | None) -> Tier | None:
    """The tier a deployment configured: an fsspec URL, a directory, or none."""
    if url:
        return FsspecTier(url)
    if directory is not None:
        return DirectoryTier(directory)
    return None


class TierFile:
    """One open file of a tier: ``read(position, length)`` and ``close()``. Thread-safe (pread)."""

    __slots__ = ("_read", "_close", "_count")

    def __init__(self, read, close, count):
        self._read, self._close, self._count = read, close, count

    def read(self, position: int, length_bytes: int) -> bytes:
        data = self._read(position, length_bytes)
        self._count(len(data))
        return data

    def close(self) -> None:
        self._close()


class TierReader:
    """A compact_index.RangeReader over one file of a tier, open until ``close`` (the file's handle
    closes it once no query has it pinned). Thread-safe."""

    def __init__(self, tier: Tier, name: str):
        self.tier = tier
        self.name = f"{tier.name}/{name}"
        self.file_name = name
        self.size_bytes = tier.size_bytes(name)
        self._file = tier.reader(name)

    def read(self, position: int, length_bytes: int) -> bytes:
        return self._file.read(position, length_bytes)

    def close(self) -> None:
        self._file.close()
