"""Static replication of the CommitLog service (replication.proto) through real gRPC on 127.0.0.1: a leader
and replicas in this process, sharing one SQLite metadata file, small sparse segments."""

from __future__ import annotations

import concurrent.futures
import contextlib
import pathlib
import threading
import time
import types

import grpc
import pytest

from commitlog_service.main import CommitLogConfig, serving
from commitlog_service.replication import GrpcLeaderLink
from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument, NotLeader
from mqstore.replication.config import ReplicationConfig
from mqstore.replication.epochs import EpochHistory
from mqstore.replication.messages import Ack, Hello
from mqstore.replication.replica import ReplicaFollower
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, replication_pb2, replication_pb2_grpc
from mqstore_rpc.server import ServerConfig
from tests.support.processes import commitlog
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SEGMENT_BYTES = 64 * 1024
RPC_TIMEOUT_S = 10
BODY = bytes(range(256)) * 4  # 1 KiB


def node_config(root: pathlib.Path, node_id: str, replica_of: str = "", **replication) -> CommitLogConfig:
    store = StoreConfig(data_dir=root / node_id, segment_size_bytes=SEGMENT_BYTES, preallocate_segments=False,
                        metadata_url=f"sqlite:///{root / 'metadata.db'}")
    settings = dict(isr_max_lag_ms=1000, sync_replication_timeout_ms=3000, replication_heartbeat_ms=50)
    settings.update(replication)
    return CommitLogConfig(store=store, server=ServerConfig(port=0, grace_s=0.5),
                           replication=ReplicationConfig(node_id=node_id, replica_of=replica_of, **settings))


class Node:
    def __init__(self, server, port: int):
        self.server, self.port = server, port
        self.address = f"127.0.0.1:{port}"
        self.channel = grpc.insecure_channel(self.address)
        self.log = commitlog_pb2_grpc.CommitLogStub(self.channel)
        self.repl = replication_pb2_grpc.ReplicationStub(self.channel)

    def state(self) -> replication_pb2.ReplicationState:
        return self.repl.GetReplicationState(replication_pb2.GetReplicationStateRequest(), timeout=RPC_TIMEOUT_S)

    def end(self) -> int:
        return self.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).max_physical_offset

    def append(self, topic: str, count: int, mode=pb.REPLICATION_MODE_UNSPECIFIED, key: str = "k"):
        messages = [common_pb2.MessageInput(body=BODY, keys=[f"{key}{i}"]) for i in range(count)]
        return self.log.Append(pb.AppendRequest(topic=topic, messages=messages, replication=mode),
                               timeout=RPC_TIMEOUT_S).results


@contextlib.contextmanager
def started(config: CommitLogConfig):
    with serving(config) as (server, port):
        node = Node(server, port)
        try:
            yield node
        finally:
            node.channel.close()


def segment_bytes(data_dir: pathlib.Path, end: int) -> dict[str, bytes]:
    """The segment files that hold data below ``end`` (a leader may have created the next one ahead)."""
    return {p.name: p.read_bytes() for p in sorted((data_dir / "commitlog").iterdir())
            if p.name.isdigit() and int(p.name) < end}


def test_replica_copies_byte_identical_serves_reads_and_refuses_writes(tmp_path):
    with started(node_config(tmp_path, "a")) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=RPC_TIMEOUT_S)
        first = leader.append("t", 100)
        with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:
            stop = threading.Event()

            def produce():  # the leader keeps taking appends while the new replica catches up from zero
                while not stop.is_set():
                    leader.append("t", 20)
            producer = threading.Thread(target=produce)
            producer.start()
            try:
                # what the leader held at some moment under load (the replica trails a live leader by the
                # frames in flight, so "equal at one instant" is a race with the producer, not a property)
                mark = wait_until(lambda: (end := leader.end()) > 300 * 1024 and end, "the leader to take 300 KiB")
                wait_until(lambda: replica.end() >= mark, "the replica to catch up under load")
            finally:
                stop.set()
                producer.join()
            wait_until(lambda: replica.end() == leader.end(), "the replica to reach the leader's end")
            assert leader.end() > 4 * SEGMENT_BYTES  # several segments, blank end records included
            end = leader.end()
            assert segment_bytes(tmp_path / "b", end) == segment_bytes(tmp_path / "a", end)

            # every read RPC answers on the replica as on the leader
            for q in (0, 1):
                info = pb.GetQueueInfoRequest(topic="t", queue_id=q)
                wait_until(lambda info=info: replica.log.GetQueueInfo(info, timeout=RPC_TIMEOUT_S) ==
                           leader.log.GetQueueInfo(info, timeout=RPC_TIMEOUT_S), "the replica's queues")
                pull = pb.PullRequest(topic="t", queue_id=q, offset=0, max_messages=50)
                assert replica.log.Pull(pull, timeout=RPC_TIMEOUT_S) == leader.log.Pull(pull, timeout=RPC_TIMEOUT_S)
                by_time = pb.GetOffsetByTimeRequest(topic="t", queue_id=q, timestamp_ms=first[0].store_timestamp_ms)
                assert (replica.log.GetOffsetByTime(by_time, timeout=RPC_TIMEOUT_S) ==
                        leader.log.GetOffsetByTime(by_time, timeout=RPC_TIMEOUT_S))
            got = replica.log.GetMessage(pb.GetMessageRequest(msg_id=first[7].msg_id), timeout=RPC_TIMEOUT_S)
            assert got.body == BODY and got.physical_offset == first[7].physical_offset
            many = pb.GetMessagesRequest(physical_offsets=[r.physical_offset for r in first[:10]])
            assert replica.log.GetMessages(many, timeout=RPC_TIMEOUT_S) == leader.log.GetMessages(many,
                                                                                                   timeout=RPC_TIMEOUT_S)
            tail = replica.log.Tail(pb.TailRequest(start=pb.TAIL_START_EARLIEST), timeout=RPC_TIMEOUT_S)
            assert next(iter(tail)).records[:first[0].size_bytes] == \
                leader.log.Tail(pb.TailRequest(start=pb.TAIL_START_EARLIEST), timeout=RPC_TIMEOUT_S).next().records[
                    :first[0].size_bytes]
            tail.cancel()

            # writes answer FAILED_PRECONDITION with the leader's address in the trailer
            refused = [
                lambda: replica.append("t", 1),
                lambda: replica.log.CreateTopic(pb.CreateTopicRequest(name="u"), timeout=RPC_TIMEOUT_S),
                lambda: replica.log.CommitOffset(pb.CommitOffsetRequest(group="g", topic="t", queue_id=0, offset=1),
                                                 timeout=RPC_TIMEOUT_S),
                lambda: replica.log.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=RPC_TIMEOUT_S),
            ]
            for call in refused:
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert ("mqstore-leader", leader.address) in err.value.trailing_metadata()
                assert leader.address in err.value.details()

            state = replica.state()
            assert (state.role, state.leader_address, state.end_offset) == ("REPLICA", leader.address, leader.end())
            # published (and counted) one in-sync check after it caught up
            wait_until(lambda: sorted(leader.state().in_sync) == ["a", "b"], "b in the published in-sync set")
            lead = leader.state()
            assert lead.role == "LEADER" and lead.epoch == 1
            assert [(r.replica_id, r.in_sync, r.connected) for r in lead.replicas] == [("b", True, True)]


def test_sync_replication_acks_state_copies_and_times_out_without_replicas(tmp_path):
    with started(node_config(tmp_path, "a", min_insync_replicas=2)) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        # one copy in sync: a SYNC append is refused before anything is written
        end = leader.end()
        with pytest.raises(grpc.RpcError) as err:
            leader.append("t", 1, pb.REPLICATION_MODE_SYNC)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("mqstore-error", "NotEnoughReplicas") in err.value.trailing_metadata()
        assert leader.end() == end
        asynchronous = leader.append("t", 1, pb.REPLICATION_MODE_ASYNC)
        assert (asynchronous[0].replicas, asynchronous[0].epoch) == (1, 1)

        with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:
            wait_until(lambda: "b" in leader.state().in_sync, "the replica to join the in-sync set")
            results = leader.append("t", 5, pb.REPLICATION_MODE_SYNC)
            assert {(r.replicas, r.epoch) for r in results} == {(2, 1)}
            assert replica.end() >= results[-1].physical_offset + results[-1].size_bytes  # it held them at the ack

        # the replica is gone: the in-sync set shrinks and SYNC appends are refused again
        wait_until(lambda: list(leader.state().in_sync) == ["a"], "the in-sync set to shrink")
        with pytest.raises(grpc.RpcError) as err:
            leader.append("t", 1, pb.REPLICATION_MODE_SYNC)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        leader.append("t", 50, pb.REPLICATION_MODE_ASYNC)  # it falls further behind meanwhile

        # it comes back, catches up from its end offset and joins the set again
        with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:
            wait_until(lambda: "b" in leader.state().in_sync, "the returning replica to rejoin the in-sync set")
            assert leader.append("t", 1, pb.REPLICATION_MODE_SYNC)[0].replicas == 2
            assert replica.end() == leader.end()


def test_no_sync_ack_reports_fewer_copies_than_min_insync_when_both_replicas_stop_under_load(tmp_path):
    """Issue 34's check end to end: SYNC appends from several threads while both replicas of a three-node
    group stop at once. Each append is either acknowledged with at least min_insync_replicas copies or
    refused (UNAVAILABLE); an ack once said replicas=1 ms after both streams dropped (the deterministic
    case: test_isr's ..._after_they_disconnect)."""
    with started(node_config(tmp_path, "a", min_insync_replicas=2)) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=4), timeout=RPC_TIMEOUT_S)
        acked, refused, stop = [], [], threading.Event()

        def produce(key: str) -> None:
            for i in range(10_000):  # bounded; ends once appends are refused after the replicas stop
                if stop.is_set():
                    return
                try:
                    acked.extend(r.replicas for r in leader.append("t", 1, pb.REPLICATION_MODE_SYNC, f"{key}{i}-"))
                except grpc.RpcError as err:
                    refused.append(err.code())
                    if len(refused) >= 20:
                        return

        with contextlib.ExitStack() as replicas:
            for rid in ("b", "c"):
                replicas.enter_context(started(node_config(tmp_path, rid, replica_of=leader.address)))
            wait_until(lambda: sorted(leader.state().in_sync) == ["a", "b", "c"], "both replicas in the set")
            producers = [threading.Thread(target=produce, args=(f"p{n}",)) for n in range(4)]
            for producer in producers:
                producer.start()
            wait_until(lambda: len(acked) >= 200, "SYNC appends acknowledged by the group")
        try:  # both replicas stopped: appends in flight are acknowledged or refused
            wait_until(lambda: len(refused) >= 20 or not any(p.is_alive() for p in producers),
                       "SYNC appends refused once the replicas are gone")
        finally:
            stop.set()
            for producer in producers:
                producer.join(RPC_TIMEOUT_S * 2)
        assert refused and set(refused) == {grpc.StatusCode.UNAVAILABLE}
        assert min(acked) >= 2, sorted(set(acked))


def test_returning_old_leader_truncates_only_its_unacknowledged_tail(tmp_path):
    """a leads epoch 1 with b in sync; SYNC appends reach both. b goes away and a takes ASYNC appends
    alone (never SYNC-acknowledged). Then b leads epoch 2 and writes; a comes back as b's replica: it cuts
    exactly its divergent tail (kept as .broken copies), keeps every SYNC-acknowledged record, and ends
    byte-identical to b."""
    with started(node_config(tmp_path, "a", min_insync_replicas=2)) as a:
        a.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        with started(node_config(tmp_path, "b", replica_of=a.address)) as b:
            wait_until(lambda: "b" in a.state().in_sync, "b to join the in-sync set")
            acked = [r for _ in range(10) for r in a.append("t", 10, pb.REPLICATION_MODE_SYNC)]
        shared_end = acked[-1].physical_offset + acked[-1].size_bytes
        assert {r.replicas for r in acked} == {2}
        a.append("t", 30, pb.REPLICATION_MODE_ASYNC, key="lost")  # a alone: never SYNC-acknowledged
        a_end = a.end()
    assert a_end > shared_end
    with started(node_config(tmp_path, "b")) as b:  # b leads epoch 2 from where it stopped
        assert b.state().epoch == 2 and b.end() == shared_end
        written = b.append("t", 5, pb.REPLICATION_MODE_ASYNC, key="new")
        with started(node_config(tmp_path, "a", replica_of=b.address)) as a:
            wait_until(lambda: a.end() == b.end() and a.state().leader_id == "b", "a to follow b")
            end = b.end()
            assert segment_bytes(tmp_path / "a", end) == segment_bytes(tmp_path / "b", end)
            assert [(e.epoch, e.start_offset) for e in a.state().epochs] == [(1, 0), (2, shared_end)]
            for r in acked + list(written):  # every acknowledged record, at its offset, from both
                got = a.log.GetMessage(pb.GetMessageRequest(physical_offset=r.physical_offset), timeout=RPC_TIMEOUT_S)
                assert got.body == BODY and got.msg_id[-16:] == r.msg_id[-16:]
            pull = pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=1000)
            wait_until(lambda: a.log.Pull(pull, timeout=RPC_TIMEOUT_S) == b.log.Pull(pull, timeout=RPC_TIMEOUT_S),
                       "a's consume queue to equal b's")
            assert not [m for m in a.log.Pull(pull, timeout=RPC_TIMEOUT_S).messages if m.keys[0].startswith("lost")]
    broken = sorted(p.name for p in (tmp_path / "a" / "commitlog").iterdir() if ".broken" in p.name)
    assert broken, "the cut tail is kept as .broken copies"


def secured(tmp_path: pathlib.Path, certs: pathlib.Path):
    """Mutual TLS and authentication on: the services' identity (``Peers``: what the nodes call each other
    with, and a client of the test's with it) and a function that puts both on a node's config."""
    import dataclasses

    from mqstore_rpc.peers import Peers
    from mqstore_rpc.secret import Secret
    from mqstore_rpc.server import AuthConfig
    from mqstore_rpc.tls import ClientTls, ServerTls

    token = Secret("replication-test-token")
    tls = ClientTls.from_files(str(certs / "ca.pem"), str(certs / "client.pem"), str(certs / "client.key"))
    service = Peers(tls, "service", token)

    def secure(config: CommitLogConfig) -> CommitLogConfig:
        server = ServerConfig(port=0, grace_s=0.5, peers=service,
                              tls=ServerTls.from_files(str(certs / "server.pem"), str(certs / "server.key"),
                                                       str(certs / "ca.pem")),
                              auth=AuthConfig(enabled=True, url=Secret(f"sqlite:///{tmp_path / 'auth.db'}"),
                                              internal_token=token))
        return dataclasses.replace(config, server=server)
    return service, secure


def test_a_replica_serves_get_message_of_a_topic_created_on_its_leader_after_it_started(tmp_path):
    """GetMessage on a replica checks the record's topic against its registry (the topic's incarnation): a
    topic the leader created after the replica loaded its registry is looked up in the shared database,
    not answered NOT_FOUND (after a failover the Index verifies every key it finds this way)."""
    with started(node_config(tmp_path, "a")) as leader:
        with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:
            wait_until(lambda: "b" in leader.state().in_sync, "the replica to join the in-sync set")
            leader.log.CreateTopic(pb.CreateTopicRequest(name="late", queue_count=1), timeout=RPC_TIMEOUT_S)
            results = leader.append("late", 3, pb.REPLICATION_MODE_SYNC)
            end = results[-1].physical_offset + results[-1].size_bytes
            wait_until(lambda: replica.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S)
                       .visible_physical_offset >= end, "the replica to make the records visible")
            many = pb.GetMessagesRequest(physical_offsets=[r.physical_offset for r in results])
            got = replica.log.GetMessages(many, timeout=RPC_TIMEOUT_S)
            assert [m.found for m in got.messages] == [True] * 3, [m.missing_reason for m in got.messages]
            assert got == leader.log.GetMessages(many, timeout=RPC_TIMEOUT_S)
            one = replica.log.GetMessage(pb.GetMessageRequest(physical_offset=results[1].physical_offset),
                                         timeout=RPC_TIMEOUT_S)
            assert (one.topic, one.physical_offset, one.body) == ("late", results[1].physical_offset, BODY)


def _answers(node: Node, topic: str, queues: int) -> list:
    """What a reader of every queue of ``topic`` gets: GetQueueInfo and a Pull of the whole queue."""
    out = []
    for q in range(queues):
        info = node.log.GetQueueInfo(pb.GetQueueInfoRequest(topic=topic, queue_id=q), timeout=RPC_TIMEOUT_S)
        out.append((info, node.log.Pull(pb.PullRequest(topic=topic, queue_id=q, offset=info.min_offset,
                                                       max_messages=1000), timeout=RPC_TIMEOUT_S)))
    return out


def _visible(node: Node) -> int:
    return node.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).visible_physical_offset


def _recreate(leader: Node, queues: int, count: int, key: str) -> list:
    leader.log.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=RPC_TIMEOUT_S)
    leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=queues), timeout=RPC_TIMEOUT_S)
    return list(leader.append("t", count, key=key))


def test_a_replica_serves_a_topic_deleted_and_created_again_as_its_leader_does(tmp_path):
    """The leader deletes t and creates it again (queue offsets from 0 again, above the old records), while
    its replica follows it and while the replica is away; the replica answers GetQueueInfo, Pull and GetMessages
    as the leader does, live, when it catches up, and after its restart: no record of an earlier t, the
    latest t's at offsets 0... After a failover onto it, its appends to t take the offsets after the latest t's."""
    with started(node_config(tmp_path, "a")) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=2), timeout=RPC_TIMEOUT_S)
        old = list(leader.append("t", 60, key="first"))  # more records than the later t's take, per queue
        with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:
            wait_until(lambda: _answers(replica, "t", 2) == _answers(leader, "t", 2), "the replica's queues of t")
            old += _recreate(leader, 3, 9, "second")  # live
            end = leader.end()
            wait_until(lambda: _visible(replica) >= end, "the replica to show the second t")
            assert _answers(replica, "t", 3) == _answers(leader, "t", 3)
        current = _recreate(leader, 2, 10, "third")  # the replica is away
        end = leader.end()
        wait_until(lambda: _visible(leader) >= end, "the leader to show the third t (the in-sync set shrunk)")
        lookup = pb.GetMessagesRequest(physical_offsets=[r.physical_offset for r in old + current])
        expected = leader.log.GetMessages(lookup, timeout=RPC_TIMEOUT_S)
        assert [m.found for m in expected.messages] == [False] * len(old) + [True] * len(current)
        assert sorted((r.queue_id, r.queue_offset) for r in current) == \
            sorted((q, o) for q in range(2) for o in range(sum(r.queue_id == q for r in current)))
        with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:  # it catches up
            wait_until(lambda: _visible(replica) >= end, "the returning replica to show the third t")
            assert _answers(replica, "t", 2) == _answers(leader, "t", 2)
            assert replica.log.GetMessages(lookup, timeout=RPC_TIMEOUT_S) == expected
        with started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:  # a restart, caught up
            wait_until(lambda: _visible(replica) >= end, "the restarted replica to show the third t")
            assert _answers(replica, "t", 2) == _answers(leader, "t", 2)
            assert replica.log.GetMessages(lookup, timeout=RPC_TIMEOUT_S) == expected
        ends = {q: i.max_offset for q, (i, _) in enumerate(_answers(leader, "t", 2))}
    with started(node_config(tmp_path, "b")) as b:  # the failover: b leads epoch 2 from its copy
        appended = b.append("t", 6, key="fourth")
        for r in appended:
            assert r.queue_offset == ends[r.queue_id]
            ends[r.queue_id] += 1
        assert [i.max_offset for i, _ in _answers(b, "t", 2)] == [ends[0], ends[1]]


def _threads(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def _hello(replica_id: str) -> Hello:
    return Hello(replica_id, "127.0.0.1:1", 0, 0, EpochHistory(), SEGMENT_BYTES)


def test_a_replica_streams_watchdog_is_a_duty_and_ends_with_the_stream(tmp_path):
    """The replica's watchdog (a Duty: steps while the leader's heartbeats come, stops and reports when the
    stream is cancelled) leaves no thread once the stream is over (counted by name). The leader reads the
    stream's acknowledgements in a task of the call on its loop: no thread of its own."""
    with started(node_config(tmp_path, "a")) as leader:
        link = GrpcLeaderLink(heartbeat_ms=50)
        try:
            stream = link.open(leader.address, _hello("w"))
            assert stream.welcome.leader_id == "a"
            wait_until(lambda: stream.watchdog.state().steps >= 2, "the watchdog to look twice")
            assert stream.watchdog.state().alive and not _threads("replication-acks")
            assert link.problem() == ""
            stream.cancel()
            state = stream.watchdog.state()
            assert not state.alive and state.died == "" and state.retries == 0
            assert not _threads("replication-watchdog")
        finally:
            link.close()


def test_the_watchdog_cancels_a_stream_whose_leader_falls_silent_and_stops(tmp_path):
    """A leader that answers the hello and then sends nothing (no heartbeat: a fault a real leader does not
    show on demand, so a stand-in on a real gRPC server): the watchdog cancels the stream after the silence,
    the iteration ends, and the watchdog's thread is gone."""
    def replicate(request_iterator, context):
        next(request_iterator)
        yield replication_pb2.LeaderMessage(welcome=replication_pb2.LeaderWelcome(leader_id="mute", epoch=1))
        ended = threading.Event()
        context.add_callback(ended.set)
        ended.wait(30)  # silent on the wire until the call ends

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("mqstore.v1.Replication", {
        "Replicate": grpc.stream_stream_rpc_method_handler(
            replicate, request_deserializer=replication_pb2.ReplicaMessage.FromString,
            response_serializer=replication_pb2.LeaderMessage.SerializeToString)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    link = GrpcLeaderLink(heartbeat_ms=50)  # silence: 2 s, the floor
    try:
        stream = link.open(f"127.0.0.1:{port}", _hello("s"))
        started_s = time.monotonic()
        assert list(stream) == []  # ends when the watchdog cancels the call
        assert time.monotonic() - started_s >= 1.5
        wait_until(lambda: not stream.watchdog.state().alive, "the watchdog to stop after cancelling")
        assert stream.watchdog.state().steps >= 1 and link.problem() == ""
        assert not _threads("replication-watchdog")
    finally:
        link.close()
        server.stop(0)


def test_a_replicas_stream_runs_on_the_thread_that_reads_it_and_its_acks_reach_the_leader(tmp_path):
    """The replica's Replicate call (SingleThreadedCall, issue 34): the data messages read and the acks sent by
    the thread that iterates the stream, no other thread but the stream's watchdog (grpc's synchronous call
    had a channel thread and a request-consumer thread besides, each message handed between them); what it
    acknowledges is what the leader reports of the replica."""
    with started(node_config(tmp_path, "a")) as leader:
        leader.log.CreateTopic(pb.CreateTopicRequest(name="t", queue_count=1), timeout=RPC_TIMEOUT_S)
        leader.append("t", 3)
        link = GrpcLeaderLink(heartbeat_ms=50)
        try:
            before = set(threading.enumerate())
            stream = link.open(leader.address, _hello("w"))
            acked = 0
            for d in stream:
                acked = d.next_offset
                stream.ack(Ack(acked, 0))
                if acked == leader.end():
                    break
            assert acked == leader.end() > 0
            for _ in range(3):  # acks back to back: each sent once the one before has left (one send at a time)
                stream.ack(Ack(acked, 0))
            # the leader's, in this process: its handler pool, its loop's default executor (uvloop's name; asyncio's
            # with MQSTORE_EVENT_LOOP=asyncio)
            leaders = ("grpc-handler", "uvloop_", "asyncio_")
            started_here = [t.name for t in set(threading.enumerate()) - before if not t.name.startswith(leaders)]
            assert started_here == ["replication-watchdog"]
            wait_until(lambda: [(r.replica_id, r.written_offset) for r in leader.state().replicas] == [("w", acked)],
                       "the leader to read the replica's ack")
            stream.cancel()
            assert not _threads("replication-watchdog")
        finally:
            link.close()


def test_a_replicas_stream_to_a_node_that_does_not_lead_says_which_does(tmp_path):
    """The Replicate call's status and trailer as the replica's stream reads them: a replica asked for the
    log answers FAILED_PRECONDITION naming its leader, and the link raises NotLeader with that address."""
    with started(node_config(tmp_path, "a")) as leader, \
            started(node_config(tmp_path, "b", replica_of=leader.address)) as replica:
        wait_until(lambda: replica.state().leader_address == leader.address, "b to follow a")
        link = GrpcLeaderLink(heartbeat_ms=50)
        try:
            with pytest.raises(NotLeader) as refused:
                link.open(replica.address, _hello("w"))
            assert refused.value.leader_address == leader.address
        finally:
            link.close()


def test_a_welcome_the_replica_cannot_read_ends_its_stream(tmp_path):
    """A welcome whose epochs are out of order (a stand-in leader on a real gRPC server: a real one does not
    send it): the link's open raises InvalidArgument, and the stream it opened is over, its call cancelled
    and its watchdog gone, rather than left to the garbage collector."""
    ended = threading.Event()

    def replicate(request_iterator, context):
        next(request_iterator)
        context.add_callback(ended.set)
        yield replication_pb2.LeaderMessage(welcome=replication_pb2.LeaderWelcome(
            leader_id="odd", epoch=2, epochs=[replication_pb2.EpochEntry(epoch=2, start_offset=0),
                                              replication_pb2.EpochEntry(epoch=1, start_offset=10)]))
        ended.wait(30)

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("mqstore.v1.Replication", {
        "Replicate": grpc.stream_stream_rpc_method_handler(
            replicate, request_deserializer=replication_pb2.ReplicaMessage.FromString,
            response_serializer=replication_pb2.LeaderMessage.SerializeToString)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    link = GrpcLeaderLink(heartbeat_ms=50)
    try:
        with pytest.raises(InvalidArgument, match="out of order"):
            link.open(f"127.0.0.1:{port}", _hello("o"))
        assert not _threads("replication-watchdog")
        assert ended.wait(10), "the call to end on the leader's side"
    finally:
        link.close()
        server.stop(0)


def test_a_bug_in_the_watchdog_is_the_links_and_so_the_followers_problem(tmp_path):
    """The watchdog is a Duty: a bug in its step kills it and is reported (GrpcLeaderLink.problem), which the
    replica's follower adds to its own health (ReplicaFollower.problem: NOT_SERVING)."""
    with started(node_config(tmp_path, "a")) as leader:
        link = GrpcLeaderLink(heartbeat_ms=50)
        follower = ReplicaFollower(None, types.SimpleNamespace(config=types.SimpleNamespace(
            replica_backoff_max_ms=1000)), link)  # never started: only its health is read
        try:
            stream = link.open(leader.address, _hello("b"))
            assert follower.problem() == ""
            stream.silent_s = lambda: 1 / 0  # the bug: the next step raises ZeroDivisionError
            wait_until(lambda: "ZeroDivisionError" in link.problem(), "the watchdog's death to be reported")
            assert "replication-watchdog" in follower.problem()
            assert not stream.watchdog.state().alive
            stream.cancel()
        finally:
            link.close()


# ---- topic metadata every node shares (issue 34) ------------------------------------------------------

@pytest.mark.parametrize("args, env, said", [
    (("--etcd-endpoints", "127.0.0.1:1"), {}, "inside this node's data dir"),   # the default: <data-dir>/metadata.db
    (("--replica-of", "127.0.0.1:1"), {"MQSTORE_METADATA_URL": "sqlite:///{data}/meta/metadata.db"},
     "inside this node's data dir"),
    (("--replica-of", "127.0.0.1:1", "--metadata-url", "sqlite://"), {}, "in memory"),
    # HA: one SQL database the nodes share is a single point of failure, refused without --shared-sql-metadata
    (("--etcd-endpoints", "127.0.0.1:1"), {"MQSTORE_METADATA_URL": "sqlite:///{data}/../metadata.db"},
     "single point of failure"),
])
def test_a_group_node_without_shared_topic_metadata_refuses_to_start(tmp_path, args, env, said):
    """Three nodes with --node-id/--etcd-endpoints and no --metadata-url started, acknowledged an append on 2
    copies, and then a replica answered NOT_FOUND for the topic (its own SQLite file had none) and the
    message could not be reached after the leader's kill -9. Such a node exits 2 at once, naming the flag;
    a node started for HA names the etcd catalog (etcd://...) it should be given."""
    data = tmp_path / "n1"
    env = {key: value.format(data=data) for key, value in env.items()}
    with commitlog(data, "--node-id", "n1", *args, env=env) as node:
        assert node.wait_exit() == 2
        message = node.wait_for("config.invalid")["message"]
    assert "--metadata-url (MQSTORE_METADATA_URL)" in message and said in message, message
    shared = "etcd://127.0.0.1:1/mqstore/meta" if args[0] == "--etcd-endpoints" else "PostgreSQL URL"
    assert shared in message, message
    assert not (data / "commitlog").exists()  # refused before anything was opened


@pytest.mark.parametrize("argv, refused", [
    (["--metadata-url", "etcd://127.0.0.1:1/mqstore/meta"], ""),
    (["--metadata-url", "sqlite:////shared/metadata.db", "--shared-sql-metadata"], ""),  # the operator's choice
    (["--metadata-url", "postgresql+psycopg2://u@db/mqstore"], "--shared-sql-metadata"),
    (["--metadata-url", "etcd://127.0.0.1:1/m", "--auth", "on", "--auth-url", "sqlite:////shared/auth.db"],
     r"users and rules in SQL \(--auth-url \(MQSTORE_AUTH_URL\)\)"),
    (["--metadata-url", "etcd://127.0.0.1:1/m", "--auth", "on"],
     "users and rules in SQLite .*inside this node's data dir.*--auth-url"),
    (["--metadata-url", "etcd://127.0.0.1:1/m", "--auth", "on", "--auth-url", "etcd://127.0.0.1:1/m"], ""),
])
def test_an_ha_node_takes_its_catalogs_from_etcd_or_says_it_shares_sql(tmp_path, argv, refused):
    from commitlog_service.main import parse_config
    from mqstore.errors import InvalidArgument
    base = ["--data-dir", str(tmp_path / "n1"), "--node-id", "n1", "--etcd-endpoints", "127.0.0.1:1"]
    if not refused:
        assert parse_config(base + argv, {}).replication.etcd_endpoints
        return
    with pytest.raises(InvalidArgument, match=refused):
        parse_config(base + argv, {})


def test_a_group_node_with_shared_topic_metadata_starts(tmp_path):
    """The same node given a database outside its data dir (one SQLite file the nodes of one machine share,
    as make run-ha and these tests do; PostgreSQL across machines) starts, as a replica of its leader."""
    with commitlog(tmp_path / "n2", "--node-id", "n2", "--replica-of", "127.0.0.1:1",
                   env={"MQSTORE_METADATA_URL": f"sqlite:///{tmp_path / 'metadata.db'}"}) as node:
        node.started()
        assert node.stop() == 0
