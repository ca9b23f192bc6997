"""The compactor's Tail source: the commit log client's Tail stream, holding the log's retention below the
stream's start as the compactor (mqstore.compaction.projection says why).

Thread-safe: the client is.
"""

from __future__ import annotations

from mqstore.compaction.projection import HOLD_NAME


class HoldingSource:
    """A TailSource (mqstore.follow) whose streams hold the commit log's retention as ``name``."""

    def __init__(self, client, name: str = HOLD_NAME):
        self.client, self.name = client, name

    def tail(self, from_physical_offset, *, max_frame_bytes: int, heartbeat_ms: int):
        return self.client.tail(from_physical_offset, max_frame_bytes=max_frame_bytes, heartbeat_ms=heartbeat_ms,
                                hold_retention_as=self.name)
