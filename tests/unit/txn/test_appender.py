"""The appends batched across producers: callers queued while an append to their topic is in flight share
the next one (group commit per topic), one caller's messages are never split, an append that the log
refuses as INVALID_ARGUMENT is retried caller by caller so that only the bad one fails. Both appenders (the
batcher, and Local mode's direct one) give a caller the same errors: the log's refusal as it is,
OUTCOME_UNKNOWN when the append may have landed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mqstore.errors import FailedPrecondition, InvalidArgument, OutcomeUnknown, Unavailable
from mqstore.model import AppendResult, MessageIn
from tests.support.waiting import wait_until
from mqstore.txn.appender import CALL_MAX_BATCHES, AppendBatcher, DirectAppender, LoopAppendBatcher


class Log:
    def __init__(self):
        self.calls: list[tuple[str, list[bytes]]] = []
        self.attempts: list[list[bytes]] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def append(self, topic, messages):
        self.entered.set()
        assert self.release.wait(10)
        self.attempts.append([m.body for m in messages])
        if any(m.body == b"bad" for m in messages):
            raise InvalidArgument("messages[0].body is bad")
        self.calls.append((topic, [m.body for m in messages]))
        return [AppendResult("id", "u", 0, i, i, 1, 0, "WRITTEN") for i in range(len(messages))]


def test_waiting_callers_share_the_next_append_and_a_bad_one_fails_alone():
    log = Log()
    batcher = AppendBatcher(log.append, max_messages=1000, max_bytes=1 << 20, timeout_s=10)
    results: dict[str, object] = {}

    def call(name, bodies):
        try:
            results[name] = len(batcher.append("t", [MessageIn(b) for b in bodies]))
        except InvalidArgument as exc:
            results[name] = exc

    first = threading.Thread(target=call, args=("first", [b"a"]))
    first.start()
    assert log.entered.wait(10)  # the first caller leads; its append is in flight
    others = [threading.Thread(target=call, args=(name, bodies))
              for name, bodies in (("two", [b"b", b"c"]), ("bad", [b"bad"]), ("three", [b"d"]))]
    for t in others:
        t.start()
    wait_until(lambda: len(batcher._queues["t"]) == 3, "the three callers queued behind the leader")
    log.release.set()
    for t in (first, *others):
        t.join(10)
    assert results["first"] == 1 and results["two"] == 2 and results["three"] == 1
    assert isinstance(results["bad"], InvalidArgument)
    assert log.calls[0] == ("t", [b"a"])
    assert sorted(b for _, bodies in log.calls[1:] for b in bodies) == [b"b", b"c", b"d"]
    assert log.attempts[1] == [b"b", b"c", b"bad", b"d"]  # the three waiting callers shared one append...
    assert len(log.calls) == 3  # ...which the log refused: then each alone, and only "bad" failed
    assert all(bodies != [b"c"] for _, bodies in log.calls)  # "two" was never split


APPENDERS = {"batcher": lambda append: AppendBatcher(append, max_messages=10, max_bytes=100, timeout_s=1),
             "direct": DirectAppender}


@pytest.mark.parametrize("kind", APPENDERS)
def test_a_closed_appender_refuses(kind):
    appender = APPENDERS[kind](lambda topic, messages: [])
    appender.close()
    with pytest.raises(Unavailable, match="stopping") as refused:
        appender.append("t", [MessageIn(b"x")])
    assert type(refused.value) is Unavailable  # not sent: plainly retriable, not of unknown outcome


@pytest.mark.parametrize("kind", APPENDERS)
@pytest.mark.parametrize("raised, expected, text", [
    (InvalidArgument("messages[0].body is bad"), InvalidArgument, "is bad"),       # the log's refusal, as it is
    (FailedPrecondition("read-only"), FailedPrecondition, "read-only"),
    (Unavailable("flush timed out"), OutcomeUnknown, "may or may not have been written"),  # it may have landed
    (KeyError("a bug"), OutcomeUnknown, "logged as txn.append_failed"),
])
def test_a_failed_append_gives_its_caller_the_same_error_from_either_appender(kind, raised, expected, text):
    def append(topic, messages):
        raise raised
    appender = APPENDERS[kind](append)
    with pytest.raises(expected, match=text):
        appender.append("t", [MessageIn(b"x")])
    assert (appender.appends, appender.appended_messages) == (0, 0)


def test_the_direct_appender_appends_on_the_callers_thread_and_counts():
    threads = []

    def append(topic, messages):
        threads.append(threading.get_ident())
        return [AppendResult("id", "u", 0, i, i, 1, 0, "WRITTEN") for i in range(len(messages))]
    appender = DirectAppender(append)
    assert [r.queue_offset for r in appender.append("t", [MessageIn(b"a"), MessageIn(b"b")])] == [0, 1]
    appender.append("t", [MessageIn(b"c")])
    assert threads == [threading.get_ident()] * 2
    assert (appender.appends, appender.appended_messages) == (2, 3)


# ---- the loop's batcher (Cluster mode's grpc.aio Transaction port) -----------------------------------------

class LoopLog:
    """An async log taking several topics' batches per call (CommitLogInternal.AppendBatches), whose calls
    wait for ``release``; a batch with a body b"bad" is refused on its own."""

    def __init__(self):
        self.calls: list[list[tuple[str, list[bytes]]]] = []
        self.release = asyncio.Event()
        self.in_flight = 0

    async def append_many(self, batches):
        self.in_flight += 1
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1
        self.calls.append([(topic, [m.body for m in messages]) for topic, messages in batches])
        return [InvalidArgument("messages[0].body is bad") if any(m.body == b"bad" for m in messages)
                else [AppendResult("id", "u", 0, i, i, 1, 0, "WRITTEN") for i in range(len(messages))]
                for _, messages in batches]


async def _settle():
    for _ in range(5):
        await asyncio.sleep(0)


def _outcome(task: asyncio.Task):
    return task.exception() or len(task.result())


def test_the_loop_batcher_shares_one_call_across_topics_and_a_bad_caller_fails_alone():
    async def run():
        log = LoopLog()
        batcher = LoopAppendBatcher(log.append_many, max_messages=1000, max_bytes=1 << 20, timeout_s=10)
        first = asyncio.ensure_future(batcher.append("t", [MessageIn(b"a")]))
        await _settle()
        assert log.in_flight == 1  # the first caller's call is in flight; the others queue for the next
        others = {name: asyncio.ensure_future(batcher.append("t", [MessageIn(b) for b in bodies]))
                  for name, bodies in (("two", [b"b", b"c"]), ("bad", [b"bad"]), ("three", [b"d"]))}
        other_topic = asyncio.ensure_future(batcher.append("u", [MessageIn(b"x")]))
        await _settle()
        assert log.in_flight == 1  # one call at a time, for every topic
        log.release.set()
        await asyncio.wait([first, other_topic, *others.values()])
        assert _outcome(first) == 1 and _outcome(others["two"]) == 2 and _outcome(others["three"]) == 1
        assert _outcome(other_topic) == 1
        assert isinstance(others["bad"].exception(), InvalidArgument)
        assert log.calls == [
            [("t", [b"a"])],
            [("t", [b"b", b"c", b"bad", b"d"]), ("u", [b"x"])],  # both topics in one call; "t" refused alone
            [("t", [b"b", b"c"]), ("t", [b"bad"]), ("t", [b"d"])],  # then each caller alone ("two" never split)
        ]
        assert (batcher.appends, batcher.appended_messages) == (3, 5)
    asyncio.run(run())


def test_the_loop_batcher_cuts_batches_and_calls_at_their_limits_never_inside_a_caller():
    async def run():
        log = LoopLog()
        log.release.set()
        batcher = LoopAppendBatcher(log.append_many, max_messages=3, max_bytes=1 << 20, timeout_s=10)
        calls = [batcher.append("t", [MessageIn(bytes([i]))] * n) for i, n in enumerate((1, 2, 2, 3))]
        await asyncio.gather(*calls)
        # all four queued before the round: 1+2 fit in 3, the next 2 would not (a caller is never cut), then 3;
        # a call holds no more messages than a batch may
        assert [[len(bodies) for _, bodies in call] for call in log.calls] == [[3], [2], [3]]

        log.calls.clear()
        many = LoopAppendBatcher(log.append_many, max_messages=1000, max_bytes=1 << 20, timeout_s=10)
        await asyncio.gather(*(many.append(f"t{i}", [MessageIn(b"m")]) for i in range(CALL_MAX_BATCHES + 1)))
        assert [len(call) for call in log.calls] == [CALL_MAX_BATCHES, 1]  # batches per call

        log.calls.clear()
        topics = LoopAppendBatcher(log.append_many, max_messages=3, max_bytes=1 << 20, timeout_s=10)
        sizes = (("a", 1), ("b", 2), ("c", 1))
        await asyncio.gather(*(topics.append(topic, [MessageIn(b"m")] * n) for topic, n in sizes))
        assert [[topic for topic, _ in call] for call in log.calls] == [["a", "b"], ["c"]]  # messages per call

        log.calls.clear()
        small = LoopAppendBatcher(log.append_many, max_messages=3, max_bytes=10, timeout_s=10)
        await asyncio.gather(*(small.append(topic, [MessageIn(b"x" * 4)]) for topic in "abcd"))
        assert [[topic for topic, _ in call] for call in log.calls] == [["a", "b"], ["c", "d"]]  # bytes per call
    asyncio.run(run())


@pytest.mark.parametrize("how", ["the call", "its batch"])
@pytest.mark.parametrize("raised, expected, text", [
    (InvalidArgument("messages[0].body is bad"), InvalidArgument, "is bad"),
    (FailedPrecondition("read-only"), FailedPrecondition, "read-only"),
    (Unavailable("deadline"), OutcomeUnknown, "may or may not have been written"),
    (KeyError("a bug"), OutcomeUnknown, "logged as txn.append_failed"),
])
def test_the_loop_batcher_gives_the_same_errors_as_the_thread_one(how, raised, expected, text):
    """Whether the whole call failed or the log refused just this caller's batch."""
    async def append_many(batches):
        if how == "the call":
            raise raised
        return [raised for _ in batches]

    async def run():
        batcher = LoopAppendBatcher(append_many, max_messages=10, max_bytes=100, timeout_s=1)
        with pytest.raises(expected, match=text):
            await batcher.append("t", [MessageIn(b"x")])
        assert batcher.appended_messages == 0
        batcher.close()
        with pytest.raises(Unavailable, match="stopping") as refused:
            await batcher.append("t", [MessageIn(b"x")])
        assert type(refused.value) is Unavailable
    asyncio.run(run())


def test_the_loop_batcher_withdraws_a_caller_that_waited_too_long_or_went_away_never_sending_it_later():
    async def run():
        log = LoopLog()
        batcher = LoopAppendBatcher(log.append_many, max_messages=10, max_bytes=100, timeout_s=0.2)
        first = asyncio.ensure_future(batcher.append("t", [MessageIn(b"a")]))
        await _settle()
        late = asyncio.ensure_future(batcher.append("t", [MessageIn(b"late")]))
        gone = asyncio.ensure_future(batcher.append("u", [MessageIn(b"gone")]))
        await _settle()
        gone.cancel()
        with pytest.raises(Unavailable, match="was not sent") as refused:
            await late  # still queued after timeout_s: the first call is held
        assert type(refused.value) is Unavailable  # plainly retriable: it was never sent
        assert first.done() is False  # a caller in a round waits for it, whatever its timeout
        log.release.set()
        assert len(await first) == 1
        await _settle()
        assert log.calls == [[("t", [b"a"])]]  # neither the withdrawn nor the cancelled caller was sent later
        assert not batcher._queue and batcher._leader is None
    asyncio.run(run())


def test_the_loop_batcher_gives_a_caller_cancelled_after_its_call_went_the_outcome_and_leaves_the_cancel_pending():
    """Once taken, a request's messages go regardless, so its caller must learn what landed (the table):
    cancelled meanwhile (even twice), it still returns the results or raises the call's error, and its task
    keeps the cancellation pending (Task.cancelling) for whoever raises it after (mqstore.txn.onloop)."""
    async def run():
        log = LoopLog()
        batcher = LoopAppendBatcher(log.append_many, max_messages=10, max_bytes=100, timeout_s=10)

        async def caller(body):
            results = await batcher.append("t", [MessageIn(body)])
            return results, asyncio.current_task().cancelling()

        sent = asyncio.ensure_future(caller(b"a"))
        await _settle()
        assert log.in_flight == 1  # taken: its call is in flight
        sent.cancel()
        await _settle()
        sent.cancel()
        await _settle()
        assert not sent.done()  # still waiting for the outcome
        log.release.set()
        results, cancelling = await sent
        assert len(results) == 1 and cancelling == 2

        log.release.clear()
        refused = asyncio.ensure_future(caller(b"bad"))
        await _settle()
        refused.cancel()
        await _settle()
        log.release.set()
        with pytest.raises(InvalidArgument):  # the call's refusal, not the cancellation: nothing landed
            await refused
        assert log.calls == [[("t", [b"a"])], [("t", [b"bad"])]]
    asyncio.run(run())
