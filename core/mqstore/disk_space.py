"""What a full disk means to the store, in one place.

A full disk must never kill the process (a write into an unallocated page of a shared mapping is a
SIGBUS) and must never leave a write half done: mapped files are allocated before they are used
(mqstore.log.segment), an allocation that fails refuses the write that needed it (ResourceExhausted),
and the store turns read-only until space is back. Reads go on.

Starting on a full disk needs a little room too: SQLite opens its ``-shm`` and ``-wal`` files (about
32 KiB), and the store writes its abort marker. :class:`SpaceReserve` keeps a file of
``SPACE_RESERVE_BYTES`` in the data directory while there is room, and deletes it when the store
starts on a disk that has less than that free, so that the store comes up (read-only) and serves reads.
"""

from __future__ import annotations

import errno
import os
import pathlib

import structlog

log = structlog.get_logger()

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
SPACE_RESERVE_BYTES = 1 << 20
RESERVE_FILE_NAME = "space.reserve"


def is_no_space(exc: BaseException) -> bool:
    """True for the OSError of a full disk (or an exhausted quota)."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


def free_bytes(directory: pathlib.Path) -> int:
    """Bytes an unprivileged writer can still allocate on the file system of ``directory``."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


class SpaceReserve:
    """The reserve file. Both methods are idempotent and may run from any thread; a race between
    them at worst allocates or deletes the file once more."""

    def __init__(self, directory: pathlib.Path, size_bytes: int = SPACE_RESERVE_BYTES):
        self.path = directory / RESERVE_FILE_NAME
        self.size_bytes = size_bytes

    def ensure(self) -> bool:
        """Allocate the reserve unless it is there; False (logged) when the disk has no room for it."""
        try:
            if self.path.stat().st_size == self.size_bytes:
                return True
        except FileNotFoundError:
            pass
        # Not made durable (the creation rule of mqstore.fs): the reserve is no data, and one lost to a
        # power cut is allocated again at the next start.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, self.size_bytes)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self.path.unlink(missing_ok=True)
            log.info("space_reserve.unavailable", path=str(self.path), size_bytes=self.size_bytes)
            return False
        finally:
            os.close(fd)
        return True

    def release(self) -> None:
        """Delete the reserve, giving its bytes to whatever needs them next."""
        if self.path.exists():
            self.path.unlink(missing_ok=True)
            log.warning("space_reserve.released", path=str(self.path), size_bytes=self.size_bytes,
                        reason="the disk is full; the store starts read-only")
