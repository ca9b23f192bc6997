"""The background-duty base: retry policy, death of a bug, wake and stop (mqstore.background)."""

from __future__ import annotations

import threading

import pytest

from mqstore.background import Backoff, Duty
from mqstore.errors import InvariantViolation, Unavailable

WAIT_S = 5.0


class Scripted(Duty):
    """Runs the next action of a script per step; signals each step through an event."""

    def __init__(self, actions, **kwargs):
        kwargs.setdefault("interval_s", 60.0)  # steps run only when woken, unless a test says otherwise
        kwargs.setdefault("backoff_initial_s", 0.001)
        kwargs.setdefault("backoff_max_s", 0.002)
        super().__init__("test-duty", **kwargs)
        self.actions = list(actions)
        self.ran = threading.Semaphore(0)
        self.stopped_hook = threading.Event()

    def step(self) -> None:
        action = self.actions.pop(0) if self.actions else None
        self.ran.release()
        if action is not None:
            action()

    def on_stop(self) -> None:
        self.stopped_hook.set()


def _raise(exc):
    def action():
        raise exc
    return action


def test_backoff_doubles_to_its_cap_and_resets():
    backoff = Backoff(0.1, 0.35)
    assert [backoff.next_s() for _ in range(4)] == [0.1, 0.2, 0.35, 0.35]
    backoff.reset()
    assert backoff.next_s() == 0.1
    with pytest.raises(ValueError):
        Backoff(0, 1)


def test_store_and_os_errors_are_retried_then_cleared():
    duty = Scripted([_raise(Unavailable("log away")), _raise(OSError(5, "EIO")), None])
    duty.start()
    try:
        for _ in range(3):
            assert duty.ran.acquire(timeout=WAIT_S)
        state = duty.state()
        assert state.retries == 2 and state.alive and duty.problem() == ""
        duty.wake()
        assert duty.ran.acquire(timeout=WAIT_S)
        assert duty.state().last_error == "" and duty.state().steps >= 1
    finally:
        assert duty.stop(WAIT_S)
    assert duty.stopped_hook.is_set() and not duty.state().alive


def test_a_bug_kills_the_duty_and_is_reported_never_retried():
    duty = Scripted([_raise(InvariantViolation("queue offsets went backwards"))])
    died = threading.Event()
    duty.on_died = lambda exc: died.set()
    duty.start()
    assert died.wait(WAIT_S)
    duty._thread.join(WAIT_S)
    state = duty.state()
    assert not state.alive and state.retries == 0
    assert "InvariantViolation: queue offsets went backwards" in duty.problem()
    assert duty.stop(WAIT_S)


def test_retry_on_nothing_makes_every_error_fatal():
    duty = Scripted([_raise(OSError(5, "EIO"))], retry_on=())
    duty.start()
    duty._thread.join(WAIT_S)
    assert "OSError" in duty.problem()


def test_wake_runs_the_next_step_now_and_stop_ends_a_long_pause():
    duty = Scripted([None, None])
    duty.start()
    assert duty.ran.acquire(timeout=WAIT_S)
    duty.wake()
    assert duty.ran.acquire(timeout=WAIT_S)
    assert duty.stop(WAIT_S)  # interval is 60 s: only the stop event ends the pause


def test_a_duty_starts_once_and_a_step_must_be_defined():
    duty = Duty("plain", interval_s=60.0)
    duty.start()
    duty._thread.join(WAIT_S)
    assert "must override Duty.step" in duty.problem()
    with pytest.raises(RuntimeError):
        duty.start()


def test_an_armed_failpoint_is_retried_as_the_io_it_stands_for():
    from mqstore.failpoints import FailpointHit
    duty = Scripted([_raise(FailpointHit("index.rebuild.after_rename")), None])
    duty.start()
    try:
        for _ in range(2):
            assert duty.ran.acquire(timeout=WAIT_S)
        assert duty.state().retries == 1 and duty.problem() == ""
    finally:
        assert duty.stop(WAIT_S)


def test_workers_run_tasks_on_named_threads_with_back_pressure_and_report_a_bug():
    from mqstore.background import Workers
    workers = Workers("test-workers", workers=1, max_queued=1)
    workers.start()
    release, started, names = threading.Event(), threading.Event(), []

    def blocking() -> None:
        names.append(threading.current_thread().name)
        started.set()
        release.wait(WAIT_S)

    try:
        workers.submit(blocking, timeout_s=WAIT_S)
        assert started.wait(WAIT_S) and names == ["test-workers-0"] and workers.busy() == 1
        workers.submit(lambda: None, timeout_s=WAIT_S)  # queued: the queue holds one
        with pytest.raises(Unavailable, match="1 tasks are queued already"):
            workers.submit(lambda: None, timeout_s=0.05)  # full: the caller waits, then is told
        release.set()
        workers.submit(_raise(InvariantViolation("a bug in a task")), timeout_s=WAIT_S)
        done = threading.Event()
        workers.submit(done.set, timeout_s=WAIT_S)  # the worker goes on after the bug
        assert done.wait(WAIT_S) and "InvariantViolation: a bug in a task" in workers.problem()
    finally:
        release.set()
        assert workers.stop(WAIT_S)
    with pytest.raises(Unavailable, match="stopping"):
        workers.submit(lambda: None, timeout_s=WAIT_S)
