"""Transact streams (txn.proto): a producer's Prepares, Commits and Rollbacks as frames of one stream.

A two-way frame is handled as its unary call would be, by the coordinator, one at a time, in order (on the
grpc.aio port's loop, or a thread of its pool: mqstore.txn.onloop says which): the stream saves the producer
and the server a gRPC call per step, nothing else changes. This module keeps what is the stream's own:

  what                                  rule
  ------------------------------------- -------------------------------------------------------------------
  open streams                          at most ``max_streams`` (each holds a server thread):
                                        more get RESOURCE_EXHAUSTED when they open
  a one-way Commit or Rollback          its guard (the caller's permission) runs on the stream's thread; then
                                        it is handed to a worker (Workers ``txn-one-way``) and the stream
                                        goes on with its next frame at once, as RocketMQ's broker does with
                                        EndTransaction. With ``inline`` (Local mode, where the log is in
                                        this process and an append costs no round trip) it is applied on
                                        the stream's thread before the next frame is read: a hand-off
                                        between threads costs more than the append it would overlap (bench/
                                        txn.py, Local mode, 8 producers: 1.80x the CPU of a plain Append
                                        against 2.04x with workers). On a grpc.aio port's event loop
                                        (:meth:`end_one_way_async`) it is a coroutine of the stream, which
                                        (Cluster mode) overlaps the next frame and is waited for before
                                        that frame's answer. Either way it is applied as the two-way
                                        call would be (by "producer (one-way)"); nobody waits for it, so a
                                        rollback does not wait for its OP record, nor the refusal of a
                                        Commit of a rolled-back transaction for that one's. A failure (the guard's, the
                                        call's, or no room for it: every worker busy and the queue full for
                                        ``queue_wait_s``, or stopping) is logged (txn.one_way_failed) and
                                        counted, never raised: the transaction stays as it was and
                                        check-back decides it. On a worker, a one-way end and a later frame
                                        for the same transaction may run concurrently: the coordinator
                                        decides races of Commit and Rollback exactly once, as for two
                                        producers.

Thread-safe: ``_lock`` guards the counts; Workers is thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import structlog

from mqstore import waits
from mqstore.background import Workers
from mqstore.errors import MqStoreError, ResourceExhausted, invariant

from .coordinator import Coordinator, LoopIo

log = structlog.get_logger("mqstore.txn.transact")
COMMIT, ROLLBACK = "COMMIT", "ROLLBACK"
BY_ONE_WAY = "producer (one-way)"


class TransactStreams:
    def __init__(self, coordinator: Coordinator, max_streams: int, workers: int = 8, max_queued: int = 1000,
                 queue_wait_s: float = 10.0, inline: bool = False):
        self.coordinator, self.max_streams, self.queue_wait_s = coordinator, max_streams, queue_wait_s
        self.inline = inline
        self.enders = Workers("txn-one-way", workers=workers, max_queued=max_queued)
        self._lock = threading.Lock()
        self._open = 0
        self.one_way_ends = self.one_way_failures = 0

    def start(self) -> None:
        if not self.inline:  # inline: every end is applied on its stream's thread, the workers are never used
            self.enders.start()

    def stop(self, timeout_s: float) -> None:
        """Take no more one-way ends; those queued are still applied (up to ``timeout_s``)."""
        self.enders.stop(timeout_s)

    def problem(self) -> str:
        return self.enders.problem()

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

    def submit_one_way(self, txn_id: str, decision: str, guard: Callable[[], None] = lambda: None) -> None:
        """A one-way frame: ``guard`` now (on the stream's thread), then :meth:`end_one_way` on a worker; the
        caller goes on at once. Waits up to ``queue_wait_s`` while the queue is full (back-pressure on the
        stream); a failure is counted, never raised. ``inline``: all of it on this thread
        (:meth:`end_one_way`), the caller going on once it is applied."""
        if self.inline:
            self.end_one_way(txn_id, decision, guard)
            return
        invariant(decision in (COMMIT, ROLLBACK), f"a one-way end is COMMIT or ROLLBACK, not {decision}")
        with self._lock:
            self.one_way_ends += 1
        try:
            guard()
            self.enders.submit(lambda: waits.blocking(self._apply(self.coordinator.thread_io, txn_id, decision)),
                               timeout_s=self.queue_wait_s)
        except MqStoreError as exc:
            self._failed(txn_id, decision, exc)

    def end_one_way(self, txn_id: str, decision: str, guard: Callable[[], None] = lambda: None) -> None:
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
