"""The object storage tier with a real commit log process and a real S3-compatible server (moto's server mode
on 127.0.0.1, one per module): sealed commit log segments are uploaded byte-identical, and a process killed
(os._exit, as kill -9) after an upload's object was put but before its FINISHED record, then killed again
between a STARTED record and its put, ends after a restart with one FINISHED attempt per sealed segment, its
object the segment's bytes, and no other object in the bucket (mqstore.tier.uploader)."""

from __future__ import annotations

import grpc
import pytest

from mqstore.config import StoreConfig
from mqstore.store_parts import build_store
from mqstore.tier.ledger import Ledger
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.s3 import moto_s3
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.integration]

SEGMENT = 64 * 1024
PREFIX = "node1"


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


def _spawn(data_dir, s3, bucket, failpoints=""):
    env = {**s3.env(), **({"MQSTORE_FAILPOINTS": failpoints} if failpoints else {})}
    return commitlog(data_dir, "--tier-url", f"s3://{bucket}/{PREFIX}", "--tier-upload-interval-ms", "100",
                     "--segment-size-bytes", str(SEGMENT), "--warm-ahead-bytes", "0", env=env)


def _start(data_dir, s3, bucket, failpoints=""):
    return _spawn(data_dir, s3, bucket, failpoints).started()


def _live_until_it_dies(data_dir, s3, bucket, failpoints: str, first_batch: int) -> int:
    """A life that ends at its armed failpoint: appends until then, unless the uploader reaches the failpoint
    while the node starts (a restart finds sealed segments to upload at once, and may die before it serves:
    the fresh clone's CI run did). Returns the next batch number."""
    node = _spawn(data_dir, s3, bucket, failpoints)
    try:
        try:
            event = node.wait_for("server.started")
        except AssertionError:
            assert node.process.poll() == 137, node.stderr()  # died at its failpoint before serving
            return first_batch
        node.address = f"127.0.0.1:{event['port']}"
        return _append_until_it_dies(node, first_batch)
    finally:
        node.stop()


def _append_until_it_dies(node, first_batch: int) -> int:
    """Append batches of ~16 KiB (the uploader sees a segment sealed every few) until the process exits at its
    armed failpoint; returns the next batch number. Bounded."""
    channel = grpc.insecure_channel(node.address)
    stub = commitlog_pb2_grpc.CommitLogStub(channel)
    batch = first_batch
    try:
        if first_batch == 0:
            stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        for batch in range(first_batch, first_batch + 400):
            if node.process.poll() is not None:
                break
            try:
                stub.Append(pb.AppendRequest(topic="t", messages=[
                    common_pb2.MessageInput(body=bytes([batch % 251]) * 4000) for _ in range(4)]), timeout=10)
            except grpc.RpcError:
                break  # it died
    finally:
        channel.close()
    assert node.wait_exit(60) == 137, node.stderr()
    return batch + 1


def _sealed_files(data_dir) -> dict[int, bytes]:
    files = sorted((data_dir / "commitlog").iterdir())
    # Sealed for sure: all but the last two (the last full one is sealed once the flush passes its end)
    return {int(path.name): path.read_bytes() for path in files[:-2]}


def test_uploads_are_byte_identical_and_kills_between_the_phases_leave_one_finished_each(tmp_path, s3):
    data_dir, bucket = tmp_path / "node", s3.bucket()
    with _start(data_dir, s3, bucket, "tier.upload.after_put=exit") as node:
        batch = _append_until_it_dies(node, 0)
    assert len(s3.objects(bucket)) == 1  # put, never FINISHED
    _live_until_it_dies(data_dir, s3, bucket, "tier.upload.started=exit", batch)
    with _start(data_dir, s3, bucket) as node:
        sealed = _sealed_files(data_dir)
        assert len(sealed) >= 2

        def uploaded():
            by_base = {}
            for key, data in s3.objects(bucket, PREFIX + "/").items():
                by_base.setdefault(int(key.split("/")[2]), []).append(data)
            return by_base if all(by_base.get(base) == [data] for base, data in sealed.items()) else None
        wait_until(uploaded, "every sealed segment uploaded once, byte-identical", 60)
        assert node.stop() == 0
    store = build_store(StoreConfig(data_dir=data_dir, segment_size_bytes=SEGMENT))
    store.start()
    try:
        ledger = Ledger.of_store(store)
        ledger.catch_up()
        finished, pending = ledger.snapshot()
    finally:
        store.stop()
    assert not pending and ledger.conflicts == 0
    objects = s3.objects(bucket)
    assert sorted(objects) == sorted(f"{PREFIX}/{upload.key}" for upload in finished.values())  # no orphan
    for base, upload in finished.items():
        assert objects[f"{PREFIX}/{upload.key}"] == (data_dir / "commitlog" / f"{base:020d}").read_bytes()
