"""The Transaction service's process (Cluster mode) stops cleanly after transactions: SIGTERM leaves no
asyncio task pending (the AppendBatches stream's reader, the grpc.aio call under it), so no "Task was
destroyed but it is pending!" or "exception was never retrieved" line reaches its output (issue 38, item 3)."""

from __future__ import annotations

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, txn_pb2, txn_pb2_grpc
from tests.integration.txn_testing import RPC_TIMEOUT_S, TOKEN, commit, prepare, rollback, wait_ready
from tests.support import processes

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
ASYNCIO_LEFTOVERS = ("Task was destroyed", "never retrieved", "Task exception was never")


def test_a_stopped_txn_service_leaves_no_pending_task(tmp_path):
    env = {"MQSTORE_INTERNAL_TOKEN": TOKEN}
    with processes.commitlog(tmp_path / "log", env=env).started() as log:
        with grpc.insecure_channel(log.address) as channel:
            commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
                cpb.CreateTopicRequest(name="orders", queue_count=2), timeout=RPC_TIMEOUT_S)
        txn = processes.ServiceProcess("txn_service.main", [
            "--data-dir", str(tmp_path / "txn"), "--port", "0", "--grace-s", "1", "--commitlog", log.address], env)
        with txn.started().serving():
            with grpc.insecure_channel(txn.address) as channel:
                stub = txn_pb2_grpc.TransactionStub(channel)
                wait_ready(stub)
                for n in range(3):
                    end = commit if n % 2 == 0 else rollback
                    done = end(stub, prepare(stub, "orders", [b"a%d" % n, b"b%d" % n]).transaction_id)
                    assert done.state in (txn_pb2.TRANSACTION_STATE_COMMITTED, txn_pb2.TRANSACTION_STATE_ROLLED_BACK)
            assert txn.stop() == 0
        output = txn.stderr() + txn.stdout
        assert txn.wait_for("server.stopped")
        assert [line for line in output.splitlines() if any(s in line for s in ASYNCIO_LEFTOVERS)] == [], output
