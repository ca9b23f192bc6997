"""Crash tests with real processes: kill -9 the CommitLog server while producers append under SYNC
flush; every acknowledged message must read back byte-identical; nothing that fails its CRC is served.
Torn tails and mid-file corruption behave as the recovery table says, and `mqstore repair` fixes the
latter, keeping a .broken copy."""

from __future__ import annotations

import json
import pathlib
import random
import subprocess
import sys
import threading
import time

import grpc
import pytest

from mqstore.format import checkpoint as cpfmt, record
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support import records
from tests.support.processes import commitlog

pytestmark = [pytest.mark.crash, pytest.mark.slow]

PRODUCERS = 4
CYCLES = 3
APPEND_WINDOW_S = 2.0
SEGMENT = "65536"


def _stub(address):
    channel = grpc.insecure_channel(address)
    return channel, commitlog_pb2_grpc.CommitLogStub(channel)


def _producer(address, producer_id, stop, acked, seed):
    rng = random.Random(seed)
    channel, stub = _stub(address)
    seq = 0
    try:
        for _ in range(100_000):  # bounded; the stop event or the kill ends it first
            if stop.is_set():
                return
            bodies = []
            for _ in range(rng.randint(1, 40)):  # large batches: a kill often lands inside a copy
                bodies.append(f"p{producer_id}-{seq}-".encode() + rng.randbytes(rng.randint(1, 3000)))
                seq += 1
            request = pb.AppendRequest(topic="crash", messages=[common_pb2.MessageInput(body=b) for b in bodies])
            try:
                response = stub.Append(request, timeout=10)
            except grpc.RpcError:
                return  # the server died: this batch was not acknowledged
            for body, result in zip(bodies, response.results, strict=True):
                assert result.durability == common_pb2.DURABILITY_FLUSHED
                acked.append((body, result))
    finally:
        channel.close()


def _verify(address, acked):
    channel, stub = _stub(address)
    try:
        for body, result in acked:
            msg = stub.GetMessage(pb.GetMessageRequest(msg_id=result.msg_id), timeout=10)
            assert msg.body == body and msg.queue_offset == result.queue_offset
            assert msg.body_crc == record.body_crc(body)
        by_queue = {}
        for body, result in acked:
            by_queue.setdefault(result.queue_id, {})[result.queue_offset] = body
        for queue_id, expected in by_queue.items():
            offset, seen = 0, {}
            info = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="crash", queue_id=queue_id), timeout=10)
            while offset < info.max_offset:
                page = stub.Pull(pb.PullRequest(topic="crash", queue_id=queue_id, offset=offset, max_messages=500),
                                 timeout=10)
                for m in page.messages:
                    assert m.body_crc == record.body_crc(m.body)
                    seen[m.queue_offset] = m.body
                offset = page.next_offset
            assert sorted(seen) == list(range(info.max_offset)), "queue offsets are contiguous"
            for queue_offset, body in expected.items():
                assert seen[queue_offset] == body
    finally:
        channel.close()


def test_kill9_under_sync_loses_nothing_acknowledged(tmp_path):
    data = tmp_path / "data"
    acked: list = []
    for cycle in range(CYCLES):
        server = commitlog(data, "--flush-mode", "SYNC", "--segment-size-bytes", SEGMENT).started()
        try:
            if cycle == 0:
                channel, stub = _stub(server.address)
                stub.CreateTopic(pb.CreateTopicRequest(name="crash", queue_count=4), timeout=10)
                channel.close()
            else:
                _verify(server.address, acked)
            stop = threading.Event()
            threads = [threading.Thread(target=_producer, args=(server.address, p, stop, acked, cycle * 100 + p))
                       for p in range(PRODUCERS)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + APPEND_WINDOW_S
            target = len(acked) + 400
            while time.monotonic() < deadline and len(acked) < target:
                time.sleep(0.05)  # pacing the load window, not synchronising on an event
            server.kill9()
            stop.set()
            for t in threads:
                t.join(30)
        finally:
            server.stop()
    print(f"acknowledged messages over {CYCLES} kill cycles: {len(acked)}")
    assert len(acked) >= CYCLES * 50, "the producers made real progress before each kill"
    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()
    try:
        started = [json.loads(line) for line in server.lines if '"store.started"' in line]
        assert started and started[-1]["unclean"] is True, server.stderr()
        _verify(server.address, acked)
    finally:
        server.stop()


def _fill_and_stop(data, count=60):
    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()
    try:
        channel, stub = _stub(server.address)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=10)
        results = list(stub.Append(pb.AppendRequest(topic="t", messages=[
            common_pb2.MessageInput(body=bytes([i]) * 2000) for i in range(count)]), timeout=10).results)
        end = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10).max_physical_offset
        channel.close()
    finally:
        assert server.stop() == 0
    return results, end


def _segment(data, physical_offset):
    size = int(SEGMENT)
    return data / "commitlog" / f"{physical_offset - physical_offset % size:020d}", physical_offset % size


def test_torn_tail_cut_on_restart(tmp_path):
    data = tmp_path / "data"
    results, end = _fill_and_stop(data)
    path, pos = _segment(data, end)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(records.encode(topic=b"t", body=b"x" * 900)[:300])
    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()
    try:
        cut = [line for line in server.lines if "recovery.torn_tail_truncated" in line]
        assert cut and '"bytes_cut": 300' in cut[0]
        channel, stub = _stub(server.address)
        info = stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10)
        assert info.max_physical_offset == end
        assert stub.GetMessage(pb.GetMessageRequest(msg_id=results[-1].msg_id), timeout=10).body == bytes([59]) * 2000
        channel.close()
    finally:
        server.stop()


def test_mid_file_corruption_refuses_start_until_repair(tmp_path):
    data = tmp_path / "data"
    results, end = _fill_and_stop(data)
    victim = results[10]
    path, pos = _segment(data, victim.physical_offset)
    with open(path, "r+b") as f:
        f.seek(pos + 200)
        f.write(b"\x00\xff\x00\xff")
    cp = cpfmt.decode((data / "checkpoint").read_bytes())
    assert cp.flushed_physical_offset == end
    (data / "checkpoint").unlink()  # a lost checkpoint: the whole log is re-checked
    refused = commitlog(data, "--segment-size-bytes", SEGMENT)
    code = refused.wait_exit(60)
    refused.stop()
    assert code != 0
    assert str(path) in refused.stderr() and f"position {pos}" in refused.stderr()
    assert "mqstore repair" in refused.stderr()

    cli = pathlib.Path(sys.executable).with_name("mqstore")
    repaired = subprocess.run([str(cli), "repair", "--data-dir", str(data)], capture_output=True, text=True,
                              timeout=120)
    assert repaired.returncode == 0, repaired.stderr
    assert (path.parent / (path.name + ".broken")).exists()

    server = commitlog(data, "--segment-size-bytes", SEGMENT).started()
    try:
        channel, stub = _stub(server.address)
        for i, r in enumerate(results[:10]):
            assert stub.GetMessage(pb.GetMessageRequest(msg_id=r.msg_id), timeout=10).body == bytes([i]) * 2000
        info = stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="t", queue_id=0), timeout=10)
        assert info.max_offset == 10
        with pytest.raises(grpc.RpcError) as err:
            stub.GetMessage(pb.GetMessageRequest(msg_id=results[20].msg_id), timeout=10)
        assert err.value.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND)
        channel.close()
    finally:
        server.stop()
