"""The commit log killed after it wrote a transaction's records and before it answered (a real process with
``MQSTORE_FAILPOINTS=log.after_write=exit``: os._exit(137), as kill -9), between a call and its retry;
the txn service runs in this process. The retried Commit must find the messages the dead log wrote (2
visible, never 4); the retried Prepare must get its first answer (one set of halves: none stranded, each
gets its OP record once the transaction is decided)."""

from __future__ import annotations

import collections
import pathlib
import socket

import grpc
import pytest

from mqstore.txn import records as tx
from mqstore.txn.opbatch import parse_body
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, txn_pb2
from tests.integration.txn_testing import TOKEN, commit, prepare, stats, txn_service, visible, wait_ready
from tests.support.processes import ServiceProcess, commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow]
RPC_S = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Log:
    """The commit log process, restarted on the same port (the txn service's address for it)."""

    def __init__(self, data_dir: pathlib.Path):
        self.data_dir, self.port = data_dir, _free_port()
        self.process: ServiceProcess | None = None

    def start(self, failpoint: str = "") -> ServiceProcess:
        self.process = commitlog(self.data_dir, "--port", str(self.port), "--segment-size-bytes", "1MiB",
                                 "--preallocate-segments", "false",
                                 env={"MQSTORE_INTERNAL_TOKEN": TOKEN, "MQSTORE_FAILPOINTS": failpoint}).started()
        return self.process

    def stub(self, channel) -> commitlog_pb2_grpc.CommitLogStub:
        return commitlog_pb2_grpc.CommitLogStub(channel)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _until_answered(call, what: str):
    def attempt():
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None
    return wait_until(attempt, what, timeout_s=60)


def _unavailable(call) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    return info.value.details()


def _until_it_dies(call, dying: ServiceProcess) -> str:
    """Call until the log process has died of its armed failpoint (the first calls may fail before they
    reach it: the service's channel is still reconnecting); every call answers UNAVAILABLE. The details of
    every answer, one per line: the call that reached the failpoint need not be the last (on a loaded machine
    a retry can go out before the death is seen, and it answers that an identical call is in progress)."""
    details: list[str] = []
    wait_until(lambda: details.append(_unavailable(call)) or dying.process.poll() is not None,
               "the commit log to die after writing", timeout_s=60)
    assert dying.wait_exit() == 137
    dying.stop()  # closes its pipes
    return "\n".join(details)


def _op_entries(log_stub) -> collections.Counter:
    return collections.Counter(o for m in visible(log_stub, tx.OP_TOPIC) for o in parse_body(m.body))


@pytest.fixture
def log(tmp_path):
    log = Log(tmp_path / "log")
    process = log.start()
    with grpc.insecure_channel(process.address) as channel:
        log.stub(channel).CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_S)
    try:
        yield log
    finally:
        log.stop()


def test_a_commit_retried_across_a_commit_log_crash_after_its_write_is_visible_once(log, tmp_path):
    with txn_service(tmp_path / "txn", log.port, in_doubt_settle_ms=200) as (_, stub):
        wait_ready(stub)
        prepare(stub, "orders", [b"paid", b"shipped"], txn_id="t1")
        log.stop()
        dying = log.start("log.after_write=exit")  # the next append is written, then the process dies
        assert "outcome" in _until_it_dies(lambda: commit(stub, "t1"), dying)
        _unavailable(lambda: commit(stub, "t1"))  # the retry, while the log is down: no decision, no append
        log.start()
        done = _until_answered(lambda: commit(stub, "t1"), "the retried commit")
        assert done.state == txn_pb2.TRANSACTION_STATE_COMMITTED and done.already
        with grpc.insecure_channel(log.process.address) as channel:
            assert sorted(m.body for m in visible(log.stub(channel), "orders")) == [b"paid", b"shipped"]


def test_a_prepare_retried_across_a_commit_log_crash_leaves_no_stranded_half(log, tmp_path):
    with txn_service(tmp_path / "txn", log.port, in_doubt_settle_ms=200) as (_, stub):
        wait_ready(stub)
        log.stop()
        dying = log.start("log.after_write=exit")
        assert "retry Prepare with transaction_id p1" in _until_it_dies(
            lambda: prepare(stub, "orders", [b"a", b"b"], txn_id="p1"), dying)
        log.start()
        again = _until_answered(lambda: prepare(stub, "orders", [b"a", b"b"], txn_id="p1"), "the retried prepare")
        assert again.already
        assert commit(stub, "p1").state == txn_pb2.TRANSACTION_STATE_COMMITTED
        with grpc.insecure_channel(log.process.address) as channel:
            log_stub = log.stub(channel)
            halves = visible(log_stub, tx.HALF_TOPIC)
            assert len(halves) == 2  # one Prepare's halves: none stranded beside them
            assert sorted(m.body for m in visible(log_stub, "orders")) == [b"a", b"b"]
            wait_until(lambda: _op_entries(log_stub) == {m.queue_offset: 1 for m in halves}, "an OP record per half")
        assert stats(stub).open == 0
