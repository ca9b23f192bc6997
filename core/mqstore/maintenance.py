"""Background duties of the store, one named thread ("store-maintenance"):

- every ``checkpoint_interval_ms``: flush consume queues, then write the checkpoint (flushed and
  dispatched physical offsets) through the atomic replace protocol;
- every ``clean_interval_ms``: retention (delete whole expired segments, oldest first, never the active
  one, never past what is flushed and dispatched; consume queue minimums follow), per-topic logical
  retention, and the disk check that puts the store into read-only mode and back.

A failure is logged and recorded in ``error`` (the store reports itself unhealthy); the loop goes on.
"""

from __future__ import annotations

import os
import threading

import structlog

log = structlog.get_logger()


class Maintenance:
    def __init__(self, store, config, clock):
        self.store = store
        self.config = config
        self.clock = clock
        self.error: str = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-maintenance", daemon=True)
        self._last_clean_s = clock.monotonic_s()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        interval_s = self.config.checkpoint_interval_ms / 1000
        while not self._stop.wait(interval_s):
            try:
                self.store.write_checkpoint()
                now = self.clock.monotonic_s()
                if now - self._last_clean_s >= self.config.clean_interval_ms / 1000:
                    self._last_clean_s = now
                    self.clean()
                self.error = ""
            except Exception as exc:  # noqa: BLE001 - record, report unhealthy, keep going
                log.exception("maintenance.failed")
                self.error = f"{type(exc).__name__}: {exc}"

    def clean(self) -> None:
        self.check_disk()
        self.delete_expired_segments()
        self.store.apply_topic_retention()

    def check_disk(self) -> None:
        st = os.statvfs(self.config.data_dir)
        used = 1 - st.f_bavail / st.f_blocks if st.f_blocks else 0.0
        self.store.set_disk_usage(used, free_bytes=st.f_bavail * st.f_frsize)

    def delete_expired_segments(self) -> int:
        store = self.store
        segs = store.segments.segments
        limit = min(store.flusher.flushed_offset, store.dispatcher.dispatched_offset)
        now_ms = self.clock.now_ms()
        deleted = 0
        for seg in segs[:-1]:  # never the active segment
            if seg.end > limit:
                break
            mtime_ms = int(seg.path.stat().st_mtime * 1000)
            if mtime_ms + self.config.retention_ms > now_ms:
                break  # stop at the first one not expired: never delete from the middle
            store.before_segment_delete(seg.end)
            store.segments.delete_first()
            log.info("retention.segment_deleted", path=str(seg.path), start=seg.start, age_ms=now_ms - mtime_ms)
            deleted += 1
        return deleted
