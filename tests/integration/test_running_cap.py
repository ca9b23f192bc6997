"""The CommitLog server with its running calls capped (max_running_handlers, mqstore_rpc.executor): calls that
wait (long polls, a Tail stream, a client stream waiting for its next item, SYNC appends waiting for their
fsync) never keep the others from running, even with a cap of one; nor do the Local-mode Transaction port's
streams, whose every frame waits for a place (Transact streams, two-way Rollbacks waiting for their OP
record, a CheckBack stream). Liveness only: every wait here is for a result that must come, bounded by a
deadline; no timing is asserted."""

from __future__ import annotations

import concurrent.futures
import pathlib
import threading

import grpc
import pytest

from commitlog_service.main import CommitLogConfig, parse_config, serving
from mqstore.config import FLUSH_SYNC, StoreConfig
from mqstore.errors import InvalidArgument
from mqstore_rpc.executor import RUNNING
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
from mqstore_rpc.server import ServerConfig

RPC_TIMEOUT_S = 30
LONG_POLL_MS = 20_000
QUEUES = 4


@pytest.fixture
def stub(tmp_path: pathlib.Path):
    store = StoreConfig(data_dir=tmp_path / "data", segment_size_bytes=4 << 20, preallocate_segments=False,
                        flush_mode=FLUSH_SYNC)
    config = CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=1.0, max_running_handlers=1))
    with serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield commitlog_pb2_grpc.CommitLogStub(channel)


def test_waiting_calls_never_hold_the_only_place(stub):
    stub.CreateTopic(pb.CreateTopicRequest(name="capped", queue_count=QUEUES), timeout=RPC_TIMEOUT_S)
    release_stream = threading.Event()

    def one_item_later():
        release_stream.wait(RPC_TIMEOUT_S)  # the client stream's handler waits for this item meanwhile
        yield pb.AppendRequest(topic="capped", messages=[common_pb2.MessageInput(body=b"streamed", queue_id=0)])

    with concurrent.futures.ThreadPoolExecutor(max_workers=QUEUES + 2) as pool:
        polls = [pool.submit(stub.Pull, pb.PullRequest(topic="capped", queue_id=q, offset=0, long_poll_ms=LONG_POLL_MS),
                             timeout=RPC_TIMEOUT_S + LONG_POLL_MS / 1000) for q in range(QUEUES)]
        tail = stub.Tail(pb.TailRequest(topics=["capped"], heartbeat_ms=100), timeout=RPC_TIMEOUT_S * 2)
        streamed = pool.submit(stub.AppendStream, one_item_later(), timeout=RPC_TIMEOUT_S * 2)
        # With one place and six calls waiting, SYNC appends (each waiting for its fsync) still run.
        for q in range(QUEUES):
            response = stub.Append(pb.AppendRequest(topic="capped", messages=[
                common_pb2.MessageInput(body=b"to %d" % q, queue_id=q)]), timeout=RPC_TIMEOUT_S)
            assert response.results[0].durability == common_pb2.DURABILITY_FLUSHED
        for q, poll in enumerate(polls):
            assert [m.body for m in poll.result(RPC_TIMEOUT_S + LONG_POLL_MS / 1000).messages] == [b"to %d" % q]
        seen = 0
        for frame in tail:
            seen += frame.record_count
            if seen >= QUEUES:
                break
        tail.cancel()
        release_stream.set()
        assert len(streamed.result(RPC_TIMEOUT_S * 2).results) == 1


def test_concurrent_sync_appends_all_complete_under_a_cap_of_one(stub):
    stub.CreateTopic(pb.CreateTopicRequest(name="group", queue_count=1), timeout=RPC_TIMEOUT_S)
    producers, calls = 16, 5

    def produce(i: int) -> list[int]:
        out = []
        for c in range(calls):
            response = stub.Append(pb.AppendRequest(topic="group", messages=[
                common_pb2.MessageInput(body=b"%d-%d" % (i, c))]), timeout=RPC_TIMEOUT_S)
            assert response.results[0].durability == common_pb2.DURABILITY_FLUSHED
            out.append(response.results[0].queue_offset)
        return out

    with concurrent.futures.ThreadPoolExecutor(max_workers=producers) as pool:
        offsets = [o for f in [pool.submit(produce, i) for i in range(producers)] for o in f.result(RPC_TIMEOUT_S * 4)]
    assert sorted(offsets) == list(range(producers * calls))


def test_the_commit_log_caps_its_running_calls_by_default_other_services_do_not(tmp_path):
    env = {"MQSTORE_DATA_DIR": str(tmp_path)}
    assert parse_config([], env).server.max_running_handlers == RUNNING
    assert parse_config(["--max-running-handlers", "0"], env).server.max_running_handlers == 0
    assert parse_config([], {**env, "MQSTORE_MAX_RUNNING_HANDLERS": "2"}).server.max_running_handlers == 2
    assert ServerConfig().max_running_handlers == 0
    with pytest.raises(InvalidArgument, match="max_running_handlers must be 0"):
        ServerConfig(max_running_handlers=-1)


def test_transact_streams_all_progress_on_a_local_transaction_port_capped_at_one(tmp_path):
    """16 producers' Transact streams (Prepares carrying the previous Commit) and 4 that roll back two-way
    (answered once the OP record is durable), with a CheckBack stream open, on a SYNC commit log whose ports
    are both capped at one running call: every transaction ends as its producer asked."""
    from tests.integration.test_txn_checkback import Producer
    from tests.integration.txn_testing import Frames, stats, txn_stack
    from tests.support.waiting import wait_until
    from mqstore_rpc.gen.mqstore.v1 import txn_pb2

    producers, rounds = 16, 4
    with txn_stack(tmp_path, "local", {"orders": QUEUES}, max_running_handlers=1, flush_mode=FLUSH_SYNC,
                   op_batch_interval_ms=200) as parts:
        checkback = Producer(parts.txn, "pg", lambda check: None)  # open, never answering: it only waits

        def carrying(i: int) -> list[str]:
            frames, ids, ends = Frames(parts.txn), [], []
            for r in range(rounds):
                answer = frames.prepare("orders", [b"%d-%d" % (i, r)], ends=ends)
                ids.append(answer.prepared.transaction_id)
                ends = [txn_pb2.CarriedEnd(transaction_id=ids[-1], decision=txn_pb2.DECISION_COMMIT)]
            frames.send(ends=ends)
            assert frames.close() == []
            return ids

        def rolling_back(i: int) -> str:
            frames = Frames(parts.txn)
            txn_id = frames.prepare("orders", [b"never %d" % i]).prepared.transaction_id
            ended = frames.ask(rollback=txn_pb2.EndRequest(transaction_id=txn_id)).ended
            assert ended.state == txn_pb2.TRANSACTION_STATE_ROLLED_BACK
            assert frames.close() == []
            return txn_id

        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=producers + 4) as pool:
                committed = [pool.submit(carrying, i) for i in range(producers)]
                rolled = [pool.submit(rolling_back, i) for i in range(4)]
                ids = [t for f in committed for t in f.result(RPC_TIMEOUT_S * 4)]
                assert len({f.result(RPC_TIMEOUT_S * 4) for f in rolled}) == 4
            wait_until(lambda: stats(parts.txn).committed == len(ids), "the carried commits to be applied")
            assert (stats(parts.txn).committed, stats(parts.txn).rolled_back) == (producers * rounds, 4)
            assert stats(parts.txn).one_way_failures == 0
        finally:
            checkback.close()
