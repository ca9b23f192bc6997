"""What the Compactor's answers derive from its state (mqstore.compaction.api), not the servicer: how far
the logs lag the commit log, and why a queue still holds tombstones."""

from __future__ import annotations

import dataclasses

from mqstore.compaction.api import Description, ServiceStats


def test_bytes_behind_is_unknown_without_the_logs_end_and_never_negative():
    stats = ServiceStats(True, 500, None, "", 1, 10, "")
    assert stats.bytes_behind is None
    assert dataclasses.replace(stats, log_end_physical_offset=800).bytes_behind == 300
    assert dataclasses.replace(stats, log_end_physical_offset=400).bytes_behind == 0


def test_a_queue_holding_tombstones_says_why():
    @dataclasses.dataclass
    class Dirt:
        tombstones_kept: int

    def described(kept: int) -> Description:
        return Description(None, Dirt(kept), None, False, False, 0, 0, "", "", 0, 0, 0, 0)

    assert described(0).tombstones_pending_why == ""
    assert "delete_retention_ms" in described(3).tombstones_pending_why
