"""A replica compactor (``--replica-of host:port``): copies a primary compactor's compaction logs instead
of following the commit log. What is kept, dropped and appended is mqstore.compaction.replica's
(ReplicaCopy); this module is its transport.

Thread ``compactor-replica`` (a Duty, every ``interval_ms``): ListQueues on the primary (ReplicaCopy.
reconcile), then per queue Pull with raw = true, a page of PAGE_MESSAGES at a time (ReplicaCopy.copy). The
replica's own rounds compact what it holds. The primary being away is a disconnection, retried with
backoff.
"""

from __future__ import annotations

import functools
import threading
from typing import Sequence

import grpc
import structlog
from mqstore import defaults
from mqstore.background import Duty
from mqstore.compaction.replica import ReplicaCopy
from mqstore.compaction.store import CompactionStore
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc
from mqstore_rpc.peers import Peers
from mqstore_rpc.remote_errors import from_rpc_error

log = structlog.get_logger("compactor_service.replica")
PAGE_MESSAGES = 500


class ReplicaDuty(Duty):
    """Thread-safe state (``_state_lock``): connected, last error; the applied count is ReplicaCopy's."""

    def __init__(self, store: CompactionStore, primary: str, *, interval_ms: int, rpc_timeout_s: float,
                 peers: Peers | None = None):
        super().__init__("compactor-replica", interval_s=interval_ms / 1000, backoff_max_s=5.0)
        self.store, self.primary, self.rpc_timeout_s = store, primary, rpc_timeout_s
        self._copy = ReplicaCopy(store, primary)
        self._channel = (peers or Peers()).channel(
            primary, [("grpc.max_receive_message_length", defaults.MAX_MESSAGE_BYTES)])
        self._stub = compactor_pb2_grpc.CompactorStub(self._channel)
        self._state_lock = threading.Lock()
        self.connected = False

    @property
    def applied(self) -> int:
        return self._copy.applied

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
        self._copy.reconcile({ref.topic: ref.topic_start_physical_offset for ref in queues})
        for ref in queues:
            if self.stopping:
                return
            self._copy.copy(ref.topic, ref.queue_id, ref.topic_start_physical_offset,
                            functools.partial(self._pull, ref.topic, ref.queue_id))

    def _pull(self, topic: str, queue_id: int, offset: int) -> Sequence[bytes]:
        """The primary's raw records of the queue from ``offset``, a page."""
        return self._call(self._stub.Pull, pb.CompactedPullRequest(
            topic=topic, queue_id=queue_id, offset=offset, max_messages=PAGE_MESSAGES, raw=True)).raw_records
