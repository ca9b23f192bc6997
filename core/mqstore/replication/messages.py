"""The replication stream's messages in plain data (replication.proto carries them; mqstore_rpc converts)."""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.replication.epochs import EpochHistory


@dataclass(frozen=True, slots=True)
class Hello:
    replica_id: str
    address: str
    end_offset: int
    min_offset: int
    history: EpochHistory
    segment_size_bytes: int
    reads_tier: bool = False  # this node reads the object storage tier below its local log (replication.tier_join)
    pages_welcome: bool = False  # it takes a welcome in several messages (replication.tier_join.parts)


@dataclass(frozen=True, slots=True)
class QueueStart:
    """A consume queue of a replica that starts from the tier (mqstore.replication.tier_join): its minimum offset, and
    the leader's entries [first_offset, first_offset + len(entries) / 20) (from the leader's first local file of
    the queue up to its first record at or above the replica's new log start: records only in the tier). The
    entries below ``first_offset`` are in the tier's FINISHED queue files."""
    topic: str
    queue_id: int
    min_offset: int
    first_offset: int
    entries: bytes
    physical_end: int  # the end of the last entry's record (0: no entries)


@dataclass(frozen=True, slots=True)
class Welcome:
    leader_id: str
    epoch: int
    truncate_to: int
    history: EpochHistory
    start_empty: bool = False
    # With start_empty: the log below truncate_to is served from the object storage tier down to tier_min (the
    # leader's logical log start), and the consume queues start as ``queues`` say. None: no tier below.
    tier_min: int | None = None
    queues: tuple[QueueStart, ...] = ()
    # With tier_min: the leader's FINISHED uploads (records of RMQ_SYS_TIER_UPLOADS, mqstore.format.tier_upload), so
    # that the replica reads the tier at once, before it shows the tail that holds them too.
    tier_uploads: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class LogData:
    offset: int
    data: bytes  # a replica's: a memoryview of the message as received (commitlog_service.replication)
    next_offset: int
    leader_end_offset: int
    committed_offset: int


@dataclass(frozen=True, slots=True)
class Ack:
    written_offset: int
    flushed_offset: int
