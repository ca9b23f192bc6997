"""Consume queue files in the object storage tier with a real commit log process and a file:// tier (issue 36's
whole-topic local disk), one process life pair for the module: with --local-retention-bytes the uploaded commit
log segments and consume queue files leave the local disk, a Pull from offset 0 returns every message
byte-identical (entries and records read from the tier), and so it does after kill -9 and a restart, whose
map of the queue's tiered files comes from the ledger in the log (no local file below)."""

from __future__ import annotations

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration]

SEGMENT = 64 * 1024
ENTRIES = 32  # entries per consume queue file: 640 bytes
BODY = 1000


def _spawn(data_dir, tier_dir):
    return commitlog(data_dir, "--tier-url", f"file://{tier_dir}", "--tier-upload-interval-ms", "100",
                     "--segment-size-bytes", str(SEGMENT), "--warm-ahead-bytes", "0",
                     "--cq-entries-per-file", str(ENTRIES), "--local-retention-bytes", str(2 * SEGMENT),
                     "--flush-interval-ms", "20", "--checkpoint-interval-ms", "100").started()


def _files(directory) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _pull_all(stub) -> list[bytes]:
    got, offset = [], 0
    for _ in range(1000):  # bounded
        response = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=offset, max_messages=64,
                                            max_bytes=4 << 20), timeout=30)
        if not response.messages:
            return got
        assert response.min_offset == 0  # the total retention's, not the local files'
        got += [m.body for m in response.messages]
        offset = response.next_offset
    raise AssertionError("pull did not end")


def test_pull_from_zero_is_byte_identical_after_local_queue_and_log_files_are_gone_and_after_kill9(tmp_path):
    data_dir, tier_dir = tmp_path / "node", tmp_path / "tier"
    tier_dir.mkdir()
    queue_dir = data_dir / "consumequeue" / "t" / "0"
    node = _spawn(data_dir, tier_dir)
    try:
        with grpc.insecure_channel(node.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
            bodies = []
            for batch in range(40):  # 40 x 16 x 1 KB: ~10 segments, ~20 queue files
                more = [f"{batch}:{i}:".encode() + bytes([(batch * 16 + i) % 251]) * BODY for i in range(16)]
                stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b) for b in more]),
                            timeout=10)
                bodies += more
            wait_until(lambda: _files(queue_dir)[0] >= 8 * ENTRIES * 20, "local retention deleted queue files", 60)
            assert _files(data_dir / "commitlog")[0] >= 4 * SEGMENT
            assert any((tier_dir / "consumequeue" / "t" / "0").iterdir())
            assert _pull_all(stub) == bodies
        node.kill9()
        node.stop()  # reaps it and closes its pipes
        node = _spawn(data_dir, tier_dir)
        assert _files(queue_dir)[0] > 0  # nothing local below: the ledger maps the tiered files
        with grpc.insecure_channel(node.address) as channel:
            assert _pull_all(commitlog_pb2_grpc.CommitLogStub(channel)) == bodies
    finally:
        node.stop()
