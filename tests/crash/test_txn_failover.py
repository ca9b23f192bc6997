"""Two Transaction services, active and standby on one etcd lease (issue 34, item 3), real processes on
127.0.0.1: a commit log, a throwaway etcd, instances A and B with ``--etcd-endpoints``. A producer given
both addresses (mqstore_rpc.endpoints.Failover with UNAVAILABLE retried, as the gateway's ``--txn`` and the
CLI) prepares and commits (even) or rolls back (odd) transactions t0, t1, ... while the active one is
killed with kill -9: the standby takes over, and afterwards every acknowledged Commit's messages are in
the real topic exactly once, every acknowledged Rollback's never, and each transaction has the state of
its acknowledged end on the new active one (none decided twice: nothing else is in the topic)."""

from __future__ import annotations

import subprocess
import sys
import threading

import grpc
import pytest
from gateway_service.txn_client import TxnClient
from mqstore.model import MessageIn

from mqstore_rpc.endpoints import Failover
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, txn_pb2, txn_pb2_grpc
from tests.crash.txn_crash import RPC_S, TOKEN, _ready, _state, _visible, txn_process
from tests.support.ha import etcd_or_skip
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.e2e]
WAIT_S = 120
BEFORE, TOTAL = 10, 40  # transactions acknowledged before the kill, in all
HA = ("--lease-ttl-s", "2")


def _until_answered(producer: Failover, method: str, request, what: str, deadline_s: float = WAIT_S):
    """``producer.call(method, request)`` again while it fails UNAVAILABLE (the active one died, the standby is
    not active yet): the producer's own retry of the same request (Prepare with its id, Commit, Rollback
    are idempotent)."""
    errors: list[str] = []

    def attempt() -> bool:
        try:
            errors.append(("ok", producer.call(method, request, timeout=RPC_S)))
            return True
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            errors.append(exc.code().name)
            return False
    wait_until(attempt, f"{what} answered", deadline_s, poll_s=0.05)
    return errors[-1][1]


def _refusal(stub) -> grpc.RpcError:
    try:
        stub.Prepare(txn_pb2.PrepareRequest(topic="orders", producer_group="pg", messages=[
            common_pb2.MessageInput(body=b"x")]), timeout=RPC_S)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the standby took a Prepare")


def test_the_standby_takes_over_after_kill_9_of_the_active_one_and_no_acknowledged_end_is_lost_or_doubled(
        tmp_path):
    etcd = etcd_or_skip()
    log = commitlog(tmp_path / "log", "--segment-size-bytes", "1MiB", "--preallocate-segments", "false",
                    env={"MQSTORE_INTERNAL_TOKEN": TOKEN})
    instances = {}
    try:
        log.started()
        with grpc.insecure_channel(log.address) as log_channel:
            log_stub = commitlog_pb2_grpc.CommitLogStub(log_channel)
            log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_S)
            for name in ("a", "b"):
                instances[name] = txn_process(tmp_path / name, log.address, "", "--etcd-endpoints", etcd.endpoint,
                                              *HA).started()
            addresses = {proc.address: name for name, proc in instances.items()}
            channels = {address: grpc.insecure_channel(address) for address in addresses}
            stubs = {address: txn_pb2_grpc.TransactionStub(ch) for address, ch in channels.items()}
            try:
                wait_until(lambda: sum(_ready(s) for s in stubs.values()) == 1, "one active Transaction service",
                           WAIT_S)
                active = next(a for a, s in stubs.items() if _ready(s))
                standby = next(a for a in stubs if a != active)
                # the standby refuses (once it has read who is active: naming it), and writes nothing
                wait_until(lambda: active in _refusal(stubs[standby]).details(), "the standby naming the active one",
                           WAIT_S)
                assert _refusal(stubs[standby]).code() == grpc.StatusCode.UNAVAILABLE
                # each holds the log's retention under its own name (one shared name lost the lower position)
                def holds() -> list[str]:
                    listed = log_stub.ListRetentionHolds(cpb.ListRetentionHoldsRequest(), timeout=RPC_S).holds
                    return sorted(h.name for h in listed if h.name.startswith("txn"))

                wait_until(lambda: len(holds()) == 2, "a retention hold for each Transaction service", WAIT_S)
                ids = sorted((tmp_path / name / "instance.id").read_text().strip() for name in instances)
                assert holds() == [f"txn-{i}" for i in ids]
                # Stats says which is which (it answers on a standby too)
                stats = {a: s.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_S) for a, s in stubs.items()}
                assert (stats[active].role, stats[active].active_address) == ("active", active)
                assert (stats[standby].role, stats[standby].active_address) == ("standby", active)
                # an end of a transaction it does not know: UNAVAILABLE too, not NOT_FOUND (it may be in the log)
                with pytest.raises(grpc.RpcError) as refused:
                    stubs[standby].Commit(txn_pb2.EndRequest(transaction_id="nowhere"), timeout=RPC_S)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()

                done: dict[str, str] = {}
                failed: list[BaseException] = []
                with Failover(",".join(sorted(addresses)), grpc.insecure_channel, txn_pb2_grpc.TransactionStub,
                              retried=frozenset({grpc.StatusCode.UNAVAILABLE})) as producer:
                    def work() -> None:
                        try:
                            for i in range(TOTAL):
                                txn_id = f"t{i}"
                                messages = [common_pb2.MessageInput(body=f"{txn_id}-{n}".encode()) for n in range(2)]
                                prepare = txn_pb2.PrepareRequest(topic="orders", messages=messages,
                                                                 producer_group="pg", transaction_id=txn_id)
                                _until_answered(producer, "Prepare", prepare, txn_id)
                                end = "Commit" if i % 2 == 0 else "Rollback"
                                request = txn_pb2.EndRequest(transaction_id=txn_id)
                                _until_answered(producer, end, request, txn_id)
                                done[txn_id] = end.lower()
                        except (grpc.RpcError, AssertionError) as exc:  # reported by the test's thread
                            failed.append(exc)

                    worker = threading.Thread(target=work, name="producer")
                    worker.start()
                    try:
                        wait_until(lambda: len(done) >= BEFORE or failed or not worker.is_alive(),
                                   "transactions before the kill", WAIT_S)
                        instances[addresses[active]].kill9()
                        killed_after = len(done)
                    finally:
                        worker.join(WAIT_S * 2)
                print(f"kill -9 of the active one after {killed_after} of {TOTAL} transactions")
                assert not failed, failed
                assert not worker.is_alive(), "the producer did not finish"
                assert killed_after < TOTAL, "the kill came after the last transaction"
                assert len(done) == TOTAL
                new = stubs[standby]
                assert _ready(new), "the standby did not become the active one"
                expected = {"commit": txn_pb2.TRANSACTION_STATE_COMMITTED,
                            "rollback": txn_pb2.TRANSACTION_STATE_ROLLED_BACK}
                for txn_id, outcome in done.items():
                    assert _state(new, txn_id) == expected[outcome], (txn_id, outcome)
                seen = _visible(log_stub)
                for txn_id, outcome in done.items():
                    for n in range(2):
                        assert seen[f"{txn_id}-{n}".encode()] == (1 if outcome == "commit" else 0), (txn_id, seen)
                assert sum(seen.values()) == 2 * sum(1 for o in done.values() if o == "commit")  # nothing twice
                stats = new.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_S)
                assert (stats.open, stats.role, stats.active_address) == (0, "active", standby)

                # the gateway's client and the CLI, given the dead one first, reach the new active one
                both = f"{active},{standby}"
                gateway_client = TxnClient(both, rpc_timeout_s=RPC_S, stream_deadline_s=60,
                                           max_reconnect_backoff_ms=500)
                try:
                    txn_id, _ = gateway_client.prepare("orders", MessageIn(body=b"gateway-0"), "orders")
                    gateway_client.commit(txn_id, "orders")
                finally:
                    gateway_client.close()
                cli = subprocess.run([sys.executable, "-m", "mqstore_cli", "--txn-address", both, "txn", "send",
                                      "orders", "cli-0", "--group", "pg"], capture_output=True, text=True,
                                     timeout=60)
                assert cli.returncode == 0 and "COMMITTED" in cli.stdout, cli.stdout + cli.stderr
                seen = _visible(log_stub)
                assert (seen[b"gateway-0"], seen[b"cli-0"]) == (1, 1), seen
            finally:
                for channel in channels.values():
                    channel.close()
    finally:
        for proc in instances.values():
            proc.stop()
        log.stop()
        etcd.stop()
