"""Local retention and transparent reads from the object storage tier with a real commit log process and a real
S3-compatible server (moto's server mode on 127.0.0.1, behind a TCP proxy that can stall it), one process for
the module: messages appended across several 1 MiB segments are uploaded, local retention
(--local-retention-bytes) deletes the sealed local files, and a Pull from offset 0 returns every message
byte-identical from the tier, and a Tail from the earliest offset too; with the tier stalled, a Pull of data
only in the tier is UNAVAILABLE naming the tier within its deadline while a Pull of the local tail answers at
once; GetTierStatus, `mqstore tier status` and the tier's metrics on the Prometheus endpoint show the uploads,
the local and tiered bytes and the reads."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading
import time

import grpc
import pytest

from mqstore.format import record_reader
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.s3 import moto_s3
from tests.support.scrape import scrape
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
                         "--metrics-port", "0", env=env).started()
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
    stream = stub.Tail(pb.TailRequest(start=pb.TAIL_START_EARLIEST, topics=["t"], max_frame_bytes=256 << 10),
                       timeout=60)
    tailed = []
    try:
        for frame in stream:  # bounded by the deadline and the count
            tailed += [bytes(view.body) for view in record_reader.records(frame.records)]
            if len(tailed) >= len(bodies):
                break
    finally:
        stream.cancel()
    assert tailed == bodies  # Tail from the earliest offset reads the tier, then the local log


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


def test_tier_status_cli_and_metrics_show_uploads_local_and_tiered_bytes_and_reads(rig):
    node, stub, _, bodies, data_dir = rig
    wait_until(lambda: _local_files(data_dir)[0] >= 2 * SEGMENT, "local retention deleted segments", 60)
    assert stub.Pull(pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=1), timeout=30).messages  # tier

    def settled():  # every sealed segment uploaded, and the local files are the ones the status lists
        s = stub.GetTierStatus(pb.GetTierStatusRequest(segments=True), timeout=30)
        local = {r.base for r in s.segments if r.local}
        return s.copy_lag_segments == 0 and local == set(_local_files(data_dir)) and s
    status = wait_until(settled, "every sealed segment uploaded", 60)
    assert status.tier_url.startswith("s3://") and status.leader and status.pending_uploads == 0
    tiered = [r for r in status.segments if r.tiered]
    assert len(tiered) >= 4 and all(r.key.startswith("commitlog/") for r in tiered)
    assert status.tiered_bytes == sum(r.size for r in tiered) and status.tiered_segments == len(tiered)
    assert all(r.tiered for r in status.segments if not r.local)  # nothing is nowhere
    assert status.local_bytes == sum((data_dir / "commitlog" / f"{b:020d}").stat().st_size
                                     for b in _local_files(data_dir))
    assert status.copy_bytes == status.tiered_bytes and status.logical_min == 0
    assert status.local_min == _local_files(data_dir)[0] and status.fetch_bytes > 0 and status.cache_misses > 0
    port = next(json.loads(line) for line in node.lines if '"server.started"' in line)["metrics_port"]
    scraped = scrape(port)
    assert scraped.value("mqstore_tier_copy_bytes_total", kind="commitlog") == status.copy_bytes
    assert scraped.value("mqstore_tier_size_bytes", kind="commitlog") == status.tiered_bytes
    assert scraped.value("mqstore_tier_copy_lag_segments", kind="commitlog") == 0
    assert scraped.value("mqstore_tier_copy_lag_bytes", kind="commitlog") == 0
    assert scraped.value("mqstore_tier_fetch_bytes_total", kind="commitlog") >= status.fetch_bytes > 0
    assert scraped.value("mqstore_tier_cache_misses_total") >= status.cache_misses
    for name in ("mqstore_tier_copy_errors_total", "mqstore_tier_fetch_errors_total", "mqstore_tier_cache_hits_total",
                 "mqstore_tier_local_bytes", "mqstore_tier_expired_bytes_total"):
        assert scraped.has(name), name
    cli = pathlib.Path(sys.executable).with_name("mqstore")
    human = subprocess.run([str(cli), "--address", node.address, "tier", "status", "--segments"],
                           capture_output=True, text=True, timeout=60)
    assert human.returncode == 0, human.stderr
    assert f"tiered_bytes: {status.tiered_bytes} (" in human.stdout and "copy_lag_segments: 0" in human.stdout
    assert f"segment {tiered[0].base:020d} size={tiered[0].size} " in human.stdout and "key=commitlog/" in human.stdout
    (row,) = [t for t in status.topics if t.topic == "t"]  # its consume queue files: a row of their own
    assert f"topic t local_bytes={row.local_bytes} " in human.stdout and row.local_bytes > 0
    as_json = subprocess.run([str(cli), "--address", node.address, "--json", "tier", "status"],
                             capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["tiered_segments"] == len(tiered)
