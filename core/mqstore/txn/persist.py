"""The checkpoint duty: saves the table's snapshot (snapshot.py) every ``interval_ms`` and at stop.
Thread-safe: the snapshot is taken under the table's lock; saves are serialised by ``_lock``."""

from __future__ import annotations

import pathlib
import threading

import structlog

from mqstore.background import Duty
from mqstore.clock import Clock

from . import snapshot
from .table import TxnTable

log = structlog.get_logger("mqstore.txn.persist")


class Checkpointer(Duty):
    def __init__(self, path: pathlib.Path, table: TxnTable, clock: Clock, interval_ms: int):
        super().__init__("txn-checkpointer", interval_s=interval_ms / 1000)
        self.path, self.table, self.clock = path, table, clock
        self._save_lock = threading.Lock()
        self.saved_applied: int | None = None

    def load(self) -> None:
        if snapshot.load(self.path, self.table):
            self.saved_applied = self.table.applied
            log.info("txn.checkpoint_loaded", applied_physical_offset=self.table.applied,
                     transactions=len(self.table.by_id))

    def step(self) -> None:
        self.save_now()

    def save_now(self) -> None:
        if self.table.applied is None:
            return  # nothing applied yet: no checkpoint (restart from the earliest record)
        with self._save_lock:
            snapshot.save(self.path, self.table, self.clock.now_ms())
            self.saved_applied = self.table.applied
