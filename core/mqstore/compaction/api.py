"""What the Compactor's servicer (compactor_service.servicer) calls: one method per RPC, in mqstore's plain
types; the rules of each call (arguments, the engine of a round) are here, the servicer only converts.

Engine choice for a round (``engine``): "local"; "spark" (the PySpark job, when a Spark runner is
configured); "auto" = spark when a runner is configured and the round is heavy: its dirty bytes exceed
``spark_threshold_bytes``, or its dirty records (an upper bound of its keys) exceed ``SPARK_MIN_LOCAL_PASSES``
fillings of the offset map (offset_map_memory_bytes / ENTRY_COST_BYTES keys each; a local round then spills
its key digests to that many buckets on this machine's disk and fills the map once per bucket,
mqstore.compaction.rounds); else local. The local engine is linear in the data at any budget, so Spark pays
off only where one machine's disk or time is the limit (bench/results/compactor.md: never on 2 cores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mqstore import limits
from mqstore.background import Duty
from mqstore.compaction import reads
from mqstore.compaction.offset_map import ENTRY_COST_BYTES
from mqstore.compaction.store import CompactionStore, Dirt, QueueSlot, RoundInfo
from mqstore.compaction.tier_status import QueueTierStatus, queue_status
from mqstore.errors import FailedPrecondition, InvalidArgument, NotFound, shown

ENGINES = ("auto", "local", "spark")
SPARK_MIN_LOCAL_PASSES = 16
MAX_BATCH_KEYS = 1000


@dataclass(frozen=True)
class Description:
    slot: QueueSlot
    dirt: Dirt
    info: RoundInfo
    running: bool
    quarantined: bool
    quarantined_until_ms: int
    failures: int
    last_error: str
    due: str
    records: int
    keys: int
    min_offset: int
    max_offset: int
    tier: QueueTierStatus | None = None  # with a tier of compaction segments (mqstore.compaction.tier_status)

    @property
    def tombstones_pending_why(self) -> str:
        """Why the queue still holds tombstones ("" when it holds none)."""
        return "within delete_retention_ms of the round that first saw them" if self.dirt.tombstones_kept else ""


@dataclass(frozen=True)
class ServiceStats:
    connected: bool
    checkpoint_physical_offset: int
    log_end_physical_offset: int | None  # None until the follower's first frame since start: unknown
    problem: str
    queues: int
    records_applied: int
    replica_of: str
    role: str = "single"       # single | active | standby | replica (CompactorStats.role)
    active_instance: str = ""  # the round lease's holder as last read

    @property
    def bytes_behind(self) -> int | None:
        """How far the compaction logs lag the commit log's end (None: its end is unknown)."""
        if self.log_end_physical_offset is None:
            return None
        return max(0, self.log_end_physical_offset - self.checkpoint_physical_offset)


class CompactorApi:
    """Thread-safe: the store is; ``spark_round`` (when set) runs one Spark round for a slot."""

    def __init__(self, store: CompactionStore, *, spark_threshold_bytes: int, stats: Callable[[], ServiceStats],
                 spark_round: Callable[[QueueSlot], RoundInfo] | None = None,
                 refuse_rounds: Callable[[], Exception | None] | None = None):
        self.store, self.spark_threshold_bytes, self._stats, self.spark_round = (
            store, spark_threshold_bytes, stats, spark_round)
        self.refuse_rounds = refuse_rounds  # why this instance runs no round now (a standby), None when it may

    def _slot(self, topic: str, queue_id: int) -> QueueSlot:
        if not topic:
            raise InvalidArgument("topic must not be empty")
        limits.at_least_zero("queue_id", queue_id)
        return self.store.slot(topic, queue_id)

    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int, max_bytes: int) -> reads.Pulled:
        return reads.pull(self._slot(topic, queue_id).qlog, offset, max_messages, max_bytes)

    def get_latest(self, topic: str, key: str) -> reads.Latest:
        if not topic:
            raise InvalidArgument("topic must not be empty")
        return reads.get_latest(self.store, topic, key)

    def batch_get_latest(self, topic: str, keys: list[str]) -> list[reads.Latest | str]:
        """The latest value per key, in order; the key itself where it has none."""
        if len(keys) > MAX_BATCH_KEYS:
            raise InvalidArgument(f"keys: {len(keys)} in one call, the limit is {MAX_BATCH_KEYS}")
        out: list[reads.Latest | str] = []
        for key in keys:
            try:
                out.append(self.get_latest(topic, key))
            except NotFound:
                out.append(key)
        return out

    def scan(self, topic: str, cursor: str, page_size: int, include_tombstones: bool, max_pages: int = 0,
             take: reads.Take | None = None) -> reads.ScanPage:
        """One page; ``max_pages`` (0 = until the end) is the caller's to count, checked here. ``take``: what
        the page keeps of the records (reads.scan; by default Latest items)."""
        limits.at_least_zero("max_pages", max_pages, "0 = until the end")
        queue_id, offset = _parse_cursor(cursor)
        if not self.store.slots(topic):
            raise reads.no_log(topic)
        return reads.scan(self.store, topic, queue_id, offset, page_size or reads.DEFAULT_SCAN_PAGE,
                          include_tombstones, take)

    def compact(self, topic: str, queue_id: int | None, engine: str, seal_active: bool) -> list[tuple[int, RoundInfo]]:
        """A round on each queue asked for: (queue id, its round). A standby (``refuse_rounds``) raises its
        Unavailable: rounds run on the active compactor only."""
        if engine not in ENGINES:
            raise InvalidArgument(f"engine must be one of {ENGINES}, not {shown(engine)}")
        if engine == "spark" and self.spark_round is None:
            raise FailedPrecondition("engine=spark: this compactor has no Spark runner (start it with --spark-master "
                                     "and the spark extra installed), or ask for engine=local")
        slots = [self._slot(topic, queue_id)] if queue_id is not None else self.store.slots(topic)
        if not slots:
            raise reads.no_log(topic)
        if self.refuse_rounds is not None and (refused := self.refuse_rounds()) is not None:
            raise refused
        return [(slot.qlog.queue_id, self._round(slot, engine, seal_active)) for slot in slots]

    def _round(self, slot: QueueSlot, engine: str, seal_active: bool) -> RoundInfo:
        if engine == "auto":
            dirt = self.store.dirt(slot)
            capacity = self.store.config.offset_map_memory_bytes // ENTRY_COST_BYTES
            heavy = (dirt.dirty_bytes > self.spark_threshold_bytes
                     or dirt.dirty_records > SPARK_MIN_LOCAL_PASSES * capacity)
            engine = "spark" if heavy and self.spark_round is not None else "local"
        if engine == "spark":
            if seal_active:
                slot.qlog.seal_active()
            return self.spark_round(slot)
        return self.store.compact(slot, seal_active=seal_active)

    def describe(self, topic: str, queue_id: int) -> Description:
        slot = self._slot(topic, queue_id)
        due = self.store.due(slot)
        q = slot.quarantine
        qlog = slot.qlog
        return Description(slot, self.store.dirt(slot), slot.info, slot.running,
                           q.blocks(self.store.clock.now_ms()), q.until_ms, q.failures, q.error, due,
                           len(qlog.entries), len(qlog.latest), qlog.min_offset(), qlog.next_offset(),
                           queue_status(self.store.remote, qlog) if self.store.remote is not None else None)

    def offsets(self, topic: str, queue_id: int, timestamp_ms: int) -> tuple[int, int, int]:
        limits.at_least_zero("timestamp_ms", timestamp_ms, "0 = no time; else ms since the epoch")
        qlog = self._slot(topic, queue_id).qlog
        by_time = qlog.by_time(timestamp_ms) if timestamp_ms > 0 else 0
        return qlog.min_offset(), qlog.next_offset(), by_time

    def queues(self) -> list[tuple[str, int, int, int, int]]:
        """(topic, queue id, min offset, max offset, the topic's start_physical_offset) of every queue held."""
        return [(s.qlog.topic, s.qlog.queue_id, s.qlog.min_offset(), s.qlog.next_offset(),
                 self.store.incarnation(s.qlog.topic) or 0) for s in self.store.slots()]

    def stats(self) -> ServiceStats:
        return self._stats()


def _parse_cursor(cursor: str) -> tuple[int, int]:
    if not cursor:
        return 0, 0
    try:
        queue_id, offset = (int(part) for part in cursor.split(":"))
    except ValueError:
        raise InvalidArgument(f"cursor {shown(cursor)} is not a cursor this service gave (queue:offset)") from None
    if queue_id < 0 or offset < 0:
        raise InvalidArgument(f"cursor {shown(cursor)} is not a cursor this service gave")
    return queue_id, offset


def cursor_of(page: reads.ScanPage) -> str:
    return "" if page.done else f"{page.next_queue_id}:{page.next_offset}"


class RoundDuty(Duty):
    """Thread ``compactor-rounds``: every round_interval_ms, a round on each due queue (CompactionStore.run_due:
    a failing queue is quarantined with backoff, the others go on). ``active``: whether this instance may
    start rounds now (a standby compactor's is False; compactor_service.lease); a sweep stops at the first
    queue after it turns False."""

    def __init__(self, store: CompactionStore, active: Callable[[], bool] | None = None):
        super().__init__("compactor-rounds", interval_s=store.config.round_interval_ms / 1000)
        self.store, self.active = store, active or (lambda: True)

    def step(self) -> None:
        if self.active():
            self.store.run_due(lambda: self.stopping or not self.active())
