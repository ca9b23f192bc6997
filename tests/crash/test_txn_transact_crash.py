"""The Transaction service killed while producers use Transact streams (real processes: a commit log and a
txn service; os._exit(137) at an armed failpoint, or kill -9): a crash mid-frame, between frames, and a
one-way Commit lost with the process, which check-back then decides. Exactly once throughout: every
acknowledged commit visible once, the transaction in flight completed by a retry or by check-back, nothing
visible twice."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, txn_pb2, txn_pb2_grpc
from tests.crash.txn_crash import RPC_S, TOKEN, _ready, _state, _visible, crash_at, txn_process
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]
CHECK_FLAGS = ["--transaction-timeout-ms", "300", "--check-scan-interval-ms", "50", "--check-interval-ms", "500"]


@pytest.mark.parametrize("name", ["txn.prepare.after_half", "txn.commit.before_real", "txn.commit.after_real"])
def test_a_crash_mid_frame_is_completed_once_by_a_retry(name, tmp_path):
    crash_at(name, tmp_path, via="stream")


class Stream:
    """A Transact stream of the test's producer."""

    def __init__(self, stub):
        self.outbox: queue.Queue = queue.Queue()
        self.answers = stub.Transact(iter(self.outbox.get, None), timeout=60)

    def ask(self, **kind) -> txn_pb2.TransactResponse:
        self.outbox.put(txn_pb2.TransactRequest(**kind))
        return next(self.answers)

    def close(self) -> None:
        self.outbox.put(None)


def _prepare(body: bytes, txn_id: str) -> txn_pb2.PrepareRequest:
    return txn_pb2.PrepareRequest(topic="orders", messages=[common_pb2.MessageInput(body=body)], producer_group="pg",
                                  transaction_id=txn_id)


def _answer_commit(stub, stop: threading.Event, checked: list) -> None:
    """The producer group's CheckBack stream: every check answered COMMIT (its own record says so)."""
    outbox: queue.Queue = queue.Queue()
    outbox.put(txn_pb2.CheckBackMessage(hello=txn_pb2.CheckBackHello(producer_group="pg")))
    call = stub.CheckBack(iter(outbox.get, None), timeout=60)
    stop_watch = threading.Thread(target=lambda: (stop.wait(), call.cancel()), daemon=True)
    stop_watch.start()
    try:
        for check in call:
            checked.append(check.transaction_id)
            outbox.put(txn_pb2.CheckBackMessage(answer=txn_pb2.CheckAnswer(check_id=check.check_id,
                                                                           decision=txn_pb2.DECISION_COMMIT)))
    except grpc.RpcError:
        pass  # cancelled at the end of the test
    finally:
        outbox.put(None)


@pytest.fixture
def log(tmp_path):
    process = commitlog(tmp_path / "log", "--segment-size-bytes", "1MiB", "--preallocate-segments", "false",
                        env={"MQSTORE_INTERNAL_TOKEN": TOKEN})
    with process:
        process.started()
        with grpc.insecure_channel(process.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_S)
            yield process.address, stub


def test_a_one_way_commit_lost_in_a_crash_is_decided_by_check_back(log, tmp_path):
    address, log_stub = log
    with txn_process(tmp_path / "txn", address, "txn.commit.before_real=exit") as first:
        first.started()
        with grpc.insecure_channel(first.address) as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_until(lambda: _ready(stub), "the first txn process")
            stream = Stream(stub)
            assert stream.ask(prepare=_prepare(b"paid", "t-1")).prepared.transaction_id == "t-1"
            stream.outbox.put(txn_pb2.TransactRequest(one_way=True, commit=txn_pb2.EndRequest(transaction_id="t-1")))
            assert first.wait_exit() == 137  # it died deciding the commit: the one-way frame is lost
            stream.close()
    with txn_process(tmp_path / "txn", address, "", *CHECK_FLAGS) as second:
        second.started()
        with grpc.insecure_channel(second.address) as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_until(lambda: _ready(stub), "the second txn process")
            assert _state(stub, "t-1") == txn_pb2.TRANSACTION_STATE_OPEN and _visible(log_stub)[b"paid"] == 0
            stop, checked = threading.Event(), []
            producer = threading.Thread(target=_answer_commit, args=(stub, stop, checked), daemon=True)
            producer.start()
            try:
                wait_until(lambda: _state(stub, "t-1") == txn_pb2.TRANSACTION_STATE_COMMITTED, "check-back's commit")
            finally:
                stop.set()
                producer.join(10)
            assert "t-1" in checked and _visible(log_stub) == {b"paid": 1}


def test_kill9_between_frames_leaves_the_transaction_to_the_next_stream(log, tmp_path):
    address, log_stub = log
    with txn_process(tmp_path / "txn", address) as first:
        first.started()
        with grpc.insecure_channel(first.address) as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_until(lambda: _ready(stub), "the first txn process")
            stream = Stream(stub)
            assert stream.ask(prepare=_prepare(b"a", "t-1")).prepared.transaction_id == "t-1"
            first.kill9()  # between the Prepare's answer and the Commit frame
            with pytest.raises(grpc.RpcError) as broken:
                stream.ask(commit=txn_pb2.EndRequest(transaction_id="t-1"))
            assert broken.value.code() == grpc.StatusCode.UNAVAILABLE
            stream.close()
    with txn_process(tmp_path / "txn", address) as second:
        second.started()
        with grpc.insecure_channel(second.address) as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_until(lambda: _ready(stub), "the second txn process")
            stream = Stream(stub)
            assert stream.ask(prepare=_prepare(b"a", "t-1")).prepared.already  # the retried Prepare: first answer
            ended = stream.ask(commit=txn_pb2.EndRequest(transaction_id="t-1")).ended
            assert ended.state == txn_pb2.TRANSACTION_STATE_COMMITTED and not ended.already
            stream.close()
    assert _visible(log_stub) == {b"a": 1}
