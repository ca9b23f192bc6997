"""Full-disk behaviour of the MessageStore (mqstore.disk_space says why): the read-only state, the
abort marker and checkpoints that may not fit, and the space reserve that lets a start on a full disk
come up. Mixed into MessageStore.

Read-only has two sources: ``disk_read_only`` (the disk check found the disk above
disk_max_used_ratio) and ``commitlog.read_only_reason`` (a file a write needed could not be
allocated, or the abort marker could not be written at start). Both are cleared only by the disk
check (``set_disk_usage``, from the maintenance thread every clean_interval_ms), once there is room.

Thread-safety: the state is plain strings and flags written by the maintenance thread and by the
append path (which sets ``commitlog.read_only_reason``); a reader sees either value, both are safe.
"""

from __future__ import annotations

import os

import structlog

from mqstore import disk_space, fs
from mqstore.errors import ResourceExhausted
from mqstore.format import cq_unit

log = structlog.get_logger()


class DiskSpaceMixin:
    disk_read_only: str = ""
    _abort_marker_written: bool = False
    _checkpoint_skipped: bool = False

    def read_only_reason(self) -> str:
        return self.disk_read_only or self.commitlog.read_only_reason

    def refuse_if_read_only(self) -> None:
        """ResourceExhausted while the disk is full (until the disk check finds room again)."""
        reason = self.read_only_reason()
        if reason:
            raise ResourceExhausted(f"the store is read-only: {reason}; reads still work")

    # ---- start
    def _check_space_before_start(self) -> None:
        """Before start writes anything: free the reserve if the disk is full, and turn read-only."""
        if disk_space.free_bytes(self.config.data_dir) < disk_space.SPACE_RESERVE_BYTES:
            self.space_reserve.release()  # room for SQLite's -shm/-wal and the abort marker
        self.maintenance.check_disk()

    def _mark_started(self) -> None:
        """Write the abort marker (or stay read-only without it), then take the reserve back."""
        if not self._write_abort_marker():
            self.commitlog.read_only_reason = "disk full: no room for the abort marker at start"
        if not self.read_only_reason():
            self.space_reserve.ensure()

    def _write_abort_marker(self) -> bool:
        """The marker that tells the next start this one did not stop cleanly. False when the disk has
        no room for it: the store must then stay read-only, or a crash would go unnoticed."""
        try:
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
    def _checkpoint_skipped_for(self, exc: OSError) -> None:
        """A checkpoint write failed: re-raise unless the disk is full; then log once and go on (the
        older checkpoint stays valid, and the abort marker stays)."""
        if not disk_space.is_no_space(exc):
            raise exc
        if not self._checkpoint_skipped:
            log.warning("checkpoint.skipped", reason="disk full", error=str(exc),
                        action="the abort marker stays; the next start re-checks the log from the last checkpoint")
        self._checkpoint_skipped = True

    def _checkpoint_written(self) -> None:
        if self._checkpoint_skipped:
            log.info("checkpoint.resumed")
            self._checkpoint_skipped = False

    # ---- the disk check
    def set_disk_usage(self, used_ratio: float, free_bytes: int | None = None) -> None:
        """The disk check's verdict: read-only at or above disk_max_used_ratio; writable again below it
        once ``free_bytes`` (when known) holds the files a refused write needed, and the abort marker
        is written."""
        if used_ratio >= self.config.disk_max_used_ratio:
            if not self.disk_read_only:
                log.error("store.read_only", used_ratio=round(used_ratio, 4), limit=self.config.disk_max_used_ratio)
            self.disk_read_only = (f"disk {used_ratio:.1%} full, above the limit of "
                                   f"{self.config.disk_max_used_ratio:.0%}: free space or raise disk_max_used_ratio")
            return
        if not self.read_only_reason():
            return
        needed = self.config.segment_size_bytes + self.config.cq_entries_per_file * cq_unit.ENTRY_SIZE
        if self.commitlog.read_only_reason and free_bytes is not None and free_bytes < needed:
            return  # the file creation that failed (ENOSPC) would fail again
        if not self._abort_marker_written and not self._write_abort_marker():
            return
        log.info("store.writable_again", used_ratio=round(used_ratio, 4), free_bytes=free_bytes)
        self.disk_read_only = ""
        self.commitlog.read_only_reason = ""
        self.space_reserve.ensure()
