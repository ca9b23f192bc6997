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
cluster; SYNC replication with min_insync_replicas 2 by default; topics, users, rules and SDK keys in that
etcd, ``etcd://e1,e2,e3/mqstore/meta`` (:func:`catalog_url`: every node's --metadata-url and every service's
MQSTORE_AUTH_URL; the ``<data-dir>/metadata.db`` and ``auth.db`` of an earlier run are imported once, while
the etcd holds none: :func:`import_earlier_catalogs`), waits until they are healthy and one leads, then the
other services on their ports
(``--index-port``, ``--txn-port``, ... as ``make run``) with ``--commitlog`` set to all three nodes (they
follow whichever leads), the Index, the Transaction service, the Compactor and the gateway twice (:data:`TWICE`:
the second on ``--index-2-port``, ``--txn-2-port``, ``--compactor-2-port`` and ``--gateway-2-port``, by default
10 above the first: 50062, 50063, 50064, 8091; one of them exiting is reported and the other serves on), and
prints the endpoints. The two Transaction services are active and standby on the same etcd
(``--etcd-endpoints``, mqstore.txn.election), the gateways get both (``--txn a,b``); the two compactors elect
the one that runs rounds through the etcd (compactor_service.lease). ``make run-ha RUN_ARGS="..."`` passes
these flags.
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
from mqstore.clock import SystemClock
from mqstore.errors import MqStoreError
from mqstore_rpc import catalogs, etcd_meta
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc
from mqstore_rpc.peers import Peers

from mqstore_launcher import child as launcher_child
from mqstore_launcher import etcd_local, launcher
from mqstore_launcher.child import port_problems

NODE_IDS = ("n1", "n2", "n3")
ETCD_MEMBERS = ("e1", "e2", "e3")
LEADER_TIMEOUT_S = 60.0
# The roles run twice (issue 34): a second instance "<name>-2" on --<name>-2-port, by default
# HA_NODE_PORT_STEP above the first (Index 50062, Transaction 50063, Compactor 50064, gateway 8091), its data
# in <data-dir>/<subdir>-2. Both Transaction services and both compactors get --etcd-endpoints: active and
# standby (mqstore.txn.election, compactor_service.lease).
TWICE = ("index", "txn", "compactor", "gateway")


def second_name(name: str) -> str:
    return f"{name}-2"


def with_second_instances(others: Sequence[launcher.Service],
                          ports: Mapping[str, int] | None = None) -> list[launcher.Service]:
    """``others`` with a second instance right after each role of :data:`TWICE` (same flags, own port and
    data dir); ``ports`` by flag name (``index-2``, ``gateway-2``) moves one."""
    ports = ports or {}
    out: list[launcher.Service] = []
    for service in others:
        out.append(service)
        if service.name in TWICE:
            name = second_name(service.name)
            port = ports.get(name) or service.port + defaults.HA_NODE_PORT_STEP
            if not 0 < port < 65536:
                raise ValueError(f"{name}'s port would be {port}: give it one with --{name}-port")
            entry = dataclasses.replace(service.entry, name=name, default_port=port,
                                        data_subdir=f"{service.entry.data_subdir}-2")
            out.append(launcher.Service(entry, port, service.extra_args))
    return out


def instances_text(services: Sequence[launcher.Service]) -> str:
    """The banner's lines for the roles that run twice: how clients are given both."""
    by_role = {role: [s.address for s in services if s.name in (role, second_name(role))] for role in TWICE}
    index, txn, compactor, gateway = by_role["index"], by_role["txn"], by_role["compactor"], by_role["gateway"]
    lines = []
    if index:
        lines.append(f"Index instances: {','.join(index)} (`export MQSTORE_INDEX_ADDRESS={','.join(index)}`: "
                     f"a query one cannot answer goes to the next).\n")
    if txn:
        lines.append(f"Transaction services (active and standby): {','.join(txn)} (`export MQSTORE_TXN_ADDRESS="
                     f"{','.join(txn)}`: the standby's refusal sends a call to the active one).\n")
    if compactor:
        lines.append(f"Compactors: {','.join(compactor)} (`export MQSTORE_COMPACTOR_ADDRESS={','.join(compactor)}`: "
                     f"either answers reads; rounds run on the one holding the etcd lease).\n")
    if gateway:
        lines.append(f"Gateways: give the RocketMQ clients both, endpoints \"{';'.join(gateway)}\" "
                     f"(sends go on through the other when one stops).\n")
    return "".join(lines)


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


def catalog_url(etcd_endpoints: str) -> str:
    """The group's catalogs (topics; users, rules and SDK keys) in its etcd: every node's --metadata-url, and
    every service's MQSTORE_AUTH_URL unless that is set."""
    return f"etcd://{etcd_endpoints}{defaults.ETCD_CATALOG_PREFIX}"


def import_earlier_catalogs(data_dir: pathlib.Path, etcd_endpoints: str) -> dict[str, int]:
    """An earlier make run-ha kept topics in ``<data-dir>/metadata.db`` (and users in ``<data-dir>/auth.db``):
    copied once into the etcd catalog while it holds none of them (mqstore_rpc.catalogs.import_sql)."""
    urls = {name: f"sqlite:///{data_dir / file}" for name, file in (("metadata_url", "metadata.db"),
                                                                     ("auth_url", "auth.db"))
            if (data_dir / file).exists()}
    if "auth_url" in urls and launcher.os.environ.get("MQSTORE_AUTH_URL"):
        del urls["auth_url"]  # the operator's own auth database: not ours to copy
    if not urls:  # a new data dir: nothing to ask etcd
        return {}
    target = catalog_url(etcd_endpoints)
    topics = etcd_meta.EtcdTopicCatalog(target, SystemClock())
    auth = etcd_meta.EtcdAuthStore(target, SystemClock())
    try:
        if topics.list_topics() or topics.deleting_topics():
            urls.pop("metadata_url", None)
        if auth.users():
            urls.pop("auth_url", None)
    finally:
        topics.close()
        auth.close()
    return catalogs.import_sql(target, SystemClock(), **urls) if urls else {}


def _node_services(etcd_endpoints: str, data_dir: pathlib.Path, embedded: bool,
                   nodes: Sequence[tuple[str, int]] = NODES) -> list[launcher.Service]:
    base = launcher.SERVICES[0]
    return [launcher.Service(
        dataclasses.replace(base, name=f"commitlog-{node_id}", default_port=port, data_subdir=node_id),
        port, ("--node-id", node_id, "--etcd-endpoints", etcd_endpoints, "--metadata-url",
               catalog_url(etcd_endpoints), "--min-insync-replicas", "2", "--default-replication",
               "SYNC", *launcher.size_flags("commitlog", embedded, launcher.os.environ))) for node_id, port in nodes]


def _role_of(name: str) -> str:
    return name.removesuffix("-2") if name.removesuffix("-2") in TWICE else name


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
    others = with_second_instances([s for s in launcher.services(ports, embedded)[1:] if s.available()], ports)
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
        env["MQSTORE_AUTH_URL"] = launcher.os.environ.get("MQSTORE_AUTH_URL") or catalog_url(etcd.endpoints)
        try:
            imported = import_earlier_catalogs(data_dir, etcd.endpoints)
        except MqStoreError as exc:
            print(f"mqstore did not start: the catalogs of an earlier run could not be imported into etcd: {exc}",
                  file=sys.stderr)
            return 1
        if imported:
            print(f"imported the catalogs of an earlier run into etcd: {imported}", flush=True)
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
        txns = [s.address for s in others if _role_of(s.name) == "txn"]
        for service in others:
            args = tuple(group if a == n1 else ",".join(txns) if a in txns else a for a in service.extra_args)
            if _role_of(service.name) in ("txn", "compactor"):  # active and standby through etcd
                args += ("--etcd-endpoints", etcd.endpoints)
            child = launcher.start_child(launcher.Service(service.entry, service.port, args), data_dir, env,
                                         secure.peers, service_logs)
            children.append(child)
            if not child.wait_ready(stop, launcher.READY_TIMEOUT_S):
                return 0 if stop.is_set() else 1
        launcher.ensure_demo_topic(leader, secure.peers)
        leader_port = next(s.port for s in node_services if s.address == leader)
        seconds = {second_name(role) for role in TWICE}
        shown = [launcher.Service(launcher.SERVICES[0], leader_port)] + [  # leader: "commitlog"
            c for c in children[len(nodes):] if c.name not in seconds]
        print(launcher.banner(shown, data_dir, embedded, secure)
              + f"The commit log nodes: {group} (leader now: {leader}).\n"
              f"etcd, a cluster of {len(members)} members (the loss of one changes nothing): {etcd.endpoints} "
              f"(peers {','.join(str(m.peer_port) for m in etcd.members)}; data in {data_dir / 'etcd'}).\n"
              f"`mqstore --address {group} replication status` tells who leads.\n" + instances_text(others),
              flush=True)
        told: set[str] = set()
        while not stop.wait(0.5):
            dead = {c.name: c for c in children if c.process.poll() is not None and not c.name.startswith("commitlog")}
            gone = [c for name, c in dead.items() if _role_of(name) not in TWICE
                    or {_role_of(name), second_name(_role_of(name))} <= set(dead)]
            if gone:
                print(f"{gone[0].name} exited with status {gone[0].process.returncode}; stopping", file=sys.stderr)
                status = 1
                break
            for name in set(dead) - told:  # the other instance of its role still serves
                print(f"{name} exited with status {dead[name].process.returncode}; its other instance still "
                      f"serves", file=sys.stderr, flush=True)
                told.add(name)
    except launcher_child.StartFailed as exc:
        print(f"mqstore did not start: {exc}Stopping the others.", file=sys.stderr)
        status = 1
    finally:
        for child in reversed(children):
            child.stop()
        etcd.stop()
    print("stopped", flush=True)
    return status
