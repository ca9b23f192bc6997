"""The gateway's coalescing of concurrent sends (mqstore.gateway.coalescing), on a fake AppendBatches that
the test holds: a lone send is one call at once; sends that arrive while a call is in flight go together
in the next one, each with its own outcome; a failed call fails only its own sends; nothing waits forever."""

from __future__ import annotations

import threading

import pytest

from mqstore.errors import NotFound, Unavailable
from mqstore.gateway.coalescing import SendCoalescer
from mqstore.model import AppendResult, MessageIn
from tests.support.waiting import wait_until

JOIN_S = 30


def _result(topic: str, n: int) -> AppendResult:
    return AppendResult(f"{topic}-{n}", "", 0, n, n, 1, 0, "WRITTEN")


class FakeLog:
    """AppendBatches: one result per message, numbered in call order; a topic named "gone" is NotFound;
    ``hold`` makes the next call wait until ``release``; ``fail`` makes the next call raise it."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.hold = threading.Event()
        self.held = threading.Event()
        self.released = threading.Event()
        self.fail: BaseException | None = None
        self.count = 0

    def __call__(self, batches):
        self.calls.append([topic for topic, _ in batches])
        if self.hold.is_set():
            self.hold.clear()
            self.held.set()
            assert self.released.wait(JOIN_S)
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        out = []
        for topic, messages in batches:
            if topic == "gone":
                out.append(NotFound(f"topic {topic} does not exist"))
                continue
            out.append([_result(topic, self.count + i) for i in range(len(messages))])
            self.count += len(messages)
        return out


def _send(coalescer: SendCoalescer, topic: str, outcomes: dict, key) -> threading.Thread:
    def run():
        try:
            outcomes[key] = coalescer.append(topic, [MessageIn(b"x")])
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcomes[key] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _join(threads) -> None:
    for thread in threads:
        thread.join(JOIN_S)
        assert not thread.is_alive(), "a send never got its answer"


def test_a_lone_send_is_one_call_at_once():
    log = FakeLog()
    coalescer = SendCoalescer(log)
    for i in range(3):
        assert coalescer.append("t", [MessageIn(b"x")])[0].queue_offset == i
    assert log.calls == [["t"], ["t"], ["t"]]
    assert (coalescer.calls, coalescer.sends, coalescer.waiting()) == (3, 3, 0)


def test_sends_arriving_while_a_call_is_in_flight_go_together_each_with_its_own_outcome():
    log, outcomes = FakeLog(), {}
    coalescer = SendCoalescer(log)
    log.hold.set()
    first = _send(coalescer, "t", outcomes, "first")
    assert log.held.wait(JOIN_S)
    topics = ["a", "gone", "b", "c"]
    followers = [_send(coalescer, topic, outcomes, topic) for topic in topics]
    wait_until(lambda: coalescer.waiting() == len(topics), "the sends queued behind the call in flight")
    log.released.set()
    _join([first, *followers])
    assert len(log.calls) == 2 and sorted(log.calls[1]) == sorted(topics), log.calls
    assert outcomes["first"][0].msg_id == "t-0"
    assert isinstance(outcomes["gone"], NotFound)  # only its own send fails
    assert sorted(outcomes[t][0].msg_id.split("-")[0] for t in ("a", "b", "c")) == ["a", "b", "c"]
    assert len({outcomes[t][0].queue_offset for t in ("a", "b", "c")}) == 3
    assert (coalescer.calls, coalescer.sends, coalescer.waiting()) == (2, 5, 0)


def test_a_failed_call_fails_its_own_sends_only_and_the_next_send_goes():
    log, outcomes = FakeLog(), {}
    coalescer = SendCoalescer(log)
    log.hold.set()
    first = _send(coalescer, "t", outcomes, "first")
    assert log.held.wait(JOIN_S)
    followers = [_send(coalescer, "t", outcomes, i) for i in range(3)]
    wait_until(lambda: coalescer.waiting() == 3, "three sends queued")
    log.fail = Unavailable("the commit log is unreachable")  # the held call fails, after the release
    log.released.set()
    _join([first, *followers])
    assert isinstance(outcomes["first"], Unavailable)
    assert all(not isinstance(outcomes[i], Exception) for i in range(3))  # their call was the next one
    assert coalescer.append("t", [MessageIn(b"x")])  # in flight is over: a lone send goes at once
    assert coalescer.waiting() == 0


def test_a_call_carries_at_most_max_batches_and_the_rest_follow():
    log, outcomes = FakeLog(), {}
    coalescer = SendCoalescer(log, max_batches=2)
    log.hold.set()
    first = _send(coalescer, "t", outcomes, "first")
    assert log.held.wait(JOIN_S)
    followers = [_send(coalescer, "t", outcomes, i) for i in range(5)]
    wait_until(lambda: coalescer.waiting() == 5, "five sends queued")
    log.released.set()
    _join([first, *followers])
    assert [len(call) for call in log.calls] == [1, 2, 2, 1]
    assert sorted(outcomes[i][0].queue_offset for i in range(5)) == [1, 2, 3, 4, 5]


def test_max_batches_is_bounded_by_what_append_batches_takes():
    with pytest.raises(ValueError):
        SendCoalescer(FakeLog(), max_batches=101)
