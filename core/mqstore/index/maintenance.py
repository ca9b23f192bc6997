"""IndexMaintainer: the named background thread that converts sealed files and moves compact files
to the second tier, so the write path never waits for either (RIP-65's "non-stop write")."""

from __future__ import annotations

import threading

import structlog
from mqstore.background import Duty
from mqstore.errors import Unavailable

log = structlog.get_logger("index.maintainer")
THREAD_NAME = "index-maintainer"


class IndexMaintainer(Duty):
    """Thread ``index-maintainer`` (a Duty): ``start()``, ``stop(timeout_s)``, ``wake()``; ``run_once()``
    does one round in the caller's thread (tests). A round runs when the store has work
    (``store.work_available``: a file was sealed or rebuilt) or every ``maintenance_interval_ms``. A
    round that fails with a store or OS error is logged, marks the store unhealthy with the error and
    is retried after ``maintenance_retry_ms``; one that fails because the tier did not answer
    (Unavailable) is retried the same way but leaves the store healthy, the error in Stats' last_error
    (as the commit log being away: local files still answer); a good round clears both; a bug kills the thread (the
    service turns NOT_SERVING). ``round_done`` is set after every round, good or failed. Thread-safe."""

    def __init__(self, store):
        retry_s = store.config.maintenance_retry_ms / 1000
        super().__init__(THREAD_NAME, interval_s=store.config.maintenance_interval_ms / 1000,
                         backoff_initial_s=retry_s, backoff_max_s=retry_s)  # a fixed retry interval
        self.store = store
        self.round_done = threading.Event()

    def run_once(self) -> int:
        """Convert every sealed file, then move what is due to the tier; number of files handled."""
        done = 0
        while converted := self.store.convert_sealed(max_files=1):
            done += converted
        while moved := self.store.move_to_tier(max_files=1):
            done += moved
        return done

    def step(self) -> None:
        self.store.work_available.clear()  # before the round: work sealed during it wakes the next one
        try:
            self.run_once()
        except Unavailable as exc:  # the object store away: queries of local files still answer
            if not self.stopping:
                log.warning("index.tier_unavailable", error=str(exc))
                self.store.set_tier_error(f"index files cannot move to the tier: {exc}")
            raise
        except self.retry_on as exc:
            if not self.stopping:
                log.error("index.maintenance_failed", error=str(exc), error_type=type(exc).__name__)
                self.store.set_maintenance_error(f"index maintenance failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.round_done.set()
        self.store.set_maintenance_error("")
        self.store.set_tier_error("")

    def pause(self) -> None:
        """Until the store has work, the interval passes, or the duty is woken or stopped."""
        self.store.work_available.wait(self.interval_s)

    def wake(self) -> None:
        self.store.work_available.set()

    def on_stop(self) -> None:
        self.store.work_available.set()
