"""The leader's side of one replication stream: the handshake, then the log's bytes from the agreed
offset, and the replica's acknowledgements into the in-sync set.

Handshake: the replica's hello carries its log's [min, end) and epoch history. The leader answers
``truncate_to`` = divergence.truncation_point(...) (the replica cuts anything above it) and sends from
there. A replica with an empty log starts at the leader's first segment (``start_empty``). A replica
whose point lies below the leader's first offset (retention removed what it lacks) or whose segment
size differs is refused with FailedPrecondition: it cannot become byte-identical. When the log below the
leader's first offset is only in the object storage tier (its local retention), an empty replica, or one whose
point lies below that offset, starts from the tier instead (``_from_tier``, mqstore.replication.tier_join): at the
leader's first segment, with what it needs to read the rest from the tier; refused when it does not read it.

Coalescing (``replication_linger_us``): a stream that has sent everything and is woken by new bytes waits
up to that long before reading them, while a SYNC append waits and lingering pays: the last data message gathered
the growth of two appends or more, or it is the PROBE_EVERY-th data message since the last linger and two
SYNC appends or more wait (a probe; with one, a lone producer's, there is nothing to gather: requiring two
for every linger, not only a probe, cut the lingers under 16 producers by two thirds, bench/README.md).
A linger ends early once as many SYNC appends wait as waited at once lately (this second or the last,
``InSyncSet.waiting_and_peak``): every producer seen has appended, there is nothing more to gather; so the
setting (3 ms) bounds a linger under many producers, where it gathers, and few producers wait little more
than the next one's append.
Under concurrent producers the appends of that moment so go in one data message and come back in one
acknowledgement (each a gRPC message for the leader's loop and the replica to handle: about a third as many
under 16 producers, bench/README.md *The replication benchmark*); a lone producer's append is sent at once,
no probe delays it. Only timing changes: an append is still acknowledged once the in-sync set holds it.

Pacing (the same setting): while no SYNC append waits, a stream woken by new bytes less than
``replication_linger_us`` after its last data message of bytes waits first for the end of the clock's slot of that
length it was woken in (``_pace_s``), ended early once a SYNC append waits (the rule above then decides). Under a
steady ASYNC load a replica so gets at most one data message a slot, each gathering the appends of that while:
without it every ASYNC append, or two, went in a data message and an acknowledgement of its own (about twice as many
as paced), and a group of three replicating ASYNC carried fewer appends a second than one replicating SYNC: under 16
producers 85,500 msg/s on average against 96,900, paced 100,000 (bench/README.md, *Pacing ASYNC replication*). A
stream that was quiet longer than that sends at once: a lone producer's append is never paced. An ASYNC append's
acknowledgement does not wait for replicas; what pacing delays, by a linger at most, is a replica's copy and so what
readers may see of it (the committed offset). A SYNC append ends a pause when the stream is next woken, at its own
write on the loop; on a handler thread it may be written just as the stream looks, and then waits out the pause, a
linger at most.

Thread-safety: one session per stream; ``data_async()`` runs on the grpc.aio port's loop (a test drives it
on its thread: waits.blocking_iter), ``ack()`` on the thread (or task) reading the replica's messages; both
only touch the thread-safe store and in-sync set.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

import structlog

from mqstore import waits
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.replication import divergence, store_ops
from mqstore.replication.messages import Ack, Hello, LogData, Welcome
from mqstore.replication.node import ReplicationNode
from mqstore.replication import tier_join

log = structlog.get_logger()
CATCH_UP_BYTES = 16 << 20  # data_async: further behind the log's end than this, a chunk is read on a thread
PROBE_EVERY = 16  # a stream whose lingers gather nothing tries one again after this many data messages


class ReplicaSession:
    _gathered = 0    # appends (log growths) in the last data message sent after a wait
    _unlingered = 0  # data messages since the last linger
    sent = 0         # data messages sent, lingers and acks read, logged at the stream's end
    lingered = 0
    paced = 0
    acks = 0
    _sent_at_s: float | None = None  # when the last data message of bytes went (the clock's monotonic seconds)
    generation = 0   # the in-sync set's number for this stream (InSyncSet.connected), given when it opens
    def __init__(self, store, node: ReplicationNode, hello: Hello):
        if not hello.replica_id:
            raise InvalidArgument("hello.replica_id: name the replica (its setting node_id)")
        if hello.replica_id == node.config.node_id:
            raise InvalidArgument(f"hello.replica_id {hello.replica_id!r} is the leader's own id; every node of a "
                                  f"group needs its own node_id")
        node.check_writable()  # NotLeader names the leader for a replica that asked the wrong node
        self.store = store
        self.node = node
        self.hello = hello
        self.welcome = self._welcome()
        self.position = self.welcome.truncate_to
        self.epoch = self.welcome.epoch

    def _welcome(self) -> Welcome:
        hello, store = self.hello, self.store
        size = store.config.segment_size_bytes
        if hello.segment_size_bytes != size:
            raise FailedPrecondition(f"replica {hello.replica_id} has segments of {hello.segment_size_bytes} "
                                     f"bytes, the leader of {size}: set segment_size_bytes alike on every node")
        lead = self.node.leadership
        leader_end, leader_min = store.log_end(), store.log_min()
        tier = store.tier_join
        tier_min = tier.logical_min() if tier is not None else leader_min
        empty = hello.end_offset == hello.min_offset
        point = leader_min if empty else \
            divergence.truncation_point(hello.history, hello.end_offset, self.node.history, leader_end)
        if tier_min < leader_min and (empty or point < leader_min):
            return self._from_tier(leader_min, tier_min)
        if empty:  # copy from the leader's first segment
            return Welcome(lead.leader_id, lead.epoch, leader_min, self.node.history, start_empty=True)
        if point < leader_min or point < hello.min_offset:
            raise FailedPrecondition(
                f"replica {hello.replica_id} shares the log with the leader only up to physical offset {point}, "
                f"but the leader holds [{leader_min}, {leader_end}) and the replica [{hello.min_offset}, "
                f"{hello.end_offset}): it cannot catch up. Move the replica's data directory aside and start it "
                f"empty: it then copies the leader's log from {leader_min}")
        if point < hello.end_offset:
            log.warning("replication.replica_diverged", replica=hello.replica_id, truncate_to=point,
                        replica_end=hello.end_offset, bytes_to_cut=hello.end_offset - point)
        return Welcome(lead.leader_id, lead.epoch, point, self.node.history)

    def _from_tier(self, leader_min: int, tier_min: int) -> Welcome:
        """The log below the leader's local start is only in the tier, down to ``tier_min``: a replica that needs
        it starts at the local start and reads the rest from the tier (mqstore.replication.tier_join), or is refused
        when it does not read the tier (nothing copied from the leader could serve that part)."""
        hello, lead = self.hello, self.node.leadership
        if not hello.reads_tier:
            raise FailedPrecondition(
                f"replica {hello.replica_id} does not read the object storage tier, and the leader's log below "
                f"physical offset {leader_min} (from {tier_min}) is only there: start the replica with the "
                f"leader's {tier_join.FLAGS} (a node of an earlier version cannot join this group)")
        queues = self.store.tier_join.queue_starts(leader_min, paged=hello.pages_welcome)
        log.info("replication.replica_from_tier", replica=hello.replica_id, log_start=leader_min, tier_min=tier_min,
                 queues=len(queues), replica_min=hello.min_offset, replica_end=hello.end_offset)
        uploads = self.store.tier_join.uploads(entry_bytes=sum(len(q.entries) for q in queues))
        return Welcome(lead.leader_id, lead.epoch, leader_min, self.node.history, start_empty=True,
                       tier_min=tier_min, queues=queues, tier_uploads=uploads)

    async def data_async(self, is_active: Callable[[], bool] = lambda: True) -> AsyncIterator[LogData]:
        """Log bytes from the agreed offset, in order; a heartbeat (no bytes) when idle, while ``is_active()``
        and this node leads. The one version (mqstore.waits): on an event loop (the stream's end cancels
        it) the log's growth is awaited there, so no thread is handed each message, and a replica more than
        CATCH_UP_BYTES behind the log's end reads from a thread: those bytes may have left the page cache,
        and a read from the disk must not hold the loop (every other call of the port waits on it). Off a
        loop (tests) waits.blocking_iter runs each step on the taking thread."""
        growth, heartbeat_s = self.node.growth, self.node.config.replication_heartbeat_ms / 1000
        self._connected()
        try:
            while is_active() and self._leading():
                seen = growth.version()
                if self.store.log_end() - self.position > CATCH_UP_BYTES:
                    yield self._sent(*await waits.off_loop(self._chunk))
                    continue
                chunk, nxt = self._chunk()
                if nxt == self.position:
                    await growth.wait(seen, heartbeat_s)
                    if linger_s := self._linger_s():
                        await self._gather(growth, linger_s, self._all_wait)
                    elif growth.version() != seen and (pace_s := self._pace_s()):
                        self.paced += 1
                        await self._gather(growth, pace_s, self.node.in_sync.waiting)
                    chunk, nxt = self._chunk()
                    self._gathered = growth.version() - seen
                yield self._sent(chunk, nxt)
        finally:
            self._disconnected()

    def _linger_s(self) -> float:
        """How long a woken stream waits before reading the new bytes (the module docstring's coalescing)."""
        linger_us = self.node.config.replication_linger_us
        waiting = self.node.in_sync.waiting() if linger_us else 0
        if not waiting:
            return 0.0
        self._unlingered += 1
        if self._gathered < 2 and (self._unlingered < PROBE_EVERY or waiting < 2):
            return 0.0  # a probe only while two SYNC appends or more wait: never a lone producer's
        self._unlingered = 0
        self.lingered += 1
        return linger_us / 1e6

    async def _gather(self, growth, wait_s: float, enough: Callable[[], object]) -> None:
        """Up to ``wait_s`` for more appends (a linger or a pause), ended early once ``enough()``: as many SYNC
        appends wait as waited at once lately for a linger (every producer seen has appended: nothing more to
        gather), any SYNC append for a pause (the SYNC rule takes over: its append goes now)."""
        clock = self.node.clock
        deadline = clock.monotonic_s() + wait_s
        while not enough() and (left := deadline - clock.monotonic_s()) > 0:
            await growth.wait(growth.version(), left)

    def _all_wait(self) -> bool:
        waiting, peak = self.node.in_sync.waiting_and_peak()
        return waiting >= peak

    def _pace_s(self) -> float:
        """How long a woken stream waits before reading the new bytes while no SYNC append waits (the module
        docstring's pacing): when its last data message of bytes went less than ``replication_linger_us`` ago,
        until the end of the clock's slot of that length it is woken in. Slots rather than a linger from each
        stream's own send: every replica's stream woken by one append reads at the same slot's end, the same
        range, and the second sends the first's bytes (DataMessages); paced from their own sends, two streams
        drifted apart and a third of the ranges were built twice."""
        linger_us = self.node.config.replication_linger_us
        if not linger_us or self._sent_at_s is None or self.node.in_sync.waiting():
            return 0.0
        slot_s, now = linger_us / 1e6, self.node.clock.monotonic_s()
        if now - self._sent_at_s >= slot_s:
            return 0.0
        return (now // slot_s + 1) * slot_s - now

    def _leading(self) -> bool:
        return self.node.is_leader and self.node.leadership.epoch == self.epoch

    def _chunk(self) -> tuple[bytes, int]:
        return store_ops.chunk(self.store, self.position, self.node.config.replication_chunk_bytes)

    def _sent(self, chunk: bytes, nxt: int) -> LogData:
        data = LogData(self.position, chunk, nxt, self.store.log_end(), self.node.in_sync.committed())
        if nxt != self.position:
            self._sent_at_s = self.node.clock.monotonic_s()
        self.position = nxt
        self.sent += 1
        return data

    def _connected(self) -> None:
        # Before the first data message the position is the welcome's truncate_to: what the replica holds.
        self.generation = self.node.in_sync.connected(self.hello.replica_id, self.hello.address, self.position)
        log.info("replication.replica_connected", replica=self.hello.replica_id, address=self.hello.address,
                 from_offset=self.position, epoch=self.epoch)

    def _disconnected(self) -> None:
        self.node.in_sync.disconnected(self.hello.replica_id, self.generation)
        log.info("replication.replica_disconnected", replica=self.hello.replica_id, at_offset=self.position,
                 data_messages=self.sent, lingered=self.lingered, paced=self.paced, acks=self.acks)

    def ack(self, ack: Ack) -> None:
        """Into the in-sync set, while this stream's leadership lasts: an acknowledgement read after it ended
        (this node may lead again by then, from a log cut back since) is of bytes of that leadership. The set
        ignores it once the replica has opened a newer stream (the generation)."""
        self.acks += 1
        if self._leading():
            self.node.in_sync.on_ack(self.hello.replica_id, ack.written_offset, ack.flushed_offset, self.generation)
