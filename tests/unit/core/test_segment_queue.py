"""SegmentQueue on real files: retention passes that overlap."""

from __future__ import annotations

import os
import threading

from mqstore.log.segment import SegmentQueue

SIZE = 4096


def test_two_retention_passes_at_once_delete_only_expired_segments(tmp_path):
    queue = SegmentQueue(tmp_path, SIZE, preallocate=False)
    queue.load()
    for i in range(3):
        queue.create(i * SIZE)
    now_ms = 10_000_000
    os.utime(queue.segments[0].path, (1000, 1000))  # expired; the second is fresh
    other: list[threading.Thread] = []
    deleted = []

    def before_delete(new_min_offset: int) -> None:
        if not other:  # the maintenance duty and, say, an operator's call overlap here
            other.append(threading.Thread(target=lambda: deleted.append(
                queue.delete_expired(3 * SIZE, now_ms, 1000, lambda _: None))))
            other[0].start()
            other[0].join(timeout=1.0)  # without serialisation it runs its whole pass now

    deleted.append(queue.delete_expired(3 * SIZE, now_ms, 1000, before_delete))
    other[0].join(timeout=30)
    assert not other[0].is_alive()
    assert sorted(deleted) == [0, 1]
    assert [seg.start for seg in queue.segments] == [SIZE, 2 * SIZE]
    assert all(seg.path.exists() for seg in queue.segments)
    queue.close()
