"""What SYNC group commit would gain with Append answered on an event loop: a prototype against the service.

The service now always does this (every port is grpc.aio, bench/README.md *One concurrency model*); the
prototype stays as the upper bound of that design without the interceptors.

``.venv/bin/python bench/sync_on_loop.py [--rounds 3] [--mode SYNC] [--shape unary-100] [--producers 32]``
measures, in alternating rounds, the CommitLog service (a synchronous gRPC server: each SYNC append parks
its handler thread until an fsync covers it, and each is woken on its own) against this file's ``--serve``
prototype: the same store (MessageStore, the compiled codec, the same request parsing and response bytes)
behind a grpc.aio server whose Append appends on the loop and then awaits a future. One group-commit thread
fdatasyncs what is written (Flusher.flush_now: the fsync, then the dispatch) and resolves every future that
fsync covers with one hand-off to the loop. ``--mode ASYNC`` runs both on an ASYNC store (the prototype then
answers without waiting). Prints each round and writes bench/results/scratch/sync_on_loop.json.

What the prototype leaves out, so its figures are an upper bound: the interceptors (metrics, error mapping,
authentication), the flush timeout, the replication acknowledgement, every other RPC (a real service would
serve them in a pool: mqstore_rpc.aio). Not part of ``make bench``; bench/README.md (*Where SYNC's time
goes*) has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import threading

import append
from procs import BENCH_DIR, PYTHON, GrpcServer, stop_all


class GroupCommit:
    """One thread that fsyncs what is written and resolves, on the loop, the futures the fsync covers."""

    def __init__(self, store, loop: asyncio.AbstractEventLoop):
        self._store, self._loop = store, loop
        self._pending: list[tuple[int, asyncio.Future]] = []
        self._wanted = threading.Condition()
        threading.Thread(target=self._run, name="group-commit", daemon=True).start()

    def covered(self, end: int) -> asyncio.Future:
        future = self._loop.create_future()
        with self._wanted:
            self._pending.append((end, future))
            self._wanted.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._wanted:
                while not self._pending:
                    self._wanted.wait()
            flushed = self._store.flusher.flush_now()
            with self._wanted:
                done = [f for end, f in self._pending if end <= flushed]
                self._pending = [(end, f) for end, f in self._pending if end > flushed]
            if done:
                self._loop.call_soon_threadsafe(_resolve, done)


def _resolve(done: list[asyncio.Future]) -> None:
    for future in done:
        if not future.done():
            future.set_result(None)


async def serve(data_dir: pathlib.Path, wait: bool) -> int:
    import grpc
    import structlog
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from mqstore.config import StoreConfig
    from mqstore.store_parts import build_store
    from mqstore_rpc import append_wire, logging as mqlogging
    from mqstore_rpc.server import ServerConfig

    from noop_server import _options

    mqlogging.configure("info")
    # ASYNC store with no flush of its own: the group-commit thread is the only one that fsyncs.
    store = build_store(StoreConfig(data_dir=data_dir, flush_interval_ms=600_000, flush_thorough_interval_ms=600_000))
    store.start()
    store.topic_admin.create(append.TOPIC, append.QUEUES)
    loop = asyncio.get_running_loop()
    group = GroupCommit(store, loop)

    async def append_(raw: bytes, context) -> bytes:
        request = append_wire.parse_request(raw)
        results = store.append(request.topic, append_wire.messages(request, context.peer()),
                               replication=append_wire.replication(request))
        if wait:
            await group.covered(store.commitlog.written_offset)
        return append_wire.append_response((results,))

    config = ServerConfig(host="127.0.0.1", port=0)
    server = grpc.aio.server(options=_options(config), maximum_concurrent_rpcs=config.max_concurrent_rpcs)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "mqstore.v1.CommitLog", {"Append": grpc.unary_unary_rpc_method_handler(append_)}),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(config.address)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    structlog.get_logger("sync_on_loop").info("server.started", port=port, pid=os.getpid())
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await server.stop(1)
    store.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=pathlib.Path, help=argparse.SUPPRESS)  # the prototype server itself
    parser.add_argument("--no-wait", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=("ASYNC", "SYNC"), default="SYNC")
    parser.add_argument("--shape", choices=sorted(append.SHAPES), default="unary-100")
    parser.add_argument("--producers", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.serve:
        return asyncio.run(serve(args.serve, wait=not args.no_wait))
    timing = {"warmup_s": 1.0, "duration_s": args.duration_s, "channels": 1}
    per_call = append.SHAPES[args.shape]["batch"] * append.SHAPES[args.shape]["items"]
    rounds: dict[str, list[dict]] = {"service": [], "on-loop": []}
    work = pathlib.Path(tempfile.mkdtemp(prefix="mqstore-sync-on-loop-"))
    try:
        for round_ in range(args.rounds):
            for name in rounds:
                data = work / f"{name}-{round_}"
                if name == "service":
                    server = GrpcServer.commitlog(data, args.mode).start().check_codec()
                    append.create_topic(server.target)
                else:
                    server = GrpcServer(name, [PYTHON, __file__, "--serve", str(data),
                                               *(["--no-wait"] if args.mode == "ASYNC" else [])],
                                        work / f"{name}-{round_}.log").start()
                try:
                    r = append.measure(server, args.shape, args.producers, timing, 1)
                finally:
                    server.stop()
                    shutil.rmtree(data, ignore_errors=True)  # each round on an empty store: the disk stays bounded
                r["cpu_us_per_call"] = r["server_cores"] / r["msgs_per_s"] * per_call * 1e6 if r["msgs_per_s"] else None
                rounds[name].append(r)
                print(f"round {round_ + 1}/{args.rounds} {name:8} msgs/s={r['msgs_per_s']:9,.0f} "
                      f"p50_ms={r['p50_ms']:.2f} server_cores={r['server_cores']:.2f} "
                      f"cpu_us_per_call={r['cpu_us_per_call']:.0f} errors={r['errors']}", flush=True)
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    out = BENCH_DIR / "results" / "scratch"
    out.mkdir(parents=True, exist_ok=True)
    meta = {"mode": args.mode, "shape": args.shape, "producers": args.producers, "rounds": args.rounds,
            "loadavg": os.getloadavg()}
    (out / "sync_on_loop.json").write_text(json.dumps({"meta": meta, "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
