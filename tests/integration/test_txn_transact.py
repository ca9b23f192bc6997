"""Transact streams through real gRPC (a commit log and a txn service in this process, 127.0.0.1, port 0):
frames answered as their unary calls, failed frames answered with their status while the stream goes on,
the stream limit, one-way ends (applied, never answered, counted), ends carried by later frames (the same;
a malformed one refuses its frame whole), a stream broken mid-transaction, and
a one-way Commit lost while the commit log is away, which check-back then decides."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import grpc
import pytest

from mqstore.clock import FakeClock
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import txn_pb2, txn_pb2_grpc
from tests.integration.test_txn_checkback import TIMEOUT_MS, Producer, to_store_time
from tests.integration.txn_testing import (MODES, RPC_TIMEOUT_S, Frames, commit, commitlog, prepare, stats, txn_config,
                                           txn_stack, visible, wait_ready)
from tests.support.waiting import wait_until
from txn_service.main import serving

pytestmark = pytest.mark.integration
COMMITTED, ROLLED_BACK = txn_pb2.TRANSACTION_STATE_COMMITTED, txn_pb2.TRANSACTION_STATE_ROLLED_BACK


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


def end(txn_id: str) -> txn_pb2.EndRequest:
    return txn_pb2.EndRequest(transaction_id=txn_id)


def show(stub, txn_id: str) -> txn_pb2.TransactionInfo:
    return stub.Show(txn_pb2.ShowRequest(transaction_id=txn_id), timeout=RPC_TIMEOUT_S)


def bodies(log_stub) -> list[bytes]:
    return sorted(m.body for m in visible(log_stub, "orders", 2))


def test_frames_answer_as_the_unary_calls(log, txn):
    _, log_stub = log
    frames = Frames(txn)
    p = frames.prepare("orders", [b"a", b"b"], txn_id="t-1")
    assert p.WhichOneof("kind") == "prepared" and len(p.prepared.halves) == 2 and not p.prepared.already
    assert p.prepared.durability and bodies(log_stub) == []
    assert stats(txn).transact_streams == 1
    assert prepare(txn, "orders", [b"a", b"b"], txn_id="t-1").already  # the same Prepare as the unary one
    c = frames.ask(commit=end("t-1"))
    assert c.ended.state == COMMITTED and not c.ended.already and len(c.ended.results) == 2
    assert bodies(log_stub) == [b"a", b"b"]
    assert frames.ask(commit=end("t-1")).ended.already and commit(txn, "t-1").already
    refused = frames.ask(rollback=end("t-1")).error
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION.value[0] and "COMMITTED" in refused.message
    assert not refused.retriable
    frames.prepare("orders", [b"never"], txn_id="t-2")
    rolled = frames.ask(rollback=end("t-2"))
    assert rolled.ended.state == ROLLED_BACK
    # answered once its OP record is durable: the follower reading the record back can release the answer before
    # the OP writer's append returns and counts it, so the counter is read until it shows the write
    wait_until(lambda: stats(txn).op_entries_written >= 1, "the Rollback's OP record counted", 10)
    assert frames.close() == []
    wait_until(lambda: stats(txn).transact_streams == 0, "the stream's slot to be given back")
    assert bodies(log_stub) == [b"a", b"b"] and show(txn, "t-1").resolved_by == "producer"


def test_a_failed_frame_answers_its_status_and_the_stream_goes_on(log, txn):
    frames = Frames(txn)
    cases = [
        (dict(commit=end("nope")), grpc.StatusCode.NOT_FOUND, "unknown"),
        (dict(rollback=end("")), grpc.StatusCode.INVALID_ARGUMENT, "transaction_id"),
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "set one of prepare, commit or rollback, or carry ends"),
        (dict(one_way=True, prepare=txn_pb2.PrepareRequest(topic="orders", producer_group="pg")),
         grpc.StatusCode.INVALID_ARGUMENT, "only a Commit or Rollback frame may be one-way"),
        (dict(prepare=txn_pb2.PrepareRequest(topic="missing", producer_group="pg")),
         grpc.StatusCode.INVALID_ARGUMENT, "1 to 1000"),
    ]
    for kind, code, text in cases:
        error = frames.ask(**kind).error
        assert (error.code, text in error.message, error.retriable) == (code.value[0], True, False), (kind, error)
    frames.prepare("orders", [b"x"], txn_id="fixed")
    other = frames.prepare("orders", [b"y"], txn_id="fixed").error
    assert other.code == grpc.StatusCode.ALREADY_EXISTS.value[0] and "other messages" in other.message
    assert frames.ask(commit=end("fixed")).ended.state == COMMITTED  # the stream still serves
    frames.close()


@pytest.mark.parametrize("mode", MODES)
def test_streams_beyond_the_limit_are_refused_until_one_ends(mode, tmp_path):
    with txn_stack(tmp_path, mode, {"orders": 2}, max_transact_streams=2) as stack:
        stub = stack.txn
        first, second = Frames(stub), Frames(stub)
        for frames in (first, second):
            assert frames.prepare("orders", [b"x"]).prepared.transaction_id
        third = Frames(stub)
        third.send(commit=end("t"))
        with pytest.raises(grpc.RpcError) as refused:
            next(third.call)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_transact_streams" in refused.value.details()
        first.cancel()
        wait_until(lambda: stats(stub).transact_streams == 1, "the cancelled stream's slot to be given back")
        fourth = Frames(stub)
        assert fourth.prepare("orders", [b"y"]).prepared.transaction_id
        second.close()
        fourth.close()


def test_a_one_way_end_is_applied_and_never_answered(log, txn):
    _, log_stub = log
    frames = Frames(txn)
    for txn_id in ("t-1", "t-2"):
        frames.prepare("orders", [txn_id.encode()], txn_id=txn_id)
    frames.send(one_way=True, commit=end("t-1"))
    frames.send(one_way=True, rollback=end("t-2"))
    frames.send(one_way=True, commit=end("t-2"))   # refused (rolled back): nobody is told, it is counted
    frames.send(one_way=True, commit=end("nope"))  # likewise
    answer = frames.prepare("orders", [b"t-3"], txn_id="t-3")  # the next answer is the next two-way frame's
    assert answer.prepared.transaction_id == "t-3"
    # Applied by workers while the stream went on: the refused ones counted (which of t-2's two ends came
    # first is the workers' race; exactly one of them took effect).
    wait_until(lambda: (stats(txn).one_way_ends, stats(txn).one_way_failures) == (4, 2)
               and show(txn, "t-1").state == COMMITTED and show(txn, "t-2").state in (COMMITTED, ROLLED_BACK),
               "the one-way ends")
    assert show(txn, "t-1").state == COMMITTED and show(txn, "t-1").resolved_by == "producer (one-way)"
    t2 = show(txn, "t-2").state
    assert bodies(log_stub) == ([b"t-1"] if t2 == ROLLED_BACK else [b"t-1", b"t-2"]), t2
    wait_until(lambda: stats(txn).op_pending_entries == 0, "the OP records")
    assert frames.close() == []


def carried(txn_id: str, decision: int = txn_pb2.DECISION_COMMIT) -> txn_pb2.CarriedEnd:
    return txn_pb2.CarriedEnd(transaction_id=txn_id, decision=decision)


def test_carried_ends_are_applied_as_one_way_frames_and_never_answered(log, txn):
    _, log_stub = log
    frames = Frames(txn)
    for txn_id in ("t-1", "t-2", "t-3"):
        frames.prepare("orders", [txn_id.encode()], txn_id=txn_id)
    # A Prepare carrying two ends (one refused: unknown) is answered as the Prepare alone.
    answer = frames.prepare("orders", [b"t-4"], txn_id="t-4",
                            ends=[carried("t-1"), carried("t-2", txn_pb2.DECISION_ROLLBACK), carried("nope")])
    assert answer.prepared.transaction_id == "t-4"
    frames.send(ends=[carried("t-3"), carried("t-4")])  # ends only: never answered
    last = frames.prepare("orders", [b"t-5"], txn_id="t-5")  # the next answer is the next two-way frame's
    assert last.prepared.transaction_id == "t-5"
    wait_until(lambda: (stats(txn).one_way_ends, stats(txn).one_way_failures) == (5, 1)
               and all(show(txn, t).state == COMMITTED for t in ("t-1", "t-3", "t-4"))
               and show(txn, "t-2").state == ROLLED_BACK, "the carried ends")
    assert show(txn, "t-1").resolved_by == "producer (one-way)"
    assert show(txn, "t-5").state == txn_pb2.TRANSACTION_STATE_OPEN
    assert bodies(log_stub) == [b"t-1", b"t-3", b"t-4"]
    assert frames.close() == []


def test_a_frame_with_malformed_ends_is_refused_whole_and_answered(log, txn):
    _, log_stub = log
    frames = Frames(txn)
    frames.prepare("orders", [b"t-1"], txn_id="t-1")
    cases = [  # each with a valid end of t-1 first: none of the frame may be applied
        (dict(ends=[carried("t-1"), carried("t-1", txn_pb2.DECISION_UNKNOWN)]), "ends[1].decision"),
        (dict(ends=[carried("t-1"), carried("t-1", txn_pb2.DECISION_UNSPECIFIED)]), "ends[1].decision"),
        (dict(ends=[carried("t-1")] * 1001), "at most 1000"),
        (dict(commit=end("t-1"), ends=[carried("t-1"), carried("t-1", 7)]), "ends[1].decision"),
        (dict(prepare=txn_pb2.PrepareRequest(topic="orders", producer_group="pg", transaction_id="t-2",
                                              messages=[txn_pb2.PrepareRequest().messages.add(body=b"t-2")]),
              ends=[carried("t-1"), carried("t-1", txn_pb2.DECISION_UNKNOWN)]), "ends[1].decision"),
    ]
    for kind, text in cases:
        error = frames.ask(**kind).error  # answered although an ends-only frame would not be
        assert (error.code, text in error.message) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], True), (text, error)
    assert show(txn, "t-1").state == txn_pb2.TRANSACTION_STATE_OPEN and bodies(log_stub) == []
    assert (stats(txn).one_way_ends, stats(txn).open) == (0, 1)  # no t-2 either
    assert frames.ask(commit=end("t-1")).ended.state == COMMITTED  # the stream still serves
    assert frames.close() == []


def test_a_carried_end_is_applied_before_the_frames_own_request_in_local_mode(tmp_path):
    """Local mode applies one-way ends on the stream's thread: an end carried by a two-way Commit of the
    same transaction has committed it by the time the Commit runs (Cluster mode's workers may race it)."""
    with txn_stack(tmp_path, "local", {"orders": 2}) as parts:
        frames = Frames(parts.txn)
        frames.prepare("orders", [b"a"], txn_id="t-1")
        answer = frames.ask(commit=end("t-1"), ends=[carried("t-1")])
        assert answer.ended.state == COMMITTED and answer.ended.already
        frames.prepare("orders", [b"b"], txn_id="t-2")
        refused = frames.ask(commit=end("t-2"), ends=[carried("t-2", txn_pb2.DECISION_ROLLBACK)]).error
        assert refused.code == grpc.StatusCode.FAILED_PRECONDITION.value[0] and "ROLLED_BACK" in refused.message
        assert frames.close() == []


def test_a_broken_stream_leaves_the_transaction_to_a_retry(log, txn):
    _, log_stub = log
    first = Frames(txn)
    first.prepare("orders", [b"p"], txn_id="t-1")
    first.cancel()  # the producer's stream breaks after its Prepare was answered
    wait_until(lambda: stats(txn).transact_streams == 0, "the broken stream's slot to be given back")
    assert show(txn, "t-1").state == txn_pb2.TRANSACTION_STATE_OPEN
    second = Frames(txn)
    assert second.ask(commit=end("t-1")).ended.state == COMMITTED
    second.prepare("orders", [b"q"], txn_id="t-2")
    second.send(commit=end("t-2"))
    second.cancel()  # broken while its Commit may be in progress: the retry answers the state reached
    third = Frames(txn)
    retried = third.ask(commit=end("t-2")).ended
    assert retried.state == COMMITTED
    assert bodies(log_stub) == [b"p", b"q"]  # each exactly once, whichever attempt appended it
    third.close()


@pytest.mark.parametrize("how", ["one-way frame", "carried"])
def test_a_one_way_commit_lost_while_the_log_is_away_is_decided_by_check_back(how, tmp_path):
    clock = FakeClock(time.time_ns() // 1_000_000)
    with contextlib.ExitStack() as stack:
        first_log = commitlog(tmp_path / "log")
        port, log_stub = first_log.__enter__()
        log_up = True
        try:
            log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_TIMEOUT_S)
            config = dataclasses.replace(txn_config(tmp_path / "txn", port, check_max=3), clock=clock)
            _, txn_port = stack.enter_context(serving(config))
            channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{txn_port}"))
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_ready(stub)
            frames = Frames(stub)
            frames.prepare("orders", [b"paid"], txn_id="t-1")
            first_log.__exit__(None, None, None)  # the commit log goes away
            log_up = False
            if how == "carried":  # by the next frame, which is answered as if it carried nothing
                answer = frames.ask(commit=end("nope"), ends=[carried("t-1")])
            else:
                frames.send(one_way=True, commit=end("t-1"))
                answer = frames.ask(commit=end("nope"))
            assert answer.error.code == grpc.StatusCode.NOT_FOUND.value[0]  # the stream goes on
            wait_until(lambda: stats(stub).one_way_failures == 1, "the one-way commit to fail")
            # the log was gone before the commit was sent: gRPC could not send it (NotWritten), so nothing is in
            # doubt and the transaction stays OPEN (before NotWritten: OUTCOME_UNKNOWN until the log was read)
            assert show(stub, "t-1").state == txn_pb2.TRANSACTION_STATE_OPEN
        finally:
            if log_up:
                first_log.__exit__(None, None, None)
        with commitlog(tmp_path / "log", port=port) as (_, log_stub):
            clock.advance(config.txn.in_doubt_settle_ms)
            assert show(stub, "t-1").state == txn_pb2.TRANSACTION_STATE_OPEN
            producer = Producer(stub, "pg", lambda check: txn_pb2.DECISION_COMMIT)
            try:
                wait_until(lambda: stats(stub).open_streams == 1, "the check-back stream to open")
                to_store_time(stub, clock, "t-1")
                clock.advance(TIMEOUT_MS)
                assert producer.next_check().transaction_id == "t-1"
                wait_until(lambda: show(stub, "t-1").state == COMMITTED, "check-back's commit")
                assert [m.body for m in visible(log_stub, "orders")] == [b"paid"]
            finally:
                producer.close()
            frames.close()
