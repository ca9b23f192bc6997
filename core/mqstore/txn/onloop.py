"""The coordinator's calls on an event loop (the grpc.aio Transaction port of both modes): which run on the
loop and which on a thread, a Commit refused on the loop taken again on a thread, a Transact stream's
one-way and carried ends. The servicer (services' txn servicer) converts requests and answers and calls
:class:`LoopCalls` once per call or frame.

  what                                  where
  ------------------------------------- -------------------------------------------------------------------
  Prepare, Commit                       on the loop, the coordinator's steps awaiting their appends there
                                        (Cluster mode: the loop's own group commit over the CommitLog
                                        client's grpc.aio Append; Local mode: the store's append, which does
                                        not wait); on a thread (``io.in_pool``) while ``loop_blocks()``:
                                        an append would hold the loop's thread now (Local mode while the
                                        store's appends wait for a SYNC flush or SYNC replication)
  a Commit refused on the loop          it is tried without waiting: if the transaction turns out rolled
                                        back and that is not durable yet, the refusal waits for the rollback's
                                        OP record as the synchronous call's does, on the loop
  Rollback (two-way)                    on the loop, answered once its OP record is durable: the thread that
                                        marks it written (the OP writer, or the follower reading it back)
                                        wakes the loop; no pool thread waits (issue 37: one hand-off, not
                                        loop -> pool thread -> OP writer -> pool thread -> loop); while a
                                        thread holds its guard, the whole call on a thread, as before
  a Transact frame                      on the loop unless ``loop_blocks()`` and it is not a two-way Rollback
                                        (:meth:`LoopCalls.frame_on_loop`); a stream takes its next frame once
                                        this one is answered, so frames stay in order
  a stream's one-way and carried ends   applied before its next frame is read (Local mode), or (``io.
                                        overlaps``, Cluster mode) started at once and waited for before the
                                        stream's next answer, so that a carried Commit's append and the next
                                        Prepare's travel together; at most MAX_CARRIED_ENDS outstanding
                                        (:class:`StreamEnds`); either way as TransactStreams applies them
                                        (counted, never answered, a failure logged)

A coordinator call started on the loop runs to its end even if its caller is cancelled meanwhile (as a
thread would): its append may have landed, and the table must learn of it (the loop's batcher gives an
append once sent its outcome regardless; the cancellation is raised after).

Thread-safe: PortIo and LoopCalls hold no state of their own beyond what they are given; a StreamEnds is
used by its stream's coroutine only.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from concurrent.futures import Executor
from typing import Awaitable, Callable, Sequence, TypeVar

from mqstore.errors import FailedPrecondition
from mqstore.model import AppendResult, MessageIn

from .coordinator import Coordinator, Ended, Prepared
from .transact import COMMIT, TransactStreams

T = TypeVar("T")
MAX_CARRIED_ENDS = 1000     # a frame's carried ends, and a stream's ends outstanding on the loop


class PortIo:
    """The coordinator's LoopIo (mqstore.txn.coordinator) on a grpc.aio port: ``append`` is awaited on the
    loop (Cluster mode: LoopAppendBatcher.append over the CommitLog client's grpc.aio call; Local mode: the
    in-process appender, called on the loop); reads of the log and calls whose guard a thread holds run
    in ``pool`` with the caller's context (the caller of a deferred permission check: mqstore_rpc.auth).
    ``overlaps``: an append is a round trip, so a stream's one-way and carried ends are worth overlapping
    with its next frame (Cluster mode); without, they are applied before it (Local mode, as inline)."""

    def __init__(self, append: Callable[[str, Sequence[MessageIn]], Awaitable[list[AppendResult]]], pool: Executor,
                 overlaps: bool):
        self.append, self._pool, self.overlaps = append, pool, overlaps

    async def read(self, call: Callable[[], T]) -> T:
        return await self.in_pool(call)

    def acquire(self, lock: threading.Lock) -> bool:
        return lock.acquire(blocking=False)

    async def in_pool(self, call: Callable[[], T]) -> T:
        run = functools.partial(contextvars.copy_context().run, call)
        return await asyncio.get_running_loop().run_in_executor(self._pool, run)


def inline_append(append: Callable[[str, Sequence[MessageIn]], list[AppendResult]]):
    """A synchronous in-process ``append`` as PortIo's coroutine (Local mode: it does not wait while the
    store's appends do not)."""
    async def call(topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        return append(topic, messages)
    return call


def _anyone() -> None:
    pass


def _anyone_may(topic: str, group: str) -> None:
    pass


class LoopCalls:
    """Prepare, Commit, Rollback and a stream's ends on the loop or on a thread (the module docstring).
    A Commit or Rollback is checked first, where it runs: Coordinator.check_end(txn_id, ``expected``,
    ``permit``), ``permit(topic, group)`` being the caller's permission; a stream's end takes its ``guard()``
    (TransactStreams)."""

    def __init__(self, coordinator: Coordinator, streams: TransactStreams, loop_blocks: Callable[[], bool],
                 io: PortIo):
        self._coordinator, self._streams, self._loop_blocks, self.io = coordinator, streams, loop_blocks, io

    def frame_on_loop(self, kind: str | None, one_way: bool) -> bool:
        """Whether a Transact frame of ``kind`` ("prepare", "commit", "rollback"; None: ends only) is handled
        on the loop: a two-way Rollback always (it appends nothing; its wait for the OP record suspends
        only its stream), anything else unless an append would hold the loop now."""
        return (kind == "rollback" and not one_way) or not self._loop_blocks()

    async def in_pool(self, call: Callable[[], T]) -> T:
        """``call()`` on a thread of the pool, with the caller's context."""
        return await self.io.in_pool(call)

    async def prepare(self, topic: str, messages: Sequence[MessageIn], group: str, txn_id: str = "",
                      on_loop: bool = False) -> Prepared:
        """Prepare; ``on_loop``: the caller has chosen the loop already (:meth:`frame_on_loop`)."""
        if not on_loop and self._loop_blocks():
            return await self.io.in_pool(functools.partial(self._coordinator.prepare, topic, messages, group, txn_id))
        return await self._to_end(self._coordinator.prepare_async(self.io, topic, messages, group, txn_id))

    async def commit(self, txn_id: str, expected: tuple[str, str] = ("", ""),
                     permit: Callable[[str, str], None] = _anyone_may, on_loop: bool = False) -> Ended:
        """Commit, on the loop (unless ``loop_blocks()`` and not ``on_loop``: then on a thread); a refusal
        because the transaction is rolled back, not durably yet, is raised once the rollback is durable."""
        if on_loop or not self._loop_blocks():
            self._coordinator.check_end(txn_id, expected, permit)
            try:
                return await self._to_end(self._coordinator.end_async(self.io, COMMIT, txn_id))
            except FailedPrecondition:
                if self._coordinator.rollback_pending(txn_id):  # refused once the rollback is durable
                    await self._coordinator.wait_rollback_durable_async(txn_id)
                raise
        return await self.io.in_pool(functools.partial(self._commit_on_thread, txn_id, expected, permit))

    def _commit_on_thread(self, txn_id: str, expected: tuple[str, str], permit: Callable[[str, str], None]) -> Ended:
        self._coordinator.check_end(txn_id, expected, permit)
        return self._coordinator.commit(txn_id)

    async def rollback(self, txn_id: str, expected: tuple[str, str] = ("", ""),
                       permit: Callable[[str, str], None] = _anyone_may) -> Ended:
        """Rollback on the loop, answered once its OP record is durable (Coordinator.rollback_async)."""
        self._coordinator.check_end(txn_id, expected, permit)
        return await self._coordinator.rollback_async(self.io, txn_id)

    def ends(self) -> StreamEnds:
        """For one Transact stream: its one-way and carried ends on the loop."""
        return StreamEnds(self._streams, self.io)

    async def _to_end(self, work: Awaitable[T]) -> T:
        """``work``, run to its end if the caller is cancelled meanwhile (its append may land: the table must
        learn of it as a thread's call would), in the caller's own task: an append once sent is awaited to
        its outcome whatever the caller's cancellation (LoopAppendBatcher.append; a read or a guard
        before it is cut short, which changes nothing; a call a thread runs goes on there), and the
        cancellation is raised once the steps are done. No task and shield of its own: the answer is
        written as soon as the append's outcome reaches the caller, with no hand-off from a task to the
        caller's in between (bench/txn.py: two loop callbacks fewer per Prepare and per Commit). Without
        ``io.overlaps`` (Local mode) an append never suspends the coroutine anyway."""
        result = await work
        task = asyncio.current_task()
        if self.io.overlaps and task is not None and task.cancelling():
            raise asyncio.CancelledError
        return result


class StreamEnds:
    """One Transact stream's one-way and carried ends on the loop: applied at once (Local mode), or started
    and waited for by :meth:`settle` (``io.overlaps``, Cluster mode; a stream that ends early leaves them to
    finish on their own). Used by its stream's coroutine only."""

    __slots__ = ("_streams", "_io", "_pending")

    def __init__(self, streams: TransactStreams, io: PortIo):
        self._streams, self._io = streams, io
        self._pending: list[asyncio.Future] = []

    async def end(self, txn_id: str, decision: str, guard: Callable[[], None] = _anyone) -> None:
        """``decision`` ("COMMIT", "ROLLBACK") for a producer that does not wait (TransactStreams)."""
        end = self._streams.end_one_way_async(self._io, txn_id, decision, guard=guard)
        if self._io.overlaps:
            self._pending.append(asyncio.ensure_future(end))
        else:
            await end

    def full(self) -> bool:
        """MAX_CARRIED_ENDS are outstanding: settle them before the next frame."""
        return len(self._pending) >= MAX_CARRIED_ENDS

    async def settle(self) -> None:
        """Wait for the outstanding ends (their failures are counted, never raised)."""
        while self._pending:
            await self._pending.pop(0)
