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


@dataclass(frozen=True, slots=True)
class Welcome:
    leader_id: str
    epoch: int
    truncate_to: int
    history: EpochHistory
    start_empty: bool = False


@dataclass(frozen=True, slots=True)
class LogData:
    offset: int
    data: bytes
    next_offset: int
    leader_end_offset: int
    committed_offset: int


@dataclass(frozen=True, slots=True)
class Ack:
    written_offset: int
    flushed_offset: int
