"""The smoke test of `make compose-check`, through the published ports of the compose stack.

    python scripts/compose_smoke.py write  --commitlog 127.0.0.1:51051 --index 127.0.0.1:51052 \
        --gateway 127.0.0.1:51081 --state S
    (restart the services)
    python scripts/compose_smoke.py verify --commitlog 127.0.0.1:51051 --index 127.0.0.1:51052 \
        --gateway 127.0.0.1:51081 --state S
    python scripts/compose_smoke.py spark  --commitlog 127.0.0.1:52051 --compactor 127.0.0.1:52054

``write`` checks that the commit log runs the compiled codec (GetStoreInfo), creates a topic, appends
MESSAGES messages (each with its own key and a shared one), pulls them back, waits until the index has
them and queries by key and by UNIQ_KEY; it records what it appended in the state file. ``verify``
(after the restart) checks that every recorded message is still there: pulled, fetched by msg id,
found by key and by UNIQ_KEY through the index; then appends one more (recorded too, for a later
verify) and checks again. ``spark`` (`make compose-check-spark`) creates a COMPACTION topic, appends
KV_KEYS keys KV_VERSIONS times each (the last version of one key a tombstone), waits until the
compactor holds every record, runs Compact(engine=SPARK) on every queue, checks that each round ran on
Spark and removed the overwritten records, and that GetLatest answers the latest value of every key
(NOT_FOUND or a tombstone for the deleted one). Every wait is bounded (WAIT_S); a failed check exits 1
with the reason.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import threading
import time

import grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, compactor_pb2 as cpb, compactor_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import index_pb2, index_pb2_grpc
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as v2d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as v2s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc as v2grpc

TOPIC = "smoke"
QUEUES = 2
MESSAGES = 50
SHARED_KEY = "smoke-all"
GATEWAY_TOPIC = "smoke-gw"
GATEWAY_MESSAGES = 5
GATEWAY_CLIENT_ID = "compose-smoke"
RPC_TIMEOUT_S = 10
KV_TOPIC = "smoke-kv"
KV_KEYS = 40
KV_VERSIONS = 10
DELETED_KEY = "kv-7"
SPARK_ROUND_TIMEOUT_S = 600
WAIT_S = 120
POLL_S = 0.2


class SmokeFailure(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SmokeFailure(what)


class Stack:
    """Stubs for the published ports. Not thread-safe."""

    def __init__(self, commitlog: str, index: str):
        self.channels = [grpc.insecure_channel(commitlog), grpc.insecure_channel(index)]
        self.log = commitlog_pb2_grpc.CommitLogStub(self.channels[0])
        self.index = index_pb2_grpc.IndexStub(self.channels[1])

    def close(self) -> None:
        for channel in self.channels:
            channel.close()

    def wait_ready(self) -> None:
        """Both answer (a restarted stack may still be starting), and the index follows the log."""
        wait_until(lambda: self.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S) is not None,
                   "the commit log to answer")
        wait_until(lambda: self.index.Stats(index_pb2.IndexStatsRequest(), timeout=RPC_TIMEOUT_S).connected,
                   "the index to connect to the commit log")

    def wait_indexed(self) -> None:
        end = self.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).visible_physical_offset
        wait_until(lambda: self.index.Stats(index_pb2.IndexStatsRequest(),
                                            timeout=RPC_TIMEOUT_S).indexed_physical_offset >= end,
                   f"the index to reach physical offset {end}")

    def pull_all(self, topic: str = TOPIC) -> dict[str, bytes]:
        """uniq_key -> body for every message of the topic."""
        found: dict[str, bytes] = {}
        for queue_id in range(QUEUES):
            offset = 0
            for _ in range(MESSAGES * 2):  # bounded: each pull advances or ends the loop
                r = self.log.Pull(pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=64),
                                  timeout=RPC_TIMEOUT_S)
                found.update((m.uniq_key, m.body) for m in r.messages)
                if r.next_offset >= r.max_offset or r.next_offset == offset:
                    break
                offset = r.next_offset
        return found

    def by_key(self, key: str) -> list[str]:
        r = self.index.QueryByKey(index_pb2.QueryByKeyRequest(topic=TOPIC, key=key, max_num=1000),
                                  timeout=RPC_TIMEOUT_S)
        return [loc.uniq_key for loc in r.locators]


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    pause = threading.Event()
    last = ""
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except grpc.RpcError as exc:
            last = f" (last: {exc.code().name}: {exc.details()})"  # still starting: keep polling
        pause.wait(POLL_S)
    raise SmokeFailure(f"timed out after {WAIT_S} s waiting for {what}{last}")


def verify_messages(stack: Stack, appended: list[dict]) -> None:
    stack.wait_indexed()
    pulled = stack.pull_all()
    for m in appended:
        check(pulled.get(m["uniq_key"]) == m["body"].encode(), f"message {m['uniq_key']} not pulled back intact")
        got = stack.log.GetMessage(pb.GetMessageRequest(msg_id=m["msg_id"]), timeout=RPC_TIMEOUT_S)
        check(got.uniq_key == m["uniq_key"], f"GetMessage {m['msg_id']} returned {got.uniq_key}")
    check(sorted(stack.by_key(SHARED_KEY)) == sorted(m["uniq_key"] for m in appended),
          f"QueryByKey {SHARED_KEY} does not return exactly the {len(appended)} messages appended")
    for m in (appended[0], appended[-1]):
        check(stack.by_key(m["key"]) == [m["uniq_key"]], f"QueryByKey {m['key']} did not find its message")
        r = stack.index.QueryByUniqKey(index_pb2.QueryByUniqKeyRequest(topic=TOPIC, uniq_key=m["uniq_key"]),
                                       timeout=RPC_TIMEOUT_S)
        check([loc.msg_id for loc in r.locators] == [m["msg_id"]], f"QueryByUniqKey {m['uniq_key']}")


def append(stack: Stack, first: int, count: int) -> list[dict]:
    messages = [common_pb2.MessageInput(body=b"smoke-%d" % i, keys=[f"smoke-{i}", SHARED_KEY])
                for i in range(first, first + count)]
    results = stack.log.Append(pb.AppendRequest(topic=TOPIC, messages=messages), timeout=RPC_TIMEOUT_S).results
    check(len(results) == count, f"Append returned {len(results)} results for {count} messages")
    return [{"msg_id": r.msg_id, "uniq_key": r.uniq_key, "key": f"smoke-{i}", "body": f"smoke-{i}"}
            for i, r in zip(range(first, first + count), results, strict=True)]


class Gateway:
    """The gateway's published port, spoken to as a RocketMQ 5 client does (x-mq-client-id on every call)."""

    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = v2grpc.MessagingServiceStub(self.channel)
        self.metadata = (("x-mq-client-id", GATEWAY_CLIENT_ID),)

    def close(self) -> None:
        self.channel.close()

    def wait_route(self) -> None:
        """QueryRoute answers OK with the topic's queues (the gateway may still be starting)."""
        def routed() -> bool:
            host, _, port = self.address.rpartition(":")
            reply = self.stub.QueryRoute(v2s.QueryRouteRequest(
                topic=v2d.Resource(name=GATEWAY_TOPIC), endpoints=v2d.Endpoints(
                    scheme=v2d.IPv4, addresses=[v2d.Address(host=host, port=int(port))])),
                timeout=RPC_TIMEOUT_S, metadata=self.metadata)
            return reply.status.code == v2d.OK and len(reply.message_queues) == QUEUES
        wait_until(routed, f"the gateway to route topic {GATEWAY_TOPIC}")

    def send(self, first: int, count: int) -> list[str]:
        """``count`` NORMAL messages, one SendMessage each (as the clients send); their message ids."""
        ids = []
        for i in range(first, first + count):
            message_id = f"01SMOKE{i:027d}"
            message = v2d.Message(topic=v2d.Resource(name=GATEWAY_TOPIC), body=b"gw-%d" % i,
                                  system_properties=v2d.SystemProperties(message_id=message_id,
                                                                         message_type=v2d.NORMAL))
            reply = self.stub.SendMessage(v2s.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT_S,
                                          metadata=self.metadata)
            check(reply.status.code == v2d.OK and [e.message_id for e in reply.entries] == [message_id],
                  f"SendMessage through the gateway: {v2d.Code.Name(reply.status.code)} {reply.status.message}")
            ids.append(message_id)
        return ids


def verify_gateway_messages(stack: Stack, ids: list[str]) -> None:
    found = stack.pull_all(GATEWAY_TOPIC)
    for i, message_id in enumerate(ids):
        check(found.get(message_id) == b"gw-%d" % i, f"message {message_id} sent through the gateway not pulled "
                                                     f"back intact")


def check_codec(stack: Stack) -> None:
    """The image's build compiles the codec (Dockerfile: MQSTORE_REQUIRE_COMPILED): the service must say so."""
    active = stack.log.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S).codec
    check(active == "compiled", f"GetStoreInfo reports codec {active!r}, expected 'compiled' (the image's build "
                                f"compiles it: see the Dockerfile's build stage)")


def write(stack: Stack, gateway: Gateway | None, state: pathlib.Path) -> None:
    stack.wait_ready()
    check_codec(stack)
    stack.log.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=QUEUES), timeout=RPC_TIMEOUT_S)
    appended = append(stack, 0, MESSAGES)
    verify_messages(stack, appended)
    sent: list[str] = []
    if gateway is not None:
        stack.log.CreateTopic(pb.CreateTopicRequest(name=GATEWAY_TOPIC, queue_count=QUEUES), timeout=RPC_TIMEOUT_S)
        gateway.wait_route()
        sent = gateway.send(0, GATEWAY_MESSAGES)
        verify_gateway_messages(stack, sent)
    state.write_text(json.dumps({"appended": appended, "gateway": sent}))
    print(f"write: codec compiled; created {TOPIC}, appended {len(appended)} messages; pulled, fetched and "
          f"queried them back; {len(sent)} messages sent through the gateway pulled back")


def verify(stack: Stack, gateway: Gateway | None, state: pathlib.Path) -> None:
    saved = json.loads(state.read_text())
    appended, sent = saved["appended"], saved["gateway"]
    stack.wait_ready()
    verify_messages(stack, appended)
    appended += append(stack, len(appended), 1)
    verify_messages(stack, appended)
    if gateway is not None:
        verify_gateway_messages(stack, sent)
        gateway.wait_route()
        sent += gateway.send(len(sent), 1)
        verify_gateway_messages(stack, sent)
    state.write_text(json.dumps({"appended": appended, "gateway": sent}))  # a later verify expects these too
    print(f"verify: all {len(appended) - 1} messages (and {max(len(sent) - 1, 0)} sent through the gateway) kept "
          f"across the restart; appending and sending still work")


def spark(commitlog: str, compactor: str) -> None:
    """A round with engine=SPARK on the compose stack's standalone cluster, checked through GetLatest."""
    with grpc.insecure_channel(commitlog) as log_channel, grpc.insecure_channel(compactor) as channel:
        log, kv = commitlog_pb2_grpc.CommitLogStub(log_channel), compactor_pb2_grpc.CompactorStub(channel)
        wait_until(lambda: kv.Stats(cpb.CompactorStatsRequest(), timeout=RPC_TIMEOUT_S).connected,
                   "the compactor to connect to the commit log")
        latest = append_kv(log)
        wait_until(lambda: sum(kv.DescribeQueue(cpb.DescribeQueueRequest(topic=KV_TOPIC, queue_id=q),
                                                timeout=RPC_TIMEOUT_S).max_offset for q in range(QUEUES))
                   == KV_KEYS * KV_VERSIONS, f"the compactor to hold all {KV_KEYS * KV_VERSIONS} records")
        started = time.monotonic()
        rounds = kv.Compact(cpb.CompactRequest(topic=KV_TOPIC, engine=cpb.COMPACTION_ENGINE_SPARK, seal_active=True),
                            timeout=SPARK_ROUND_TIMEOUT_S).rounds
        seconds = time.monotonic() - started
        check(sorted((r.queue_id, r.engine, r.result) for r in rounds) == [(q, "spark", "ok") for q in range(QUEUES)],
              f"expected one ok Spark round per queue, got {[(r.queue_id, r.engine, r.result) for r in rounds]}")
        removed = sum(r.records_removed for r in rounds)
        check(removed >= KV_KEYS * (KV_VERSIONS - 1), f"the Spark rounds removed only {removed} overwritten records")
        for key, value in latest.items():
            check_latest(kv, key, value)
        print(f"spark: {len(rounds)} rounds on Spark in {seconds:.1f} s removed {removed} of "
              f"{KV_KEYS * KV_VERSIONS} records; GetLatest answers the latest value of all {KV_KEYS} keys")


def append_kv(log) -> dict[str, bytes]:
    log.CreateTopic(pb.CreateTopicRequest(name=KV_TOPIC, queue_count=QUEUES, kind=common_pb2.TOPIC_KIND_COMPACTION),
                    timeout=RPC_TIMEOUT_S)
    latest: dict[str, bytes] = {}
    for version in range(KV_VERSIONS):
        batch = []
        for i in range(KV_KEYS):
            key = f"kv-{i}"
            last = version == KV_VERSIONS - 1
            latest[key] = b"" if last and key == DELETED_KEY else b"value-%d-of-%s" % (version, key.encode())
            batch.append(common_pb2.MessageInput(body=latest[key], keys=[key]))
        log.Append(pb.AppendRequest(topic=KV_TOPIC, messages=batch), timeout=RPC_TIMEOUT_S)
    return latest


def check_latest(kv, key: str, value: bytes) -> None:
    try:
        got = kv.GetLatest(cpb.GetLatestRequest(topic=KV_TOPIC, key=key), timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as exc:
        check(value == b"" and exc.code() == grpc.StatusCode.NOT_FOUND, f"GetLatest {key}: {exc.code().name}")
        return
    if value == b"":
        check(got.tombstone, f"GetLatest {key} returned a value, expected the key deleted")
    else:
        check(got.value == value, f"GetLatest {key} returned {got.value!r}, expected {value!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["write", "verify", "spark"])
    parser.add_argument("--commitlog", required=True, help="published host:port of CommitLog")
    parser.add_argument("--index", help="published host:port of Index (write, verify)")
    parser.add_argument("--gateway", help="published host:port of the RocketMQ 5 gateway (write, verify; optional)")
    parser.add_argument("--state", type=pathlib.Path, help="what write appended, for verify")
    parser.add_argument("--compactor", help="published host:port of Compactor (spark)")
    args = parser.parse_args(argv)
    if args.phase == "spark" and not args.compactor:
        parser.error("spark needs --compactor")
    if args.phase != "spark" and not (args.index and args.state):
        parser.error(f"{args.phase} needs --index and --state")
    stack = Stack(args.commitlog, args.index or args.commitlog)
    gateway = Gateway(args.gateway) if args.gateway else None
    try:
        if args.phase == "spark":
            spark(args.commitlog, args.compactor)
        else:
            (write if args.phase == "write" else verify)(stack, gateway, args.state)
    except (SmokeFailure, grpc.RpcError) as exc:
        detail = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else str(exc)
        print(f"compose smoke test failed ({args.phase}): {detail}", file=sys.stderr)
        return 1
    finally:
        stack.close()
        if gateway is not None:
            gateway.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
