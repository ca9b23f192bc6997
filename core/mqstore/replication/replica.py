"""The replica's side: a background duty ("replica-follower") that copies its leader's log.

Each step opens a stream to the leader the node knows (``node.leadership.leader_address``), says hello
(log range, epoch history), and obeys the welcome: with ``start_empty`` it starts a new log at the
leader's first segment (keeping ``.broken`` copies of whatever it held), and with ``tier_min`` it reads
everything below from the object storage tier (mqstore.replication.tier_join: the queues' starts and the uploads the
welcome carries, taken in durably before the first byte of the tail); otherwise it truncates its log
to ``truncate_to`` when it is longer (``.broken`` copies of the bytes cut, logged as
``replication.truncated``). Then, for each data message: record the leader's epochs for the bytes it
is about to hold (durably, first), write the bytes at the same physical offsets (the store dispatches
them to its own consume queues; under SYNC flush after its fsync), and acknowledge its written and
flushed offsets on the same stream. Heartbeats are acknowledged too (the leader measures lag by them).

  what happens                              what the follower does
  ----------------------------------------- ---------------------------------------------------------
  no leader known                           wait (a backoff) for the controller to name one
  the leader is away (Unavailable)          reconnect with backoff (at most replica_backoff_max_ms)
  the node asked is not the leader          NotLeader names the leader: follow it (static group) or
  (NotLeader)                               wait for the controller; reconnect
  the stream's offsets disagree with ours   FailedPrecondition: reconnect (a new handshake decides)
  the node became leader (election)         the stream is cancelled and the duty idles
  the controller names another leader       the stream is cancelled, a backoff cut short: connect there now

The consume queues (what the replica's readers see) follow the leader's committed offset, which each
message carries: dispatched at once for a heartbeat (the stream is idle), else at most every SHOW_EVERY_S
unless SHOW_BYTES wait, so that under a stream of data one dispatch covers several data messages (each
walks the records and writes every queue they touch: ~0.4 ms a data message when each had its own, issue
34). A reader on a replica so sees records up to SHOW_EVERY_S later while data flows; after the last data
message of a burst, at the next heartbeat (replication_heartbeat_ms: the heartbeat shows at once), the bound
a record waiting for the committed offset that covers it already had; a promotion shows
everything copied as before (ReplicaView.promote).

Every message from the leader (heartbeats too) is noted (``node.heard_from_leader``): a leader silent for
three heartbeats makes the controller read the leader key every ``fast_poll_ms`` (controller.py).

Thread-safety: runs on its own thread; ``leader_changed()`` (any thread) cancels the open stream.
"""

from __future__ import annotations

import threading
from typing import Iterator, Protocol

import structlog

from mqstore.background import Duty
from mqstore.errors import FailedPrecondition, NotLeader, Unavailable
from mqstore.replication import divergence, store_ops
from mqstore.replication.messages import Ack, Hello, LogData, Welcome
from mqstore.replication.node import LEADER, ReplicationNode
from mqstore.replication import tier_join

log = structlog.get_logger()
SHOW_EVERY_S = 0.005    # under a stream of data messages, the consume queues follow at most this often...
SHOW_BYTES = 4 << 20    # ...unless this much committed log waits for them


class ReplicationStream(Protocol):
    welcome: Welcome

    def __iter__(self) -> Iterator[LogData]: ...

    def ack(self, ack: Ack) -> None: ...

    def cancel(self) -> None: ...


class LeaderLink(Protocol):
    """Opens replication streams (mqstore_rpc over gRPC; a fake in tests). Thread-safe."""

    def open(self, address: str, hello: Hello) -> ReplicationStream: ...

    def cancel_opening(self) -> None:
        """End the opens still waiting for the leader's welcome (they raise Unavailable)."""
        ...

    def problem(self) -> str:
        """"" while healthy; why not (a stream's helper died of a bug), for the follower's health."""
        ...


class ReplicaFollower(Duty):
    def __init__(self, store, node: ReplicationNode, link: LeaderLink):
        backoff_max_s = node.config.replica_backoff_max_ms / 1000
        super().__init__("replica-follower", interval_s=0.0, backoff_initial_s=min(0.05, backoff_max_s),
                         backoff_max_s=backoff_max_s)
        self.wake_ends_backoff = True  # leader_changed(): connect to the new leader now, not after the backoff
        self.store = store
        self.node = node
        self.link = link
        self._stream_lock = threading.Lock()
        self._stream: ReplicationStream | None = None
        self._shown_s = float("-inf")  # when the consume queues last followed the committed offset
        self._shown_to = 0             # the committed offset they were given then

    def leader_changed(self) -> None:
        with self._stream_lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()
        if self.link is not None:
            self.link.cancel_opening()  # a frozen leader never answers the hello
        self.wake()

    def on_stop(self) -> None:
        self.leader_changed()

    def problem(self) -> str:
        return super().problem() or self.link.problem()

    def step(self) -> None:
        lead = self.node.leadership
        if lead.role == LEADER or not lead.leader_address:
            self.sleep(0.05)
            return
        try:
            stream = self.link.open(lead.leader_address, self.hello())
        except NotLeader as exc:
            if exc.leader_address and self.node.config.replica_of:
                self.node.become_replica("", exc.leader_address, lead.epoch)
            raise
        with self._stream_lock:
            self._stream = stream
        if self.stopping or self.node.leadership != lead:
            stream.cancel()
        try:
            self._follow(stream)
        finally:
            stream.cancel()
            with self._stream_lock:
                self._stream = None

    def hello(self) -> Hello:
        return Hello(self.node.config.node_id, self.node.config.advertised_address, self.store.log_end(),
                     self.store.log_min(), self.node.history, self.store.config.segment_size_bytes,
                     reads_tier=self.store.tier_join is not None, pages_welcome=True)

    def _follow(self, stream: ReplicationStream) -> None:
        with self.node.apply_lock:
            if self.node.is_leader:
                return
            self._handshake(stream.welcome)
        self.node.heard_from_leader()
        received = False
        for data in stream:
            self.node.heard_from_leader()
            with self.node.apply_lock:
                if self.node.is_leader:
                    return  # elected meanwhile: not one more byte of the old leader's
                self._apply(stream, data)
            received = True
            if self.stopping:
                return
        if not received and not self.stopping:
            raise Unavailable("the replication stream ended before its first message (is the leader stopping?)")

    def _handshake(self, welcome: Welcome) -> None:
        lead = self.node.leadership
        if (lead.leader_id, lead.epoch) != (welcome.leader_id, welcome.epoch) and lead.leader_address:
            self.node.become_replica(welcome.leader_id, lead.leader_address, welcome.epoch)
        if welcome.start_empty and welcome.tier_min is not None:  # the log below is only in the tier
            if self.store.tier_join is None:
                raise FailedPrecondition(f"the leader starts this replica from the object storage tier, which it "
                                         f"does not read: set {tier_join.FLAGS}")
            # what it shares with the leader's log (the leader's bytes, in the tier below its local start) needs no
            # .broken copy: a replica left far behind may hold much of it
            shared = divergence.truncation_point(self.node.history, self.store.log_end(), welcome.history, 1 << 62)
            store_ops.restart_at(self.store, welcome.truncate_to, keep_from=shared)
            self.node.truncated(welcome.truncate_to)
            self.store.tier_join.join(welcome.truncate_to, welcome.tier_min, welcome.queues, welcome.tier_uploads)
        elif welcome.start_empty:
            if self.store.log_end() != welcome.truncate_to or self.store.log_min() != welcome.truncate_to:
                store_ops.restart_at(self.store, welcome.truncate_to)
                self.node.truncated(welcome.truncate_to)
        elif self.store.log_end() > welcome.truncate_to:
            store_ops.truncate(self.store, welcome.truncate_to)
            self.node.truncated(welcome.truncate_to)
        self.node.record_epochs(welcome.history, self.store.log_end())
        log.info("replication.following", leader=welcome.leader_id, epoch=welcome.epoch,
                 from_offset=self.store.log_end())

    def _apply(self, stream: ReplicationStream, data: LogData) -> None:
        if data.offset != self.store.log_end():
            raise Unavailable(f"the leader sent bytes at {data.offset} but this log ends at "
                              f"{self.store.log_end()}; reconnecting for a new handshake")
        if data.next_offset > data.offset:
            self.node.record_epochs(stream.welcome.history, data.next_offset)
            store_ops.apply(self.store, data.offset, data.data, data.next_offset)
        stream.ack(Ack(self.store.log_end(), self.store.flushed_offset()))
        self._show(data)

    def _show(self, data: LogData) -> None:
        """The consume queues up to the leader's committed offset: for a heartbeat at once, else batched (the
        module docstring)."""
        now = self.node.clock.monotonic_s()
        if (data.next_offset == data.offset or now - self._shown_s >= SHOW_EVERY_S
                or data.committed_offset - self._shown_to >= SHOW_BYTES):
            self._shown_s, self._shown_to = now, data.committed_offset
            self.store.replica_view.visible_to(data.committed_offset)
