"""Transact streams (txn.proto): a producer's Prepares, Commits and Rollbacks as frames of one stream.

A frame is handled as its unary call would be, by the coordinator, on the stream's own thread, one
at a time, in order: the stream saves the producer and the server a gRPC call per step, nothing else
changes. This module keeps what is the stream's own:

  what                                  rule
  ------------------------------------- -------------------------------------------------------------------
  open streams                          at most ``max_streams`` (each holds a server thread):
                                        more get RESOURCE_EXHAUSTED when they open
  a one-way Commit or Rollback          applied as the two-way call would be (by "producer (one-way)"); nobody
                                        waits for it, so a rollback does not wait for its OP record, and a
                                        failure is logged (txn.one_way_failed) and counted, never raised: the
                                        transaction stays as it was and check-back decides it

Thread-safe: ``_lock`` guards the counts.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import structlog

from mqstore.errors import MqStoreError, ResourceExhausted, invariant

from .coordinator import Coordinator

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
        """Commit or roll back ``txn_id`` for a producer that does not wait for the outcome. ``guard`` runs
        first and may refuse (the caller's permission): a refusal fails the end like any other error."""
        invariant(decision in (COMMIT, ROLLBACK), f"a one-way end is COMMIT or ROLLBACK, not {decision}")
        with self._lock:
            self.one_way_ends += 1
        try:
            guard()
            if decision == COMMIT:
                self.coordinator.commit(txn_id, by=BY_ONE_WAY)
            else:
                self.coordinator.rollback(txn_id, by=BY_ONE_WAY, wait_durable=False)
        except MqStoreError as exc:  # nobody to tell: the transaction is as it was, check-back decides it
            with self._lock:
                self.one_way_failures += 1
            log.warning("txn.one_way_failed", transaction_id=txn_id[:128], decision=decision,
                        error=type(exc).__name__, message=str(exc)[:500],
                        why="a one-way end is never answered; the transaction is decided by check-back")
