"""The compaction segments' tier in the compactor's DescribeQueue (``tier``, a QueueTierStatus) and in
``mqstore compact status``: local and tiered bytes, pending uploads and the queue's last error, before and after
an upload pass, after a failed one, and unset without a tier."""

from __future__ import annotations

from mqstore.compaction.api import CompactorApi, ServiceStats
from mqstore.compaction.store import CompactionStore
from mqstore.errors import Unavailable
from mqstore_cli.compactor import status_text
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb
from compactor_service.servicer import CompactorServicer
from tests.support.compaction_tier import CONFIG, Rig, fill, sealed_files


def _describe(store) -> pb.QueueDescription:
    api = CompactorApi(store, spark_threshold_bytes=1 << 40,
                       stats=lambda: ServiceStats(True, 0, None, "", 1, 0, ""))
    return CompactorServicer(api).DescribeQueue(pb.DescribeQueueRequest(topic="kv", queue_id=0), None)


def test_describe_queue_shows_local_and_tiered_bytes_pending_uploads_and_the_last_error(tmp_path):
    rig = Rig(tmp_path, local_retention_bytes=1)
    fill(rig.open(), rig.clock)
    try:
        files = sealed_files(rig.store)
        total = sum(len(b) for b in files.values())
        t = _describe(rig.store).tier
        assert (t.tier_url, t.local_bytes, t.tiered_bytes, t.tiered_segments) == (rig.config.tier_url, total, 0, 0)
        assert (t.pending_uploads, t.pending_bytes, t.last_error) == (len(files), total, "")

        def fails(key, path, size):
            raise Unavailable("injected: the store refused the put")
        put_file, rig.tier.writes.put_file = rig.tier.writes.put_file, fails
        try:
            rig.tier.run_pass(rig.store)
        except Unavailable:
            pass
        t = _describe(rig.store).tier
        assert "injected" in t.last_error and t.last_error_ms == rig.clock.now_ms()
        assert t.pending_uploads == len(files) and t.local_bytes == total
        assert "tier_last_error: " in status_text(_describe(rig.store)) and "injected" in status_text(
            _describe(rig.store))
        rig.tier.writes.put_file = put_file
        rig.tier.run_pass(rig.store)  # uploaded, then the local copies deleted (local retention of 1 byte)
        d = _describe(rig.store)
        t = d.tier
        assert (t.local_bytes, t.tiered_bytes, t.tiered_segments) == (0, total, len(files))
        assert (t.pending_uploads, t.pending_bytes, t.last_error, t.last_error_ms) == (0, 0, "", 0)
        text = status_text(d)
        assert f"tier_tiered_bytes: {total} ({len(files)} segments)" in text
        assert "tier_pending_uploads: 0 (0 bytes)" in text and "tier_last_error: none" in text
    finally:
        rig.close()


def test_describe_queue_without_a_tier_leaves_it_unset(tmp_path):
    store = CompactionStore(tmp_path / "logs", CONFIG, Rig(tmp_path).clock)
    try:
        fill(store, Rig(tmp_path).clock, 20)
        d = _describe(store)
        assert not d.HasField("tier") and "tier" not in status_text(d)
    finally:
        store.close()
