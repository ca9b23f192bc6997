"""Which of the CommitLog port's reads run on its event loop (mqstore.hot_reads: pull_at_once and records_at_once,
mqstore_rpc.aio.at_once_when): a Pull, GetMessage or GetMessages of the hot local log (its last two segments, the
queue's last two files) is answered on the loop; one of an older segment, one only in the tier, a long poll that
waits and a filtered Pull run in the handler pool, and a tier read that hangs holds a pool thread, not the loop:
other calls are answered meanwhile. A store in this process, served by a port of its own on 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading

import grpc
import pytest

from mqstore.hot_reads import pull_at_once, records_at_once
from mqstore.model import MessageIn
from mqstore.store_parts import build_store
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc
from mqstore_rpc.server import ManagedServer, ServerConfig
from commitlog_service.servicer import CommitLogServicer, add_to_server
from tests.support.waiting import WAIT_S, wait_until

pytestmark = pytest.mark.integration

SEGMENT = 16 * 1024
LOOP = "grpc-aio-loop"  # mqstore_rpc.aio.LoopThread's thread


class Rig:
    """A store of ~9 segments of one queue (tags "a"), its CommitLog port, and the threads its record reads ran on."""

    def __init__(self, store):
        self.store = store
        self.reads: list[str] = []
        for name in ("checked_at", "decode_at"):  # the compiled codec's reads and the reference's
            self._spy(name)
        store.topic_admin.create("t", 1)
        self.bodies = []
        for batch in range(200):  # bounded: stops at 9 segments
            if store.log_end() > 9 * SEGMENT:
                break
            more = [b"%d:%d:" % (batch, i) + bytes([batch % 251]) * 700 for i in range(2)]
            store.append("t", [MessageIn(body=body, tags="a") for body in more])
            self.bodies += more
        wait_until(lambda: store.visible_offset() >= store.log_end(), "every record visible")

    def _spy(self, name: str) -> None:
        real = getattr(self.store.commitlog, name)

        def read(*args, **kwargs):
            self.reads.append(threading.current_thread().name)
            return real(*args, **kwargs)
        setattr(self.store.commitlog, name, read)

    def read_on(self, call) -> tuple[object, set[str]]:
        """What ``call()`` answered, and the threads the record reads it made ran on."""
        before = len(self.reads)
        answer = call()
        return answer, set(self.reads[before:])


@contextlib.contextmanager
def serving(small_config):
    store = build_store(small_config(segment_size_bytes=SEGMENT))
    store.start()
    server = ManagedServer(ServerConfig(port=0, grace_s=0.5))
    try:
        rig = Rig(store)
        add_to_server(CommitLogServicer(store, scheduler=None), server.grpc_server)
        server.start()
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield rig, commitlog_pb2_grpc.CommitLogStub(channel)
    finally:
        server.stop()
        store.stop()


def _pull(stub, offset: int, **more) -> pb.PullResponse:
    return stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=offset, max_messages=4, **more), timeout=WAIT_S)


def test_reads_of_the_hot_log_are_answered_on_the_loop_and_the_others_in_the_pool(small_config):
    with serving(small_config) as (rig, stub):
        end = len(rig.bodies)
        hot = end - 4
        answer, threads = rig.read_on(lambda: _pull(stub, hot))
        assert [m.body for m in answer.messages] == rig.bodies[hot:end] and threads == {LOOP}
        answer, threads = rig.read_on(lambda: _pull(stub, hot, long_poll_ms=5000))  # records there: no wait
        assert len(answer.messages) == 4 and threads == {LOOP}
        answer, threads = rig.read_on(lambda: _pull(stub, 0))  # the first segment: cold
        assert [m.body for m in answer.messages] == rig.bodies[:4] and threads and LOOP not in threads
        answer, threads = rig.read_on(lambda: _pull(stub, hot, tags=["a"]))  # filtered
        assert len(answer.messages) == 4 and threads and LOOP not in threads
        assert pull_at_once(rig.store, "t", 0, hot) and not pull_at_once(rig.store, "t", 0, 0)
        assert not pull_at_once(rig.store, "t", 0, hot, max_messages=10_000)  # too long a walk for the loop

        first = _pull(stub, 0).messages[0].physical_offset
        last = _pull(stub, end - 1).messages[0].physical_offset
        answer, threads = rig.read_on(lambda: stub.GetMessage(pb.GetMessageRequest(physical_offset=last),
                                                              timeout=WAIT_S))
        assert answer.body == rig.bodies[-1] and threads == {LOOP}
        answer, threads = rig.read_on(lambda: stub.GetMessage(pb.GetMessageRequest(physical_offset=first),
                                                              timeout=WAIT_S))
        assert answer.body == rig.bodies[0] and threads and LOOP not in threads
        answer, threads = rig.read_on(lambda: stub.GetMessages(pb.GetMessagesRequest(physical_offsets=[last, last]),
                                                               timeout=WAIT_S))
        assert [f.message.body for f in answer.messages] == [rig.bodies[-1]] * 2 and threads == {LOOP}
        answer, threads = rig.read_on(lambda: stub.GetMessages(pb.GetMessagesRequest(physical_offsets=[last, first]),
                                                               timeout=WAIT_S))
        assert [f.message.body for f in answer.messages] == [rig.bodies[-1], rig.bodies[0]]
        assert threads and LOOP not in threads

        # A long poll at the queue's end waits in the pool; the record appended meanwhile is read there too
        long_polls, parked = rig.store._long_polls, threading.Event()
        real_wait, wait_threads = long_polls.wait, []

        def wait(*args, **kwargs):
            wait_threads.append(threading.current_thread().name)
            parked.set()  # (just before it parks: a record appended from now on is seen, before or after)
            return real_wait(*args, **kwargs)
        long_polls.wait = wait
        assert not pull_at_once(rig.store, "t", 0, end, long_poll_ms=1)
        waiting = stub.Pull.future(pb.PullRequest(topic="t", queue_id=0, offset=end, long_poll_ms=int(WAIT_S * 1000)),
                                   timeout=WAIT_S)
        assert parked.wait(WAIT_S)
        before = len(rig.reads)
        rig.store.append("t", [MessageIn(body=b"late")])
        assert [m.body for m in waiting.result(WAIT_S).messages] == [b"late"]
        assert wait_threads and LOOP not in wait_threads
        assert set(rig.reads[before:]) and LOOP not in rig.reads[before:]


def test_a_read_of_the_tier_runs_in_the_pool_and_one_that_hangs_does_not_hold_the_loop(small_config):
    with serving(small_config) as (rig, stub):
        store = rig.store
        first = store.segments.segments[0]
        saved = bytes(first.buffer[:SEGMENT])
        entered, release = threading.Event(), threading.Event()
        tier_threads: list[str] = []

        def tier(physical_offset: int, size: int) -> bytes:  # a tier that hangs until released
            tier_threads.append(threading.current_thread().name)
            entered.set()
            release.wait(WAIT_S)
            return saved[physical_offset:physical_offset + size]
        store.commitlog.remote = tier
        assert store.segments.delete_first_at(0)  # the first segment is only in the tier now
        try:
            hung = stub.Pull.future(pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=2), timeout=WAIT_S)
            assert entered.wait(WAIT_S)
            assert LOOP not in tier_threads
            # The loop answers meanwhile: a hot Pull (read on the loop) and GetStoreInfo
            hot = len(rig.bodies) - 2
            answer, threads = rig.read_on(lambda: _pull(stub, hot))
            assert [m.body for m in answer.messages] == rig.bodies[hot:] and threads == {LOOP}
            assert stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=WAIT_S).segment_count >= 8
            assert not hung.done()
        finally:
            release.set()
        assert [m.body for m in hung.result(WAIT_S).messages] == rig.bodies[:2]
        assert not pull_at_once(store, "t", 0, 0) and not records_at_once(store, (0,))
        # The second segment is now the first local one: with the tier on, local retention may delete it under a
        # read, so it is not hot even when it is one of the last two
        assert store.commitlog.is_hot(store.segments.segments[-1].start)
        assert not store.commitlog.is_hot(store.segments.segments[0].start)
