"""Local mode of the Transaction service (mqstore.v1.Transaction served by the commit log process,
--txn-port) over real gRPC on 127.0.0.1: what differs from Cluster mode only in where it runs. Its state
survives a restart of the process (checkpoint journal in --txn-data-dir, the rest read back from the log);
a replica's Transaction port takes no write (the store's NotLeader, FAILED_PRECONDITION as every write on a
replica); its RPCs are counted in the commit log's metrics. The protocol is checked in both modes by the
other test_txn_* suites (their ``stack`` fixture); a kill -9 by tests/crash/test_txn_local_crash.py."""

from __future__ import annotations

import pathlib

import grpc
import pytest

from commitlog_service.main import CommitLogConfig, serving
from mqstore.config import StoreConfig
from mqstore.replication.config import ReplicationConfig
from mqstore_launcher.node import LocalMode
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, txn_pb2, txn_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.integration.txn_testing import (RPC_TIMEOUT_S, commit, commitlog_with_txn, local_txn_config, prepare,
                                           rollback, stats, visible, wait_ready)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def test_a_restart_of_the_commit_log_recovers_open_and_committed_transactions(tmp_path):
    with commitlog_with_txn(tmp_path / "log", tmp_path / "txn") as (_, _, txn_port, log_stub):
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=2), timeout=RPC_TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{txn_port}") as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_ready(stub)
            open_one = prepare(stub, "orders", [b"open"]).transaction_id
            done = prepare(stub, "orders", [b"done"]).transaction_id
            commit(stub, done)
            wait_until(lambda: stats(stub).op_entries_written == 1, "the OP record")
    assert (tmp_path / "txn" / "state.journal").exists()  # --txn-data-dir, not the log's directory
    with commitlog_with_txn(tmp_path / "log", tmp_path / "txn") as (_, _, txn_port, log_stub):
        with grpc.insecure_channel(f"127.0.0.1:{txn_port}") as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            s = wait_ready(stub)
            assert (s.open, s.committed, s.halves_written) == (1, 1, 2)
            assert commit(stub, done).already
            assert commit(stub, open_one).state == txn_pb2.TRANSACTION_STATE_COMMITTED  # its half read from the log
        assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [b"done", b"open"]


def node_config(root: pathlib.Path, node_id: str, replica_of: str = "") -> CommitLogConfig:
    store = StoreConfig(data_dir=root / node_id, segment_size_bytes=64 * 1024, preallocate_segments=False,
                        metadata_url=f"sqlite:///{root / 'metadata.db'}")
    return CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=0.5),
                           hosted=(LocalMode(txn=local_txn_config(root / node_id / "txn")),),
                           replication=ReplicationConfig(node_id=node_id, replica_of=replica_of,
                                                         replication_heartbeat_ms=50))


def log_end(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return commitlog_pb2_grpc.CommitLogStub(channel).GetStoreInfo(
            cpb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).max_physical_offset


def test_a_replicas_transaction_port_refuses_writes_and_follows_the_leaders_transactions(tmp_path):
    with serving(node_config(tmp_path, "a")) as (leader, leader_port):
        with grpc.insecure_channel(f"127.0.0.1:{leader_port}") as channel:
            commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
                cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{leader.extra_ports['txn']}") as channel:
            leader_stub = txn_pb2_grpc.TransactionStub(channel)
            wait_ready(leader_stub)
            open_one = prepare(leader_stub, "orders", [b"open"], txn_id="t-open").transaction_id
        with serving(node_config(tmp_path, "b", replica_of=f"127.0.0.1:{leader_port}")) as (replica, replica_port):
            wait_until(lambda: log_end(replica_port) == log_end(leader_port), "the replica to catch up")
            before = log_end(leader_port)
            with grpc.insecure_channel(f"127.0.0.1:{replica.extra_ports['txn']}") as channel:
                stub = txn_pb2_grpc.TransactionStub(channel)
                # its table follows the replicated log: the leader's open transaction is known here
                wait_until(lambda: not stats(stub).recovering and stats(stub).open == 1, "the replica's table")
                # a Rollback too: it writes nothing at once (its OP record later), so only the gate stops a
                # replica from deciding what its log never records
                for call in (lambda: prepare(stub, "orders", [b"x"]), lambda: commit(stub, open_one),
                             lambda: rollback(stub, open_one)):
                    with pytest.raises(grpc.RpcError) as refused:
                        call()
                    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
                    assert "leader" in refused.value.details().lower()
                shown = stub.Show(txn_pb2.ShowRequest(transaction_id=open_one), timeout=RPC_TIMEOUT_S)
                assert shown.state == txn_pb2.TRANSACTION_STATE_OPEN
            assert log_end(leader_port) == before and log_end(replica_port) == before  # nothing written anywhere


def test_the_transaction_rpcs_are_counted_in_the_commit_logs_metrics(tmp_path):
    with commitlog_with_txn(tmp_path / "log", tmp_path / "txn") as (server, _, txn_port, _):
        with grpc.insecure_channel(f"127.0.0.1:{txn_port}") as channel:
            wait_ready(txn_pb2_grpc.TransactionStub(channel))
        handled = next(f for f in server.registry.collect() if f.name == "grpc_server_handled_total")
        counted = {labels: value for labels, value in handled.samples}
        assert counted.get(("unary", "mqstore.v1.Transaction", "Stats", "OK"), 0) >= 1, counted
