"""Exactly once through real gRPC: a commit log and a txn service in this process, with a proxy between them
(tests/support/grpc_proxy.py) that loses an append's answer after the commit log wrote it, holds it past
the caller's deadline, or loses the request. Each is an append whose outcome the service cannot know: the
transaction must show OUTCOME_UNKNOWN, refuse decisions meanwhile, and a retry must answer from what the
log holds, never append twice. Also: concurrent Prepares of one id, a Prepare written twice (duplicate
halves: committed once, the duplicate rolled back), the cap on open transactions."""

from __future__ import annotations

import collections
import concurrent.futures

import grpc
import pytest

from mqstore.txn import records as tx
from mqstore.model import MessageIn
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import common_pb2, txn_pb2
from mqstore.txn.opbatch import parse_body
from tests.integration.txn_testing import (RPC_TIMEOUT_S, TOKEN, commit, commitlog, prepare, rollback, stats,
                                           txn_service, visible, wait_ready)
from tests.support.grpc_proxy import FaultyProxy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
APPEND = "/mqstore.v1.CommitLogInternal/AppendBatchesStream"  # Prepare's and Commit's appends (the loop's)
OP_APPEND = "/mqstore.v1.CommitLogInternal/Append"       # the OP records' (the thread batcher's)
SETTLE_MS = 200


@pytest.fixture
def env(tmp_path):
    with commitlog(tmp_path / "log") as (port, log_stub), FaultyProxy(f"127.0.0.1:{port}") as proxy:
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=2), timeout=RPC_TIMEOUT_S)
        with txn_service(tmp_path / "txn", proxy.port, in_doubt_settle_ms=SETTLE_MS, rpc_timeout_ms=2000,
                         op_batch_interval_ms=20) as (_, stub):
            wait_ready(stub)
            yield stub, log_stub, proxy, port


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def state(stub, txn_id: str) -> int:
    return stub.Show(txn_pb2.ShowRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S).state


def until_answered(call, what: str):
    """Retry ``call`` while it answers UNAVAILABLE (what a client does), bounded by a deadline."""
    def attempt():
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None
    return wait_until(attempt, what)


def op_entries(log_stub) -> collections.Counter:
    """Half queue offsets named by OP records, with how many OP records name each."""
    return collections.Counter(o for m in visible(log_stub, tx.OP_TOPIC) for o in parse_body(m.body))


@pytest.mark.parametrize("fault", ["answer_lost", "past_deadline"])
def test_a_commit_whose_outcome_is_unknown_is_never_appended_twice(env, fault):
    stub, log_stub, proxy, _ = env
    p = prepare(stub, "orders", [b"a", b"b"], txn_id="t1")
    proxy.hold_streams()  # the follower sees nothing new: as while the commit log is down after a crash
    proxy.arm(APPEND, fault)  # the commit log writes the real messages; the service does not learn it
    code, details = status_of(lambda: commit(stub, "t1"))
    assert code == grpc.StatusCode.UNAVAILABLE and "outcome" in details and "retry Commit" in details
    assert proxy.hits == [(APPEND, fault)]
    assert state(stub, "t1") == txn_pb2.TRANSACTION_STATE_OUTCOME_UNKNOWN
    for call in (commit, rollback):  # no new decision while the outcome is unknown: above all no second append
        code, details = status_of(lambda call=call: call(stub, "t1"))
        assert code == grpc.StatusCode.UNAVAILABLE and "unknown" in details
    proxy.release_streams()
    done = until_answered(lambda: commit(stub, "t1"), "the retried commit")
    assert done.state == txn_pb2.TRANSACTION_STATE_COMMITTED and done.already  # the first append landed
    assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [b"a", b"b"]  # 2 visible, never 4
    wait_until(lambda: all(op_entries(log_stub)[h.half_queue_offset] == 1 for h in p.halves), "the OP records")
    wait_until(lambda: (s := stats(stub)).in_doubt_appends == 0 and s.in_doubt_settled == 1, "the resolver done")
    assert stats(stub).outcome_unknown == 0


def test_a_commit_whose_request_was_lost_is_appended_on_retry(env):
    stub, log_stub, proxy, _ = env
    prepare(stub, "orders", [b"a", b"b"], txn_id="t1")
    proxy.arm(APPEND, "request_lost")
    code, _ = status_of(lambda: commit(stub, "t1"))
    assert code == grpc.StatusCode.UNAVAILABLE
    done = until_answered(lambda: commit(stub, "t1"), "the retried commit")
    assert done.state == txn_pb2.TRANSACTION_STATE_COMMITTED and not done.already and len(done.results) == 2
    assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [b"a", b"b"]


def test_a_prepare_whose_answer_was_lost_gives_its_first_answer_and_one_set_of_halves(env):
    stub, log_stub, proxy, _ = env
    proxy.hold_streams()
    proxy.arm(APPEND, "answer_lost")
    code, details = status_of(lambda: prepare(stub, "orders", [b"x", b"y"], txn_id="p1"))
    assert code == grpc.StatusCode.UNAVAILABLE and "p1" in details
    code, _ = status_of(lambda: prepare(stub, "orders", [b"x", b"y"], txn_id="p1"))
    assert code == grpc.StatusCode.UNAVAILABLE  # not appended again while its outcome is unknown
    proxy.release_streams()
    again = until_answered(lambda: prepare(stub, "orders", [b"x", b"y"], txn_id="p1"), "the retried prepare")
    assert again.already and len(again.halves) == 2
    halves = visible(log_stub, tx.HALF_TOPIC)
    assert len(halves) == 2 and len({m.properties[tx.PROPERTY_ATTEMPT] for m in halves}) == 1  # appended once
    assert commit(stub, "p1").state == txn_pb2.TRANSACTION_STATE_COMMITTED
    assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [b"x", b"y"]
    wait_until(lambda: set(op_entries(log_stub)) == {h.queue_offset for h in halves}, "an OP record for each half")


def test_a_prepare_whose_caller_gave_up_mid_append_still_learns_its_outcome(env):
    """On the Transaction port's event loop, a Prepare whose RPC ends (the producer's deadline) while its
    append is in flight runs on to the append's outcome, as a thread would: its id is not freed behind a
    half that may land, so the producer's retry never appends a second set of halves."""
    stub, log_stub, proxy, _ = env
    proxy.hold_streams()
    proxy.arm(APPEND, "past_deadline")  # held past the service's own deadline (rpc_timeout_ms 2000)
    request = txn_pb2.PrepareRequest(topic="orders", messages=[common_pb2.MessageInput(body=b"k")],
                                     producer_group="pg", transaction_id="k1")
    code, _ = status_of(lambda: stub.Prepare(request, timeout=0.3))  # the producer gives up first
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    code, details = status_of(lambda: stub.Prepare(request, timeout=RPC_TIMEOUT_S))
    assert code == grpc.StatusCode.UNAVAILABLE and "k1" in details  # still in progress, or its outcome unknown
    proxy.release_streams()
    again = until_answered(lambda: stub.Prepare(request, timeout=RPC_TIMEOUT_S), "the retried prepare")
    assert again.already and len(again.halves) == 1
    assert [m.body for m in visible(log_stub, tx.HALF_TOPIC)] == [b"k"]  # appended once


def test_a_carried_commit_whose_outcome_is_unknown_is_settled_from_the_log_and_appended_once(env):
    """Cluster mode's Transact on the loop: a carried Commit's append whose answer is lost is a one-way
    failure (counted, never answered); the transaction is OUTCOME_UNKNOWN until the log is read past it,
    then COMMITTED from what landed; the stream's next frame is answered meanwhile."""
    stub, log_stub, proxy, _ = env
    p = prepare(stub, "orders", [b"c"], txn_id="c1")
    proxy.hold_streams()
    proxy.arm(APPEND, "answer_lost")

    def frames():
        yield txn_pb2.TransactRequest(request_id=1, ends=[txn_pb2.CarriedEnd(
            transaction_id="c1", decision=txn_pb2.DECISION_COMMIT)])
        # the end's append meets the fault first (the next frame's would overlap it)
        wait_until(lambda: proxy.hits, "the carried Commit's append")
        yield txn_pb2.TransactRequest(request_id=2, prepare=txn_pb2.PrepareRequest(
            topic="orders", messages=[common_pb2.MessageInput(body=b"n")], producer_group="pg", transaction_id="c2"))
    answers = list(stub.Transact(frames(), timeout=RPC_TIMEOUT_S))
    assert [a.request_id for a in answers] == [2] and answers[0].prepared.transaction_id == "c2"
    assert proxy.hits == [(APPEND, "answer_lost")]
    assert stats(stub).one_way_failures == 1
    assert state(stub, "c1") == txn_pb2.TRANSACTION_STATE_OUTCOME_UNKNOWN
    proxy.release_streams()
    wait_until(lambda: state(stub, "c1") == txn_pb2.TRANSACTION_STATE_COMMITTED, "c1 settled from the log")
    assert commit(stub, "c1").already
    assert [m.body for m in visible(log_stub, "orders", 2)] == [b"c"]  # landed once, never appended again
    wait_until(lambda: op_entries(log_stub)[p.halves[0].half_queue_offset] == 1, "c1's OP record")


def test_a_generated_id_is_named_when_its_prepare_is_unknown(env):
    stub, _, proxy, _ = env
    proxy.arm(APPEND, "request_lost")
    code, details = status_of(lambda: prepare(stub, "orders", [b"x"]))
    assert code == grpc.StatusCode.UNAVAILABLE and "retry Prepare with transaction_id" in details
    txn_id = details.split("transaction_id ")[1].split(":")[0]
    again = until_answered(lambda: prepare(stub, "orders", [b"x"], txn_id=txn_id), "the prepare with the id")
    assert again.transaction_id == txn_id and not again.already  # it had not landed: appended now, once


def test_an_op_write_of_unknown_outcome_is_not_written_again(env):
    stub, log_stub, proxy, _ = env
    p = prepare(stub, "orders", [b"r"], txn_id="r1")
    proxy.arm(OP_APPEND, "answer_lost")  # the next append is the rollback's OP record
    done = until_answered(lambda: rollback(stub, "r1"), "the rollback")
    assert done.state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK
    assert proxy.hits == [(OP_APPEND, "answer_lost")]
    assert op_entries(log_stub) == {p.halves[0].half_queue_offset: 1}  # one OP record: the one that landed
    assert stats(stub).op_unknown_outcomes == 1
    code, details = status_of(lambda: commit(stub, "r1"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ROLLED_BACK" in details


def test_concurrent_prepares_of_one_id_never_merge(env):
    stub, log_stub, _, _ = env

    def attempt(i: int):
        try:
            return i, prepare(stub, "orders", [f"m{i}-0".encode(), f"m{i}-1".encode()], txn_id="same")
        except grpc.RpcError as exc:
            return i, exc.code()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(attempt, range(8)))
    winners = [i for i, r in outcomes if not isinstance(r, grpc.StatusCode)]
    assert len(winners) == 1, outcomes
    assert all(r == grpc.StatusCode.ALREADY_EXISTS for i, r in outcomes if i not in winners), outcomes
    done = commit(stub, "same")
    assert len(done.results) == 2
    w = winners[0]
    assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [f"m{w}-0".encode(), f"m{w}-1".encode()]
    assert len(visible(log_stub, tx.HALF_TOPIC)) == 2  # the losers appended nothing


def test_concurrent_identical_prepares_append_once(env):
    stub, log_stub, _, _ = env

    def attempt(_):
        try:
            return prepare(stub, "orders", [b"same-0", b"same-1"], txn_id="dup")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE  # the first is still in progress: retry
            return None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [a for a in pool.map(attempt, range(8)) if a is not None]
    assert sum(not a.already for a in answers) == 1 and all(a.halves == answers[0].halves for a in answers)
    commit(stub, "dup")
    assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [b"same-0", b"same-1"]


def test_a_prepare_written_twice_is_committed_once_and_its_duplicate_rolled_back(env):
    """Halves of a second Prepare attempt of one id in the log (an append misjudged, or a log of an older
    version): only one attempt's messages become visible, every half gets its OP record."""
    stub, log_stub, _, port = env
    first = prepare(stub, "orders", [b"d0", b"d1"], txn_id="twice")
    client = CommitLogClient(f"127.0.0.1:{port}")
    try:
        original = [m for m in visible(log_stub, tx.HALF_TOPIC)]
        copies = [MessageIn(m.body, properties={**dict(m.properties), tx.PROPERTY_ATTEMPT: "0123456789abcdef"},
                            queue_id=0) for m in original]
        client.internal_append(tx.HALF_TOPIC, copies, writer="txn", token=TOKEN)
    finally:
        client.close()
    info = wait_until(lambda: (i := stub.Show(txn_pb2.ShowRequest(transaction_id="twice"), timeout=RPC_TIMEOUT_S))
                      and len(i.half_physical_offsets) == 4 and i, "the follower to find the duplicate")
    assert info.message_count == 2 and info.state == txn_pb2.TRANSACTION_STATE_OPEN
    done = commit(stub, "twice")
    assert [r.physical_offset for r in done.results] != [] and len(done.results) == 2
    assert sorted(m.body for m in visible(log_stub, "orders", 2)) == [b"d0", b"d1"]
    assert {m.prepared_transaction_offset for m in visible(log_stub, "orders", 2)} == \
        {h.physical_offset for h in first.halves}  # the first attempt's halves, not the copies
    halves = {m.queue_offset for m in visible(log_stub, tx.HALF_TOPIC)}
    wait_until(lambda: set(op_entries(log_stub)) == halves, "an OP record for every half, the duplicates too")
    assert stats(stub).open == 0


def test_open_transactions_are_capped(tmp_path):
    with commitlog(tmp_path / "log") as (port, log_stub):
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_TIMEOUT_S)
        with txn_service(tmp_path / "txn", port, max_open_transactions=2) as (_, stub):
            wait_ready(stub)
            prepare(stub, "orders", [b"1"], txn_id="a")
            prepare(stub, "orders", [b"2"], txn_id="b")
            code, details = status_of(lambda: prepare(stub, "orders", [b"3"], txn_id="c"))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_open_transactions is 2" in details
            commit(stub, "a")
            assert prepare(stub, "orders", [b"3"], txn_id="c").transaction_id == "c"
