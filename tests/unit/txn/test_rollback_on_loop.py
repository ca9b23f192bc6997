"""A two-way Rollback on the event loop (mqstore.txn.onloop.LoopCalls.rollback over Coordinator.rollback_async,
issue 37): decided on the loop, answered once another thread marks its OP record written, with no pool
thread involved (the handler pool's only thread is held busy throughout); a Commit refused for that rollback
is answered once it is durable, on the loop too; a waiter given up (cancelled) is forgotten by the table."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition
from mqstore.model import DURABILITY_WRITTEN, AppendResult, MessageIn, TopicRecord
from mqstore.txn.cache import HalfCache
from mqstore.txn.config import TxnConfig
from mqstore.txn.coordinator import Coordinator
from mqstore.txn.onloop import LoopCalls, PortIo
from mqstore.txn.table import ROLLED_BACK, TxnTable
from mqstore.txn.transact import TransactStreams

WAIT_S = 10.0  # bounds every wait; the test takes milliseconds


class Log:
    """The coordinator's appender and log reader: every append lands, offsets counting up."""

    def __init__(self):
        self.next = 0

    def append(self, topic, messages):
        out = []
        for _ in messages:
            out.append(AppendResult(f"id{self.next}", f"u{self.next}", 0, self.next, self.next, 100, 0,
                                    DURABILITY_WRITTEN))
            self.next += 1
        return out

    def topic(self, name):
        return TopicRecord(name, 1, "NORMAL", 0, 0)

    def get_messages_batch(self, offsets):
        raise AssertionError("the halves are cached")


class Ops:
    """The OP queue: what was urged is written by the test (``write``), from a thread of its own."""

    def __init__(self, table: TxnTable):
        self.table, self.entries, self.urged = table, [], threading.Event()

    def add(self, half_queue_offsets):
        self.entries.extend(half_queue_offsets)

    def urge(self):
        self.urged.set()

    def write(self):
        entries, self.entries = self.entries, []
        self.table.mark_op_written(entries)


class InDoubt:
    def add(self, what, settle):
        raise AssertionError(f"nothing is in doubt here: {what}")


@pytest.fixture
def rig(tmp_path):
    table = TxnTable(resolved_keep=100)
    table.set_applied(0, 0)  # caught up with an empty log: ready
    log, ops = Log(), Ops(table)
    coordinator = Coordinator(TxnConfig(data_dir=tmp_path), table, log, log, ops, HalfCache(100, 1 << 20),
                              FakeClock(), InDoubt())
    busy = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        pool.submit(busy.wait, WAIT_S)  # the handler pool's only thread is taken for the whole test
        calls = LoopCalls(coordinator, TransactStreams(coordinator, max_streams=1), lambda: False,
                          PortIo(log.append, pool, overlaps=False))
        yield coordinator, calls, ops, table
        busy.set()


def _prepared(coordinator: Coordinator) -> str:
    return coordinator.prepare("orders", [MessageIn(b"x")], "pg").transaction_id


def _write_ops_once_urged(ops: Ops) -> threading.Thread:
    """The OP writer: once urged, marks the queued entries written from its own thread."""
    def run():
        assert ops.urged.wait(WAIT_S), "the Rollback never urged its OP record"
        ops.write()
    writer = threading.Thread(target=run, name="op-writer", daemon=True)
    writer.start()
    return writer


def test_a_rollback_is_answered_on_the_loop_once_another_thread_marks_its_op_record_written(rig):
    coordinator, calls, ops, table = rig
    txn_id = _prepared(coordinator)
    writer = _write_ops_once_urged(ops)

    async def roll_back():
        loop_thread = threading.current_thread()
        ended = await asyncio.wait_for(calls.rollback(txn_id), WAIT_S)  # the pool's thread is busy: never there
        assert threading.current_thread() is loop_thread
        return ended
    ended = asyncio.run(roll_back())
    writer.join(WAIT_S)
    txn = table.get(txn_id)
    assert ended.state == ROLLED_BACK and not ended.already
    assert txn.op_written  # answered only once durable
    assert table._op_waiters == []


def test_a_rollback_whose_op_record_is_written_already_is_answered_at_once(rig):
    coordinator, calls, ops, table = rig
    txn_id = _prepared(coordinator)
    writer = _write_ops_once_urged(ops)
    asyncio.run(asyncio.wait_for(calls.rollback(txn_id), WAIT_S))
    writer.join(WAIT_S)
    ended = asyncio.run(asyncio.wait_for(calls.rollback(txn_id), WAIT_S))  # a retry: durable already
    assert ended.already and table._op_waiters == []


def test_a_commit_refused_for_a_rollback_is_answered_once_that_is_durable_on_the_loop(rig):
    coordinator, calls, ops, table = rig
    txn_id = _prepared(coordinator)
    coordinator.rollback(txn_id, wait_durable=False)  # decided; its OP record not written yet
    writer = _write_ops_once_urged(ops)

    async def commit():
        with pytest.raises(FailedPrecondition, match="ROLLED_BACK"):
            await asyncio.wait_for(calls.commit(txn_id), WAIT_S)
    asyncio.run(commit())
    writer.join(WAIT_S)
    assert table.get(txn_id).op_written


def test_a_waiter_given_up_is_forgotten_and_a_later_write_wakes_nobody(rig):
    coordinator, calls, ops, table = rig
    txn_id = _prepared(coordinator)

    async def give_up():
        rollback = asyncio.ensure_future(calls.rollback(txn_id))
        for _ in range(100):
            await asyncio.sleep(0)
            if table._op_waiters:
                break
        assert len(table._op_waiters) == 1 and ops.urged.is_set()
        rollback.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rollback
    asyncio.run(give_up())
    assert table._op_waiters == [] and table.get(txn_id).state == ROLLED_BACK  # the decision stays
    ops.write()  # the loop has closed: nothing to wake
    assert table.get(txn_id).op_written
