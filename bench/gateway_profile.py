"""Where a send through the gateway spends its time: ``bench/gateway_profile.py [--count N] [--rounds R]
[--py-spy DIR]``.

bench/gateway.py gives the rates; this gives, for the same workloads, each process's CPU per message
(utime + stime from /proc, over the measured sends only, after a warm-up) next to the wall time per
message, so that a ratio can be explained process by process:

  gateway   the official Python client (.venv-rmq) -> gateway_service -> commitlog_service (Cluster mode)
  local     the same client -> a second commitlog_service serving the gateway itself (Local mode,
            ``--gateway-port``: no hop; its process is "commitlog+gateway")
  floor     the same client -> bench/gateway_floor.py sync (parse, one unary Append, answer) -> commit log
  direct    a plain grpc loop calling CommitLog.Append (bench/append_loop.py's shape) -> commit log
  noop      the same client -> bench/noop_v2.py (stores nothing): the client's own cost

The gateway's threads are listed by name with their CPU per message (a thread-pool handler, the grpc
poller, the duties). ``--py-spy DIR`` also records every process of the gateway workload (client, gateway,
commit log) during the measured sends of the first round with py-spy (``--gil`` and without), as
collapsed stacks (``py-spy record -f raw``, one line per stack with its sample count) in DIR. Prints a
table and writes it to bench/results/gateway_profile.md (``--out`` another file). Rounds alternate the
workloads; each figure is the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gateway import BODY_BYTES, PY_CLIENT, ROOT, TOPIC, create_topic, free_port, start, start_event
from procs import BenchError, stop, stop_all

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
DRIVER = ROOT / "tests" / "clients" / "python" / "rmq_driver.py"
# The direct loop, driven by lines on stdin: "warm N" / "run N" answer with the elapsed seconds.
DIRECT_LOOP = """
import sys, time, grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
channel = grpc.insecure_channel(sys.argv[1])
stub = commitlog_pb2_grpc.CommitLogStub(channel)
body = b"x" * int(sys.argv[3])
print("ready", flush=True)
for line in sys.stdin:
    n = int(line.split()[1])
    start = time.perf_counter()
    for _ in range(n):
        stub.Append(commitlog_pb2.AppendRequest(topic=sys.argv[2], messages=[common_pb2.MessageInput(body=body)]),
                    timeout=10)
    print(time.perf_counter() - start, flush=True)
"""


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of one name summed)."""
    out: dict[str, float] = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * TICK_S
    return out


class Driver:
    """The client driver as a process we talk to line by line (bench/gateway.py runs it in one go)."""

    def __init__(self, endpoint: str, home: pathlib.Path):
        home.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([str(PY_CLIENT), str(DRIVER), endpoint], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "HOME": str(home)})
        self.next_id = 0

    def call(self, **command) -> dict:
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": self.next_id, **command}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            reply = json.loads(line)
            if reply.get("id") == self.next_id:
                if not reply["ok"]:
                    raise BenchError(f"driver: {reply}")
                return reply
        raise BenchError(f"the driver exited with {self.proc.wait(30)}")

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call(op="shutdown")
        finally:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


class Spy:
    """py-spy on ``pids`` for ``seconds`` (both with --gil and without), or nothing."""

    def __init__(self, out_dir: pathlib.Path | None, label: str, pids: dict[str, int], seconds: int):
        self.procs = []
        if out_dir is None:
            return
        spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy")
        for name, pid in pids.items():
            for gil in (False, True):
                stacks = out_dir / f"{label}-{name}{'-gil' if gil else ''}.txt"
                self.procs.append(subprocess.Popen(
                    [spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "200", "-o", str(stacks), "-f", "raw",
                     "--threads", *(["--gil"] if gil else [])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # py-spy attaches before the measured sends start (not a synchronisation of ours)

    def wait(self) -> None:
        for proc in self.procs:
            proc.wait(120)


def measured(pids: dict[str, int], run, count: int) -> dict:
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    threads_before = thread_cpu_s(pids["gateway"]) if "gateway" in pids else {}
    elapsed = run()
    out = {"wall_ms": elapsed * 1000 / count,
           **{f"cpu_ms.{name}": (cpu_s(pid) - before[name]) * 1000 / count for name, pid in pids.items()}}
    if threads_before:
        after = thread_cpu_s(pids["gateway"])
        for name, value in after.items():
            out[f"gateway_thread_ms.{name}"] = (value - threads_before.get(name, 0.0)) * 1000 / count
    return out


def client_round(endpoint: str, servers: dict[str, int], cfg: dict, home: pathlib.Path,
                 spy_dir: pathlib.Path | None = None):
    driver = Driver(endpoint, home)
    try:
        driver.call(op="producer", topics=[TOPIC])
        driver.call(op="send_many", topic=TOPIC, count=cfg["warmup"], body_bytes=BODY_BYTES)
        pids = {"client": driver.proc.pid, **servers}
        spy = Spy(spy_dir, "gateway", pids, max(2, int(cfg["count"] / 400)))
        result = measured(pids, lambda: driver.call(op="send_many", topic=TOPIC, count=cfg["count"],
                                                    body_bytes=BODY_BYTES)["elapsed_s"], cfg["count"])
        spy.wait()
        return result
    finally:
        driver.close()


def direct_round(log_address: str, log_pid: int, cfg: dict) -> dict:
    loop = subprocess.Popen([sys.executable, "-c", DIRECT_LOOP, log_address, TOPIC, str(BODY_BYTES)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert loop.stdout.readline().strip() == "ready"

        def run(n: int) -> float:
            loop.stdin.write(f"run {n}\n")
            loop.stdin.flush()
            return float(loop.stdout.readline())
        run(cfg["warmup"])
        return measured({"client": loop.pid, "commitlog": log_pid}, lambda: run(cfg["count"]), cfg["count"])
    finally:
        close_served(loop)


def served(script: str, *args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / script), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    while line and not line.strip().isdigit():
        line = proc.stdout.readline()
    if not line:
        raise BenchError(f"{script} exited with {proc.wait(30)} before serving")
    return proc, int(line)


def close_served(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def profile(cfg: dict, work: pathlib.Path, spy_dir: pathlib.Path | None) -> dict[str, list[dict]]:
    log_proc, log_address = start("commitlog_service.main", ["--data-dir", str(work / "log")], work / "log.err")
    results: dict[str, list[dict]] = {"gateway": [], "local": [], "floor": [], "direct": [], "noop": []}
    try:
        txn_proc, txn_address = start("txn_service.main", ["--data-dir", str(work / "txn"), "--commitlog",
                                                           log_address], work / "txn.err")
        gw_proc, gw_address = start("gateway_service.main", ["--commitlog", log_address, "--txn", txn_address],
                                    work / "gateway.err")
        create_topic(log_address)
        local_txn_port = free_port()
        local_proc, event = start_event("mqstore_launcher.node", [
            "--data-dir", str(work / "local-log"), "--gateway-port", "0",
            "--gateway-txn", f"127.0.0.1:{local_txn_port}"], work / "local-log.err")
        local_txn_proc, _ = start("txn_service.main", ["--data-dir", str(work / "local-txn"), "--commitlog",
                                                       f"127.0.0.1:{event['port']}"], work / "local-txn.err",
                                  port=local_txn_port)
        create_topic(f"127.0.0.1:{event['port']}")
        for round_no in range(cfg["rounds"]):
            servers = {"gateway": gw_proc.pid, "commitlog": log_proc.pid}
            results["gateway"].append(client_round(gw_address, servers, cfg, work / f"home-gw-{round_no}",
                                                   spy_dir if round_no == 0 else None))
            results["local"].append(client_round(f"127.0.0.1:{event['ports']['gateway']}",
                                                 {"commitlog+gateway": local_proc.pid}, cfg,
                                                 work / f"home-local-{round_no}"))
            floor, port = served("gateway_floor.py", "sync", log_address)
            try:
                results["floor"].append(client_round(f"127.0.0.1:{port}", {"floor": floor.pid,
                                                                           "commitlog": log_proc.pid},
                                                     cfg, work / f"home-floor-{round_no}"))
            finally:
                close_served(floor)
            results["direct"].append(direct_round(log_address, log_proc.pid, cfg))
            noop, port = served("noop_v2.py")
            try:
                results["noop"].append(client_round(f"127.0.0.1:{port}", {"noop": noop.pid}, cfg,
                                                     work / f"home-noop-{round_no}"))
            finally:
                close_served(noop)
            print("round", round_no, {k: round(v[-1]["wall_ms"], 3) for k, v in results.items()}, flush=True)
        stop(local_txn_proc)
        stop(local_proc)
        stop(gw_proc)
        stop(txn_proc)
    finally:
        stop(log_proc)
    return results


def table(results: dict[str, list[dict]]) -> str:
    lines = ["| workload | wall ms/msg | CPU ms/msg per process (median of rounds) | rounds' wall ms/msg |",
             "|---|---|---|---|"]
    for name, rounds in results.items():
        keys = [k for k in rounds[0] if k.startswith("cpu_ms.")]
        cpu = ", ".join(f"{k[7:]} {statistics.median(r.get(k, 0.0) for r in rounds):.3f}" for k in keys)
        walls = ", ".join(f"{r['wall_ms']:.3f}" for r in rounds)
        lines.append(f"| {name} | {statistics.median(r['wall_ms'] for r in rounds):.3f} | {cpu} | {walls} |")
    threads = sorted({k for r in results["gateway"] for k in r if k.startswith("gateway_thread_ms.")})
    per_thread = {k[len("gateway_thread_ms."):]: statistics.median(r.get(k, 0.0) for r in results["gateway"])
                  for k in threads}
    busy = ", ".join(f"{name} {ms:.3f}" for name, ms in sorted(per_thread.items(), key=lambda kv: -kv[1]) if ms > 0)
    return "\n".join(lines) + f"\n\nthe gateway's threads, CPU ms/msg: {busy}\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--py-spy", type=pathlib.Path, default=None, dest="spy_dir")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "gateway_profile.md")
    args = parser.parse_args(argv)
    if not PY_CLIENT.exists():
        print(f"{PY_CLIENT} is missing: run `make rmq-clients`", file=sys.stderr)
        return 1
    if args.spy_dir:
        args.spy_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-gateway-profile-"))
    try:
        results = profile({"count": args.count, "warmup": args.warmup, "rounds": args.rounds}, work, args.spy_dir)
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"gateway profile failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (f"# Where a send through the gateway spends its time\n\n{when} on {os.cpu_count()} cores, load "
            f"average {os.getloadavg()[0]:.1f} at the end; {args.count} messages per round after {args.warmup}, "
            f"{args.rounds} alternating rounds. Workload: bench/gateway_profile.py (CPU: utime + stime of each "
            f"process over the measured sends, per message).\n\n{table(results)}")
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
