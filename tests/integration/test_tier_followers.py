"""Followers of a commit log whose old segments are only in the object storage tier (issue 36): a real CommitLog
server with a file:// tier and --local-retention-bytes of two 64 KiB segments, a real Compactor and a real Index
server, all in this process on 127.0.0.1. The compactor follows, then stops (its durable retention hold stays at
its stream's start); the appends go on, the segments are uploaded and leave the local disk all the same: the
local log stays bounded by local retention, not by the hold. The tier then fails (its segments' directory made
a file): a read below the local log is UNAVAILABLE naming the tier, and the Index, started only then, retries
without skipping a record; once the tier is back it follows the log from its earliest record through the tier and
answers key, unique key and time queries exactly as the appends say an
all-local log does (tests/integration/test_index_service.py's expectations); the compactor, started again,
catches up from the tier and builds the latest value of every key."""

from __future__ import annotations

import pathlib

import grpc
import pytest
from commitlog_service.main import CommitLogConfig
from commitlog_service.main import serving as commitlog_serving
from compactor_service.main import CompactorServiceConfig
from compactor_service.main import serving as compactor_serving
from index_service.main import IndexServiceConfig
from index_service.main import serving as index_serving
from mqstore.compaction.policy import CompactionConfig
from mqstore.config import StoreConfig
from mqstore.follow import FollowConfig
from mqstore.index.config import IndexConfig
from mqstore.index.follower import FollowerConfig
from mqstore.tier.config import TierConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as cpb, compactor_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import index_pb2, index_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

T = 10  # RPC timeout, s
SEGMENT = 64 * 1024
LOCAL_BYTES = 2 * SEGMENT


def compactor_config(data_dir: pathlib.Path, port: int) -> CompactorServiceConfig:
    return CompactorServiceConfig(
        data_dir=data_dir, server=ServerConfig(port=0, grace_s=1.0), commitlog_address=f"127.0.0.1:{port}",
        compaction=CompactionConfig(segment_size_bytes=8192, delete_retention_ms=3_600_000,
                                    round_interval_ms=3_600_000),
        checkpoint_interval_ms=50, follow=FollowConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200))


def index_config(data_dir: pathlib.Path, port: int) -> IndexServiceConfig:
    return IndexServiceConfig(
        index=IndexConfig(data_dir, slot_count=16, entry_count=256, max_keys_per_message=8,
                          maintenance_interval_ms=50, maintenance_retry_ms=50, checkpoint_interval_ms=100),
        server=ServerConfig(port=0, grace_s=1.0), commitlog_address=f"127.0.0.1:{port}",
        follower=FollowerConfig(heartbeat_ms=50, backoff_initial_ms=20, backoff_max_ms=200,
                                retention_interval_ms=200, rebuild_interval_ms=100))


def local_segments(log_dir: pathlib.Path) -> list[int]:
    return sorted(int(path.name) for path in (log_dir / "commitlog").iterdir() if path.name.isdigit())


def applied(compactor, topic: str, total: int) -> bool:
    try:
        return sum(compactor.DescribeQueue(cpb.DescribeQueueRequest(topic=topic, queue_id=q), timeout=T).max_offset
                   for q in range(2)) == total
    except grpc.RpcError:
        return False


def query_all(index, topic: str, key: str, **fields) -> list[index_pb2.MessageLocator]:
    found, token = [], ""
    for _ in range(1000):  # bounded
        page = index.QueryByKey(index_pb2.QueryByKeyRequest(topic=topic, key=key, max_num=64, page_token=token,
                                                            **fields), timeout=T)
        found += page.locators
        token = page.next_page_token
        if not token:
            return found
    raise AssertionError("more than 1000 pages")


def compacted(compactor, topic: str) -> dict[str, bytes]:
    seen: dict[str, bytes] = {}
    for q in range(2):
        offset = 0
        for _ in range(1000):  # bounded
            page = compactor.Pull(cpb.CompactedPullRequest(topic=topic, queue_id=q, offset=offset, max_messages=50),
                                  timeout=T)
            if not page.messages:
                break
            for m in page.messages:
                assert m.keys[0] not in seen, f"{m.keys[0]} appears twice after compaction"
                seen[m.keys[0]] = m.body
            offset = page.next_offset
    return seen


def test_lagging_followers_read_the_tier_and_hold_no_local_disk(tmp_path):
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    log_dir = tmp_path / "log"
    config = CommitLogConfig(
        store=StoreConfig(data_dir=log_dir, segment_size_bytes=SEGMENT, preallocate_segments=False),
        server=ServerConfig(port=0, grace_s=1.0),
        tier=TierConfig(tier_url=f"file://{tier_dir}", tier_upload_interval_ms=100, local_retention_bytes=LOCAL_BYTES,
                        tier_read_ahead_bytes=16 << 10, tier_cache_bytes=64 << 10, tier_call_timeout_ms=5000))
    with commitlog_serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        log = commitlog_pb2_grpc.CommitLogStub(channel)
        log.CreateTopic(pb.CreateTopicRequest(name="kv", queue_count=2, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        log.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=2), timeout=T)
        writes: list[tuple[str, bytes]] = []

        def write_kv(count: int) -> None:
            batch = [(f"user-{(len(writes) + i) % 40}", f"v{len(writes) + i}-".encode() * 30) for i in range(count)]
            log.Append(pb.AppendRequest(topic="kv", messages=[common_pb2.MessageInput(body=v, keys=[k])
                                                              for k, v in batch]), timeout=T)
            writes.extend(batch)

        write_kv(50)
        with compactor_serving(compactor_config(tmp_path / "compactor", port)) as (_, cport), \
                grpc.insecure_channel(f"127.0.0.1:{cport}") as cchannel:
            compactor = compactor_pb2_grpc.CompactorStub(cchannel)
            wait_until(lambda: applied(compactor, "kv", len(writes)), "the compactor to apply the first records")

        def closed_hold():
            holds = log.ListRetentionHolds(pb.ListRetentionHoldsRequest(), timeout=T).holds
            return next((h for h in holds if h.name.startswith("compactor") and not h.open_streams), None)
        hold = wait_until(closed_hold, "the compactor's stream to close")
        assert hold.durable  # the compactor is away: its hold stays (retention_hold_max_ms: days)

        # The appends go on: ~10 segments of keyed messages and key/value writes.
        results: list[pb.AppendResult] = []
        for batch in range(40):
            more = [common_pb2.MessageInput(body=b"order-%d-" % (batch * 10 + i) + bytes(1200),
                                            keys=[f"k{(batch * 10 + i) % 3}", "all"]) for i in range(10)]
            results += log.Append(pb.AppendRequest(topic="orders", messages=more), timeout=T).results
            write_kv(5)
        end = log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=T).visible_physical_offset
        assert end > 8 * SEGMENT

        def bounded():
            local = local_segments(log_dir)
            return local[0] > hold.physical_offset + SEGMENT and len(local) * SEGMENT <= LOCAL_BYTES + 2 * SEGMENT
        wait_until(bounded, "local retention to delete the uploaded segments below the compactor's hold", 30)
        held = next(h for h in log.ListRetentionHolds(pb.ListRetentionHoldsRequest(), timeout=T).holds
                    if h.name == hold.name)
        assert held.physical_offset == hold.physical_offset  # still held, for the total retention

        # The tier fails (its directory of segments is a file: every GET is an OSError): reads below the local log
        # are UNAVAILABLE naming the tier, and the Index, started only now, retries without skipping anything.
        segments_dir = tier_dir / "commitlog"
        segments_dir.rename(tier_dir / "commitlog.away")
        segments_dir.write_bytes(b"")
        with pytest.raises(grpc.RpcError) as down:
            log.GetMessage(pb.GetMessageRequest(physical_offset=results[0].physical_offset), timeout=T)
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE and f"file://{tier_dir}" in down.value.details()
        with index_serving(index_config(tmp_path / "index", port)) as (_, iport), \
                grpc.insecure_channel(f"127.0.0.1:{iport}") as ichannel:
            index = index_pb2_grpc.IndexStub(ichannel)
            failing = wait_until(lambda: (st := index.Stats(index_pb2.IndexStatsRequest(), timeout=T)).last_error
                                 and st, "the Index's Tail to fail on the tier")
            assert f"file://{tier_dir}" in failing.last_error and "UNAVAILABLE" in failing.last_error.upper()
            assert failing.indexed_physical_offset < local_segments(log_dir)[0]  # it did not skip to the local log
            segments_dir.unlink()
            (tier_dir / "commitlog.away").rename(segments_dir)  # the tier is back
            first = log.GetMessage(pb.GetMessageRequest(physical_offset=results[0].physical_offset), timeout=T)
            assert first.body == b"order-0-" + bytes(1200)  # below the local log: read from the tier

            # The Index follows from the earliest record: the old segments come from the tier.
            wait_until(lambda: index.Stats(index_pb2.IndexStatsRequest(), timeout=T).indexed_physical_offset >= end,
                       f"the index to reach {end}", 60)
            assert local_segments(log_dir)[0] > results[0].physical_offset  # it read what is only in the tier
            newest_first = [r.physical_offset for r in reversed(results)]
            assert [loc.physical_offset for loc in query_all(index, "orders", "all")] == newest_first
            k1 = query_all(index, "orders", "k1")
            assert [loc.physical_offset for loc in k1] == [r.physical_offset for i, r in reversed(list(
                enumerate(results))) if i % 3 == 1]
            page = index.QueryByKey(index_pb2.QueryByKeyRequest(topic="orders", key="k0", max_num=200,
                                                                include_messages=True), timeout=T)
            assert [m.body for m in page.messages] == [b"order-%d-" % i + bytes(1200)
                                                       for i in reversed(range(0, len(results), 3))]
            by_offset = {r.physical_offset: r for r in results}
            for loc in page.locators:
                r = by_offset[loc.physical_offset]
                assert (loc.msg_id, loc.queue_id, loc.queue_offset, loc.store_timestamp_ms) == (
                    r.msg_id, r.queue_id, r.queue_offset, r.store_timestamp_ms)
            target = results[5]
            unique = index.QueryByUniqKey(index_pb2.QueryByUniqKeyRequest(topic="orders", uniq_key=target.uniq_key),
                                          timeout=T)
            assert [loc.physical_offset for loc in unique.locators] == [target.physical_offset]
            for r in results[::37]:
                got = index.QueryByTime(index_pb2.QueryByTimeRequest(topic="orders", queue_id=r.queue_id,
                                                                     timestamp_ms=r.store_timestamp_ms),
                                        timeout=T).offset
                assert got == min(x.queue_offset for x in results
                                  if x.queue_id == r.queue_id and x.store_timestamp_ms >= r.store_timestamp_ms)

        # The compactor comes back: it catches up from the tier and builds the latest value of every key.
        with compactor_serving(compactor_config(tmp_path / "compactor", port)) as (_, cport), \
                grpc.insecure_channel(f"127.0.0.1:{cport}") as cchannel:
            compactor = compactor_pb2_grpc.CompactorStub(cchannel)
            wait_until(lambda: applied(compactor, "kv", len(writes)), "the compactor to catch up from the tier", 60)
            rounds = compactor.Compact(cpb.CompactRequest(topic="kv", seal_active=True), timeout=60).rounds
            assert all(r.result == "ok" for r in rounds)
            assert compacted(compactor, "kv") == dict(writes)
