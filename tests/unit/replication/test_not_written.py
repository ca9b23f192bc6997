"""commitlog.proto, Append: "UNAVAILABLE with trailer mqstore-error NotWritten when the leader refused before writing
anything (its etcd lease unconfirmed ...; or it is handing its leadership over): safe to send again as it is". The
fault injected on a real store and its replication node: the leader's lease lapses (no renewal within the fence
time) or a handover starts while a producer appends; the refused append must leave the log as it was, and the
same append sent again once the leader is confirmed must be stored exactly once."""

from __future__ import annotations

import pytest

from mqstore.errors import NotWritten
from mqstore.model import MessageIn
from tests.unit.replication.pair import open_node


def _bodies(store) -> list[bytes]:
    return [m.record.body for m in store.pull("t", 0, 0, max_messages=100).messages]


@pytest.mark.parametrize("refusal", ["lease lapsed", "handing over"])
def test_a_refused_append_writes_nothing_and_sent_again_is_stored_once(small_config, tmp_path, refusal):
    store, node = open_node(small_config, tmp_path, "a")
    try:
        node.become_leader(1, frozenset({"a"}))
        store.topic_admin.create("t", 1)
        batch = [MessageIn(body=b"first"), MessageIn(body=b"second")]
        store.append("t", [MessageIn(body=b"before")], replication="ASYNC")
        end = store.log_end()
        if refusal == "lease lapsed":
            node.lease_valid_until_s = node._monotonic() - 0.001  # the last renewal too long ago: fenced
        else:
            node.handing_over_to = "b"
        with pytest.raises(NotWritten):
            store.append("t", batch, replication="ASYNC")
        assert store.log_end() == end and _bodies(store) == [b"before"]   # nothing of the batch written
        node.lease_valid_until_s, node.handing_over_to = None, ""          # renewed / the handover given up
        store.append("t", batch, replication="ASYNC")                      # the same request again
        assert _bodies(store) == [b"before", b"first", b"second"]          # stored once
    finally:
        store.stop()
