"""A replica's stream counts the leader's silence from when the replica waits for it (commitlog_service.replication
GrpcReplicationStream and its watchdog): the replica's own handshake after the welcome (cutting its log) is not the
leader's silence. A cut that took ~6 s made the watchdog call the leader silent at 2 s and end the stream, and the
replica handshook a second time (make compose-check-chaos)."""

from __future__ import annotations

import types

from commitlog_service import replication as R
from mqstore.replication.epochs import EpochHistory
from mqstore.replication.messages import Hello, LogData
from mqstore_rpc.gen.mqstore.v1 import replication_pb2 as pb


class _Call:
    """The leader's side of a call: a welcome, then one heartbeat; notes the stream's silence when the replica
    asks for the heartbeat (it waits for the leader from then on)."""

    def __init__(self):
        self.stream = None
        self.silence_when_waited: list[float] = []
        self._messages = iter([pb.LeaderMessage(welcome=pb.LeaderWelcome(leader_id="a", epoch=1)),
                               LogData(0, b"", 0, 0, 0)])

    def __iter__(self):
        return self

    def __next__(self):
        if self.stream is not None:
            self.silence_when_waited.append(self.stream.silent_s())
        return next(self._messages)

    def send(self, message) -> None:
        pass

    def cancel(self) -> None:
        pass


def test_the_replicas_own_handshake_is_not_the_leaders_silence(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(R, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    call = _Call()
    stub = types.SimpleNamespace(Replicate=lambda requests: (next(requests), call)[1])
    stream = R.GrpcReplicationStream(stub, "a:1", Hello("b", "b:1", 0, 0, EpochHistory(()), 1 << 20), 3600.0)
    try:
        stream.read_welcome()
        now[0] += 10.0  # the handshake: the replica cuts its log
        call.stream = stream
        data = next(iter(stream))
        assert data.next_offset == 0
        assert call.silence_when_waited == [0.0]  # from when it waits for the leader, not from the welcome
    finally:
        stream.cancel()
