"""Two compactors on one etcd (``--etcd-endpoints``, issue 34, item 3), real processes on 127.0.0.1: a commit log,
etcd, compactors ``a`` and ``b`` each following the log. Keyed appends to a COMPACTION topic go on while the
active one runs rounds and the standby runs none; kill -9 of the active one in the middle: the standby takes the
lease and runs rounds from its own logs, its compacted view is the last value of each acknowledged key, and
either instance answers reads (a client given both goes on to the one alive). Both have one file:// tier for
their sealed segments (``--tier-url``, mqstore.compaction.tier): only the active uploads (under its instance
id), the standby none; after the takeover the new active uploads its own, leaves the old one's objects alone,
and serves its segments from the tier once local retention deleted them."""

from __future__ import annotations

import json
import threading

import grpc
import pytest

from mqstore_rpc.etcd_client import EtcdCoordination
from mqstore_rpc.endpoints import Failover
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as clpb, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from tests.integration.test_compactor_replica import compactor, everything
from tests.support.ha import etcd_or_skip
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.e2e]
T = 10
WAIT_S = 120
KEYS = 20
PREFIX = "/test/compactors"
FLAGS = ["--etcd-prefix", PREFIX, "--round-interval-ms", "100", "--min-cleanable-dirty-ratio", "0.01"]


def _describe(stub) -> pb.QueueDescription | None:
    try:
        return stub.DescribeQueue(pb.DescribeQueueRequest(topic="kv", queue_id=0), timeout=T)
    except grpc.RpcError:
        return None


def _objects(tmp_path, instance: str) -> set[str]:
    root = tmp_path / "tier" / "compaction" / instance / "segments"
    return {str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")}


def _latest(stub, key: str) -> bytes | None:
    try:
        return stub.GetLatest(pb.GetLatestRequest(topic="kv", key=key), timeout=T).value
    except grpc.RpcError:
        return None


def test_the_standby_takes_over_rounds_after_kill_9_of_the_active_and_both_answer_reads(tmp_path):
    etcd = etcd_or_skip()
    coordination = EtcdCoordination(etcd.endpoint)
    procs, channels = {}, []
    try:
        log_process = commitlog(tmp_path / "log").started()
        procs["log"] = log_process
        log_channel = grpc.insecure_channel(log_process.address)
        channels.append(log_channel)
        log = commitlog_pb2_grpc.CommitLogStub(log_channel)
        (tmp_path / "tier").mkdir()
        log.CreateTopic(clpb.CreateTopicRequest(name="kv", queue_count=1, kind=common_pb2.TOPIC_KIND_COMPACTION),
                        timeout=T)
        stubs = {}
        for name in ("a", "b"):
            procs[name] = compactor(tmp_path / name, "--commitlog", log_process.address, "--etcd-endpoints",
                                    etcd.endpoint, "--instance-id", name, *FLAGS, "--tier-url",
                                    f"file://{tmp_path / 'tier'}", "--local-retention-bytes", "1",
                                    "--tier-upload-interval-ms", "100")
            channels.append(grpc.insecure_channel(procs[name].address))
            stubs[name] = compactor_pb2_grpc.CompactorStub(channels[-1])

        def active() -> str:
            value = coordination.get(f"{PREFIX}/active").value
            return json.loads(value)["instance"] if value else ""

        wait_until(lambda: active() in stubs, "one compactor to take the lease", timeout_s=WAIT_S)
        first = active()
        standby = "b" if first == "a" else "a"
        model: dict[str, bytes] = {}
        sent = [0]

        def append(n: int) -> None:
            for _ in range(n):
                values = [(f"k{(sent[0] + i) % KEYS}", f"v{sent[0] + i}".encode() * 40) for i in range(10)]
                log.Append(clpb.AppendRequest(topic="kv", messages=[
                    common_pb2.MessageInput(body=v, keys=[k]) for k, v in values]), timeout=T)
                model.update(values)  # acknowledged: the last value of each key
                sent[0] += 10

        append(40)
        wait_until(lambda: (d := _describe(stubs[first])) is not None and d.cleaned_up_to_offset >= 0,
                   "the active compactor to run a round", timeout_s=WAIT_S)
        standby_before = _describe(stubs[standby])
        assert standby_before is not None and standby_before.cleaned_up_to_offset == -1  # it ran no round
        wait_until(lambda: _objects(tmp_path, first), "the active compactor to upload segments", timeout_s=WAIT_S)
        assert not _objects(tmp_path, standby)  # the standby uploads nothing
        with pytest.raises(grpc.RpcError) as refused:
            stubs[standby].Compact(pb.CompactRequest(topic="kv", seal_active=True), timeout=T)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "standby" in refused.value.details()
        def role(name: str) -> tuple[str, str]:
            stats = stubs[name].Stats(pb.CompactorStatsRequest(), timeout=T)
            return stats.role, stats.active_instance

        assert role(first) == ("active", first)
        wait_until(lambda: role(standby) == ("standby", first), "the standby's Stats to name the active one",
                   timeout_s=WAIT_S)

        writer = threading.Thread(target=append, args=(40,))
        writer.start()
        procs[first].kill9()  # during rounds and appends
        writer.join(timeout=WAIT_S)
        assert not writer.is_alive()
        append(10)

        wait_until(lambda: active() == standby, "the standby to take the lease", timeout_s=WAIT_S)
        wait_until(lambda: (d := _describe(stubs[standby])) is not None and d.cleaned_up_to_offset >= 0,
                   "the new active compactor to run rounds", timeout_s=WAIT_S)
        wait_until(lambda: all(_latest(stubs[standby], k) == v for k, v in model.items()),
                   "the new active compactor to hold the last value of each key", timeout_s=WAIT_S)
        held = everything(stubs[standby], "kv", 0)
        latest = {}
        for _, key, body in held:
            latest[key] = body
        assert latest == model
        assert role(standby) == ("active", standby)
        old_objects = _objects(tmp_path, first)
        wait_until(lambda: _objects(tmp_path, standby) and len(list((tmp_path / standby / "logs" / "kv" / "0").glob(
            "*.log"))) == 1, "the new active to upload its segments and delete their local copies", timeout_s=WAIT_S)
        assert {k: v for _, k, v in everything(stubs[standby], "kv", 0)} == model  # read from the tier
        assert _objects(tmp_path, first) == old_objects  # the old active's objects are its own: untouched
        assert len(held) < sent[0]  # compacted: superseded records are gone
        offsets = [offset for offset, _, _ in held]
        assert offsets == sorted(set(offsets))  # each record once, in order

        # a client given both (the dead one first) is answered by the one alive
        both = Failover([procs[first].address, procs[standby].address], grpc.insecure_channel,
                        compactor_pb2_grpc.CompactorStub)
        assert both.call("GetLatest", pb.GetLatestRequest(topic="kv", key="k3"), timeout=T).value == model["k3"]
        both.call("Compact", pb.CompactRequest(topic="kv", seal_active=True), timeout=60)  # on the active one
    finally:
        for proc in procs.values():
            proc.stop()
        for channel in channels:
            channel.close()
        coordination.close()
        etcd.stop()


def test_two_compactors_hold_the_logs_retention_under_names_of_their_own(tmp_path):
    etcd = etcd_or_skip()
    procs = []
    try:
        log_process = commitlog(tmp_path / "log").started()
        procs.append(log_process)
        for name in ("a", "b"):
            procs.append(compactor(tmp_path / name, "--commitlog", log_process.address, "--etcd-endpoints",
                                   etcd.endpoint, "--instance-id", name, *FLAGS))
        with grpc.insecure_channel(log_process.address) as channel:
            log = commitlog_pb2_grpc.CommitLogStub(channel)

            def names() -> set[str]:
                return {h.name for h in log.ListRetentionHolds(clpb.ListRetentionHoldsRequest(), timeout=T).holds}

            wait_until(lambda: {"compactor-a", "compactor-b"} <= names(), "both holds", timeout_s=WAIT_S)
    finally:
        for proc in procs:
            proc.stop()
        etcd.stop()
