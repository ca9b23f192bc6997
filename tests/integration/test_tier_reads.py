"""Local retention and transparent reads from the object storage tier with a real commit log process and a real
S3-compatible server (moto's server mode on 127.0.0.1, behind a TCP proxy that can stall it), one process for
the module: messages appended across several 1 MiB segments are uploaded, local retention
(--local-retention-bytes) deletes the sealed local files, and a Pull from offset 0 returns every message
byte-identical from the tier; with the tier stalled, a Pull of data only in the tier is UNAVAILABLE naming the
tier within its deadline while a Pull of the local tail answers at once."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.s3 import moto_s3
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration]

SEGMENT = 1 << 20
DEADLINE_MS = 4000
BODY = 8000


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """(node, stub, proxy, bodies appended, data dir): ~4.5 MB appended, uploaded, the local copies deleted."""
    with moto_s3() as s3:
        host, port = s3.endpoint.removeprefix("http://").split(":")
        proxy = TcpProxy((host, int(port)))
        bucket, data_dir = s3.bucket(), tmp_path_factory.mktemp("tierread") / "node"
        env = {**s3.env(), "AWS_ENDPOINT_URL": f"http://{proxy.address}"}
        node = commitlog(data_dir, "--tier-url", f"s3://{bucket}/n1", "--tier-upload-interval-ms", "100",
                         "--segment-size-bytes", str(SEGMENT), "--warm-ahead-bytes", "0",
                         "--local-retention-bytes", str(2 * SEGMENT), "--tier-call-timeout-ms", str(DEADLINE_MS),
                         "--tier-read-ahead-bytes", str(256 << 10), "--tier-cache-bytes", str(512 << 10),
                         env=env).started()
        channel = grpc.insecure_channel(node.address)
        try:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
            bodies = []
            for batch in range(70):  # 70 x 8 x 8 KB: ~4.5 MB, four segments and a bit
                more = [f"{batch}:{i}:".encode() + bytes([(batch * 8 + i) % 251]) * BODY for i in range(8)]
                stub.Append(pb.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b) for b in more]),
                            timeout=10)
                bodies += more
            yield node, stub, proxy, bodies, data_dir
        finally:
            proxy.heal()
            channel.close()
            node.stop()
            proxy.close()


def _local_files(data_dir) -> list[int]:
    return sorted(int(path.name) for path in (data_dir / "commitlog").iterdir() if path.name.isdigit())


def test_local_retention_deletes_uploaded_segments_and_pull_from_zero_reads_them_byte_identical(rig):
    node, stub, _, bodies, data_dir = rig
    wait_until(lambda: _local_files(data_dir)[0] >= 2 * SEGMENT, "local retention deleted the first two segments", 60)
    assert len(_local_files(data_dir)) <= 4  # about 2 MiB kept, plus the active and a sealed one in flight
    got, offset = [], 0
    for _ in range(1000):  # bounded
        response = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=offset, max_messages=64,
                                            max_bytes=4 << 20), timeout=30)
        if not response.messages:
            break
        assert response.min_offset == 0  # the logical log is the total retention's
        got += [m.body for m in response.messages]
        offset = response.next_offset
    assert len(got) == len(bodies) and got == bodies
    first = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=1), timeout=30).messages[0]
    assert first.physical_offset < _local_files(data_dir)[0]
    assert stub.GetMessage(pb.GetMessageRequest(physical_offset=first.physical_offset), timeout=30).body \
        == bodies[0]


def test_a_stalled_tier_is_unavailable_within_its_deadline_while_the_local_tail_answers(rig):
    node, stub, proxy, bodies, data_dir = rig
    wait_until(lambda: _local_files(data_dir)[0] >= 2 * SEGMENT, "local retention deleted segments", 60)
    tail = len(bodies) - 5
    assert stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=tail), timeout=30).messages  # local, cached
    proxy.partition()
    try:
        outcome: dict = {}

        def tier_pull():
            started = time.monotonic()
            try:
                # ~1.6 MB into the log: in segment 1, a block the cache of 512 KiB does not hold now
                stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=200, max_messages=1), timeout=60)
                outcome["error"] = None
            except grpc.RpcError as exc:
                outcome["error"] = exc
            outcome["seconds"] = time.monotonic() - started
        waiting = threading.Thread(target=tier_pull)
        waiting.start()
        time.sleep(0.3)  # not a wait for a condition: gives the tier pull time to be inside its GET
        started = time.monotonic()
        local = stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=tail, max_messages=5), timeout=30)
        local_s = time.monotonic() - started
        assert [m.body for m in local.messages] == bodies[tail:]
        assert "seconds" not in outcome, "the tier pull ended before the local one: not a read that waits"
        assert local_s < DEADLINE_MS / 1000 / 2  # answered while the tier read waits, not after its deadline
        waiting.join(30)
        error = outcome["error"]
        assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE, error
        assert "object storage tier s3://" in error.details() and outcome["seconds"] < DEADLINE_MS / 1000 + 5
    finally:
        proxy.heal()
