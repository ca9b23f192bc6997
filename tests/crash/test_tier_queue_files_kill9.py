"""Consume queue files in the object storage tier with a real commit log process and a file:// tier (issue 36's
whole-topic local disk): the process dies (os._exit, as kill -9) after a queue file's object was put but before
its FINISHED record; after a restart every uploaded file is FINISHED once, byte-identical, with no other object;
with --local-retention-bytes the uploaded commit log segments and queue files leave the local disk, and a Pull
from offset 0 returns every acknowledged message byte-identical (entries and records read from the tier); so it
does after kill -9 and another restart, whose map of the queue's tiered files comes from the ledger in the log
(no local file below)."""

from __future__ import annotations

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.integration]

SEGMENT = 64 * 1024
ENTRIES = 32  # entries per consume queue file: 640 bytes
BODY = 1000


def _spawn(data_dir, tier_dir, failpoints=""):
    return commitlog(data_dir, "--tier-url", f"file://{tier_dir}", "--tier-upload-interval-ms", "100",
                     "--segment-size-bytes", str(SEGMENT), "--warm-ahead-bytes", "0",
                     "--cq-entries-per-file", str(ENTRIES), "--local-retention-bytes", str(2 * SEGMENT),
                     "--flush-interval-ms", "20", "--checkpoint-interval-ms", "100",
                     env={"MQSTORE_FAILPOINTS": failpoints} if failpoints else None).started()


def _files(directory) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _append(stub, batches: range, bodies: list[bytes]) -> bool:
    """Append 16 x 1 KB a batch; the acknowledged bodies go to ``bodies``. False once the process died."""
    for batch in batches:
        more = [f"{batch}:{i}:".encode() + bytes([(batch * 16 + i) % 251]) * BODY for i in range(16)]
        try:
            stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b) for b in more]),
                        timeout=10)
        except grpc.RpcError:
            return False
        bodies += more
    return True


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


def test_a_kill_between_the_phases_loses_nothing_and_pull_from_zero_is_byte_identical_from_the_tier(tmp_path):
    data_dir, tier_dir = tmp_path / "node", tmp_path / "tier"
    tier_dir.mkdir()
    queue_dir, objects_dir = data_dir / "consumequeue" / "t" / "0", tier_dir / "consumequeue" / "t" / "0"
    bodies: list[bytes] = []
    node = _spawn(data_dir, tier_dir, "tier.upload.queue_file.after_put=exit")
    try:
        with grpc.insecure_channel(node.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
            assert not _append(stub, range(400), bodies)  # bounded: it dies at its first queue file's put
        assert node.wait_exit(60) == 137, node.stderr()
    finally:
        node.stop()
    assert len([p for p in objects_dir.rglob("*") if p.is_file()]) == 1  # put, never FINISHED
    node = _spawn(data_dir, tier_dir)
    try:
        with grpc.insecure_channel(node.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            assert _append(stub, range(1000, 1040), bodies)  # ~10 segments and ~20 queue files in all
            wait_until(lambda: _files(queue_dir)[0] >= 8 * ENTRIES * 20, "local retention deleted queue files", 60)
            assert _files(data_dir / "commitlog")[0] >= 4 * SEGMENT
            by_base: dict[int, list] = {}
            for path in objects_dir.rglob("*"):
                if path.is_file():
                    by_base.setdefault(int(path.parent.name), []).append(path)
            assert all(len(paths) == 1 for paths in by_base.values())  # one object a file: the cut one finished
            assert _pull_all(stub) == bodies
        node.kill9()
        node.stop()  # reaps it and closes its pipes
        node = _spawn(data_dir, tier_dir)
        assert _files(queue_dir)[0] > 0  # nothing local below: the ledger maps the tiered files
        with grpc.insecure_channel(node.address) as channel:
            assert _pull_all(commitlog_pb2_grpc.CommitLogStub(channel)) == bodies
    finally:
        node.stop()
