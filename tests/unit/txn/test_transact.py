"""Transact streams' own rules (mqstore.txn.transact): at most max_streams open, a slot given back however a
stream ends; a one-way end applied as the two-way call (a rollback without waiting for its OP record), on the
thread that asks before it returns, its failure (a refused guard, the call's) counted and logged, never
raised; the one-way workers' flags gone, refused as unknown. And the one mapping of a frame's error
(mqstore_rpc.errors)."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from mqstore.errors import (FailedPrecondition, InvariantViolation, NotFound, PermissionDenied, ResourceExhausted,
                            Unavailable)
from mqstore_rpc.errors import FrameStatus, frame_outcome
from mqstore.txn.transact import BY_ONE_WAY, TransactStreams
from txn_service.main import parse_config


class Coordinator:
    """What TransactStreams calls, recording the calls; ``fail`` makes them raise."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[tuple] = []
        self.fail = fail

    def commit(self, txn_id, by="producer", wait_durable=True):
        self.calls.append(("commit", txn_id, by, wait_durable))
        if self.fail:
            raise self.fail

    def rollback(self, txn_id, by="producer", wait_durable=True):
        self.calls.append(("rollback", txn_id, by, wait_durable))
        if self.fail:
            raise self.fail

    thread_io = "thread io"  # the real one's: every call waits on the thread

    async def end_async(self, io, decision, txn_id, by="producer"):
        """The one version of a one-way end (the real Coordinator.end_async: wait_durable False)."""
        assert io == self.thread_io, "a one-way end on a thread runs with the coordinator's thread io"
        return (self.commit if decision == "COMMIT" else self.rollback)(txn_id, by, False)


def test_streams_beyond_the_limit_are_refused_and_every_end_gives_its_slot_back():
    streams = TransactStreams(Coordinator(), max_streams=2)
    with streams.opened(), streams.opened():
        assert streams.open_streams() == 2
        with pytest.raises(ResourceExhausted, match="max_transact_streams"), streams.opened():
            pass
    assert streams.open_streams() == 0
    with pytest.raises(RuntimeError), streams.opened():  # a stream that ends with an error
        raise RuntimeError("the producer went away")
    assert streams.open_streams() == 0


def test_one_way_ends_are_applied_as_their_calls_without_waiting_for_the_op_record():
    coordinator = Coordinator()
    streams = TransactStreams(coordinator, max_streams=1)
    streams.end_one_way("t-1", "COMMIT")
    streams.end_one_way("t-2", "ROLLBACK")
    assert coordinator.calls == [("commit", "t-1", BY_ONE_WAY, False), ("rollback", "t-2", BY_ONE_WAY, False)]
    assert (streams.one_way_ends, streams.one_way_failures) == (2, 0)
    with pytest.raises(InvariantViolation):
        streams.end_one_way("t-3", "UNKNOWN")


@pytest.mark.parametrize("error", [FailedPrecondition("transaction t is ROLLED_BACK"), NotFound("unknown"),
                                   Unavailable("recovering")])
def test_a_failed_one_way_end_is_counted_not_raised(error):
    streams = TransactStreams(Coordinator(fail=error), max_streams=1)
    streams.end_one_way("t", "COMMIT")
    assert (streams.one_way_ends, streams.one_way_failures) == (1, 1)


def test_a_failed_one_way_end_that_is_a_bug_is_raised():
    streams = TransactStreams(Coordinator(fail=KeyError("bug")), max_streams=1)
    with pytest.raises(KeyError):
        streams.end_one_way("t", "COMMIT")


def test_a_frame_gets_the_status_its_call_would_end_with():
    async def behave(error):
        raise error

    async def add(a, b):
        return a + b

    async def bug():
        return 1 / 0

    def outcome(*args):
        return asyncio.run(frame_outcome("/m", *args))
    assert outcome(add, 1, 2) == 3
    assert outcome(behave, NotFound("transaction 't' is unknown")) == FrameStatus(
        grpc.StatusCode.NOT_FOUND, "transaction 't' is unknown", False)
    assert outcome(behave, Unavailable("recovering")).retriable
    with pytest.raises(ZeroDivisionError):  # a bug is not an answer: it ends the stream as INTERNAL
        outcome(bug)


def test_the_server_gets_a_handler_thread_per_admitted_stream_unless_told(tmp_path):
    default = parse_config(["--data-dir", str(tmp_path), "--max-transact-streams", "10", "--max-check-streams", "5"],
                           {})
    assert default.server.max_workers == 64 + 10 + 5  # the unary calls' threads stay free while streams are open
    assert parse_config(["--data-dir", str(tmp_path), "--max-workers", "16"], {}).server.max_workers == 16


class Recording(Coordinator):
    """Records the thread each call ran on."""

    def __init__(self, fail: Exception | None = None):
        super().__init__(fail)
        self.threads: list[int] = []

    def commit(self, txn_id, by="producer", wait_durable=True):
        self.threads.append(threading.get_ident())
        super().commit(txn_id, by, wait_durable)


def test_a_one_way_end_on_a_thread_is_applied_on_that_thread_before_it_returns():
    coordinator = Recording()
    streams = TransactStreams(coordinator, max_streams=1)  # a frame placed in the pool (Local mode)
    streams.end_one_way("t-1", "COMMIT")
    assert coordinator.calls == [("commit", "t-1", BY_ONE_WAY, False)]  # applied already, on this thread
    assert coordinator.threads == [threading.get_ident()]
    def refuse():
        raise PermissionDenied("user u lacks PUB on topic orders")
    streams.end_one_way("t-2", "COMMIT", guard=refuse)  # refused: counted, never applied, never raised
    failing = TransactStreams(Recording(fail=Unavailable("recovering")), max_streams=1)
    failing.end_one_way("t-3", "COMMIT")
    assert (streams.one_way_ends, streams.one_way_failures) == (2, 1)
    assert (failing.one_way_ends, failing.one_way_failures) == (1, 1)
    assert [c[1] for c in coordinator.calls] == ["t-1"]


@pytest.mark.parametrize("flag", ["--one-way-workers", "--one-way-queue"])
def test_the_one_way_workers_flags_are_gone_and_refused(tmp_path, flag, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_config(["--data-dir", str(tmp_path), flag, "3"], {})
    assert exited.value.code == 2 and f"unrecognized arguments: {flag} 3" in capsys.readouterr().err
