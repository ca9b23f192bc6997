"""The replication data connection (commitlog_service.data_link) on real servers on 127.0.0.1: the stream's data
and acks on the leader's data port, the token that admits a connection (once, only a welcomed stream's), either
end ending the other, the fallback to the gRPC stream, and a cut of the data path alone."""

from __future__ import annotations

import dataclasses
import pathlib
import queue
import socket
import struct

import grpc
import pytest

from commitlog_service import data_link
from commitlog_service.replication import GrpcLeaderLink
from mqstore.replication.messages import Ack
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import replication_pb2 as rpb
from mqstore_rpc.gen.mqstore.v1 import replication_pb2_grpc
from tests.integration.test_replication import (RPC_TIMEOUT_S, SEGMENT_BYTES, _hello, node_config, secured,
                                                segment_bytes, started)
from tests.support.gateway import free_port
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _with_data(config, **fields):
    return dataclasses.replace(config, replication=dataclasses.replace(config.replication, **fields))


def test_frames_are_a_big_endian_length_and_the_payload():
    """The layout the module docstring gives (golden bytes): a 4-byte big-endian length, then the payload."""
    assert data_link.HEADER.pack(0x010203) + b"x" == b"\x00\x01\x02\x03x"
    assert data_link.HEADER.size == 4
    assert data_link.split_address("[::1]:7001") == ("::1", 7001)
    assert data_link.split_address("node-1:7001") == ("node-1", 7001)


def _read_until(stream, end: int) -> int:
    acked = 0
    for d in stream:
        acked = d.next_offset
        stream.ack(Ack(acked, 0))
        if acked >= end:
            break
    return acked


@pytest.mark.parametrize("leader_port, link_takes, connected", [
    (0, True, True),      # the default: the data connection
    (-1, True, False),    # a leader without a data port: everything on the gRPC stream
    (0, False, False),    # a replica that does not take one (an earlier version): the gRPC stream
])
def test_a_stream_takes_the_data_connection_when_both_sides_have_it_and_works_either_way(
        tmp_path, leader_port, link_takes, connected):
    with started(_with_data(node_config(tmp_path, "a"), replication_data_port=leader_port)) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        leader.append("t", 40)
        link = GrpcLeaderLink(heartbeat_ms=50, data_connection=link_takes)
        try:
            stream = link.open(leader.address, _hello("w"))
            assert (stream._data is not None) == connected
            acked = _read_until(stream, leader.end())
            assert acked == leader.end() > 0
            wait_until(lambda: [(r.replica_id, r.written_offset) for r in leader.state().replicas] == [("w", acked)],
                       "the leader to read the replica's ack")
            stream.cancel()
        finally:
            link.close()


class RawStream:
    """A Replicate call made by hand (a hello that takes the data connection), for what a replica would not do."""

    def __init__(self, address: str, replica_id: str = "raw", channel: grpc.Channel | None = None):
        self.channel = channel or grpc.insecure_channel(address)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.requests.put(rpb.ReplicaMessage(hello=rpb.ReplicaHello(
            replica_id=replica_id, address="127.0.0.1:1", segment_size_bytes=SEGMENT_BYTES, pages_welcome=True,
            takes_data_connection=True)))
        self.call = replication_pb2_grpc.ReplicationStub(self.channel).Replicate(iter(self.requests.get, None),
                                                                                 timeout=60)
        self.welcome = next(self.call).welcome
        assert self.welcome.data_address and len(self.welcome.data_token) == data_link.TOKEN_BYTES

    def connect(self, token: bytes | None = None) -> socket.socket:
        sock = socket.create_connection(data_link.split_address(self.welcome.data_address), timeout=10)
        payload = self.welcome.data_token if token is None else token
        sock.sendall(struct.pack(">I", len(payload)) + payload)
        return sock

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


def _frame(sock: socket.socket) -> bytes | None:
    """The next frame's payload; None at the connection's end."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    return _exactly(sock, struct.unpack(">I", head)[0])


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    out = b""
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def _ends_without_a_byte(sock: socket.socket) -> bool:
    with sock:
        return sock.recv(1) == b""


def test_the_data_port_admits_only_a_welcomed_streams_token_and_only_once(tmp_path, monkeypatch):
    monkeypatch.setattr(data_link, "TOKEN_WAIT_S", 0.5)
    with started(node_config(tmp_path, "a")) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        leader.append("t", 3)
        stream = RawStream(leader.address)
        try:
            assert _ends_without_a_byte(stream.connect(b"\0" * data_link.TOKEN_BYTES))  # a guessed token
            silent = socket.create_connection(data_link.split_address(stream.welcome.data_address), timeout=10)
            assert _ends_without_a_byte(silent)  # no token at all: closed after TOKEN_WAIT_S
            huge = socket.create_connection(data_link.split_address(stream.welcome.data_address), timeout=10)
            huge.sendall(struct.pack(">I", 1 << 30))
            assert _ends_without_a_byte(huge)  # a "token" of a GiB is not read
            with stream.connect() as sock:  # the stream's own: the log from its start
                first = rpb.LeaderMessage.FromString(_frame(sock))
                assert first.WhichOneof("kind") == "data" and first.data.offset == 0 and first.data.next_offset > 0
                assert _ends_without_a_byte(stream.connect())  # the same token again: used
        finally:
            stream.close()


def test_a_welcomed_replica_that_never_connects_ends_its_stream_unavailable_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(data_link, "CONNECT_WAIT_S", 0.5)
    with started(node_config(tmp_path, "a")) as leader:
        stream = RawStream(leader.address)
        try:
            with pytest.raises(grpc.RpcError) as ended:
                next(stream.call)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "did not open its data connection" in ended.value.details()
            assert "--replication-data-address" in ended.value.details()
            assert _ends_without_a_byte(stream.connect())  # and its token is no longer taken
        finally:
            stream.close()


def test_either_end_of_a_stream_ends_the_other(tmp_path):
    with started(node_config(tmp_path, "a")) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        leader.append("t", 3)
        # the call cancelled: the leader closes the data connection
        stream = RawStream(leader.address)
        sock = stream.connect()
        assert _frame(sock) is not None
        stream.close()
        frames = 0
        while _frame(sock) is not None:  # heartbeats sent before the cancel reached the leader, then the end
            frames += 1
            assert frames < 1000, "the data connection outlived its call"
        sock.close()
        # the data connection closed: the call ends UNAVAILABLE
        stream = RawStream(leader.address)
        try:
            with stream.connect() as sock:
                assert _frame(sock) is not None
            with pytest.raises(grpc.RpcError) as ended:
                next(stream.call)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "closed its data connection" in ended.value.details()
        finally:
            stream.close()
        wait_until(lambda: not any(r.connected for r in leader.state().replicas), "both streams to be over")


def test_a_cut_data_path_stops_sync_acks_and_the_replica_catches_up_once_it_heals(tmp_path):
    """Only the data port is cut (a proxy that blackholes, as a cut cable): the gRPC call still answers, but no
    SYNC append is acknowledged while the replica cannot copy it; once healed the replica reconnects, catches up
    and every acknowledged append is on it, byte for byte."""
    port = free_port()
    proxy = TcpProxy(("127.0.0.1", port))
    leader_config = _with_data(node_config(tmp_path, "a", min_insync_replicas=2), replication_data_port=port,
                               replication_data_address=proxy.address)
    try:
        with started(leader_config) as leader:
            leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
            with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:
                wait_until(lambda: "b" in leader.state().in_sync, "the replica to join the in-sync set")
                acked = leader.append("t", 5, pb.REPLICATION_MODE_SYNC)
                assert {r.replicas for r in acked} == {2}
                proxy.partition()
                refused = 0
                for _ in range(3):
                    try:
                        leader.append("t", 1, pb.REPLICATION_MODE_SYNC)
                    except grpc.RpcError as exc:
                        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                        refused += 1
                assert refused == 3, "a SYNC append was acknowledged while its only replica could not copy it"
                proxy.heal()
                wait_until(lambda: "b" in leader.state().in_sync, "the replica to rejoin once the data path heals",
                           timeout_s=60)
                acked = [*acked, *leader.append("t", 5, pb.REPLICATION_MODE_SYNC)]
                end = acked[-1].physical_offset + acked[-1].size_bytes
                wait_until(lambda: replica.end() >= end, "the replica to hold every acknowledged append")
                assert segment_bytes(tmp_path / "b", end) == segment_bytes(tmp_path / "a", end)
    finally:
        proxy.close()


def _established(port: int) -> int:
    """TCP connections established to local ``port`` (/proc/net/tcp: this machine's, IPv4)."""
    lines = pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if (f := line.split()) and int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01")


def test_a_replica_follows_over_mutual_tls_with_authentication_on_its_data_connection_too(tmp_path, certs):
    """The replication stream goes through the server's TLS and its `service` identity (ServerConfig.peers): a
    replica copies and acknowledges a SYNC append on a group with mutual TLS and authentication on, its data on
    the data connection under the gRPC port's TLS (the leader's certificate checked, the replica's required); a
    client without credentials is refused the stream, and a plaintext connection to the data port, or TLS
    without a client certificate, gets not one byte of the log."""
    import ssl

    from commitlog_service.main import serving
    from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2
    from mqstore_rpc.peers import Peers

    service, secure = secured(tmp_path, certs)
    with serving(secure(node_config(tmp_path, "a", min_insync_replicas=2))) as (_, leader_port):
        leader_address = f"localhost:{leader_port}"
        with serving(secure(node_config(tmp_path, "b", replica_of=leader_address))), \
                service.channel(leader_address) as channel:
            log = commitlog_pb2_grpc.CommitLogStub(channel)
            repl = replication_pb2_grpc.ReplicationStub(channel)
            log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
            wait_until(lambda: "b" in repl.GetReplicationState(rpb.GetReplicationStateRequest(),
                                                               timeout=RPC_TIMEOUT_S).in_sync,
                       "the replica to join the in-sync set over TLS")
            results = log.Append(pb.AppendRequest(topic="t", replication=pb.REPLICATION_MODE_SYNC, messages=[
                common_pb2.MessageInput(body=b"x" * 100)] * 3), timeout=RPC_TIMEOUT_S).results
            assert {r.replicas for r in results} == {2}
            with service.channel(leader_address) as own:  # where the data port is: a welcome says
                raw = RawStream(leader_address, "probe", own)
                port = data_link.split_address(raw.welcome.data_address)[1]
                raw.close()
            assert _established(port) == 1  # the replica's data connection (in this process, as the leader)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
                plain.sendall(b"\0\0\0\x10" + b"\0" * 16)
                try:
                    assert plain.recv(1) == b""  # not TLS: closed
                except ConnectionResetError:
                    pass
            context = ssl.create_default_context(cadata=(certs / "ca.pem").read_text())
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                        context.wrap_socket(raw, server_hostname="localhost") as anonymous:
                    anonymous.sendall(b"\0\0\0\x10" + b"\0" * 16)  # TLS 1.3: the refusal comes with the first read
                    got = anonymous.recv(1)
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                got = b""
            assert got == b"", "a connection without a client certificate was served"

        anonymous = Peers(service.tls)  # TLS but no credentials: the stream is refused
        with anonymous.channel(leader_address) as channel:
            stream = replication_pb2_grpc.ReplicationStub(channel).Replicate(iter([]), timeout=RPC_TIMEOUT_S)
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(stream))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_replica_reads_frames_of_any_size_whole_and_stops_at_a_torn_or_oversized_one():
    """DataConnection.read_frame: frames of 0 bytes to 1 MiB, in pieces as TCP delivers them, read whole (each
    payload what was sent); a frame cut by the connection's end, or longer than a gRPC message may be, ends the
    reading (None) without a partial payload."""
    import threading

    sizes = [10, 0, 5, 1 << 20, 3, 70_000]
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    for tail in (b"\0\0\0\x09abc", struct.pack(">I", data_link.MAX_FRAME_BYTES + 1) + b"x" * 100):
        with socket.create_server(("127.0.0.1", 0)) as listener:
            got_token: list[bytes] = []

            def serve(listener=listener, got_token=got_token, tail=tail):
                conn, _ = listener.accept()
                with conn:
                    got_token.append(_frame(conn))
                    wire = b"".join(struct.pack(">I", len(p)) + p for p in payloads) + tail
                    for at in range(0, len(wire), 7919):  # in pieces
                        conn.sendall(wire[at:at + 7919])
            server = threading.Thread(target=serve)
            server.start()
            connection = data_link.DataConnection(f"127.0.0.1:{listener.getsockname()[1]}", b"t" * 16, None)
            try:
                for payload in payloads:
                    frame = connection.read_frame()
                    assert frame == payload
                assert connection.read_frame() is None
            finally:
                connection.close()
                server.join(10)
            assert got_token == [b"t" * 16]


def test_a_data_port_taken_by_another_process_stops_the_start_naming_the_setting(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        config = _with_data(node_config(tmp_path, "a"), replication_data_port=taken.getsockname()[1])
        with pytest.raises(OSError, match="--replication-data-port"):
            with started(config):
                pass
