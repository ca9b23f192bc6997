"""The Compactor service through real gRPC on 127.0.0.1 (port 0): a real CommitLog server and a real
Compactor server in this process, real files, small compaction segments."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import grpc
import pytest
from commitlog_service.main import CommitLogConfig
from commitlog_service.main import serving as commitlog_serving
from compactor_service.main import CompactorServiceConfig, serving
from mqstore.compaction.policy import CompactionConfig
from mqstore.config import StoreConfig
from mqstore.follow import FollowConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as clpb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
T = 10  # RPC timeout, s


def compactor_config(data_dir: pathlib.Path, commitlog_port: int, spark_master: str = "",
                     **compaction) -> CompactorServiceConfig:
    values = dict(segment_size_bytes=8192, offset_map_memory_bytes=4 * 128, delete_retention_ms=3_600_000,
                  round_interval_ms=3_600_000)
    values.update(compaction)
    return CompactorServiceConfig(data_dir=data_dir, server=ServerConfig(port=0, grace_s=1.0),
                                  commitlog_address=f"127.0.0.1:{commitlog_port}",
                                  compaction=CompactionConfig(**values), checkpoint_interval_ms=50,
                                  spark_master=spark_master,
                                  follow=FollowConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200))


@dataclasses.dataclass
class Services:
    log: commitlog_pb2_grpc.CommitLogStub
    compactor: compactor_pb2_grpc.CompactorStub
    compactor_address: str = ""


@pytest.fixture
def commitlog_port(tmp_path):
    config = CommitLogConfig(store=StoreConfig(data_dir=tmp_path / "log", segment_size_bytes=64 * 1024,
                                               preallocate_segments=False), server=ServerConfig(port=0, grace_s=1.0))
    with commitlog_serving(config) as (_, port):
        yield port


@pytest.fixture
def services(tmp_path, commitlog_port):
    with serving(compactor_config(tmp_path / "compactor", commitlog_port)) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Services(commitlog_pb2_grpc.CommitLogStub(log_channel), compactor_pb2_grpc.CompactorStub(channel),
                       f"127.0.0.1:{port}")


def write_kv(log, topic: str, writes: list[tuple[str, bytes]], queues: int = 2) -> None:
    log.CreateTopic(clpb.CreateTopicRequest(name=topic, queue_count=queues, kind=common_pb2.TOPIC_KIND_COMPACTION),
                    timeout=T)
    for first in range(0, len(writes), 100):
        batch = [common_pb2.MessageInput(body=value, keys=[key]) for key, value in writes[first:first + 100]]
        log.Append(clpb.AppendRequest(topic=topic, messages=batch), timeout=T)


def applied(compactor, topic: str, total: int, queues: int = 2) -> bool:
    try:
        return sum(compactor.DescribeQueue(pb.DescribeQueueRequest(topic=topic, queue_id=q), timeout=T).max_offset
                   for q in range(queues)) == total
    except grpc.RpcError:
        return False


def read_all(compactor, topic: str, queue_id: int) -> list[tuple[int, str, bytes]]:
    out, offset = [], 0
    for _ in range(1000):
        page = compactor.Pull(pb.CompactedPullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=50),
                              timeout=T)
        out += [(m.queue_offset, m.keys[0], m.body) for m in page.messages]
        if not page.messages:
            return out
        offset = page.next_offset
    raise AssertionError("pull did not end")


def test_a_consumer_from_offset_0_after_compaction_sees_the_latest_value_per_key(services):
    writes = [(f"user-{i % 25}", f"v{i}-".encode() * 20) for i in range(600)]
    writes += [("user-3", b""), ("user-4", b"")]  # tombstones, kept within their retention
    write_kv(services.log, "kv", writes)
    wait_until(lambda: applied(services.compactor, "kv", len(writes)), "the compactor to apply every record")
    response = services.compactor.Compact(pb.CompactRequest(topic="kv", seal_active=True), timeout=60)
    assert {r.queue_id for r in response.rounds} == {0, 1} and all(r.result == "ok" for r in response.rounds)
    assert max(r.passes for r in response.rounds) > 1  # 4 keys per pass: multi-pass
    latest = {key: value for key, value in writes}
    seen = {}
    for q in range(2):
        records = read_all(services.compactor, "kv", q)
        assert [o for o, _, _ in records] == sorted(o for o, _, _ in records)
        for _, key, body in records:
            assert key not in seen, f"{key} appears twice after compaction"
            seen[key] = body
    assert seen == latest
    found = services.compactor.GetLatest(pb.GetLatestRequest(topic="kv", key="user-7"), timeout=T)
    assert found.found and found.value == latest["user-7"] and not found.tombstone
    assert services.compactor.GetLatest(pb.GetLatestRequest(topic="kv", key="user-3"), timeout=T).tombstone
    batch = services.compactor.BatchGetLatest(pb.BatchGetLatestRequest(topic="kv", keys=["user-1", "nope"]), timeout=T)
    assert [(v.key, v.found) for v in batch.values] == [("user-1", True), ("nope", False)]
    scanned = {}
    for page in services.compactor.Scan(pb.ScanRequest(topic="kv", page_size=7), timeout=T):
        scanned.update({v.key: v.value for v in page.values})
    assert scanned == {k: v for k, v in latest.items() if v}


def test_skipped_offsets_offsets_queries_and_describe(services):
    write_kv(services.log, "kv", [("a", b"1"), ("a", b"2"), ("a", b"3"), ("b", b"4")], queues=1)
    wait_until(lambda: applied(services.compactor, "kv", 4, 1), "the compactor to apply every record")
    services.compactor.Compact(pb.CompactRequest(topic="kv", queue_id=0, seal_active=True), timeout=60)
    page = services.compactor.Pull(pb.CompactedPullRequest(topic="kv", queue_id=0, offset=0), timeout=T)
    assert [m.queue_offset for m in page.messages] == [2, 3] and page.next_offset == 4
    assert [(s.from_offset, s.to_offset, s.reason) for s in page.skipped] == [(0, 2, "compacted")]
    offsets = services.compactor.GetQueueOffsets(pb.GetQueueOffsetsRequest(topic="kv", queue_id=0), timeout=T)
    assert (offsets.min_offset, offsets.max_offset) == (2, 4)  # the compaction log's, not the raw queue's (0, 4)
    d = services.compactor.DescribeQueue(pb.DescribeQueueRequest(topic="kv", queue_id=0), timeout=T)
    assert d.cleaned_up_to_offset == 3 and d.keys == 2 and d.records == 2 and d.last_round.records_removed == 2
    assert d.dirty_bytes == 0 and d.clean_bytes > 0 and not d.quarantined
    stats = services.compactor.Stats(pb.CompactorStatsRequest(), timeout=T)
    assert stats.healthy and stats.queues == 1 and stats.records_applied == 4
    assert (stats.role, stats.active_instance) == ("single", "")


@pytest.mark.parametrize("call, code", [
    (lambda c: c.GetLatest(pb.GetLatestRequest(topic="", key="a"), timeout=T), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda c: c.GetLatest(pb.GetLatestRequest(topic="kv", key=""), timeout=T), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda c: c.GetLatest(pb.GetLatestRequest(topic="nope", key="a"), timeout=T), grpc.StatusCode.NOT_FOUND),
    (lambda c: c.Pull(pb.CompactedPullRequest(topic="nope", queue_id=0), timeout=T), grpc.StatusCode.NOT_FOUND),
    (lambda c: list(c.Scan(pb.ScanRequest(topic="nope"), timeout=T)), grpc.StatusCode.NOT_FOUND),
    (lambda c: list(c.Scan(pb.ScanRequest(topic="kv", cursor="x"), timeout=T)), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda c: c.Compact(pb.CompactRequest(topic="kv", engine=pb.COMPACTION_ENGINE_SPARK), timeout=T),
     grpc.StatusCode.FAILED_PRECONDITION),
    (lambda c: c.BatchGetLatest(pb.BatchGetLatestRequest(topic="kv", keys=["k"] * 1001), timeout=T),
     grpc.StatusCode.INVALID_ARGUMENT),
])
def test_bad_requests_get_the_right_status(services, call, code):
    write_kv(services.log, "kv", [("a", b"1")], queues=1)
    wait_until(lambda: applied(services.compactor, "kv", 1, 1), "the compactor to apply the record")
    with pytest.raises(grpc.RpcError) as info:
        call(services.compactor)
    assert info.value.code() == code and info.value.details()
    assert services.compactor.GetLatest(pb.GetLatestRequest(topic="kv", key="a"), timeout=T).value == b"1"


def test_keyless_and_disagreeing_appends_are_refused(services):
    write_kv(services.log, "kv", [("a", b"1")], queues=4)
    for message in (common_pb2.MessageInput(body=b"x"), common_pb2.MessageInput(body=b"x", keys=["a"], queue_id=9)):
        with pytest.raises(grpc.RpcError) as info:
            services.log.Append(clpb.AppendRequest(topic="kv", messages=[message]), timeout=T)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _cli(*args: str) -> str:
    """The mqstore command line as a process (in-process, it would configure logging on pytest's streams)."""
    done = subprocess.run([sys.executable, "-m", "mqstore_cli", *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cli_runs_rounds_and_reads_latest_values(services):
    write_kv(services.log, "kv", [("a", b"1"), ("a", b"2"), ("b", b"3"), ("c", b"")], queues=1)
    wait_until(lambda: applied(services.compactor, "kv", 4, 1), "the compactor to apply every record")
    address = services.compactor_address
    assert "queue 0: ok" in _cli("--compactor-address", address, "compact", "run", "kv", "--seal-active",
                                 "--engine", "local")
    assert _cli("kv", "get", "kv", "a", "c", "zz", "--compactor-address", address).splitlines() == [
        "a: 2  queue=0  offset=1", "c: (deleted)  queue=0  offset=3", "zz: (no value)"]
    assert [line.split(":")[0] for line in _cli("kv", "scan", "kv", "--compactor-address", address).splitlines()] == [
        "a", "b"]
    assert "cleaned_up_to_offset: 3" in _cli("compact", "status", "kv", "--compactor-address", address)


def test_stats_after_a_restart_does_not_claim_caught_up_before_it_has_seen_the_log(tmp_path, commitlog_port):
    write_config = compactor_config(tmp_path / "compactor", commitlog_port)
    with serving(write_config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{commitlog_port}") as log_channel, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        compactor = compactor_pb2_grpc.CompactorStub(channel)
        write_kv(commitlog_pb2_grpc.CommitLogStub(log_channel), "kv", [("a", b"1")], queues=1)
        wait_until(lambda: applied(compactor, "kv", 1, 1), "the compactor to apply the record")
        stats = wait_until(lambda: (s := compactor.Stats(pb.CompactorStatsRequest(), timeout=T)).HasField(
            "bytes_behind") and s.bytes_behind == 0 and s, "the compactor to be caught up")
        assert stats.connected and stats.log_end_physical_offset > 0
    # Restarted while the commit log cannot be reached (a port nothing listens on): it knows its checkpoint only.
    with serving(dataclasses.replace(write_config, commitlog_address="127.0.0.1:1")) as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stats = compactor_pb2_grpc.CompactorStub(channel).Stats(pb.CompactorStatsRequest(), timeout=T)
        assert not stats.connected and stats.checkpoint_physical_offset > 0
        assert not stats.HasField("log_end_physical_offset") and not stats.HasField("bytes_behind")
    with serving(write_config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        compactor = compactor_pb2_grpc.CompactorStub(channel)
        wait_until(lambda: compactor.Stats(pb.CompactorStatsRequest(), timeout=T).HasField("bytes_behind"),
                   "the follower's first frame")
