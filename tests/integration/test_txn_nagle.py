"""Nagle-style OP batching through the real Transaction service (Cluster mode: its own gRPC server talking
to a commit log over gRPC, real files): with op_batch_interval_ms at 10 s, a lone Rollback (unary, or a
two-way Transact frame) is answered as soon as its OP record is durable, well under the interval; a
Commit's OP entry, which nobody waits for, still waits, and rides along with the next OP message (issue 37:
a lone Rollback took 3,006 ms)."""

from __future__ import annotations

import time

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import txn_pb2
from tests.integration.txn_testing import Frames, commit, prepare, rollback, stats, txn_stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

INTERVAL_MS = 10_000
PROMPT_S = 1.5  # "well under the interval" on a loaded 2-core machine; today's code takes the 10 s
# The batcher counts its write when the append returns, but the service's follower may read the OP record from
# the log first and release the answer: the counters are read until they settle, well within the interval.
SETTLE_S = 5.0


def settled(txn, done):
    """The stats once ``done(stats)`` holds (the OP writer's counters catch up with an answer already sent)."""
    def read():
        now = stats(txn)
        return now if done(now) else None
    return wait_until(read, "the OP counters to settle", SETTLE_S)


@pytest.fixture(scope="module")
def txn(tmp_path_factory):
    with txn_stack(tmp_path_factory.mktemp("nagle"), "cluster", {"orders": 1},
                   op_batch_interval_ms=INTERVAL_MS) as stack:
        yield stack.txn


def timed(call):
    start = time.monotonic()
    out = call()
    return out, time.monotonic() - start


def test_a_lone_rollback_is_answered_once_its_op_record_is_durable_not_after_the_interval(txn):
    before = stats(txn)
    for _ in range(3):
        txn_id = prepare(txn, "orders", [b"x"]).transaction_id
        done, took_s = timed(lambda: rollback(txn, txn_id))  # noqa: B023 - called at once
        assert done.state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK and not done.already
        assert took_s < PROMPT_S, f"a lone Rollback took {took_s:.2f} s (op_batch_interval_ms {INTERVAL_MS})"
    after = settled(txn, lambda now: now.op_pending_entries == 0)
    assert after.op_flush_by_waiter - before.op_flush_by_waiter == 3
    assert after.op_flush_by_time == before.op_flush_by_time and after.op_pending_entries == 0


def test_a_two_way_rollback_frame_is_answered_as_promptly(txn):
    frames = Frames(txn)
    try:
        txn_id = frames.prepare("orders", [b"y"]).prepared.transaction_id
        answer, took_s = timed(lambda: frames.ask(rollback=txn_pb2.EndRequest(transaction_id=txn_id)))
        assert answer.ended.state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK
        assert took_s < PROMPT_S, f"a Rollback frame took {took_s:.2f} s"
    finally:
        frames.close()


def test_a_commits_op_entry_waits_and_rides_along_with_the_next_rollbacks_op_message(txn):
    committed = prepare(txn, "orders", [b"c"]).transaction_id
    assert commit(txn, committed).state == txn_pb2.TRANSACTION_STATE_COMMITTED
    before = stats(txn)
    assert before.op_pending_entries == 1  # nobody waits for a Commit's OP entry: no OP message for it alone
    txn_id = prepare(txn, "orders", [b"r"]).transaction_id
    _, took_s = timed(lambda: rollback(txn, txn_id))
    assert took_s < PROMPT_S, f"a Rollback took {took_s:.2f} s"
    after = settled(txn, lambda now: now.op_pending_entries == 0)
    assert after.op_messages_written - before.op_messages_written == 1  # the Commit's entry rode along
    assert after.op_entries_written - before.op_entries_written == 2 and after.op_pending_entries == 0
    with pytest.raises(grpc.RpcError) as refused:  # and the rollback holds
        commit(txn, txn_id)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
