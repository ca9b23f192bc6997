"""``python -m mqstore_launcher --ha --data-dir ./data-ha`` (``make run-ha``): the launcher's HA mode.

Starts a throwaway etcd on free 127.0.0.1 ports (mqstore_launcher.etcd_local; its data under
``<data-dir>/etcd``), three CommitLog nodes n1, n2, n3 on 50051, 50061, 50071 (automatic failover through
that etcd; SYNC replication with min_insync_replicas 2 by default; topic metadata in one SQLite file they
share, ``<data-dir>/metadata.db``: on one machine that is the shared database PostgreSQL is in a real
deployment), waits until they are healthy and one leads, then the other services with ``--commitlog`` set
to all three nodes (they follow whichever leads), and prints the endpoints. Ctrl-C stops everything, etcd
last. Try a failover: kill the leader's process (``mqstore replication status`` names it) and watch
another node take over within the lease (5 s).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import threading
import time

import grpc

from mqstore import fs
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc
from mqstore_rpc.peers import Peers

from mqstore_launcher import child as launcher_child
from mqstore_launcher import etcd_local, launcher

NODES = (("n1", 50051), ("n2", 50061), ("n3", 50071))
LEADER_TIMEOUT_S = 60.0


def _node_services(etcd_endpoint: str, data_dir: pathlib.Path, embedded: bool) -> list[launcher.Service]:
    base = launcher.SERVICES[0]
    return [launcher.Service(
        dataclasses.replace(base, name=f"commitlog-{node_id}", default_port=port, data_subdir=node_id),
        port, ("--node-id", node_id, "--etcd-endpoints", etcd_endpoint, "--metadata-url",
               f"sqlite:///{data_dir / 'metadata.db'}", "--min-insync-replicas", "2", "--default-replication",
               "SYNC", *launcher.size_flags("commitlog", embedded, launcher.os.environ))) for node_id, port in NODES]


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


def run(data_dir: pathlib.Path, *, tls: bool = False, auth: bool = False, service_logs: str = "files") -> int:
    """As launcher.run, with the commit log as three nodes of a replication group (``tls``/``auth`` and
    ``service_logs`` too: the nodes' logs are <data-dir>/logs/commitlog-n1.log, ...)."""
    stop = threading.Event()
    launcher._install_stop_handlers(stop)
    fs.make_dirs(data_dir / "etcd")
    embedded = launcher.uses_embedded_sizes(data_dir / NODES[0][0])
    auth = auth or launcher.os.environ.get("MQSTORE_AUTH", "").lower() in ("1", "on", "true", "yes")
    secure = launcher.security(data_dir, tls, auth, launcher.internal_token(data_dir))
    etcd = etcd_local.LocalEtcd(data_dir=str(data_dir / "etcd")).start()
    children: list[launcher_child.Child] = []
    status = 0
    try:
        env = {**launcher.os.environ, launcher.TOKEN_ENV: launcher.internal_token(data_dir), **dict(secure.env)}
        nodes = _node_services(etcd.endpoint, data_dir, embedded)
        for service in nodes:
            children.append(launcher.start_child(service, data_dir, env, secure.peers, service_logs))
        for child in children:
            if not child.wait_ready(stop, launcher.READY_TIMEOUT_S):
                return 0 if stop.is_set() else 1
        addresses = [s.address for s in nodes]
        leader = wait_leader(addresses, stop, LEADER_TIMEOUT_S, secure.peers)
        if leader is None:
            print("no commit log node was elected leader", file=sys.stderr)
            return 0 if stop.is_set() else 1
        group = ",".join(addresses)
        for service in launcher.services(embedded=embedded)[1:]:
            if not service.available():
                continue
            args = tuple(a if a != launcher.services()[0].address else group for a in service.extra_args)
            child = launcher.start_child(launcher.Service(service.entry, service.port, args), data_dir, env,
                                         secure.peers, service_logs)
            children.append(child)
            if not child.wait_ready(stop, launcher.READY_TIMEOUT_S):
                return 0 if stop.is_set() else 1
        launcher.ensure_demo_topic(leader, secure.peers)
        leader_port = next(s.port for s in nodes if s.address == leader)
        shown = [launcher.Service(launcher.SERVICES[0], leader_port)] + children[len(nodes):]  # leader: "commitlog"
        print(launcher.banner(shown, data_dir, embedded, secure)
              + f"The commit log nodes: {group} (leader now: {leader}); etcd on {etcd.endpoint}.\n"
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
