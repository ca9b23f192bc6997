"""Pop consumption benchmark (run by ``make bench``): ``bench/pop.py [--quick]``.

Workload, as a real commit log process on 127.0.0.1 (ASYNC flush): a topic of 4 queues filled with
``messages`` messages of 1 KiB. Then each group consumes all of them once, as fast as it can, with 1 and
with 4 consumers (closed loop, grpc.aio in this process):

* pop: Receive (batch 32, every queue of the topic, invisible time 60 s) then Ack of the 32 handles, the
  consumers sharing one group;
* the comparison point, Pull + CommitOffset for the same messages: Pull (32 messages) then CommitOffset
  of its next offset; one consumer goes round the 4 queues, 4 consumers take a queue each.

Measured: messages consumed per second from the first call to the last message, and p50/p99 of one
Receive+Ack or Pull+CommitOffset pair. Pop and Pull take turns over ``rounds`` rounds (a fresh group each
time, on the same messages), and the table gives the medians and the ratio of the medians.
Target (issue 18): Receive + Ack (batch 32) >= 0.5x Pull + CommitOffset.

Ordered groups (issue 35, mqstore.pop.ordered): a second topic of 4 queues holds the same number of messages
of 1,000 message groups (sharding key and __SHARDINGKEY, as the gateway's FIFO producer stores them, each
group in one queue, the groups interleaved); an ordered group consumes all of them with Receive + Ack (batch
32) against an unordered group on the same messages, taking turns likewise. Target: >= 0.7x.

A full run writes bench/results/pop.json and pop.md; ``--quick`` writes to bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import diskuse
from procs import BenchError, run_meta, spawn, stop, stop_all, wait_for_event, write_table

from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2, consumer_pb2_grpc

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
TOPIC = "bench"
FIFO_TOPIC = "bench_fifo"
MESSAGE_GROUPS = 1_000
QUEUES = 4
BATCH = 32
BODY = b"x" * 1024
CONSUMERS = (1, 4)
FULL = {"messages": 20_000, "rounds": 3}
QUICK = {"messages": 2_000, "rounds": 1}


def start_log(work: pathlib.Path) -> tuple[object, str]:
    log_path = work / "commitlog.err"
    proc = spawn([sys.executable, "-m", "commitlog_service.main", "--port", "0", "--data-dir", str(work / "log")],
                 log_path, env=dict(os.environ))
    event = wait_for_event(proc, log_path, "server.started", 60)
    return proc, f"127.0.0.1:{event['port']}"


def fill(address: str, messages: int) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name=TOPIC, queue_count=QUEUES), timeout=10)
        for start in range(0, messages, 1000):
            count = min(1000, messages - start)
            stub.Append(commitlog_pb2.AppendRequest(topic=TOPIC, messages=[common_pb2.MessageInput(body=BODY)] * count),
                        timeout=30)


def fill_fifo(address: str, messages: int) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        stub.CreateTopic(commitlog_pb2.CreateTopicRequest(name=FIFO_TOPIC, queue_count=QUEUES), timeout=10)
        for start in range(0, messages, 1000):
            batch = []
            for i in range(start, min(start + 1000, messages)):
                group = f"order-{i % MESSAGE_GROUPS}"
                batch.append(common_pb2.MessageInput(body=BODY, sharding_key=group,
                                                     properties={"__SHARDINGKEY": group}))
            stub.Append(commitlog_pb2.AppendRequest(topic=FIFO_TOPIC, messages=batch), timeout=30)


def set_ordered(address: str, group: str) -> None:
    with grpc.insecure_channel(address) as channel:
        consumer_pb2_grpc.ConsumerStub(channel).SetGroupSettings(consumer_pb2.GroupSettings(group=group, ordered=True),
                                                                 timeout=10)


def _summary(latencies: list[float], consumed: int, elapsed_s: float, errors: dict) -> dict:
    latencies.sort()
    return {"msgs_per_s": consumed / elapsed_s, "consumed": consumed, "elapsed_s": elapsed_s,
            "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else None,
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else None, "errors": errors}


async def pop_group(address: str, group: str, consumers: int, messages: int, topic: str = TOPIC) -> dict:
    """Receive + Ack until every message of ``topic`` is acked once."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    consumed = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = consumer_pb2_grpc.ConsumerStub(channel)
        request = consumer_pb2.ReceiveRequest(group=group, topic=topic, batch_size=BATCH,
                                              invisible_duration_ms=60_000)

        async def consumer():
            nonlocal consumed
            while consumed < messages:
                began = time.monotonic()
                try:
                    received = await stub.Receive(request, timeout=30)
                    if not received.messages:
                        continue
                    acked = await stub.Ack(consumer_pb2.AckRequest(
                        group=group, topic=topic, receipt_handles=[m.receipt_handle for m in received.messages]),
                        timeout=30)
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                    continue
                consumed += sum(1 for r in acked.results if r.status == consumer_pb2.ACK_STATUS_OK)
                latencies.append(time.monotonic() - began)

        started = time.monotonic()
        await asyncio.gather(*(consumer() for _ in range(consumers)))
        return _summary(latencies, consumed, time.monotonic() - started, errors)


async def pull_group(address: str, group: str, consumers: int, messages: int) -> dict:
    """Pull + CommitOffset until every message of the topic is read once (4 consumers: a queue each)."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    consumed = 0
    per_queue = messages // QUEUES  # round robin: the same count in each queue
    async with grpc.aio.insecure_channel(address) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)

        async def consumer(queue_ids: list[int]):
            nonlocal consumed
            offsets = dict.fromkeys(queue_ids, 0)
            while any(offset < per_queue for offset in offsets.values()):
                for queue_id in queue_ids:
                    if offsets[queue_id] >= per_queue:
                        continue
                    began = time.monotonic()
                    try:
                        page = await stub.Pull(commitlog_pb2.PullRequest(
                            topic=TOPIC, queue_id=queue_id, offset=offsets[queue_id], max_messages=BATCH), timeout=30)
                        await stub.CommitOffset(commitlog_pb2.CommitOffsetRequest(
                            group=group, topic=TOPIC, queue_id=queue_id, offset=page.next_offset), timeout=30)
                    except grpc.aio.AioRpcError as exc:
                        errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                        continue
                    consumed += len(page.messages)
                    offsets[queue_id] = page.next_offset
                    latencies.append(time.monotonic() - began)

        split = [[q] for q in range(QUEUES)] if consumers == QUEUES else [list(range(QUEUES))] * consumers
        started = time.monotonic()
        await asyncio.gather(*(consumer(queues) for queues in split))
        return _summary(latencies, consumed, time.monotonic() - started, errors)


def measure(cfg: dict, work: pathlib.Path) -> dict:
    proc, address = start_log(work)
    raw: dict = {kind: {n: [] for n in CONSUMERS} for kind in ("pop", "pull", "fifo", "unordered")}
    try:
        fill(address, cfg["messages"])
        fill_fifo(address, cfg["messages"])
        for round_index in range(cfg["rounds"]):
            for n in CONSUMERS:
                for kind, run in (("pop", pop_group), ("pull", pull_group)):
                    result = asyncio.run(run(address, f"{kind}-{n}-{round_index}", n, cfg["messages"]))
                    raw[kind][n].append(result)
                    print(kind, n, "round", round_index, {k: v for k, v in result.items() if k != "errors"},
                          result["errors"] or "", flush=True)
                for kind in ("fifo", "unordered"):
                    group = f"{kind}-{n}-{round_index}"
                    if kind == "fifo":
                        set_ordered(address, group)
                    result = asyncio.run(pop_group(address, group, n, cfg["messages"], FIFO_TOPIC))
                    raw[kind][n].append(result)
                    print(kind, n, "round", round_index, {k: v for k, v in result.items() if k != "errors"},
                          result["errors"] or "", flush=True)
    finally:
        stop(proc)
    return raw


def rows(raw: dict) -> list[dict]:
    out = []
    for n in CONSUMERS:
        pop = statistics.median(r["msgs_per_s"] for r in raw["pop"][n])
        pull = statistics.median(r["msgs_per_s"] for r in raw["pull"][n])
        pop_p50 = statistics.median(r["p50_ms"] for r in raw["pop"][n])
        pull_p50 = statistics.median(r["p50_ms"] for r in raw["pull"][n])
        out += [{"workload": f"Receive+Ack batch {BATCH}, {n} consumer(s) (msgs/s)", "figure": pop,
                 "comparison": "Pull+CommitOffset, same messages and consumers", "comparison_figure": pull,
                 "ratio": round(pop / pull, 3), "target": ">= 0.5"},
                {"workload": f"Receive+Ack p50 ms, {n} consumer(s)", "figure": pop_p50,
                 "comparison": "Pull+CommitOffset p50 ms", "comparison_figure": pull_p50,
                 "ratio": round(pop_p50 / pull_p50, 3), "target": None}]
    for n in CONSUMERS:
        fifo = statistics.median(r["msgs_per_s"] for r in raw["fifo"][n])
        plain = statistics.median(r["msgs_per_s"] for r in raw["unordered"][n])
        out.append({"workload": f"ordered group: Receive+Ack batch {BATCH}, {MESSAGE_GROUPS:,} message groups, "
                                f"{n} consumer(s) (msgs/s)", "figure": fifo,
                    "comparison": "an unordered group, same messages and consumers", "comparison_figure": plain,
                    "ratio": round(fifo / plain, 3), "target": ">= 0.7"})
    return out


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))


def markdown(table: list[dict], meta: dict) -> str:
    lines = ["# Pop consumption benchmark", "",
             f"{meta['when']} at {meta['git']} on {meta['machine']}; {meta['mode']} run: {meta['messages']} messages "
             f"of 1 KiB in {QUEUES} queues, each group consumes all of them; medians of {meta['rounds']} "
             "alternating round(s). Workload: bench/pop.py. " + diskuse.describe(meta), "",
             "| workload | figure | comparison point | comparison | ratio | target |", "|---|---|---|---|---|---|"]
    for r in table:
        met = "" if not r["target"] else (" (met)" if r["ratio"] >= float(r["target"][3:]) else " (**missed**)")
        lines.append(f"| {r['workload']} | {_fmt(r['figure'])} | {r['comparison']} | {_fmt(r['comparison_figure'])} | "
                     f"{_fmt(r['ratio'])} | {(r['target'] or '') + met} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args, _ = parser.parse_known_args(argv)  # `make bench` passes run.py's options to every script
    cfg = QUICK if args.quick else FULL
    out_dir = RESULTS / "scratch" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-pop-bench-"))
    watch = diskuse.DiskWatch(work)
    try:
        with watch:
            raw = measure(cfg, work)
    except BenchError as exc:
        print(f"pop bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    meta = run_meta("quick" if args.quick else "full", **cfg, **watch.report())
    write_table(out_dir, "pop", meta, rows(raw), raw, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
