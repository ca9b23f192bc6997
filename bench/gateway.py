"""RocketMQ 5 gateway benchmark (run by ``make bench``): ``bench/gateway.py [--quick]``.

Workload, all as real processes on 127.0.0.1 (a commit log with ASYNC flush, a Transaction service, the
gateway in Cluster mode, i.e. its own process; and for Local mode a second commit log serving the gateway
itself, ``--gateway-port``, with its own Transaction service): the official RocketMQ 5 Python client
(rocketmq-python-client 5.1.2 in .venv-rmq, driven by tests/clients/python/rmq_driver.py) sends 1 KiB messages
to an 8-queue topic through the gateway, one ``producer.send()`` at a time (the client sends one message per
request), for ``count`` messages after a warm-up. Comparison point in the same run, the same loop shape: one
process calling the commit log's own unary ``CommitLog.Append`` with one 1 KiB message per call, sequentially
(a plain grpc client, bench/append_loop.py). Rounds alternate (Cluster gateway, direct, Local gateway, ...);
each figure is the median of the rounds, and each ratio's spread is the lowest and highest of the per-round
ratios. Also reported, without a target: the Python client's own ceiling (the same loop against a no-op v2
server, bench/noop_v2.py, which stores nothing), the floors of the design (bench/gateway_floor.py: a minimal
sync proxy, the same on grpc.aio, and a minimal server that appends in its own process) and the Node client
(1.0.8) through the gateway. Targets: the Python client through the gateway >= 0.6x the direct loop in Cluster
mode (issue 37; Local mode >= 0.5x, issue 18; both against the same direct loop); and, in each round, 16 official
Python client processes sending at once through the Cluster-mode gateway (each after its warm-up, started
together) >= 0.6x 16 direct Append loops started so (the aggregate: every process's count over the slowest
one's time).

A full run writes bench/results/gateway.json and gateway.md; ``--quick`` writes to bench/results/scratch/.
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

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import diskuse
from procs import BenchError, run_meta, spawn, stop, stop_all, wait_for_event, write_table
import socket

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TOKEN = "bench-token"
TOPIC = "bench"
BODY_BYTES = 1024
FULL = {"count": 3000, "warmup": 300, "rounds": 3, "many": 16, "many_count": 400}
QUICK = {"count": 200, "warmup": 50, "rounds": 1, "many": 16, "many_count": 40}
PY_CLIENT = ROOT / ".venv-rmq" / "bin" / "python"
# bench/gateway_floor.py's minimal v2 servers: what the design allows, measured in the same rounds
FLOORS = {"sync": "a minimal sync proxy (parse, one unary Append, answer: gateway_floor.py sync)",
          "aio": "the same minimal proxy on grpc.aio with an aio channel (gateway_floor.py aio)",
          "stream": "a minimal sync proxy on one open CommitLogInternal.AppendBatchesStream (gateway_floor.py stream)",
          "inproc": "a minimal server appending in its own process, no hop (gateway_floor.py inproc)"}
CLIENT_TIMEOUT_S = 600
MANY = FULL["many"]


def start(module: str, args: list[str], log_path: pathlib.Path, port: int = 0):
    proc, event = start_event(module, args, log_path, port)
    return proc, f"127.0.0.1:{event['port']}"


def start_event(module: str, args: list[str], log_path: pathlib.Path, port: int = 0):
    proc = spawn([sys.executable, "-m", module, "--port", str(port), *args], log_path,
                 env={**os.environ, "MQSTORE_INTERNAL_TOKEN": TOKEN})
    return proc, wait_for_event(proc, log_path, "server.started", 60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def create_topic(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        commitlog_pb2_grpc.CommitLogStub(channel).CreateTopic(
            commitlog_pb2.CreateTopicRequest(name=TOPIC, queue_count=8), timeout=10)


def drive(command: list[str], script: list[dict], home: pathlib.Path) -> list[dict]:
    """Run a client driver with these commands; its replies (a failed command is a BenchError)."""
    home.mkdir(parents=True, exist_ok=True)
    stdin = "".join(json.dumps({"id": i, **c}) + "\n" for i, c in enumerate(script, 1))
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S,
                          env={**os.environ, "HOME": str(home)})
    replies = [r for r in map(json.loads, done.stdout.splitlines()) if "id" in r]
    failed = [r for r in replies if not r["ok"]]
    if failed or len(replies) != len(script):
        raise BenchError(f"{command[1]}: {failed or 'missing replies'}; stderr: {done.stderr[-2000:]}")
    return replies


def client_rate(kind: str, endpoint: str, cfg: dict, home: pathlib.Path) -> float:
    if kind == "python":
        command = [str(PY_CLIENT), str(ROOT / "tests" / "clients" / "python" / "rmq_driver.py"), endpoint]
    else:
        command = ["node", str(ROOT / "tests" / "clients" / "node" / "driver.js"), endpoint]
    replies = drive(command, [{"op": "producer", "topics": [TOPIC]},
                              {"op": "send_many", "topic": TOPIC, "count": cfg["warmup"], "body_bytes": BODY_BYTES},
                              {"op": "send_many", "topic": TOPIC, "count": cfg["count"], "body_bytes": BODY_BYTES},
                              {"op": "shutdown"}], home)
    return cfg["count"] / replies[2]["elapsed_s"]


def direct_rate(address: str, cfg: dict) -> float:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "append_loop.py"), address, TOPIC,
                           str(cfg["warmup"]), str(cfg["count"]), str(BODY_BYTES)],
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    if done.returncode != 0:
        raise BenchError(f"append_loop.py: {done.stderr[-2000:]}")
    return cfg["count"] / json.loads(done.stdout)["elapsed_s"]


def _reply(proc: subprocess.Popen) -> dict:
    """The next reply of a driver (its event lines skipped); a failed one is a BenchError."""
    for line in proc.stdout:
        reply = json.loads(line)
        if "id" in reply:
            if not reply["ok"]:
                raise BenchError(f"driver: {reply}")
            return reply
    raise BenchError(f"a driver exited with {proc.wait(30)} before answering")


def _barrier_rate(procs: list[subprocess.Popen], start_line: str, count: int, elapsed) -> float:
    """Aggregate rate of ``procs``, all warm: ``start_line`` to each at once, then each one's elapsed seconds
    (``elapsed(proc)``); the aggregate is every process's ``count`` over the slowest one's time."""
    for proc in procs:
        proc.stdin.write(start_line)
        proc.stdin.flush()
    return len(procs) * count / max(elapsed(proc) for proc in procs)


def many_clients_rate(endpoint: str, cfg: dict, home: pathlib.Path) -> float:
    """``cfg["many"]`` official Python client processes sending ``cfg["many_count"]`` each at once, after each
    one's warm-up (a barrier): messages per second, all together."""
    procs = []
    try:
        for i in range(cfg["many"]):
            (home / str(i)).mkdir(parents=True, exist_ok=True)
            procs.append(subprocess.Popen([str(PY_CLIENT), str(ROOT / "tests" / "clients" / "python" / "rmq_driver.py"),
                                           endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                          env={**os.environ, "HOME": str(home / str(i))}))
        script = [{"op": "producer", "topics": [TOPIC]},
                  {"op": "send_many", "topic": TOPIC, "count": cfg["warmup"] // 4, "body_bytes": BODY_BYTES}]
        for proc in procs:
            proc.stdin.write("".join(json.dumps({"id": n, **c}) + "\n" for n, c in enumerate(script, 1)))
            proc.stdin.flush()
        for proc in procs:
            _reply(proc)
            _reply(proc)
        measured = json.dumps({"id": 3, "op": "send_many", "topic": TOPIC, "count": cfg["many_count"],
                               "body_bytes": BODY_BYTES}) + "\n"
        rate = _barrier_rate(procs, measured, cfg["many_count"], lambda p: _reply(p)["elapsed_s"])
        for proc in procs:
            proc.stdin.write(json.dumps({"id": 4, "op": "shutdown"}) + "\n")
            proc.stdin.close()
        return rate
    finally:
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


def many_direct_rate(address: str, cfg: dict) -> float:
    """``cfg["many"]`` bench/append_loop.py processes at once (a barrier after each one's warm-up)."""
    procs = [subprocess.Popen([sys.executable, str(ROOT / "bench" / "append_loop.py"), address, TOPIC,
                               str(cfg["warmup"] // 4), str(cfg["many_count"]), str(BODY_BYTES), "barrier"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(cfg["many"])]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise BenchError(f"append_loop.py exited with {proc.wait(30)} before its warm-up ended")
        return _barrier_rate(procs, "go\n", cfg["many_count"], lambda p: json.loads(p.stdout.readline())["elapsed_s"])
    finally:
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


def noop_rate(cfg: dict, home: pathlib.Path) -> float:
    """The Python client's loop against bench/noop_v2.py: what the client alone allows."""
    noop = subprocess.Popen([sys.executable, str(ROOT / "bench" / "noop_v2.py")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(noop.stdout.readline())
        return client_rate("python", f"127.0.0.1:{port}", cfg, home)
    finally:
        noop.stdin.close()
        try:
            noop.wait(30)
        except subprocess.TimeoutExpired:
            noop.kill()
            noop.wait(30)


def floor_rate(mode: str, log_address: str, cfg: dict, home: pathlib.Path) -> float:
    """The Python client's loop against bench/gateway_floor.py in ``mode`` (sync, aio, inproc)."""
    floor = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gateway_floor.py"), mode, log_address],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "MQSTORE_INTERNAL_TOKEN": TOKEN})  # the stream floor's
    try:
        line = floor.stdout.readline()
        while line and not line.strip().isdigit():  # the in-process store logs to stdout first
            line = floor.stdout.readline()
        if not line:
            raise BenchError(f"gateway_floor.py {mode} exited with {floor.wait(30)} before serving")
        return client_rate("python", f"127.0.0.1:{int(line)}", cfg, home)
    finally:
        floor.stdin.close()
        try:
            floor.wait(30)
        except subprocess.TimeoutExpired:
            floor.kill()
            floor.wait(30)


def measure(cfg: dict, work: pathlib.Path) -> dict:
    if not PY_CLIENT.exists():
        raise BenchError(f"{PY_CLIENT} is missing: run `make rmq-clients`")
    log_proc, log_address = start("commitlog_service.main", ["--data-dir", str(work / "log")], work / "log.err")
    rates: dict[str, list[float]] = {"python": [], "direct": [], "local": [], "noop": [], "node": [], "node_local": [],
                                     "many": [], "many_direct": [], **{f"floor_{mode}": [] for mode in FLOORS}}
    try:
        txn_proc, txn_address = start("txn_service.main", ["--data-dir", str(work / "txn"), "--commitlog",
                                                           log_address], work / "txn.err")
        gw_proc, gw_address = start("gateway_service.main", ["--commitlog", log_address, "--txn", txn_address],
                               work / "gateway.err")
        create_topic(log_address)
        # Local mode: a second commit log serving the gateway itself, told its Transaction service's port
        local_txn_port = free_port()
        local_proc, event = start_event("mqstore_launcher.node", [
            "--data-dir", str(work / "local-log"), "--gateway-port", "0",
            "--gateway-txn", f"127.0.0.1:{local_txn_port}"], work / "local-log.err")
        local_log, local_gw = f"127.0.0.1:{event['port']}", f"127.0.0.1:{event['ports']['gateway']}"
        local_txn_proc, _ = start("txn_service.main", ["--data-dir", str(work / "local-txn"), "--commitlog", local_log],
                                  work / "local-txn.err", port=local_txn_port)
        create_topic(local_log)
        for round_no in range(cfg["rounds"]):
            rates["python"].append(client_rate("python", gw_address, cfg, work / f"home-py-{round_no}"))
            rates["direct"].append(direct_rate(log_address, cfg))
            rates["local"].append(client_rate("python", local_gw, cfg, work / f"home-local-{round_no}"))
            rates["noop"].append(noop_rate(cfg, work / f"home-noop-{round_no}"))
            for mode in FLOORS:
                rates[f"floor_{mode}"].append(floor_rate(mode, log_address, cfg, work / f"home-{mode}-{round_no}"))
            rates["many"].append(many_clients_rate(gw_address, cfg, work / f"home-many-{round_no}"))
            rates["many_direct"].append(many_direct_rate(log_address, cfg))
            print("round", round_no, {k: round(v[-1], 1) for k, v in rates.items() if v}, flush=True)
        if shutil.which("node") and (ROOT / "tests" / "clients" / "node" / "node_modules").is_dir():
            rates["node"].append(client_rate("node", gw_address, cfg, work / "home-node"))
            rates["node_local"].append(client_rate("node", local_gw, cfg, work / "home-node-local"))
        stop(local_txn_proc)
        stop(local_proc)
        stop(gw_proc)
        stop(txn_proc)
    finally:
        stop(log_proc)
    return rates


def spread(rates: dict, name: str) -> str:
    """The lowest and highest per-round ratio of ``name`` to the direct loop of the same round."""
    ratios = [a / b for a, b in zip(rates[name], rates["direct"], strict=True)]
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def rows(rates: dict) -> list[dict]:
    py, direct = statistics.median(rates["python"]), statistics.median(rates["direct"])
    local = statistics.median(rates["local"])
    out = [{"workload": "Python client send(), 1 x 1 KiB per call, sequential, through the gateway in Cluster mode "
                        "(its own process) (msg/s)",
            "figure": round(py, 1), "comparison": "the same loop calling CommitLog.Append directly (plain grpc)",
            "comparison_figure": round(direct, 1), "ratio": round(py / direct, 3), "spread": spread(rates, "python"),
            "target": ">= 0.6"},
           {"workload": "the same through the gateway in Local mode (served by the commit log process, "
                        "--gateway-port) (msg/s)",
            "figure": round(local, 1), "comparison": "the same direct Append loop",
            "comparison_figure": round(direct, 1), "ratio": round(local / direct, 3),
            "spread": spread(rates, "local"), "target": ">= 0.5"}]
    many, many_direct = statistics.median(rates["many"]), statistics.median(rates["many_direct"])
    ratios = [a / b for a, b in zip(rates["many"], rates["many_direct"], strict=True)]
    out.append({"workload": f"{MANY} official Python client processes at once, "
                            f"each send() sequential, through the gateway in Cluster mode, aggregate (msg/s)",
                "figure": round(many, 1), "comparison": f"{MANY} direct Append loops at once (append_loop.py)",
                "comparison_figure": round(many_direct, 1), "ratio": round(many / many_direct, 3),
                "spread": f"{min(ratios):.3f}-{max(ratios):.3f}", "target": ">= 0.6"})
    noop = statistics.median(rates["noop"])
    out.append({"workload": "Python client send() against a no-op v2 server (msg/s): the client's own ceiling",
                "figure": round(noop, 1), "comparison": "the direct Append loop", "comparison_figure": round(direct, 1),
                "ratio": round(noop / direct, 3), "spread": spread(rates, "noop"), "target": None})
    for mode, label in FLOORS.items():
        if rates[f"floor_{mode}"]:
            floor = statistics.median(rates[f"floor_{mode}"])
            out.append({"workload": f"Python client send() against {label} (msg/s): a floor of the design",
                        "figure": round(floor, 1), "comparison": "the direct Append loop",
                        "comparison_figure": round(direct, 1), "ratio": round(floor / direct, 3),
                        "spread": spread(rates, f"floor_{mode}"), "target": None})
    for name, label in (("node", "Cluster"), ("node_local", "Local")):
        if rates[name]:  # one round, after the others
            node = statistics.median(rates[name])
            out.append({"workload": f"Node client send(), 1 x 1 KiB per call, sequential, through the gateway in "
                                    f"{label} mode (msg/s)",
                        "figure": round(node, 1), "comparison": "the direct Append loop (median)",
                        "comparison_figure": round(direct, 1), "ratio": round(node / direct, 3), "spread": "one round",
                        "target": None})
    return out


def markdown(table: list[dict], meta: dict) -> str:
    lines = ["# RocketMQ 5 gateway benchmark", "", f"{meta['when']} on {meta['machine']}; {meta['mode']} run: "
             f"{meta['count']} messages per round after {meta['warmup']}, medians of {meta['rounds']} alternating "
             f"rounds (spread: the lowest and highest per-round ratio). Workload: bench/gateway.py. "
             + diskuse.describe(meta), "",
             "| workload | figure | comparison point | comparison | ratio | spread | target |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['figure']:,} | {r['comparison']} | {r['comparison_figure']:,} | {r['ratio']} | "
              f"{r['spread']} | {r['target'] or ''} |" for r in table]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = RESULTS / "scratch" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-gateway-bench-"))
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            rates = measure(cfg, work)
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"gateway bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta("quick" if args.quick else "full", **cfg, **watch.report())
    write_table(out_dir, "gateway", meta, rows(rates), rates, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
