"""Replication benchmark (issue 17), ratios taken in one run on this machine:

1. SYNC-replicated Append (a group of three CommitLog nodes, min_insync_replicas 2, ASYNC flush: every
   in-sync node holds the batch before the ack), 16 producers, 100 x 1 KiB per call, against the same load
   on one node with SYNC flush (one copy, fsync before the ack), in --rounds alternating rounds (medians).
   Target >= 0.7x (issue 34; 0.5x before). Each round starts with an os.sync() (the other setup's dirty pages
   written back before, not during it; the seconds it took: ``sync_before_round_s``). Each setup is first
   loaded until every node's log has passed its page cache window (``page_cache_keep_bytes``, 1 GiB by
   default, and a quarter more): the rounds measure the store as it runs, not a node's first GiB, whose pages
   the kernel takes from memory never used before (on this VM a fault in the host for each page:
   bench/README.md, *Drop-behind*). That first phase's rates
   are reported beside the rounds (``warm_in``); ``--no-warm-in`` and ``--quick`` leave it out.
2. Replication lag under the full ASYNC Append load (a leader and one replica): the replica's copy rate
   over the leader's append rate in the same window, and the lag at its end. Target >= 1.0x.
3. Failover: kill -9 of the leader, to the first SYNC append acknowledged by the new leader, with the
   default 2 s lease, over --failovers runs (>= 20): the distribution. Target <= 10 s. (bench/failover.py
   measures kill -9 and SIGSTOP through the services' client against the tighter targets of issue 34.)

``python bench/replication.py [--quick] [--failovers N] [--rounds N] [--only PART]``; writes
bench/results/replication.json (a partial run replaces only its parts).
Needs etcd (make setup-ha) for 1 and 3. Every process it starts is stopped (bench/procs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import grpc

BENCH_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from procs import BenchError, GrpcServer, git_rev, kill9, run_loadgen, stop_all  # noqa: E402

from mqstore.config import StoreConfig  # noqa: E402
from mqstore_launcher import etcd_local  # noqa: E402
from mqstore_rpc import settings  # noqa: E402
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb  # noqa: E402
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, replication_pb2, replication_pb2_grpc  # noqa: E402

TOPIC = "bench"
SEGMENT = "64MiB"


def _stub(target):
    return commitlog_pb2_grpc.CommitLogStub(grpc.insecure_channel(target))


def _state(target):
    with grpc.insecure_channel(target) as ch:
        return replication_pb2_grpc.ReplicationStub(ch).GetReplicationState(
            replication_pb2.GetReplicationStateRequest(), timeout=2)


def _node(root, name, etcd, extra=(), log_name=""):
    group = name[0]  # nodes of one group share their etcd prefix and catalog (an HA group's: in etcd)
    return GrpcServer.commitlog(root / name, "ASYNC", extra=("--node-id", name, "--etcd-endpoints", etcd,
                                                             "--etcd-prefix", f"/bench/{group}",
                                                             "--metadata-url", f"etcd://{etcd}/bench/{group}/meta",
                                                             "--segment-size-bytes", SEGMENT, *extra),
                                log_name=log_name)


def _leader(nodes, above_epoch=0, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for n in nodes:
            if n.proc is None or n.proc.poll() is not None:
                continue
            try:
                s = _state(n.target)
            except grpc.RpcError:
                continue
            if s.role == "LEADER" and s.epoch > above_epoch and not s.fenced:
                return n, s
        time.sleep(0.01)
    raise BenchError(f"no leader above epoch {above_epoch} within {timeout_s} s")


def _wait_in_sync(target, count, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(_state(target).in_sync) >= count:
            return
        time.sleep(0.05)
    raise BenchError(f"fewer than {count} nodes in sync after {timeout_s} s")


def _append_rate(target, timing, producers=16, latencies_ms=None):
    """The Append rate (msg/s) of ``producers`` over the window; each call's latency added to ``latencies_ms``."""
    spec = {"kind": "unary", "target": target, "topic": TOPIC, "batch": 100, "items": 1, "body_bytes": 1024,
            "concurrency": producers, "channels": 4, "start_at": 0, "warmup_s": timing["warmup_s"],
            "duration_s": timing["duration_s"], "max_calls": 10_000_000}
    results = run_loadgen(spec, 1, timeout_s=timing["warmup_s"] + timing["duration_s"] + 60)
    errors = sum(sum(r["errors"].values()) for r in results)
    if errors:
        raise BenchError(f"{errors} appends failed: {results[0]['first_error']}")
    if latencies_ms is not None:
        latencies_ms.extend(ms for r in results for ms in r["latencies_ms"])
    return sum(r["messages"] for r in results) / timing["duration_s"]


WARM_IN_STEP_S = 4.0
WARM_IN_MAX_S = 180.0


def page_cache_window_bytes() -> int:
    """The nodes' drop-behind window: the environment's MQSTORE_PAGE_CACHE_KEEP_BYTES (it reaches them), else the
    store's default."""
    text = os.environ.get("MQSTORE_PAGE_CACHE_KEEP_BYTES")
    return settings.parse_int(text) if text else StoreConfig(data_dir=pathlib.Path(".")).page_cache_keep_bytes


def _warm_in(target, goal_bytes):
    """Load ``target`` (the same load as the rounds) until its log ends at or past ``goal_bytes``: each step's
    rate (msg/s). Bounded: BenchError after WARM_IN_MAX_S."""
    stub, rates = _stub(target), []
    deadline = time.monotonic() + WARM_IN_MAX_S
    while stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10).max_physical_offset < goal_bytes:
        if time.monotonic() > deadline:
            raise BenchError(f"the warm-in did not write {goal_bytes} bytes within {WARM_IN_MAX_S} s")
        rates.append(round(_append_rate(target, {"warmup_s": 0.0, "duration_s": WARM_IN_STEP_S})))
    return rates


def bench_sync(root, etcd, timing, rounds, warm_in=True):
    """Both setups up at once, the load taking turns (one copy first in even rounds, the group first in odd
    ones), so that the machine's other load falls on both alike; the medians of the rounds and their ratio."""
    single = GrpcServer.commitlog(root / "single", "SYNC", extra=("--segment-size-bytes", SEGMENT))
    nodes = [_node(root, f"n{i}", etcd, ("--min-insync-replicas", "2", "--default-replication", "SYNC"))
             for i in (1, 2, 3)]
    one_copy, replicated = [], []
    try:
        single.start()
        _stub(single.target).CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=8), timeout=10)
        for n in nodes:
            n.start()
        leader, _ = _leader(nodes)
        _stub(leader.target).CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=8), timeout=10)
        _wait_in_sync(leader.target, 3)
        window = page_cache_window_bytes()
        goal = window + window // 4 if warm_in else 0
        warmed = {"bytes_per_node": goal, "step_s": WARM_IN_STEP_S,
                  "one_copy_msgs_s": _warm_in(single.target, goal) if goal else [],
                  "three_nodes_msgs_s": _warm_in(leader.target, goal) if goal else []}
        cpu = {"one_copy": [], "leader": [], "replicas": []}  # CPU us a message of each round
        kernel = {"one_copy": [], "leader": [], "replicas": []}  # of which in the kernel (system time)
        # The machine's share-out of each round: the load generator's CPU a message and the cores left idle
        # (bench/README.md, *The machine's two cores*): a setup with no core left idle is bound by the machine.
        loadgen = {"one_copy": [], "three_nodes": []}
        idle = {"one_copy": [], "three_nodes": []}
        settle = []  # seconds each round's os.sync() took before it
        for r in range(rounds):
            turns = [(one_copy, single.target, [single]), (replicated, leader.target, nodes)]
            for figures, target, procs in turns if r % 2 == 0 else reversed(turns):
                # the other setup's dirty pages written back first, not during this round: a group that wrote
                # faster (three copies, ASYNC flush) left more behind, and the one copy's fsyncs waited for them
                synced = time.monotonic()
                os.sync()
                settle.append(round(time.monotonic() - synced, 2))
                before = [_cpu_split_s(p.proc.pid) for p in procs]
                idle_before, children_before, started = machine_idle_s(), children_cpu_s(), time.monotonic()
                figures.append(_append_rate(target, timing))
                elapsed = time.monotonic() - started
                messages = figures[-1] * (timing["warmup_s"] + timing["duration_s"])  # the warm-up's too, at its rate
                used = [[(a - b) / messages * 1e6 for a, b in zip(_cpu_split_s(p.proc.pid), was, strict=True)]
                        for p, was in zip(procs, before, strict=True)]  # (user, system) us a message
                setup = "one_copy" if procs[0] is single else "three_nodes"
                loadgen[setup].append(round((children_cpu_s() - children_before) / messages * 1e6, 1))
                idle[setup].append(round((machine_idle_s() - idle_before) / elapsed / os.cpu_count(), 3))
                if procs[0] is single:
                    cpu["one_copy"].append(round(sum(used[0]), 1))
                    kernel["one_copy"].append(round(used[0][1], 1))
                else:
                    at = nodes.index(leader)
                    cpu["leader"].append(round(sum(used[at]), 1))
                    kernel["leader"].append(round(used[at][1], 1))
                    cpu["replicas"].append(round(sum(sum(u) for i, u in enumerate(used) if i != at), 1))
                    kernel["replicas"].append(round(sum(u[1] for i, u in enumerate(used) if i != at), 1))
    finally:
        single.stop()
        for n in nodes:
            n.stop()
    one, three = statistics.median(one_copy), statistics.median(replicated)
    return {"rounds": rounds, "one_copy_rounds_msgs_s": one_copy, "three_nodes_rounds_msgs_s": replicated,
            "one_copy_sync_flush_msgs_s": one, "three_nodes_sync_replication_msgs_s": three, "ratio": three / one,
            "cpu_us_a_message_rounds": cpu, "kernel_cpu_us_a_message_rounds": kernel,
            "loadgen_cpu_us_a_message_rounds": loadgen, "machine_idle_fraction_rounds": idle, "warm_in": warmed,
            "sync_before_round_s": settle}


def machine_idle_s() -> float:
    """The machine's idle CPU seconds so far, all cores (/proc/stat: idle and iowait)."""
    fields = pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """The CPU seconds of this process's children that ended (the load generator's processes, once run)."""
    t = os.times()
    return t.children_user + t.children_system


def _cpu_split_s(pid) -> tuple[float, float]:
    """A process's (user, system) CPU seconds so far (/proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def bench_lag(root, etcd, timing):
    nodes = [_node(root, f"l{i}", etcd, ("--default-replication", "ASYNC"))
             for i in (1, 2)]
    try:
        for n in nodes:
            n.start()
        leader, _ = _leader(nodes)
        replica = next(n for n in nodes if n is not leader)
        _stub(leader.target).CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=8), timeout=10)
        _wait_in_sync(leader.target, 2)
        samples = {}

        def sample():
            time.sleep(timing["warmup_s"])
            for name, target in (("leader", leader.target), ("replica", replica.target)):
                samples[name + "0"] = _state(target).end_offset
            t0 = time.monotonic()
            series = []
            while (left := timing["duration_s"] - (time.monotonic() - t0)) > 1.0:
                time.sleep(1.0)  # the lag each second: steady (frames in flight) or growing (the replica is slower)
                ahead = _state(leader.target).end_offset
                series.append(ahead - _state(replica.target).end_offset)
            time.sleep(max(0.0, left))
            for name, target in (("replica", replica.target), ("leader", leader.target)):  # lag: replica first
                samples[name + "1"] = _state(target).end_offset
            samples["s"] = time.monotonic() - t0
            samples["series"] = series
        sampler = threading.Thread(target=sample)
        sampler.start()
        rate = _append_rate(leader.target, timing)
        sampler.join()
        time.sleep(0.5)  # the load has stopped: what is left is lag, not frames in flight
        after = _state(leader.target).end_offset - _state(replica.target).end_offset
        leader_bps = (samples["leader1"] - samples["leader0"]) / samples["s"]
        replica_bps = (samples["replica1"] - samples["replica0"]) / samples["s"]
        return {"append_msgs_s": rate, "leader_bytes_s": leader_bps, "replica_bytes_s": replica_bps,
                "ratio": replica_bps / leader_bps, "final_lag_bytes": samples["leader1"] - samples["replica1"],
                "lag_bytes_series": samples["series"], "lag_after_load_bytes": after}
    finally:
        for n in nodes:
            n.stop()


def bench_failover(root, etcd, count):
    flags = ("--min-insync-replicas", "2", "--default-replication", "SYNC")  # the default lease: 2 s
    nodes = [_node(root, f"f{i}", etcd, flags) for i in (1, 2, 3)]
    times = []
    try:
        for n in nodes:
            n.start()
        leader, state = _leader(nodes)
        _stub(leader.target).CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=10)
        request = pb.AppendRequest(topic=TOPIC, messages=[common_pb2.MessageInput(body=b"x" * 1024)],
                                   replication=pb.REPLICATION_MODE_SYNC)
        for run in range(count):
            _wait_in_sync(leader.target, 3, 120)
            _stub(leader.target).Append(request, timeout=10)
            killed_at = time.monotonic()
            kill9(leader.proc)
            epoch = state.epoch
            while True:
                found = None
                for n in nodes:
                    if n is leader:
                        continue
                    try:
                        _stub(n.target).Append(request, timeout=2)
                        found = n
                        break
                    except grpc.RpcError:
                        continue
                if found:
                    times.append(time.monotonic() - killed_at)
                    break
                if time.monotonic() - killed_at > 60:
                    raise BenchError("no SYNC append acknowledged within 60 s of the kill")
                time.sleep(0.01)
            leader.stop()
            name = leader.args[leader.args.index("--node-id") + 1]
            back = _node(root, name, etcd, flags, log_name=f"restart-{run}.log")
            nodes[nodes.index(leader)] = back.start()  # back as a replica (a fresh log file: its port is new)
            leader, state = _leader(nodes, above_epoch=epoch)
    finally:
        for n in nodes:
            n.stop()
    times.sort()
    return {"failovers": len(times), "seconds": times, "min_s": times[0], "median_s": statistics.median(times),
            "p90_s": times[int(0.9 * (len(times) - 1))], "max_s": times[-1]}


def machine_line(s: dict) -> str:
    """The sync part's share-out of the machine, in words: each setup's CPU a message with its load generator's,
    the cores it left idle, and the rate the group would reach with every core busy at its CPU a message."""
    med = statistics.median
    cpu, loadgen, idle = (s["cpu_us_a_message_rounds"], s["loadgen_cpu_us_a_message_rounds"],
                          s["machine_idle_fraction_rounds"])
    one = med(cpu["one_copy"]) + med(loadgen["one_copy"])
    group = med(cpu["leader"]) + med(cpu["replicas"]) + med(loadgen["three_nodes"])
    cores = os.cpu_count()
    return (f"the machine ({cores} cores): every process's CPU a message, the load generator's included, one copy "
            f"{one:.1f} us with {med(idle['one_copy']):.0%} of the cores idle, the group {group:.1f} us with "
            f"{med(idle['three_nodes']):.0%} idle; with every core busy at that CPU the group would carry "
            f"{cores / group * 1e6:,.0f} msg/s ({cores / group * 1e6 / s['one_copy_sync_flush_msgs_s']:.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="short windows, 3 failovers")
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the SYNC comparison")
    parser.add_argument("--only", choices=("sync", "lag", "failover"), action="append",
                        help="run only these parts (repeatable); the file then holds only them")
    parser.add_argument("--no-warm-in", action="store_true",
                        help="measure the SYNC comparison from the nodes' first bytes (see the module docstring)")
    args = parser.parse_args()
    timing = {"warmup_s": 1.0, "duration_s": 3.0} if args.quick else {"warmup_s": 2.0, "duration_s": 8.0}
    failovers = 3 if args.quick else args.failovers
    if etcd_local.find_binary() is None:
        print(f"bench/replication.py: {etcd_local.INSTALL_HINT}", file=sys.stderr)
        return 1
    results = {"rev": git_rev(), "timing": timing}
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-repl-") as tmp, etcd_local.LocalEtcd() as etcd:
        root = pathlib.Path(tmp)
        try:
            parts = args.only or ("sync", "lag", "failover")
            if "sync" in parts:
                warm_in = not (args.no_warm_in or args.quick)
                results["sync"] = bench_sync(root, etcd.endpoint, timing, args.rounds, warm_in=warm_in)
            if "lag" in parts:
                results["lag"] = bench_lag(root, etcd.endpoint, timing)
            if "failover" in parts:
                results["failover"] = bench_failover(root, etcd.endpoint, failovers)
        finally:
            stop_all()
    if s := results.get("sync"):
        print(f"SYNC-replicated Append (3 nodes, min in-sync 2) 16 producers 100 x 1 KiB: "
              f"{s['three_nodes_sync_replication_msgs_s']:,.0f} msg/s = {s['ratio']:.2f}x one copy with SYNC flush "
              f"({s['one_copy_sync_flush_msgs_s']:,.0f} msg/s), medians of {s['rounds']} alternating rounds; "
              f"target >= 0.7x (issue 34)")
        cpu, kernel = s["cpu_us_a_message_rounds"], s["kernel_cpu_us_a_message_rounds"]
        print("  CPU us a message (medians; of which in the kernel): " + ", ".join(
            f"{part.replace('_', ' ')} {statistics.median(cpu[part]):.1f} ({statistics.median(kernel[part]):.1f})"
            for part in ("one_copy", "leader", "replicas")))
        print("  " + machine_line(s))
        if w := s["warm_in"]["bytes_per_node"]:
            print(f"  after a warm-in of {w / 2**30:.2f} GiB a node (the page cache window and a quarter more), whose "
                  f"{s['warm_in']['step_s']:.0f} s steps ran: one copy {s['warm_in']['one_copy_msgs_s']} msg/s, "
                  f"the group {s['warm_in']['three_nodes_msgs_s']} msg/s")
    if lag := results.get("lag"):
        print(f"replication under full ASYNC load: replica {lag['replica_bytes_s'] / 1e6:.1f} MB/s = "
              f"{lag['ratio']:.2f}x the leader's append rate, lag {lag['lag_bytes_series']} B each second, "
              f"{lag['final_lag_bytes']} B at the end, {lag['lag_after_load_bytes']} B once the load stopped; "
              f"target >= 1.0x")
    if f := results.get("failover"):
        print(f"failover, kill -9 to the first SYNC ack by the new leader (2 s lease), {f['failovers']} runs: "
              f"min {f['min_s']:.2f} s, median {f['median_s']:.2f} s, p90 {f['p90_s']:.2f} s, "
              f"max {f['max_s']:.2f} s; target <= 10 s")
    out = BENCH_DIR / "results" / "replication.json"
    if args.only and out.exists():  # a partial run replaces its parts of the last full one, each part with its rev
        kept = json.loads(out.read_text())
        for part, value in kept.items():
            if part in ("sync", "lag", "failover") and part not in results:
                results[part] = {"rev": kept["rev"], **value} if "rev" not in value else value
            elif part not in results:  # the series of earlier sittings bench/README.md cites, kept as they were
                results[part] = value
    out.write_text(json.dumps(results, indent=2))
    print(f"written {out.relative_to(BENCH_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
