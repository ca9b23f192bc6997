"""The SYNC-replicated group of bench/replication.py alone, with its CPU (not in `make bench`; scratch figures).

Three CommitLog nodes as in bench/replication.py's part 1 (etcd, min_insync_replicas 2, SYNC replication, ASYNC
flush), the same load (100 x 1 KiB per Append, PRODUCERS producers, 16 by default) for ROUNDS windows of DUR
seconds (8), each after a 2 s warm-up. Prints per window the rate, each node's CPU (cores and us a message,
from /proc; ``*`` marks the leader) and, once the nodes are stopped, each replication stream's
``replication.replica_disconnected`` line (``data_messages``, ``lingered``: how much the stream's linger
gathered, ``acks``: the replica's acknowledgements the leader read) and ``replication.data_messages_shared``
(data messages built, and reused by a second replica's stream). The environment reaches the nodes:
``MQSTORE_REPLICATION_LINGER_US=0`` turns the linger off, ``MQSTORE_PROFILE_DIR=<dir>``
writes their threads' cProfiles (bench/README.md, *Profiling a server*).

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


def main() -> int:
    duration_s, rounds = float(os.environ.get("DUR", "8")), int(os.environ.get("ROUNDS", "1"))
    producers = int(os.environ.get("PRODUCERS", "16"))
    timing = {"warmup_s": 2.0, "duration_s": duration_s}
    if etcd_local.find_binary() is None:
        print(f"bench/replication_group.py: {etcd_local.INSTALL_HINT}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-group-") as tmp, etcd_local.LocalEtcd() as etcd:
        root = pathlib.Path(tmp)
        nodes = [R._node(root, f"n{i}", etcd.endpoint, ("--min-insync-replicas", "2", "--default-replication", "SYNC"))
                 for i in (1, 2, 3)]
        try:
            for n in nodes:
                n.start()
            leader, _ = R._leader(nodes)
            R._stub(leader.target).CreateTopic(R.pb.CreateTopicRequest(name=R.TOPIC, queue_count=8), timeout=10)
            R._wait_in_sync(leader.target, 3)
            names = {n.proc.pid: n.args[n.args.index("--node-id") + 1] + ("*" if n is leader else "") for n in nodes}
            for _ in range(rounds):
                before, started = {pid: cpu_s(pid) for pid in names}, time.monotonic()
                rate = R._append_rate(leader.target, timing, producers)
                elapsed = time.monotonic() - started
                used = {names[pid]: cpu_s(pid) - s for pid, s in before.items()}
                messages = rate * (timing["warmup_s"] + duration_s)  # the warm-up's too, at the window's rate
                print(f"{rate:,.0f} msg/s ({producers} producers, {BATCH} per call); CPU cores "
                      + " ".join(f"{k}={v / elapsed:.2f}" for k, v in used.items()) + "; us a message "
                      + " ".join(f"{k}={v / messages * 1e6:.1f}" for k, v in used.items()), flush=True)
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
