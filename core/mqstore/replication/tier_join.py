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

**Paging.** The queues' entries and the upload records can outgrow one gRPC message (64 MiB; some 80,000 upload
records are 16 MiB): a replica whose hello says ``pages_welcome`` (this version) takes them in parts of at most
WELCOME_ENTRY_BYTES of entries and records together (:func:`parts`: the welcome, then more parts; the queues
first, a queue's entries split where a page is full, each piece continuing the one before (:func:`pages`), then
the upload records, whole, in the rest of the last queue page and as many parts after as they need), joined
again (:func:`merged`, the records concatenated in order) before the join. What fits one message is one message,
the one an earlier version sent. A replica of an earlier version takes one message: beyond WELCOME_ENTRY_BYTES
of entries it is refused; its upload records go whole, as before (a message beyond gRPC's is refused too, by
commitlog_service.replication.welcome_messages). Every replica is refused beyond
WELCOME_TOTAL_BYTES of entries and records in all (FailedPrecondition naming what to do): the bound of what a
leader builds in memory for one join, the entries read from its queue files and the records encoded anew from
its ledger (Ledger.finished_records), both held while the welcome goes; the messages themselves are made one part
at a time as the stream sends them.

The leader refuses a replica that does not read the tier (an empty replica without ``--tier-url`` and
``--local-retention-ms/-bytes``, or an older version, whose hello carries no ``reads_tier``) when its log below
the local start is only in the tier: FailedPrecondition naming the flags, never a replica missing that part.

Consume queues of the topics kept local (the consumer offsets, the ledger: Retention's LOCAL_ONLY_TOPICS) start
with the tail, as the leader's do (their minimum follows the local log).

Thread-safety: ``queue_starts`` runs on a leader's stream thread (reads below each queue's max offset, as every
reader); ``join`` on the replica's follower thread under the node's apply lock, the only writer of its log.
"""

from __future__ import annotations

from collections.abc import Iterator

import structlog

from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.format import cq_unit
from mqstore.replication.messages import QueueStart
from mqstore.store_retention import LOCAL_ONLY_TOPICS

log = structlog.get_logger("mqstore.tier")

ENTRY = cq_unit.ENTRY_SIZE
WELCOME_ENTRY_BYTES = 48 << 20  # entries and upload records one welcome message carries at most (gRPC's: 64 MiB)
WELCOME_TOTAL_BYTES = 512 << 20  # the entries and upload records of one welcome, in all (the leader's memory)
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
    def queue_starts(self, at: int, paged: bool = False) -> tuple[QueueStart, ...]:
        """Each consume queue's start for a replica whose log starts at ``at`` (the leader's local start); ``paged``:
        the replica takes them in pages (the module docstring), else in one message."""
        starts, total = [], 0
        limit = WELCOME_TOTAL_BYTES if paged else WELCOME_ENTRY_BYTES
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
            if total > limit:
                raise FailedPrecondition(
                    f"the consume queues' entries below the leader's local log start {at} need more than "
                    f"{limit} bytes, more than " + ("a welcome carries in all" if paged else
                                                    "one welcome carries to a replica of an earlier version "
                                                    "(upgrade it: this version takes them in pages)") +
                    ": a replica cannot start from the tier yet; raise --local-retention-ms/-bytes on the leader "
                    "(fewer entries below its local log) or copy the leader's data directory")
            starts.append(QueueStart(topic, queue_id, cq.min_offset, first, data,
                                     real[-1][0] + real[-1][1] if real else 0))
        return tuple(starts)

    def uploads(self, entry_bytes: int = 0) -> tuple[bytes, ...]:
        """The FINISHED uploads' records, for a replica's ledger before it shows the tail; refused when they and the
        welcome's ``entry_bytes`` of queue entries need more than WELCOME_TOTAL_BYTES (the module docstring)."""
        self.local.ledger.catch_up()
        records = tuple(self.local.ledger.finished_records())
        need = entry_bytes + sum(len(record) for record in records)
        if need > WELCOME_TOTAL_BYTES:
            raise FailedPrecondition(
                f"the welcome of a replica starting from the tier needs {need} bytes ({entry_bytes} of consume "
                f"queue entries, {len(records)} upload records), more than a welcome carries in all "
                f"({WELCOME_TOTAL_BYTES}): a replica cannot start from the tier yet; raise "
                f"--local-retention-ms/-bytes on the leader or copy the leader's data directory")
        return records

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


# ---- paging (the module docstring) -----------------------------------------------------------------------------

Part = tuple[tuple[QueueStart, ...], tuple[bytes, ...]]  # a message's queues and upload records


def parts(starts: tuple[QueueStart, ...], uploads: tuple[bytes, ...] = (), page_bytes: int | None = WELCOME_ENTRY_BYTES
          ) -> Iterator[Part]:
    """The welcome's queues and upload records in parts of at most ``page_bytes`` of entries and records together
    (at least one part, the welcome itself; None: one part holding all, as to a replica of an earlier version):
    the queues' pages (:func:`pages`), then the records, whole, in what is left of the last page and the parts
    after (a record larger than a part goes alone). Made one part at a time: the caller holds one at once."""
    if page_bytes is None:
        yield tuple(starts), tuple(uploads)
        return
    queue_pages = _queue_pages(starts, page_bytes)
    last = next(queue_pages)
    for page in queue_pages:
        yield tuple(last), ()
        last = page
    queues, held = tuple(last), []
    room = page_bytes - sum(len(q.entries) for q in queues)
    for record in uploads:
        if len(record) > room and (held or room < page_bytes):  # full: this part goes, the record starts the next
            yield queues, tuple(held)
            queues, held, room = (), [], page_bytes
        held.append(record)
        room -= len(record)
    yield queues, tuple(held)


def part_count(starts: tuple[QueueStart, ...], uploads: tuple[bytes, ...] = (),
               page_bytes: int | None = WELCOME_ENTRY_BYTES) -> int:
    """How many parts :func:`parts` makes (the welcome's ``more_parts`` is one fewer), one part at a time."""
    return sum(1 for _ in parts(starts, uploads, page_bytes))


def pages(starts: tuple[QueueStart, ...], page_bytes: int = WELCOME_ENTRY_BYTES) -> list[tuple[QueueStart, ...]]:
    """``starts`` in pages of at most ``page_bytes`` of entries (whole entries; at least one page, the first
    sent with the welcome): a queue whose entries do not fit what is left of a page is split, each piece a
    QueueStart continuing the one before (its ``first_offset`` advanced; ``physical_end`` the piece's own)."""
    return [tuple(page) for page in _queue_pages(starts, page_bytes)]


def _queue_pages(starts: tuple[QueueStart, ...], page_bytes: int) -> Iterator[list[QueueStart]]:
    """:func:`pages`, one page at a time."""
    per_page = max(page_bytes // ENTRY, 1) * ENTRY
    page: list[QueueStart] = []
    room = per_page
    for start in starts:
        at = 0
        while True:
            piece = start.entries[at:at + room]
            page.append(QueueStart(start.topic, start.queue_id, start.min_offset, start.first_offset + at // ENTRY,
                                   piece, _physical_end(piece)))
            at, room = at + len(piece), room - len(piece)
            if at >= len(start.entries):
                break
            yield page
            page, room = [], per_page
    yield page


def merged(pieces: tuple[QueueStart, ...] | list[QueueStart]) -> tuple[QueueStart, ...]:
    """The queues of a paged welcome joined again: consecutive pieces of one queue concatenated (each must continue
    the one before: InvalidArgument otherwise); its ``physical_end`` the last piece's that holds a record."""
    out: list[QueueStart] = []
    for piece in pieces:
        last = out[-1] if out else None
        if last is None or (last.topic, last.queue_id) != (piece.topic, piece.queue_id):
            out.append(piece)
            continue
        if piece.first_offset != last.first_offset + len(last.entries) // ENTRY or piece.min_offset != last.min_offset:
            raise InvalidArgument(f"welcome: the piece of queue {piece.topic}/{piece.queue_id} at offset "
                                  f"{piece.first_offset} does not continue the one before (which ends at "
                                  f"{last.first_offset + len(last.entries) // ENTRY})")
        out[-1] = QueueStart(last.topic, last.queue_id, last.min_offset, last.first_offset,
                             last.entries + piece.entries, piece.physical_end or last.physical_end)
    return tuple(out)


def _physical_end(entries: bytes) -> int:
    """The end of the record of the last entry of ``entries`` that is not blank (0: none)."""
    for at in range(len(entries) - ENTRY, -1, -ENTRY):
        phys, size, _ = cq_unit.ENTRY.unpack_from(entries, at)
        if size != cq_unit.BLANK_SIZE_FIELD:
            return phys + size
    return 0
