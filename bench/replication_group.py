"""The SYNC-replicated group of bench/replication.py alone, with its CPU (not in `make bench`; scratch figures).

Three CommitLog nodes as in bench/replication.py's part 1 (etcd, min_insync_replicas 2, SYNC replication, ASYNC
flush), the same load (100 x 1 KiB per Append, PRODUCERS producers, 16 by default) for ROUNDS windows of DUR
seconds (8), each after a 2 s warm-up. Prints per window the rate, each node's CPU (cores and us a message,
from /proc; ``*`` marks the leader; ``loadgen``: the load generator's process, its start included), an Append's
latency as the load generator saw it (p50, p90), how idle the machine's cores were (0%: the window was bound by
CPU, the three nodes', the load generator's and other work's together), each node's threads' CPU a message (by their
OS names: grpc's ``event_engine`` threads; Python's all show as ``python``, the busiest being the grpc.aio
loop on the leader) and, once the nodes are stopped, each replication stream's
``replication.replica_disconnected`` line (``data_messages``, ``lingered`` and ``paced``: how often the stream
waited to gather SYNC or ASYNC appends, ``acks``: the replica's acknowledgements the leader read) and
``replication.data_messages_shared`` (data messages built, and reused by a second replica's stream).
``REPLICATION=ASYNC`` makes the group's default replication ASYNC (the appends do not wait for the replicas; SYNC
by default). The environment reaches the nodes: ``MQSTORE_REPLICATION_LINGER_US=0`` turns the linger and the
pacing off, ``MQSTORE_PROFILE_DIR=<dir>`` writes their threads' cProfiles (bench/README.md, *Profiling a
server*; ``MQSTORE_PROFILE_CLOCK=cpu`` for CPU time rather than the wall clock).

    ROUNDS=2 .venv/bin/python bench/replication_group.py
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import replication as R  # noqa: E402
from procs import stop_all  # noqa: E402

from mqstore_launcher import etcd_local  # noqa: E402

BATCH = 100


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread's (name, CPU seconds) from /proc (grpc's threads name themselves; Python's show as python)."""
    out = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def main() -> int:
    duration_s, rounds = float(os.environ.get("DUR", "8")), int(os.environ.get("ROUNDS", "1"))
    producers = int(os.environ.get("PRODUCERS", "16"))
    replication = os.environ.get("REPLICATION", "SYNC")
    timing = {"warmup_s": 2.0, "duration_s": duration_s}
    if etcd_local.find_binary() is None:
        print(f"bench/replication_group.py: {etcd_local.INSTALL_HINT}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-group-") as tmp, etcd_local.LocalEtcd() as etcd:
        root = pathlib.Path(tmp)
        flags = ("--min-insync-replicas", "2", "--default-replication", replication)
        nodes = [R._node(root, f"n{i}", etcd.endpoint, flags) for i in (1, 2, 3)]
        try:
            for n in nodes:
                n.start()
            leader, _ = R._leader(nodes)
            R._stub(leader.target).CreateTopic(R.pb.CreateTopicRequest(name=R.TOPIC, queue_count=8), timeout=10)
            R._wait_in_sync(leader.target, 3)
            names = {n.proc.pid: n.args[n.args.index("--node-id") + 1] + ("*" if n is leader else "") for n in nodes}
            for _ in range(rounds):
                before, started = {pid: cpu_s(pid) for pid in names}, time.monotonic()
                threads_before = {pid: thread_cpu_s(pid) for pid in names}
                idle_before, children_before = R.machine_idle_s(), R.children_cpu_s()
                latencies: list[float] = []
                rate = R._append_rate(leader.target, timing, producers, latencies)
                elapsed = time.monotonic() - started
                used = {names[pid]: cpu_s(pid) - s for pid, s in before.items()}
                used["loadgen"] = R.children_cpu_s() - children_before  # the nodes are not waited for: not in it
                messages = rate * (timing["warmup_s"] + duration_s)  # the warm-up's too, at the window's rate
                print(f"{rate:,.0f} msg/s ({producers} producers, {BATCH} per call); CPU cores "
                      + " ".join(f"{k}={v / elapsed:.2f}" for k, v in used.items()) + "; us a message "
                      + " ".join(f"{k}={v / messages * 1e6:.1f}" for k, v in used.items()), flush=True)
                idle = (R.machine_idle_s() - idle_before) / elapsed / os.cpu_count()
                latencies.sort()
                p50, p90 = (latencies[int(q * (len(latencies) - 1))] for q in (0.5, 0.9))
                print(f"  an Append's latency p50 {p50:.1f} ms, p90 {p90:.1f}; the machine's cores idle {idle:.0%}; "
                      f"each node's threads (name=us a message):", flush=True)
                for pid, node in names.items():
                    threads = [(name, s - threads_before[pid].get(tid, (name, 0.0))[1])
                               for tid, (name, s) in thread_cpu_s(pid).items()]
                    print(f"    {node}: " + " ".join(f"{name}={s / messages * 1e6:.1f}" for name, s in
                                                sorted(threads, key=lambda t: -t[1]) if s / messages * 1e6 >= 0.1),
                          flush=True)
        finally:
            for n in nodes:
                n.stop()
            stop_all()
            for path in sorted(root.glob("*.log")):
                for line in path.read_text(errors="replace").splitlines():
                    if "data_messages" in line:  # the streams' counts, and the data messages built once
                        print(path.name, line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
