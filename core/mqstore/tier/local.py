"""The ``file://`` backend of the object storage tier (mqstore.tier.objects): one file per object under a
root directory, the key its relative path. A put writes a temp file beside the object (``.<name>.<uuid>.tmp``),
fsyncs it and links it to the object's name: the link fails when the name exists (put-if-absent, atomic: a
reader sees the whole object or none), then the temp name goes and the directory is fsynced. A temp file a
crash left is never listed and never read; :meth:`LocalBackend.list` skips it.

**The root directory is the bucket.** It must exist: no operation creates it (a put makes only the directories
below it). While it is missing (a mount not there, a directory moved away) every operation fails with
:class:`RootMissing` (ObjectStore: Unavailable naming the tier), as S3 fails on a missing bucket: a listing
is never "empty" and an object never "gone" for that reason, so a reader starts degraded and retries
(mqstore.compaction.tier, the commit log's reads) instead of taking an absent tier for an empty one, and no
writer uploads into a fresh directory standing where the real one was. A missing directory *below* the root
is an empty prefix, as on S3.

Thread-safety: stateless apart from the root; the file system serialises the link.
"""

from __future__ import annotations

import os
import pathlib
import urllib.parse
import uuid

from mqstore import fs
from mqstore.errors import AlreadyExists, InvalidArgument, NotFound
from mqstore.tier.objects import ObjectInfo, Pace

TEMP_SUFFIX = ".tmp"
COPY_BYTES = 4 << 20


class RootMissing(OSError):
    """The tier's root directory does not exist (the module docstring): the tier is unavailable."""


class LocalBackend:
    reads_inline = True  # a directory of this machine: ObjectStore reads it on the caller's thread

    def __init__(self, root: pathlib.Path):
        self.root = root
        self._root_text = str(root)

    @classmethod
    def of_url(cls, url: str) -> LocalBackend:
        parsed = urllib.parse.urlparse(url)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidArgument(f"a file:// tier URL names an absolute directory (file:///DIR), not {url!r}")
        return cls(pathlib.Path(urllib.parse.unquote(parsed.path)))

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._create(key, lambda out: out.write(data))

    def put_file(self, key: str, path: pathlib.Path, size: int, pace: Pace | None = None) -> None:
        """The first ``size`` bytes of ``path``, copied in chunks of COPY_BYTES (os.pread: no file-sized buffer),
        each after ``pace.take`` (the upload quota, mqstore.tier.quota) allowed it."""
        def copy(out) -> None:
            with open(path, "rb") as source:
                for at in range(0, size, COPY_BYTES):
                    if pace is not None:
                        pace.take(min(COPY_BYTES, size - at))
                    chunk = os.pread(source.fileno(), min(COPY_BYTES, size - at), at)
                    if not chunk:
                        raise OSError(f"{path} ended at {at} bytes, before {size}")
                    out.write(chunk)
        self._create(key, copy)

    def _missing(self) -> RootMissing:
        return RootMissing(f"the tier's directory {self.root} does not exist (not mounted, or moved away?); "
                           f"nothing is created in its place: create it (mkdir -p) for a new, empty tier")

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise self._missing()

    def _make_dirs(self, directory: pathlib.Path) -> None:
        """The directories from the root down to ``directory``, never the root itself (each mkdir needs its
        parent: the root gone meanwhile fails), each entry made durable (the creation rule, mqstore.fs)."""
        created = []
        at = self.root
        for part in directory.relative_to(self.root).parts:
            at = at / part
            try:
                at.mkdir()
                created.append(at)
            except FileExistsError:
                if not at.is_dir():
                    raise
            except FileNotFoundError:
                raise self._missing() from None
        fs.sync_dirs(created)

    def _create(self, key: str, write) -> None:
        path = self.root / key
        self._check_root()
        self._make_dirs(path.parent)  # the creation rule: a new directory's entry is durable before the object
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        try:
            with open(temp, "xb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(temp, path)
            except FileExistsError:
                raise AlreadyExists(f"object {key} exists already (objects are written once)") from None
        finally:
            temp.unlink(missing_ok=True)
        fs.fsync_dir(path.parent)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        fd = self._open(key)  # (os calls, no file object: an index query on tier files makes several of these reads)
        try:
            return _pread_range(fd, start, length)
        finally:
            os.close(fd)

    def open_object(self, key: str) -> OpenFile:
        """The object's file kept open for ranged reads (an index file on the tier: a query reads it 2-8 times).
        Objects never change, so its reads give the object's bytes for as long as it stays open, even once it
        is deleted or its directory moved away (as an open file on S3 would not: ObjectStore.open_object)."""
        return OpenFile(self._open(key))

    def _open(self, key: str) -> int:
        try:
            return os.open(os.path.join(self._root_text, key), os.O_RDONLY)
        except FileNotFoundError:
            self._check_root()
            raise NotFound(f"object {key} does not exist") from None

    def size(self, key: str) -> int | None:
        try:
            return (self.root / key).stat().st_size
        except FileNotFoundError:
            self._check_root()
            return None

    def list(self, prefix: str) -> list[ObjectInfo]:
        self._check_root()
        top = self.root / prefix
        if not top.is_dir():
            return []
        found = []
        for path in top.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                found.append(ObjectInfo(path.relative_to(self.root).as_posix(), path.stat().st_size))
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        try:
            (self.root / key).unlink()
        except FileNotFoundError:
            self._check_root()  # (absent is no error; an absent tier is)

    def close(self) -> None:
        pass


class OpenFile:
    """An object's file open for reads (LocalBackend.open_object); ``close`` releases it. Thread-safe (pread)."""

    def __init__(self, fd: int):
        self._fd = fd

    def get_range(self, start: int, length: int) -> bytes:
        return _pread_range(self._fd, start, length)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _pread_range(fd: int, start: int, length: int) -> bytes:
    data = os.pread(fd, length, start)
    if len(data) == length or not data:
        return data  # (the usual case: one read, whole or at the object's end)
    parts, at, end = [data], start + len(data), start + length
    while at < end:
        chunk = os.pread(fd, end - at, at)
        if not chunk:
            break  # the object's end: fewer bytes, as a ranged GET past the end gives
        parts.append(chunk)
        at += len(chunk)
    return b"".join(parts)  # (one part: that part itself, no copy)
