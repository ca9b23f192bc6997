"""A replica's consume queues follow its leader's committed offset batched under a stream of data
(mqstore.replication.replica, module docstring): at once for a heartbeat, else at most every SHOW_EVERY_S
unless SHOW_BYTES of committed log wait; the ack goes before, each data message. Fakes for the store and
the stream; the node's clock is a FakeClock."""

from __future__ import annotations

from types import SimpleNamespace

from mqstore.clock import FakeClock
from mqstore.replication import replica
from mqstore.replication.messages import LogData


class FakeStore:
    """What ReplicaFollower._apply touches of a store: the log's end grows with each data message."""

    def __init__(self):
        self.end = 0
        self.shown: list[int] = []
        self.replica_view = SimpleNamespace(visible_to=self.shown.append)
        self.config = SimpleNamespace(segment_size_bytes=1 << 30)
        self.flusher = SimpleNamespace(sync=False)
        self.commitlog = SimpleNamespace(append_replicated=self._append)

    def _append(self, offset, data, next_offset):
        self.end = next_offset

    def check_running(self):
        pass

    def log_end(self):
        return self.end

    def flushed_offset(self):
        return self.end


def _follower():
    clock = FakeClock()
    node = SimpleNamespace(clock=clock, config=SimpleNamespace(replica_backoff_max_ms=1000),
                           record_epochs=lambda history, end: None)
    store = FakeStore()
    acks = []
    stream = SimpleNamespace(welcome=SimpleNamespace(history=None), ack=acks.append)
    return replica.ReplicaFollower(store, node, link=None), store, stream, clock, acks


def _data(store, size, committed):
    return LogData(store.end, b"x" * size, store.end + size, store.end + size, committed)


def test_data_messages_show_at_most_every_interval_and_a_heartbeat_shows_at_once():
    follower, store, stream, clock, acks = _follower()
    follower._apply(stream, _data(store, 100, 0))
    assert store.shown == [0]  # the first: shown
    follower._apply(stream, _data(store, 100, 100))
    follower._apply(stream, _data(store, 100, 200))
    assert store.shown == [0] and len(acks) == 3  # within the interval: acknowledged, shown later
    clock.advance(int(replica.SHOW_EVERY_S * 1000) + 1)
    follower._apply(stream, _data(store, 100, 300))
    assert store.shown == [0, 300]  # one dispatch for the three messages' committed log
    follower._apply(stream, _data(store, 0, 400))  # a heartbeat: the stream is idle, show now
    assert store.shown == [0, 300, 400]
    assert [a.written_offset for a in acks] == [100, 200, 300, 400, 400]


def test_a_large_committed_backlog_is_shown_within_the_interval():
    follower, store, stream, clock, acks = _follower()
    follower._apply(stream, _data(store, 100, 0))
    follower._apply(stream, _data(store, 100, replica.SHOW_BYTES - 1))
    assert store.shown == [0]
    follower._apply(stream, _data(store, 100, replica.SHOW_BYTES))
    assert store.shown == [0, replica.SHOW_BYTES]
