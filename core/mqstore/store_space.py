"""Full-disk behaviour of the MessageStore (mqstore.disk_space says why): the read-only state, the
abort marker and checkpoints that may not fit, and the space reserve that lets a start on a full disk
come up. The store holds one :class:`DiskSpace`.

Read-only has two sources: the disk check found the disk above disk_max_used_ratio (``check``, from
the maintenance duty every clean_interval_ms), or a file a write needed could not be allocated (the
append path calls ``allocation_failed``), or the abort marker could not be written at start. Both are
cleared only by the disk check, once there is room.

Thread-safety: the state is plain references written by the maintenance duty and by the append path;
a reader sees either the old or the new value, both are safe.
"""

from __future__ import annotations

import os
import pathlib

import structlog

from mqstore import disk_space, fs
from mqstore.config import StoreConfig
from mqstore.errors import ResourceExhausted
from mqstore.format import cq_unit
from mqstore.metrics import Registry

log = structlog.get_logger()


class DiskSpace:
    def __init__(self, config: StoreConfig, abort_path: pathlib.Path, metrics: Registry | None = None):
        self.config = config
        self.abort_path = abort_path
        metrics = metrics or Registry()
        self._used_ratio = metrics.gauge("mqstore_commitlog_disk_used_ratio", "used share of the data directory's "
                                         "file system at the last disk check")
        metrics.gauge_fn("mqstore_commitlog_read_only", "1 while the store refuses writes, by reason: disk_full "
                         "(the disk check) or allocation_failed (a file a write needed)", self._read_only, ("reason",))
        self.reserve = disk_space.SpaceReserve(config.data_dir)
        self._disk_full: str | None = None          # why the disk check found the disk full
        self._allocation_failed: str | None = None  # why a file a write needed could not be allocated
        self._abort_marker_written = False
        self._checkpoint_skipped = False

    def _read_only(self) -> dict[tuple[str], int]:
        return {("disk_full",): int(self._disk_full is not None),
                ("allocation_failed",): int(self._allocation_failed is not None)}

    def read_only_reason(self) -> str | None:
        """None while the store is writable; otherwise why it is read-only."""
        return self._disk_full or self._allocation_failed

    def refuse_if_read_only(self) -> None:
        """ResourceExhausted while the disk is full (until the disk check finds room again)."""
        reason = self.read_only_reason()
        if reason is not None:
            raise ResourceExhausted(f"the store is read-only: {reason}; reads still work")

    def refuse_metadata_write_if_read_only(self) -> None:
        """The default metadata database (SQLite in the data directory) shares the data's disk: while
        the store is read-only it would fail too (and grow its WAL on the last bytes), so refuse first.
        A metadata_url elsewhere (PostgreSQL) is written regardless."""
        if not self.config.metadata_url:
            self.refuse_if_read_only()

    def allocation_failed(self, reason: str) -> None:
        """A file a write needed could not be allocated: read-only until the disk check finds room."""
        self._allocation_failed = reason

    # ---- start
    def check_before_start(self) -> None:
        """Before start writes anything: free the reserve if the disk is full, and turn read-only."""
        if disk_space.free_bytes(self.config.data_dir) < disk_space.SPACE_RESERVE_BYTES:
            self.reserve.release()  # room for SQLite's -shm/-wal and the abort marker
        self.check()

    def mark_started(self) -> None:
        """Write the abort marker (or stay read-only without it), then take the reserve back."""
        if not self._write_abort_marker():
            self._allocation_failed = "disk full: no room for the abort marker at start"
        if self.read_only_reason() is None:
            self.reserve.ensure()

    def _write_abort_marker(self) -> bool:
        """The marker that tells the next start this one did not stop cleanly. False when the disk has
        no room for it: the store must then stay read-only, or a crash would go unnoticed."""
        try:
            # The creation rule (mqstore.fs): the marker's entry must survive a power cut, its bytes
            # (the pid, for people) need not, so only the directory is fsynced.
            self.abort_path.write_text(str(os.getpid()))
            fs.fsync_dir(self.config.data_dir)
        except OSError as exc:
            if not disk_space.is_no_space(exc):
                raise
            if not self.abort_path.exists():
                log.warning("store.abort_marker_unwritable", error=str(exc))
                return False
            # Left by an unclean stop, emptied by the failed write: it is there, which is what counts.
        self._abort_marker_written = True
        return True

    # ---- checkpoints
    def checkpoint_skipped_for(self, exc: OSError) -> None:
        """A checkpoint write failed: re-raise unless the disk is full; then log once and go on (the
        older checkpoint stays valid, and the abort marker stays)."""
        if not disk_space.is_no_space(exc):
            raise exc
        if not self._checkpoint_skipped:
            log.warning("checkpoint.skipped", reason="disk full", error=str(exc),
                        action="the abort marker stays; the next start re-checks the log from the last checkpoint")
        self._checkpoint_skipped = True

    def checkpoint_written(self) -> None:
        if self._checkpoint_skipped:
            log.info("checkpoint.resumed")
            self._checkpoint_skipped = False

    # ---- the disk check
    def check(self) -> None:
        """Measure the data directory's file system and apply :meth:`set_usage`."""
        st = os.statvfs(self.config.data_dir)
        used = 1 - st.f_bavail / st.f_blocks if st.f_blocks else 0.0
        self._used_ratio.set(used)
        self.set_usage(used, free_bytes=st.f_bavail * st.f_frsize)

    def set_usage(self, used_ratio: float, free_bytes: int | None = None) -> None:
        """The disk check's verdict: read-only at or above disk_max_used_ratio; writable again below it
        once ``free_bytes`` (when known) holds the files a refused write needed, and the abort marker
        is written."""
        if used_ratio >= self.config.disk_max_used_ratio:
            if self._disk_full is None:
                log.error("store.read_only", used_ratio=round(used_ratio, 4), limit=self.config.disk_max_used_ratio)
            self._disk_full = (f"disk {used_ratio:.1%} full, above the limit of "
                               f"{self.config.disk_max_used_ratio:.0%}: free space or raise disk_max_used_ratio")
            return
        if self.read_only_reason() is None:
            return
        needed = self.config.segment_size_bytes + self.config.cq_entries_per_file * cq_unit.ENTRY_SIZE
        if self._allocation_failed is not None and free_bytes is not None and free_bytes < needed:
            return  # the file creation that failed (ENOSPC) would fail again
        if not self._abort_marker_written and not self._write_abort_marker():
            return
        log.info("store.writable_again", used_ratio=round(used_ratio, 4), free_bytes=free_bytes)
        self._disk_full = None
        self._allocation_failed = None
        self.reserve.ensure()
