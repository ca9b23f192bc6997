"""One AppendStream call's limit (mqstore.stream_appends) on a real store: the item that would pass
max_stream_messages is refused before it is stored, the items before it stay stored."""

from __future__ import annotations

import pytest

from mqstore.errors import InvalidArgument
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore.stream_appends import StreamAppends


def test_an_item_past_the_limit_is_refused_and_the_earlier_ones_stay(small_config):
    store = build_store(small_config(max_stream_messages=5))
    store.start()
    try:
        store.topic_admin.create("t")
        appends = StreamAppends(store)
        for count in (2, 3):
            appends.admit(count)
            appends.append("t", [MessageIn(body=b"a")] * count)
        with pytest.raises(InvalidArgument, match="at most 5 messages .*make it 6. The 5 messages"):
            appends.admit(1)
        assert appends.stored == 5 and [len(b) for b in appends.batches] == [2, 3]
        assert sum(store.queue_info("t", q).max_offset for q in range(store.topic_admin.get("t").queue_count)) == 5
    finally:
        store.stop()
