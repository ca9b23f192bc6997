"""The replication stream's transport floor (issue 34): what a replica's gRPC client costs per data message
before the replica does any work. Not part of ``make bench``; scratch figures.

    .venv/bin/python bench/replication_floor.py [--rounds 3] [--count 2000] [--size 256000]
        [--clients mt,st] [--window 1]

A leader-like server (a separate process on 127.0.0.1: grpc.aio, Replicate's handler and serializers as the
commit log registers them) answers a hello with a welcome, then streams ``--count`` data messages of
``--size`` bytes of log (built as the leader builds them, ``data_message_bytes``), at most ``--window``
unacknowledged (1: each after the ack of the one before, as the leader's stream wakes for the next append
after the replica acked the last one, bench/README.md *The replication benchmark*). The client, in this
process, is the replica's link (commitlog_service.replication.GrpcLeaderLink) doing nothing but acknowledge
each message as it arrives; its flavours (``--clients``):

  mt   grpc's synchronous stream-stream call (the replica's client before issue 34's transport step: a
       channel spin thread, a request-consumer thread, the acks through a SimpleQueue)
  st   the single-threaded call (GrpcReplicationStream: the follower's thread polls the call's own
       completion queue, sends each ack itself)

and either with HTTP/2 channel options (``+frame``: a 4 MiB max frame; ``+window``: 4 MiB of stream lookahead,
the initial window; ``+nobdp``: no BDP probe; ``+chunk``: 256 KiB TCP reads), e.g. ``--clients st,st+frame``.
``--server-options`` names the same for the server (one set a run).

Measured, flavours alternated each round: this process's CPU (all threads, ``time.process_time``) and the
server's (/proc) per data message, and the messages a second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import tempfile
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import grpc  # noqa: E402
from procs import PYTHON, cpu_seconds, spawn, stop_all  # noqa: E402

from commitlog_service import replication as R  # noqa: E402
from mqstore.replication.epochs import EpochHistory  # noqa: E402
from mqstore.replication.messages import Ack, Hello, LogData  # noqa: E402
from mqstore_rpc.gen.mqstore.v1 import replication_pb2 as pb  # noqa: E402


OPTIONS = {
    "frame": [("grpc.http2.max_frame_size", 4 << 20)],
    "window": [("grpc.http2.lookahead_bytes", 4 << 20)],
    "nobdp": [("grpc.http2.bdp_probe", 0)],
    "chunk": [("grpc.experimental.tcp_read_chunk_size", 256 << 10),
              ("grpc.experimental.tcp_min_read_chunk_size", 256 << 10)],
}


def _options(names: list[str]) -> list[tuple[str, int]]:
    return [o for name in names if name for o in OPTIONS[name]]


class FloorServicer(R.ReplicationServicer):
    """Replicate only: the welcome, then the data messages; the count, size and window in the hello's
    replica_id ("count:size:window")."""

    def __init__(self):  # no store, no node
        self.data_messages = R.DataMessages()

    async def Replicate(self, request_iterator, context):
        requests = aiter(request_iterator)
        hello = (await anext(requests)).hello
        count, size, window = (int(v) for v in hello.replica_id.split(":"))
        yield pb.LeaderMessage(welcome=pb.LeaderWelcome(leader_id="floor", epoch=1))
        payload = os.urandom(size)
        unacked = 0
        for i in range(count):
            while unacked >= window:
                await anext(requests)
                unacked -= 1
            end = (i + 1) * size
            yield R.data_message_bytes(LogData(i * size, payload, end, end, end))
            unacked += 1
        while unacked:
            await anext(requests)
            unacked -= 1


async def _serve(port_file: pathlib.Path, options: list[str]) -> None:
    server = grpc.aio.server(options=[("grpc.max_send_message_length", R._MAX_MESSAGE_BYTES),
                                      ("grpc.max_receive_message_length", R._MAX_MESSAGE_BYTES), *_options(options)])
    R.add_to_server(FloorServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


def _stream_once(link: R.GrpcLeaderLink, address: str, count: int, size: int, window: int) -> int:
    hello = Hello(f"{count}:{size}:{window}", "", 0, 0, EpochHistory(()), 1 << 30)
    stream = link.open(address, hello)
    seen = 0
    try:
        for d in stream:
            seen += 1
            stream.ack(Ack(d.next_offset, d.next_offset))
            if seen == count:
                break
    finally:
        stream.cancel()
    return seen


def floor_parser() -> argparse.ArgumentParser:
    """The arguments of every floor script (this one's, replication_floor_raw.py's)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256_000)
    return parser


def wait_for_port(port_file: pathlib.Path, server) -> int:
    """The port the floor server wrote once it listens; RuntimeError when it ended or took too long."""
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("the floor server did not start")
        time.sleep(0.05)
    return int(port_file.read_text())


def main() -> int:
    parser = floor_parser()
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--clients", default="mt,st")
    parser.add_argument("--server-options", default="")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.server_options.split(",")))
        return 0
    flavours = args.clients.split(",")
    with tempfile.TemporaryDirectory(prefix="mqstore-floor-") as tmp:
        port_file = pathlib.Path(tmp) / "port"
        server = spawn([PYTHON, __file__, "--serve", str(port_file), "--server-options", args.server_options])
        try:
            address = f"127.0.0.1:{wait_for_port(port_file, server)}"
            links = {}
            plain_open = R.open_channel
            for f in flavours:  # each link's channel opened now (connected and warmed up), with its options
                kind, *names = f.split("+")
                links[f] = R.GrpcLeaderLink(1000, single_threaded=(kind == "st"))
                extra = _options(names)
                R.open_channel = lambda a, tls, options, extra=extra: plain_open(a, tls, [*options, *extra])
                _stream_once(links[f], address, 50, args.size, args.window)
            R.open_channel = plain_open
            figures: dict[str, list[tuple[float, float, float]]] = {f: [] for f in flavours}
            for r in range(args.rounds):
                for f in (flavours if r % 2 == 0 else flavours[::-1]):
                    cpu0, server0, wall0 = time.process_time(), cpu_seconds(server.pid), time.perf_counter()
                    n = _stream_once(links[f], address, args.count, args.size, args.window)
                    wall = time.perf_counter() - wall0
                    cpu, server_cpu = time.process_time() - cpu0, cpu_seconds(server.pid) - server0
                    figures[f].append((cpu / n * 1e6, server_cpu / n * 1e6, n / wall))
                    print(f"round {r} {f}: client {cpu / n * 1e6:7.1f} us/msg, server {server_cpu / n * 1e6:7.1f} "
                          f"us/msg, {n / wall:8.0f} msg/s", flush=True)
            for f in flavours:
                c, s, rate = zip(*figures[f], strict=True)
                print(f"{f}: client median {statistics.median(c):.1f} us/msg ({min(c):.1f}-{max(c):.1f}), server "
                      f"{statistics.median(s):.1f}, {statistics.median(rate):.0f} msg/s")
            for link in links.values():
                link.close()
        finally:
            stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
