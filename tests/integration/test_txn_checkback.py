"""Check-back through the real bidi stream: a producer that answers COMMIT, one that answers UNKNOWN
until the transaction is parked, one that disconnects (not counted as checked), one whose clock is hours
off (decisions use store time), and streams that send garbage. The txn service runs on a FakeClock set
to the real time, so the test moves time past the timeouts without sleeping."""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import grpc
import pytest

from mqstore.clock import FakeClock
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc
from tests.integration.txn_testing import MODES, RPC_TIMEOUT_S, prepare, stats, txn_stack, visible
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
TIMEOUT_MS, INTERVAL_MS = 6000, 30_000


class Producer:
    """One CheckBack stream: answers each check with ``decide(check)``; records the checks it got."""

    def __init__(self, stub, group: str, decide):
        self.outbox: queue.Queue = queue.Queue()
        self.checks: queue.Queue = queue.Queue()
        self.outbox.put(txn_pb2.CheckBackMessage(hello=txn_pb2.CheckBackHello(producer_group=group)))
        self.call = stub.CheckBack(iter(self.outbox.get, None), timeout=60)
        self.decide = decide
        self.error: list[grpc.RpcError] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for check in self.call:
                self.checks.put(check)
                if (decision := self.decide(check)) is not None:
                    self.outbox.put(txn_pb2.CheckBackMessage(answer=txn_pb2.CheckAnswer(check_id=check.check_id,
                                                                                       decision=decision)))
        except grpc.RpcError as exc:
            self.error.append(exc)

    def next_check(self, timeout_s: float = 10) -> txn_pb2.CheckRequest:
        return self.checks.get(timeout=timeout_s)

    def close(self):
        self.outbox.put(None)
        self.call.cancel()
        self._thread.join(10)


@contextlib.contextmanager
def services(tmp_path, mode: str = "cluster", **overrides):
    """The commit log and the Transaction service in ``mode`` (MODES), the service on a FakeClock (the
    commit log's store times stay real)."""
    clock = FakeClock(time.time_ns() // 1_000_000)
    with txn_stack(tmp_path, mode, {"orders": 1}, **{"check_max": 3, **overrides}, clock=clock) as stack:
        channel = grpc.insecure_channel(f"127.0.0.1:{stack.txn_port}")
        try:
            yield txn_pb2_grpc.TransactionStub(channel), stack.log, clock, channel
        finally:
            channel.close()


@pytest.fixture(params=MODES)
def env(request, tmp_path):
    with services(tmp_path, request.param) as parts:
        yield parts


def show(stub, txn_id):
    return stub.Show(txn_pb2.ShowRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S)


def to_store_time(stub, clock, txn_id) -> None:
    """Move the service's clock to the half's store time (the commit log's real clock ran on meanwhile)."""
    clock.advance(max(0, show(stub, txn_id).store_timestamp_ms - clock.now_ms()))


def test_a_commit_answer_commits_and_store_time_not_the_producers_clock_decides(env):
    stub, log_stub, clock, _ = env
    hours_ago = time.time_ns() // 1_000_000 - 5 * 3600 * 1000  # the producer's clock is 5 h behind
    p = prepare(stub, "orders", [b"late"], born_timestamp_ms=hours_ago)
    producer = Producer(stub, "pg", lambda check: txn_pb2.DECISION_COMMIT)
    try:
        wait_until(lambda: stats(stub).open_streams == 1, "the stream to open")
        to_store_time(stub, clock, p.transaction_id)
        clock.advance(TIMEOUT_MS - 1000)  # by store time the half is 5 s old: no check yet
        with pytest.raises(queue.Empty):
            producer.next_check(0.3)
        clock.advance(2000)
        check = producer.next_check()
        assert check.transaction_id == p.transaction_id and check.check_times == 1 and check.age_ms >= TIMEOUT_MS
        assert check.halves[0].body == b"late" and check.halves[0].properties["REAL_TOPIC"] == "orders"
        wait_until(lambda: show(stub, p.transaction_id).state == txn_pb2.TRANSACTION_STATE_COMMITTED, "the commit")
        assert [m.body for m in visible(log_stub, "orders")] == [b"late"]
        # The follower may see the COMMIT record before the coordinator records who decided ("recovery" until then).
        wait_until(lambda: show(stub, p.transaction_id).resolved_by == "check-back", "the decider recorded")
    finally:
        producer.close()


def test_unknown_answers_are_checked_again_then_parked(env):
    stub, log_stub, clock, _ = env
    p = prepare(stub, "orders", [b"undecided"])
    producer = Producer(stub, "pg", lambda check: txn_pb2.DECISION_UNKNOWN)
    try:
        wait_until(lambda: stats(stub).open_streams == 1, "the stream to open")
        to_store_time(stub, clock, p.transaction_id)
        clock.advance(TIMEOUT_MS)
        for n in (1, 2, 3):
            assert producer.next_check().check_times == n
            wait_until(lambda: show(stub, p.transaction_id).last_answer == txn_pb2.DECISION_UNKNOWN, "the answer")
            clock.advance(INTERVAL_MS)
        wait_until(lambda: show(stub, p.transaction_id).state == txn_pb2.TRANSACTION_STATE_PARKED, "parking")
        info = show(stub, p.transaction_id)
        assert info.checks_sent == 3 and "check_max" in info.resolved_by
        parked = visible(log_stub, "TRANS_CHECK_MAX_TIME_TOPIC")
        assert [m.body for m in parked] == [b"undecided"] and parked[0].properties["TRANSACTION_CHECK_TIMES"] == "3"
        assert visible(log_stub, "orders") == [] and stats(stub).parked == 1
        listed = stub.ListOpen(txn_pb2.ListOpenRequest(), timeout=RPC_TIMEOUT_S).transactions
        assert [t.state for t in listed] == [txn_pb2.TRANSACTION_STATE_PARKED]
        code = None
        try:
            stub.Commit(txn_pb2.EndRequest(transaction_id=p.transaction_id), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            code = exc.code()
        assert code == grpc.StatusCode.FAILED_PRECONDITION  # a parked one only through ForceResolve
    finally:
        producer.close()


def test_a_group_without_a_stream_is_not_counted_as_checked(env):
    stub, _, clock, _ = env
    p = prepare(stub, "orders", [b"x"])
    producer = Producer(stub, "pg", lambda check: None)
    wait_until(lambda: stats(stub).open_streams == 1, "the stream to open")
    producer.close()  # the producer disconnects
    wait_until(lambda: stats(stub).open_streams == 0, "the stream to close")
    to_store_time(stub, clock, p.transaction_id)
    for _ in range(5):
        clock.advance(INTERVAL_MS)
    scans = stats(stub)
    wait_until(lambda: stats(stub).checks_sent == scans.checks_sent and show(stub, p.transaction_id).checks_sent == 0,
               "a quiet checker")
    assert show(stub, p.transaction_id).state == txn_pb2.TRANSACTION_STATE_OPEN  # never parked without checks
    again = Producer(stub, "pg", lambda check: txn_pb2.DECISION_ROLLBACK)  # the group comes back
    try:
        assert again.next_check().check_times == 1  # the scans without a stream did not count
        wait_until(lambda: show(stub, p.transaction_id).state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK, "rollback")
    finally:
        again.close()


def test_streams_sending_garbage_end_with_invalid_argument(env):
    stub, _, clock, channel = env
    answer_first = stub.CheckBack(iter([txn_pb2.CheckBackMessage(answer=txn_pb2.CheckAnswer(check_id=1))]),
                                  timeout=RPC_TIMEOUT_S)
    with pytest.raises(grpc.RpcError) as info:
        list(answer_first)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "hello" in info.value.details()
    producer = Producer(stub, "pg", lambda check: None)
    producer.outbox.put(txn_pb2.CheckBackMessage(answer=txn_pb2.CheckAnswer(check_id=424242,
                                                                           decision=txn_pb2.DECISION_COMMIT)))
    producer._thread.join(10)
    assert producer.error and producer.error[0].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "was not sent on this stream" in producer.error[0].details()
    producer.close()
    raw = channel.stream_stream("/mqstore.v1.Transaction/CheckBack", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as info:
        list(raw(iter([b"\xff\xff\xff garbage"]), timeout=RPC_TIMEOUT_S))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stats(stub).open_streams == 0  # and the service still answers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("decision", [txn_pb2.DECISION_ROLLBACK, txn_pb2.DECISION_COMMIT])
def test_answers_stop_the_checks_at_once_and_none_is_parked(tmp_path, decision, mode):
    """Ten transactions answered at their first check, while the rollbacks wait for their OP record (the
    OP batch is written only when the fake clock reaches its interval): none is checked again or parked.
    An eleventh, answered UNKNOWN, shows that the checker scanned after each advance of the clock."""
    with services(tmp_path, mode, check_interval_ms=1000, op_batch_interval_ms=60_000, check_rate_per_s=1000) as env:
        stub, log_stub, clock, _ = env
        ids = [prepare(stub, "orders", [f"m{i}".encode()]).transaction_id for i in range(10)]
        canary = prepare(stub, "orders", [b"canary"]).transaction_id
        producer = Producer(stub, "pg", lambda c: txn_pb2.DECISION_UNKNOWN if c.transaction_id == canary else decision)
        try:
            wait_until(lambda: stats(stub).open_streams == 1, "the stream to open")
            to_store_time(stub, clock, canary)
            clock.advance(TIMEOUT_MS)
            wait_until(lambda: stats(stub).check_answers == 11, "the eleven answers")
            for n in (2, 3):
                clock.advance(1000)
                wait_until(lambda n=n: show(stub, canary).checks_sent == n, f"check {n} of the canary (a scan)")
            clock.advance(1000)
            wait_until(lambda: show(stub, canary).state == txn_pb2.TRANSACTION_STATE_PARKED, "the canary parked")
            for txn_id in ids:  # answered at once: checked once, never parked, whatever their durability waits
                info = show(stub, txn_id)
                assert info.checks_sent == 1 and info.state != txn_pb2.TRANSACTION_STATE_PARKED, info
            clock.advance(60_000)  # the OP batch is due: every rollback becomes durable
            expected = (txn_pb2.TRANSACTION_STATE_ROLLED_BACK if decision == txn_pb2.DECISION_ROLLBACK
                        else txn_pb2.TRANSACTION_STATE_COMMITTED)
            wait_until(lambda: all(show(stub, t).state == expected for t in ids)
                       and stats(stub).op_pending_entries == 0, "every answer applied")
            s = stats(stub)
            assert s.parked == 1 and s.check_failures == 0 and s.checks_sent == 10 + 3
            visible_bodies = sorted(m.body for m in visible(log_stub, "orders"))
            assert visible_bodies == ([] if decision == txn_pb2.DECISION_ROLLBACK
                                      else sorted(f"m{i}".encode() for i in range(10)))
        finally:
            producer.close()
