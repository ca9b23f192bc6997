"""The gRPC floor of a transaction (issue 20): what the Transaction service's server costs before it does
any work. ``.venv/bin/python bench/txn_floor.py [--rounds 3] [--producers 8,32] [--duration-s 4]``

Three servers, each a separate process on 127.0.0.1, measured in alternating rounds with the same
closed-loop producers as bench/txn.py (grpc.aio in this process):

  server                 what it serves                      built as
  ---------------------- ----------------------------------- ---------------------------------------------
  append (no-op)         CommitLog.Append, no store          bench/noop_server.py ``sync``: the service
                                                             skeleton (mqstore_rpc.server, interceptors)
  transact sync (no-op)  Transaction.Transact, no coordinator this file ``--serve sync``: the same skeleton
  transact aio (no-op)   Transaction.Transact, no coordinator this file ``--serve aio``: grpc.aio, one loop

A producer of "append" makes one unary Append of a 256-byte message; a producer of "transact" runs a mode of
bench/txn.py (``--mode``, default one-way: a Prepare frame, answered with a fresh transaction id and one
half, and a one-way Commit frame; stream: the Commit frame answered too; unary: two unary calls, Prepare and
Commit, answered as the frames are). Measured: operations/s and the server's CPU ms per operation (/proc,
over the window). The ratio "transact / append" of a round is the share of a plain Append's rate that a
transaction could reach if the service did nothing but receive and answer its frames: the ceiling of the
Prepare+Commit target (>= 0.5x plain Append) for each server flavour. Prints a table and writes
bench/results/scratch/txn_floor.json. Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import txn as txn_bench
from procs import PYTHON, spawn, stop_all, wait_for_event

from mqstore_rpc.gen.mqstore.v1 import common_pb2, txn_pb2, txn_pb2_grpc

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "scratch"
SERVERS = ("append", "transact-sync", "transact-aio")


# ---- the no-op Transaction servers ----------------------------------------------------------------------

def _answer(request: txn_pb2.TransactRequest, ids) -> txn_pb2.TransactResponse | None:
    """A Prepare gets a fresh id and one half of a realistic size; a one-way end gets nothing; a two-way
    end gets COMMITTED."""
    if request.one_way:
        return None
    if request.HasField("prepare"):
        prepared = txn_pb2.PrepareResponse(transaction_id=f"{next(ids):032x}", durability=common_pb2.DURABILITY_WRITTEN)
        prepared.halves.add(uniq_key="7F0000010000" + "AB" * 10, physical_offset=9_876_543_210,
                            half_queue_offset=123_456, real_queue_id=3)
        return txn_pb2.TransactResponse(request_id=request.request_id, prepared=prepared)
    return txn_pb2.TransactResponse(request_id=request.request_id, ended=txn_pb2.EndResponse(
        state=txn_pb2.TRANSACTION_STATE_COMMITTED))


def _prepared(ids) -> txn_pb2.PrepareResponse:
    return _answer(txn_pb2.TransactRequest(prepare=txn_pb2.PrepareRequest()), ids).prepared


_COMMITTED = txn_pb2.EndResponse(state=txn_pb2.TRANSACTION_STATE_COMMITTED)


class NoopTransaction(txn_pb2_grpc.TransactionServicer):
    def __init__(self) -> None:
        self._ids = itertools.count(1)  # next() on a count is atomic under the GIL

    def Prepare(self, request, context):
        return _prepared(self._ids)

    def Commit(self, request, context):
        return _COMMITTED

    def Transact(self, request_iterator, context):
        for request in request_iterator:
            answer = _answer(request, self._ids)
            if answer is not None:
                yield answer


class AioNoopTransaction(txn_pb2_grpc.TransactionServicer):
    def __init__(self) -> None:
        self._ids = itertools.count(1)

    async def Prepare(self, request, context):
        return _prepared(self._ids)

    async def Commit(self, request, context):
        return _COMMITTED

    async def Transact(self, request_iterator, context):
        async for request in request_iterator:
            answer = _answer(request, self._ids)
            if answer is not None:
                yield answer


def serve(flavour: str) -> int:
    from mqstore_rpc import logging as mqlogging
    mqlogging.configure("info")
    if flavour == "aio":
        return asyncio.run(_serve_aio())
    from mqstore_rpc.server import ServerConfig, create_server
    server = create_server(ServerConfig(host="127.0.0.1", port=0))
    txn_pb2_grpc.add_TransactionServicer_to_server(NoopTransaction(), server.grpc_server)
    server.add_service_names([txn_pb2.DESCRIPTOR.services_by_name["Transaction"].full_name])
    server.start()
    server.mark_serving()
    _started(server.port, flavour)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    stopping.wait()
    server.stop()
    return 0


async def _serve_aio() -> int:
    server = grpc.aio.server()
    txn_pb2_grpc.add_TransactionServicer_to_server(AioNoopTransaction(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _started(port, "aio")
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop(1)
    return 0


def _started(port: int, flavour: str) -> None:
    print(json.dumps({"event": "server.started", "port": port, "flavour": flavour, "pid": os.getpid()}),
          file=sys.stderr, flush=True)


# ---- measuring ------------------------------------------------------------------------------------------

async def run_transact(address: str, producers: int, cfg: dict, pid: int, mode: str = "one-way") -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = txn_pb2_grpc.TransactionStub(channel)
        made = [txn_bench.MODES[mode](stub) for _ in range(producers)]
        result = await txn_bench.closed_loop([op for op, _ in made], cfg["warmup_s"], cfg["duration_s"],
                                             {"server": pid})
        for _, close in made:
            if close is not None:  # unary producers have nothing to close
                await close()
    return result


def start(args: list[str], log_path: pathlib.Path):
    proc = spawn(args, log_path)
    return proc, f"127.0.0.1:{wait_for_event(proc, log_path, 'server.started', 60)['port']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=("sync", "aio"), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producers", default="8,32")
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--mode", default="one-way", choices=tuple(txn_bench.MODES),
                        help="how a producer makes its Prepare and Commit (bench/txn.py's modes)")
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve)
    cfg = {"warmup_s": 1.0, "duration_s": args.duration_s}
    counts = [int(x) for x in args.producers.split(",") if x.strip()]
    here = pathlib.Path(__file__).resolve()
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="mqstore-txn-floor-") as tmp:
        work = pathlib.Path(tmp)
        try:
            servers = {
                "append": start([PYTHON, str(here.parent / "noop_server.py"), "--port", "0", "--flavour", "sync"],
                                work / "append.err"),
                "transact-sync": start([PYTHON, str(here), "--serve", "sync"], work / "sync.err"),
                "transact-aio": start([PYTHON, str(here), "--serve", "aio"], work / "aio.err")}
            for round_ in range(args.rounds):
                for n in counts:
                    for name, (proc, address) in servers.items():
                        if name == "append":
                            got = asyncio.run(txn_bench.run_append(address, n, 1, cfg, {"server": proc.pid}))
                        else:
                            got = asyncio.run(run_transact(address, n, cfg, proc.pid, args.mode))
                        rows.setdefault(f"{name} {n}", []).append(got)
                        print(f"round {round_ + 1}: {name:14} {n:3}p  {got['ops_per_s']:8.1f} ops/s  server "
                              f"{got['cpu_ms_per_op']['server']:.3f} ms/op  client "
                              f"{got['cpu_ms_per_op']['client']:.3f} ms/op", flush=True)
        finally:
            stop_all()
    summary = []
    for n in counts:
        base = rows[f"append {n}"]
        for name in SERVERS[1:]:
            mine = rows[f"{name} {n}"]
            ratios = [m["ops_per_s"] / b["ops_per_s"] for m, b in zip(mine, base, strict=True)]
            cpu = [m["cpu_ms_per_op"]["server"] / b["cpu_ms_per_op"]["server"] for m, b in zip(mine, base, strict=True)]
            summary.append({"server": name, "producers": n, "rate_ratio": statistics.median(ratios),
                            "rate_spread": [min(ratios), max(ratios)], "server_cpu_ratio": statistics.median(cpu),
                            "server_cpu_ms": statistics.median(m["cpu_ms_per_op"]["server"] for m in mine),
                            "append_server_cpu_ms": statistics.median(b["cpu_ms_per_op"]["server"] for b in base)})
    print("\n| server | producers | txn/s ÷ Append/s (median, spread) | server CPU ms per txn | per Append | ratio |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['server']} | {s['producers']} | {s['rate_ratio']:.2f} ({s['rate_spread'][0]:.2f}-"
              f"{s['rate_spread'][1]:.2f}) | {s['server_cpu_ms']:.3f} | {s['append_server_cpu_ms']:.3f} | "
              f"{s['server_cpu_ratio']:.2f} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "txn_floor.json").write_text(json.dumps({"mode": args.mode, "rounds": rows, "summary": summary},
                                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
