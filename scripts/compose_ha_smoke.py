"""The checks of `make compose-check-ha` (docker-compose.ha.yml), through the published ports of the stack.

    python scripts/compose_ha_smoke.py write    --nodes A,B,C --index I,I2 --state S   (prints leader=NODE_ID)
    python scripts/compose_ha_smoke.py pairs    --nodes A,B,C --index I,I2 --txn T,T2 --compactor C,C2 --gateway G,G2
    python scripts/compose_ha_smoke.py steady   --nodes A,B,C --state S --started F --stop G
    (meanwhile: kill -9 an etcd member's container, then touch G)
    (kill -9 the leader's container)
    python scripts/compose_ha_smoke.py failover --nodes A,B,C --index I --state S --killed NODE_ID
    (start the killed container again)
    python scripts/compose_ha_smoke.py rejoin   --nodes A,B,C --state S --node NODE_ID

``write`` finds the leader (GetReplicationState on each node), creates a topic, waits until the three
nodes are in sync, appends MESSAGES messages with SYNC replication (each with its own key), checks each
result names two or more copies, waits until the index (following every node) finds them, and records
what was acknowledged in the state file. ``pairs`` checks the roles that run twice (issue 34), each instance
on its own: every one SERVING (gRPC health); a transaction prepared and committed through the Transaction
pair, answered by the active one while the standby refuses with UNAVAILABLE, its message then found by
every Index instance; a COMPACTION topic's latest values (SYNC appends) read back from each compactor; and
through each gateway a QueryRoute and a SendMessage, the message found by every Index instance.
``failover`` waits for another node to lead a higher epoch and
times it from ``--killed-at`` to the first SYNC append that node acknowledges, appends MESSAGES more,
then checks every acknowledged message, byte-identical at its physical offset, on the new leader, and
every key through the index (which resumed its Tail on the new leader). ``rejoin``: the restarted node
is a replica of the new leader, the three are in sync again and it serves every acknowledged message.
``steady`` appends SYNC batches of STEADY_BATCH messages to the leader, one after another, from its first
acknowledgement (it then creates the file ``--started``) until the file ``--stop`` exists: every append must
be acknowledged on two copies or more (none refused, none failed), the leader and its epoch must be the
same at the end as at the start, and every message acknowledged must be there (they join the state file's).
Every wait is bounded (WAIT_S); a failed check exits 1 with the reason.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import grpc
from mqstore_rpc import endpoints
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, index_pb2, index_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as v2d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as v2s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc as v2grpc
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2, compactor_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc, txn_pb2, txn_pb2_grpc

TOPIC = "ha-smoke"
KV_TOPIC = "ha-smoke-kv"    # pairs: a COMPACTION topic, read on both compactors
KV_KEYS = 20
MESSAGES = 200
STEADY_BATCH = 4  # steady's batches: small, so the index's later key-by-key check stays short
RPC_TIMEOUT_S = 10
WAIT_S = 180
POLL_S = 0.1


class SmokeFailure(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SmokeFailure(what)


def wait_for(condition, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if value := condition():
                return value
        except grpc.RpcError:
            pass  # a node restarting or electing: asked again
        time.sleep(POLL_S)
    raise SmokeFailure(f"timed out after {timeout_s} s waiting for {what}")


class Group:
    """The nodes by their published ports, and their node ids. Not thread-safe."""

    def __init__(self, nodes: str):
        self.channels = {address: grpc.insecure_channel(address) for address in nodes.split(",")}

    def state(self, address: str) -> replication_pb2.ReplicationState:
        return replication_pb2_grpc.ReplicationStub(self.channels[address]).GetReplicationState(
            replication_pb2.GetReplicationStateRequest(), timeout=RPC_TIMEOUT_S)

    def log(self, address: str) -> commitlog_pb2_grpc.CommitLogStub:
        return commitlog_pb2_grpc.CommitLogStub(self.channels[address])

    def leader(self, above_epoch: int = 0) -> tuple[str, replication_pb2.ReplicationState] | None:
        for address in self.channels:
            try:
                s = self.state(address)
            except grpc.RpcError:
                continue
            if s.role == "LEADER" and s.epoch > above_epoch and not s.fenced:
                return address, s
        return None

    def address_of(self, node_id: str) -> str | None:
        return next((a for a in self.channels if _state_or_none(self, a, node_id)), None)


def _state_or_none(group: Group, address: str, node_id: str) -> bool:
    try:
        return group.state(address).node_id == node_id
    except grpc.RpcError:
        return False


def append(group: Group, address: str, first: int, count: int = MESSAGES) -> list[dict]:
    request = pb.AppendRequest(topic=TOPIC, replication=pb.REPLICATION_MODE_SYNC, messages=[
        common_pb2.MessageInput(body=b"ha-%06d" % i, keys=[f"ha-key-{i}"]) for i in range(first, first + count)])
    results = group.log(address).Append(request, timeout=RPC_TIMEOUT_S).results
    check(all(r.replicas >= 2 for r in results), f"a SYNC append acknowledged with fewer than 2 copies: "
                                                  f"{sorted({r.replicas for r in results})}")
    return [{"offset": r.physical_offset, "body": f"ha-{first + i:06d}", "key": f"ha-key-{first + i}",
             "epoch": r.epoch} for i, r in enumerate(results)]


def check_readable(group: Group, address: str, acked: list[dict]) -> None:
    top = max(a["offset"] for a in acked)
    wait_for(lambda: group.log(address).GetStoreInfo(pb.GetStoreInfoRequest(), timeout=RPC_TIMEOUT_S)
             .visible_physical_offset > top, f"{address} to show every acknowledged message")
    for first in range(0, len(acked), 1000):
        part = acked[first:first + 1000]
        found = group.log(address).GetMessages(pb.GetMessagesRequest(physical_offsets=[a["offset"] for a in part]),
                                               timeout=30).messages
        for a, got in zip(part, found, strict=True):
            check(got.found and got.message.body == a["body"].encode() and got.message.physical_offset == a["offset"],
                  f"acknowledged message {a['body']} at {a['offset']} (epoch {a['epoch']}) is not there on {address}")


def check_index(index_addresses: str, acked: list[dict]) -> None:
    """Every Index instance of ``host:port[,host:port]`` (issue 34: compose runs two) finds every key."""
    for address in endpoints.split(index_addresses):
        _check_one_index(address, acked)


def _check_one_index(index_address: str, acked: list[dict]) -> None:
    with grpc.insecure_channel(index_address) as channel:
        stub = index_pb2_grpc.IndexStub(channel)

        def found(a):
            response = stub.QueryByKey(index_pb2.QueryByKeyRequest(topic=TOPIC, key=a["key"]), timeout=RPC_TIMEOUT_S)
            return [loc.physical_offset for loc in response.locators]
        wait_for(lambda: found(acked[-1]) == [acked[-1]["offset"]], "the index to catch up")
        for a in acked:
            check(found(a) == [a["offset"]], f"the index finds {a['key']} at {found(a)}, not once at {a['offset']}")


def cmd_write(args) -> None:
    group = Group(args.nodes)
    address, state = wait_for(group.leader, "a leader")
    group.log(address).CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2), timeout=RPC_TIMEOUT_S)
    wait_for(lambda: len(group.state(address).in_sync) == 3, "the three nodes in sync")
    acked = append(group, address, 0)
    check_index(args.index, acked)
    pathlib.Path(args.state).write_text(json.dumps({"acked": acked, "epoch": state.epoch}))
    print(f"leader={state.node_id} epoch {state.epoch}: {len(acked)} messages acknowledged by 3 nodes")


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S) \
            .status == health_pb2.HealthCheckResponse.SERVING


def _key_found(index_addresses: str, key: str, offset: int | None = None) -> None:
    """Every Index instance finds ``key`` once (at ``offset`` when given)."""
    for address in endpoints.split(index_addresses):
        with grpc.insecure_channel(address) as channel:
            stub = index_pb2_grpc.IndexStub(channel)

            def located(stub=stub):
                response = stub.QueryByKey(index_pb2.QueryByKeyRequest(topic=TOPIC, key=key), timeout=RPC_TIMEOUT_S)
                return [loc.physical_offset for loc in response.locators]
            found = wait_for(located, f"the Index at {address} to find {key}")
            check(len(found) == 1 and offset in (None, found[0]),
                  f"the Index at {address} finds {key} at {found}, not once{f' at {offset}' if offset else ''}")


def _transaction(txn_addresses: str) -> tuple[str, txn_pb2.EndResponse]:
    """Prepare and Commit one transaction on whichever instance answers; the other must refuse (standby)."""
    stubs = {a: txn_pb2_grpc.TransactionStub(grpc.insecure_channel(a)) for a in endpoints.split(txn_addresses)}
    check(len(stubs) >= 2, f"--txn names {len(stubs)} instance(s), the pair needs two")
    prepare = txn_pb2.PrepareRequest(topic=TOPIC, producer_group="ha-smoke", transaction_id="ha-smoke-txn-1",
                                     messages=[common_pb2.MessageInput(body=b"ha-txn", keys=["ha-txn-key"])])

    def one_answers():
        answered, refused = [], []
        for address, stub in stubs.items():
            try:
                stub.Prepare(prepare, timeout=RPC_TIMEOUT_S)
                answered.append(address)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise SmokeFailure(f"Prepare on {address}: {exc.code().name} {exc.details()}") from None
                refused.append(address)
        return (answered, refused) if len(answered) == 1 else None
    (active,), _ = wait_for(one_answers, "one Transaction instance to answer Prepare and the other to refuse it")
    ended = stubs[active].Commit(txn_pb2.EndRequest(transaction_id=prepare.transaction_id), timeout=RPC_TIMEOUT_S)
    check(ended.state == txn_pb2.TRANSACTION_STATE_COMMITTED, f"Commit on {active}: {ended.state}")
    for address, stub in stubs.items():
        if address != active:
            try:
                stub.Commit(txn_pb2.EndRequest(transaction_id=prepare.transaction_id), timeout=RPC_TIMEOUT_S)
                raise SmokeFailure(f"the standby {address} answered a Commit the active {active} had answered")
            except grpc.RpcError as exc:
                check(exc.code() == grpc.StatusCode.UNAVAILABLE,
                      f"the standby {address} answered Commit {exc.code().name}, not UNAVAILABLE")
    return active, ended


def _compacted(group: Group, leader: str, compactor_addresses: str) -> None:
    """SYNC appends to a COMPACTION topic (two values per key), then each compactor's latest is the second."""
    try:
        group.log(leader).CreateTopic(pb.CreateTopicRequest(name=KV_TOPIC, queue_count=2,
                                                            kind=common_pb2.TOPIC_KIND_COMPACTION),
                                      timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
    for version in (1, 2):
        group.log(leader).Append(pb.AppendRequest(topic=KV_TOPIC, replication=pb.REPLICATION_MODE_SYNC, messages=[
            common_pb2.MessageInput(body=b"v%d-%d" % (version, k), keys=[f"k{k}"]) for k in range(KV_KEYS)]),
            timeout=RPC_TIMEOUT_S)
    for address in endpoints.split(compactor_addresses):
        with grpc.insecure_channel(address) as channel:
            stub = compactor_pb2_grpc.CompactorStub(channel)

            def latest(stub=stub):
                values = stub.BatchGetLatest(compactor_pb2.BatchGetLatestRequest(
                    topic=KV_TOPIC, keys=[f"k{k}" for k in range(KV_KEYS)]), timeout=RPC_TIMEOUT_S).values
                return [v.value for v in values] == [b"v2-%d" % k for k in range(KV_KEYS)]
            wait_for(latest, f"the compactor at {address} to hold the latest value of every key")


def _through_gateway(address: str, i: int) -> str:
    """QueryRoute and one SendMessage (a key ha-gw-<i>) through the gateway at ``address``, as a RocketMQ 5
    client does; the message id."""
    with grpc.insecure_channel(address) as channel:
        stub, metadata = v2grpc.MessagingServiceStub(channel), (("x-mq-client-id", f"ha-smoke-{i}"),)
        host, _, port = address.rpartition(":")

        def routed():
            reply = stub.QueryRoute(v2s.QueryRouteRequest(topic=v2d.Resource(name=TOPIC), endpoints=v2d.Endpoints(
                scheme=v2d.IPv4, addresses=[v2d.Address(host=host, port=int(port))])), timeout=RPC_TIMEOUT_S,
                metadata=metadata)
            return reply.status.code == v2d.OK and len(reply.message_queues) > 0
        wait_for(routed, f"the gateway at {address} to route {TOPIC}")
        message_id = f"01HASMOKE{i:025d}"
        reply = stub.SendMessage(v2s.SendMessageRequest(messages=[v2d.Message(
            topic=v2d.Resource(name=TOPIC), body=b"ha-gw-%d" % i, system_properties=v2d.SystemProperties(
                message_id=message_id, message_type=v2d.NORMAL, keys=[f"ha-gw-{i}"]))]),
            timeout=RPC_TIMEOUT_S, metadata=metadata)
        check(reply.status.code == v2d.OK and [e.message_id for e in reply.entries] == [message_id],
              f"SendMessage through the gateway at {address}: {v2d.Code.Name(reply.status.code)} "
              f"{reply.status.message}")
        return message_id


def cmd_pairs(args) -> None:
    group = Group(args.nodes)
    leader, _ = wait_for(group.leader, "a leader")
    every = [*endpoints.split(args.index), *endpoints.split(args.txn), *endpoints.split(args.compactor),
             *endpoints.split(args.gateway)]
    for address in every:
        wait_for(lambda address=address: _serving(address), f"{address} to be SERVING")
    active, ended = _transaction(args.txn)
    _key_found(args.index, "ha-txn-key", ended.results[0].physical_offset if ended.results else None)
    _compacted(group, leader, args.compactor)
    gateways = endpoints.split(args.gateway)
    for i, address in enumerate(gateways):
        _through_gateway(address, i)
        _key_found(args.index, f"ha-gw-{i}")
    print(f"pairs: {len(every)} instances SERVING; a transaction committed through {active} (the other refused: "
          f"standby), found by every Index; {KV_KEYS} keys' latest values on each compactor; a message sent "
          f"through each of {len(gateways)} gateways, found by every Index")


def cmd_failover(args) -> None:
    group = Group(args.nodes)
    saved = json.loads(pathlib.Path(args.state).read_text())
    acked = saved["acked"]

    def first_ack():
        found = group.leader(above_epoch=saved["epoch"])
        if found is None:
            return None
        try:
            return found, append(group, found[0], len(acked))
        except grpc.RpcError:
            return None  # NotEnoughReplicas while a replica joins the new leader: retried
    (address, state), more = wait_for(first_ack, "a new leader acknowledging a SYNC append")
    took_s = time.time() - args.killed_at
    check(state.node_id != args.killed, f"{args.killed} still leads")
    acked += more
    check_readable(group, address, acked)
    check_index(args.index, acked)
    pathlib.Path(args.state).write_text(json.dumps({"acked": acked, "epoch": state.epoch}))
    print(f"failover: {state.node_id} leads epoch {state.epoch}; first SYNC ack {took_s:.1f} s after the kill; "
          f"all {len(acked)} acknowledged messages there, the index found every key")


def cmd_steady(args) -> None:
    group = Group(args.nodes)
    saved = json.loads(pathlib.Path(args.state).read_text())
    acked = saved["acked"]
    address, state = wait_for(group.leader, "a leader")
    deadline, batches = time.monotonic() + WAIT_S, 0
    while not pathlib.Path(args.stop).exists():
        check(time.monotonic() < deadline, f"no stop file {args.stop} within {WAIT_S} s")
        try:
            acked += append(group, address, len(acked), STEADY_BATCH)
        except grpc.RpcError as exc:
            raise SmokeFailure(f"a SYNC append to the leader {state.node_id} failed after {batches} batches: "
                               f"{exc.code().name} {exc.details()}") from None
        batches += 1
        pathlib.Path(args.started).touch()
    now = group.state(address)
    check((now.role, now.epoch, now.fenced) == ("LEADER", state.epoch, False),
          f"the leader changed: {state.node_id} led epoch {state.epoch}, now {now.role} epoch {now.epoch} "
          f"(fenced: {now.fenced})")
    check_readable(group, address, acked)
    pathlib.Path(args.state).write_text(json.dumps({"acked": acked, "epoch": state.epoch}))
    print(f"steady: {state.node_id} led epoch {state.epoch} throughout; {batches} SYNC batches, none failed; "
          f"all {len(acked)} acknowledged messages there")


def cmd_rejoin(args) -> None:
    group = Group(args.nodes)
    saved = json.loads(pathlib.Path(args.state).read_text())
    address = wait_for(lambda: group.address_of(args.node), f"{args.node} to answer")
    wait_for(lambda: group.state(address).role == "REPLICA", f"{args.node} to follow the new leader")
    leader, _ = wait_for(group.leader, "the leader")
    wait_for(lambda: len(group.state(leader).in_sync) == 3, "the three nodes in sync again")
    check_readable(group, address, saved["acked"])
    print(f"{args.node} rejoined as a replica, in sync, and serves all {len(saved['acked'])} messages")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("write")
    p.add_argument("--nodes", required=True)
    p.add_argument("--index", required=True, help="host:port of the Index, or of each: a,b")
    p.add_argument("--state", required=True)
    p.set_defaults(func=cmd_write)
    p = sub.add_parser("pairs")
    p.add_argument("--nodes", required=True)
    p.add_argument("--index", required=True, help="host:port of each Index: a,b")
    p.add_argument("--txn", required=True, help="host:port of each Transaction service: a,b")
    p.add_argument("--compactor", required=True, help="host:port of each compactor: a,b")
    p.add_argument("--gateway", required=True, help="host:port of each gateway: a,b")
    p.set_defaults(func=cmd_pairs)
    p = sub.add_parser("failover")
    p.add_argument("--nodes", required=True)
    p.add_argument("--index", required=True, help="host:port of the Index, or of each: a,b")
    p.add_argument("--state", required=True)
    p.add_argument("--killed", required=True)
    p.add_argument("--killed-at", type=float, required=True, help="time.time() of the kill")
    p.set_defaults(func=cmd_failover)
    p = sub.add_parser("steady")
    p.add_argument("--nodes", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--started", required=True, help="created after the first acknowledgement")
    p.add_argument("--stop", required=True, help="appends stop once this file exists")
    p.set_defaults(func=cmd_steady)
    p = sub.add_parser("rejoin")
    p.add_argument("--nodes", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--node", required=True)
    p.set_defaults(func=cmd_rejoin)
    args = parser.parse_args()
    try:
        args.func(args)
    except SmokeFailure as exc:
        print(f"compose_ha_smoke {args.command}: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
