"""Compaction log segments in a file:// object storage tier, real processes on 127.0.0.1 (a commit log and a
compactor with ``--tier-url``, ``--local-retention-bytes 1``): the compactor first dies (os._exit, failpoint
``compaction.tier.after_put``) after a segment's put before its FINISHED; restarted, it uploads every sealed
segment once, deletes the dead attempt's object and the local .log files, and a compacted Pull from 0 returns
the latest record of every key with the segments only in the tier; a round over them (reading them from the
tier) leaves exactly the latest of each key, and after a kill -9 a restart reads the same bytes."""

from __future__ import annotations

import pathlib

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as clpb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from mqstore.compaction.tier_manifest import FINISHED, Manifest
from mqstore.tier.urls import open_store
from tests.integration.test_compactor_replica import SMALL
from tests.support.processes import ServiceProcess, commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.e2e]
T = 10
WAIT_S = 60
KEYS = 40


def _compactor(data_dir: pathlib.Path, tier: pathlib.Path, log_address: str, env=None) -> ServiceProcess:
    return ServiceProcess("compactor_service.main", [
        "--data-dir", str(data_dir), *SMALL, "--commitlog", log_address, "--instance-id", "c1",
        "--tier-url", f"file://{tier}", "--local-retention-bytes", "1", "--tier-upload-interval-ms", "100"], env)


def _raw(stub) -> list[bytes]:
    out, offset = [], 0
    for _ in range(1000):
        page = stub.Pull(pb.CompactedPullRequest(topic="kv", queue_id=0, offset=offset, max_messages=100, raw=True),
                         timeout=T)
        if not page.raw_records:
            return out
        out += list(page.raw_records)
        offset = page.next_offset
    raise AssertionError("pull did not end")


def _bodies(stub) -> list[tuple[int, str, bytes]]:
    out, offset = [], 0
    for _ in range(1000):
        page = stub.Pull(pb.CompactedPullRequest(topic="kv", queue_id=0, offset=offset, max_messages=100), timeout=T)
        if not page.messages:
            return out
        out += [(m.queue_offset, m.keys[0], m.body) for m in page.messages]
        offset = page.next_offset
    raise AssertionError("pull did not end")


def _local(queue_dir: pathlib.Path) -> tuple[int, int]:
    return len(list(queue_dir.glob("*.log"))), len(list(queue_dir.glob("*.cq")))


def _manifest_keys(tier: pathlib.Path) -> set[str]:
    """The FINISHED uploads the tier's manifest names (its newest snapshot and the changes after it)."""
    writes, reads = open_store(f"file://{tier}", timeout_ms=T * 1000), open_store(f"file://{tier}", timeout_ms=T * 1000)
    try:
        manifest = Manifest(writes, reads, "compaction/c1")
        manifest.load()
        return {s.key for s in manifest.segments().values() if s.state == FINISHED}
    finally:
        writes.close()
        reads.close()


def _objects(tier: pathlib.Path) -> set[str]:
    root = tier / "compaction" / "c1" / "segments"
    return {str(p.relative_to(tier)) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")}


def test_a_compactor_killed_mid_upload_then_serves_its_segments_from_the_tier(tmp_path):
    tier, data = tmp_path / "tier", tmp_path / "compactor"
    tier.mkdir()
    queue_dir = data / "logs" / "kv" / "0"
    written = [(f"k{i % KEYS}", b"value-%05d-" % i + b"x" * 60) for i in range(400)]
    with commitlog(tmp_path / "log").started() as log_process, \
            grpc.insecure_channel(log_process.address) as log_channel:
        log = commitlog_pb2_grpc.CommitLogStub(log_channel)
        log.CreateTopic(clpb.CreateTopicRequest(name="kv", queue_count=1, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        for first in range(0, len(written), 100):
            log.Append(clpb.AppendRequest(topic="kv", messages=[common_pb2.MessageInput(body=v, keys=[k])
                                                                 for k, v in written[first:first + 100]]), timeout=T)
        dying = _compactor(data, tier, log_process.address, {"MQSTORE_FAILPOINTS": "compaction.tier.after_put=exit"})
        assert dying.wait_exit(WAIT_S) == 137  # died after a put, before its FINISHED
        dying.stop()
        assert _local(queue_dir)[0] > 2 and _objects(tier) and not _manifest_keys(tier)

        def restarted() -> ServiceProcess:
            return _compactor(data, tier, log_process.address).started()

        def tiered() -> bool:
            logs, cqs = _local(queue_dir)
            return logs == 1 and cqs > 2 and _objects(tier) == _manifest_keys(tier)
        expected = [(i, k, v) for i, (k, v) in enumerate(written)]
        with restarted() as process, grpc.insecure_channel(process.address) as channel:
            stub = compactor_pb2_grpc.CompactorStub(channel)
            wait_until(lambda: stub.DescribeQueue(pb.DescribeQueueRequest(topic="kv", queue_id=0),
                                                  timeout=T).max_offset == len(written), "every record applied",
                       timeout_s=WAIT_S)
            wait_until(tiered, "every sealed segment only in the tier, one object each, no orphan", timeout_s=WAIT_S)
            served = _bodies(stub)  # (a background round may have compacted the sealed part already)
            assert set(expected[-KEYS:]) <= set(served) <= set(expected) and served == sorted(served)
            stub.Compact(pb.CompactRequest(topic="kv", queue_id=0, seal_active=True), timeout=WAIT_S)
            compacted = _bodies(stub)
            assert [k for _, k, _ in compacted] == [k for _, k, _ in expected[-KEYS:]]
            assert compacted == expected[-KEYS:]
            wait_until(tiered, "the round's segments uploaded, the replaced objects deleted", timeout_s=WAIT_S)
            raw = _raw(stub)
            process.kill9()
        with restarted() as process, grpc.insecure_channel(process.address) as channel:
            stub = compactor_pb2_grpc.CompactorStub(channel)
            assert _raw(stub) == raw  # a restart maps the tiered segments from the tier's manifest alone
            assert _local(queue_dir)[0] == 1
