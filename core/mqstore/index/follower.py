"""The index's side of the Tail follower (mqstore.follow): its projection and its settings.

The follower (thread ``index-follower``) opens ``CommitLog.Tail`` at ``IndexStore.resume_physical_offset()``
(from the earliest record while the index holds nothing), and :class:`IndexProjection` decodes each
frame with the shared record codec (with the compiled codec: into IndexColumns, columns.py) and applies
its records as one batch with the frame's ``next_physical_offset`` (batching is what makes the build
fast; the store checkpoints every ``checkpoint_interval_ms``). Heartbeat frames advance the resume point
past filtered or blank bytes. Failures, reconnects, the log being ahead or behind: see mqstore.follow.

A record that fails its checks (CRC, lengths) is not indexed: the frame's other records are, and the
bad range goes back to the follower, which logs it (``follower.damaged_record_skipped``) and keeps it
for Stats (decode.decode_frame says how the next record is found when TOTALSIZE itself is bad).
Stopping there instead would leave every later record unindexed, while queries answer OK with
nothing; the damaged record itself is known to the commit log too (Pull and GetMessage answer
DATA_LOSS for it), so nothing is hidden by going on.

The index can be rebuilt from the log, so its gap policy is SKIP: when retention has deleted records
before they were indexed, they no longer exist anywhere; the follower goes on from the log's first
record and counts the skipped bytes (``follower.gap``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mqstore.errors import InvalidArgument
from mqstore.follow import FollowConfig, Follower, GapPolicy, TailSource
from mqstore.model import TailFrame

from . import columns
from .decode import DamagedRange, decode_frame

THREAD_NAME = "index-follower"


@dataclass(frozen=True)
class FollowerConfig(FollowConfig):
    """How the follower and the upkeep thread talk to the commit log. Frozen, validated."""

    retention_interval_ms: int = 10_000   # how often the index follows the log's retention
    rebuild_interval_ms: int = 10_000     # how often the upkeep thread looks for ranges to rebuild

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("retention_interval_ms", "rebuild_interval_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")


class IndexProjection:
    """Tail frames -> IndexStore.apply. Called from the follower's thread only; the store is thread-safe."""

    def __init__(self, store):
        self.store = store

    def resume_offset(self) -> int | None:
        return self.store.resume_physical_offset()

    def apply(self, frame: TailFrame) -> Sequence[DamagedRange]:
        if not frame.records:  # a heartbeat: applied only when it moves the resume point
            resume = self.store.resume_physical_offset()
            if resume is None or frame.next_physical_offset > resume:
                self.store.apply((), frame.next_physical_offset)
            return ()
        if columns.available():  # the compiled build: the same records, files and ranges
            decoded = columns.decode_columns(frame.records, frame.next_physical_offset,
                                             self.store.config.max_keys_per_message)
            self.store.apply(decoded.columns, frame.next_physical_offset)
        else:
            decoded = decode_frame(frame.records, frame.next_physical_offset)
            self.store.apply(decoded.records, frame.next_physical_offset)
        return decoded.damaged


def index_follower(store, source: TailSource, config: FollowerConfig) -> Follower:
    return Follower(THREAD_NAME, source, IndexProjection(store), config, gap_policy=GapPolicy.SKIP)
