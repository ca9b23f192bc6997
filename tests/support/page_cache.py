"""The page cache as the kernel reports it (mincore(2)), for the drop-behind tests (mqstore.log.warmer), and a
directory whose files' pages can leave it (not a tmpfs)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from mqstore.log.segment import PAGE_SIZE, Segment

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _on_tmpfs(path: pathlib.Path) -> bool:
    """Whether ``path`` lies on a tmpfs, whose pages are the files themselves and cannot be dropped."""
    best, fstype = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, kind = line.split()[:3]
            if str(path).startswith(point.rstrip("/") + "/") and len(point) > len(best):
                best, fstype = point, kind
    return fstype in ("tmpfs", "ramfs")


def resident_pages(path: pathlib.Path) -> list[bool]:
    """Which pages of the file are in the page cache (mincore on a private mapping that touches none)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        buf = ctypes.c_char.from_buffer(mm)
        vec = (ctypes.c_ubyte * ((size + PAGE_SIZE - 1) // PAGE_SIZE))()
        if _libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        del buf
        return [bool(v & 1) for v in vec]
    finally:
        mm.close()


def record_drops(monkeypatch) -> list[tuple[int, int]]:
    """The [from, to) physical offsets of the log that the store gives back from now on (Segment.drop_cache, which
    still drops them), in the order given: what the store dropped, whatever else the kernel pages out by itself."""
    dropped: list[tuple[int, int]] = []
    real = Segment.drop_cache

    def noted(seg, from_position: int, to_position: int) -> None:
        dropped.append((seg.start + from_position, seg.start + to_position))
        real(seg, from_position, to_position)

    monkeypatch.setattr(Segment, "drop_cache", noted)
    return dropped


@contextlib.contextmanager
def disk_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A directory on a file system whose pages can leave the page cache: the test's own, or (where it is a tmpfs,
    whose pages are the files and stay) a scratch directory beside the repository, removed afterwards."""
    if not _on_tmpfs(tmp_path):
        yield tmp_path
        return
    root = pathlib.Path(__file__).resolve().parents[2]
    if _on_tmpfs(root):
        pytest.fail(f"neither {tmp_path} nor {root} is on a disk: drop-behind cannot be observed on a tmpfs")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=".drop-behind-", dir=root))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
