"""Where the CPU goes during a benchmark window, from /proc (bench/tier_upload.py's breakdown).

A :class:`Snapshot` reads, at one instant: the machine's CPU time by kind (/proc/stat: user, nice, system, idle,
iowait, irq, softirq, steal), the CPU pressure stall time (/proc/pressure/cpu ``some``: time at least one runnable
task waited for a CPU; this kernel keeps no per-task schedstats), and for each watched process its threads' CPU time
and involuntary context switches (/proc/PID/task/TID/stat and status). :func:`breakdown` turns two snapshots into
cores (CPU seconds per wall second) per kind, per process and per thread.

Threads are named by their ``comm`` (Python 3.11 does not name its OS threads: they are all ``python``, but the
store's duties, its grpc.aio loop and its tier executor carry their Python names, mqstore.profiling.name_os_thread;
obstore's are ``tokio-rt-worker``, grpc's ``event_engine``, ``grpc_global_tim``, ...) and their TID.
"""

from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass, field

TICK = os.sysconf("SC_CLK_TCK")
STAT_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass
class Snapshot:
    wall: float
    machine: dict[str, float]
    pressure_us: int
    # process name -> tid -> (comm, CPU seconds, involuntary switches)
    threads: dict[str, dict[int, tuple[str, float, int]]] = field(default_factory=dict)
    processes: dict[str, float] = field(default_factory=dict)  # process name -> CPU seconds (exited threads too)


def parse_stat(stat: str) -> tuple[str, list[str]]:
    """A /proc/PID[/task/TID]/stat line: the comm, and the fields after it (``fields[0]`` is the state, field 3
    of proc(5); minflt is ``fields[7]``, utime and stime ``fields[11]`` and ``fields[12]``)."""
    return stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()


def _threads(pid: int) -> dict[int, tuple[str, float, int]]:
    found = {}
    try:
        tasks = list(pathlib.Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        comm, fields = parse_stat(stat)
        involuntary = 0
        for line in status.splitlines():
            if line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary = int(line.split()[1])
        found[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / TICK, involuntary)
    return found


def snapshot(pids: dict[str, int]) -> Snapshot:
    with open("/proc/stat") as stat:
        cpu = stat.readline().split()[1:1 + len(STAT_KINDS)]
    machine = {kind: int(value) / TICK for kind, value in zip(STAT_KINDS, cpu, strict=True)}
    pressure = 0
    try:
        for line in pathlib.Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some"):
                pressure = int(line.rsplit("total=", 1)[1])
    except FileNotFoundError:
        pass
    processes = {name: _process_cpu(pid) for name, pid in pids.items() if pid}
    return Snapshot(time.monotonic(), machine, pressure, {name: _threads(pid) for name, pid in pids.items() if pid},
                    processes)


def _process_cpu(pid: int) -> float:
    """The process's CPU seconds, its threads that exited included (moto's server runs a thread per request)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def breakdown(a: Snapshot, b: Snapshot, top: int = 8) -> dict:
    """Cores per machine kind, CPU pressure (fraction of the wall time some task waited), and per process: cores
    (exited threads too), its live threads' cores, involuntary switches a second, and its ``top`` busiest threads
    (comm/tid: cores)."""
    wall = b.wall - a.wall
    out = {"wall_s": wall, "machine": {k: (b.machine[k] - a.machine[k]) / wall for k in STAT_KINDS},
           "cpu_pressure": (b.pressure_us - a.pressure_us) / 1e6 / wall, "processes": {}}
    for name, after in b.threads.items():
        before = a.threads.get(name, {})
        rows = []
        for tid, (comm, cpu, nv) in after.items():
            cpu0, nv0 = (before[tid][1], before[tid][2]) if tid in before else (0.0, 0)
            rows.append((comm, tid, (cpu - cpu0) / wall, (nv - nv0) / wall))
        rows.sort(key=lambda r: -r[2])
        by_comm: dict[str, float] = {}
        for comm, _, cores, _ in rows:
            by_comm[comm] = by_comm.get(comm, 0.0) + cores
        out["processes"][name] = {
            "cores": (b.processes.get(name, 0.0) - a.processes.get(name, 0.0)) / wall,
            "live_thread_cores": sum(r[2] for r in rows), "involuntary_per_s": sum(r[3] for r in rows),
            "threads": len(rows), "by_comm": dict(sorted(by_comm.items(), key=lambda kv: -kv[1])),
            "top": [f"{comm}/{tid}: {cores:.3f}" for comm, tid, cores, _ in rows[:top]]}
    return out


def child_pids(parent: int, marker: str) -> list[int]:
    """The pids of ``parent``'s children whose command line holds ``marker`` (a load generator's script)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
                continue
            if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return found
