"""Consumer offsets survive kill -9 of the commit log (mqstore.consumer_offsets): committers stream
CommitOffsets, the process is killed at a random moment, several times; after each restart every
acknowledged commit reads back (QueryOffset), never an older value: a key's offset is its last acknowledged
commit, or the one commit that was in flight when the process died (it may have reached the log)."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog

pytestmark = [pytest.mark.crash, pytest.mark.slow]

COMMITTERS = 6
QUEUES = 4
MESSAGES_PER_QUEUE = 3000
CYCLES = 3
COMMIT_WINDOW_S = 2.0


def _stub(address):
    channel = grpc.insecure_channel(address)
    return channel, commitlog_pb2_grpc.CommitLogStub(channel)


def _committer(address, group, start, acked, pending, stop):
    """Commit 1, 2, 3... (from ``start``) for every queue of ``group`` in turn, one call at a time."""
    channel, stub = _stub(address)
    try:
        offset = start
        while not stop.is_set() and offset < MESSAGES_PER_QUEUE:
            offset += 1
            for queue_id in range(QUEUES):
                key = (group, queue_id)
                pending[key] = offset
                try:
                    stub.CommitOffset(pb.CommitOffsetRequest(group=group, topic="t", queue_id=queue_id, offset=offset),
                                      timeout=10)
                except grpc.RpcError:
                    return  # the server died: this commit was not acknowledged
                acked[key] = offset
    finally:
        channel.close()


def _check(address, acked, pending) -> int:
    """Every key reads back its last acknowledged offset or the one in flight at the kill; returns the
    lowest offset read (where the committers go on from)."""
    channel, stub = _stub(address)
    try:
        lowest = MESSAGES_PER_QUEUE
        for (group, queue_id), offset in sorted(acked.items()):
            got = stub.QueryOffset(pb.QueryOffsetRequest(group=group, topic="t", queue_id=queue_id), timeout=10).offset
            assert got in (offset, pending[(group, queue_id)]), \
                f"{group}/{queue_id}: read {got}, acknowledged {offset}, in flight {pending[(group, queue_id)]}"
            acked[(group, queue_id)] = pending[(group, queue_id)] = got
            lowest = min(lowest, got)
        return lowest
    finally:
        channel.close()


def test_kill9_during_commits_loses_no_acknowledged_offset(tmp_path):
    data = tmp_path / "data"
    acked: dict = {}
    pending: dict = {}
    commits = 0
    for cycle in range(CYCLES):
        server = commitlog(data, "--segment-size-bytes", "65536").started()
        try:
            start = 0
            if cycle == 0:
                channel, stub = _stub(server.address)
                stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=QUEUES), timeout=10)
                for queue_id in range(QUEUES):
                    for _ in range(MESSAGES_PER_QUEUE // 500):
                        stub.Append(pb.AppendRequest(topic="t", messages=[
                            common_pb2.MessageInput(body=b"m", queue_id=queue_id)] * 500), timeout=30)
                channel.close()
            else:
                start = _check(server.address, acked, pending)
            before = sum(acked.values())
            stop = threading.Event()
            threads = [threading.Thread(target=_committer, args=(server.address, f"g{c}", start, acked, pending, stop))
                       for c in range(COMMITTERS)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + COMMIT_WINDOW_S + cycle * 0.37
            while time.monotonic() < deadline:
                time.sleep(0.05)  # pacing the load window, not synchronising on an event
            server.kill9()
            stop.set()
            for t in threads:
                t.join(30)
            commits += sum(acked.values()) - before
        finally:
            server.stop()
    print(f"acknowledged commits over {CYCLES} kill cycles: {commits}")
    assert commits >= CYCLES * 100, "the committers made real progress before each kill"
    server = commitlog(data, "--segment-size-bytes", "65536").started()
    try:
        started = [json.loads(line) for line in server.lines if '"store.started"' in line]
        assert started and started[-1]["unclean"] is True, server.stderr()
        _check(server.address, acked, pending)
    finally:
        server.stop()
