"""Crash scenarios of the Transaction service with real processes: a commit log process, and a txn process
that an armed failpoint kills (os._exit(137), as kill -9) at one step; then a txn process without it.

Workload: transactions t0, t1, ... (fixed ids, two messages each), prepared and then committed (even)
or rolled back (odd), until the first call fails (the process died); the calls are unary ones or frames
of one Transact stream. The invariants after the restart:
every acknowledged commit is visible exactly once, nothing of a rolled-back transaction is ever
visible, nothing is committed twice; the transaction in flight at the crash is OPEN (its halves
stored) or reached its state, and repeating its call completes it; then nothing is left open.
"""

from __future__ import annotations

import collections
import pathlib
import queue

import grpc

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as cpb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, txn_pb2, txn_pb2_grpc
from tests.support.processes import ServiceProcess, commitlog
from tests.support.waiting import wait_until

TOKEN = "crash-token"
RPC_S = 10
ROUNDS = 12


def txn_process(data_dir: pathlib.Path, log_address: str, failpoint: str = "", *extra: str) -> ServiceProcess:
    env = {"MQSTORE_INTERNAL_TOKEN": TOKEN, "MQSTORE_FAILPOINTS": failpoint}
    return ServiceProcess("txn_service.main", [
        "--data-dir", str(data_dir), "--port", "0", "--grace-s", "1", "--commitlog", log_address,
        "--op-batch-interval-ms", "30", "--checkpoint-interval-ms", "20", "--heartbeat-ms", "20",
        "--backoff-initial-ms", "20", "--backoff-max-ms", "200", *extra], env)


def local_process(data_dir: pathlib.Path, failpoint: str = "", *extra: str) -> ServiceProcess:
    """A commit log serving the Transaction service itself (Local mode, --txn-port); its state in
    <data_dir>/txn. ``started_local`` waits for it and gives the Transaction port's address."""
    return commitlog(data_dir, "--segment-size-bytes", "1MiB", "--preallocate-segments", "false", "--txn-port", "0",
                     "--txn-op-batch-interval-ms", "30", "--txn-checkpoint-interval-ms", "20", *extra,
                     env={"MQSTORE_INTERNAL_TOKEN": TOKEN, "MQSTORE_FAILPOINTS": failpoint})


def started_local(process: ServiceProcess) -> str:
    """Wait for ``server.started`` (as ServiceProcess.started); the Transaction port's address."""
    try:
        event = process.wait_for("server.started", 60)
    except BaseException:
        process.stop()
        raise
    process.address = f"127.0.0.1:{event['port']}"
    return f"127.0.0.1:{event['ports']['txn']}"


def _ready(stub) -> bool:
    try:
        return not stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_S).recovering
    except grpc.RpcError:
        return False


def _visible(log_stub) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    offset = 0
    while True:
        r = log_stub.Pull(cpb.PullRequest(topic="orders", queue_id=0, offset=offset, max_messages=1000), timeout=RPC_S)
        seen.update(m.body for m in r.messages)
        if not r.messages:
            return seen
        offset = r.next_offset


class _Unary:
    """The workload's calls as unary calls; a failed call raises grpc.RpcError."""

    def __init__(self, stub):
        self.stub = stub

    def call(self, step: str, request) -> None:
        getattr(self.stub, step.capitalize())(request, timeout=RPC_S)

    def close(self) -> None:
        pass


class _Stream:
    """The same calls as frames of one Transact stream: a frame answered with an error, or the stream
    broken (the process died), is a failed call."""

    def __init__(self, stub):
        self._outbox: queue.Queue = queue.Queue()
        self._answers = stub.Transact(iter(self._outbox.get, None), timeout=60)

    def call(self, step: str, request) -> None:
        self._outbox.put(txn_pb2.TransactRequest(**{step: request}))
        if next(self._answers).WhichOneof("kind") == "error":
            raise grpc.RpcError(f"the {step} frame was answered with an error")

    def close(self) -> None:
        self._outbox.put(None)


def _workload(stub, via: str) -> tuple[dict[str, str], str, str]:
    """Acknowledged outcomes by id, and the id and step in flight when a call failed."""
    done: dict[str, str] = {}
    calls = _Stream(stub) if via == "stream" else _Unary(stub)
    try:
        for i in range(ROUNDS):
            txn_id = f"t{i}"
            messages = [common_pb2.MessageInput(body=f"{txn_id}-{n}".encode()) for n in range(2)]
            for step in ("prepare", "commit" if i % 2 == 0 else "rollback"):
                request = (txn_pb2.PrepareRequest(topic="orders", messages=messages, producer_group="pg",
                                                  transaction_id=txn_id) if step == "prepare"
                           else txn_pb2.EndRequest(transaction_id=txn_id))
                try:
                    calls.call(step, request)
                except grpc.RpcError:
                    return done, txn_id, step
            done[txn_id] = step
        return done, "", ""
    finally:
        calls.close()


def crash_at(name: str, tmp_path: pathlib.Path, via: str = "unary") -> None:
    """``via``: the producer's calls as unary calls or as frames of a Transact stream."""
    log = commitlog(tmp_path / "log", "--segment-size-bytes", "1MiB", "--preallocate-segments", "false",
                    env={"MQSTORE_INTERNAL_TOKEN": TOKEN})
    with log:
        log.started()
        log_channel = grpc.insecure_channel(log.address)
        log_stub = commitlog_pb2_grpc.CommitLogStub(log_channel)
        log_stub.CreateTopic(cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_S)
        try:
            with txn_process(tmp_path / "txn", log.address, f"{name}=exit") as first:
                first.started()
                with grpc.insecure_channel(first.address) as channel:
                    stub = txn_pb2_grpc.TransactionStub(channel)
                    wait_until(lambda: _ready(stub) or first.process.poll() is not None, "the first txn process")
                    done, in_flight, step = _workload(stub, via)
                assert first.wait_exit() == 137, f"{name} was never reached: {first.stderr()[-2000:]}"
            with txn_process(tmp_path / "txn", log.address) as second:
                second.started()
                with grpc.insecure_channel(second.address) as channel:
                    stub = txn_pb2_grpc.TransactionStub(channel)
                    if name == "txn.commit.after_real":  # recognised as committed from its COMMIT records
                        wait_until(lambda: _ready(stub), "the txn service to recover")
                        assert (in_flight, step) == ("t0", "commit")
                        assert _state(stub, "t0") == txn_pb2.TRANSACTION_STATE_COMMITTED
                    _check_after(stub, log_stub, done, in_flight, step)
        finally:
            log_channel.close()


def crash_local_at(name: str, tmp_path: pathlib.Path, via: str = "unary") -> None:
    """As :func:`crash_at` in Local mode: the failpoint kills the commit log process that hosts the
    Transaction service (log and service die together, as kill -9 of that process); then the same process
    without it, on the same directories."""
    with local_process(tmp_path / "log", f"{name}=exit") as first:
        txn_address = started_local(first)
        with grpc.insecure_channel(first.address) as log_channel, grpc.insecure_channel(txn_address) as channel:
            commitlog_pb2_grpc.CommitLogStub(log_channel).CreateTopic(
                cpb.CreateTopicRequest(name="orders", queue_count=1), timeout=RPC_S)
            stub = txn_pb2_grpc.TransactionStub(channel)
            wait_until(lambda: _ready(stub) or first.process.poll() is not None, "the first process")
            done, in_flight, step = _workload(stub, via)
        assert first.wait_exit() == 137, f"{name} was never reached: {first.stderr()[-2000:]}"
    with local_process(tmp_path / "log") as second:
        txn_address = started_local(second)
        with grpc.insecure_channel(second.address) as log_channel, grpc.insecure_channel(txn_address) as channel:
            stub = txn_pb2_grpc.TransactionStub(channel)
            if name == "txn.commit.after_real":  # recognised as committed from its COMMIT records
                wait_until(lambda: _ready(stub), "the txn service to recover")
                assert (in_flight, step) == ("t0", "commit")
                assert _state(stub, "t0") == txn_pb2.TRANSACTION_STATE_COMMITTED
            _check_after(stub, commitlog_pb2_grpc.CommitLogStub(log_channel), done, in_flight, step)


def _state(stub, txn_id: str) -> int:
    return stub.Show(txn_pb2.ShowRequest(transaction_id=txn_id), timeout=RPC_S).state


def _check_after(stub, log_stub, done: dict[str, str], in_flight: str, step: str) -> None:
    wait_until(lambda: _ready(stub), "the txn service to recover")
    expected = {"commit": txn_pb2.TRANSACTION_STATE_COMMITTED, "rollback": txn_pb2.TRANSACTION_STATE_ROLLED_BACK}
    for txn_id, outcome in done.items():
        assert _state(stub, txn_id) == expected[outcome], (txn_id, outcome)
    if in_flight:
        try:
            state = _state(stub, in_flight)
        except grpc.RpcError as exc:  # the halves never reached the log
            assert step == "prepare" and exc.code() == grpc.StatusCode.NOT_FOUND
        else:
            assert state in (txn_pb2.TRANSACTION_STATE_OPEN, expected.get(step, txn_pb2.TRANSACTION_STATE_OPEN))
            final = "commit" if step in ("prepare", "commit") else "rollback"
            getattr(stub, final.capitalize())(txn_pb2.EndRequest(transaction_id=in_flight), timeout=RPC_S)
            done[in_flight] = final
    seen = _visible(log_stub)
    for txn_id, outcome in done.items():
        for n in range(2):
            assert seen[f"{txn_id}-{n}".encode()] == (1 if outcome == "commit" else 0), (txn_id, outcome, seen)
    assert sum(seen.values()) == 2 * sum(1 for o in done.values() if o == "commit")  # nothing else, nothing twice
    wait_until(lambda: stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_S).op_pending_entries == 0, "OPs written")
    assert stub.Stats(txn_pb2.TxnStatsRequest(), timeout=RPC_S).open == 0
