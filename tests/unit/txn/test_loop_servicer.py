"""TransactionServicer (txn_service.servicer) over mqstore.txn.onloop.LoopCalls: which Transact frames
and unary calls the coordinator gets on the event loop and which in the handler pool, in order, with the
caller of a deferred permission check carried to the pool; a two-way Rollback on the loop (it waits for its OP
record there), and a Commit refused on the loop while a rollback is not durable refused once it is, there too."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from mqstore.errors import FailedPrecondition
from mqstore.model import DURABILITY_WRITTEN
from mqstore.txn.coordinator import Ended, Prepared
from mqstore.txn.onloop import LoopCalls, PortIo
from mqstore.txn.transact import BY_ONE_WAY, TransactStreams
from mqstore_rpc import auth
from mqstore_rpc.gen.mqstore.v1 import txn_pb2
from txn_service.servicer import TransactionServicer

PREPARE = txn_pb2.TransactRequest(request_id=1, prepare=txn_pb2.PrepareRequest(topic="t"))
CARRIED = txn_pb2.TransactRequest(request_id=2, ends=[txn_pb2.CarriedEnd(transaction_id="a", decision=1)])
ONE_WAY = txn_pb2.TransactRequest(request_id=3, one_way=True, commit=txn_pb2.EndRequest(transaction_id="b"))
COMMIT = txn_pb2.TransactRequest(request_id=4, commit=txn_pb2.EndRequest(transaction_id="c"))
ROLLBACK = txn_pb2.TransactRequest(request_id=5, rollback=txn_pb2.EndRequest(transaction_id="d"))
FRAMES = [PREPARE, CARRIED, ONE_WAY, COMMIT, ROLLBACK]


class RecordingCoordinator:
    """Records where each call ran (its thread), how (``wait_durable``) and the caller it saw; refuses a
    Commit of "pending" (a rolled-back transaction whose OP record is not written yet) without waiting, and
    a one-way end ("end <id>") suspends once on the loop."""

    def __init__(self):
        self.ran: list[tuple] = []

    def _note(self, what, wait_durable=True):
        self.ran.append((what, threading.current_thread().name, auth._current.get(), wait_durable))

    def prepare(self, topic, messages, group, txn_id=""):
        self._note("Prepare")
        return Prepared("t-1", [], DURABILITY_WRITTEN)

    async def prepare_async(self, io, topic, messages, group, txn_id=""):
        self._note("Prepare", False)
        return Prepared("t-1", [], DURABILITY_WRITTEN)

    def commit(self, txn_id, by="producer", wait_durable=True):
        self._note(("end " if by == BY_ONE_WAY else "Commit ") + txn_id, wait_durable)
        return Ended("COMMITTED", False, [])

    def rollback(self, txn_id, by="producer", wait_durable=True):
        self._note(("end " if by == BY_ONE_WAY else "Rollback ") + txn_id, wait_durable)
        return Ended("ROLLED_BACK", False, [])

    thread_io = "thread io"  # the real one's: every call waits on the thread, nothing suspends

    async def end_async(self, io, decision, txn_id, by="producer"):
        if by == BY_ONE_WAY:
            if io is not self.thread_io:
                await asyncio.sleep(0)
            self._note(f"end {txn_id}", False)
            return Ended(decision, False, [])
        self._note("Commit " + txn_id, False)
        if txn_id == "pending":
            raise FailedPrecondition("rolled back")
        return Ended("COMMITTED", False, [])

    async def rollback_async(self, io, txn_id, by="producer"):
        self._note("Rollback " + txn_id, False)
        await asyncio.sleep(0)  # its wait for the OP record suspends the caller, never the loop
        self._note("durable " + txn_id, False)
        return Ended("ROLLED_BACK", False, [])

    async def wait_rollback_durable_async(self, txn_id):
        await asyncio.sleep(0)
        self._note("durable " + txn_id, False)

    def check_end(self, txn_id, expected=("", ""), permit=None):
        pass

    def rollback_pending(self, txn_id):
        return txn_id == "pending"


class Recording(TransactionServicer):
    def __init__(self, append_waits: bool, pool, overlaps: bool = False):
        coordinator = RecordingCoordinator()
        streams = TransactStreams(coordinator, max_streams=1)
        calls = LoopCalls(coordinator, streams, lambda: append_waits, PortIo(None, pool, overlaps))
        super().__init__(None, None, calls)
        self.coordinator = coordinator

    @property
    def ran(self):
        return self.coordinator.ran

    @ran.setter
    def ran(self, value):
        self.coordinator.ran = value


class Caller:
    """A caller of deferred permission checks (mqstore_rpc.auth) that allows everything."""
    principal = method = context = None

    def __init__(self):
        self.interceptor = self

    def _check(self, *args):
        pass


class Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


async def _frames(frames):
    for frame in frames:
        yield frame


def _run(servicer: Recording, caller: object, call) -> object:
    """``call()`` (a coroutine) on a fresh loop, as a call's task with ``caller`` set; ``servicer.ran`` then
    says "loop" or "pool" for where each step ran."""
    async def task() -> object:
        auth._current.set(caller)  # as the authentication wrapper sets it around each step
        loop_thread = threading.current_thread().name
        out = await call()
        servicer.ran = [(w, "loop" if name == loop_thread else "pool", seen is caller, durable)
                        for w, name, seen, durable in servicer.ran]
        return out
    return asyncio.run(task())


def _transact(servicer: Recording, caller: object, frames) -> list[int]:
    async def answers() -> list[int]:
        return [a.request_id async for a in servicer.Transact(_frames(frames), Context())]
    return _run(servicer, caller, answers)


def test_frames_run_on_the_loop_in_order_with_their_caller_a_rollback_too():
    caller = Caller()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(False, pool)
        assert _transact(servicer, caller, FRAMES) == [1, 4, 5]  # in order; ends only and one-way: no answer
    assert [(w, where) for w, where, _, _ in servicer.ran] == [
        ("Prepare", "loop"), ("end a", "loop"), ("end b", "loop"), ("Commit c", "loop"), ("Rollback d", "loop"),
        ("durable d", "loop")]
    assert all(seen for _, _, seen, _ in servicer.ran)  # a deferred check in the pool sees the caller
    # on the loop, a frame never waits for a rollback's OP record
    assert all(not durable for _, where, _, durable in servicer.ran if where == "loop")


def test_while_appends_wait_every_frame_but_a_rollback_runs_in_the_pool_in_order():
    caller = Caller()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(True, pool)
        _transact(servicer, caller, FRAMES)
    assert [(w, where) for w, where, _, _ in servicer.ran] == [
        ("Prepare", "pool"), ("end a", "pool"), ("end b", "pool"), ("Commit c", "pool"), ("Rollback d", "loop"),
        ("durable d", "loop")]  # a Rollback appends nothing: the loop is never held by it
    assert all(seen for _, _, seen, _ in servicer.ran)


def test_overlapped_ends_are_applied_before_the_next_answer():
    """Cluster mode (io.overlaps): a carried end runs alongside its frame's Prepare; the frame is answered
    once the end is applied, and ends of frames that are not answered are waited for at the stream's end."""
    caller = Caller()
    carried_prepare = txn_pb2.TransactRequest(request_id=8, prepare=txn_pb2.PrepareRequest(topic="t"),
                                              ends=[txn_pb2.CarriedEnd(transaction_id="e", decision=1)])
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(False, pool, overlaps=True)
        answers = []

        async def run():
            async for answer in servicer.Transact(_frames([carried_prepare, ONE_WAY]), Context()):
                answers.append((answer.request_id, [w for w, *_ in servicer.ran]))
            return [w for w, *_ in servicer.ran]
        ran = _run(servicer, caller, run)
    assert answers == [(8, ["Prepare", "end e"])]  # the end started first and finished after the Prepare
    assert ran == ["Prepare", "end e", "end b"]    # the last one-way end, at the stream's end


def test_a_commit_refused_on_the_loop_for_a_rollback_not_yet_durable_is_answered_once_it_is_on_the_loop():
    pending = txn_pb2.TransactRequest(request_id=7, commit=txn_pb2.EndRequest(transaction_id="pending"))
    caller = Caller()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(False, pool)
        assert _transact(servicer, caller, [pending, PREPARE]) == [7, 1]
    assert servicer.ran == [("Commit pending", "loop", True, False), ("durable pending", "loop", True, False),
                            ("Prepare", "loop", True, False)]


@pytest.mark.parametrize("append_waits", [False, True])
def test_unary_calls_run_on_the_loop_unless_they_may_wait(append_waits):
    caller = Caller()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(append_waits, pool)

        async def calls():
            await servicer.Prepare(txn_pb2.PrepareRequest(topic="t"), Context())
            await servicer.Commit(txn_pb2.EndRequest(transaction_id="c"), Context())
            try:
                await servicer.Commit(txn_pb2.EndRequest(transaction_id="pending"), Context())
            except FailedPrecondition:  # refused (the fake's Commit on a thread does not refuse)
                assert not append_waits
            await servicer.Rollback(txn_pb2.EndRequest(transaction_id="d"), Context())
        _run(servicer, caller, calls)
    on_loop = "pool" if append_waits else "loop"
    expected = [("Prepare", on_loop, True, append_waits), ("Commit c", on_loop, True, append_waits)]
    if append_waits:
        expected.append(("Commit pending", "pool", True, True))
    else:  # refused on the loop once the rollback is durable
        expected += [("Commit pending", "loop", True, False), ("durable pending", "loop", True, False)]
    expected += [("Rollback d", "loop", True, False), ("durable d", "loop", True, False)]
    assert servicer.ran == expected


def test_a_commit_cancelled_while_its_append_is_in_flight_runs_to_its_end_in_the_callers_task_then_raises():
    """Cluster mode (``overlaps``): no task of its own around a Commit; the caller cancelled while the
    Commit's append is in flight still has the coordinator finish (the table learns what landed), and only
    then sees the cancellation. Cancelled while its append is still queued, nothing is sent."""
    from mqstore.model import MessageIn
    from mqstore.txn.appender import LoopAppendBatcher

    class AppendingCoordinator(RecordingCoordinator):
        async def end_async(self, io, decision, txn_id, by="producer"):
            results = await io.append("t", [MessageIn(txn_id.encode())])
            self._note(f"Commit {txn_id} landed {len(results)}", False)
            return Ended("COMMITTED", False, results)

    async def run():
        release, calls = asyncio.Event(), []

        async def append_many(batches):
            calls.append([topic for topic, _ in batches])
            await release.wait()
            return [[None] * len(messages) for _, messages in batches]

        batcher = LoopAppendBatcher(append_many, max_messages=10, max_bytes=100, timeout_s=10)
        coordinator = AppendingCoordinator()
        streams = TransactStreams(coordinator, max_streams=1)
        calls_ = LoopCalls(coordinator, streams, lambda: False, PortIo(batcher.append, None, overlaps=True))
        first = asyncio.ensure_future(calls_.commit("c"))
        for _ in range(5):
            await asyncio.sleep(0)
        queued = asyncio.ensure_future(calls_.commit("q"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == [["t"]]  # c's append in flight, q's queued behind it
        first.cancel()
        queued.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not first.done() and queued.cancelled()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert [what for what, *_ in coordinator.ran] == ["Commit c landed 1"]
        assert calls == [["t"]]  # the cancelled queued one was never sent
    asyncio.run(run())


def test_prepare_commit_rollback_and_transact_have_one_version_a_coroutine():
    """One servicer (issue 33): the coordinator's calls are answered on the loop through LoopCalls; no
    synchronous twin runs them in the pool."""
    import inspect

    for name in ("Prepare", "Commit", "Rollback"):
        assert inspect.iscoroutinefunction(getattr(TransactionServicer, name)), name
    assert inspect.isasyncgenfunction(TransactionServicer.Transact)
    assert not [name for name in ("_handle", "_carried", "_commit", "_rollback", "_prepare")
                if hasattr(TransactionServicer, name)]


class CountingPool(ThreadPoolExecutor):
    """Counts the hand-offs to its threads."""

    def __init__(self):
        super().__init__(1, thread_name_prefix="pool")
        self.handoffs = 0

    def submit(self, *args, **kwargs):
        self.handoffs += 1
        return super().submit(*args, **kwargs)


@pytest.mark.parametrize("on_loop", [True, False])
def test_carried_ends_are_checked_whole_in_core_then_applied_in_order_on_a_thread_in_one_hand_off(on_loop):
    """mqstore.txn.onloop.StreamEnds.carried holds the carried ends' rule (the servicer only converts): a
    malformed one refuses them all, none applied; good ones are applied in order, checked as their call
    (Coordinator.check_end with the caller's permission), and a frame placed on a thread hands all of them to
    the pool at once."""
    from mqstore.errors import InvalidArgument
    from mqstore.txn.onloop import MAX_CARRIED_ENDS

    checked = []

    class Checking(RecordingCoordinator):
        def check_end(self, txn_id, expected=("", ""), permit=None):
            checked.append((txn_id, expected, permit))

    def permit(topic, group):
        pass

    coordinator = Checking()
    streams = TransactStreams(coordinator, max_streams=1)
    with CountingPool() as pool:
        calls = LoopCalls(coordinator, streams, lambda: not on_loop, PortIo(None, pool, overlaps=False))

        async def run():
            async with calls.stream() as ends:
                assert await ends.place(None, False) is on_loop
                for bad, why in (([("a", "COMMIT"), ("b", 7)], "ends[1].decision"),
                                 ([("a", "COMMIT"), ("b", "UNKNOWN")], "ends[1].decision"),
                                 ([("a", "COMMIT")] * (MAX_CARRIED_ENDS + 1), "at most 1000")):
                    with pytest.raises(InvalidArgument, match=why.replace("[", r"\[")):
                        await ends.carried(bad, permit, on_loop)
                assert coordinator.ran == [] and checked == [] and pool.handoffs == 0  # none applied
                await ends.carried([("a", "COMMIT"), ("b", "ROLLBACK"), ("c", "COMMIT")], permit, on_loop)
        asyncio.run(run())
    assert [what for what, *_ in coordinator.ran] == ["end a", "end b", "end c"]
    assert checked == [("a", ("", ""), permit), ("b", ("", ""), permit), ("c", ("", ""), permit)]
    assert pool.handoffs == (0 if on_loop else 1)
