"""A small tmpfs of its own for full-disk tests: mounted for real (root, or CAP_SYS_ADMIN), filled by
a filler file, always unmounted. Where mounting is not allowed the test is skipped with the reason
(a real mount attempt decides, not a guess from the user id)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

MOUNT_TIMEOUT_S = 30
FILLER_NAME = "filler"


class SmallDisk:
    def __init__(self, path: pathlib.Path):
        self.path = path
        self.filler = path / FILLER_NAME

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_bytes: int = 0) -> int:
        """Grow the filler until the file system refuses a single byte, then give ``leave_bytes`` back
        (so that a test can leave room for a page but not for a whole file); returns the bytes added."""
        added = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for chunk in (1 << 20, 1 << 12, 1):  # bounded: each size ends at the first ENOSPC
                block = b"\0" * chunk
                for _ in range(1 << 16):
                    try:
                        added += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != 28:  # ENOSPC
                            raise
                        break
            assert self.free_bytes() == 0, f"{self.path} still has {self.free_bytes()} bytes free"
            if leave_bytes:
                added -= leave_bytes
                os.ftruncate(fd, os.fstat(fd).st_size - leave_bytes)
        finally:
            os.close(fd)
        return added

    def free_filler(self) -> None:
        self.filler.unlink(missing_ok=True)


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)


def mounted_tmpfs(directory: pathlib.Path, size: str):
    """Generator for a fixture: yields a SmallDisk on a fresh tmpfs of ``size`` at ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    result = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory))
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (mount said: {result.stderr.strip() or result.returncode}); "
                    f"full-disk tests need root or CAP_SYS_ADMIN")
    try:
        yield SmallDisk(directory)
    finally:
        if _run("umount", str(directory)).returncode != 0:
            _run("umount", "--lazy", str(directory))  # still busy: detach now, freed when released
