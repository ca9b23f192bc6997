"""LoopTransactionServicer (mqstore_rpc.txn.servicer): which Transact frames and unary calls are handled on
the event loop and which in the handler pool, in order, with the caller of a deferred permission check
carried to the pool; a Commit refused on the loop while a rollback is not durable is taken again there."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from mqstore.errors import FailedPrecondition
from mqstore.model import DURABILITY_WRITTEN
from mqstore.txn.coordinator import Ended, Prepared
from mqstore_rpc import auth
from mqstore_rpc.gen.mqstore.v1 import txn_pb2
from mqstore_rpc.txn.servicer import LoopTransactionServicer
from mqstore.txn.transact import TransactStreams

PREPARE = txn_pb2.TransactRequest(request_id=1, prepare=txn_pb2.PrepareRequest(topic="t"))
CARRIED = txn_pb2.TransactRequest(request_id=2, ends=[txn_pb2.CarriedEnd(transaction_id="a", decision=1)])
ONE_WAY = txn_pb2.TransactRequest(request_id=3, one_way=True, commit=txn_pb2.EndRequest(transaction_id="b"))
COMMIT = txn_pb2.TransactRequest(request_id=4, commit=txn_pb2.EndRequest(transaction_id="c"))
ROLLBACK = txn_pb2.TransactRequest(request_id=5, rollback=txn_pb2.EndRequest(transaction_id="d"))
FRAMES = [PREPARE, CARRIED, ONE_WAY, COMMIT, ROLLBACK]


class Recording(LoopTransactionServicer):
    """Records where each frame or call ran, how, and the caller it saw; answers each frame with its request
    id, refuses a Commit of "pending" (a rolled-back transaction whose OP record is not written yet)."""

    def __init__(self, append_waits: bool, pool):
        super().__init__(None, None, None, TransactStreams(None, max_streams=1), lambda: append_waits, pool)
        self.ran: list[tuple] = []

    def _note(self, what, wait_durable=True):
        self.ran.append((what, threading.current_thread().name, auth._current.get(), wait_durable))

    def _handle(self, request, peer, wait_durable=True):
        self._note(request.request_id, wait_durable)
        if request.WhichOneof("kind") == "commit" and request.commit.transaction_id == "pending":
            return txn_pb2.TransactResponse(request_id=request.request_id, error=txn_pb2.FrameError(code=9))
        return txn_pb2.TransactResponse(request_id=request.request_id)

    def _commit_frame(self, request, peer):
        self._note(f"commit frame {request.request_id}")
        return txn_pb2.TransactResponse(request_id=request.request_id)

    def _prepare(self, p, peer):
        self._note("Prepare")
        return Prepared("t-1", [], DURABILITY_WRITTEN)

    def _commit(self, txn_id, wait_durable=True):
        self._note("Commit " + txn_id, wait_durable)
        if txn_id == "pending" and not wait_durable:
            raise FailedPrecondition("rolled back")
        return Ended("COMMITTED", False, [])

    def _rollback(self, txn_id):
        self._note("Rollback")
        return Ended("ROLLED_BACK", False, [])

    def _rollback_pending(self, txn_id):
        return txn_id == "pending"


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


@pytest.mark.parametrize("append_waits, in_pool", [(False, {5}), (True, {1, 2, 3, 4, 5})])
def test_frames_that_may_wait_run_in_the_pool_in_order_with_their_caller(append_waits, in_pool):
    caller = object()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(append_waits, pool)
        assert _transact(servicer, caller, FRAMES) == [1, 2, 3, 4, 5]  # in order, each answered before the next
    assert [w for w, _, _, _ in servicer.ran] == [1, 2, 3, 4, 5]
    assert {w for w, where, _, _ in servicer.ran if where == "pool"} == in_pool
    assert all(seen for _, _, seen, _ in servicer.ran)  # a deferred check in the pool sees the caller
    # on the loop, a frame never waits for a rollback's OP record
    assert all(not durable for _, where, _, durable in servicer.ran if where == "loop")


def test_a_commit_refused_on_the_loop_for_a_rollback_not_yet_durable_is_answered_from_the_pool():
    pending = txn_pb2.TransactRequest(request_id=7, commit=txn_pb2.EndRequest(transaction_id="pending"))
    caller = object()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(False, pool)
        assert _transact(servicer, caller, [pending, PREPARE]) == [7, 1]
    assert servicer.ran == [(7, "loop", True, False), ("commit frame 7", "pool", True, True), (1, "loop", True, False)]


@pytest.mark.parametrize("append_waits", [False, True])
def test_unary_calls_run_on_the_loop_unless_they_may_wait(append_waits):
    caller = object()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        servicer = Recording(append_waits, pool)

        async def calls():
            await servicer.Prepare(txn_pb2.PrepareRequest(topic="t"), Context())
            await servicer.Commit(txn_pb2.EndRequest(transaction_id="c"), Context())
            await servicer.Commit(txn_pb2.EndRequest(transaction_id="pending"), Context())
            await servicer.Rollback(txn_pb2.EndRequest(transaction_id="d"), Context())
        _run(servicer, caller, calls)
    on_loop = "pool" if append_waits else "loop"
    expected = [("Prepare", on_loop, True, True), ("Commit c", on_loop, True, append_waits)]
    if not append_waits:
        expected.append(("Commit pending", "loop", True, False))  # refused on the loop: not durable yet
    expected += [("Commit pending", "pool", True, True), ("Rollback", "pool", True, True)]
    assert servicer.ran == expected
