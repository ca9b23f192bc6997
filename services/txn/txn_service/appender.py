"""The service's own appends, batched across producers (group commit): concurrent Prepares share one
Append to the half topic, concurrent Commits of one topic share one Append to it, and so on.

A caller submits (topic, messages) and waits; the duty's thread takes everything pending, groups it by
topic in arrival order into Appends of at most ``max_messages`` messages and ``max_bytes`` of bodies
(one caller's messages are never split: all of them or none, which is what makes a multi-message
commit visible at once), and hands each caller its own results. An Append that the log refuses as
INVALID_ARGUMENT is retried one caller at a time, so one bad request fails alone.

Thread-safe: ``_cond`` guards the queue and counters; the appends run on the duty's thread unlocked.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

from mqstore.background import Duty
from mqstore.errors import InvalidArgument, MqStoreError, Unavailable
from mqstore.model import AppendResult, MessageIn

AppendFn = Callable[[str, Sequence[MessageIn]], list[AppendResult]]


@dataclass(eq=False)
class _Request:
    topic: str
    messages: Sequence[MessageIn]
    body_bytes: int
    done: threading.Event = field(default_factory=threading.Event)
    results: list[AppendResult] | None = None
    error: BaseException | None = None


class AppendBatcher(Duty):
    def __init__(self, append: AppendFn, *, max_messages: int, max_bytes: int, timeout_s: float):
        super().__init__("txn-appender", interval_s=0.0)
        self._append, self.max_messages, self.max_bytes, self.timeout_s = append, max_messages, max_bytes, timeout_s
        self._cond = threading.Condition()
        self._queue: collections.deque[_Request] = collections.deque()
        self.appends = self.appended_messages = 0

    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        """Append ``messages`` to ``topic`` (all or none), batched with other callers'."""
        request = _Request(topic, messages, sum(len(m.body) for m in messages))
        with self._cond:
            if self.stopping:
                raise Unavailable("the Transaction service is stopping; retry on the next start")
            self._queue.append(request)
            self._cond.notify_all()
        if not request.done.wait(self.timeout_s):
            raise Unavailable(f"the commit log did not take the append within {self.timeout_s:.0f} s; the "
                              f"messages may still be stored")
        if request.error is not None:
            raise request.error
        return request.results

    def step(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self.stopping, 0.5)
            pending = list(self._queue)
            self._queue.clear()
        for group in self._groups(pending):
            self._append_group(group)

    def pause(self) -> None:
        return  # step() waits on the queue itself

    def on_stop(self) -> None:
        with self._cond:
            self._cond.notify_all()
            for request in self._queue:
                request.error = Unavailable("the Transaction service is stopping; retry on the next start")
                request.done.set()
            self._queue.clear()

    def _groups(self, pending: list[_Request]) -> list[list[_Request]]:
        """Per topic in arrival order, cut at the message and byte limits (a request is never cut)."""
        by_topic: dict[str, list[list[_Request]]] = {}
        for request in pending:
            groups = by_topic.setdefault(request.topic, [[]])
            last = groups[-1]
            count = sum(len(r.messages) for r in last) + len(request.messages)
            size = sum(r.body_bytes for r in last) + request.body_bytes
            if last and (count > self.max_messages or size > self.max_bytes):
                groups.append([request])
            else:
                last.append(request)
        return [group for groups in by_topic.values() for group in groups]

    def _append_group(self, group: list[_Request]) -> None:
        messages = [m for request in group for m in request.messages]
        try:
            results = self._append(group[0].topic, messages)
        except InvalidArgument as exc:
            if len(group) == 1:
                self._fail(group, exc)
            else:
                for request in group:  # find the bad one: each alone
                    self._append_group([request])
            return
        except MqStoreError as exc:
            self._fail(group, exc)
            return
        except BaseException as exc:  # a bug: the callers get it, the duty dies and health says so
            self._fail(group, exc)
            raise
        with self._cond:
            self.appends += 1
            self.appended_messages += len(messages)
        at = 0
        for request in group:
            request.results = results[at:at + len(request.messages)]
            at += len(request.messages)
            request.done.set()

    @staticmethod
    def _fail(group: list[_Request], exc: BaseException) -> None:
        for request in group:
            request.error = exc
            request.done.set()
