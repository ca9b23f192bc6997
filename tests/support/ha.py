"""A replication group of real CommitLog processes on 127.0.0.1 with a throwaway etcd (mqstore_launcher.etcd_local),
for the failover tests: start, kill -9, restart nodes; find the leader; append and read through it. The etcd
is one member (:func:`etcd_or_skip`) or a cluster of three (:func:`etcd_cluster_or_skip`, whose members can be
killed, paused and restarted one at a time; the group is then given every member)."""

from __future__ import annotations

import contextlib
import pathlib
import time
from typing import Iterator

import grpc
import pytest

from mqstore import defaults
from mqstore_launcher import etcd_local
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2 as pb
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2_grpc, replication_pb2, replication_pb2_grpc
from tests.support.processes import ServiceProcess, commitlog

RPC_TIMEOUT_S = 5


def etcd_or_skip() -> etcd_local.LocalEtcd:
    if etcd_local.find_binary() is None:
        pytest.skip(f"no etcd server binary: {etcd_local.INSTALL_HINT} (.ci/run and `make setup-ha` install it)")
    return etcd_local.LocalEtcd().start()


@contextlib.contextmanager
def group_on_etcd(root: pathlib.Path, *extra: str, size: int = 3) -> Iterator["Group"]:
    """A Group of ``size`` nodes (``extra``: their flags) on a throwaway one-member etcd; every process stopped
    at the end (the failover tests' ``group`` fixture)."""
    etcd = etcd_or_skip()
    group = Group(root, etcd.endpoint, size, *extra)
    try:
        yield group
    finally:
        group.stop()
        etcd.stop()


def etcd_cluster_or_skip(size: int = 3) -> etcd_local.LocalEtcdCluster:
    if etcd_local.find_binary() is None:
        pytest.skip(f"no etcd server binary: {etcd_local.INSTALL_HINT} (.ci/run and `make setup-ha` install it)")
    return etcd_local.LocalEtcdCluster(size).start()


class Group:
    """Nodes n1..nN, each a CommitLog process, their topics in the etcd (:attr:`metadata_url`); ``stop()`` ends
    every process this group started."""

    def __init__(self, root: pathlib.Path, etcd_endpoint: str, size: int = 3, *extra: str,
                 env: dict[str, str] | None = None):
        self.root, self.etcd_endpoint, self.extra, self.env = root, etcd_endpoint, extra, env
        self.procs: dict[str, ServiceProcess | None] = {f"n{i}": None for i in range(1, size + 1)}
        self.channels: dict[str, grpc.Channel] = {}

    @property
    def metadata_url(self) -> str:
        """The group's catalogs (topics; users, rules, SDK keys): in its etcd, as an HA group's must be (``extra``
        may give others)."""
        return f"etcd://{self.etcd_endpoint}{defaults.ETCD_CATALOG_PREFIX}"

    def start(self, node_id: str) -> ServiceProcess:
        proc = commitlog(self.root / node_id, "--node-id", node_id, "--etcd-endpoints", self.etcd_endpoint,
                         "--metadata-url", self.metadata_url, "--auth-url", self.metadata_url,
                         "--segment-size-bytes", "64KiB", "--preallocate-segments", "false", *self.extra,
                         env=self.env).started()
        self.procs[node_id] = proc
        old = self.channels.pop(node_id, None)
        if old is not None:
            old.close()
        self.channels[node_id] = grpc.insecure_channel(proc.address)
        return proc

    def start_all(self) -> None:
        for node_id in self.procs:
            self.start(node_id)

    def kill9(self, node_id: str) -> None:
        self.procs[node_id].kill9()
        self.procs[node_id].stop()
        self.procs[node_id] = None

    def stop(self) -> None:
        for node_id, proc in self.procs.items():
            if proc is not None:
                proc.stop()
                self.procs[node_id] = None
        for channel in self.channels.values():
            channel.close()

    def log(self, node_id: str) -> commitlog_pb2_grpc.CommitLogStub:
        return commitlog_pb2_grpc.CommitLogStub(self.channels[node_id])

    def state(self, node_id: str) -> replication_pb2.ReplicationState | None:
        if self.procs.get(node_id) is None:
            return None
        try:
            return replication_pb2_grpc.ReplicationStub(self.channels[node_id]).GetReplicationState(
                replication_pb2.GetReplicationStateRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            return None

    def leader(self, above_epoch: int = 0) -> tuple[str, int] | None:
        """(node id, epoch) of a live node that says it leads an epoch above ``above_epoch``, unfenced."""
        for node_id in self.procs:
            state = self.state(node_id)
            if state is not None and state.role == "LEADER" and state.epoch > above_epoch and not state.fenced:
                return node_id, state.epoch
        return None

    def wait_leader(self, above_epoch: int = 0, timeout_s: float = 30) -> tuple[str, int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.leader(above_epoch)
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no leader above epoch {above_epoch} within {timeout_s} s: "
                             f"{ {n: self.state(n) for n in self.procs} }")

    def append(self, node_id: str, topic: str, bodies: list[bytes], mode=pb.REPLICATION_MODE_SYNC):
        from mqstore_rpc.gen.mqstore.v1 import common_pb2
        request = pb.AppendRequest(topic=topic, messages=[common_pb2.MessageInput(body=b) for b in bodies],
                                   replication=mode)
        return self.log(node_id).Append(request, timeout=RPC_TIMEOUT_S).results


FENCED = "may have lost its leadership lease"  # ReplicationNode.check_writable: refused before anything is written


def append_unfenced(stub: commitlog_pb2_grpc.CommitLogStub, request: pb.AppendRequest, timeout_s: float = 60):
    """``stub.Append(request)``, sent again while the leader refuses it because its lease renewal is late (on a
    loaded machine etcd or the renewing thread may be starved past the lease): that refusal comes before the
    write (check_writable), so sending again cannot append twice. Any other error is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return stub.Append(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or FENCED not in (exc.details() or "") \
                    or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
