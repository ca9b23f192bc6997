"""Appends whose outcome is unknown, settled from the log (txn.proto: OUTCOME_UNKNOWN).

An append to the commit log that fails with mqstore.errors.OutcomeUnknown (the connection dropped, a
deadline passed, the log died after writing, a SYNC flush timed out) may or may not have landed. Its
owner registers it here with a ``settle`` function and takes no new decision meanwhile:

  step                                                         when
  ------------------------------------------------------------ ------------------------------------------
  ask the commit log for its end (GetStoreInfo's written end)  ``settle_ms`` after the failure, so that a
                                                               request still inside the commit log when
                                                               the caller gave up has been written by then
  wait until the follower has applied the log up to that end   (the table's ``applied``; woken per frame)
  call ``settle()``: whatever the follower found has decided   then; the owner treats what is still
  (a COMMIT record, an OP record, a parked copy, halves)       unknown as not written

While items wait, the end is asked again every ``settle_ms`` and each target lowered to it: a log
that came back shorter (its unflushed tail lost) no longer holds what lay beyond, so the wait never
outlasts the log. A failure to ask (the log still down) is retried by the Duty with backoff.

Thread-safe: ``_lock`` guards the items; ``settle`` functions run on the duty's thread (or the
caller's of :meth:`settle_due`, in tests), outside the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import structlog

from mqstore.background import Duty
from mqstore.clock import Clock

from .table import TxnTable

log = structlog.get_logger("mqstore.txn.indoubt")
POLL_S = 0.1  # the longest pause while items wait (frames wake it sooner)


@dataclass(eq=False)
class _Item:
    what: str                      # for the logs: "commit t-7", "op batch of 12"
    settle: Callable[[], None]
    since_ms: int
    target: int | None = None      # the log end asked after the failure
    asked_ms: int = 0


class InDoubt(Duty):
    def __init__(self, table: TxnTable, log_end: Callable[[], int], clock: Clock, settle_ms: int):
        super().__init__("txn-in-doubt", interval_s=POLL_S, backoff_initial_s=0.05, backoff_max_s=2.0)
        self.table, self._log_end, self.clock, self.settle_ms = table, log_end, clock, settle_ms
        self._lock = threading.Lock()
        self._items: list[_Item] = []
        self.settled = 0
        table.on_applied.append(self.wake)

    def add(self, what: str, settle: Callable[[], None]) -> None:
        with self._lock:
            self._items.append(_Item(what, settle, self.clock.now_ms()))
        log.info("txn.in_doubt", what=what, settle_ms=self.settle_ms)
        self.wake()

    def pending(self) -> int:
        with self._lock:
            return len(self._items)

    def step(self) -> None:
        self.settle_due()

    def settle_due(self) -> int:
        """Ask for the log's end where due, settle the items the follower has passed; how many settled.
        Raises what asking the log raises (the duty retries)."""
        now = self.clock.now_ms()
        with self._lock:
            ask = [i for i in self._items if now - max(i.since_ms, i.asked_ms) >= self.settle_ms]
        if ask:
            end = self._log_end()
            with self._lock:
                for item in ask:
                    item.target = end if item.target is None else min(item.target, end)
                    item.asked_ms = now
        with self.table.lock:
            applied = self.table.applied
        with self._lock:
            due = [i for i in self._items if i.target is not None and applied is not None and applied >= i.target]
            self._items = [i for i in self._items if i not in due]
        for item in due:
            item.settle()
            log.info("txn.in_doubt_settled", what=item.what, log_end_physical_offset=item.target,
                     waited_ms=now - item.since_ms)
        with self._lock:
            self.settled += len(due)
        return len(due)
