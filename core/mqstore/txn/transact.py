"""Transact streams (txn.proto): a producer's Prepares, Commits and Rollbacks as frames of one stream.

A two-way frame is handled as its unary call would be, by the coordinator, one at a time, in order (on the
grpc.aio port's loop, or a thread of its pool: mqstore.txn.onloop says which): the stream saves the producer
and the server a gRPC call per step, nothing else changes. This module keeps what is the stream's own:

  what                                  rule
  ------------------------------------- -------------------------------------------------------------------
  open streams                          at most ``max_streams`` (each holds a server thread):
                                        more get RESOURCE_EXHAUSTED when they open
  a one-way Commit or Rollback          its guard (the caller's permission) runs first; then it is applied
                                        as the two-way call would be (by "producer (one-way)"), where its
                                        frame was placed (mqstore.txn.onloop): on the grpc.aio port's event
                                        loop (:meth:`end_one_way_async`), a coroutine of the stream, which in
                                        Cluster mode overlaps the next frame and is waited for before that
                                        frame's answer, and in Local mode is applied before the next frame
                                        is read; or on the thread of a frame placed in the pool
                                        (:meth:`end_one_way`: Local mode while an append would hold the
                                        loop), before that frame's own call. Nobody waits for its outcome,
                                        so a rollback does not wait for its OP record, nor the refusal of a
                                        Commit of a rolled-back transaction for that one's. A failure (the
                                        guard's or the call's) is logged (txn.one_way_failed) and counted,
                                        never raised: the transaction stays as it was and check-back
                                        decides it. (A pool of one-way workers, one_way_workers and
                                        one_way_queue, went with issue 33: no frame of Cluster mode is
                                        placed on a thread, and Local mode applied its ends inline.)

Thread-safe: ``_lock`` guards the counts.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import structlog

from mqstore import waits
from mqstore.errors import MqStoreError, ResourceExhausted, invariant

from .coordinator import Coordinator, LoopIo

log = structlog.get_logger("mqstore.txn.transact")
COMMIT, ROLLBACK = "COMMIT", "ROLLBACK"
BY_ONE_WAY = "producer (one-way)"


class TransactStreams:
    def __init__(self, coordinator: Coordinator, max_streams: int):
        self.coordinator, self.max_streams = coordinator, max_streams
        self._lock = threading.Lock()
        self._open = 0
        self.one_way_ends = self.one_way_failures = 0

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        """For the life of one stream; ResourceExhausted when ``max_streams`` are open."""
        with self._lock:
            if self._open >= self.max_streams:
                raise ResourceExhausted(f"{self._open} Transact streams are open, the limit max_transact_streams; "
                                        f"keep one stream per producer (it carries every transaction of the "
                                        f"producer), use the unary calls, or raise the limit")
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1

    def open_streams(self) -> int:
        with self._lock:
            return self._open

    def end_one_way(self, txn_id: str, decision: str, guard: Callable[[], None] = lambda: None) -> None:
        """:meth:`end_one_way_async` on this thread (a frame placed in the pool), applied before it returns."""
        return waits.blocking(self.end_one_way_async(self.coordinator.thread_io, txn_id, decision, guard))

    async def end_one_way_async(self, io: LoopIo, txn_id: str, decision: str,
                                guard: Callable[[], None] = lambda: None) -> None:
        """Commit or roll back ``txn_id`` for a producer that does not wait for the outcome, the coordinator's
        appends through ``io`` (mqstore.txn.coordinator.LoopIo): awaited on an event loop (Cluster mode's
        grpc.aio port); :meth:`end_one_way` runs it on this thread (mqstore.waits.blocking, the coordinator's
        ``thread_io``). ``guard`` runs first and may refuse (the caller's permission): a refusal fails the
        end like any other error."""
        invariant(decision in (COMMIT, ROLLBACK), f"a one-way end is COMMIT or ROLLBACK, not {decision}")
        with self._lock:
            self.one_way_ends += 1
        try:
            guard()
        except MqStoreError as exc:
            self._failed(txn_id, decision, exc)
            return
        await self._apply(io, txn_id, decision)

    async def _apply(self, io: LoopIo, txn_id: str, decision: str) -> None:
        try:
            await self.coordinator.end_async(io, decision, txn_id, by=BY_ONE_WAY)
        except MqStoreError as exc:  # nobody to tell: the transaction is as it was, check-back decides it
            self._failed(txn_id, decision, exc)

    def _failed(self, txn_id: str, decision: str, exc: MqStoreError) -> None:
        with self._lock:
            self.one_way_failures += 1
        log.warning("txn.one_way_failed", transaction_id=txn_id[:128], decision=decision,
                    error=type(exc).__name__, message=str(exc)[:500],
                    why="a one-way end is never answered; the transaction is decided by check-back")
