"""The one protocol for replacing files, and the only module that renames them.

replace_file(path, data): write ``path.tmp``, fsync it, rename over ``path``, fsync the directory.
After a crash at any step either the old or the new content is at ``path``; a leftover ``*.tmp`` is
garbage and is removed by :func:`remove_leftovers` on start:

  found on start            meaning                               action
  ------------------------- ------------------------------------- ----------------------
  path + path.tmp           crash before or during the rename     delete path.tmp
  path.tmp only             crash before the first rename         delete path.tmp
  path only                 clean                                 nothing

copy_durably(src, dst): the same protocol for a copy that must survive a power loss before its
source is changed (the ``.broken`` copies of ``mqstore repair``): copy into ``dst.tmp``, fsync it,
rename to ``dst``, fsync the directory. ``dst`` is then either absent or complete; a leftover
``dst.tmp`` is garbage (repair removes the leftovers of its directory first), and the source is only
changed after copy_durably returns.
"""

from __future__ import annotations

import os
import pathlib
import shutil

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: pathlib.Path, data: bytes, *, before_rename=None) -> None:
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: give the bytes back now, not at the next start
        raise
    finally:
        os.close(fd)
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    fsync_dir(path.parent)


def rename_durably(src: pathlib.Path, dst: pathlib.Path) -> None:
    os.replace(src, dst)
    fsync_dir(dst.parent)


def copy_durably(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """Copy ``src`` to ``dst`` through ``dst.tmp`` (see the module docstring); returns ``dst``."""
    tmp = dst.with_name(dst.name + TMP_SUFFIX)
    shutil.copyfile(src, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dst)
    fsync_dir(dst.parent)
    return dst


def free_name(path: pathlib.Path, suffix: str) -> pathlib.Path:
    """``path`` + ``suffix``, or + ``suffix.1``, ``.2``... for the first that does not exist, so that
    a copy never overwrites an older one (a second repair must not lose the first one's bytes)."""
    candidate = path.with_name(path.name + suffix)
    for n in range(1, 10_000):
        if not candidate.exists():
            return candidate
        candidate = path.with_name(f"{path.name}{suffix}.{n}")
    raise FileExistsError(f"{path.parent} holds 10,000 copies {path.name}{suffix}.N: remove old ones")


def remove_leftovers(directory: pathlib.Path) -> list[pathlib.Path]:
    removed = []
    if directory.is_dir():
        for tmp in directory.glob("*" + TMP_SUFFIX):
            tmp.unlink()
            removed.append(tmp)
    return removed
