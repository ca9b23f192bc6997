"""The commit log service with the object storage tier: the uploader's reads of a sealed segment that drop-behind
(mqstore.log.warmer) had given back leave no pages behind: once the upload is done the segment's pages are given back
again (``SegmentWarmer.drop_read_back``, wired by the service's composition). Uploads are held back by failing them
(failpoint ``tier.upload.started``) until drop-behind has passed the first segment. What the store drops is recorded
at ``Segment.drop_cache`` (the server runs in this process); that the pages are gone is read from the kernel."""

from __future__ import annotations

import os

import grpc
import pytest

from commitlog_service.main import CommitLogConfig
from commitlog_service.main import serving as commitlog_serving
from mqstore import failpoints
from mqstore.config import StoreConfig
from mqstore.log.segment import PAGE_SIZE
from mqstore.tier.config import TierConfig
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.server import ServerConfig
from tests.support import page_cache
from tests.support.waiting import wait_until

T = 10  # RPC timeout, s
SEGMENT = 512 << 10
KEEP = 256 << 10
BATCHES = 20  # x 40 messages of ~2 KiB: ~1.6 MiB, three sealed segments and the active one


@pytest.fixture
def disk_dir(tmp_path):
    with page_cache.disk_dir(tmp_path) as path:
        yield path


def _times_dropped(dropped: list[tuple[int, int]], start: int, end: int) -> int:
    """How many times every page of [start, end) was given back (the fewest over its pages)."""
    return min(sum(1 for a, b in dropped if a <= at < b) for at in range(start, end, PAGE_SIZE))


def test_an_uploads_reads_below_the_window_are_given_back(disk_dir, monkeypatch):
    tier_dir = disk_dir / "tier"
    tier_dir.mkdir()
    log_dir = disk_dir / "log"
    config = CommitLogConfig(
        store=StoreConfig(data_dir=log_dir, segment_size_bytes=SEGMENT, preallocate_segments=False,
                          page_cache_keep_bytes=KEEP, warm_ahead_bytes=0, flush_interval_ms=20),
        server=ServerConfig(port=0, grace_s=1.0),
        tier=TierConfig(tier_url=f"file://{tier_dir}", tier_upload_interval_ms=100, tier_call_timeout_ms=5000))
    dropped = page_cache.record_drops(monkeypatch)  # [from, to) physical offsets the store gave back
    failpoints.arm("tier.upload.started", "raise")  # no upload yet: drop-behind passes the first segment first
    try:
        with commitlog_serving(config) as (_, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            log = commitlog_pb2_grpc.CommitLogStub(channel)
            log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=T)
            for batch in range(BATCHES):
                log.Append(pb.AppendRequest(topic="t", messages=[
                    common_pb2.MessageInput(body=b"%04d" % batch + os.urandom(2000)) for _ in range(40)]), timeout=T)
            wait_until(lambda: dropped and _times_dropped(dropped, 0, SEGMENT) >= 1,
                       "drop-behind to give back the first segment", timeout_s=60)
            assert _times_dropped(dropped, 0, SEGMENT) == 1

            failpoints.disarm_all()  # the uploads read the sealed segments back, then give them back
            wait_until(lambda: _times_dropped(dropped, 0, SEGMENT) >= 2,
                       "the first segment's pages given back after its upload", timeout_s=60)
            first = page_cache.resident_pages(min((log_dir / "commitlog").iterdir(), key=lambda f: int(f.name)))
            assert not any(first[:SEGMENT // PAGE_SIZE]), "pages the upload read stayed in the page cache"
            got, offset = [], 0
            for _ in range(100):  # bounded: every message reads back, the dropped ones from the disk
                page = log.Pull(pb.PullRequest(topic="t", queue_id=0, offset=offset, max_messages=500,
                                               max_bytes=2 << 20), timeout=T)
                if not page.messages:
                    break
                got += [m.body[:4] for m in page.messages]
                offset = page.next_offset
            assert got == [b"%04d" % batch for batch in range(BATCHES) for _ in range(40)]
    finally:
        failpoints.disarm_all()
