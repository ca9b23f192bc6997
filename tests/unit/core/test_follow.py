"""The shared Tail follower (mqstore.follow) over an in-memory log and a recording projection: resume
semantics (None = earliest, 0 = offset 0), both gap policies, a log behind the resume point, damaged
ranges, the log going away and a bug. No sockets, no sleeps: waits poll a condition with a deadline."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from mqstore.errors import InvalidArgument, OutOfRange, Unavailable
from mqstore.follow import FollowConfig, Follower, Gap, GapPolicy
from mqstore.model import TailFrame
from tests.support.waiting import WAIT_S, wait_until

FAST = FollowConfig(heartbeat_ms=10, backoff_initial_ms=1, backoff_max_ms=10)
RECORD_BYTES = 10


class MemoryLog:
    """Records of RECORD_BYTES each in [min_offset, end); ``fail_next`` makes the next read raise."""

    def __init__(self, end: int, min_offset: int = 0):
        self.lock = threading.Condition()
        self.min_offset, self.end = min_offset, end
        self.opened: list[int | None] = []
        self.fail_next: Exception | None = None
        self.refuse_opens: Exception | None = None  # tail() itself raises it (a client that fails at once)

    def grow(self, end: int) -> None:
        with self.lock:
            self.end = end
            self.lock.notify_all()

    def tail(self, start, *, max_frame_bytes, heartbeat_ms):
        with self.lock:
            self.opened.append(start)
            if self.refuse_opens is not None:
                raise self.refuse_opens
            low, high = self.min_offset, self.end
        position = low if start is None else start
        if not low <= position <= high:
            return Stream(self, position, OutOfRange(f"{position} outside [{low}, {high}]", min_value=low,
                                                     max_value=high))
        return Stream(self, position)


class Stream:
    def __init__(self, log: MemoryLog, position: int, error: Exception | None = None):
        self.log, self.position, self.error = log, position, error
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()
        with self.log.lock:
            self.log.lock.notify_all()

    def __iter__(self):
        if self.error is not None:
            raise self.error
        while not self.cancelled.is_set():
            with self.log.lock:
                if self.log.fail_next is not None:
                    error, self.log.fail_next = self.log.fail_next, None
                    raise error
                if self.position >= self.log.end:
                    self.log.lock.wait(0.01)
                end = self.log.end
            if self.position < end:
                first, self.position = self.position, min(end, self.position + 3 * RECORD_BYTES)
                yield TailFrame(b"r" * (self.position - first), (self.position - first) // RECORD_BYTES,
                                self.position, end)
            else:
                yield TailFrame(b"", 0, self.position, end)
        raise Unavailable("cancelled")


@dataclass(frozen=True)
class Damage:
    start_physical_offset: int
    end_physical_offset: int
    reason: str


class Recorder:
    """A projection: remembers every record offset applied; may report damage or hit a bug."""

    def __init__(self, resume: int | None = None):
        self.resume = resume
        self.records: list[int] = []
        self.damage: dict[int, Damage] = {}  # reported whenever a frame covers its start
        self.bug = False

    def resume_offset(self) -> int | None:
        return self.resume

    def apply(self, frame: TailFrame) -> list[Damage]:
        if self.bug:
            raise TypeError("a bug in the projection")
        first = frame.next_physical_offset - len(frame.records)
        self.records += [o for o in range(first, frame.next_physical_offset, RECORD_BYTES)
                         if self.resume is None or o >= self.resume]
        if self.resume is None or frame.next_physical_offset > self.resume:
            self.resume = frame.next_physical_offset
        return [d for start, d in self.damage.items() if first <= start < frame.next_physical_offset]


@pytest.fixture
def running():
    followers = []

    def start(log, projection, policy=GapPolicy.SKIP) -> Follower:
        follower = Follower("test-follower", log, projection, FAST, gap_policy=policy)
        followers.append(follower)
        follower.start()
        return follower

    yield start
    for follower in followers:
        assert follower.stop(WAIT_S)


def test_none_means_the_earliest_record_and_zero_means_offset_zero(running):
    log = MemoryLog(end=200, min_offset=100)  # retention removed [0, 100)
    fresh, at_zero = Recorder(None), Recorder(0)
    running(log, fresh)
    wait_until(lambda: fresh.resume == 200, "the fresh projection to catch up")
    assert fresh.records == list(range(100, 200, RECORD_BYTES))
    follower = running(log, at_zero)
    wait_until(lambda: at_zero.resume == 200, "the projection at 0 to catch up")
    assert log.opened[:2] == [None, 0]
    state = follower.state()
    assert state.skipped_bytes == 100 and state.gap is None and state.healthy and follower.problem() == ""


def test_stop_policy_stays_at_the_gap_and_reports_it(running):
    log = MemoryLog(end=200, min_offset=100)
    projection = Recorder(40)
    follower = running(log, projection, GapPolicy.STOP)
    state = wait_until(lambda: (s := follower.state()).gap and s, "the gap to be reported")
    assert state.gap == Gap(40, 100) and not state.healthy and state.alive and state.skipped_bytes == 0
    assert "stopped at physical offset 40" in follower.problem() and "cannot be rebuilt" in follower.problem()
    wait_until(lambda: len(log.opened) >= 3, "retries")
    assert projection.resume == 40 and projection.records == [] and set(log.opened) == {40}
    with log.lock:
        log.min_offset = 0  # the records came back (restored): the follower goes on from where it stayed
    wait_until(lambda: projection.resume == 200, "the projection to catch up")
    assert projection.records == list(range(40, 200, RECORD_BYTES))
    assert follower.state().gap is None and follower.problem() == ""


def test_a_log_behind_the_resume_point_is_waited_for_healthy(running):
    log = MemoryLog(end=100)
    projection = Recorder(150)
    follower = running(log, projection)
    state = wait_until(lambda: (s := follower.state()).last_error and s, "the failure to be recorded")
    assert state.healthy and not state.connected and follower.problem() == "" and "OutOfRange" in state.last_error
    log.grow(300)
    wait_until(lambda: projection.resume == 300, "the projection to catch up")
    assert projection.records[0] == 150 and follower.state().connected and follower.state().skipped_bytes == 0


def test_damaged_ranges_are_kept_once_and_counted(running):
    log = MemoryLog(end=300)
    projection = Recorder()
    projection.damage = {50: Damage(50, 60, "crc"), 200: Damage(200, 230, "totalsize")}
    follower = running(log, projection)
    wait_until(lambda: projection.resume == 300, "the projection to catch up")
    log.fail_next = Unavailable("connection reset")  # a reconnect re-feeds: the ranges come again
    wait_until(lambda: follower.state().reconnects >= 1 and follower.state().connected, "a reconnect")
    state = follower.state()
    assert [(d.start_physical_offset, d.reason) for d in state.damaged_ranges] == [(50, "crc"), (200, "totalsize")]
    assert state.damaged_bytes == 40 and state.healthy and follower.problem() == ""


def test_the_log_going_away_is_healthy_and_other_errors_are_not(running):
    log = MemoryLog(end=50)
    projection = Recorder()
    follower = running(log, projection)
    wait_until(lambda: projection.resume == 50, "the first records")
    log.fail_next = Unavailable("the log is restarting")
    state = wait_until(lambda: (s := follower.state()).last_error and s, "the disconnect")
    assert state.healthy and follower.problem() == ""
    wait_until(lambda: follower.state().connected, "the reconnect")
    log.refuse_opens = Unavailable("connection refused")  # the re-open itself fails...
    log.fail_next = Unavailable("connection reset")  # ...after this stream breaks
    state = wait_until(lambda: "connection refused" in (s := follower.state()).last_error and s, "the refused open")
    assert state.healthy and not state.connected
    log.refuse_opens = None
    wait_until(lambda: follower.state().connected, "the reconnect after the refusal")
    log.fail_next = InvalidArgument("no record starts at 50")
    state = wait_until(lambda: (s := follower.state()).last_error and s, "the failure")
    assert not state.healthy and "no record starts at 50" in follower.problem() and state.alive


def test_a_bug_kills_the_follower_and_is_reported(running):
    log = MemoryLog(end=50)
    projection = Recorder()
    projection.bug = True
    follower = running(log, projection)
    wait_until(lambda: not follower.state().alive and follower.state().died, "the follower to die")
    assert "TypeError: a bug in the projection" in follower.problem()


def test_stop_ends_a_stream_waiting_for_records():
    log = MemoryLog(end=0)
    follower = Follower("test-follower", log, Recorder(), FollowConfig(heartbeat_ms=60_000))
    follower.start()
    wait_until(lambda: log.opened, "the stream to open")
    started = time.monotonic()
    assert follower.stop(5)
    assert not follower.state().alive and not follower.state().connected and time.monotonic() - started < 5


def test_config_is_validated():
    with pytest.raises(InvalidArgument, match="heartbeat_ms"):
        FollowConfig(heartbeat_ms=0)
    with pytest.raises(InvalidArgument, match="backoff_max_ms"):
        FollowConfig(backoff_initial_ms=10, backoff_max_ms=5)


def test_the_lag_is_unknown_until_a_frame_and_its_seconds_count_from_the_start():
    """A follower that never reached the log is not "caught up": no lag in bytes (the metric is absent),
    and its lag in seconds grows from its start, so that an alert on the lag fires for it."""
    from mqstore.clock import FakeClock
    from mqstore.metrics import Registry

    clock = FakeClock()
    log = MemoryLog(end=50)
    log.refuse_opens = Unavailable("connection refused")
    follower = Follower("test-follower", log, Recorder(), FAST, clock=clock)
    registry = Registry()
    follower.register_metrics(registry)
    follower.start()
    try:
        wait_until(lambda: len(log.opened) >= 2, "the follower to try the log twice")
        clock.advance(7_000)
        assert follower.lag_bytes() is None and follower.lag_seconds() == 7.0
        assert registry.get("mqstore_follower_lag_bytes").value == {}  # absent from /metrics
        assert registry.get("mqstore_follower_lag_seconds").value == {("test-follower",): 7.0}
        log.refuse_opens = None  # the log comes back: the first frame tells the follower where it ends
        wait_until(lambda: follower.lag_bytes() == 0, "the follower to catch up")
        assert follower.lag_seconds() == 0.0
        assert registry.get("mqstore_follower_lag_bytes").value == {("test-follower",): 0}
    finally:
        assert follower.stop(WAIT_S)
