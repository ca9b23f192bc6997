"""The Transaction service through real gRPC: a commit log and a txn service in this process, on
127.0.0.1 (port 0), real files. Prepare, Commit, Rollback, idempotence, refusals, recovery."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest

from mqstore.format import record
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import common_pb2, txn_pb2
from tests.integration.txn_testing import (MODES, RPC_TIMEOUT_S, commit, commitlog, prepare, rollback, stats,
                                           txn_service, txn_stack, visible, wait_ready)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(params=MODES)
def stack(request, tmp_path):
    """A commit log and the Transaction service, in both deployments (Cluster mode, Local mode)."""
    with txn_stack(tmp_path, request.param, {"orders": 2}) as parts:
        yield parts


@pytest.fixture
def log(stack):
    return stack.log_port, stack.log


@pytest.fixture
def txn(stack):
    return stack.txn


@pytest.fixture
def cluster_log(tmp_path):
    """The commit log alone, for the tests that start (and restart) a Cluster-mode service themselves."""
    with commitlog(tmp_path / "log") as (port, stub):
        stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=2), timeout=RPC_TIMEOUT_S)
        yield port, stub


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_prepare_is_invisible_commit_shows_every_message_once(log, txn):
    _, log_stub = log
    p = prepare(txn, "orders", [b"a", b"b", b"c"], keys=["k1"], tags="t")
    assert len(p.halves) == 3 and p.transaction_id
    assert visible(log_stub, "orders", 2) == []
    done = commit(txn, p.transaction_id)
    assert done.state == txn_pb2.TRANSACTION_STATE_COMMITTED and not done.already and len(done.results) == 3
    seen = visible(log_stub, "orders", 2)
    assert sorted(m.body for m in seen) == [b"a", b"b", b"c"]
    for m, half in zip(sorted(seen, key=lambda m: m.prepared_transaction_offset), p.halves, strict=True):
        assert m.prepared_transaction_offset == half.physical_offset and m.queue_id == half.real_queue_id
        assert m.sys_flag & record.SYSFLAG_TX_MASK == record.SYSFLAG_TX_COMMIT and m.tags == "t"
        assert m.uniq_key == half.uniq_key and "REAL_TOPIC" not in m.properties
        assert m.properties["__transactionId__"] == p.transaction_id and m.properties["PGROUP"] == "pg"
    again = commit(txn, p.transaction_id)
    assert again.state == txn_pb2.TRANSACTION_STATE_COMMITTED and again.already
    assert len(visible(log_stub, "orders", 2)) == 3  # never twice
    code, details = code_of(lambda: rollback(txn, p.transaction_id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "COMMITTED" in details


def test_rollback_waits_for_its_op_and_nothing_becomes_visible(log, txn):
    _, log_stub = log
    p = prepare(txn, "orders", [b"x"])
    done = rollback(txn, p.transaction_id)
    assert done.state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK and not done.already
    # acknowledged only once its OP record is durable: the follower reading it back may release the answer before
    # the OP writer's append returns and counts it, so the counter is read until it shows the write
    wait_until(lambda: stats(txn).op_entries_written >= 1, "the Rollback's OP record counted", 10)
    assert rollback(txn, p.transaction_id).already
    code, details = code_of(lambda: commit(txn, p.transaction_id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ROLLED_BACK" in details
    assert visible(log_stub, "orders", 2) == []


def test_bad_input_gets_the_right_status(log, txn):
    _, log_stub = log
    log_stub.CreateTopic(cpb.CreateTopicRequest(name="kv", kind=common_pb2.TOPIC_KIND_COMPACTION),
                         timeout=RPC_TIMEOUT_S)
    cases = [
        (lambda: commit(txn, "nope"), grpc.StatusCode.NOT_FOUND, "unknown"),
        (lambda: rollback(txn, ""), grpc.StatusCode.INVALID_ARGUMENT, "transaction_id"),
        (lambda: prepare(txn, "missing", [b"x"]), grpc.StatusCode.NOT_FOUND, "missing"),
        (lambda: prepare(txn, "kv", [b"x"], keys=["k"]), grpc.StatusCode.INVALID_ARGUMENT, "COMPACTION"),
        (lambda: prepare(txn, "RMQ_SYS_TRANS_HALF_TOPIC", [b"x"]), grpc.StatusCode.INVALID_ARGUMENT, "system topic"),
        (lambda: prepare(txn, "orders", [b"x"], properties={"DELAY": "3"}), grpc.StatusCode.INVALID_ARGUMENT,
         "delayed"),
        (lambda: prepare(txn, "orders", [b"x"], properties={"REAL_TOPIC": "y"}), grpc.StatusCode.INVALID_ARGUMENT,
         "set by the Transaction service"),
        (lambda: prepare(txn, "orders", [], group="pg"), grpc.StatusCode.INVALID_ARGUMENT, "1 to 1000"),
        (lambda: prepare(txn, "orders", [b"x"], group=""), grpc.StatusCode.INVALID_ARGUMENT, "group"),
        (lambda: prepare(txn, "orders", [b"x"], txn_id="bad id!"), grpc.StatusCode.INVALID_ARGUMENT, "transaction_id"),
        (lambda: prepare(txn, "orders", [b"x"], queue_id=9), grpc.StatusCode.INVALID_ARGUMENT, "queue_id"),
        (lambda: prepare(txn, "orders", [b""]), grpc.StatusCode.INVALID_ARGUMENT, "body"),
        (lambda: prepare(txn, "orders", [b"x"], properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "soon"}),
         grpc.StatusCode.INVALID_ARGUMENT, "whole seconds in [0, 604800]"),
        (lambda: prepare(txn, "orders", [b"x"], properties={"TRAN_ATTEMPT": "x"}), grpc.StatusCode.INVALID_ARGUMENT,
         "set by the Transaction service"),
    ]
    for call, code, text in cases:
        got, details = code_of(call)
        assert got == code and text in details, (code, text, got, details)
    p = prepare(txn, "orders", [b"x"], txn_id="fixed-1")
    code, details = code_of(lambda: prepare(txn, "orders", [b"y"], txn_id="fixed-1"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "other messages" in details
    again = prepare(txn, "orders", [b"x"], txn_id="fixed-1")  # a retry of the same request: the first answer
    assert again.already and list(again.halves) == list(p.halves) and not p.already
    assert commit(txn, p.transaction_id).state == txn_pb2.TRANSACTION_STATE_COMMITTED  # still serving
    assert stats(txn).open == 0


def test_concurrent_commits_and_rollbacks_of_one_transaction_resolve_it_once(log, txn):
    _, log_stub = log
    ids = [prepare(txn, "orders", [f"m{i}".encode()]).transaction_id for i in range(20)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        def race(txn_id, call):
            try:
                return call(txn, txn_id).state
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
                return None
        futures = [pool.submit(race, t, call) for t in ids for call in (commit, rollback, commit)]
        [f.result() for f in futures]
    committed = {t for t in ids if txn.Show(txn_pb2.ShowRequest(transaction_id=t), timeout=RPC_TIMEOUT_S).state
                 == txn_pb2.TRANSACTION_STATE_COMMITTED}
    bodies = sorted(m.body for m in visible(log_stub, "orders", 2))
    assert bodies == sorted(f"m{ids.index(t)}".encode() for t in committed)


def test_prepares_share_appends_and_ops_batch(stack, txn):
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(lambda i: prepare(txn, "orders", [b"x"]).transaction_id, range(64)))
        list(pool.map(lambda t: commit(txn, t), ids))
    s = wait_until(lambda: (s := stats(txn)).op_pending_entries == 0 and s.op_entries_written == 64 and s,
                   "the OP entries to be written")
    if stack.mode == "cluster":  # in Local mode an append takes no round trip: callers rarely meet to share one
        assert s.appends < 128 + s.op_messages_written  # some appends carried more than one producer's messages
    assert s.appends <= 128 + s.op_messages_written
    assert s.op_messages_written < 64 and s.half_to_op_ratio > 1
    assert s.cache_hits == 64 and s.cache_misses == 0 and s.cache_entries == 0


def test_restart_recovers_open_and_committed_state(cluster_log, tmp_path):
    port, log_stub = cluster_log
    with txn_service(tmp_path / "txn", port) as (_, stub):
        wait_ready(stub)
        open_one = prepare(stub, "orders", [b"open"]).transaction_id
        done = prepare(stub, "orders", [b"done"]).transaction_id
        commit(stub, done)
        before = wait_until(lambda: (s := stats(stub)).op_entries_written == 1 and s, "the OP record")
    with txn_service(tmp_path / "txn", port) as (_, stub):
        s = wait_ready(stub)  # the counters go on from what the checkpoint recorded (they reset to 0 before)
        assert (s.halves_written, s.appends, s.op_entries_written, s.cache_hits) == \
            (before.halves_written, before.appends, before.op_entries_written, before.cache_hits) == (2, 4, 1, 1)
        assert commit(stub, done).already
        assert stats(stub).open == 1 and stats(stub).cache_entries == 0  # the cache is empty after a restart
        assert commit(stub, open_one).state == txn_pb2.TRANSACTION_STATE_COMMITTED  # read from the log (a miss)
        assert stats(stub).cache_misses == 1
    assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [b"done", b"open"]
    with txn_service(tmp_path / "txn-fresh", port) as (_, stub):  # no checkpoint: rebuilt from the log alone
        s = wait_ready(stub)
        assert (s.open, s.committed) == (0, 2)
        assert commit(stub, done).already and commit(stub, open_one).already
