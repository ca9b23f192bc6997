"""A commit of several offsets is all or nothing after a crash (mqstore.consumer_offsets): its rows are one
record of RMQ_SYS_CONSUMER_OFFSETS, and recovery keeps or cuts a record whole. A crash that tears that
record (its second half never reached the file) leaves every row of it out, and the offsets as the commit
before it left them; pop's offsets never go without its revive checkpoint, nor the checkpoint without them."""

from __future__ import annotations

import pytest

from mqstore import store_offsets
from mqstore.format import offset_commit
from mqstore.model import MessageIn
from mqstore.store_parts import build_store

pytestmark = pytest.mark.crash


def test_a_torn_multi_row_commit_leaves_none_of_its_rows(small_config):
    config = small_config()
    store = build_store(config)
    store.start()
    store.topic_admin.create("t", 2)
    store.append("t", [MessageIn(body=b"x", queue_id=i % 2) for i in range(20)])
    store_offsets.commit_offsets(store, [("g", "t", 0, 1), ("g", "t", 1, 1), ("CID_REVIVE", "t", 0, 2)])
    store_offsets.commit_offsets(store, [("g", "t", 0, 7), ("g", "t", 1, 8), ("CID_REVIVE", "t", 0, 9)])
    info = store.queue_info(offset_commit.TOPIC, 0)
    last = store.pull(offset_commit.TOPIC, 0, info.max_offset - 1).messages[0].record
    store.halt()
    size = config.segment_size_bytes
    path = config.commitlog_dir / f"{last.physical_offset - last.physical_offset % size:020d}"
    with open(path, "r+b") as f:  # zero the second half of the last commit's record: a torn copy
        f.seek(last.physical_offset % size + last.size // 2)
        f.write(bytes(last.size - last.size // 2))
    store = build_store(config)
    store.start()
    try:
        assert store.commitlog.written_offset == last.physical_offset  # the torn record was cut
        assert store.offsets.rows() == [("CID_REVIVE", "t", 0, 2), ("g", "t", 0, 1), ("g", "t", 1, 1)]
    finally:
        store.stop()
