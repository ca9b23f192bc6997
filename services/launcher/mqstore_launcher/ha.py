"""``python -m mqstore_launcher --ha --data-dir ./data-ha`` (``make run-ha``): the launcher's HA mode.

Checks first that every port it needs can be bound on 127.0.0.1 (as ``make run``: a port in use stops it
before anything starts, naming the flag that moves it). Then it starts an etcd cluster of three members e1,
e2, e3 (mqstore_launcher.etcd_local; :func:`etcd_ports`: e1's client port on ``--etcd-port``, 2379 by
default, its peer port on ``--etcd-peer-port``, by default 1 above; e2 and e3 10 and 20 above those unless
``--etcd-e2-port``, ``--etcd-e2-peer-port``, ... say otherwise; each member's data under
``<data-dir>/etcd/<member>``, kept across runs), three CommitLog nodes n1, n2, n3 (:func:`node_ports`: n1
on ``--commitlog-port``, 50051 by default, n2 and n3 on ``--commitlog-n2-port`` and
``--commitlog-n3-port``, by default 10 and 20 above n1: 50061, 50071), each given every etcd member
(``--etcd-endpoints e1,e2,e3``: the loss of one member changes nothing; automatic failover through that
cluster; SYNC replication with min_insync_replicas 2 by default; topic metadata in one SQLite file they
share, ``<data-dir>/metadata.db``: on one machine that is the shared database PostgreSQL is in a real
deployment), waits until they are healthy and one leads, then the other services on their ports
(``--index-port``, ``--txn-port``, ... as ``make run``) with ``--commitlog`` set to all three nodes (they
follow whichever leads), and prints the endpoints. ``make run-ha RUN_ARGS="..."`` passes these flags.
Ctrl-C stops everything, etcd last. Try a failover: kill the leader's process (``mqstore replication
status`` names it) and watch another node take over within the lease; or kill one etcd member (the banner
names their ports) and watch nothing happen.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import threading
import time
from typing import Mapping, Sequence

import grpc

from mqstore import defaults, fs
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc
from mqstore_rpc.peers import Peers

from mqstore_launcher import child as launcher_child
from mqstore_launcher import etcd_local, launcher
from mqstore_launcher.child import port_problems

NODE_IDS = ("n1", "n2", "n3")
ETCD_MEMBERS = ("e1", "e2", "e3")
LEADER_TIMEOUT_S = 60.0


def node_flag(node_id: str) -> str:
    """The name whose ``--<name>-port`` moves that node: n1 is the commit log's own (``--commitlog-port``)."""
    return "commitlog" if node_id == NODE_IDS[0] else f"commitlog-{node_id}"


def node_ports(ports: Mapping[str, int] | None = None) -> tuple[tuple[str, int], ...]:
    """(node id, port) of n1, n2, n3: ``ports`` by :func:`node_flag` name (``commitlog``, ``commitlog-n2``,
    ``commitlog-n3``); a node not named there is ``HA_NODE_PORT_STEP`` times its rank above n1."""
    ports = ports or {}
    first = ports.get("commitlog") or defaults.COMMITLOG_PORT
    plan = tuple((node_id, ports.get(node_flag(node_id)) or first + rank * defaults.HA_NODE_PORT_STEP)
                 for rank, node_id in enumerate(NODE_IDS))
    for node_id, port in plan:
        if not 0 < port < 65536:
            raise ValueError(f"node {node_id}'s port would be {port}: give it one with --{node_flag(node_id)}-port")
    return plan


NODES = node_ports()  # the default plan: n1 50051, n2 50061, n3 50071


def etcd_flag(member: str, peer: bool = False) -> str:
    """The name whose ``--<name>-port`` moves that member's client (or peer) port: e1's are ``etcd`` and
    ``etcd-peer``, e2's ``etcd-e2`` and ``etcd-e2-peer``, ..."""
    name = "etcd" if member == ETCD_MEMBERS[0] else f"etcd-{member}"
    return f"{name}-peer" if peer else name


def etcd_ports(ports: Mapping[str, int] | None = None) -> tuple[tuple[str, int, int], ...]:
    """(member, client port, peer port) of e1, e2, e3: ``ports`` by :func:`etcd_flag` name; e1's client port
    ``defaults.ETCD_PORT`` and its peer port 1 above its client port when not given; e2 and e3
    ``HA_NODE_PORT_STEP`` times their rank above e1's, each port unless named."""
    ports = ports or {}
    client = ports.get("etcd") or defaults.ETCD_PORT
    peer = ports.get("etcd-peer") or client + 1
    step = defaults.HA_NODE_PORT_STEP
    plan = tuple((member, ports.get(etcd_flag(member)) or client + rank * step,
                  ports.get(etcd_flag(member, peer=True)) or peer + rank * step)
                 for rank, member in enumerate(ETCD_MEMBERS))
    for member, client_port, peer_port in plan:
        for port, is_peer in ((client_port, False), (peer_port, True)):
            if not 0 < port < 65536:
                raise ValueError(f"etcd member {member}'s {'peer' if is_peer else 'client'} port would be {port}: "
                                 f"give it one with --{etcd_flag(member, is_peer)}-port")
    return plan


def wanted_ports(nodes: Sequence[tuple[str, int]], others: Sequence[launcher.Service],
                 members: Sequence[tuple[str, int, int]] = ()) -> list[tuple[str, int]]:
    """What must be free before anything starts: each node's and service's port and its /metrics port, and
    each etcd member's client and peer ports, by the name of the flag that moves it."""
    grpc_ports = [(node_flag(node_id), port) for node_id, port in nodes] + [(s.name, s.port) for s in others]
    etcd = [(etcd_flag(m, peer), port) for m, client, peer_port in members
            for peer, port in ((False, client), (True, peer_port))]
    return grpc_ports + [(f"{name} metrics", port + launcher.METRICS_PORT_OFFSET) for name, port in grpc_ports] + etcd


def _node_services(etcd_endpoints: str, data_dir: pathlib.Path, embedded: bool,
                   nodes: Sequence[tuple[str, int]] = NODES) -> list[launcher.Service]:
    base = launcher.SERVICES[0]
    return [launcher.Service(
        dataclasses.replace(base, name=f"commitlog-{node_id}", default_port=port, data_subdir=node_id),
        port, ("--node-id", node_id, "--etcd-endpoints", etcd_endpoints, "--metadata-url",
               f"sqlite:///{data_dir / 'metadata.db'}", "--min-insync-replicas", "2", "--default-replication",
               "SYNC", *launcher.size_flags("commitlog", embedded, launcher.os.environ))) for node_id, port in nodes]


def wait_leader(addresses: list[str], stop: threading.Event, timeout_s: float,
                peers: Peers = launcher.PLAINTEXT) -> str | None:
    """The address of the node that leads, once one does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        for address in addresses:
            with peers.channel(address) as channel:
                try:
                    state = replication_pb2_grpc.ReplicationStub(channel).GetReplicationState(
                        replication_pb2.GetReplicationStateRequest(), timeout=2)
                except grpc.RpcError:
                    continue  # that node is not answering yet
            if state.role == "LEADER" and not state.fenced:
                return address
        stop.wait(launcher_child.POLL_INTERVAL_S)
    return None


def run(data_dir: pathlib.Path, ports: Mapping[str, int] | None = None, *, tls: bool = False,
        auth: bool = False, service_logs: str = "files") -> int:
    """As launcher.run, with the commit log as three nodes of a replication group (``tls``/``auth`` too):
    ``ports`` by flag name (``commitlog``, ``commitlog-n2``, ``commitlog-n3``, ``index``, ...; the defaults,
    and n2 and n3 derived from n1, for the rest); ``service_logs`` as launcher.run's (the nodes' logs are
    <data-dir>/logs/commitlog-n1.log, ...)."""
    nodes, members = node_ports(ports), etcd_ports(ports)
    embedded = launcher.uses_embedded_sizes(data_dir / nodes[0][0])
    others = [s for s in launcher.services(ports, embedded)[1:] if s.available()]
    if problems := port_problems(wanted_ports(nodes, others, members), make_target="run-ha"):
        print("mqstore did not start anything:\n" + "".join(f"  {p}\n" for p in problems), end="",
              file=sys.stderr)
        return 1
    stop = threading.Event()
    launcher._install_stop_handlers(stop)
    fs.make_dirs(data_dir / "etcd")
    auth = auth or launcher.os.environ.get("MQSTORE_AUTH", "").lower() in ("1", "on", "true", "yes")
    secure = launcher.security(data_dir, tls, auth, launcher.internal_token(data_dir))
    try:
        etcd = etcd_local.LocalEtcdCluster(len(members), data_dir=str(data_dir / "etcd"),
                                           ports=[(client, peer) for _, client, peer in members]).start()
    except RuntimeError as exc:
        print(f"mqstore did not start: the etcd cluster did not come up: {exc}", file=sys.stderr)
        return 1
    children: list[launcher_child.Child] = []
    status = 0
    try:
        env = {**launcher.os.environ, launcher.TOKEN_ENV: launcher.internal_token(data_dir), **dict(secure.env)}
        node_services = _node_services(etcd.endpoints, data_dir, embedded, nodes)
        for service in node_services:
            children.append(launcher.start_child(service, data_dir, env, secure.peers, service_logs))
        for child in children:
            if not child.wait_ready(stop, launcher.READY_TIMEOUT_S):
                return 0 if stop.is_set() else 1
        addresses = [s.address for s in node_services]
        leader = wait_leader(addresses, stop, LEADER_TIMEOUT_S, secure.peers)
        if leader is None:
            print("no commit log node was elected leader", file=sys.stderr)
            return 0 if stop.is_set() else 1
        group = ",".join(addresses)
        n1 = addresses[0]  # launcher.services gives the others --commitlog <n1>: they get the whole group
        for service in others:
            args = tuple(a if a != n1 else group for a in service.extra_args)
            child = launcher.start_child(launcher.Service(service.entry, service.port, args), data_dir, env,
                                         secure.peers, service_logs)
            children.append(child)
            if not child.wait_ready(stop, launcher.READY_TIMEOUT_S):
                return 0 if stop.is_set() else 1
        launcher.ensure_demo_topic(leader, secure.peers)
        leader_port = next(s.port for s in node_services if s.address == leader)
        shown = [launcher.Service(launcher.SERVICES[0], leader_port)] + children[len(nodes):]  # leader: "commitlog"
        print(launcher.banner(shown, data_dir, embedded, secure)
              + f"The commit log nodes: {group} (leader now: {leader}).\n"
              f"etcd, a cluster of {len(members)} members (the loss of one changes nothing): {etcd.endpoints} "
              f"(peers {','.join(str(m.peer_port) for m in etcd.members)}; data in {data_dir / 'etcd'}).\n"
              f"`mqstore --address {group} replication status` tells who leads.\n", flush=True)
        while not stop.wait(0.5):
            dead = [c for c in children if c.process.poll() is not None and not c.name.startswith("commitlog")]
            if dead:
                print(f"{dead[0].name} exited with status {dead[0].process.returncode}; stopping", file=sys.stderr)
                status = 1
                break
    except launcher_child.StartFailed as exc:
        print(f"mqstore did not start: {exc}Stopping the others.", file=sys.stderr)
        status = 1
    finally:
        for child in reversed(children):
            child.stop()
        etcd.stop()
    print("stopped", flush=True)
    return status
