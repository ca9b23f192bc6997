"""Nagle's rule of the OP batcher (mqstore.txn.opbatch): entries an answer waits for (urge) are written at
once when no OP write is in flight; those arriving while one is in flight go as one batch when it completes;
the size limit splits; entries nobody waits for keep to size and time. The duty runs on its thread with a
blocking writer; the clock is a FakeClock that never moves, so no write here can be a timer's."""

from __future__ import annotations

import threading

import pytest

from mqstore.clock import FakeClock
from mqstore.txn.opbatch import OpBatcher, parse_body
from tests.support.waiting import wait_until


class GatedLog:
    """A writer that holds each write until the test opens the gate (``hold`` True), counting entries."""

    def __init__(self, hold: bool):
        self.bodies: list[bytes] = []
        self.entered = 0
        self.hold = hold
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def write(self, body: bytes, offsets) -> None:
        with self._lock:
            self.entered += 1
        if self.hold:
            assert self.gate.wait(30), "the test never opened the gate"
        with self._lock:
            self.bodies.append(body)

    def written(self) -> list[list[int]]:
        with self._lock:
            return [parse_body(b) for b in self.bodies]


@pytest.fixture
def rig(request):
    log = GatedLog(hold=getattr(request, "param", False))
    ops = OpBatcher(log.write, FakeClock(), max_bytes=4096, interval_ms=3_600_000)
    ops.start()
    yield log, ops
    log.gate.set()
    assert ops.stop(10)


def test_a_lone_entry_an_answer_waits_for_is_written_at_once(rig):
    log, ops = rig
    ops.add([7])
    ops.urge()
    wait_until(lambda: log.written() == [[7]], "the lone OP entry written without a timer")
    assert ops.stats().flush_by_waiter == 1 and ops.stats().flush_by_time == 0


@pytest.mark.parametrize("rig", [True], indirect=True)
def test_entries_arriving_while_a_write_is_in_flight_go_as_one_batch_when_it_completes(rig):
    log, ops = rig
    ops.add([1])
    ops.urge()
    wait_until(lambda: log.entered == 1, "the first OP write in flight")
    for offset in (2, 3):  # two answers wait behind the write in flight
        ops.add([offset])
        ops.urge()
    ops.add([4])  # nobody waits for this one: it rides along
    assert log.entered == 1  # nothing more goes while the first is in flight
    log.gate.set()
    wait_until(lambda: log.written() == [[1], [2, 3, 4]], "the gathered entries as one OP message")
    stats = ops.stats()
    assert (stats.messages_written, stats.entries_written, stats.flush_by_waiter, stats.pending) == (2, 4, 2, 0)


@pytest.mark.parametrize("rig", [True], indirect=True)
def test_the_size_limit_splits_what_gathered_behind_a_write_in_flight(rig):
    log, ops = rig
    ops.max_bytes = 4  # "n," is 2 bytes: two entries a message
    ops.add([1])
    ops.urge()
    wait_until(lambda: log.entered == 1, "the first OP write in flight")
    ops.add([2, 3, 4])
    ops.urge()
    log.gate.set()
    wait_until(lambda: log.written() == [[1], [2, 3], [4]], "the gathered entries split at max_bytes")
    stats = ops.stats()
    assert (stats.flush_by_size, stats.flush_by_waiter) == (1, 2)


def test_entries_nobody_waits_for_keep_to_size_and_time_and_ride_with_an_urged_write():
    clock = FakeClock()
    log = GatedLog(hold=False)
    ops = OpBatcher(log.write, clock, max_bytes=4096, interval_ms=3000)  # the duty not started
    ops.add([1, 2])  # a Commit's entries: nobody waits
    assert ops.flush_due() == 0
    ops.add([3])
    ops.urge()  # a Rollback waits for 3: 1 and 2 go with it
    assert ops.flush_due() == 1 and log.written() == [[1, 2, 3]]
    ops.urge()  # nothing queued: nothing to write
    ops.add([4])
    assert ops.flush_due() == 0  # urged before 4 was queued: 4 waits for size or time
    clock.advance(3000)
    assert ops.flush_due() == 1 and log.written()[-1] == [4]
    assert (ops.stats().flush_by_waiter, ops.stats().flush_by_time) == (1, 1)
