"""The checkpoint duty: every ``interval_ms`` (and at stop) it writes what changed since its last save
as a delta record of the checkpoint journal (journal.py, snapshot.py): the transactions the table marked
changed, the applied offset and the Stats counters; nothing at all when none of them moved. The file is
replaced by one full record at the first save after a start and whenever it has grown past
``max(REBASE_MIN_BYTES, REBASE_FACTOR x the last full record)``, and after a failed write.

Thread-safe: a record is taken under the table's lock; saves are serialised by ``_save_lock``.
"""

from __future__ import annotations

import pathlib
import threading
from typing import Callable

import structlog

from mqstore.background import Duty
from mqstore.clock import Clock

from . import snapshot
from .journal import JournalWriter
from .table import TxnTable

log = structlog.get_logger("mqstore.txn.persist")
REBASE_MIN_BYTES = 1 << 20
REBASE_FACTOR = 4


class Checkpointer(Duty):
    def __init__(self, path: pathlib.Path, table: TxnTable, clock: Clock, interval_ms: int):
        super().__init__("txn-checkpointer", interval_s=interval_ms / 1000)
        self.path, self.table, self.clock = path, table, clock
        self.counters: Callable[[], dict] = dict
        self._save_lock = threading.Lock()
        self._writer = JournalWriter(path)
        self._full_bytes = 0
        self._need_full = True
        self._saved: tuple[int | None, dict] = (None, {})
        self.saved_applied: int | None = None
        self.deltas = self.fulls = 0

    def load(self) -> dict:
        """Fill the table from the file; the counters it recorded ({} without a file)."""
        counters = snapshot.load(self.path, self.table)
        if counters is None:
            return {}
        self.saved_applied = self.table.applied
        log.info("txn.checkpoint_loaded", applied_physical_offset=self.table.applied,
                 transactions=len(self.table.by_id))
        return counters

    def step(self) -> None:
        self.save_now()

    def save_now(self) -> None:
        with self._save_lock:
            try:
                self._save()
            except BaseException:
                self._need_full = True  # the changes taken for this record are in no record: write all next
                raise

    def close(self) -> None:
        self.save_now()
        self._writer.close()

    def _save(self) -> None:
        counters = self.counters()
        now = self.clock.now_ms()
        with self.table.lock:
            applied = self.table.applied
            if applied is None:
                return  # nothing applied yet: no checkpoint (restart from the earliest record)
            changed = self.table.take_dirty()
            full = self._need_full or self._writer.size > max(REBASE_MIN_BYTES, REBASE_FACTOR * self._full_bytes)
            txns = snapshot.kept(self.table) if full else changed
            entries = [e for e in map(snapshot.entry, txns) if e is not None]
        if not full and not entries and (applied, counters) == self._saved:
            return
        payload = snapshot.encode("full" if full else "delta", entries, applied, counters, now)
        if full:
            self._writer.rewrite(payload)
            self._full_bytes, self._need_full = len(payload), False
            self.fulls += 1
        else:
            self._writer.append(payload)
            self.deltas += 1
        self._saved, self.saved_applied = (applied, counters), applied
