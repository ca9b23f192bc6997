"""The ``file://`` backend of the object storage tier (mqstore.tier.objects): one file per object under a
root directory, the key its relative path. A put writes a temp file beside the object (``.<name>.<uuid>.tmp``),
fsyncs it and links it to the object's name: the link fails when the name exists (put-if-absent, atomic: a
reader sees the whole object or none), then the temp name goes and the directory is fsynced. A temp file a
crash left is never listed and never read; :meth:`LocalBackend.list` skips it.

Thread-safety: stateless apart from the root; the file system serialises the link.
"""

from __future__ import annotations

import os
import pathlib
import urllib.parse
import uuid

from mqstore import fs
from mqstore.errors import AlreadyExists, InvalidArgument, NotFound
from mqstore.tier.objects import ObjectInfo

TEMP_SUFFIX = ".tmp"
COPY_BYTES = 4 << 20


class LocalBackend:
    def __init__(self, root: pathlib.Path):
        self.root = root

    @classmethod
    def of_url(cls, url: str) -> LocalBackend:
        parsed = urllib.parse.urlparse(url)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidArgument(f"a file:// tier URL names an absolute directory (file:///DIR), not {url!r}")
        return cls(pathlib.Path(urllib.parse.unquote(parsed.path)))

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._create(key, lambda out: out.write(data))

    def put_file(self, key: str, path: pathlib.Path, size: int) -> None:
        """The first ``size`` bytes of ``path``, copied in chunks of COPY_BYTES (os.pread: no file-sized buffer)."""
        def copy(out) -> None:
            with open(path, "rb") as source:
                for at in range(0, size, COPY_BYTES):
                    chunk = os.pread(source.fileno(), min(COPY_BYTES, size - at), at)
                    if not chunk:
                        raise OSError(f"{path} ended at {at} bytes, before {size}")
                    out.write(chunk)
        self._create(key, copy)

    def _create(self, key: str, write) -> None:
        path = self.root / key
        fs.make_dirs(path.parent)  # the creation rule: a new directory's entry is durable before the object
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
        try:
            with open(self.root / key, "rb") as source:
                source.seek(start)
                return source.read(length)
        except FileNotFoundError:
            raise NotFound(f"object {key} does not exist") from None

    def size(self, key: str) -> int | None:
        try:
            return (self.root / key).stat().st_size
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[ObjectInfo]:
        top = self.root / prefix
        if not top.is_dir():
            return []
        found = []
        for path in top.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                found.append(ObjectInfo(path.relative_to(self.root).as_posix(), path.stat().st_size))
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)

    def close(self) -> None:
        pass
