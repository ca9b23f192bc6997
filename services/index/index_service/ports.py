"""What the index service needs from the commit log, as plain Python (no grpc here).

The composition root (main.py) plugs in ``commitlog_client.CommitLogClient``, which speaks gRPC to the
CommitLog service and turns its status codes into mqstore errors; tests may plug in anything with the
same methods. Errors the callers rely on:

* ``Unavailable`` - the commit log cannot be reached (down, restarting, timed out): retry later;
* ``OutOfRange`` - a physical offset outside the log; ``min_value``/``max_value`` give the valid range;
* ``InvalidArgument`` - no record starts at the offset asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence


@dataclass(frozen=True, slots=True)
class Frame:
    """One Tail frame: whole raw records back to back (RocketMQ's V1 layout), where to resume, and
    the visible end of the log when the frame was built."""

    records: bytes
    record_count: int
    next_physical_offset: int
    log_end_physical_offset: int


@dataclass(frozen=True, slots=True)
class FetchedMessage:
    """The facts of one stored message that verifying a query needs; ``payload`` is the adapter's
    own representation (the StoredMessage proto), passed through untouched for include_messages."""

    physical_offset: int
    topic: str
    keys: tuple[str, ...]
    uniq_key: str
    store_timestamp_ms: int
    queue_id: int
    queue_offset: int
    msg_id: str
    size_bytes: int
    payload: Any = None


class TailStream(Protocol):
    """An open Tail: iterate for frames; ``cancel()`` (from any thread) ends the iteration."""

    def __iter__(self) -> Iterator[Frame]: ...

    def cancel(self) -> None: ...


class CommitLogReader(Protocol):
    """Thread-safe."""

    def tail(self, from_physical_offset: int | None, *, max_frame_bytes: int, heartbeat_ms: int) -> TailStream:
        """Frames from ``from_physical_offset`` (a record start), or from the earliest record when None."""

    def min_physical_offset(self) -> int:
        """The first physical offset the log still holds (it moves up with retention)."""

    def fetch(self, physical_offsets: Sequence[int]) -> list[FetchedMessage | None]:
        """The messages at these offsets, in the same order; None where the log no longer holds one."""

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store time is at or after ``timestamp_ms``."""
