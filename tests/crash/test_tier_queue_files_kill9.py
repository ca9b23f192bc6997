"""Consume queue files in the object storage tier with a real commit log process, on a file:// tier and on a real
S3-compatible server (moto's server mode on 127.0.0.1, one per module) (issue 36's whole-topic local disk): the
process dies (os._exit, as kill -9) after a queue file's object was put but before its FINISHED record; after a
restart every uploaded file is FINISHED once, byte-identical, with no other object; with --local-retention-bytes
the uploaded commit log segments and queue files leave the local disk, and a Pull from offset 0 returns every
acknowledged message byte-identical (entries and records read from the tier); so it does after kill -9 and
another restart, whose map of the queue's tiered files comes from the ledger in the log (no local file below)."""

from __future__ import annotations

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.s3 import moto_s3
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.integration]

SEGMENT = 64 * 1024
ENTRIES = 32  # entries per consume queue file: 640 bytes
BODY = 1000


PREFIX = "node1"


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


class FileTier:
    def __init__(self, tmp_path):
        self.dir = tmp_path / "tier"
        self.dir.mkdir()
        self.url, self.env = f"file://{self.dir}", {}
        self.batches, self.files_gone = 40, 8  # ~10 segments and ~20 queue files in all; queue files deleted

    def queue_objects(self) -> dict[str, bytes]:
        """key -> bytes of the objects of queue t/0's files: as LocalBackend.list sees them, without the temp
        file of a put still being written (``.<name>.<uuid>.tmp``, linked to the object's name once whole)."""
        return {str(p.relative_to(self.dir)): p.read_bytes() for p in (self.dir / "consumequeue" / "t" / "0").rglob("*")
                if p.is_file() and not p.name.startswith(".")}


class S3Tier:
    def __init__(self, s3):
        self.s3, self.bucket = s3, s3.bucket()
        self.url, self.env = f"s3://{self.bucket}/{PREFIX}", s3.env()
        self.batches, self.files_gone = 24, 6  # fewer: moto answers slower than a local directory

    def queue_objects(self) -> dict[str, bytes]:
        found = self.s3.objects(self.bucket, f"{PREFIX}/consumequeue/t/0/")
        return {key[len(PREFIX) + 1:]: data for key, data in found.items()}


@pytest.fixture(params=["file", "s3"])
def tier(request, tmp_path):
    return FileTier(tmp_path) if request.param == "file" else S3Tier(request.getfixturevalue("s3"))


def _spawn(data_dir, tier, failpoints=""):
    return commitlog(data_dir, "--tier-url", tier.url, "--tier-upload-interval-ms", "100",
                     "--segment-size-bytes", str(SEGMENT), "--warm-ahead-bytes", "0",
                     "--cq-entries-per-file", str(ENTRIES), "--local-retention-bytes", str(2 * SEGMENT),
                     "--flush-interval-ms", "20", "--checkpoint-interval-ms", "100",
                     env={**tier.env, **({"MQSTORE_FAILPOINTS": failpoints} if failpoints else {})}).started()


def _files(directory) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _append(stub, batches: range, bodies: list[bytes], unsure: list[bytes] | None = None) -> bool:
    """Append 16 x 1 KB a batch; the acknowledged bodies go to ``bodies``. False once the process died; the batch
    it was sent then goes to ``unsure`` (it may have landed whole before the exit, its answer lost, or not at all)."""
    for batch in batches:
        more = [f"{batch}:{i}:".encode() + bytes([(batch * 16 + i) % 251]) * BODY for i in range(16)]
        try:
            stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b) for b in more]),
                        timeout=10)
        except grpc.RpcError:
            if unsure is not None:
                unsure += more
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


def test_a_kill_between_the_phases_loses_nothing_and_pull_from_zero_is_byte_identical_from_the_tier(tmp_path, tier):
    data_dir = tmp_path / "node"
    queue_dir = data_dir / "consumequeue" / "t" / "0"
    bodies: list[bytes] = []
    unsure: list[bytes] = []  # the batch in flight when the process exited
    node = _spawn(data_dir, tier, "tier.upload.queue_file.after_put=exit")
    try:
        with grpc.insecure_channel(node.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
            # ~16 segments and ~32 sealed queue files, unless it died before: then it dies at its first queue
            # file's put (the uploader may reach it after the appends on a loaded machine, moto slower)
            _append(stub, range(64), bodies, unsure)
        assert node.wait_exit(120) == 137, node.stderr()
    finally:
        node.stop()
    assert len(tier.queue_objects()) == 1  # put, never FINISHED
    node = _spawn(data_dir, tier)
    try:
        with grpc.insecure_channel(node.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            assert _append(stub, range(1000, 1000 + tier.batches), bodies)
            wait_until(lambda: _files(queue_dir)[0] >= tier.files_gone * ENTRIES * 20,
                       "local retention deleted queue files", 60)
            assert _files(data_dir / "commitlog")[0] >= 4 * SEGMENT
            by_base: dict[int, list] = {}
            for key, data in tier.queue_objects().items():  # consumequeue/t/0/<base>/<upload id>
                by_base.setdefault(int(key.split("/")[-2]), []).append(data)
                assert len(data) == ENTRIES * 20  # whole
            assert all(len(objects) == 1 for objects in by_base.values())  # one object a file: the cut one finished
            assert min(by_base) == 0 and len(by_base) >= tier.files_gone
            acked_first = len(bodies) - 16 * tier.batches  # what the first process acknowledged
            landed = bodies[:acked_first] + unsure + bodies[acked_first:]  # its batch in flight landed whole
            assert _pull_all(stub) in (bodies, landed)
        node.kill9()
        node.stop()  # reaps it and closes its pipes
        node = _spawn(data_dir, tier)
        assert _files(queue_dir)[0] > 0  # nothing local below: the ledger maps the tiered files
        with grpc.insecure_channel(node.address) as channel:
            assert _pull_all(commitlog_pb2_grpc.CommitLogStub(channel)) == bodies
    finally:
        node.stop()
