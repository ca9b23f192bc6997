"""A replica that catches up from the object storage tier plus its leader's local tail (issue 36, item 3): with
the tier's local retention on, the leader's log below its local start is only in the tier, and a replica that
joins empty (or so far behind that the leader no longer holds where it stopped) starts its own log at the
leader's local start and copies only the local tail.

What it needs to serve everything below from the tier, and where it comes from:

  what                                   from
  -------------------------------------- --------------------------------------------------------------------
  the ledger (which object holds which   the welcome (``tier_uploads``: the leader's FINISHED records), so the
  segment or queue file)                 replica reads the tier at once; and the local tail it copies: the
                                         leader re-appends the latest FINISHED record of every live tiered
                                         segment and queue file before the part of the log holding it goes
                                         (mqstore.tier.local_retention), so the records, with the epochs that
                                         wrote them, are all in the tail too (what a restart reads)
  the logical log's start                the welcome (``tier_min``: the leader's LocalRetention.logical_min);
                                         the replica's own local retention moves it on from there
  each consume queue's entries           the welcome (``queues``, :class:`QueueStart`): the queue's minimum and
  below the tail                         the leader's entries from its first local file of the queue up to its
                                         first record in the tail; below that file, the tier's FINISHED files

The leader refuses a replica that does not read the tier (an empty replica without ``--tier-url`` and
``--local-retention-ms/-bytes``, or an older version, whose hello carries no ``reads_tier``) when its log below
the local start is only in the tier: FailedPrecondition naming the flags, never a replica missing that part.

Consume queues of the topics kept local (the consumer offsets, the ledger: Retention's LOCAL_ONLY_TOPICS) start
with the tail, as the leader's do (their minimum follows the local log).

Thread-safety: ``queue_starts`` runs on a leader's stream thread (reads below each queue's max offset, as every
reader); ``join`` on the replica's follower thread under the node's apply lock, the only writer of its log.
"""

from __future__ import annotations

import structlog

from mqstore.errors import FailedPrecondition
from mqstore.format import cq_unit
from mqstore.replication.messages import QueueStart
from mqstore.store_retention import LOCAL_ONLY_TOPICS

log = structlog.get_logger("mqstore.tier")

ENTRY = cq_unit.ENTRY_SIZE
WELCOME_ENTRY_BYTES = 48 << 20  # the queues' entries one welcome carries at most (a gRPC message is 64 MiB)
FLAGS = "--tier-url and --local-retention-ms or --local-retention-bytes"


class TierJoin:
    """The store's side of a join from the tier (``store.tier_join``, set by the commit log's composition when the
    tier's local retention is on): ``local`` is the node's LocalRetention (mqstore.tier.local_retention)."""

    def __init__(self, store, local):
        self.store = store
        self.local = local
        self.joined = 0  # joins from the tier this node made as a replica (tests, logs)

    def logical_min(self) -> int:
        """The logical log's start: below the local log, the tier serves from here."""
        return min(self.local.logical_min, self.store.log_min())

    # ---- the leader's side
    def queue_starts(self, at: int) -> tuple[QueueStart, ...]:
        """Each consume queue's start for a replica whose log starts at ``at`` (the leader's local start)."""
        starts, total = [], 0
        for (topic, queue_id), cq in sorted(self.store.queues.queues.items()):
            if topic in LOCAL_ONLY_TOPICS or cq.max_offset == 0 or not cq.files.segments:
                continue
            first = cq.files.min_offset // ENTRY  # the leader's first local file: the tier holds every one below
            lo = cq.first_entry_from(at, first, cq.max_offset)  # the first entry whose record is in the tail
            entries, at_offset = [], first
            while at_offset < lo:  # entries() stops at a file's end
                more = cq.entries(at_offset, lo - at_offset)
                if not more:
                    break
                entries += more
                at_offset += len(more)
            data = b"".join(cq_unit.ENTRY.pack(*entry) for entry in entries)
            real = [(phys, size) for phys, size, _ in entries if size != cq_unit.BLANK_SIZE_FIELD]
            total += len(data)
            if total > WELCOME_ENTRY_BYTES:
                raise FailedPrecondition(
                    f"the consume queues' entries below the leader's local log start {at} need more than "
                    f"{WELCOME_ENTRY_BYTES} bytes, more than one welcome carries: a replica cannot start from the "
                    f"tier yet; raise --local-retention-ms/-bytes on the leader or copy its data directory")
            starts.append(QueueStart(topic, queue_id, cq.min_offset, first, data,
                                     real[-1][0] + real[-1][1] if real else 0))
        return tuple(starts)

    def uploads(self) -> tuple[bytes, ...]:
        """The FINISHED uploads' records, for a replica's ledger before it shows the tail."""
        self.local.ledger.catch_up()
        return tuple(self.local.ledger.finished_records())

    # ---- the replica's side
    def join(self, log_start: int, tier_min: int, starts: tuple[QueueStart, ...], uploads: tuple[bytes, ...] = ()
             ) -> None:
        """After the log restarted empty at ``log_start``: serve [tier_min, log_start) from the tier, each queue as
        its start says; durable (queue files flushed, a checkpoint) before the first byte of the tail is copied."""
        store = self.store
        if store.log_min() != log_start or store.log_end() != log_start:
            raise FailedPrecondition(f"a join from the tier needs an empty log at {log_start}, this one holds "
                                     f"[{store.log_min()}, {store.log_end()})")
        self.local.ledger.seed(uploads)
        self.local.logical_min = tier_min
        with store.dispatcher.lock:
            for start in starts:
                cq = store.queues.get_or_create(start.topic, start.queue_id)
                self.local.attach(cq)
                cq.start_from_tier(start.min_offset, start.first_offset, start.entries, start.physical_end)
        store.write_checkpoint()  # the entries below the tail are in no log this node holds: durable now
        self.joined += 1
        log.info("tier.replica_joined", log_start=log_start, logical_min=tier_min, queues=len(starts),
                 entry_bytes=sum(len(s.entries) for s in starts))
