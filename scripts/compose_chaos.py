"""The driver of `make compose-check-chaos` (scripts/compose_check_chaos.sh): chaos on docker-compose.ha.yml.

    python scripts/compose_chaos.py --project P --nodes A,B,C --index I,I2 --txn T,T2 --compactor C,C2 \\
        --gateway G,G2 [--duration-s 180] [--kill-every-s 5] [--down-s 6] [--seed N] [--roles etcd,...]
        [--report FILE]

With the stack up (every service healthy), for ``--duration-s`` it kills one container with SIGKILL
(``docker kill -s KILL``) every ``--kill-every-s`` seconds, chosen at random: a role first (etcd,
commitlog, index, txn, compactor, gateway; ``--roles`` narrows them), then one of its containers (for the
commit log, the leader half of the time, else any node). Never two of one role at once: a role is not
chosen again until its killed container has been started again (``docker start``, ``--down-s`` after the
kill) and is back (healthy; a commit log node also in the leader's in-sync set again). Meanwhile, through
the published ports (this runs where they are: the engine's namespace), the load:

  * SYNC producer: batches of 8 SYNC-replicated appends to topic chaos-sync on whichever node leads
    (GetReplicationState), each message its own key; and an ASYNC producer the same to chaos-async;
  * a producer through the gateway pair (RocketMQ 5's SendMessage, as the official clients send; the
    gateway's appends take the nodes' default replication, SYNC in the HA profile) to chaos-gw;
  * a transactional producer through the Transaction pair (mqstore's own Transaction API, Prepare then
    Commit, or Rollback for one in five, each call retried with the same id on UNAVAILABLE or a deadline:
    the calls are idempotent) to chaos-txn;
  * pop consumers: Receive and Ack (the commit log's Consumer API, group chaos-pop) on chaos-sync;
  * a pull consumer committing offsets (QueryOffset, Pull, CommitOffset; group chaos-pull) on chaos-sync;
  * a writer of a COMPACTION topic (chaos-kv, 16 keys, SYNC) and compaction readers (BatchGetLatest on
    either compactor) and key queries on either Index instance.

At the end every killed container is started again and must be back, the load stops, and it checks:
  * acknowledged messages lost: every SYNC ack and every gateway send acknowledged is on the leader and on
    every node, byte-identical at its offset (ASYNC acks a failover cut are counted, not a failure: the
    replication README says an ASYNC ack may be lost with its leader);
  * transactions committed twice (a real message there twice) or lost (a Commit answered COMMITTED whose
    message is not there), and rolled-back ones visible;
  * consumer offsets that went back (QueryOffset below an offset whose CommitOffset was acknowledged);
  * pop: every SYNC-acknowledged message of chaos-sync received by the pop group (redeliveries counted);
  * each compactor's latest value of every key at least the last acknowledged one; both Index instances
    find the keys of a sample of the SYNC acks;
and prints, per role, the longest time its API was unavailable: the longest gap between two successful
calls of the load on that role (commitlog: appends; txn: Prepare or Commit; compactor: reads; gateway:
SendMessage; index: QueryByKey; etcd: GET /health answered healthy by any member, at its container's
address). Exit status 1 when an invariant fails, 2 when the
stack did not come back; a JSON report in ``--report``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
from mqstore_rpc import endpoints
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as v2d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as v2s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc as v2grpc
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, common_pb2, compactor_pb2, compactor_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import consumer_pb2, consumer_pb2_grpc, index_pb2, index_pb2_grpc
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc, txn_pb2, txn_pb2_grpc

ROLES = {
    "etcd": ["etcd-1", "etcd-2", "etcd-3"],
    "commitlog": ["commitlog-1", "commitlog-2", "commitlog-3"],
    "index": ["index", "index-2"],
    "txn": ["txn", "txn-2"],
    "compactor": ["compactor", "compactor-2"],
    "gateway": ["gateway", "gateway-2"],
}
QUEUES = 4
BATCH = 8
KV_KEYS = 16
RPC_TIMEOUT_S = 5.0
BACK_TIMEOUT_S = 240.0     # a killed container must be back within this after the chaos ends
DRAIN_TIMEOUT_S = 120.0    # the pop group must have received every SYNC ack within this after the load ends
ERROR_PAUSE_S = 0.2        # after a failed call, before the next (no hot loop while a role is down)
PROBE_EVERY_S = 0.25
TXN_RETRY_S = 60.0         # one Prepare or End retried (same id) this long before it counts as unresolved


def now() -> float:
    return time.monotonic()


class Availability:
    """Per role, the longest gap between two successful calls inside the chaos window (an outage that
    starts before the window's first success or lasts past its end counts up to the window's edge)."""

    def __init__(self, roles):
        self.lock = threading.Lock()
        self.roles = roles
        self.start = self.end = None
        self.last: dict[str, float] = {}
        self.seen: set[str] = set()      # the roles with a successful call, also before the window
        self.worst: dict[str, tuple[float, float]] = {role: (0.0, 0.0) for role in roles}  # gap, at (s into it)

    def begin(self) -> None:
        with self.lock:
            self.start = now()
            self.last = {role: self.start for role in self.roles}

    def ok(self, role: str) -> None:
        t = now()
        with self.lock:
            self.seen.add(role)
            if self.start is None or self.end is not None:
                return
            self._gap(role, t)
            self.last[role] = t

    def _gap(self, role: str, t: float) -> None:
        gap = t - self.last[role]
        if gap > self.worst[role][0]:
            self.worst[role] = (gap, self.last[role] - self.start)

    def finish(self) -> None:
        with self.lock:
            self.end = now()
            for role in self.roles:
                self._gap(role, self.end)


class NoLeader(Exception):
    """No node answered as an unfenced leader (between a leader's loss and the next election): counted among a
    worker's errors as ``NoLeader``, as an RpcError is by its code."""


class Log:
    """The commit log's nodes by their published ports; the leader found by GetReplicationState. One per
    worker (not thread-safe)."""

    def __init__(self, nodes: str):
        self.channels = {a: grpc.insecure_channel(a) for a in endpoints.split(nodes)}
        self._leader: str | None = None

    def state(self, address: str, timeout: float = 1.0) -> replication_pb2.ReplicationState:
        return replication_pb2_grpc.ReplicationStub(self.channels[address]).GetReplicationState(
            replication_pb2.GetReplicationStateRequest(), timeout=timeout)

    def leader(self) -> str | None:
        if self._leader is None:
            best = None
            for address in self.channels:
                try:
                    s = self.state(address)
                except grpc.RpcError:
                    continue
                if s.role == "LEADER" and not s.fenced and (best is None or s.epoch > best[1]):
                    best = (address, s.epoch, s.node_id)
            self._leader = best[0] if best else None
        return self._leader

    def lost(self) -> None:
        self._leader = None

    def _leader_channel(self) -> grpc.Channel:
        address = self.leader()
        if address is None:
            raise NoLeader("no commit log node answers as an unfenced leader")
        return self.channels[address]

    def log(self, address: str | None = None) -> commitlog_pb2_grpc.CommitLogStub:
        return commitlog_pb2_grpc.CommitLogStub(self.channels[address] if address else self._leader_channel())

    def consumer(self) -> consumer_pb2_grpc.ConsumerStub:
        return consumer_pb2_grpc.ConsumerStub(self._leader_channel())

    def node_ids(self) -> dict[str, str]:
        """address -> node id of every node that answers."""
        ids = {}
        for address in self.channels:
            try:
                ids[address] = self.state(address).node_id
            except grpc.RpcError:
                pass
        return ids

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


class Docker:
    """The project's containers, by compose service (docker CLI, DOCKER_HOST as given)."""

    def __init__(self, project: str):
        self.project = project
        self.ids: dict[str, str] = {}

    def run(self, *args: str, timeout: float = 60) -> str:
        return subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=timeout).stdout

    def resolve(self, services) -> None:
        for service in services:
            out = self.run("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={self.project}",
                           "--filter", f"label=com.docker.compose.service={service}").split()
            if len(out) != 1:
                raise RuntimeError(f"project {self.project}: {len(out)} containers of {service}, expected 1")
            self.ids[service] = out[0]

    def kill(self, service: str) -> None:
        self.run("kill", "-s", "KILL", self.ids[service])

    def start(self, service: str) -> None:
        self.run("start", self.ids[service])

    def healthy(self, service: str) -> bool:
        state = self.run("inspect", "-f", "{{.State.Running}} {{if .State.Health}}{{.State.Health.Status}}"
                                          "{{else}}none{{end}}", self.ids[service]).split()
        return state[0] == "true" and state[1] in ("healthy", "none")

    def ip(self, service: str) -> str:
        """The container's address on the compose network ("" while it has none: stopped)."""
        addresses = self.run("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                             self.ids[service]).split()
        return addresses[0] if addresses else ""


class Worker(threading.Thread):
    def __init__(self, name: str, stop: threading.Event, availability: Availability):
        super().__init__(name=name, daemon=True)
        self.stop, self.availability = stop, availability
        self.errors: dict[str, int] = {}
        self.samples: dict[str, list[str]] = {}   # per status, the first few messages with their time
        self.crash: str | None = None

    def failed(self, exc: BaseException) -> None:
        code = exc.code().name if isinstance(exc, grpc.RpcError) else type(exc).__name__
        self.errors[code] = self.errors.get(code, 0) + 1
        detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
        samples = self.samples.setdefault(code, [])
        if len(samples) < 5 and not any(detail[:60] in sample for sample in samples):
            start = self.availability.start
            samples.append(f"{now() - start if start else 0:.1f} s: {detail[:300]}")
        self.stop.wait(ERROR_PAUSE_S)

    def run(self) -> None:
        try:
            self.loop()
        except Exception as exc:  # noqa: BLE001 - a thread's failure (a driver bug): reported, the check fails
            self.crash = f"{type(exc).__name__}: {exc}"


class Producer(Worker):
    """SYNC or ASYNC appends of BATCH messages to the leader; acks: body -> (offset, replicas, epoch)."""

    def __init__(self, nodes, mode, topic, stop, availability):
        super().__init__(f"producer-{topic}", stop, availability)
        self.log, self.mode, self.topic = Log(nodes), mode, topic
        self.acked: dict[str, tuple[int, int, int]] = {}
        self.seq = 0

    def loop(self) -> None:
        while not self.stop.is_set():
            bodies = [f"{self.topic}-{self.seq + i}" for i in range(BATCH)]
            self.seq += BATCH
            try:
                results = self.log.log().Append(pb.AppendRequest(topic=self.topic, replication=self.mode, messages=[
                    common_pb2.MessageInput(body=b.encode(), keys=[b]) for b in bodies]), timeout=RPC_TIMEOUT_S).results
            except (grpc.RpcError, NoLeader) as exc:
                self.log.lost()
                self.failed(exc)
                continue
            for body, r in zip(bodies, results, strict=True):
                self.acked[body] = (r.physical_offset, r.replicas, r.epoch)
            self.availability.ok("commitlog")


class GatewayProducer(Worker):
    """SendMessage through the gateways (the one that answered last first); acks: message id -> body."""

    def __init__(self, gateways, stop, availability):
        super().__init__("producer-gateway", stop, availability)
        self.addresses = endpoints.split(gateways)
        self.stubs = [v2grpc.MessagingServiceStub(grpc.insecure_channel(a)) for a in self.addresses]
        self.acked: dict[str, str] = {}
        self.preferred, self.seq = 0, 0

    def loop(self) -> None:
        metadata = (("x-mq-client-id", "chaos-producer"),)
        while not self.stop.is_set():
            message_id, body = f"01CHAOS{self.seq:027d}", f"chaos-gw-{self.seq}"
            self.seq += 1
            try:
                reply = self.stubs[self.preferred].SendMessage(v2s.SendMessageRequest(messages=[v2d.Message(
                    topic=v2d.Resource(name="chaos-gw"), body=body.encode(), system_properties=v2d.SystemProperties(
                        message_id=message_id, message_type=v2d.NORMAL))]), timeout=RPC_TIMEOUT_S, metadata=metadata)
                if reply.status.code != v2d.OK:
                    raise RuntimeError(v2d.Code.Name(reply.status.code))
            except (grpc.RpcError, RuntimeError) as exc:
                self.preferred = (self.preferred + 1) % len(self.stubs)
                self.failed(exc)
                continue
            self.acked[message_id] = body
            self.availability.ok("gateway")


class TxnProducer(Worker):
    """Transactions through the Transaction pair: outcome per id (committed, rolled_back, unresolved, or
    what refused it)."""

    def __init__(self, txns, stop, availability):
        super().__init__("producer-txn", stop, availability)
        self.stubs = [txn_pb2_grpc.TransactionStub(grpc.insecure_channel(a)) for a in endpoints.split(txns)]
        self.outcomes: dict[str, str] = {}
        self.preferred = 0

    def call(self, method: str, request):
        """``method`` on the preferred instance, then the other, again while UNAVAILABLE or DEADLINE_EXCEEDED
        (the same request: Prepare with the same id and messages, Commit and Rollback are idempotent), up to
        TXN_RETRY_S; None when it never answered."""
        deadline = now() + TXN_RETRY_S
        while now() < deadline:
            try:
                response = getattr(self.stubs[self.preferred], method)(request, timeout=RPC_TIMEOUT_S)
                self.availability.ok("txn")
                return response
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                self.preferred = (self.preferred + 1) % len(self.stubs)
                self.failed(exc)
        return None

    def loop(self) -> None:
        n = 0
        while not self.stop.is_set():
            txn_id, body = f"chaos-tx-{n}", f"tx-{n}"
            rollback = n % 5 == 4
            n += 1
            try:
                if self.call("Prepare", txn_pb2.PrepareRequest(
                        topic="chaos-txn", producer_group="chaos-txn", transaction_id=txn_id,
                        messages=[common_pb2.MessageInput(body=body.encode(), keys=[body])])) is None:
                    self.outcomes[txn_id] = "unresolved"
                    continue
            except grpc.RpcError as exc:
                self.outcomes[txn_id] = f"prepare refused {exc.code().name}"
                continue
            try:
                ended = self.call("Rollback" if rollback else "Commit", txn_pb2.EndRequest(transaction_id=txn_id))
            except grpc.RpcError as exc:
                self.outcomes[txn_id] = f"refused {exc.code().name}: {exc.details()}"
                continue
            if ended is None:
                self.outcomes[txn_id] = "unresolved"
            else:
                self.outcomes[txn_id] = txn_pb2.TransactionState.Name(ended.state)


class PopConsumer(Worker):
    """Receive and Ack (group chaos-pop) on chaos-sync: bodies received, deliveries."""

    def __init__(self, nodes, stop, availability):
        super().__init__("pop", stop, availability)
        self.log = Log(nodes)
        self.received: set[str] = set()
        self.deliveries = 0

    def loop(self) -> None:
        while not self.stop.is_set():
            try:
                consumer = self.log.consumer()
                got = consumer.Receive(consumer_pb2.ReceiveRequest(
                    group="chaos-pop", topic="chaos-sync", batch_size=64, invisible_duration_ms=10_000,
                    long_poll_ms=500, start=consumer_pb2.POP_START_EARLIEST), timeout=RPC_TIMEOUT_S).messages
                for m in got:
                    self.received.add(m.message.body.decode())
                self.deliveries += len(got)
                if got:
                    consumer.Ack(consumer_pb2.AckRequest(group="chaos-pop", topic="chaos-sync",
                                                         receipt_handles=[m.receipt_handle for m in got]),
                                 timeout=RPC_TIMEOUT_S)
            except (grpc.RpcError, NoLeader) as exc:
                self.log.lost()
                self.failed(exc)


class OffsetsConsumer(Worker):
    """QueryOffset, Pull, CommitOffset (group chaos-pull) on every queue of chaos-sync: an offset read below
    one whose commit was acknowledged went back."""

    def __init__(self, nodes, stop, availability):
        super().__init__("offsets", stop, availability)
        self.log = Log(nodes)
        self.committed = dict.fromkeys(range(QUEUES), 0)  # the highest acknowledged commit per queue
        self.went_back: list[str] = []
        self.commits = 0

    def loop(self) -> None:
        queue = 0
        while not self.stop.is_set():
            queue = (queue + 1) % QUEUES
            try:
                log = self.log.log()
                try:
                    offset = log.QueryOffset(pb.QueryOffsetRequest(group="chaos-pull", topic="chaos-sync",
                                                                   queue_id=queue), timeout=RPC_TIMEOUT_S).offset
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    offset = 0
                if offset < self.committed[queue]:
                    self.went_back.append(f"queue {queue}: QueryOffset {offset} after CommitOffset "
                                          f"{self.committed[queue]} was acknowledged")
                pulled = log.Pull(pb.PullRequest(topic="chaos-sync", queue_id=queue, offset=offset, max_messages=64),
                                  timeout=RPC_TIMEOUT_S)
                if pulled.next_offset > offset:
                    log.CommitOffset(pb.CommitOffsetRequest(group="chaos-pull", topic="chaos-sync", queue_id=queue,
                                                            offset=pulled.next_offset), timeout=RPC_TIMEOUT_S)
                    self.committed[queue] = max(self.committed[queue], pulled.next_offset)
                    self.commits += 1
                else:
                    self.stop.wait(0.05)
            except (grpc.RpcError, NoLeader) as exc:
                self.log.lost()
                self.failed(exc)


class KvWriter(Worker):
    """SYNC appends to the COMPACTION topic chaos-kv: key k<i> value "<seq>"; the last acknowledged seq per key."""

    def __init__(self, nodes, stop, availability):
        super().__init__("kv-writer", stop, availability)
        self.log = Log(nodes)
        self.acked: dict[str, int] = {}
        self.seq = 0

    def loop(self) -> None:
        while not self.stop.is_set():
            keys = [f"k{(self.seq + i) % KV_KEYS}" for i in range(KV_KEYS // 2)]
            seqs = [self.seq + i for i in range(len(keys))]
            self.seq += len(keys)
            try:
                self.log.log().Append(pb.AppendRequest(
                    topic="chaos-kv", replication=pb.REPLICATION_MODE_SYNC, messages=[
                        common_pb2.MessageInput(body=str(seq).encode(), keys=[key])
                        for key, seq in zip(keys, seqs, strict=True)]),
                    timeout=RPC_TIMEOUT_S)
            except (grpc.RpcError, NoLeader) as exc:
                self.log.lost()
                self.failed(exc)
                continue
            for k, s in zip(keys, seqs, strict=True):
                self.acked[k] = s
            self.availability.ok("commitlog")
            self.stop.wait(0.05)


def latest(stub, timeout: float = RPC_TIMEOUT_S) -> dict[str, int]:
    values = stub.BatchGetLatest(compactor_pb2.BatchGetLatestRequest(
        topic="chaos-kv", keys=[f"k{i}" for i in range(KV_KEYS)]), timeout=timeout).values
    return {v.key: int(v.value) for v in values if v.found and not v.tombstone}


class KvReader(Worker):
    """BatchGetLatest on either compactor; per instance, a key read lower than it read it before went back
    (counted: a compactor that restarts may answer from an older point until it has followed the log)."""

    def __init__(self, compactors, stop, availability):
        super().__init__("kv-reader", stop, availability)
        self.addresses = endpoints.split(compactors)
        self.stubs = [compactor_pb2_grpc.CompactorStub(grpc.insecure_channel(a)) for a in self.addresses]
        self.seen: list[dict[str, int]] = [{} for _ in self.stubs]
        self.reads, self.went_back, self.preferred = 0, 0, 0

    def loop(self) -> None:
        while not self.stop.is_set():
            i = self.preferred
            try:
                values = latest(self.stubs[i])
            except grpc.RpcError as exc:
                self.preferred = (i + 1) % len(self.stubs)
                self.failed(exc)
                continue
            self.availability.ok("compactor")
            self.reads += 1
            for key, seq in values.items():
                if seq < self.seen[i].get(key, -1):
                    self.went_back += 1
                self.seen[i][key] = max(seq, self.seen[i].get(key, -1))
            self.preferred = (i + 1) % len(self.stubs)  # both instances read in turn
            self.stop.wait(0.1)


class Probes:
    """The roles no load uses as a client: the Index (QueryByKey on either), etcd (GET /health on any member,
    at its container's address), PostgreSQL (a TCP connection to its container)."""

    def __init__(self, indexes, addresses: dict[str, str]):
        self.indexes = [index_pb2_grpc.IndexStub(grpc.insecure_channel(a)) for a in endpoints.split(indexes)]
        self.addresses = addresses   # service -> container IP (the chaos loop refreshes it)

    def index_ok(self) -> bool:
        for stub in self.indexes:
            try:
                stub.QueryByKey(index_pb2.QueryByKeyRequest(topic="chaos-sync", key="chaos-sync-0"), timeout=1.0)
                return True
            except grpc.RpcError:
                continue
        return False

    def etcd_ok(self) -> bool:
        for service in ROLES["etcd"]:
            try:
                with urllib.request.urlopen(f"http://{self.addresses[service]}:2379/health", timeout=1.0) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return True
            except (OSError, ValueError, KeyError):
                continue
        return False



class Prober(Worker):
    """One role's probe every PROBE_EVERY_S (a thread per role: one role's timeouts never delay another's)."""

    def __init__(self, role: str, probe, stop, availability):
        super().__init__(f"probe-{role}", stop, availability)
        self.role, self.probe = role, probe

    def loop(self) -> None:
        while not self.stop.is_set():
            if self.probe():
                self.availability.ok(self.role)
            self.stop.wait(PROBE_EVERY_S)


def in_sync_count(log: Log) -> int:
    log.lost()
    leader = log.leader()
    if leader is None:
        return 0
    try:
        return len(log.state(leader).in_sync)
    except grpc.RpcError:
        return 0


class Chaos(threading.Thread):
    """Kills and restarts containers (the module docstring); its events for the report."""

    def __init__(self, docker: Docker, nodes: str, roles: list[str], addresses: dict[str, str], args):
        super().__init__(name="chaos", daemon=True)
        self.docker, self.log, self.roles, self.addresses, self.args = docker, Log(nodes), roles, addresses, args
        self.rng = random.Random(args.seed)
        self.events: list[dict] = []
        self.down: dict[str, dict] = {}   # role -> its event while its container is not back
        self.crash: str | None = None
        self.t0 = now()
        self.came_back = False                       # set by main once the chaos has ended
        self.availability: Availability | None = None

    def back(self, event: dict) -> bool:
        if not self.docker.healthy(event["service"]):
            return False
        return event["role"] != "commitlog" or in_sync_count(self.log) == 3

    def tend(self) -> None:
        """Start what is due, notice what is back."""
        for role, event in list(self.down.items()):
            t = now() - self.t0
            if "started_s" not in event and t >= event["killed_s"] + self.args.down_s:
                self.docker.start(event["service"])
                event["started_s"] = round(now() - self.t0, 2)
                self.addresses[event["service"]] = self.docker.ip(event["service"])
            elif "started_s" in event and self.back(event):
                event["back_s"] = round(now() - self.t0, 2)
                self.addresses[event["service"]] = self.docker.ip(event["service"])
                del self.down[role]

    def kill_one(self) -> None:
        roles = [r for r in self.roles if r not in self.down]
        if not roles:
            return
        role = self.rng.choice(roles)
        service, leader = self.rng.choice(ROLES[role]), False
        if role == "commitlog" and self.rng.random() < 0.5:
            self.log.lost()
            address = self.log.leader()
            node = self.log.node_ids().get(address or "", "")
            if node:
                service, leader = f"commitlog-{node.removeprefix('n')}", True
        event = {"role": role, "service": service, "leader": leader, "killed_s": round(now() - self.t0, 2)}
        self.docker.kill(service)
        self.events.append(event)
        self.down[role] = event
        print(f"[chaos {event['killed_s']:6.1f} s] kill -9 {service}{' (the leader)' if leader else ''}", flush=True)

    def run(self) -> None:
        try:
            end, next_kill = self.t0 + self.args.duration_s, self.t0 + self.args.kill_every_s
            while now() < end:
                self.tend()
                if now() >= next_kill:
                    self.kill_one()
                    next_kill += self.args.kill_every_s
                time.sleep(0.5)
            deadline = now() + BACK_TIMEOUT_S   # the end: everything started again when due, and back
            while self.down and now() < deadline:
                self.tend()
                time.sleep(0.5)
        except Exception as exc:  # noqa: BLE001 - a docker call failed: reported, the check fails
            self.crash = f"{type(exc).__name__}: {exc}"


def pull_all(log: Log, address: str, topic: str) -> list[common_pb2.StoredMessage]:
    found = []
    for queue_id in range(QUEUES):
        offset = 0
        for _ in range(100_000):  # bounded: each pull advances or ends the loop
            r = log.log(address).Pull(pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=1000,
                                                     max_bytes=8 << 20), timeout=30)
            found.extend(r.messages)
            if r.next_offset >= r.max_offset or r.next_offset == offset:
                break
            offset = r.next_offset
    return found


def wait_for(condition, timeout_s: float):
    deadline = now() + timeout_s
    while now() < deadline:
        try:
            if value := condition():
                return value
        except grpc.RpcError:
            pass
        time.sleep(0.5)
    return None


def check_acked(log: Log, acked: dict[str, tuple[int, int, int]]) -> dict[str, int]:
    """address -> acknowledged messages not there, byte-identical at their offset, on that node."""
    items = sorted(acked.items(), key=lambda kv: kv[1][0])
    missing = {}
    for address in log.channels:
        if items:  # a replica shows what every in-sync node holds: wait until it shows the last one
            wait_for(lambda address=address: log.log(address).GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10)
                     .visible_physical_offset > items[-1][1][0], 60)
        lost = 0
        for first in range(0, len(items), 1000):
            part = items[first:first + 1000]
            got = log.log(address).GetMessages(pb.GetMessagesRequest(physical_offsets=[o for _, (o, _, _) in part]),
                                               timeout=30).messages
            lost += sum(1 for (body, (offset, _, _)), m in zip(part, got, strict=True)
                        if not (m.found and m.message.body == body.encode() and m.message.physical_offset == offset))
        missing[address] = lost
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", required=True, help="the compose project (its containers are killed)")
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--txn", required=True)
    parser.add_argument("--compactor", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--duration-s", type=float, default=180.0, help="how long containers are killed (180)")
    parser.add_argument("--kill-every-s", type=float, default=5.0, help="a kill this often (5)")
    parser.add_argument("--down-s", type=float, default=6.0, help="a killed container is started again after (6)")
    parser.add_argument("--seed", type=int, default=None, help="of the random choices (default: the time)")
    parser.add_argument("--roles", default=",".join(ROLES), help=f"the roles killed (default {','.join(ROLES)})")
    parser.add_argument("--report", help="write the JSON report here")
    args = parser.parse_args()
    args.seed = int(time.time()) if args.seed is None else args.seed
    roles = [r for r in endpoints.split(args.roles)]
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        parser.error(f"unknown roles {unknown}: choose among {', '.join(ROLES)}")

    docker = Docker(args.project)
    docker.resolve([s for services in ROLES.values() for s in services])
    addresses = {s: docker.ip(s) for s in ROLES["etcd"]}
    setup = Log(args.nodes)
    leader = wait_for(setup.leader, 60)
    if leader is None:
        print("compose_chaos: no leader", file=sys.stderr)
        return 2
    for topic, kind in (("chaos-sync", common_pb2.TOPIC_KIND_NORMAL), ("chaos-async", common_pb2.TOPIC_KIND_NORMAL),
                        ("chaos-gw", common_pb2.TOPIC_KIND_NORMAL), ("chaos-txn", common_pb2.TOPIC_KIND_NORMAL),
                        ("chaos-kv", common_pb2.TOPIC_KIND_COMPACTION)):
        try:
            setup.log().CreateTopic(pb.CreateTopicRequest(name=topic, queue_count=QUEUES, kind=kind), timeout=30)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
    if not wait_for(lambda: in_sync_count(setup) == 3, 120):
        print("compose_chaos: the three nodes are not in sync", file=sys.stderr)
        return 2

    stop_load, stop_pop = threading.Event(), threading.Event()
    availability = Availability(list(ROLES))
    sync = Producer(args.nodes, pb.REPLICATION_MODE_SYNC, "chaos-sync", stop_load, availability)
    async_ = Producer(args.nodes, pb.REPLICATION_MODE_ASYNC, "chaos-async", stop_load, availability)
    gateway = GatewayProducer(args.gateway, stop_load, availability)
    txn = TxnProducer(args.txn, stop_load, availability)
    pop = PopConsumer(args.nodes, stop_pop, availability)
    offsets = OffsetsConsumer(args.nodes, stop_load, availability)
    kv_writer = KvWriter(args.nodes, stop_load, availability)
    kv_reader = KvReader(args.compactor, stop_load, availability)
    probes = Probes(args.index, addresses)
    workers = [sync, async_, gateway, txn, pop, offsets, kv_writer, kv_reader,
               *(Prober(role, probe, stop_load, availability) for role, probe in (
                   ("index", probes.index_ok), ("etcd", probes.etcd_ok)))]
    chaos = Chaos(docker, args.nodes, roles, addresses, args)
    print(f"[chaos] seed {args.seed}; {args.duration_s:g} s, a kill every {args.kill_every_s:g} s, started again "
          f"after {args.down_s:g} s; roles {','.join(roles)}", flush=True)
    for worker in workers:
        worker.start()
    # the load warms up (a gateway learns the new topics, a compactor the COMPACTION topic) before the window
    if not wait_for(lambda: availability.seen >= set(ROLES), 120):
        print(f"[chaos] no successful call yet of {sorted(set(ROLES) - availability.seen)} after 120 s: counted "
              f"unavailable from the start", flush=True)
    availability.begin()
    chaos.start()
    chaos.join()
    availability.finish()
    stopped_at = now()
    chaos.came_back, chaos.availability = not chaos.down and chaos.crash is None, availability
    print(f"[chaos] {len(chaos.events)} kills; everything back: {chaos.came_back}", flush=True)
    stop_load.wait(5)        # a few seconds of load with everything up
    stop_load.set()
    for worker in workers:
        if worker is not pop:
            worker.join(timeout=TXN_RETRY_S * 2 + 30)

    log = Log(args.nodes)
    leader = wait_for(log.leader, 60)
    wait_for(lambda: in_sync_count(log) == 3, 120)
    wait_for(lambda: set(sync.acked) <= pop.received, DRAIN_TIMEOUT_S)
    stop_pop.set()
    pop.join(timeout=30)

    report: dict = {"seed": args.seed, "duration_s": args.duration_s, "kill_every_s": args.kill_every_s,
                    "down_s": args.down_s, "roles": roles, "kills": chaos.events, "everything_back": chaos.came_back,
                    "drain_s": round(now() - stopped_at, 1)}
    failures: list[str] = []
    if chaos.crash:
        failures.append(f"the chaos loop failed: {chaos.crash}")
    for worker in workers:
        if worker.crash:
            failures.append(f"{worker.name} failed: {worker.crash}")
    if leader is None:
        failures.append("no leader after the chaos")
        print("\n".join(failures))
        return 2

    try:
        report.update(verify(args, log, leader, chaos, workers, probes, failures))
    except grpc.RpcError as exc:
        failures.append(f"the checks after the chaos could not be made: {exc.code().name} {exc.details()}")
        print("\n".join(f"FAILED: {f}" for f in failures))
        return 2
    report["failures"] = failures
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    for failure in failures:
        print(f"FAILED: {failure}")
    print("chaos: " + ("FAILED" if failures else "passed"), flush=True)
    return 1 if failures else 0


def verify(args, log: Log, leader: str, chaos: Chaos, workers: list[Worker], probes: Probes,
           failures: list[str]) -> dict:
    """The checks after the chaos (the module docstring); prints the figures, appends to ``failures``;
    the report's entries."""
    sync, async_, gateway, txn, pop, offsets, kv_writer, kv_reader = workers[:8]
    sync_acked = set(sync.acked)
    # acknowledged messages, on every node
    sync_missing = check_acked(log, sync.acked)
    async_missing = check_acked(log, async_.acked)
    gw_found = {m.uniq_key: m.body for m in pull_all(log, leader, "chaos-gw")}
    gw_lost = sorted(i for i, body in gateway.acked.items() if gw_found.get(i) != body.encode())
    under_reported = sum(1 for (_, replicas, _) in sync.acked.values() if replicas < 2)
    if any(sync_missing.values()):
        failures.append(f"SYNC-acknowledged messages not there: {sync_missing} (of {len(sync.acked)})")
    if gw_lost:
        failures.append(f"{len(gw_lost)} messages acknowledged by a gateway lost, e.g. {gw_lost[:3]}")
    # transactions
    txn_copies: dict[str, int] = {}
    for m in pull_all(log, leader, "chaos-txn"):
        txn_copies[m.body.decode()] = txn_copies.get(m.body.decode(), 0) + 1
    outcome_count: dict[str, int] = {}
    for outcome in txn.outcomes.values():
        outcome_count[outcome] = outcome_count.get(outcome, 0) + 1
    twice = sorted(b for b, c in txn_copies.items() if c > 1)
    txn_lost = sorted(t for t, o in txn.outcomes.items() if o == "TRANSACTION_STATE_COMMITTED"
                      and txn_copies.get("tx-" + t.rsplit("-", 1)[1], 0) == 0)
    rolled_visible = sorted(t for t, o in txn.outcomes.items() if o == "TRANSACTION_STATE_ROLLED_BACK"
                            and txn_copies.get("tx-" + t.rsplit("-", 1)[1], 0) > 0)
    refused = sorted(o for o in txn.outcomes.values() if o.startswith("refused"))
    if twice:
        failures.append(f"{len(twice)} transactions committed twice, e.g. {twice[:3]}")
    if txn_lost:
        failures.append(f"{len(txn_lost)} transactions acknowledged COMMITTED are not there, e.g. {txn_lost[:3]}")
    if rolled_visible:
        failures.append(f"{len(rolled_visible)} rolled-back transactions are visible, e.g. {rolled_visible[:3]}")
    if refused:
        failures.append(f"{len(refused)} transactions refused after their Prepare was acknowledged, e.g. {refused[:2]}")
    # consumers
    if offsets.went_back:
        failures.append(f"{len(offsets.went_back)} consumer offsets went back, e.g. {offsets.went_back[:3]}")
    not_popped = sorted(sync_acked - pop.received)
    if not_popped:
        failures.append(f"{len(not_popped)} SYNC-acknowledged messages never received by the pop group within "
                        f"{DRAIN_TIMEOUT_S:g} s, e.g. {not_popped[:3]}")
    # compactors and indexes
    kv_behind = {}
    for address, stub in zip(kv_reader.addresses, kv_reader.stubs, strict=True):
        def caught_up(stub=stub):
            values = latest(stub)
            return all(values.get(k, -1) >= s for k, s in kv_writer.acked.items())
        if not wait_for(caught_up, 120):
            values = latest(stub, timeout=30)
            kv_behind[address] = sorted(k for k, s in kv_writer.acked.items() if values.get(k, -1) < s)
    if kv_behind:
        failures.append(f"compactors without the last acknowledged value of keys: {kv_behind}")
    by_offset = sorted(sync.acked, key=lambda body: sync.acked[body][0])
    sample = by_offset[-100:] + random.Random(args.seed).sample(by_offset, min(100, len(by_offset)))
    index_missing = {}
    for address, stub in zip(endpoints.split(args.index), probes.indexes, strict=True):
        def found(key: str, stub=stub) -> bool:
            return bool(stub.QueryByKey(index_pb2.QueryByKeyRequest(topic="chaos-sync", key=key), timeout=10).locators)
        if by_offset:
            wait_for(lambda found=found: found(by_offset[-1]), 120)  # the newest: the Index has caught up
        missing = [key for key in sample if not found(key)]
        if missing:
            index_missing[address] = missing[:5] + ([f"... {len(missing)} in all"] if len(missing) > 5 else [])
    if index_missing:
        failures.append(f"keys of SYNC acks the Index does not find: {index_missing}")
    if not chaos.came_back:
        failures.append(f"not back within {BACK_TIMEOUT_S:g} s after the chaos: "
                        f"{[e['service'] for e in chaos.down.values()]}")

    kills: dict[str, int] = {}
    for event in chaos.events:
        kills[event["role"]] = kills.get(event["role"], 0) + 1
    availability = chaos.availability
    report = {
        "load": {"sync_acked": len(sync.acked), "async_acked": len(async_.acked), "gateway_acked": len(gateway.acked),
                 "transactions": outcome_count, "pop_received": len(pop.received), "pop_deliveries": pop.deliveries,
                 "offset_commits": offsets.commits, "kv_writes": kv_writer.seq,
                 "kv_reads": kv_reader.reads},
        "errors": {w.name: w.errors for w in workers},
        "error_samples": {w.name: w.samples for w in workers if w.samples},
        "lost": {"sync": sync_missing, "gateway": len(gw_lost), "async_cut_by_failover": async_missing},
        "sync_acks_under_reported_replicas": under_reported,
        "transactions_committed_twice": len(twice), "transactions_lost": len(txn_lost),
        "transactions_rolled_back_visible": len(rolled_visible),
        "offsets_went_back": len(offsets.went_back), "pop_not_received": len(not_popped),
        "pop_redeliveries": pop.deliveries - len(pop.received), "compacted_reads_went_back": kv_reader.went_back,
        "longest_unavailable_s": {role: {"gap_s": round(gap, 1), "at_s": round(at, 1)}
                                  for role, (gap, at) in availability.worst.items()},
    }

    print(f"chaos: {args.duration_s:g} s, {len(chaos.events)} kills "
          f"({', '.join(f'{r} {c}' for r, c in sorted(kills.items()))}; "
          f"{sum(1 for e in chaos.events if e['leader'])} of the commit log's leader), seed {args.seed}")
    print(f"load: SYNC acks {len(sync.acked)}, ASYNC acks {len(async_.acked)}, gateway sends {len(gateway.acked)}, "
          f"transactions {outcome_count}, pop received {len(pop.received)} ({pop.deliveries} deliveries), "
          f"offset commits {offsets.commits}, compaction writes {kv_writer.seq} / reads {kv_reader.reads}")
    print(f"acknowledged messages lost: SYNC {max(sync_missing.values())} of {len(sync.acked)} (on any node), "
          f"gateway {len(gw_lost)} of {len(gateway.acked)}; ASYNC acks cut by a failover (allowed): "
          f"{max(async_missing.values())} of {len(async_.acked)}; SYNC acks reporting < 2 replicas: {under_reported}")
    print(f"transactions committed twice {len(twice)}, lost {len(txn_lost)}, rolled back but visible "
          f"{len(rolled_visible)}; consumer offsets that went back {len(offsets.went_back)}; SYNC acks the pop "
          f"group never received {len(not_popped)} (redeliveries {pop.deliveries - len(pop.received)}); "
          f"compacted reads that went back (one instance, counted) {kv_reader.went_back}")
    print("longest unavailable per role: " + ", ".join(
        f"{role} {gap:.1f} s (at {at:.0f} s)" for role, (gap, at) in availability.worst.items()))
    return report


if __name__ == "__main__":
    sys.exit(main())
