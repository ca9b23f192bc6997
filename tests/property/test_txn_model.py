"""The transaction state machine against a model (Hypothesis stateful), on the real domain objects
(coordinator, table, cache, appender) over a real MessageStore in this process, with restarts.

Rules: prepare; commit, rollback and check-back answers, alone or racing on threads (many producers
on one transaction); OP batches written; a restart that loses everything in memory (a crash: pending
OP entries too), from the last checkpoint or none, followed by catching up with the log. After every
step: each transaction the model calls COMMITTED has each message visible exactly once, nothing else
is visible, and the service's state agrees with the model (an OPEN one may have been resolved only by
a call whose answer the model saw)."""

from __future__ import annotations

import collections
import shutil
import tempfile
import threading
import pathlib

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqstore import transactions as tx
from mqstore.clock import FakeClock
from mqstore.config import StoreConfig
from mqstore.errors import FailedPrecondition
from mqstore.format.record import SYSFLAG_TX_COMMIT
from mqstore.model import MessageIn, TailFrame
from mqstore.store import MessageStore
from mqstore.txn import snapshot
from mqstore.txn.appender import AppendBatcher
from mqstore.txn.cache import HalfCache
from mqstore.txn.config import TxnConfig
from mqstore.txn.coordinator import Coordinator
from mqstore.txn.table import COMMITTED, OPEN, TxnTable

TOPIC = "orders"
FOLLOWED = frozenset(t.encode() for t in (tx.HALF_TOPIC, tx.OP_TOPIC, tx.CHECK_MAX_TOPIC))


class SyncOps:
    """The OP queue, written on demand: ``flush`` writes what is pending; Rollback's wait writes at once."""

    def __init__(self, append, on_written):
        self.append, self.on_written = append, on_written
        self.pending: list[int] = []
        self.written = 0
        self.lock = threading.Lock()

    def add(self, offsets) -> int:
        with self.lock:
            self.pending += offsets
            return self.written + len(self.pending)

    def wait_written(self, seq: int, timeout_s: float) -> None:
        self.flush()

    def flush(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, []
            if batch:
                self.append(tx.OP_TOPIC, [MessageIn("".join(f"{o}," for o in batch).encode(), tx.OP_TAG, queue_id=0)])
                self.written += len(batch)
        if batch:
            self.on_written(batch)


class TxnMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="txn-model-"))
        self.clock = FakeClock()
        self.store = MessageStore(StoreConfig(data_dir=self.dir / "log", segment_size_bytes=1 << 20,
                                              preallocate_segments=False, warm_ahead_bytes=0), self.clock)
        self.store.start()
        self.store.create_topic(TOPIC, 2)
        self.model: dict[str, str] = {}
        self.bodies: dict[str, list[bytes]] = {}
        self.count = 0
        self._open_service(load=False)

    # ---- the service, rebuilt at each restart -------------------------------------------------------------
    def _open_service(self, load: bool) -> None:
        config = TxnConfig(data_dir=self.dir / "txn", cache_max_entries=4)
        self.table = TxnTable(config.resolved_keep)
        if load:
            snapshot.load(self.dir / "state.json", self.table)
        self.appender = AppendBatcher(lambda topic, messages: list(self.store.append(topic, messages,
                                                                                    system_writer="txn")),
                                      max_messages=1000, max_bytes=4 << 20, timeout_s=10)
        self.ops = SyncOps(self.appender.append, self.table.mark_op_written)
        self.coordinator = Coordinator(config, self.table, self, self.appender, self.ops,
                                       HalfCache(config.cache_max_entries, config.cache_max_bytes), self.clock)
        self._catch_up()
        assert self.table.ready

    def topic(self, name):  # the coordinator's LogReader, on the store
        return self.store.topic(name)

    def get_messages_batch(self, offsets):
        return self.store.get_messages(offsets)

    def _catch_up(self) -> None:
        pos = self.table.applied if self.table.applied is not None else self.store.commitlog.min_offset
        while True:
            visible = self.store.visible_offset()
            if pos >= visible:
                self.table.apply(TailFrame(b"", 0, pos, visible))  # a heartbeat: ready once at the end
                return
            data, count, pos = self.store.commitlog.frame(pos, visible, 1 << 20, FOLLOWED,
                                                          frozenset({SYSFLAG_TX_COMMIT}))
            self.table.apply(TailFrame(data, count, pos, visible))

    def teardown(self):
        self.appender.close()
        self.store.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- rules ---------------------------------------------------------------------------------------------
    @rule(size=st.integers(1, 3))
    def prepare(self, size):
        txn_id = f"t{self.count}"
        self.count += 1
        bodies = [f"{txn_id}-{i}".encode() for i in range(size)]
        self.coordinator.prepare(TOPIC, [MessageIn(b) for b in bodies], "pg", txn_id)
        self.model[txn_id], self.bodies[txn_id] = OPEN, bodies

    @precondition(lambda self: self.model)
    @rule(data=st.data(), calls=st.lists(st.sampled_from(["commit", "rollback", "check-commit", "check-rollback"]),
                                         min_size=1, max_size=4))
    def race(self, data, calls):
        txn_id = data.draw(st.sampled_from(sorted(self.model)))
        results: list[tuple[str, object]] = []

        def call(kind: str) -> None:
            by = "check-back" if kind.startswith("check") else "producer"
            method = self.coordinator.commit if kind.endswith("commit") else self.coordinator.rollback
            try:
                results.append((kind, method(txn_id, by=by).state))
            except FailedPrecondition as exc:
                results.append((kind, exc))

        threads = [threading.Thread(target=call, args=(kind,)) for kind in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        states = {r for _, r in results if isinstance(r, str)}
        assert len(states) <= 1, results  # every successful call agrees: one decision wins
        final = states.pop() if states else self.model[txn_id]  # all refused: it was resolved before
        assert self.model[txn_id] in (OPEN, final), (self.model[txn_id], results)
        for _kind, r in results:  # a call that lost the race was refused, naming the state
            assert r == final or (isinstance(r, FailedPrecondition) and final in str(r)), results
        self.model[txn_id] = final

    @rule()
    def write_ops(self):
        self.ops.flush()

    @rule(checkpoint=st.booleans())
    def crash_and_restart(self, checkpoint):
        if checkpoint and self.table.applied is not None:
            snapshot.save(self.dir / "state.json", self.table, self.clock.now_ms())
        elif not checkpoint:
            (self.dir / "state.json").unlink(missing_ok=True)
        self.appender.close()  # pending OP entries and the cache are lost with the process
        self._open_service(load=checkpoint)

    # ---- invariants ----------------------------------------------------------------------------------------
    @invariant()
    def visible_exactly_once_and_states_agree(self):
        seen = collections.Counter()
        for queue_id in range(2):
            seen.update(m.record.body for m in self.store.pull(TOPIC, queue_id, 0, max_messages=10_000).messages)
        expected = collections.Counter(b for t, s in self.model.items() if s == COMMITTED for b in self.bodies[t])
        assert seen == expected
        for txn_id, state in self.model.items():
            assert self.table.get(txn_id).state == state, (txn_id, state)


TxnMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=25, deadline=None)
test_txn_state_machine = TxnMachine.TestCase
