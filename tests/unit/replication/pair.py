"""Two MessageStores on real files as a leader and its replica in one process, sharing one SQLite metadata
file, each with its replication node wired as the replication composition wires it; and the copy a replica's
follower makes (ReplicaFollower._apply). For tests of what a replica holds and what it does once it leads."""

from __future__ import annotations

from mqstore.clock import FakeClock
from mqstore.replication import store_ops
from mqstore.replication.config import ReplicationConfig
from mqstore.replication.node import ReplicationNode
from mqstore.store import MessageStore
from mqstore.store_parts import build_store


def open_node(small_config, tmp_path, name: str) -> tuple[MessageStore, ReplicationNode]:
    config = small_config(data_dir=tmp_path / name, metadata_url=f"sqlite:///{tmp_path / 'meta.db'}",
                          preallocate_segments=False)
    store = build_store(config, FakeClock())
    store.start()
    store.topics.reload_on_miss = True  # as the replication composition sets it
    node = ReplicationNode(ReplicationConfig(node_id=name), FakeClock(), config.data_dir / "epochs",
                           log_end=store.log_end, flush_sync=False)
    node.on_promote = store.replica_view.promote
    node.in_sync.on_committed = store.replica_view.advance_visible
    store.gate = node
    return store, node


def copy(leader: MessageStore, replica: MessageStore, visible_to: int | None = None) -> None:
    """The leader's bytes up to its end, then visible up to ``visible_to`` (the committed offset the replica
    last heard of; default the leader's end)."""
    while replica.log_end() < leader.log_end():
        chunk, nxt = store_ops.chunk(leader, replica.log_end(), 1 << 20)
        store_ops.apply(replica, replica.log_end(), chunk, nxt)
    replica.replica_view.visible_to(leader.log_end() if visible_to is None else visible_to)
