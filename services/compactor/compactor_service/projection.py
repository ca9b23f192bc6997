"""The compactor's side of the Tail follower (mqstore.follow): Tail frames -> compaction logs.

Gap policy STOP: a compaction log is durable data (once the commit log has expired a segment it is the
only copy of those keys), so when retention deleted records before they were applied the follower
stays there, health turns NOT_SERVING and Stats says why; it never skips. The commit log is asked to
hold retention below the stream's start (TailRequest.hold_retention_as, :class:`HoldingSource`), so a
gap needs the compactor to be away longer than the log's retention_hold_max_ms.

The resume offset is the *durable* checkpoint: every ``checkpoint_interval_ms`` the logs are fsynced and
then the checkpoint (mqstore.format.follower_checkpoint, magic "MQCM") is replaced. A stream re-opens
there, so the hold never sits above data that is not durable yet; re-fed records are dropped by queue
offset (QueueLog.append is idempotent). A record that fails its checks raises DataLoss (unhealthy,
retried): skipping it could lose a key's latest value.

Which topics are compaction topics: the commit log's topic list (ListTopics), fetched again when a record
names a topic not seen before (topics are created before they are written, and kinds never change).
"""

from __future__ import annotations

import pathlib
import struct
import threading
from typing import Sequence

from mqstore.clock import Clock
from mqstore.compaction.store import CompactionStore
from mqstore.errors import DataLoss
from mqstore.follow import FollowConfig, Follower, GapPolicy
from mqstore.format import follower_checkpoint as fcp
from mqstore.format.record import PROPERTY_TAGS
from mqstore.format.record_reader import RecordError, records
from mqstore.model import KIND_COMPACTION, TailFrame

THREAD_NAME = "compactor-follower"
HOLD_NAME = "compactor"
CHECKPOINT = fcp.CheckpointFormat("compactor checkpoint", 0x4D51434D, 1, struct.Struct(">q"))  # records applied


class HoldingSource:
    """A TailSource whose streams hold the commit log's retention (thread-safe: the client is)."""

    def __init__(self, client, name: str = HOLD_NAME):
        self.client, self.name = client, name

    def tail(self, from_physical_offset, *, max_frame_bytes: int, heartbeat_ms: int):
        return self.client.tail(from_physical_offset, max_frame_bytes=max_frame_bytes, heartbeat_ms=heartbeat_ms,
                                hold_retention_as=self.name)


class CompactionProjection:
    """Called from the follower's thread; ``stats()`` from any (``_lock``)."""

    def __init__(self, store: CompactionStore, topic_kinds, checkpoint_path: pathlib.Path, clock: Clock,
                 checkpoint_interval_ms: int):
        self.store, self.topic_kinds, self.path, self.clock = store, topic_kinds, checkpoint_path, clock
        self.interval_ms = checkpoint_interval_ms
        self._lock = threading.Lock()
        saved = CHECKPOINT.load(checkpoint_path)
        self._durable = saved.next_physical_offset if saved else None
        self._applied_records = saved.payload[0] if saved else 0
        self._applied_to = self._durable
        self._saved_ms = clock.now_ms()
        self._kinds: dict[str, str] = {}

    def resume_offset(self) -> int | None:
        with self._lock:
            return self._durable

    def apply(self, frame: TailFrame) -> Sequence:
        if frame.records:
            try:
                for view in records(frame.records):
                    self._apply_record(view)
            except RecordError as exc:
                raise DataLoss(f"a Tail frame holds a record that fails its checks ({exc}) at byte "
                               f"{exc.position} of the frame; the compactor does not skip records") from None
        with self._lock:
            self._applied_to = frame.next_physical_offset
        if self.clock.now_ms() - self._saved_ms >= self.interval_ms:
            self.checkpoint()
        return ()

    def _apply_record(self, view) -> None:
        topic = view.topic
        kind = self._kinds.get(topic)
        if kind is None:
            self._kinds = dict(self.topic_kinds())
            kind = self._kinds.setdefault(topic, "")  # "" = not a user topic (a system one): never compacted
        if kind != KIND_COMPACTION:
            return
        raw = bytes(view.buf[view.position:view.position + view.size])
        if self.store.append(topic, view.queue_id, raw, view.queue_offset, view.property(PROPERTY_TAGS),
                             view.store_timestamp_ms):
            with self._lock:
                self._applied_records += 1

    def checkpoint(self) -> None:
        """fsync the logs, then record how far they hold the log (the follower's thread, and close)."""
        with self._lock:
            applied_to, count = self._applied_to, self._applied_records
        if applied_to is None:
            return
        self.store.sync()
        CHECKPOINT.save(self.path, fcp.FollowerCheckpoint(applied_to, self.clock.now_ms(), (count,)))
        with self._lock:
            self._durable, self._saved_ms = applied_to, self.clock.now_ms()

    def stats(self) -> tuple[int | None, int]:
        with self._lock:
            return self._durable, self._applied_records


def compactor_follower(projection: CompactionProjection, source, config: FollowConfig) -> Follower:
    return Follower(THREAD_NAME, source, projection, config, gap_policy=GapPolicy.STOP)
