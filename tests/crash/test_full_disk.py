"""A full disk, for real: a CommitLog process on a 64 MiB tmpfs that a filler file fills to the last byte.

Appends are refused with RESOURCE_EXHAUSTED (a batch whose consume queue file cannot be allocated
included: no SIGBUS from a sparse mapped page), reads go on, CreateTopic and CommitOffset are refused
at once, SIGTERM exits 0, a restart on the still-full disk comes up read-only and serves every
acknowledged message, and once space is freed appends work again.
"""

from __future__ import annotations

import signal
import subprocess
import time

import grpc
import pytest

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc, common_pb2
from tests.support.processes import commitlog
from tests.support.tmpfs import mounted_tmpfs

pytestmark = [pytest.mark.crash, pytest.mark.slow]

RPC_TIMEOUT_S = 10
QUICK_S = 5.0  # "at once": half the metadata store's 10 s lock wait (not a speed check)
# The default disk limit (90%) on this test's own small disk: the suite gives every other store 0.99, so that the
# machine's disk level does not matter (tests/conftest.py)
STORE_FLAGS = ("--segment-size-bytes", "1MiB", "--cq-entries-per-file", "1024", "--disk-max-used-ratio", "0.9")
Code = grpc.StatusCode


@pytest.fixture
def disk(tmp_path):
    yield from mounted_tmpfs(tmp_path / "disk", "64m")


def _append(stub, queue_id: int, bodies: list[bytes]):
    messages = [common_pb2.MessageInput(body=b, queue_id=queue_id) for b in bodies]
    return stub.Append(pb.AppendRequest(topic="t", messages=messages), timeout=RPC_TIMEOUT_S).results


def _append_once_writable(stub, disk, proc):
    """The append after the disk check found room again. A check that read the disk before the filler's
    space came back may still refuse one append (CI saw "disk 98.4% full" right after writable_again,
    once, on a loaded machine): retried until the deadline, and the disk's files are named if it never
    goes through."""
    deadline = time.monotonic() + RPC_TIMEOUT_S
    while True:
        try:
            return _append(stub, 1, [b"after"])
        except grpc.RpcError as exc:
            if exc.code() != Code.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                files = subprocess.run(["du", "-a", "-k", str(disk.path)], capture_output=True, text=True).stdout
                raise AssertionError(f"append refused after store.writable_again: {exc.details()}; "
                                     f"free {disk.free_bytes()} bytes; files:\n{files}\n"
                                     f"stderr:\n{proc.stderr()}") from exc
            time.sleep(0.1)


def _refused(call) -> grpc.RpcError:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert time.monotonic() - started < QUICK_S
    return info.value


def _pull_all(stub, queue_id: int) -> list[bytes]:
    response = stub.Pull(pb.PullRequest(topic="t", queue_id=queue_id, offset=0, max_messages=1000),
                         timeout=RPC_TIMEOUT_S)
    return [m.body for m in response.messages]


def _store_info(stub) -> pb.StoreInfo:
    return stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S)


def test_full_disk_is_read_only_never_fatal(disk):
    data = disk.path / "data"
    acked = [b"m%d" % i for i in range(20)]
    # First life: no disk check during the test (clean interval 60 s), so every refusal below comes
    # from a file that could not be allocated, not from the used-ratio check.
    with commitlog(data, *STORE_FLAGS, "--clean-interval-ms", "60000").started() as proc, \
            grpc.insecure_channel(proc.address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=4), timeout=RPC_TIMEOUT_S)
        _append(stub, 0, acked)
        end = _store_info(stub).max_physical_offset
        disk.fill()

        # Queue 1 has no consume queue file yet: its file cannot be allocated, so the batch is refused
        # before a byte reaches the log (a sparse file here used to die with SIGBUS).
        error = _refused(lambda: _append(stub, 1, [b"never"]))
        assert error.code() == Code.RESOURCE_EXHAUSTED, (error.details(), proc.process.poll())  # -7: SIGBUS
        assert proc.process.poll() is None, proc.stderr()
        assert _refused(lambda: _append(stub, 0, [b"never"])).code() == Code.RESOURCE_EXHAUSTED
        info = _store_info(stub)
        assert info.read_only and info.max_physical_offset == end

        assert _pull_all(stub, 0) == acked
        assert stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="t", queue_id=1), timeout=RPC_TIMEOUT_S).max_offset == 0
        create = _refused(lambda: stub.CreateTopic(pb.CreateTopicRequest(name="u"), timeout=RPC_TIMEOUT_S))
        commit = _refused(lambda: stub.CommitOffset(pb.CommitOffsetRequest(group="g", topic="t", queue_id=0, offset=3),
                                                    timeout=RPC_TIMEOUT_S))
        assert (create.code(), commit.code()) == (Code.RESOURCE_EXHAUSTED, Code.RESOURCE_EXHAUSTED)

        proc.process.send_signal(signal.SIGTERM)
        assert proc.wait_exit() == 0, proc.stderr()
        assert '"checkpoint.skipped"' in proc.stderr()

    # Second life, on the disk still full (stopping gave SQLite's -wal/-shm bytes back: take them too).
    disk.fill()
    with commitlog(data, *STORE_FLAGS, "--clean-interval-ms", "100", "--checkpoint-interval-ms", "100").started() \
            as proc, grpc.insecure_channel(proc.address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        assert '"space_reserve.released"' in proc.stderr()  # its bytes let SQLite open on the full disk
        assert _store_info(stub).read_only
        assert _pull_all(stub, 0) == acked
        assert _refused(lambda: _append(stub, 1, [b"never"])).code() == Code.RESOURCE_EXHAUSTED
        assert proc.process.poll() is None, proc.stderr()

        disk.free_filler()
        proc.wait_for("store.writable_again", timeout_s=RPC_TIMEOUT_S)
        assert [r.queue_offset for r in _append_once_writable(stub, disk, proc)] == [0]
        assert _pull_all(stub, 1) == [b"after"]
        stub.CreateTopic(pb.CreateTopicRequest(name="u"), timeout=RPC_TIMEOUT_S)
        assert proc.stop() == 0, proc.stderr()
