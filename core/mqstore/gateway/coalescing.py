"""Concurrent sends of the gateway coalesced into one append (Cluster mode: one AppendBatches call to the
commit log carries the sends of many producers), by Nagle's rule: a send that finds nothing in flight goes
at once, alone (a sequential producer never waits behind a timer); sends that arrive while an append is in
flight wait for it and then go together, up to ``max_batches`` per call, in arrival order.

Each send is its own batch of the call (``append_batches([(topic, messages), ...])``: CommitLogInternal
.AppendBatches), all or nothing with its own outcome, so one producer's refused message never fails
another's: each send gets its own results or the error it would have got alone. A failure of the whole call
(the commit log unreachable, the call's deadline) is every send's of that call. A send is answered only
with the commit log's answer to the call that carried it: OK only after the commit log acknowledged it.

One call is in flight at a time. The thread whose send went in a call makes it (no thread of its own):
when it is answered, that thread hands the sends that queued meanwhile to the first of them, whose thread
makes the next call, and returns its own answer at once.

Thread-safe.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from mqstore.errors import MqStoreError, Unavailable
from mqstore.model import AppendResult, MessageIn

AppendBatches = Callable[[Sequence[tuple[str, Sequence[MessageIn]]]], Sequence["list[AppendResult] | MqStoreError"]]
MAX_BATCHES = 100  # CommitLogInternal.AppendBatches takes 1..100 batches per call


class _Send:
    __slots__ = ("topic", "messages", "done", "outcome", "group")

    def __init__(self, topic: str, messages: Sequence[MessageIn]):
        self.topic, self.messages = topic, messages
        self.done = threading.Event()
        self.outcome: list[AppendResult] | Exception | None = None
        self.group: list[_Send] | None = None  # set when this send's thread is to make the next call


class SendCoalescer:
    def __init__(self, append_batches: AppendBatches, max_batches: int = MAX_BATCHES):
        if not 1 <= max_batches <= MAX_BATCHES:
            raise ValueError(f"max_batches must be in 1..{MAX_BATCHES}, not {max_batches}")
        self._append_batches, self.max_batches = append_batches, max_batches
        self._lock = threading.Lock()
        self._waiting: list[_Send] = []
        self._in_flight = False
        self.calls = 0      # calls made (for tests and benchmarks: sends / calls = the coalescing)
        self.sends = 0

    def waiting(self) -> int:
        """Sends queued behind the call in flight."""
        with self._lock:
            return len(self._waiting)

    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        """``messages`` appended to ``topic`` all or nothing (as one Append): their results, or the error."""
        send = _Send(topic, messages)
        with self._lock:
            if self._in_flight:
                self._waiting.append(send)
                group = None
            else:
                self._in_flight = True
                group = [send]
        if group is None:
            send.done.wait()  # the call that carries it is answered, or this thread is to make the next call
            group = send.group
        if group is not None:
            self._call(group)
        if isinstance(send.outcome, Exception):
            raise send.outcome
        return send.outcome

    def _call(self, group: list[_Send]) -> None:
        """Make the call of ``group`` (this thread's send is its first), answer every send of it, then hand
        what queued meanwhile to the next caller."""
        try:
            try:
                outcomes = self._append_batches([(s.topic, s.messages) for s in group])
                if len(outcomes) != len(group):
                    raise AssertionError(f"append_batches answered {len(outcomes)} outcomes for {len(group)} batches")
            except Exception as exc:  # noqa: BLE001 - the whole call failed: every send of it gets the error
                outcomes = [exc] * len(group)
            self.calls += 1
            self.sends += len(group)
            for send, outcome in zip(group, outcomes, strict=True):
                send.outcome = outcome
        finally:
            for send in group[1:]:
                if send.outcome is None:  # not reached unless this thread was interrupted: never left waiting
                    send.outcome = Unavailable("the gateway's append call was interrupted: the message may or may "
                                               "not have been written")
                send.done.set()
            with self._lock:
                following, self._waiting = self._waiting[:self.max_batches], self._waiting[self.max_batches:]
                if not following:
                    self._in_flight = False
            if following:
                following[0].group = following
                following[0].done.set()
