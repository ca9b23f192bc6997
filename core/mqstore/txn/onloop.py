"""The coordinator's calls on an event loop (the grpc.aio Transaction port of both modes): which run on the
loop and which on a thread, a Commit refused while a rollback is not durable, a Transact stream's frames
and its one-way and carried ends (their checks included). The servicer (services' txn servicer) converts
requests and answers and calls :class:`LoopCalls` (or its stream's :class:`StreamEnds`) once per call or
step of a frame; it decides nothing itself.

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
                                        (:meth:`LoopCalls.frame_on_loop`); one placed on a thread hands its
                                        ends (all in one hand-off) and then its call to the pool; a stream
                                        takes its next frame once this one is answered, so frames stay in order
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
import contextlib
import contextvars
import functools
import threading
from concurrent.futures import Executor
from typing import AsyncIterator, Awaitable, Callable, Sequence, TypeVar

from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.model import AppendResult, MessageIn

from .coordinator import Coordinator, Ended, Prepared
from .transact import COMMIT, ROLLBACK, TransactStreams

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


def _anyone_may(topic: str, group: str) -> None:
    pass


class LoopCalls:
    """Prepare, Commit, Rollback and a Transact stream's frames on the loop or on a thread (the module
    docstring). A Commit or Rollback is checked first, where it runs: Coordinator.check_end(txn_id,
    ``expected``, ``permit``), ``permit(topic, group)`` being the caller's permission; a stream's end is
    checked so too, as its guard (TransactStreams). ``on_loop`` of a call: where its Transact frame was placed
    (:meth:`StreamEnds.place`); None (a unary call): on the loop unless ``loop_blocks()``."""

    def __init__(self, coordinator: Coordinator, streams: TransactStreams, loop_blocks: Callable[[], bool],
                 io: PortIo):
        self._coordinator, self._streams, self._loop_blocks, self.io = coordinator, streams, loop_blocks, io

    def frame_on_loop(self, kind: str | None, one_way: bool) -> bool:
        """Whether a Transact frame of ``kind`` ("prepare", "commit", "rollback"; None: ends only) is handled
        on the loop: a two-way Rollback always (it appends nothing; its wait for the OP record suspends
        only its stream), anything else unless an append would hold the loop now."""
        return (kind == "rollback" and not one_way) or not self._loop_blocks()

    def _on_loop(self, on_loop: bool | None) -> bool:
        return not self._loop_blocks() if on_loop is None else on_loop

    async def prepare(self, topic: str, messages: Sequence[MessageIn], group: str, txn_id: str = "",
                      on_loop: bool | None = None) -> Prepared:
        """Prepare, on the loop or on a thread (``on_loop``)."""
        if not self._on_loop(on_loop):
            return await self.io.in_pool(functools.partial(self._coordinator.prepare, topic, messages, group, txn_id))
        return await self._to_end(self._coordinator.prepare_async(self.io, topic, messages, group, txn_id))

    async def commit(self, txn_id: str, expected: tuple[str, str] = ("", ""),
                     permit: Callable[[str, str], None] = _anyone_may, on_loop: bool | None = None) -> Ended:
        """Commit, on the loop or on a thread (``on_loop``); on the loop, a refusal because the transaction is
        rolled back, not durably yet, is raised once the rollback is durable (as the thread's call does)."""
        if self._on_loop(on_loop):
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

    @contextlib.asynccontextmanager
    async def stream(self) -> AsyncIterator[StreamEnds]:
        """One Transact stream, counted open while it lasts (TransactStreams.opened: ResourceExhausted beyond
        max_transact_streams): its one-way and carried ends, waited for when it ends."""
        with self._streams.opened():
            ends = StreamEnds(self._streams, self.io, self.frame_on_loop)
            yield ends
            await ends.settle()

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


def carried_decisions(decisions: Sequence[str | int]) -> list[str]:
    """A frame's carried ends' decisions, all checked (InvalidArgument: none of the frame is applied): at most
    MAX_CARRIED_ENDS, each COMMIT or ROLLBACK (anything else shown as the caller sent it)."""
    if len(decisions) > MAX_CARRIED_ENDS:
        raise InvalidArgument(f"ends: carry at most {MAX_CARRIED_ENDS} ends in one frame, not {len(decisions)}")
    for index, decision in enumerate(decisions):
        if decision not in (COMMIT, ROLLBACK):
            raise InvalidArgument(f"ends[{index}].decision: a carried end is DECISION_COMMIT (1) or "
                                  f"DECISION_ROLLBACK (2), not {decision}")
    return list(decisions)


class StreamEnds:
    """One Transact stream's frames' places and its one-way and carried ends: on the loop, applied at once
    (Local mode), or started and waited for by :meth:`settle` (``io.overlaps``, Cluster mode; a stream that
    ends early leaves them to finish on their own); those of a frame placed on a thread applied there
    (TransactStreams.end_one_way), in one hand-off. Used by its stream's coroutine only."""

    __slots__ = ("_streams", "_io", "_frame_on_loop", "_pending")

    def __init__(self, streams: TransactStreams, io: PortIo, frame_on_loop: Callable[[str | None, bool], bool]):
        self._streams, self._io, self._frame_on_loop = streams, io, frame_on_loop
        self._pending: list[asyncio.Future] = []

    async def place(self, kind: str | None, one_way: bool) -> bool:
        """Whether a frame of ``kind`` is handled on the loop (LoopCalls.frame_on_loop); before one that is
        not, the outstanding ends are waited for, so that frames stay in order."""
        on_loop = self._frame_on_loop(kind, one_way)
        if not on_loop:
            await self.settle()
        return on_loop

    async def carried(self, ends: Sequence[tuple[str, str | int]], permit: Callable[[str, str], None],
                      on_loop: bool) -> None:
        """A frame's carried ends, (transaction id, decision) each: all checked first (:func:`carried_decisions`:
        a malformed one refuses the frame, none of it applied), then each ended as a one-way end of any
        topic and group the caller may end (:meth:`end`), in order."""
        decisions = carried_decisions([decision for _, decision in ends])
        if on_loop:
            for (txn_id, _), decision in zip(ends, decisions, strict=True):
                await self.end(txn_id, decision, ("", ""), permit)
            return
        guarded = [(txn_id, decision, self._guard(txn_id, ("", ""), permit))
                   for (txn_id, _), decision in zip(ends, decisions, strict=True)]
        await self._io.in_pool(functools.partial(self._submit, guarded))

    async def end(self, txn_id: str, decision: str, expected: tuple[str, str] = ("", ""),
                  permit: Callable[[str, str], None] = _anyone_may, on_loop: bool = True) -> None:
        """``decision`` ("COMMIT", "ROLLBACK") for a producer that does not wait (TransactStreams), checked
        first as its two-way call (Coordinator.check_end: a refusal fails the end)."""
        guard = self._guard(txn_id, expected, permit)
        if not on_loop:
            await self._io.in_pool(functools.partial(self._submit, [(txn_id, decision, guard)]))
            return
        end = self._streams.end_one_way_async(self._io, txn_id, decision, guard=guard)
        if self._io.overlaps:
            self._pending.append(asyncio.ensure_future(end))
        else:
            await end

    def _guard(self, txn_id: str, expected: tuple[str, str], permit: Callable[[str, str], None]) -> Callable[[], None]:
        return functools.partial(self._streams.coordinator.check_end, txn_id, expected, permit)

    def _submit(self, guarded: list[tuple[str, str, Callable[[], None]]]) -> None:
        """On a thread: each end as TransactStreams.end_one_way, in order, before the frame's own call."""
        for txn_id, decision, guard in guarded:
            self._streams.end_one_way(txn_id, decision, guard=guard)

    async def answered(self, answering: bool) -> None:
        """After a frame: the outstanding ends are waited for before its answer (``answering``), or once
        MAX_CARRIED_ENDS are outstanding, before the next frame."""
        if answering or len(self._pending) >= MAX_CARRIED_ENDS:
            await self.settle()

    async def settle(self) -> None:
        """Wait for the outstanding ends (their failures are counted, never raised)."""
        while self._pending:
            await self._pending.pop(0)
