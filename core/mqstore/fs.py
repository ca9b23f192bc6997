"""The one protocol for replacing files, and the only module that renames them.

replace_file(path, data): write ``path.tmp``, fsync it, rename over ``path``, fsync the directory.
After a crash at any step either the old or the new content is at ``path``; a leftover ``*.tmp`` is
garbage and is removed by :func:`remove_leftovers` on start:

  found on start            meaning                               action
  ------------------------- ------------------------------------- ----------------------
  path + path.tmp           crash before or during the rename     delete path.tmp
  path.tmp only             crash before the first rename         delete path.tmp
  path only                 clean                                 nothing
"""

from __future__ import annotations

import os
import pathlib

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


def remove_leftovers(directory: pathlib.Path) -> list[pathlib.Path]:
    removed = []
    if directory.is_dir():
        for tmp in directory.glob("*" + TMP_SUFFIX):
            tmp.unlink()
            removed.append(tmp)
    return removed
