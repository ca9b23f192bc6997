"""`mqstore repair`: cut the commit log at its first bad record, keeping `.broken` copies.

Run only while the store is stopped: it takes the same directory lock as the server. Consume queues
need nothing here; the next start cuts their entries past the new log end and replays the rest.
"""

from __future__ import annotations

import fcntl
import os
import pathlib

from mqstore.config import StoreConfig, max_write_bytes
from mqstore.errors import FailedPrecondition
from mqstore.log import recovery
from mqstore.log.segment import SegmentQueue
from mqstore.format import segment_name

# Repair runs without the server's configuration: the default append limits bound a torn tail.
_DEFAULT_MAX_WRITE_BYTES = max_write_bytes(StoreConfig.max_batch_body_bytes, StoreConfig.max_batch_messages)


def repair(data_dir: str | os.PathLike) -> dict:
    root = pathlib.Path(data_dir)
    log_dir = root / "commitlog"
    if not log_dir.is_dir():
        raise FailedPrecondition(f"{log_dir} does not exist: is {root} an mqstore data directory?")
    fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FailedPrecondition(f"{root} is in use by a running mqstore; stop it before repair") from None
        segments = SegmentQueue(log_dir, _segment_size(log_dir), preallocate=False)
        segments.load()
        try:
            report = recovery.repair(segments, _DEFAULT_MAX_WRITE_BYTES)
        finally:
            segments.close()
        # The checkpoint may point past the cut; without it the next start re-checks the whole log.
        (root / "checkpoint").unlink(missing_ok=True)
        return report
    finally:
        os.close(fd)


def _segment_size(log_dir: pathlib.Path) -> int:
    sizes = set()
    for path in log_dir.iterdir():
        try:
            segment_name.parse(path.name)
        except ValueError:
            continue
        sizes.add(path.stat().st_size)
    sizes.discard(0)
    if len(sizes) > 1:
        raise FailedPrecondition(f"segments in {log_dir} have different sizes {sorted(sizes)}; fix by hand")
    return sizes.pop() if sizes else 1 << 30
