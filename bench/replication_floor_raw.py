"""The replication stream's floor over plain TCP (issue 34): what a data message and its acknowledgement would
cost the leader and the replica without gRPC, beside bench/replication_floor.py's figures for the gRPC stream.
Not part of ``make bench``; scratch figures for the decision on the replication transport (bench/README.md,
*Pacing ASYNC replication, and where the leader's extra goes*).

    .venv/bin/python bench/replication_floor_raw.py [--rounds 3] [--count 2000] [--size 256000]

The same exchange as replication_floor.py's with ``--window 1``: a leader-like server (a separate process on
127.0.0.1, an asyncio protocol on uvloop, as the servers run their loops) sends ``--count`` data messages of
``--size`` bytes of log, each built as the leader builds it (``data_message_bytes``) and framed by its length
(4 bytes, little-endian), the next once the last is acknowledged; the client, in this process, reads each whole
message into one buffer, parses it as the replica does (``leader_message_in``) and answers a serialized
``ReplicaMessage`` ack, framed alike, which the server parses. No TLS, no flow control but TCP's, no
multiplexing: what such a transport would have to add is not in these figures.

Measured: this process's CPU (``time.process_time``) and the server's (/proc) per data message, and the
messages a second.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import statistics
import struct
import sys
import tempfile
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from procs import PYTHON, cpu_seconds, spawn, stop_all  # noqa: E402
from replication_floor import floor_parser, wait_for_port  # noqa: E402

from commitlog_service import replication as R  # noqa: E402
from mqstore.replication.messages import LogData  # noqa: E402
from mqstore_rpc.gen.mqstore.v1 import replication_pb2 as pb  # noqa: E402

LENGTH = struct.Struct("<I")
SOCKET_BUFFER_BYTES = 4 << 20


async def _serve(port_file: pathlib.Path) -> None:
    """Per connection: a request "count:size" (framed), then the data messages, one at a time."""
    loop = asyncio.get_running_loop()

    class Leader(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buffer, self.count, self.size, self.sent = transport, bytearray(), 0, 0, 0
            # room for a whole data message in the kernel: one send each, not a partial one and a wait to write
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            self.payload = b""

        def data_received(self, data):
            self.buffer += data
            while len(self.buffer) >= 4:
                length = LENGTH.unpack_from(self.buffer)[0]
                if len(self.buffer) < 4 + length:
                    return
                frame = bytes(self.buffer[4:4 + length])
                del self.buffer[:4 + length]
                if not self.count:  # the request
                    self.count, self.size = (int(v) for v in frame.decode().split(":"))
                    self.payload = os.urandom(self.size)
                else:
                    pb.ReplicaMessage.FromString(frame)  # the ack, parsed as the leader parses it
                if self.sent < self.count:
                    end = (self.sent + 1) * self.size
                    message = R.data_message_bytes(LogData(self.sent * self.size, self.payload, end, end, end))
                    self.transport.writelines((LENGTH.pack(len(message)), message))
                    self.sent += 1
                else:
                    self.count = self.sent = 0  # ready for the next request

    server = await loop.create_server(Leader, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await server.serve_forever()


def _read_exactly(sock: socket.socket, view: memoryview, size: int) -> None:
    got = 0
    while got < size:
        n = sock.recv_into(view[got:size], size - got)
        if not n:
            raise ConnectionError("the floor server closed the connection")
        got += n


def _stream_once(sock: socket.socket, count: int, size: int) -> int:
    request = f"{count}:{size}".encode()
    sock.sendall(LENGTH.pack(len(request)) + request)
    buffer = bytearray(size + 64)
    view = memoryview(buffer)
    for _ in range(count):
        _read_exactly(sock, view, 4)
        length = LENGTH.unpack_from(buffer)[0]
        if length > len(buffer):
            buffer = bytearray(length)
            view = memoryview(buffer)
        _read_exactly(sock, view, length)
        d = R.leader_message_in(bytes(view[:length]))
        ack = pb.ReplicaMessage(ack=pb.ReplicaAck(written_offset=d.next_offset, flushed_offset=d.next_offset))
        raw = ack.SerializeToString()
        sock.sendall(LENGTH.pack(len(raw)) + raw)
    return count


def main() -> int:
    args = floor_parser().parse_args()
    if args.serve:
        import uvloop
        uvloop.run(_serve(args.serve))
        return 0
    with tempfile.TemporaryDirectory(prefix="mqstore-floor-raw-") as tmp:
        port_file = pathlib.Path(tmp) / "port"
        server = spawn([PYTHON, __file__, "--serve", str(port_file)])
        try:
            with socket.create_connection(("127.0.0.1", wait_for_port(port_file, server)), timeout=60) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
                _stream_once(sock, 50, args.size)  # warmed up
                figures = []
                for r in range(args.rounds):
                    cpu0, server0, wall0 = time.process_time(), cpu_seconds(server.pid), time.perf_counter()
                    n = _stream_once(sock, args.count, args.size)
                    wall = time.perf_counter() - wall0
                    cpu, server_cpu = time.process_time() - cpu0, cpu_seconds(server.pid) - server0
                    figures.append((cpu / n * 1e6, server_cpu / n * 1e6, n / wall))
                    print(f"round {r} raw: client {cpu / n * 1e6:7.1f} us/msg, server {server_cpu / n * 1e6:7.1f} "
                          f"us/msg, {n / wall:8.0f} msg/s", flush=True)
            c, s, rate = zip(*figures, strict=True)
            print(f"raw: client median {statistics.median(c):.1f} us/msg ({min(c):.1f}-{max(c):.1f}), server "
                  f"{statistics.median(s):.1f}, {statistics.median(rate):.0f} msg/s")
        finally:
            stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
