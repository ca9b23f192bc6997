"""``python -m mqstore_rpc.launcher --ha --data-dir ./data-ha`` (``make run-ha``): the launcher's HA mode.

Starts a throwaway etcd on free 127.0.0.1 ports (mqstore_rpc.etcd_local; its data under
``<data-dir>/etcd``), three CommitLog nodes n1, n2, n3 on 50051, 50061, 50071 (automatic failover through
that etcd; SYNC replication with min_insync_replicas 2 by default; topic metadata in one SQLite file they
share, ``<data-dir>/metadata.db``: on one machine that is the shared database PostgreSQL is in a real
deployment), waits until they are healthy and one leads, then the other services with ``--commitlog`` set
to all three nodes (they follow whichever leads), and prints the endpoints. Ctrl-C stops everything, etcd
last. Try a failover: kill the leader's process (``mqstore replication status`` names it) and watch
another node take over within the lease (5 s).
"""

from __future__ import annotations

import pathlib
import sys
import threading
import time

import grpc

from mqstore_rpc import etcd_local, launcher
from mqstore_rpc.gen.mqstore.v1 import replication_pb2, replication_pb2_grpc

NODES = (("n1", 50051), ("n2", 50061), ("n3", 50071))
LEADER_TIMEOUT_S = 60.0


def _node_services(etcd_endpoint: str, data_dir: pathlib.Path) -> list[launcher.Service]:
    base = launcher.SERVICES[0]
    return [launcher.Service(
        launcher.ServiceEntry(f"commitlog-{node_id}", base.module, port, node_id, False, base.address_env),
        port, ("--node-id", node_id, "--etcd-endpoints", etcd_endpoint, "--metadata-url",
               f"sqlite:///{data_dir / 'metadata.db'}", "--min-insync-replicas", "2", "--default-replication",
               "SYNC")) for node_id, port in NODES]


def wait_leader(addresses: list[str], stop: threading.Event, timeout_s: float) -> str | None:
    """The address of the node that leads, once one does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        for address in addresses:
            with grpc.insecure_channel(address) as channel:
                try:
                    state = replication_pb2_grpc.ReplicationStub(channel).GetReplicationState(
                        replication_pb2.GetReplicationStateRequest(), timeout=2)
                except grpc.RpcError:
                    continue  # that node is not answering yet
            if state.role == "LEADER" and not state.fenced:
                return address
        stop.wait(launcher.POLL_INTERVAL_S)
    return None


def run(data_dir: pathlib.Path) -> int:
    stop = threading.Event()
    launcher._install_stop_handlers(stop)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "etcd").mkdir(exist_ok=True)
    etcd = etcd_local.LocalEtcd(data_dir=str(data_dir / "etcd")).start()
    children: list[launcher.Child] = []
    status = 0
    try:
        env = {**launcher.os.environ, launcher.TOKEN_ENV: launcher.internal_token(data_dir)}
        nodes = _node_services(etcd.endpoint, data_dir)
        for service in nodes:
            children.append(launcher.Child(service, data_dir, env))
        for child in children:
            if not child.wait_healthy(stop, launcher.READY_TIMEOUT_S):
                return 0 if stop.is_set() else 1
        addresses = [s.address for s in nodes]
        leader = wait_leader(addresses, stop, LEADER_TIMEOUT_S)
        if leader is None:
            print("no commit log node was elected leader", file=sys.stderr)
            return 0 if stop.is_set() else 1
        group = ",".join(addresses)
        for service in launcher.services()[1:]:
            if not service.available():
                continue
            service = launcher.Service(service.entry, service.port, ("--commitlog", group))
            child = launcher.Child(service, data_dir, env)
            children.append(child)
            if not child.wait_healthy(stop, launcher.READY_TIMEOUT_S):
                return 0 if stop.is_set() else 1
        launcher.ensure_demo_topic(leader)
        print(launcher.banner(children) + f"The commit log nodes: {group} (leader now: {leader}); "
              f"etcd on {etcd.endpoint}.\n`mqstore --address {group} replication status` tells who leads.\n",
              flush=True)
        while not stop.wait(0.5):
            dead = [c for c in children if c.process.poll() is not None and not c.service.name.startswith("commitlog")]
            if dead:
                print(f"{dead[0].service.name} exited with status {dead[0].process.returncode}; stopping",
                      file=sys.stderr)
                status = 1
                break
    finally:
        for child in reversed(children):
            child.stop()
        etcd.stop()
    print("stopped", flush=True)
    return status
