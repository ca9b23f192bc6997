"""Local retention of the commit log with the object storage tier on (``--local-retention-ms/-bytes``, issue 36):
the duty ``tier-local-retention``, on every node, deletes the oldest local segments whose upload FINISHED once
they are older than ``local_retention_ms`` or the local log is larger than ``local_retention_bytes``; their
records are then read from the tier (mqstore.tier.reads). The consume queues keep their entries: the store's
logical minimum stays the total retention's (``retention_ms``), which this duty applies to the part of the log
only in the tier too.

A local segment goes only when, oldest first and never the last one:
  - its upload is FINISHED in the ledger (a segment not uploaded, or whose upload failed, stays local: the
    uploader's floor, Retention.add_floor("tier"), holds it too), with the segment's size;
  - it is due: older (file mtime) than ``local_retention_ms``, or the local log beyond ``local_retention_bytes``;
  - it ends at or below the store's retention limit (Retention.limit: flushed and dispatched, the consumer
    offsets' floor, the timer's floor, the followers' holds at or above the local log's start: a hold below it
    is a Tail that reads the tier, which reads a segment deleted meanwhile from the tier too);
  - it holds no record the node reads from the local log only: the latest FINISHED record of a segment still
    in the log (the ledger maps segments to objects, so it must stay readable) and the consumer offsets'
    live records. Before a pass deletes, the leader re-appends both (the FINISHED records again,
    ``offsets.rewrite_below``), and a replica waits until those copies reached it. Those topics' consume queues
    then start at the local log (Retention.correct_local_only), at every start too.

Total retention of the tiered part: a segment only in the tier goes from the logical log (every consume
queue's minimum past it, Retention.before_segment_delete) once the first record after it (the next segment's
first, local or in the tier) is older than ``retention_ms``. Its object is then deleted by the tier's own retention
(the uploader on the leader, below :attr:`LocalRetention.logical_min`; mqstore.tier.uploader).

Thread-safety: ``step`` runs on the duty's thread; ``logical_min`` is a plain int, replaced whole.
"""

from __future__ import annotations

from typing import Callable

import structlog

from mqstore import failpoints
from mqstore.background import Duty
from mqstore.errors import MqStoreError
from mqstore.tier.ledger import Ledger

log = structlog.get_logger("mqstore.tier")


class LocalRetention(Duty):
    def __init__(self, store, ledger: Ledger, *, local_retention_ms: int, local_retention_bytes: int,
                 writable: Callable[[], bool], interval_ms: int):
        """``writable()``: this node appends (the leader, or a single node): it re-appends what must stay local."""
        super().__init__("tier-local-retention", interval_s=interval_ms / 1000, backoff_initial_s=0.1,
                         backoff_max_s=5.0)
        self.store = store
        self.ledger = ledger
        self.local_retention_ms = local_retention_ms
        self.local_retention_bytes = local_retention_bytes
        self.writable = writable
        self.logical_min = store.segments.min_offset  # the log's oldest byte kept, locally or in the tier
        self.deleted = 0        # local segments deleted (tests, status)
        self.rerecorded = 0     # FINISHED records appended again

    def open(self) -> None:
        """At start, before serving: the logical log reaches down through every segment FINISHED in the tier
        right below the local one, and every consume queue starts there."""
        self.ledger.catch_up()
        finished, _ = self.ledger.snapshot()
        size, low = self.store.segments.segment_size, self.store.segments.min_offset
        while low - size >= 0 and low - size in finished:
            low -= size
        self.logical_min = low
        self.store.retention.before_segment_delete(low)

    def step(self) -> None:
        self.ledger.catch_up()
        self._expire_tiered(self.store.clock.now_ms())
        due = self._due(self.store.clock.now_ms())
        if not due:
            return
        end = due[-1][1]
        if self.writable():
            self._keep_readable(end)
        self.ledger.catch_up()
        local_min = self.store.segments.min_offset  # a hold below it is a Tail reading the tier: it holds nothing local
        limit = min(self.store.retention.limit(holds_from=local_min), self._ledger_floor(), self.store.flushed_offset(),
                    self.store.visible_offset())
        for start, seg_end in due:
            if seg_end > limit or self.stopping:
                break
            failpoints.hit("tier.local_retention.before_delete")
            if not self.store.segments.delete_first_at(start):
                break
            self.store.retention.correct_local_only(self.store.segments.min_offset)
            self.deleted += 1
            log.info("tier.local_segment_deleted", start=start, end=seg_end, local_min=self.store.segments.min_offset,
                     logical_min=self.logical_min)

    def _due(self, now_ms: int) -> list[tuple[int, int]]:
        """(start, end) of the oldest local segments due for deletion whose upload FINISHED, oldest first."""
        segments = self.store.segments.segments
        size = self.store.segments.segment_size
        local_bytes = len(segments) * size
        due = []
        for seg in segments[:-1]:
            upload = self.ledger.finished_upload(seg.start)
            if upload is None or upload.segment_size != seg.size:
                break
            mtime_ms = int(seg.path.stat().st_mtime * 1000)
            old = self.local_retention_ms > 0 and mtime_ms + self.local_retention_ms <= now_ms
            big = self.local_retention_bytes > 0 and local_bytes - len(due) * size > self.local_retention_bytes
            if not (old or big):
                break
            due.append((seg.start, seg.end))
        return due

    def _ledger_floor(self) -> int:
        """The lowest latest FINISHED record of a segment still in the log: the local log keeps it."""
        positions = self.ledger.positions()
        return min((max(at, 0) for base, at in positions.items() if base >= self.logical_min),
                   default=1 << 62)

    def _keep_readable(self, end: int) -> None:
        """The leader: re-append the FINISHED records and the live consumer offsets that lie below ``end``."""
        positions = self.ledger.positions()
        finished, _ = self.ledger.snapshot()
        for base, at in sorted(positions.items()):
            if base >= self.logical_min and at < end and base in finished:
                self.ledger.record(finished[base])
                self.rerecorded += 1
        try:
            self.store.offsets.rewrite_below(end)
        except (MqStoreError, OSError) as exc:
            log.warning("offsets.rewrite_failed", below=end, error=type(exc).__name__, message=str(exc),
                        why="the segments holding live offsets stay local until a rewrite succeeds")

    def _expire_tiered(self, now_ms: int) -> None:
        """Total retention of the segments only in the tier, oldest first (the module docstring)."""
        size = self.store.segments.segment_size
        retention_ms = self.store.config.retention_ms
        limit = self.store.retention.limit()
        while self.logical_min < self.store.segments.min_offset and not self.stopping:
            end = self.logical_min + size
            if end > limit:
                return
            try:
                newest_ms = self.store.commitlog.store_timestamp_at(end)
            except MqStoreError as exc:  # the tier does not answer: the next pass tries again
                log.warning("tier.expiry_deferred", segment=self.logical_min, error=type(exc).__name__,
                            message=str(exc))
                return
            if newest_ms + retention_ms > now_ms:
                return
            self.store.retention.before_segment_delete(end)
            log.info("tier.segment_expired", start=self.logical_min, end=end, why="older than retention_ms")
            self.logical_min = end
