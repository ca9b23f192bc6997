"""Operator tools of the Transaction service: ListOpen (age, checks, last answer), Show, ForceResolve with
its audit trail in SQL (SQLite; PostgreSQL when MQSTORE_TEST_PG_URL is set), Stats, and the ``mqstore txn``
commands as a subprocess against in-process servers on 127.0.0.1."""

from __future__ import annotations

import json
import pathlib
import sqlite3
import subprocess
import sys

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import txn_pb2
from tests.support.waiting import wait_until
from tests.integration.txn_testing import (MODES, RPC_TIMEOUT_S, commitlog, prepare, rollback, stats, txn_service,
                                           txn_stack, visible, wait_ready)
from tests.unit.test_meta_sql import db_url  # noqa: F401 - the sqlite / postgres fixture
from mqstore.meta.txn_audit import AuditTrail

pytestmark = pytest.mark.integration
MQSTORE = pathlib.Path(sys.executable).with_name("mqstore")


@pytest.fixture(params=MODES)
def env(request, tmp_path, db_url):  # noqa: F811
    """Both deployments: the operator tools are the same on a Local-mode port."""
    with txn_stack(tmp_path, request.param, {"orders": 1}, metadata_url=db_url) as stack:
        yield stack.txn, stack.log, stack.txn_port, db_url


def test_list_show_force_resolve_and_the_audit_trail(env):
    stub, log_stub, _, url = env
    a = prepare(stub, "orders", [b"a1", b"a2"], group="g1").transaction_id
    b = prepare(stub, "orders", [b"b"], group="g2").transaction_id
    listed = stub.ListOpen(txn_pb2.ListOpenRequest(), timeout=RPC_TIMEOUT_S).transactions
    assert [t.transaction_id for t in listed] == [a, b] and listed[0].message_count == 2
    assert [t.transaction_id for t in stub.ListOpen(txn_pb2.ListOpenRequest(producer_group="g2"),
                                                    timeout=RPC_TIMEOUT_S).transactions] == [b]
    assert stub.ListOpen(txn_pb2.ListOpenRequest(older_than_ms=3_600_000), timeout=RPC_TIMEOUT_S).transactions == []
    s = stats(stub)
    assert s.open == 2 and s.oldest_open_age_ms >= 0 and s.halves_written == 3
    with pytest.raises(grpc.RpcError) as info:
        stub.ForceResolve(txn_pb2.ForceResolveRequest(transaction_id=a, decision=txn_pb2.DECISION_COMMIT),
                          timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reason" in info.value.details()
    done = stub.ForceResolve(txn_pb2.ForceResolveRequest(transaction_id=a, decision=txn_pb2.DECISION_COMMIT,
                                                         reason="producer lost its state", operator="alice"),
                             timeout=RPC_TIMEOUT_S)
    assert done.state == txn_pb2.TRANSACTION_STATE_COMMITTED and len(done.results) == 2
    assert sorted(m.body for m in visible(log_stub, "orders")) == [b"a1", b"a2"]
    rollback(stub, b)
    with pytest.raises(grpc.RpcError) as info:
        stub.ForceResolve(txn_pb2.ForceResolveRequest(transaction_id=b, decision=txn_pb2.DECISION_COMMIT,
                                                      reason="oops", operator="bob"), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    shown = stub.Show(txn_pb2.ShowRequest(transaction_id=a), timeout=RPC_TIMEOUT_S)
    assert shown.resolved_by == "operator alice: producer lost its state"
    audit = AuditTrail(url)
    try:
        rows = [(e.transaction_id, e.decision, e.previous_state, e.operator, e.outcome) for e in audit.entries()]
    finally:
        audit.close()
    assert rows[0] == (a, "COMMIT", "OPEN", "alice", "done")
    assert rows[1][:4] == (b, "COMMIT", "ROLLED_BACK", "bob") and "FailedPrecondition" in rows[1][4]
    page = stub.ListAudit(txn_pb2.ListAuditRequest(limit=1), timeout=RPC_TIMEOUT_S)  # the same through the API
    assert [(e.transaction_id, e.decision, e.previous_state, e.outcome) for e in page.entries] == \
        [(a, txn_pb2.DECISION_COMMIT, txn_pb2.TRANSACTION_STATE_OPEN, "done")] and page.next_page_token
    rest = stub.ListAudit(txn_pb2.ListAuditRequest(page_token=page.next_page_token), timeout=RPC_TIMEOUT_S)
    assert [e.transaction_id for e in rest.entries] == [b] and rest.next_page_token == ""
    assert rest.entries[0].reason == "oops" and rest.entries[0].operator == "bob"
    only_b = stub.ListAudit(txn_pb2.ListAuditRequest(transaction_id=b), timeout=RPC_TIMEOUT_S)
    assert [e.id for e in only_b.entries] == [rest.entries[0].id]
    with pytest.raises(grpc.RpcError) as info:
        stub.ListAudit(txn_pb2.ListAuditRequest(page_token="not-ours"), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in info.value.details()


def test_an_audit_database_outage_is_unavailable_and_decides_nothing(tmp_path):
    with commitlog(tmp_path / "log") as (port, log_stub):
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_TIMEOUT_S)
        with txn_service(tmp_path / "txn", port, audit_wait_timeout_ms=300) as (_, stub):
            wait_ready(stub)
            txn_id = prepare(stub, "orders", [b"x"]).transaction_id
            request = txn_pb2.ForceResolveRequest(transaction_id=txn_id, decision=txn_pb2.DECISION_ROLLBACK,
                                                  reason="stuck", operator="carol")
            locker = sqlite3.connect(tmp_path / "txn" / "txn-audit.db", isolation_level=None)
            try:
                locker.execute("BEGIN EXCLUSIVE")  # the database stays locked longer than the service waits
                with pytest.raises(grpc.RpcError) as info:
                    stub.ForceResolve(request, timeout=RPC_TIMEOUT_S)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # INTERNAL before
                assert "metadata database" in info.value.details() and "retry" in info.value.details()
                assert stub.Show(txn_pb2.ShowRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S).state == \
                    txn_pb2.TRANSACTION_STATE_OPEN  # nothing decided without its audit entry
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            assert stub.ForceResolve(request, timeout=RPC_TIMEOUT_S).state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK
            entries = stub.ListAudit(txn_pb2.ListAuditRequest(), timeout=RPC_TIMEOUT_S).entries
            assert [(e.operator, e.outcome) for e in entries] == [("carol", "done")]


def run_cli(port: int, *args: str, expect: int = 0) -> str:
    done = subprocess.run([str(MQSTORE), "--txn-address", f"127.0.0.1:{port}", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == expect, f"mqstore {' '.join(args)}: {done.stderr}"
    return done.stdout + done.stderr


def test_the_txn_commands(env):
    stub, log_stub, port, _ = env
    out = run_cli(port, "txn", "begin", "orders", "one", "two", "--group", "pg", "--id", "t-1")
    assert "transaction t-1: OPEN (2 half message(s))" in out
    assert "t-1  OPEN  group=pg" in run_cli(port, "txn", "list")
    assert json.loads(run_cli(port, "--json", "txn", "show", "t-1"))["message_count"] == 2
    assert "COMMITTED" in run_cli(port, "txn", "commit", "t-1")
    assert "COMMITTED (already)" in run_cli(port, "txn", "commit", "t-1")
    assert "transaction t-2: COMMITTED" in run_cli(port, "txn", "send", "orders", "x", "--group", "pg", "--id", "t-2")
    assert "error: ALREADY_EXISTS" in run_cli(port, "txn", "send", "orders", "z", "--group", "pg", "--id", "t-2",
                                             expect=1)
    one_way = run_cli(port, "txn", "send", "orders", "w", "--group", "pg", "--id", "t-4", "--one-way")
    assert "transaction t-4: commit sent one-way" in one_way
    wait_until(lambda: "producer (one-way)" in run_cli(port, "txn", "show", "t-4"), "the one-way commit")
    run_cli(port, "txn", "begin", "orders", "y", "--group", "pg", "--id", "t-3")
    assert "ROLLED_BACK" in run_cli(port, "txn", "resolve", "t-3", "rollback", "--reason", "test")
    assert "error: FAILED_PRECONDITION" in run_cli(port, "txn", "rollback", "t-1", expect=1)
    assert "error: NOT_FOUND" in run_cli(port, "txn", "show", "nope", expect=1)
    assert "op_messages_written" in run_cli(port, "txn", "stats")
    audit = run_cli(port, "txn", "audit")
    assert "t-3  ROLLBACK  was=OPEN" in audit and "outcome=done  reason=test" in audit
    assert json.loads(run_cli(port, "--json", "txn", "audit", "--id", "t-3"))["transaction_id"] == "t-3"
    assert "no audit entries" in run_cli(port, "txn", "audit", "--id", "t-1")
    assert sorted(m.body for m in visible(log_stub, "orders")) == [b"one", b"two", b"w", b"x"]
