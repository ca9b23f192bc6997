"""The replication data connection: a Replicate stream's data messages and acks on a TCP connection of its own.

A leader with a data port (``--replication-data-port``, on by default: any free port) offers each replica that
says it can take one (``ReplicaHello.takes_data_connection``) a connection beside its gRPC call, as RocketMQ's
master serves its slaves on an HA port of its own: the welcome carries the port's address and a random token,
the replica connects (with the gRPC port's TLS, when it has one) and sends the token as its first frame, and from
then on the leader's data messages and the replica's acks are frames on that connection. The gRPC call carries
the hello, the welcome (checked by the port's authentication and permissions like any call: the token, handed
over on it, is what admits the connection) and, at the end, the stream's status; either's end ends both.

Why: gRPC's per-message machinery (HTTP/2 framing, flow control, the completion queue's hand-offs) cost a
leader ~230 us and each replica ~300 us a data message more than a framed TCP connection (bench/README.md, *What
a transport without gRPC would buy*), ~13% of a SYNC-replicated group's CPU on one machine.

Frames, either way::

    offset  size  field
    0       4     length: the payload's size in bytes, unsigned big-endian (at most MAX_FRAME_BYTES)
    4       n     payload: a serialized replication.proto message (LeaderMessage to the replica,
                  ReplicaMessage to the leader; the first frame to the leader: the token's bytes)

Thread-safety: :class:`DataPort` lives on the gRPC port's event loop (its methods are called there);
:class:`DataConnection` is read and written by the replica's follower thread, ``close()`` from any thread.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
import struct

import structlog
from mqstore import defaults
from mqstore.errors import Unavailable
from mqstore_rpc.tls import ClientTls, ServerTls

log = structlog.get_logger()
HEADER = struct.Struct(">I")
TOKEN_BYTES = 16
MAX_FRAME_BYTES = defaults.MAX_MESSAGE_BYTES  # what a gRPC message may be: the data messages are the same
MAX_ACK_FRAME_BYTES = 1 << 16                 # a replica's frames are acks (a few bytes) and its token
CONNECT_WAIT_S = 5.0   # the leader's wait for a welcomed replica's connection; the replica's connect timeout
TOKEN_WAIT_S = 5.0     # an accepted connection's wait for its token
READ_BUFFER_BYTES = 1 << 18


def split_address(address: str) -> tuple[str, int]:
    """host:port (an IPv6 host in brackets) as (host, port)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise Unavailable(f"the leader's data address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def server_context(tls: ServerTls) -> ssl.SSLContext:
    """The data port's TLS: the gRPC port's certificate and key, and its client CA (mutual TLS) if it has one."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.mutual:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=_text(tls.client_ca_pem.reveal()))
    return context


def client_context(tls: ClientTls) -> ssl.SSLContext:
    """A replica's TLS towards the data port: the CA the leader's certificate chains to, and its own client
    certificate for mutual TLS, as its gRPC channel has them."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=_text(tls.ca_pem.reveal()))
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def _text(pem) -> str:
    return pem.decode() if isinstance(pem, bytes) else pem


class DataPort:
    """The leader's side: a TCP listener on the gRPC port's loop. ``offer()`` makes a token for a welcomed
    stream, ``connection(token)`` waits for the replica to bring it back. Only the loop's thread calls it."""

    def __init__(self, host: str, port: int, advertised_host: str, advertised_address: str, tls: ServerTls | None):
        """Bound on ``host`` (the gRPC port's), ``port`` (0: any free one); replicas reach it at
        ``advertised_address``, else ``advertised_host`` (the host they reach the gRPC port at) and the port."""
        self._host, self._port = host, port
        self._advertised_host, self._advertised_address = advertised_host, advertised_address
        self._context = server_context(tls) if tls is not None else None
        self._server: asyncio.AbstractServer | None = None
        self._waiting: dict[bytes, asyncio.Future] = {}
        self.address = ""  # host:port replicas reach it at, once started

    async def start(self) -> None:
        host = None if self._host in ("", "0.0.0.0", "::", "[::]") else self._host.strip("[]")
        self._server = await asyncio.start_server(self._accepted, host, self._port, ssl=self._context,
                                                  limit=MAX_ACK_FRAME_BYTES * 2)
        port = self._server.sockets[0].getsockname()[1]
        self.address = self._advertised_address or f"{self._advertised_host}:{port}"
        log.info("replication.data_port", bound=port, address=self.address, tls=self._context is not None)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()

    def offer(self) -> bytes:
        """A token for one stream's connection (:meth:`connection` takes it back)."""
        token = secrets.token_bytes(TOKEN_BYTES)
        self._waiting[token] = asyncio.get_running_loop().create_future()
        return token

    async def connection(self, token: bytes, replica_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The replica's connection that brought ``token``; Unavailable when none came within CONNECT_WAIT_S
        (the replica went away, or cannot reach the data port)."""
        future = self._waiting[token]
        try:
            return await asyncio.wait_for(future, CONNECT_WAIT_S)
        except asyncio.TimeoutError:
            raise Unavailable(f"replica {replica_id} did not open its data connection to {self.address} within "
                              f"{CONNECT_WAIT_S:g} s (can it reach that address? --replication-data-address "
                              f"says where replicas find the data port)") from None
        finally:
            self._waiting.pop(token, None)

    def forget(self, token: bytes) -> None:
        """A stream that ended before its connection came: a late one is refused."""
        future = self._waiting.pop(token, None)
        if future is not None and future.done() and not future.cancelled():
            future.result()[1].close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            token = await asyncio.wait_for(read_frame(reader, TOKEN_BYTES), TOKEN_WAIT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError, ValueError):  # (ssl's errors are OSErrors)
            token = None
        future = self._waiting.get(token) if token is not None else None
        if future is None or future.done():
            log.warning("replication.data_connection_refused", peer=str(writer.get_extra_info("peername")),
                        why="no token" if token is None else "unknown or used token")
            writer.close()
            return
        future.set_result((reader, writer))


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    """One frame's payload; IncompleteReadError at the end of the connection, ValueError past ``limit``."""
    (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if length > limit:
        raise ValueError(f"a frame of {length} bytes, more than the {limit} expected")
    return await reader.readexactly(length)


class DataConnection:
    """The replica's side: a blocking connection to the leader's data port, read and written by the follower
    thread; ``close()`` from any thread ends a read in progress."""

    def __init__(self, address: str, token: bytes, tls: ClientTls | None):
        host, port = split_address(address)
        try:
            sock = socket.create_connection((host, port), timeout=CONNECT_WAIT_S)
        except OSError as exc:
            raise Unavailable(f"cannot connect to the leader's replication data port at {address} ({exc}): the "
                              f"leader's --replication-data-address says where replicas reach it (or "
                              f"--replication-data-port -1 sends the log on its gRPC port)") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = client_context(tls).wrap_socket(sock, server_hostname=tls.server_name or host)
            sock.settimeout(None)
            sock.sendall(HEADER.pack(len(token)) + token)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise Unavailable(f"the leader's data port at {address} refused the connection: {exc}") from None
        self.address = address
        self._sock = sock
        self._reader = sock.makefile("rb", buffering=READ_BUFFER_BYTES)
        self._closed = False

    def read_frame(self) -> bytes | None:
        """The next frame's payload; None at the connection's end (or once closed)."""
        try:
            head = self._reader.read(HEADER.size)
            if len(head) < HEADER.size:
                return None
            (length,) = HEADER.unpack(head)
            if length > MAX_FRAME_BYTES:
                log.warning("replication.data_frame_too_large", leader=self.address, bytes=length)
                return None
            payload = self._reader.read(length)
        except (OSError, ValueError, ssl.SSLError):
            return None  # closed under the read, or the connection broke
        return payload if len(payload) == length else None

    def send_frame(self, payload: bytes) -> bool:
        """Send one frame; False when the connection is over (the next read reports its end)."""
        try:
            self._sock.sendall(HEADER.pack(len(payload)) + payload)
            return True
        except (OSError, ValueError, ssl.SSLError):
            return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)  # ends a read blocked in another thread
        except OSError:
            pass
        try:
            self._reader.close()  # (waits for such a read to return, which the shutdown made it)
        except (OSError, ValueError):
            pass
        self._sock.close()
