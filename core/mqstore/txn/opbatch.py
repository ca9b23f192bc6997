"""OP records batched Nagle-style (RIP-50): resolved halves' queue offsets gather in memory and are
written as one OP message (tag ``d``, body ``"17,18,23,"``). Nagle's rule, for the entries an answer waits
for (a Rollback, a Commit refused because its transaction was rolled back: :meth:`OpBatcher.urge`):

  when                                              what is written
  ------------------------------------------------- -----------------------------------------------------
  an answer waits, no OP write is in flight         at once: the queue (up to ``max_bytes``), never
                                                    behind a timer
  an answer waits while an OP write is in flight    what gathered meanwhile, as one batch, as soon as that
                                                    write completes (the duty writes one at a time)
  the queue reaches ``max_bytes``                   a full batch (the size limit splits a longer queue)
  nobody waits (a Commit's entries, one-way ends,   with the next write, at ``max_bytes``, or at the
  check-back decisions)                             latest ``interval_ms`` after the oldest was queued:
                                                    an upper bound, so the OP log never lags far behind
                                                    the decisions (fewer check-backs and less recovery
                                                    work after a crash) while at load OP messages stay
                                                    full (half:OP in the hundreds)

Unlike RocketMQ (which logs and drops them), a failed OP write is never lost:

  the write failed                                  its entries
  ------------------------------------------------- -----------------------------------------------------
  definitely (the log refused it)                   stay at the head of the queue, retried after a backoff
  outcome unknown (mqstore.errors.OutcomeUnknown)   leave the queue and go to ``on_unknown`` (the in-doubt
                                                    resolver): once the follower has read past the failure,
                                                    those the log does not hold come back (``requeue``)

so an OP message is not appended twice for one decision. Rollback waits for its halves' OP records
through the table (TxnTable.op_written_async), which the batcher's ``on_written`` and the follower mark.

Counters: OP messages written, entries written, flushes by size / by time / for a waiting answer /
other (stop), mean fill (body bytes / max_bytes), write failures.

Thread-safe: ``_cond`` guards the queue and the counters; ``write`` (an Append to the commit log) runs on
the duty's thread without the lock, one batch at a time. Time comes from the injected clock; tests
call :meth:`flush_due` themselves instead of starting the thread.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import structlog

from mqstore import failpoints
from mqstore.background import Duty
from mqstore.clock import Clock
from mqstore.errors import OutcomeUnknown
from mqstore.model import AppendResult, MessageIn

from . import records as tx

log = structlog.get_logger("mqstore.txn.opbatch")

REASON_SIZE, REASON_TIME, REASON_WAITER, REASON_OTHER = "size", "time", "waiter", "other"
MAX_PAUSE_MS = 100  # the duty looks again at least this often: the due time is the injected clock's


@dataclass(frozen=True, slots=True)
class OpStats:
    messages_written: int
    entries_written: int
    flush_by_size: int
    flush_by_time: int
    flush_other: int
    mean_fill: float
    write_failures: int
    pending: int
    unknown_outcomes: int       # writes whose outcome was unknown (their entries went to the resolver)
    flush_by_waiter: int = 0    # written at once (Nagle's rule) because an answer waited for them


def op_writer(append: Callable[[str, Sequence[MessageIn]], list[AppendResult]]) -> Callable[[bytes, list[int]], object]:
    """OpBatcher's ``write`` over an ``append(topic, messages)``: one OP message, on OP_TOPIC queue 0 with tag
    ``d`` (mqstore.txn.records)."""
    def write(body: bytes, offsets: list[int]) -> list[AppendResult]:
        return append(tx.OP_TOPIC, [MessageIn(body, tx.OP_TAG, queue_id=0)])
    return write


def entry_text(half_queue_offset: int) -> str:
    return f"{half_queue_offset},"


def parse_body(body: bytes) -> list[int]:
    """Half queue offsets named by an OP body; anything that is not a number is skipped (foreign data)."""
    return [int(p) for p in body.decode("ascii", "replace").split(",") if p.strip().isdigit()]


class OpBatcher(Duty):
    def __init__(self, write: Callable[[bytes, Sequence[int]], None], clock: Clock, *, max_bytes: int,
                 interval_ms: int, on_written: Callable[[Sequence[int]], None] = lambda offsets: None,
                 on_unknown: Callable[[list[int]], None] = lambda offsets: None):
        super().__init__("txn-op-batcher", interval_s=0.0, backoff_initial_s=0.05, backoff_max_s=2.0)
        self._write, self.clock, self.max_bytes, self.interval_ms = write, clock, max_bytes, interval_ms
        self._on_written, self._on_unknown = on_written, on_unknown
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[str, int]] = collections.deque()  # (text, added ms)
        self._queued_bytes = 0
        self._messages = self._entries = self._by_size = self._by_time = self._other = self._failures = 0
        self._unknown = self._by_waiter = 0
        self._fill_sum = 0.0
        # Entries are numbered in the order they are queued: ``_head_seq`` is the number of the queue's
        # head (entries dropped so far), ``_added_seq`` the next number; those below ``_urgent_seq`` are
        # waited for (urge) and are written without waiting for size or time.
        self._head_seq = self._added_seq = self._urgent_seq = 0
        self._flush_all = False

    # ---- producers ------------------------------------------------------------------------------------
    def add(self, half_queue_offsets: Sequence[int]) -> None:
        """Queue OP entries (written within ``interval_ms``, sooner when the batch is full, another write
        takes them along or an answer waits for them: :meth:`urge`)."""
        with self._cond:
            now = self.clock.now_ms()
            for offset in half_queue_offsets:
                text = entry_text(offset)
                self._queue.append((text, now))
                self._queued_bytes += len(text)
                self._added_seq += 1
            if self._queued_bytes >= self.max_bytes:
                self.wake()

    def urge(self) -> None:
        """An answer waits for entries queued so far: they are written at once if no OP write is in flight,
        else as one batch with whatever gathered as soon as the write in flight completes (Nagle)."""
        with self._cond:
            self._urgent_seq = self._added_seq
            if self._head_seq >= self._urgent_seq:
                return  # written already (or being written: the waiter hears when it completes)
        self.wake()

    def requeue(self, half_queue_offsets: Sequence[int]) -> None:
        """Entries whose write had an unknown outcome and did not land: queued again, due at once when
        they are the oldest (added at the back: a batch being written is the head of the queue)."""
        with self._cond:
            for offset in half_queue_offsets:
                text = entry_text(offset)
                self._queue.append((text, 0))
                self._queued_bytes += len(text)
                self._added_seq += 1
        self.wake()

    # ---- the duty -------------------------------------------------------------------------------------
    def due(self, now_ms: int) -> str:
        """Why a batch is due now ("" if none): size first, then a waiting answer, then the age of the
        oldest entry."""
        if not self._queue:
            return ""
        if self._queued_bytes >= self.max_bytes:
            return REASON_SIZE
        if self._flush_all:
            return REASON_OTHER
        if self._head_seq < self._urgent_seq:
            return REASON_WAITER
        if now_ms - self._queue[0][1] >= self.interval_ms:
            return REASON_TIME
        return ""

    def flush_due(self) -> int:
        """Write every batch that is due now; returns the OP messages written. Raises when a write fails
        (its entries stay queued)."""
        written = 0
        while True:
            with self._cond:
                reason = self.due(self.clock.now_ms())
                if not reason:
                    return written
                batch = self._take_batch()
            self._write_batch(batch, reason)
            written += 1

    def _take_batch(self) -> list[tuple[str, int]]:
        """The oldest entries whose texts fit ``max_bytes`` (at least one); left queued until written."""
        batch, size = [], 0
        for item in self._queue:
            if batch and size + len(item[0]) > self.max_bytes:
                break
            batch.append(item)
            size += len(item[0])
        return batch

    def _drop_head(self, count: int) -> None:
        """Under ``_cond``: the batch just written (or given up as unknown) is the head of the queue:
        only the duty removes entries, and others add at the back only."""
        for _ in range(count):
            text, _ = self._queue.popleft()
            self._queued_bytes -= len(text)
            self._head_seq += 1

    def _write_batch(self, batch, reason: str) -> None:
        body = "".join(text for text, _ in batch).encode("ascii")
        offsets = [int(text[:-1]) for text, _ in batch]
        try:
            failpoints.hit("txn.op.before_write")
            self._write(body, offsets)
        except OutcomeUnknown:
            with self._cond:
                self._failures += 1
                self._unknown += 1
                self._drop_head(len(batch))
            self._on_unknown(offsets)
            raise
        except BaseException:
            with self._cond:
                self._failures += 1
            raise
        failpoints.hit("txn.op.after_write")
        with self._cond:
            self._drop_head(len(batch))
            self._messages += 1
            self._entries += len(batch)
            self._fill_sum += len(body) / self.max_bytes
            self._by_size += reason == REASON_SIZE
            self._by_time += reason == REASON_TIME
            self._by_waiter += reason == REASON_WAITER
            self._other += reason == REASON_OTHER
        self._on_written(offsets)

    def step(self) -> None:
        self.flush_due()

    def pause(self) -> None:
        with self._cond:
            if self._queue and not self.due(self.clock.now_ms()):
                wait_ms = self._queue[0][1] + self.interval_ms - self.clock.now_ms()
            elif self._queue:
                return
            else:
                wait_ms = self.interval_ms
        self._wake.wait(min(max(wait_ms, 1), MAX_PAUSE_MS) / 1000)
        self._wake.clear()

    def drain(self, timeout_s: float) -> None:
        """Write everything pending now (on stop): best effort, what fails stays for the OP recovery."""
        with self._cond:
            self._flush_all = True
        try:
            self.flush_due()
        except Exception as exc:  # noqa: BLE001 - stopping: recovery re-queues these entries at the next start
            log.warning("op.drain_failed", error=f"{type(exc).__name__}: {exc}", pending=len(self._queue))

    def stats(self) -> OpStats:
        with self._cond:
            return OpStats(self._messages, self._entries, self._by_size, self._by_time, self._other,
                           self._fill_sum / self._messages if self._messages else 0.0, self._failures,
                           len(self._queue), self._unknown, self._by_waiter)
