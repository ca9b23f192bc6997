"""Failover benchmark (issue 34, item 4): the time from a fault of the leader to the first SYNC append
acknowledged by the new leader, at the default lease (2 s), with clients that follow the leader.

Three CommitLog nodes with etcd (``--min-insync-replicas 2``, ``--default-replication SYNC``, every other
replication flag at its default) on fixed ports; --producers threads, each with its own CommitLogClient
given all three nodes (as the services are), append one 1 KiB message at a time, retrying whatever is not
acknowledged. --failovers times, alternating: kill -9 of the leader (restarted on its data dir once the
new leader acked) and SIGSTOP of the leader (SIGCONT once the new leader acked: it must follow, not ack).
Before each fault all three nodes are in sync and the producers are being acknowledged.

Figures: per fault kind and together, min / median / p90 / max of fault -> first ack of an epoch above the
old leader's (targets: median <= 2.5 s, max <= 3.5 s); acks lost (every acknowledged message read back,
byte-identical at its offset, from the final leader: 0); epochs acknowledged by two nodes (0); acks of the
old epoch received after the new epoch's first (0); the load average before and after (the machine is shared).

``python bench/failover.py [--quick] [--failovers N] [--producers N]``; --quick: 6 failovers. Writes
bench/results/failover.json. Needs etcd (make setup-ha). Every process it starts is stopped (bench/procs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

import grpc

BENCH_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from procs import BenchError, GrpcServer, free_port, git_rev, kill9, read_json_lines, stop_all  # noqa: E402

from mqstore import errors, model  # noqa: E402
from mqstore_launcher import etcd_local  # noqa: E402
from mqstore_rpc.commitlog_client import CommitLogClient  # noqa: E402
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb  # noqa: E402
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, replication_pb2, replication_pb2_grpc  # noqa: E402

TOPIC = "failover"
FLAGS = ("--min-insync-replicas", "2", "--default-replication", "SYNC", "--segment-size-bytes", "16MiB",
         "--preallocate-segments", "false")
GIVE_UP_S = 30.0


class Node:
    def __init__(self, root: pathlib.Path, name: str, etcd: str):
        self.name, self.port, self.frozen, self.restarts = name, free_port(), False, 0
        self.args = ("--node-id", name, "--etcd-endpoints", etcd, "--etcd-prefix", "/bench/failover",
                     "--metadata-url", f"etcd://{etcd}/bench/failover/meta", *FLAGS)
        self.root = root
        self.server: GrpcServer | None = None
        self.channel = grpc.insecure_channel(self.target)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = GrpcServer.commitlog(self.root / self.name, "ASYNC", port=self.port, extra=self.args,
                                           log_name=f"{self.name}-{self.restarts}.log").start()
        self.restarts += 1

    def state(self):
        if self.frozen or self.server is None or self.server.proc.poll() is not None:
            return None
        try:
            return replication_pb2_grpc.ReplicationStub(self.channel).GetReplicationState(
                replication_pb2.GetReplicationStateRequest(), timeout=1)
        except grpc.RpcError:
            return None


class Producers:
    """Threads appending one message at a time through their own CommitLogClient; every ack is recorded."""

    def __init__(self, addresses: str, count: int):
        self.addresses = addresses
        self.acks: list[tuple[float, int, str, bytes, int]] = []  # (monotonic, epoch, node, body, offset)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.failed_attempts = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), name=f"producer-{i}") for i in range(count)]

    def _run(self, i: int) -> None:
        client = CommitLogClient(self.addresses, rpc_timeout_s=10)
        seq = 0
        try:
            while not self.stop.is_set():
                seq += 1
                body = f"p{i}-{seq:09d}-".encode().ljust(1024, b"x")
                try:
                    result = client.append(TOPIC, [model.MessageIn(body=body)])[0]
                except errors.MqStoreError:
                    with self.lock:
                        self.failed_attempts += 1
                    time.sleep(0.01)  # not acknowledged: may or may not be there; never counted
                    continue
                with self.lock:
                    self.acks.append((time.monotonic(), result.epoch, client.address, body, result.physical_offset))
        finally:
            client.close()

    def first_ack_above(self, epoch: int, after: float) -> tuple[float, int, str] | None:
        with self.lock:
            found = [a for a in self.acks[-20_000:] if a[0] >= after and a[1] > epoch]
        return min(found)[:3] if found else None

    def acked_recently(self, epoch: int, since: float) -> bool:
        with self.lock:
            return any(a[0] >= since and a[1] == epoch for a in self.acks[-200:])


def _leader(nodes: list[Node]):
    for n in nodes:
        s = n.state()
        if s is not None and s.role == "LEADER" and not s.fenced:
            return n, s
    return None


def _wait(condition, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise BenchError(f"timed out after {timeout_s:g} s waiting for {what}")


def _check_acks(leader: Node, acks) -> int:
    """How many acknowledged messages the leader does not hold, byte-identical, at their offsets."""
    stub = commitlog_pb2_grpc.CommitLogStub(leader.channel)
    top = max(a[4] for a in acks)
    _wait(lambda: stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10).visible_physical_offset > top,
          "the final leader to show every acknowledged record")
    lost = 0
    for first in range(0, len(acks), 1000):
        part = acks[first:first + 1000]
        found = stub.GetMessages(pb.GetMessagesRequest(physical_offsets=[a[4] for a in part]), timeout=60).messages
        lost += sum(1 for a, got in zip(part, found, strict=True) if not got.found or got.message.body != a[3])
    return lost


def _elections(root: pathlib.Path) -> dict[int, float]:
    """epoch -> wall-clock time of its controller.elected event, from every node's log."""
    import datetime
    out = {}
    for path in root.glob("*.log"):
        for e in read_json_lines(path):
            if e.get("event") == "controller.elected":
                stamp = datetime.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
                out[e["epoch"]] = stamp
    return out


def _summary(times: list[float]) -> dict:
    times = sorted(times)
    if not times:
        return {"failovers": 0}
    return {"failovers": len(times), "min_s": times[0], "median_s": statistics.median(times),
            "p90_s": times[int(0.9 * (len(times) - 1))], "max_s": times[-1]}


def run(root: pathlib.Path, etcd: str, failovers: int, producers: int) -> dict:
    nodes = [Node(root, f"n{i}", etcd) for i in (1, 2, 3)]
    for n in nodes:
        n.start()
    leader, state = _wait(lambda: _leader(nodes), "a leader")
    commitlog_pb2_grpc.CommitLogStub(leader.channel).CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=4),
                                                                 timeout=10)
    load = Producers(",".join(n.target for n in nodes), producers)
    for t in load.threads:
        t.start()
    runs, late_acks = [], 0
    load_before = os.getloadavg()
    try:
        for i in range(failovers):
            kind = "kill9" if i % 2 == 0 else "sigstop"
            leader, state = _wait(lambda: (found := _leader(nodes)) and len(found[1].in_sync) == 3 and found,
                                  "the group in sync under a leader")
            _wait(lambda epoch=state.epoch: load.acked_recently(epoch, time.monotonic() - 0.3), "acks from the leader")
            fault, fault_wall = time.monotonic(), time.time()
            if kind == "kill9":
                kill9(leader.server.proc)
            else:
                leader.server.proc.send_signal(signal.SIGSTOP)
                leader.frozen = True
            try:
                first = _wait(lambda epoch=state.epoch, at=fault: load.first_ack_above(epoch, at),
                              "the new leader's first SYNC ack", GIVE_UP_S)
            finally:
                if kind == "kill9":
                    leader.start()
                else:
                    leader.server.proc.send_signal(signal.SIGCONT)
                    leader.frozen = False
            took = first[0] - fault
            runs.append({"kind": kind, "seconds": took, "old_epoch": state.epoch, "new_epoch": first[1],
                         "old_leader": leader.name, "new_first_ack_at": first[0], "fault_wall": fault_wall})
            print(f"  {i + 1}/{failovers} {kind} of {leader.name} (epoch {state.epoch}): {took:.2f} s",
                  flush=True)
        time.sleep(1.0)
    finally:
        load.stop.set()
        for t in load.threads:
            t.join(30)
    load_after = os.getloadavg()
    try:
        final, _ = _wait(lambda: _leader(nodes), "the final leader")
        acks = list(load.acks)
        by_epoch: dict[int, set[str]] = {}
        for _, epoch, node, _, _ in acks:
            by_epoch.setdefault(epoch, set()).add(node)
        for r in runs:  # an ack of the old epoch after the new one's first: two leaders acknowledging at once
            new_first = r.pop("new_first_ack_at")
            late_acks += sum(1 for a in acks if a[1] == r["old_epoch"] and a[0] > new_first)
        lost = _check_acks(final, acks)
        elected = _elections(root)
        for r in runs:  # the fault -> election part of each failover (the rest: clients finding it, its first ack)
            at = elected.get(r["new_epoch"])
            r["elected_after_s"] = at - r.pop("fault_wall") if at else None
    finally:
        for n in nodes:
            if n.server is not None:
                n.server.stop()
            n.channel.close()
    return {
        "all": _summary([r["seconds"] for r in runs]),
        "kill9": _summary([r["seconds"] for r in runs if r["kind"] == "kill9"]),
        "sigstop": _summary([r["seconds"] for r in runs if r["kind"] == "sigstop"]),
        "fault_to_election": _summary([r["elected_after_s"] for r in runs if r["elected_after_s"] is not None]),
        "runs": runs, "acks": len(acks), "acks_lost": lost,
        "epochs_acked_by_two_nodes": sum(1 for v in by_epoch.values() if len(v) > 1),
        "old_epoch_acks_after_the_new_epochs_first": late_acks,
        "unacknowledged_attempts": load.failed_attempts, "producers": producers,
        "loadavg_before": load_before, "loadavg_after": load_after, "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="6 failovers")
    parser.add_argument("--failovers", type=int, default=50)
    parser.add_argument("--producers", type=int, default=4)
    args = parser.parse_args()
    failovers = 6 if args.quick else args.failovers
    if etcd_local.find_binary() is None:
        print(f"bench/failover.py: {etcd_local.INSTALL_HINT}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-failover-") as tmp, etcd_local.LocalEtcd() as etcd:
        try:
            result = run(pathlib.Path(tmp), etcd.endpoint, failovers, args.producers)
        except BenchError:
            kept = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-bench-failover-logs-"))
            for log_file in pathlib.Path(tmp).glob("*.log"):
                shutil.copy(log_file, kept)
            print(f"bench/failover.py: the nodes' logs are kept in {kept}", file=sys.stderr)
            raise
        finally:
            stop_all()
    result = {"rev": git_rev(), **result}
    a = result["all"]
    print(f"failover, fault of the leader to the first SYNC ack by the new leader (2 s lease, 3 nodes, min in-sync "
          f"2, {args.producers} producers), {a['failovers']} faults: median {a['median_s']:.2f} s, p90 "
          f"{a['p90_s']:.2f} s, max {a['max_s']:.2f} s (targets: median <= 2.5 s, max <= 3.5 s)")
    for kind in ("kill9", "sigstop"):
        k = result[kind]
        if k["failovers"]:
            print(f"  {kind}: {k['failovers']} faults, min {k['min_s']:.2f} s, median {k['median_s']:.2f} s, "
                  f"max {k['max_s']:.2f} s")
    e = result["fault_to_election"]
    if e["failovers"]:
        print(f"  of which fault -> election: median {e['median_s']:.2f} s, max {e['max_s']:.2f} s")
    late = result["old_epoch_acks_after_the_new_epochs_first"]
    print(f"  {result['acks']} SYNC acks, {result['acks_lost']} lost, {result['epochs_acked_by_two_nodes']} epochs "
          f"acknowledged by two nodes, {late} acks of an old epoch after the new one's first; "
          f"load average {result['loadavg_before'][0]:.2f} before, "
          f"{result['loadavg_after'][0]:.2f} after ({result['cpus']} CPUs)")
    out = BENCH_DIR / "results" / "failover.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"written {out.relative_to(BENCH_DIR.parent)}")
    ok = result["acks_lost"] == result["epochs_acked_by_two_nodes"] == result[
        "old_epoch_acks_after_the_new_epochs_first"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
