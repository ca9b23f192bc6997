"""A replica's acks coalesced (mqstore.replication.replica, module docstring): a data message ending below the
leader's end it carries has a successor on its way and is acknowledged by that one's ack; a message reaching
the leader's end, a heartbeat, or the ACK_EVERY-th message since the last ack is acknowledged at once. Fakes
for the store and the stream (test_replica_show's)."""

from __future__ import annotations

from mqstore.replication import replica
from mqstore.replication.messages import LogData

from tests.unit.replication.test_replica_show import _follower


def _data(store, size, leader_end):
    return LogData(store.end, b"x" * size, store.end + size, leader_end, 0)


def test_a_lone_message_reaching_the_leaders_end_is_acknowledged_at_once():
    follower, store, stream, _, acks = _follower()
    follower._apply(stream, _data(store, 100, 100))
    assert [a.written_offset for a in acks] == [100]


def test_a_message_with_a_successor_on_its_way_is_acknowledged_by_the_successors_ack():
    follower, store, stream, _, acks = _follower()
    follower._apply(stream, _data(store, 100, 250))  # the leader held 250: more comes at once
    assert acks == []
    follower._apply(stream, _data(store, 150, 250))  # reaches the leader's end: one ack for both
    assert [(a.written_offset, a.flushed_offset) for a in acks] == [(250, 250)]
    assert follower.acks_left_out == 1


def test_a_heartbeat_is_always_acknowledged():
    follower, store, stream, _, acks = _follower()
    follower._apply(stream, _data(store, 100, 1000))
    follower._apply(stream, _data(store, 0, 1000))  # no bytes: the leader measures lag by its ack
    assert [a.written_offset for a in acks] == [100]


def test_a_replica_catching_up_acknowledges_every_ack_every_th_message():
    follower, store, stream, _, acks = _follower()
    far = 100 * (3 * replica.ACK_EVERY + 1)
    for _ in range(3 * replica.ACK_EVERY):
        follower._apply(stream, _data(store, 100, far))
    every = replica.ACK_EVERY * 100
    assert [a.written_offset for a in acks] == [every, 2 * every, 3 * every]
