"""The service's own appends, batched across producers (group commit): concurrent Prepares share one
Append to the half topic, concurrent Commits of one topic share one Append to it, and so on.

A caller submits (topic, messages); the caller that leads (see ``append``) takes everything pending,
groups it by topic in arrival order into Appends of at most ``max_messages`` messages and ``max_bytes`` of bodies
(one caller's messages are never split: all of them or none, which is what makes a multi-message
commit visible at once), and hands each caller its own results. An Append that the log refuses as
INVALID_ARGUMENT is retried one caller at a time, so one bad request fails alone.

Thread-safe: ``_cond`` guards the queues, the leaders and the counters; a leader appends unlocked.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import structlog

from mqstore.errors import InvalidArgument, MqStoreError, Unavailable
from mqstore.model import AppendResult, MessageIn

log = structlog.get_logger("txn_service.appender")
AppendFn = Callable[[str, Sequence[MessageIn]], list[AppendResult]]


@dataclass(eq=False)
class _Request:
    topic: str
    messages: Sequence[MessageIn]
    body_bytes: int
    done: threading.Event = field(default_factory=threading.Event)
    results: list[AppendResult] | None = None
    error: BaseException | None = None


class AppendBatcher:
    def __init__(self, append: AppendFn, *, max_messages: int, max_bytes: int, timeout_s: float):
        self._append, self.max_messages, self.max_bytes, self.timeout_s = append, max_messages, max_bytes, timeout_s
        self._cond = threading.Condition()
        self._queues: dict[str, collections.deque[_Request]] = collections.defaultdict(collections.deque)
        self._leading: set[str] = set()  # topics with an append in flight (one per topic at a time)
        self._closed = False
        self.appends = self.appended_messages = 0

    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        """Append ``messages`` to ``topic`` (all or none), batched with other callers'.

        Group commit per topic, without a thread of its own: a caller that finds no append to its
        topic in flight leads one round: it appends everything queued for the topic (its own request
        and those that arrived), then hands over; a waiting caller whose request is still queued leads
        the next round. So a lone producer pays no hand-off between threads, under load one Append
        carries many producers' messages, and halves, real messages and OP records (other topics) are
        appended concurrently."""
        request = _Request(topic, messages, sum(len(m.body) for m in messages))
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            if self._closed:
                raise Unavailable("the Transaction service is stopping; retry on the next start")
            queue = self._queues[topic]
            queue.append(request)
            while not request.done.is_set() and topic in self._leading:
                left = deadline - time.monotonic()
                if left <= 0 and request in queue:
                    # Never appended later behind the caller's back: a retried Commit must not find its
                    # first attempt's messages arriving after it (a leader's append has its own timeout).
                    queue.remove(request)
                    raise Unavailable(f"the append waited {self.timeout_s:.0f} s for its turn and was not sent; "
                                      f"retry")
                self._cond.wait(max(left, 0.05))
            lead = not request.done.is_set()
            if lead:
                self._leading.add(topic)
                pending = list(queue)
                queue.clear()
        if lead:
            self._lead(topic, pending)
        if request.error is not None:
            raise request.error
        return request.results

    def _lead(self, topic: str, pending: list[_Request]) -> None:
        try:
            for group in self._groups(pending):
                self._append_group(group)
        finally:
            with self._cond:
                self._leading.discard(topic)
                self._cond.notify_all()

    def close(self) -> None:
        """Refuse new appends (those in flight finish)."""
        with self._cond:
            self._closed = True

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
        except BaseException as exc:  # a bug: each caller gets it (INTERNAL), the next round goes on
            log.exception("txn.append_failed", topic=group[0].topic)
            self._fail(group, exc)
            return
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
