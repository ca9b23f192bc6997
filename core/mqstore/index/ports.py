"""What the index service needs from the commit log, as plain Python (no grpc here).

The composition root (main.py) plugs in mqstore_rpc's ``CommitLogClient``, which speaks gRPC to the
CommitLog service and turns its status codes into mqstore errors; tests may plug in anything with the
same methods. Errors the callers rely on:

* ``Unavailable`` - the commit log cannot be reached (down, restarting, timed out): retry later;
* ``OutOfRange`` - a physical offset outside the log; ``min_value``/``max_value`` give the valid range;
* ``InvalidArgument`` - no record starts at the offset asked for.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from mqstore.follow import TailSource
from mqstore.model import StoreInfo, StoredMessage


class CommitLogReader(TailSource, Protocol):
    """Thread-safe. ``tail`` (mqstore.follow.TailSource) feeds the follower and the rebuilds."""

    def store_info(self) -> StoreInfo:
        """Log-wide facts; ``min_physical_offset`` moves up with retention."""

    def get_messages(self, physical_offsets: Sequence[int]) -> list[StoredMessage | None]:
        """The messages at these offsets, in the same order; None where the log no longer holds one."""

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store time is at or after ``timestamp_ms``."""
