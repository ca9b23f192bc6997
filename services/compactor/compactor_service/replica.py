"""A replica compactor (``--replica-of host:port``): copies a primary compactor's compaction logs instead
of following the commit log (seed 000's replication of compaction logs; RocketMQ's slave pulls the
master's compacted data the same way, reference §6.8).

Thread ``compactor-replica`` (a Duty, every ``interval_ms``): ListQueues on the primary, then per queue
Pull with raw = true from the replica's own next offset (0 on a new replica: the primary's compacted
records, holes and all) until the primary has nothing newer, appending each record as stored (the
same bytes; the replica's append rewrites only PHYSICALOFFSET, to its own position). The replica's
own rounds compact what it holds. The primary being away is a disconnection, retried with backoff.

A topic deleted on the primary (its DELETED event, see mqstore.compaction.projection) is no longer
listed: the replica drops its copy. One deleted and created again is listed with another
``topic_start_physical_offset``: the replica drops its copy of the older topic and copies the new one
from offset 0 (CompactionStore.append of a record of the newer topic would too).
"""

from __future__ import annotations

import threading

import grpc
import structlog
from mqstore.background import Duty
from mqstore.compaction.store import CompactionStore
from mqstore.errors import Unavailable
from mqstore.format.record import PROPERTY_TAGS
from mqstore.format.record_reader import decode
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from mqstore_rpc.peers import Peers
from mqstore_rpc.remote_errors import from_rpc_error

log = structlog.get_logger("compactor_service.replica")
PAGE_MESSAGES = 500
MAX_PAGES_PER_STEP = 10_000


class ReplicaDuty(Duty):
    """Thread-safe state (``_state_lock``): applied count, connected, last error."""

    def __init__(self, store: CompactionStore, primary: str, *, interval_ms: int, rpc_timeout_s: float,
                 peers: Peers | None = None):
        super().__init__("compactor-replica", interval_s=interval_ms / 1000, backoff_max_s=5.0)
        self.store, self.primary, self.rpc_timeout_s = store, primary, rpc_timeout_s
        self._channel = (peers or Peers()).channel(primary, [("grpc.max_receive_message_length", 64 << 20)])
        self._stub = compactor_pb2_grpc.CompactorStub(self._channel)
        self._state_lock = threading.Lock()
        self.applied = 0
        self.connected = False

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            with self._state_lock:
                self.connected = False
            raise from_rpc_error(exc, self.primary) from None

    def step(self) -> None:
        queues = self._call(self._stub.ListQueues, pb.ListQueuesRequest()).queues
        with self._state_lock:
            self.connected = True
        listed = {ref.topic: ref.topic_start_physical_offset for ref in queues}
        for topic in self.store.topics():
            if listed.get(topic, -1) != self.store.incarnation(topic):
                log.info("compactor.replica_topic_dropped", topic=topic, primary_start=listed.get(topic),
                         held_start=self.store.incarnation(topic), why="deleted on the primary (or created again)")
                self.store.drop_topic(topic)
        for ref in queues:
            if self.stopping:
                return
            self._copy(ref.topic, ref.queue_id, ref.topic_start_physical_offset)

    def _copy(self, topic: str, queue_id: int, incarnation: int) -> None:
        if not self.store.hold_topic(topic, incarnation):
            return  # (a newer topic of the name is held: the primary's list is older than what was copied)
        slot = self.store.slot(topic, queue_id, create=True)
        for _ in range(MAX_PAGES_PER_STEP):
            offset = slot.qlog.next_offset()
            page = self._call(self._stub.Pull, pb.CompactedPullRequest(
                topic=topic, queue_id=queue_id, offset=offset, max_messages=PAGE_MESSAGES, raw=True))
            if not page.raw_records:
                return
            for raw in page.raw_records:
                r = decode(raw)
                if r.topic != topic or r.queue_id != queue_id:
                    raise Unavailable(f"the primary {self.primary} answered a record of {r.topic}/{r.queue_id} "
                                      f"for {topic}/{queue_id}")
                if self.store.append(topic, queue_id, raw, r.queue_offset, r.properties.get(PROPERTY_TAGS),
                                     r.store_timestamp_ms, incarnation):
                    with self._state_lock:
                        self.applied += 1
            slot.qlog.sync()  # durable before it is counted as copied
