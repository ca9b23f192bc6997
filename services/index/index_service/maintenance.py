"""IndexMaintainer: the named background thread that converts sealed files and moves compact files
to the second tier, so the write path never waits for either (RIP-65's "non-stop write")."""

from __future__ import annotations

import threading

import structlog

log = structlog.get_logger("index.maintainer")


class IndexMaintainer:
    """Thread ``index-maintainer``. ``start()``, ``stop(timeout_s)``, ``wakeup()``; ``run_once()``
    does one round in the caller's thread (tests). A failed round is logged, marks the store
    unhealthy with the error, and is retried after ``maintenance_retry_ms``; a good round clears it.
    Thread-safe."""

    def __init__(self, store):
        self.store = store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.round_done = threading.Event()  # set after every round, for tests and shutdown

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="index-maintainer", daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        self.store.work_available.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self.store.work_available.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("index.maintainer_stop_timeout", timeout_s=timeout_s)

    def run_once(self) -> int:
        """Convert every sealed file, then move what is due to the tier; number of files handled."""
        done = 0
        while converted := self.store.convert_sealed(max_files=1):
            done += converted
        while moved := self.store.move_to_tier(max_files=1):
            done += moved
        return done

    def _loop(self) -> None:
        wait_s = 0.0
        while not self._stop.is_set():
            self.store.work_available.wait(wait_s)
            self.store.work_available.clear()
            if self._stop.is_set():
                break
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the top of a background loop: report, retry later
                log.error("index.maintenance_failed", error=str(exc), error_type=type(exc).__name__)
                self.store.set_maintenance_error(f"index maintenance failed: {type(exc).__name__}: {exc}")
                wait_s = self.store.config.maintenance_retry_ms / 1000
            else:
                self.store.set_maintenance_error("")
                wait_s = self.store.config.maintenance_interval_ms / 1000
            self.rounds += 1
            self.round_done.set()
