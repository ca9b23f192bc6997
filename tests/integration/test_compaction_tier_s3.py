"""Compaction log segments on a real S3-compatible server (moto's server mode on 127.0.0.1, one per module):
each uploaded object is its segment's file byte for byte (read with boto3, not the code tested), reads and a
round of segments only in the tier are byte-identical to local ones, and a restart maps them from the
manifest in the bucket alone; with the server gone, a tier read is UNAVAILABLE naming the tier within its
deadline while local data answers."""

from __future__ import annotations

import time

import pytest

from mqstore.compaction import reads
from mqstore.compaction.store import CompactionStore
from mqstore.compaction.tier import TierDuty
from mqstore.errors import Unavailable
from mqstore.format import compaction_segment as cseg
from mqstore.tier.config import Credentials
from mqstore.tier.urls import open_store
from tests.support.compaction import put
from tests.support.compaction_tier import CONFIG, Rig, everything, fill, sealed_files
from tests.support.s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, moto_s3, stalled_server
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


def _rig(tmp_path, bucket: str, endpoint: str, **extra) -> Rig:
    return Rig(tmp_path, tier_url=f"s3://{bucket}/mq", tier_endpoint=endpoint, tier_region=REGION,
               credentials=Credentials(ACCESS_KEY_ID, SECRET_ACCESS_KEY), local_retention_bytes=1, **extra)


def test_segments_on_s3_read_back_byte_identical_and_after_a_restart(s3, tmp_path):
    bucket = s3.bucket()
    rig = _rig(tmp_path, bucket, s3.endpoint)
    rig.open()
    reference = CompactionStore(tmp_path / "reference", CONFIG, rig.clock)
    try:
        fill(rig.store, rig.clock)
        fill(reference, rig.clock)
        before, files = everything(rig.store), sealed_files(rig.store)
        rig.tier.run_pass(rig.store)
        manifest = rig.tier.segments()
        objects = s3.objects(bucket, "mq/compaction/a/segments/")
        assert {f"mq/{s.key}": files[s.segment_base] for s in manifest.values()} == objects
        assert rig.qlog.tiered == set(files)
        assert everything(rig.store) == before
        rig.close()
        rig.open()  # the map of tiered segments from the bucket's manifest alone
        assert rig.qlog.tiered == set(files) and everything(rig.store) == before
        reference.compact(reference.slot("kv", 0))
        rig.store.compact(rig.store.slot("kv", 0))  # a round reading its input from S3
        assert everything(rig.store) == everything(reference)
        rig.tier.run_pass(rig.store)
        assert set(s3.objects(bucket, "mq/compaction/a/segments/")) == {
            f"mq/{s.key}" for s in rig.tier.segments().values()}  # replaced objects deleted, no orphan
    finally:
        reference.close()
        rig.close()


def test_a_stalled_store_fails_tier_reads_within_the_deadline_and_local_reads_answer(s3, tmp_path):
    bucket = s3.bucket()
    rig = _rig(tmp_path, bucket, s3.endpoint)
    rig.open()
    fill(rig.store, rig.clock, 200)
    put(rig.store, "local", b"v", 200, rig.clock.now_ms())
    rig.tier.run_pass(rig.store)
    assert rig.qlog.tiered
    rig.close()
    with stalled_server() as stalled:
        rig = _rig(tmp_path, bucket, s3.endpoint, tier_cache_bytes=0)  # (its start read every segment once)
        rig.open()  # (the manifest read from the live server)
        rig.tier.reader.objects = open_store(f"s3://{bucket}/mq", timeout_ms=500, endpoint=stalled, region=REGION,
                                             credentials=rig.config.credentials)  # then the store stalls
        try:
            began = time.monotonic()
            with pytest.raises(Unavailable, match=f"s3://{bucket}/mq"):
                rig.qlog.read(0, 5)
            assert time.monotonic() - began < 5
            assert reads.get_latest(rig.store, "kv", "local").stored.entry.queue_offset == 200  # local: at once
        finally:
            rig.tier.reader.objects.close()
            rig.close()


def test_a_start_with_the_tier_stalled_serves_local_data_and_reads_the_manifest_once_it_answers(s3, tmp_path):
    """The commit log's rule for the compactor: a start whose tier does not answer goes on, local data answers,
    tiered segments (and keys only there) answer UNAVAILABLE naming the tier, a round waits; once the tier
    answers, the duty reads the manifest and every read and the key table are as before."""
    host, port = s3.endpoint.removeprefix("http://").split(":")
    proxy = TcpProxy((host, int(port)))
    bucket = s3.bucket()
    rig = _rig(tmp_path, bucket, f"http://{proxy.address}", tier_read_timeout_ms=500)
    try:
        rig.open()
        fill(rig.store, rig.clock, 200)
        put(rig.store, "local", b"v", 200, rig.clock.now_ms())
        rig.tier.run_pass(rig.store)
        tiered, before = set(rig.qlog.tiered), everything(rig.store)
        latest = {k: reads.get_latest(rig.store, "kv", k).stored.raw for k in [f"k{i}" for i in range(12)] + ["local"]}
        assert tiered
        rig.close()
        proxy.partition()  # the tier stalls: every new connection is accepted and never answered
        began = time.monotonic()
        rig.open()  # starts: the manifest's read fails within --tier-read-timeout-ms
        assert time.monotonic() - began < 10 and not rig.tier.loaded
        assert rig.qlog.tiered == tiered  # (the lone .cq files kept)
        assert reads.get_latest(rig.store, "kv", "local").stored.raw == latest["local"]  # local data answers
        with pytest.raises(Unavailable, match=f"s3://{bucket}/mq.*manifest is not read yet"):
            rig.qlog.read(0, 5)
        with pytest.raises(Unavailable, match=f"s3://{bucket}/mq"):
            reads.get_latest(rig.store, "kv", "k1")  # only in tiered segments: never NOT_FOUND
        with pytest.raises(Unavailable, match="manifest is not read yet"):
            rig.store.compact(rig.store.slot("kv", 0))  # refused before it starts
        assert rig.store.run_due() == 0 and not rig.store.slot("kv", 0).quarantine.failures  # waits, no quarantine
        duty = TierDuty(rig.tier, rig.store)
        duty.step()  # still stalled: nothing uploaded, nothing deleted
        assert not rig.tier.loaded and all((rig.qlog.directory / cseg.index_name(b)).exists() for b in tiered)
        proxy.heal()
        wait_until(lambda: duty.step() is None and rig.tier.loaded, timeout_s=30, what="the manifest read")
        assert everything(rig.store) == before
        assert {k: reads.get_latest(rig.store, "kv", k).stored.raw for k in latest} == latest
        rig.store.compact(rig.store.slot("kv", 0))  # rounds run again
    finally:
        proxy.heal()
        rig.close()
        proxy.close()
