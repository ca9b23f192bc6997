"""The compactor's Tail source (compactor_service.tail): every stream it opens holds the commit log's
retention below its start as the compactor (mqstore.retention_holds.COMPACTOR)."""

from __future__ import annotations

from compactor_service.tail import HoldingSource
from mqstore import retention_holds


def test_every_stream_holds_retention_as_the_compactor():
    calls = []

    class Client:
        def tail(self, start, *, max_frame_bytes, heartbeat_ms, hold_retention_as=""):
            calls.append((start, max_frame_bytes, heartbeat_ms, hold_retention_as))
            return "stream"

    source = HoldingSource(Client())
    assert source.tail(500, max_frame_bytes=1024, heartbeat_ms=20) == "stream"
    assert source.tail(None, max_frame_bytes=1, heartbeat_ms=2) == "stream"
    assert calls == [(500, 1024, 20, retention_holds.COMPACTOR), (None, 1, 2, retention_holds.COMPACTOR)]
