"""The commit log process hosting the Transaction service (Local mode, --txn-port) killed: by an armed
failpoint (os._exit(137), as kill -9) at each step of a transaction, and by a real kill -9 with
transactions left prepared. The log and the service die together; after the restart on the same
directories every acknowledged commit is visible exactly once, nothing rolled back is, and every prepared
transaction is settled (by the producer's retry, or by check-back for those nobody ends)."""

from __future__ import annotations

import threading

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, txn_pb2, txn_pb2_grpc
from tests.crash.test_txn_transact_crash import _answer_commit
from tests.crash.txn_crash import RPC_S, _ready, _state, _visible, crash_local_at, local_process, started_local
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]
CHECK_FLAGS = ["--txn-transaction-timeout-ms", "300", "--txn-check-scan-interval-ms", "50",
               "--txn-check-interval-ms", "500"]
STEPS = ["txn.prepare.after_half", "txn.commit.before_real", "txn.commit.after_real"]


@pytest.mark.parametrize("via", ["unary", "stream"])
@pytest.mark.parametrize("name", STEPS)
def test_a_crash_of_the_hosting_commit_log_mid_transaction_is_completed_once(name, via, tmp_path):
    crash_local_at(name, tmp_path, via)


def _prepare(stub, txn_id: str) -> None:
    stub.Prepare(txn_pb2.PrepareRequest(topic="orders", messages=[common_pb2.MessageInput(body=txn_id.encode())],
                                        producer_group="pg", transaction_id=txn_id), timeout=RPC_S)


def test_kill9_loses_no_acknowledged_commit_and_check_back_settles_the_prepared(tmp_path):
    with local_process(tmp_path / "log") as first:
        txn_address = started_local(first)
        with grpc.insecure_channel(first.address) as log_channel, grpc.insecure_channel(txn_address) as channel:
            commitlog_pb2_grpc.CommitLogStub(log_channel).CreateTopic(
                cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_S)
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_until(lambda: _ready(stub), "the first process")
            committed = []
            for i in range(10):
                _prepare(stub, f"c{i}")
                stub.Commit(txn_pb2.EndRequest(transaction_id=f"c{i}"), timeout=RPC_S)
                committed.append(f"c{i}")  # acknowledged
            prepared = [f"p{i}" for i in range(5)]
            for txn_id in prepared:
                _prepare(stub, txn_id)  # acknowledged, never ended by the producer
            first.kill9()  # at once: OP records and the checkpoint may not be written yet
    with local_process(tmp_path / "log", "", *CHECK_FLAGS) as second:
        txn_address = started_local(second)
        with grpc.insecure_channel(second.address) as log_channel, grpc.insecure_channel(txn_address) as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            log_stub = commitlog_pb2_grpc.CommitLogStub(log_channel)
            wait_until(lambda: _ready(stub), "the second process")
            for txn_id in committed:
                assert _state(stub, txn_id) == txn_pb2.TRANSACTION_STATE_COMMITTED, txn_id
            stop, checked = threading.Event(), []
            producer = threading.Thread(target=_answer_commit, args=(stub, stop, checked), daemon=True)
            producer.start()
            try:
                wait_until(lambda: all(_state(stub, t) == txn_pb2.TRANSACTION_STATE_COMMITTED for t in prepared),
                           "check-back to settle every prepared transaction")
            finally:
                stop.set()
                producer.join(10)
            assert set(prepared) <= set(checked) and not set(committed) & set(checked)  # only the open ones checked
            assert _visible(log_stub) == {t.encode(): 1 for t in [*committed, *prepared]}  # each once, nothing else
            wait_until(lambda: stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_S).op_pending_entries == 0,
                       "the OP records")
            assert stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_S).open == 0
