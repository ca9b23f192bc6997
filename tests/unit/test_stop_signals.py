"""StopSignals (mqstore_rpc.server): SIGTERM reaches a main thread that waits in it, and its handler takes no
lock. It used to set a threading.Event: run between two bytecodes of a main thread that held that Event's lock
(Event.wait holds it on entry and on waking), the handler waited for itself forever and the service ignored
SIGTERM until it was killed 120 s later (seen twice in full runs)."""

from __future__ import annotations

import os
import signal
import threading

from mqstore_rpc import server
from mqstore_rpc.server import StopSignals


def test_a_sigterm_sent_while_the_main_thread_waits_is_its_answer():
    signals = StopSignals().install()
    try:
        sender = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        sender.start()
        assert signals.wait() == "SIGTERM"
        sender.join(5)
    finally:
        signals.restore()


def test_the_handler_runs_in_the_middle_of_wait_and_wait_still_returns(monkeypatch):
    """A signal handled inside wait() (here: at its first pause) is seen at the next look; with the Event, a
    handler run while wait() held the Event's lock deadlocked."""
    signals = StopSignals()
    real_sleep = server.time.sleep

    def sleep_then_signal(seconds: float) -> None:
        signals._handle(signal.SIGINT, None)
        real_sleep(seconds)

    monkeypatch.setattr(server.time, "sleep", sleep_then_signal)
    answered: list[str] = []
    waiter = threading.Thread(target=lambda: answered.append(signals.wait()), daemon=True)
    waiter.start()
    waiter.join(5)
    assert answered == ["SIGINT"]


def test_a_signal_before_the_wait_is_kept():
    signals = StopSignals()
    signals._handle(signal.SIGTERM, None)  # during a long start
    assert signals.wait() == "SIGTERM"
