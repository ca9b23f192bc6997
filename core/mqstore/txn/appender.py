"""The service's own appends, batched across producers (group commit): concurrent Prepares share one
Append to the half topic, concurrent Commits of one topic share one Append to it, and so on.

A caller submits (topic, messages); the caller that leads (see ``append``) takes everything pending,
groups it by topic in arrival order into Appends of at most ``max_messages`` messages and ``max_bytes`` of bodies
(one caller's messages are never split: all of them or none, which is what makes a multi-message
commit visible at once), and hands each caller its own results. An Append that the log refuses as
INVALID_ARGUMENT is retried one caller at a time, so one bad request fails alone.

Errors each caller gets: the log's own refusal as it is (nothing was written), a ``NotWritten`` among
them (the log could not be reached, or its leader refused before writing: mqstore_rpc.remote_errors);
``OutcomeUnknown`` when the append failed in a way that does not prove nothing was written (UNAVAILABLE,
a deadline, a lost connection, a SYNC flush timeout: mqstore_rpc.remote_errors maps them to Unavailable;
or a bug, logged); plain ``Unavailable`` when the request was never sent (the batcher is closed, or it
waited too long for its turn). Nothing here retries an append.

Thread-safe: ``_lock`` guards the queues, the leaders, the requests' flags and the counters; a leader
appends unlocked; each caller waits on its request's own event.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import structlog

from mqstore import waits
from mqstore.errors import InvalidArgument, MqStoreError, NotWritten, OutcomeUnknown, Unavailable
from mqstore.model import AppendResult, MessageIn

log = structlog.get_logger("mqstore.txn.appender")
AppendFn = Callable[[str, Sequence[MessageIn]], list[AppendResult]]


@dataclass(eq=False)
class _Request:
    topic: str
    messages: Sequence[MessageIn]
    body_bytes: int
    signal: threading.Event = field(default_factory=threading.Event)  # done, or handed the lead
    lead: bool = False           # this caller appends the next round (set under _lock)
    taken: bool = False          # in a leader's round: only that round decides the outcome (under _lock)
    done: bool = False
    results: list[AppendResult] | None = None
    error: BaseException | None = None


class AppendBatcher:
    def __init__(self, append: AppendFn, *, max_messages: int, max_bytes: int, timeout_s: float):
        self._append, self.max_messages, self.max_bytes, self.timeout_s = append, max_messages, max_bytes, timeout_s
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[_Request]] = collections.defaultdict(collections.deque)
        self._leading: set[str] = set()  # topics with a leader (one per topic at a time)
        self._closed = False
        self.appends = self.appended_messages = 0

    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        """Append ``messages`` to ``topic`` (all or none), batched with other callers'.

        Group commit per topic, without a thread of its own: a caller that finds no append to its
        topic in flight leads one round: it appends everything queued for the topic (its own request
        and those that arrived), then hands the lead to the eldest caller still queued, who leads the
        next round. So a lone producer pays no hand-off between threads, under load one Append
        carries many producers' messages, and halves, real messages and OP records (other topics) are
        appended concurrently. Each caller is woken once, by its own event (its results, or its
        turn to lead): no caller is woken for a round it is not in."""
        request = _Request(topic, messages, sum(len(m.body) for m in messages))
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            if self._closed:
                raise Unavailable("the Transaction service is stopping; retry on the next start")
            queue = self._queues[topic]
            queue.append(request)
            if topic not in self._leading:
                self._leading.add(topic)
                request.lead = True
        if not request.lead:
            self._await_turn(request, queue, deadline)
        if not request.done:  # handed the lead (or found none): append the queue as it is now
            with self._lock:
                pending = list(queue)
                queue.clear()
                for taken in pending:
                    taken.taken = True
            self._lead(topic, pending)
        if request.error is not None:
            raise request.error
        return request.results

    def _await_turn(self, request: _Request, queue: collections.deque[_Request], deadline: float) -> None:
        """Until ``request`` is done or its caller is handed the lead; Unavailable (and withdrawn) if it
        is still queued at ``deadline``."""
        with waits.waiting():  # the handler pool runs other calls meanwhile (mqstore.waits)
            if request.signal.wait(max(deadline - time.monotonic(), 0)):
                return
        with self._lock:
            if not request.lead and not request.taken:
                # Never appended later behind the caller's back: a retried Commit must not find its
                # first attempt's messages arriving after it.
                queue.remove(request)
                raise Unavailable(f"the append waited {self.timeout_s:.0f} s for its turn and was not sent; retry")
        with waits.waiting():
            while not request.signal.wait(self.timeout_s):
                pass  # in a leader's round (or just handed the lead): that append has its own timeout

    def _lead(self, topic: str, pending: list[_Request]) -> None:
        try:
            for group in self._groups(pending):
                self._append_group(group)
        finally:
            with self._lock:
                queue = self._queues[topic]
                if queue:  # hand over: the eldest queued caller leads the next round
                    queue[0].lead = True
                    queue[0].signal.set()
                else:
                    self._leading.discard(topic)

    def close(self) -> None:
        """Refuse new appends (those in flight finish)."""
        with self._lock:
            self._closed = True

    def _groups(self, pending: list[_Request]) -> list[list[_Request]]:
        return _groups(pending, self.max_messages, self.max_bytes)

    def _append_group(self, group: list[_Request]) -> None:
        messages = [m for request in group for m in request.messages]
        try:
            results = _appended(self._append, group[0].topic, messages)
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
        with self._lock:
            self.appends += 1
            self.appended_messages += len(messages)
        at = 0
        for request in group:
            request.results = results[at:at + len(request.messages)]
            at += len(request.messages)
            request.done = True
            request.signal.set()

    @staticmethod
    def _fail(group: list[_Request], exc: BaseException) -> None:
        for request in group:
            request.error = exc
            request.done = True
            request.signal.set()


def _groups(pending: list, max_messages: int, max_bytes: int) -> list[list]:
    """Requests per topic in arrival order, cut at the message and byte limits (a request is never cut)."""
    by_topic: dict[str, list[list]] = {}
    for request in pending:
        groups = by_topic.setdefault(request.topic, [[]])
        last = groups[-1]
        count = sum(len(r.messages) for r in last) + len(request.messages)
        size = sum(r.body_bytes for r in last) + request.body_bytes
        if last and (count > max_messages or size > max_bytes):
            groups.append([request])
        else:
            last.append(request)
    return [group for groups in by_topic.values() for group in groups]


@dataclass(eq=False, slots=True)
class _LoopRequest:
    topic: str
    messages: Sequence[MessageIn]
    body_bytes: int
    result: asyncio.Future
    expiry: asyncio.TimerHandle | None = None
    taken: bool = False      # in a leader's round: only that round decides the outcome
    outcome: tuple | None = None    # (results, error) once the round has decided it


AppendManyFn = Callable[[list[tuple[str, list[MessageIn]]]],
                         Awaitable[list[list[AppendResult] | BaseException]]]
CALL_MAX_BATCHES = 100          # CommitLogInternal.AppendBatches: batches per request (commitlog.proto)


class LoopAppendBatcher:
    """AppendBatcher's group commit for coroutines of one event loop (Cluster mode's Transaction port on
    grpc.aio, txn_service.servicer): the same grouping (per topic, arrival order, at most
    ``max_messages`` and ``max_bytes`` per batch, a caller's messages never split), the same retry of a
    refused group one caller at a time and the same errors (the module docstring).

    Unlike the thread batcher, one round covers every topic: ``append_many`` is the coroutine
    ``append_many([(topic, messages), ...])`` of the log (CommitLogInternal.AppendBatchesStream, kept open by
    the CommitLog client on this loop), which appends each batch on its own (all or nothing per batch) and returns
    each one's results or error, in order. So a round's halves and the previous round's committed messages
    go in one call, not one per topic. While a call is in flight, the callers that arrive queue for the
    next, which a leader task sends as soon as that one is answered: the loop's thread never waits and no
    other thread is involved. A round's batches go in calls within the same limits as one batch: at most
    ``max_messages`` messages and ``max_bytes`` of bodies in all (and CALL_MAX_BATCHES batches), so
    ``max_messages`` 1 still means one message per call to the log (bench/txn.py's unbatched variant).

    A caller still queued after ``timeout_s`` gets Unavailable and its request is withdrawn (never sent
    later behind its back); one in a leader's round waits for that call, which has its own timeout. A
    caller cancelled while queued is withdrawn too; once taken, its messages are sent regardless and the
    caller still gets their outcome (the cancellation is left pending on its task: Task.cancelling), so
    that whoever appended learns what landed without a task of its own around the call
    (mqstore.txn.onloop, LoopCalls).

    Not thread-safe: every method is called on the loop's thread (the counters may be read from any)."""

    def __init__(self, append_many: AppendManyFn, *, max_messages: int, max_bytes: int, timeout_s: float):
        self._append_many = append_many
        self.max_messages, self.max_bytes, self.timeout_s = max_messages, max_bytes, timeout_s
        self._queue: collections.deque[_LoopRequest] = collections.deque()
        self._leader: asyncio.Task | None = None
        self._closed = False
        self.appends = self.appended_messages = 0   # calls to the log, and the messages they carried

    async def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        """Append ``messages`` to ``topic`` (all or none), batched with other callers' on this loop."""
        if self._closed:
            raise Unavailable("the Transaction service is stopping; retry on the next start")
        loop = asyncio.get_running_loop()
        request = _LoopRequest(topic, messages, sum(len(m.body) for m in messages), loop.create_future())
        request.expiry = loop.call_later(self.timeout_s, self._expire, request)
        self._queue.append(request)
        if self._leader is None:
            self._leader = loop.create_task(self._lead())
        try:
            return await request.result
        except asyncio.CancelledError:
            if self._withdraw(request):
                raise
        return await self._outcome_of(request)

    @staticmethod
    async def _outcome_of(request: _LoopRequest) -> list[AppendResult]:
        """A taken request's outcome for a caller cancelled meanwhile: its messages go regardless, and it may
        have landed; the caller must learn which (the table). Cancelled again while waiting, it waits on."""
        loop = asyncio.get_running_loop()
        while request.outcome is None:
            request.result = loop.create_future()
            try:
                await request.result
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 (the outcome below; a cancel stays pending)
                pass
        results, error = request.outcome
        if error is not None:
            raise error
        return results

    def _expire(self, request: _LoopRequest) -> None:
        if self._withdraw(request):
            request.result.set_exception(
                Unavailable(f"the append waited {self.timeout_s:.0f} s for its turn and was not sent; retry"))

    def _withdraw(self, request: _LoopRequest) -> bool:
        """Take a request not yet in a round out of the queue; False if a round has it."""
        if request.taken:
            return False
        request.taken = True
        request.expiry.cancel()
        self._queue.remove(request)
        return True

    async def _lead(self) -> None:
        queue = self._queue
        try:
            while queue:
                pending = list(queue)
                queue.clear()
                for request in pending:
                    request.taken = True
                    request.expiry.cancel()
                for call in self._calls(_groups(pending, self.max_messages, self.max_bytes)):
                    await self._append_groups(call)
        finally:
            self._leader = None

    def _calls(self, groups: list[list[_LoopRequest]]) -> list[list[list[_LoopRequest]]]:
        """``groups`` packed into calls, in order, within the call limits."""
        calls: list[list[list[_LoopRequest]]] = []
        count = size = 0
        for group in groups:
            group_count = sum(len(r.messages) for r in group)
            group_size = sum(r.body_bytes for r in group)
            if not calls or (len(calls[-1]) >= CALL_MAX_BATCHES or count + group_count > self.max_messages
                             or size + group_size > self.max_bytes):
                calls.append([])
                count = size = 0
            calls[-1].append(group)
            count += group_count
            size += group_size
        return calls

    async def _append_groups(self, groups: list[list[_LoopRequest]]) -> None:
        batches = [(group[0].topic, [m for request in group for m in request.messages]) for group in groups]
        try:
            outcomes = await self._append_many(batches)
        except BaseException as exc:
            for group, (topic, _) in zip(groups, batches, strict=True):
                error = _as_caller_error(exc, topic) if isinstance(exc, Exception) else OutcomeUnknown(
                    f"the append to {topic} was cut off by the service stopping: it may or may not have been "
                    f"written")
                self._fail(group, error)
            if not isinstance(exc, Exception):
                raise  # the loop is stopping (CancelledError): the leader ends too
            return
        self.appends += 1
        alone: list[list[_LoopRequest]] = []
        for group, (topic, messages), outcome in zip(groups, batches, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                error = _as_caller_error(outcome, topic)
                if isinstance(error, InvalidArgument) and len(group) > 1:
                    alone.extend([request] for request in group)  # find the bad one: each alone
                else:
                    self._fail(group, error)
                continue
            self.appended_messages += len(messages)
            at = 0
            for request in group:
                _decide(request, outcome[at:at + len(request.messages)], None)
                at += len(request.messages)
        for call in self._calls(alone):
            await self._append_groups(call)

    @staticmethod
    def _fail(group: list[_LoopRequest], error: BaseException) -> None:
        for request in group:
            _decide(request, None, error)

    def close(self) -> None:
        """Refuse new appends (those in flight finish)."""
        self._closed = True


def _decide(request: _LoopRequest, results: list[AppendResult] | None, error: BaseException | None) -> None:
    """A taken request's outcome, kept for a caller cancelled meanwhile (LoopAppendBatcher._outcome_of)."""
    request.outcome = (results, error)
    if not request.result.done():  # cancelled by its caller: _outcome_of waits on a fresh one
        if error is None:
            request.result.set_result(results)
        else:
            request.result.set_exception(error)


class AppendCounts:
    """The counters of several appenders as one (Stats: a thread's and the loop's batcher in Cluster mode)."""

    def __init__(self, *appenders):
        self._appenders = appenders

    @property
    def appends(self) -> int:
        return sum(a.appends for a in self._appenders)

    @property
    def appended_messages(self) -> int:
        return sum(a.appended_messages for a in self._appenders)


def _appended(append: AppendFn, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
    """``append(topic, messages)`` with its errors as callers get them (the module docstring): the log's
    own refusal as it is, OutcomeUnknown when it may have been written (Unavailable, or a bug: logged)."""
    try:
        return append(topic, messages)
    except BaseException as exc:  # noqa: BLE001 (turned into the error the caller gets; a bug is logged)
        raise _as_caller_error(exc, topic) from None


def _as_caller_error(exc: BaseException, topic: str) -> BaseException:
    """The error a caller gets for an append that raised ``exc``."""
    if isinstance(exc, NotWritten):  # certainly not written: as it is, retriable, no outcome to find out
        return exc
    if isinstance(exc, Unavailable):
        return OutcomeUnknown(f"the commit log did not confirm the append to {topic} ({exc}): it may or may not "
                              f"have been written")
    if isinstance(exc, MqStoreError):
        return exc
    # a bug (logged); whether the log wrote it is unknown: none may retry blindly
    log.error("txn.append_failed", topic=topic, exc_info=exc)
    return OutcomeUnknown(f"the append to {topic} failed unexpectedly ({type(exc).__name__}, logged as "
                          f"txn.append_failed): it may or may not have been written")


class DirectAppender:
    """The appender of Local mode, where the log is in this process: each caller appends on its own thread,
    with the same errors as AppendBatcher's callers get and the same counters. Merging buys nothing there
    (an append takes no round trip, so callers rarely meet: 1.0 message per append measured, bench/txn.py)
    and the batcher's queue, events and hand-offs cost 10-25% of a transaction's rate; concurrent SYNC
    appends still share a flush, in the store's own group commit. Thread-safe: ``_lock`` guards the
    counters; ``_closed`` is only ever set (a call racing close may still append, as in the batcher)."""

    def __init__(self, append: AppendFn):
        self._append = append
        self._lock = threading.Lock()
        self._closed = False
        self.appends = self.appended_messages = 0

    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]:
        if self._closed:
            raise Unavailable("the Transaction service is stopping; retry on the next start")
        results = _appended(self._append, topic, messages)
        with self._lock:
            self.appends += 1
            self.appended_messages += len(messages)
        return results

    def close(self) -> None:
        """Refuse new appends (those in flight finish)."""
        self._closed = True
