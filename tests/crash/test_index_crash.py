"""Crash tests of the Index service with real processes (``python -m commitlog_service.main`` and
``python -m index_service.main`` on 127.0.0.1):

* kill -9 of the index while producers append: after each restart it catches up from its checkpoint;
  at the end every appended key is found exactly once and the files hold no duplicate entry;
* kill -9 and restart of the commit log while the index follows: the index keeps answering, reports
  it is not connected, reconnects and catches up without skipping a record; a batch written before
  the kill but never acknowledged is indexed once or not at all (a failpoint makes the written case
  certain);
* kill -9 at each phase of a move to the tier (before the put, between it and FINISHED, after FINISHED): on
  restart every key is found once and no object is left that the index's manifest does not name;
* a damaged index file (truncated while the index is stopped): quarantined on start, rebuilt from the
  log while newer ranges answer, and a query over the damaged range says FAILED_PRECONDITION instead
  of returning a partial answer (a failpoint holds the rebuild so that this can be observed).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import grpc
import pytest
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import (
    commitlog_pb2_grpc,
    common_pb2,
    index_pb2,
    index_pb2_grpc,
)

from mqstore.index.tier_manifest import TierManifest
from tests.support.processes import ServiceProcess, commitlog

pytestmark = [pytest.mark.crash, pytest.mark.slow]

RPC_TIMEOUT_S = 10
WAIT_S = 240  # an index restarted after kill -9 catches up under a producer; on a loaded 2-core machine 60 s was short
POLL_S = 0.02
TOPIC = "crash"
MAX_BATCHES = 200
BATCH = 20
THROTTLE_S = 0.005          # between batches: the kills land while appends still run
TIER_KILL_POINTS = ("index.tier.started", "index.tier.after_put", "index.tier.finished")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_index(data_dir, log_address: str, env: dict[str, str] | None = None, *,
                started: bool = True) -> ServiceProcess:
    """The index process; ``started``: once it has logged server.started (a process armed to die at a
    failpoint may die before)."""
    args = ["--data-dir", str(data_dir), "--port", "0", "--grace-s", "1", "--commitlog", log_address,
            "--slot-count", "64", "--entry-count", "3000", "--max-keys-per-message", "8",
            "--checkpoint-interval-ms", "50", "--maintenance-interval-ms", "100", "--maintenance-retry-ms", "100",
            "--heartbeat-ms", "50", "--backoff-initial-ms", "20", "--backoff-max-ms", "300",
            "--rebuild-interval-ms", "100", "--rpc-timeout-ms", "3000"]
    process = ServiceProcess("index_service.main", args, env)
    return process.started() if started else process


def crash(process: ServiceProcess) -> None:
    """kill -9, then release the pipe of its stderr."""
    process.kill9()
    process.stop()


def logged(process: ServiceProcess, event: str) -> list[dict]:
    """The JSON log events named ``event`` the process has written so far."""
    found = []
    for line in list(process.lines):
        if f'"{event}"' in line:
            item = json.loads(line)
            if item.get("event") == event:
                found.append(item)
    return found


def start_log(data_dir, port: int = 0, env: dict[str, str] | None = None) -> ServiceProcess:
    return commitlog(data_dir, "--port", str(port), "--segment-size-bytes", "1MiB",
                     "--preallocate-segments", "false", env=env).started()


class Client:
    """Stubs for one commit log and one index address. Not thread-safe."""

    def __init__(self, log_address: str, index_address: str):
        self._channels = [grpc.insecure_channel(log_address), grpc.insecure_channel(index_address)]
        self.log = commitlog_pb2_grpc.CommitLogStub(self._channels[0])
        self.index = index_pb2_grpc.IndexStub(self._channels[1])

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def stats(self) -> index_pb2.IndexStats:
        return self.index.Stats(index_pb2.IndexStatsRequest(), timeout=RPC_TIMEOUT_S)

    def query(self, key: str, **fields) -> index_pb2.QueryByKeyResponse:
        return self.index.QueryByKey(index_pb2.QueryByKeyRequest(topic=TOPIC, key=key, **fields),
                                     timeout=RPC_TIMEOUT_S)


def wait_until(condition, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < deadline:
        try:
            value = condition()
        except grpc.RpcError:
            value = None  # a server still starting; keep polling until the deadline
        if value:
            return value
        pause.wait(POLL_S)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def wait_indexed(client: Client) -> index_pb2.IndexStats:
    end = client.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).visible_physical_offset
    return wait_until(lambda: (s := client.stats()).indexed_physical_offset >= end and s, f"the index at {end}")


class Producer:
    """Thread ``producer``: appends batches with a unique key per message (and "all") until stopped, the
    server dies, MAX_BATCHES, or (when ``allow`` set a limit) until that many messages are acknowledged;
    ``acked`` holds (key, AppendResult) of acknowledged messages and ``in_doubt`` the keys of the batch in
    flight when the server died: written or not, never acknowledged."""

    def __init__(self, log_address: str, first: int = 0):
        self.acked: list[tuple[str, pb.AppendResult]] = []
        self.in_doubt: list[str] = []
        self.stop_event = threading.Event()
        self._address = log_address
        self._next = first
        self._limit: int | None = None
        self.error = ""  # why it stopped early (the server died, or an append failed)
        self._more = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def allow(self, count: int) -> None:
        """Append until ``count`` messages are acknowledged (then wait for a higher limit): a test paces the
        producer, so that there is always something left to append after it restarts a follower."""
        with self._more:
            self._limit = count
            self._more.notify_all()

    def _wait_for_allowance(self) -> bool:
        with self._more:
            return self._more.wait_for(lambda: self.stop_event.is_set() or self._limit is None
                                       or len(self.acked) < self._limit, RPC_TIMEOUT_S)

    def append(self, stub, count: int) -> None:
        for first in range(0, count, 1000):  # Append takes at most 1000 messages
            keys = [f"key-{self._next + i}" for i in range(min(1000, count - first))]
            self._next += len(keys)
            request = pb.AppendRequest(topic=TOPIC, messages=[
                common_pb2.MessageInput(body=k.encode(), keys=[k, "all"]) for k in keys])
            try:
                response = stub.Append(request, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError:
                self.in_doubt += keys
                raise
            self.acked += zip(keys, response.results, strict=True)

    def _run(self) -> None:
        with grpc.insecure_channel(self._address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            for _ in range(MAX_BATCHES):
                while not self._wait_for_allowance():
                    pass
                if self.stop_event.is_set():
                    return
                try:
                    self.append(stub, BATCH)
                except grpc.RpcError as exc:
                    self.error = f"{exc.code()}: {exc.details()}"
                    return  # the server died: that batch was not acknowledged
                self.stop_event.wait(THROTTLE_S)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._more:
            self.stop_event.set()
            self._more.notify_all()
        self._thread.join(RPC_TIMEOUT_S * 2)
        assert not self._thread.is_alive()

    def wait_for(self, count: int) -> None:
        wait_until(lambda: len(self.acked) >= count or not self._thread.is_alive(), f"{count} acked messages")


def assert_each_key_once(client: Client, acked, in_doubt=(), every_key: bool = True) -> None:
    """Every acknowledged key is found once, at its offset; a key whose append was in flight when the
    log was killed may have been written before the kill: it is found once or not at all. Not
    ``every_key``: ``acked`` is a sample; the key "all" and the entry count are not checked."""
    for key, result in acked:
        found = client.query(key).locators
        assert [loc.physical_offset for loc in found] == [result.physical_offset], key
    written = []
    for key in in_doubt:
        found = [loc.physical_offset for loc in client.query(key).locators]
        assert len(found) <= 1, key
        written += found
    if not every_key:
        return
    everything, token = [], ""
    for _ in range(1000):
        page = client.query("all", max_num=500, page_token=token)
        everything += [loc.physical_offset for loc in page.locators]
        token = page.next_page_token
        if not token:
            break
    assert everything == sorted([r.physical_offset for _, r in acked] + written, reverse=True)
    assert client.stats().entries == 3 * (len(acked) + len(written))  # UNIQ_KEY, key-N, "all": once each


def test_kill9_index_during_appends_loses_and_duplicates_nothing(tmp_path):
    with start_log(tmp_path / "log") as log_proc:
        index = start_index(tmp_path / "index", log_proc.address)
        client = Client(log_proc.address, index.address)
        try:
            client.log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=4), timeout=RPC_TIMEOUT_S)
            producer = Producer(log_proc.address).start()
            for cycle in range(3):
                # 800 more messages after each restart (a producer left unpaced could finish before the
                # index restarted, and then the restarted index, its checkpoint at the end, had nothing to do)
                producer.allow((cycle + 1) * 800)
                wait_until(lambda c=client: c.stats().records_indexed > 100 or producer.error,
                           "the index to make progress")
                assert not producer.error, f"an append failed while the log was up: {producer.error}"
                crash(index)
                client.close()
                index = start_index(tmp_path / "index", log_proc.address)
                client = Client(log_proc.address, index.address)
            producer.stop()
            wait_indexed(client)
            assert_each_key_once(client, producer.acked)
        finally:
            client.close()
            index.stop()


def test_kill9_at_each_phase_of_a_tier_move_loses_nothing_holds_nothing_twice_and_leaves_no_orphan(tmp_path):
    """The index process dies (os._exit at the failpoint: kill -9) before the put, between the put and FINISHED,
    and after FINISHED of a move to a file:// tier (each restart dies at the next point); restarted without a
    failpoint, it finds every key once (a sample of keys; each file once: the entry count), and the tier holds
    exactly the objects its manifest names."""
    tier = tmp_path / "tier"
    tier.mkdir()
    with start_log(tmp_path / "log") as log_proc:
        with grpc.insecure_channel(log_proc.address) as channel:
            stub = commitlog_pb2_grpc.CommitLogStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=RPC_TIMEOUT_S)
            producer = Producer(log_proc.address)
            producer.append(stub, 3_500)  # 3 entries a message, 3,000 a file: three sealed files and a fourth
        for point in TIER_KILL_POINTS:
            dying = start_index(tmp_path / "index", log_proc.address,
                                env={"MQSTORE_FAILPOINTS": f"{point}=exit", "MQSTORE_TIER_DIR": str(tier)},
                                started=False)
            try:
                assert dying.wait_exit(WAIT_S) == 137, f"{point}: {dying.stderr()[-2000:]}"
            finally:
                dying.stop()
        index = start_index(tmp_path / "index", log_proc.address, env={"MQSTORE_TIER_DIR": str(tier)})
        client = Client(log_proc.address, index.address)
        try:
            wait_indexed(client)
            wait_until(lambda: (s := client.stats()).tiered_files == 3 and s.compact_files == 0 and s,
                       "the three sealed files on the tier")
            assert_each_key_once(client, producer.acked[::50], every_key=False)  # a sample: 3,500 queries take 20 s
            assert client.stats().entries == 3 * len(producer.acked)  # each file once
            manifest = TierManifest.load(tmp_path / "index" / "index", f"file://{tier.resolve()}")
            objects = sorted(p.relative_to(tier).as_posix() for p in tier.rglob("*")
                             if p.is_file() and not p.name.startswith("."))
            assert manifest.started == {} and objects == sorted(f.key for f in manifest.finished.values())
            assert list((tmp_path / "index" / "index").glob("*.cidx")) == []
        finally:
            client.close()
            index.stop()


def test_commitlog_restart_while_following(tmp_path):
    port = free_port()
    log_proc = start_log(tmp_path / "log", port)
    index = start_index(tmp_path / "index", log_proc.address)
    client = Client(log_proc.address, index.address)
    try:
        client.log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=RPC_TIMEOUT_S)
        producer = Producer(log_proc.address).start()
        producer.wait_for(600)
        crash(log_proc)
        producer.stop()
        down = wait_until(lambda: not (s := client.stats()).connected and s, "the index to notice")
        assert down.last_error and down.log_end_physical_offset >= down.indexed_physical_offset
        assert client.query("no-such-key").locators == []  # answered from the index alone
        with pytest.raises(grpc.RpcError) as unverifiable:  # candidates cannot be verified: says so
            client.query(producer.acked[0][0])
        assert unverifiable.value.code() == grpc.StatusCode.UNAVAILABLE
        log_proc = start_log(tmp_path / "log", port)
        more = Producer(log_proc.address, first=len(producer.acked) + 1_000_000)
        with grpc.insecure_channel(log_proc.address) as channel:
            more.append(commitlog_pb2_grpc.CommitLogStub(channel), 300)
        up = wait_until(lambda: (s := wait_indexed(client)).connected and s, "the index to reconnect")
        assert up.connected and up.reconnects >= 1 and up.bytes_behind == 0 and up.skipped_bytes == 0
        assert_each_key_once(client, producer.acked + more.acked, producer.in_doubt)
    finally:
        client.close()
        index.stop()
        log_proc.stop()


def test_append_written_but_never_acknowledged_is_indexed_once(tmp_path):
    """The log dies after copying a batch and before answering (failpoint log.after_write=exit): the
    producer sees an error, the records survive in the page cache, and after the restart the index
    holds them once, next to the acknowledged ones."""
    port = free_port()
    log_proc = start_log(tmp_path / "log", port, env={"MQSTORE_FAILPOINTS": "log.after_write=exit"})
    index = start_index(tmp_path / "index", log_proc.address)
    client = Client(log_proc.address, index.address)
    try:
        client.log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=RPC_TIMEOUT_S)
        lost = Producer(log_proc.address)
        with pytest.raises(grpc.RpcError):
            lost.append(client.log, BATCH)
        assert lost.acked == [] and len(lost.in_doubt) == BATCH
        crash(log_proc)  # already gone; releases its pipe
        log_proc = start_log(tmp_path / "log", port)
        more = Producer(log_proc.address, first=1_000)
        with grpc.insecure_channel(log_proc.address) as channel:
            more.append(commitlog_pb2_grpc.CommitLogStub(channel), 50)
        wait_until(lambda: (s := wait_indexed(client)).connected and s, "the index to catch up")
        assert_each_key_once(client, more.acked, lost.in_doubt)
        assert all(client.query(key).locators for key in lost.in_doubt), "the unacknowledged batch was written"
    finally:
        client.close()
        index.stop()
        log_proc.stop()


def test_damaged_index_file_is_quarantined_and_rebuilt(tmp_path):
    with start_log(tmp_path / "log") as log_proc:
        index = start_index(tmp_path / "index", log_proc.address)
        client = Client(log_proc.address, index.address)
        try:
            client.log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=RPC_TIMEOUT_S)
            old = Producer(log_proc.address)
            old.append(client.log, 3_000)  # 9,000 entries: three full files and a fourth
            wait_indexed(client)
            wait_until(lambda: client.stats().compact_files >= 3, "sealed files to be converted")
            _wait_for_wall_clock(old.acked[-1][1].store_timestamp_ms + 2_000)
            new = Producer(log_proc.address, first=10_000)
            new.append(client.log, 50)
            wait_indexed(client)
            assert index.stop() == 0
            client.close()

            victim = sorted((tmp_path / "index" / "index").glob("*.cidx"))[1]
            with open(victim, "r+b") as f:
                f.truncate(victim.stat().st_size // 2)
            index = start_index(tmp_path / "index", log_proc.address,
                                env={"MQSTORE_FAILPOINTS": "index.rebuild.after_rename=raise"})
            client = Client(log_proc.address, index.address)
            [quarantined] = logged(index, "index.file_quarantined")  # before server.started
            assert victim.name in quarantined["path"]
            wait_until(lambda: logged(index, "index.upkeep_failed"), "the rebuild to stop at the failpoint")
            assert client.stats().rebuilding_ranges
            with pytest.raises(grpc.RpcError) as partial:
                client.query("all")
            assert partial.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            recent = client.query("all", begin_ms=new.acked[0][1].store_timestamp_ms, max_num=100)
            expected = [r.physical_offset for _, r in reversed(new.acked)]
            assert [loc.physical_offset for loc in recent.locators] == expected
            crash(index)  # a crash after the rebuilt files were renamed, before the range was closed
            client.close()

            index = start_index(tmp_path / "index", log_proc.address)
            client = Client(log_proc.address, index.address)
            wait_until(lambda: not client.stats().rebuilding_ranges, "the rebuild to finish")
            # The events are read from the process's stderr by a thread: they may come a moment after
            # Stats shows the range closed.
            wait_until(lambda: logged(index, "index.rebuild_finished") and logged(index, "index.leftover_deleted"),
                       "the rebuild's events")
            assert_each_key_once(client, old.acked + new.acked)
        finally:
            client.close()
            index.stop()


def _wait_for_wall_clock(ms: int) -> None:
    """The index keeps store times in whole seconds: let the wall clock pass ``ms`` (bounded)."""
    pause = threading.Event()
    for _ in range(300):
        if time.time() * 1000 >= ms:
            return
        pause.wait(0.02)
    raise AssertionError("the wall clock did not advance")
