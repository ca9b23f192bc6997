"""A power cut inside one test process: what the file system was never asked to make durable is lost.

kill -9 loses only what a process had not handed to the kernel; a power cut also loses what the
kernel had not written to the disk. For data pages the crash tests already model that (torn tails,
test_recovery_inprocess.py). This models the metadata of new files, after POSIX's contract:

  - the entry of a new file or directory survives only if its directory was fsynced after the
    entry was made (created, or renamed into it);
  - the size of a new file survives only as far as its last fsync or fdatasync.

While a :class:`PowerCut` records, every file and directory the process creates under its root (the
test's own directory) is tracked (os.open with O_CREAT, the builtin open for writing, os.mkdir; renames
move the tracking), and so are the fsyncs. Files elsewhere are not: threads of other tests may still
run in the process (a store a failed test left open), and a cut must not touch their files.
:meth:`PowerCut.cut` then drops what was never made durable, the worst a cut may leave:

  mode       a new entry never made durable          a new file's size beyond its last sync
  ---------- -------------------------------------- ----------------------------------------
  entries    gone (a directory with what it holds)   cut (to 0 if it was never synced)
  sizes      kept (as if its directory was synced)   cut (to 0 if it was never synced)

Bytes below the durable size keep what the page cache held, as after kill -9. Not modelled: files that
existed before recording (their sizes are kept), deletions (every deletion is kept), files the
process creates outside Python's os module (SQLite's). A rename that was never made durable is
reported instead of guessed at (the old file would come back, and its bytes are gone).
Stop every thread that writes files (MessageStore.halt) before ``cut``.
"""

from __future__ import annotations

import builtins
import io
import os
import pathlib
import shutil
import stat
import threading
from dataclasses import dataclass

import pytest

ENTRIES = "entries"
SIZES = "sizes"


@dataclass
class _Created:
    is_dir: bool
    entry_durable: bool = False
    durable_size: int = 0


class PowerCut:
    """Records while active (``with PowerCut(mode) as power:``), then ``power.cut()``. The patches of
    os, io and builtins are its own and undone by ``cut`` or at the end of the block."""

    def __init__(self, mode: str, root: str | os.PathLike):
        if mode not in (ENTRIES, SIZES):
            raise ValueError(f"mode must be {ENTRIES!r} or {SIZES!r}, not {mode!r}")
        self.mode = mode
        self.root = os.path.abspath(root) + os.sep
        self._monkeypatch = pytest.MonkeyPatch()
        self._lock = threading.Lock()
        self.created: dict[str, _Created] = {}
        self.pending_renames: set[str] = set()  # renamed over a file that existed, not yet durable
        self.fsynced_dirs: list[str] = []

    # ---- recording
    def __enter__(self) -> PowerCut:
        real_open, real_mkdir, real_replace, real_rename = os.open, os.mkdir, os.replace, os.rename
        real_fsync, real_fdatasync, real_io_open = os.fsync, os.fdatasync, io.open

        def recording_open(path, flags, mode=0o777, *, dir_fd=None):
            new = dir_fd is None and flags & os.O_CREAT and not os.path.lexists(path)
            fd = real_open(path, flags, mode, dir_fd=dir_fd)
            if new:
                self._track(path, is_dir=False)
            return fd

        def recording_io_open(file, mode="r", *args, **kwargs):
            new = (isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wxa")
                   and not os.path.lexists(file))
            handle = real_io_open(file, mode, *args, **kwargs)
            if new:
                self._track(file, is_dir=False)
            return handle

        def recording_mkdir(path, mode=0o777, *, dir_fd=None):
            real_mkdir(path, mode, dir_fd=dir_fd)
            if dir_fd is None:
                self._track(path, is_dir=True)

        def recording_move(real):
            def move(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
                existed = os.path.lexists(dst)
                real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
                self._moved(src, dst, existed)
            return move

        def recording_sync(real):
            def sync(fd):
                real(fd)
                self._synced(fd)
            return sync

        patch = self._monkeypatch.setattr
        patch(os, "open", recording_open)
        patch(os, "mkdir", recording_mkdir)
        patch(os, "replace", recording_move(real_replace))
        patch(os, "rename", recording_move(real_rename))
        patch(os, "fsync", recording_sync(real_fsync))
        patch(os, "fdatasync", recording_sync(real_fdatasync))
        patch(io, "open", recording_io_open)
        patch(builtins, "open", recording_io_open)
        return self

    def __exit__(self, *exc) -> None:
        self._monkeypatch.undo()

    def _mine(self, path: str) -> bool:
        return path.startswith(self.root)

    def _track(self, path, is_dir: bool) -> None:
        path = os.path.abspath(path)
        if not self._mine(path):
            return
        with self._lock:
            self.created[path] = _Created(is_dir)

    def _moved(self, src, dst, existed: bool) -> None:
        src, dst = os.path.abspath(src), os.path.abspath(dst)
        if not self._mine(dst):
            return
        with self._lock:
            moved = self.created.pop(src, None)
            if moved is not None:
                moved.entry_durable = False  # a new entry in dst's directory
                self.created[dst] = moved
                if existed:
                    self.pending_renames.add(dst)

    def _synced(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(" (deleted)"):
            return
        mode = os.fstat(fd).st_mode
        with self._lock:
            if stat.S_ISDIR(mode):
                self.fsynced_dirs.append(path)
                for name, created in self.created.items():
                    if os.path.dirname(name) == path:
                        created.entry_durable = True
                        self.pending_renames.discard(name)
            elif path in self.created:
                self.created[path].durable_size = os.fstat(fd).st_size

    # ---- the cut
    def cut(self) -> list[str]:
        """Drop what was never made durable; returns what it did, one line per path (for the report)."""
        self._monkeypatch.undo()
        assert not self.pending_renames, f"renames never made durable (not modelled): {sorted(self.pending_renames)}"
        done = []
        for path, created in sorted(self.created.items()):
            if not os.path.lexists(path):
                continue  # deleted (or inside a directory already dropped)
            if self.mode == ENTRIES and not created.entry_durable:
                if created.is_dir:
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                done.append(f"{path}: entry lost")
            elif not created.is_dir and os.path.getsize(path) > created.durable_size:
                done.append(f"{path}: size {os.path.getsize(path)} -> {created.durable_size}")
                os.truncate(path, created.durable_size)
        return done

    def created_under(self, directory: pathlib.Path) -> list[str]:
        prefix = str(directory) + os.sep
        return sorted(p for p in self.created if p.startswith(prefix))
