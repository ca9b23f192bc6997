"""The checks of `make compose-check-ha` (docker-compose.ha.yml), through the published ports of the stack.

    python scripts/compose_ha_smoke.py write    --nodes A,B,C --index I --state S   (prints leader=NODE_ID)
    python scripts/compose_ha_smoke.py steady   --nodes A,B,C --state S --started F --stop G
    (meanwhile: kill -9 an etcd member's container, then touch G)
    (kill -9 the leader's container)
    python scripts/compose_ha_smoke.py failover --nodes A,B,C --index I --state S --killed NODE_ID
    (start the killed container again)
    python scripts/compose_ha_smoke.py rejoin   --nodes A,B,C --state S --node NODE_ID

``write`` finds the leader (GetReplicationState on each node), creates a topic, waits until the three
nodes are in sync, appends MESSAGES messages with SYNC replication (each with its own key), checks each
result names two or more copies, waits until the index (following every node) finds them, and records
what was acknowledged in the state file. ``failover`` waits for another node to lead a higher epoch and
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
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc

TOPIC = "ha-smoke"
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
