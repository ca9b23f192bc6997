"""MessageStore: the facade every service and the CLI call; the composition of the storage core.

Start-up (``start``): take the directory lock; resolve leftover temp files; read the checkpoint; load
segments, removing the empty ones a power cut left past its flushed offset (mqstore.log.segment);
re-check the log (CRC included) from recovery.check_start: the last ``recheck_segments`` segments and
everything past the checkpoint's flushed offset, or all of it (mqstore.log.recovery: torn tail cut,
corruption refuses to start; the checkpoint then records the range checked); load consume
queues and cut entries past the log end; replay records from the checkpoint's dispatched offset
(from the log's start when the checkpoint or the consume queue directory is missing); rebuild the
queue offset table; fsync; write the abort marker; start threads.
A clean ``stop`` flushes everything, writes the checkpoint and removes the abort marker.

Composition: the store holds its parts and gives each the narrow callables it needs: the topic
registry (mqstore.store_topics), the full-disk state (mqstore.store_space), retention of the log and
topics with the followers' holds (mqstore.store_retention: ``store.retention``), and three background
duties (mqstore.background): the flush service, the segment warmer and the maintenance duty. Topic
administration (mqstore.topic_admin: CreateTopic, DeleteTopic's steps...) and the replica side
(mqstore.store_replica: the visibility of copied records, promotion) use the store and are composed
outside it, by mqstore.store_parts.build_store (``store.topic_admin``, ``store.replica_view``); the store
offers them two hooks and knows neither: :meth:`MessageStore.on_start` (a step at the end of every start:
the deletes a crash cut short are resumed) and :meth:`MessageStore.dispatch_through` (the write path's
dispatch: a replica's copied records before its own appends). Tail streams of the log are not the store's:
mqstore.tailing reads them through it; nor are CommitOffset, QueryOffset and the import of an earlier
version's SQL offsets at start: mqstore.store_offsets, through the offsets map (mqstore.consumer_offsets); nor
is the rule for which reads an event loop may run: mqstore.hot_reads.

On a full disk the store is read-only (mqstore.store_space): appends, CreateTopic, UpdateTopic and
CommitOffset get ResourceExhausted, reads go on; a checkpoint that does not fit is skipped and the abort
marker stays; a start on a full disk comes up read-only.

Thread-safety: every public method may be called from any thread. Appends serialise on the commit
log's lock; consume queue writes on the dispatcher's lock; topic changes on the registry's lock.
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Callable, Sequence

import structlog

from mqstore import codec, failpoints, fs, limits, waits
from mqstore import topics as topic_rules
from mqstore.clock import Clock, SystemClock
from mqstore.config import FLUSH_SYNC, StoreConfig
from mqstore.errors import (DataLoss, FailedPrecondition, InvalidArgument, NotFound, OutOfRange,
                            ResourceExhausted, Unavailable, invariant, shown)
from mqstore.consumer_offsets import ConsumerOffsets
from mqstore.format import checkpoint as cpfmt, offset_commit, record, record_reader, tier_upload, topic_event
from mqstore.limits import MAX_GET_MESSAGES
from mqstore.log.commitlog import CommitLog
from mqstore.log.encoder import MessageEncoder
from mqstore.log.flush import Flusher
from mqstore.log.recovery import check_start, recover
from mqstore.log.segment import SegmentQueue
from mqstore.log.warmer import WARM_CREATE, WARM_ZEROS, SegmentWarmer
from mqstore.maintenance import Maintenance
from mqstore.meta import MetadataStore
from mqstore.meta.catalog import TopicCatalogOpener, is_etcd_url
from mqstore.metrics import Registry
from mqstore.model import (DURABILITY_FLUSHED, DURABILITY_WRITTEN, AppendResults, MessageIn,
                           MessageLookup, PullResult, QueueInfo, RawPullResult, StoredMessage, StoreInfo,
                           TopicRecord)
from mqstore.queue.dispatch import Dispatcher, QueueTable
from mqstore.queue.pull import LongPolls, Selector, read_queue, read_queue_raw
from mqstore.replication.node import SingleNode, takes_writes
from mqstore.queue.usage import TopicUsage
from mqstore.store_retention import Retention
from mqstore.store_space import DiskSpace
from mqstore.store_topics import TopicRegistry
from mqstore.writers import SYSTEM_WRITERS, WriterRules, Writers

log = structlog.get_logger()

MAX_PULL_MESSAGES = 10_000
MAX_PULL_BYTES = 8 << 20
MAX_LONG_POLL_MS = 30_000


def _open_sql_catalog(url: str, clock: Clock) -> MetadataStore:
    if is_etcd_url(url):  # the etcd catalog's client speaks gRPC, which core does not import
        raise InvalidArgument(f"metadata URL {url}: an etcd catalog is opened by the CommitLog service "
                              f"(mqstore_rpc.etcd_meta), not by a store built without it")
    return MetadataStore(url, clock)


# The store as a system writer (mqstore.writers): its topic events, which no writer may name.
STORE_WRITER = WriterRules(topic_rules.OWNER_STORE, topic_rules.OWNER_DESCRIPTIONS[topic_rules.OWNER_STORE],
                           frozenset({topic_event.TOPIC, offset_commit.TOPIC, tier_upload.TOPIC}))


class MessageStore:
    def __init__(self, config: StoreConfig, clock: Clock | None = None, metrics: Registry | None = None,
                 writers: Writers | None = None, open_catalog: TopicCatalogOpener | None = None):
        """``writers``: the system writers' rules (mqstore.writers), the process's registry by default
        (mqstore.system_writers fills it); the store adds its own. ``open_catalog(metadata URL, clock)``: the
        topic catalog (mqstore.meta.catalog; the services give one that also opens ``etcd://``), SQL by default."""
        self._open_catalog = open_catalog or _open_sql_catalog
        self.config = config
        self.writers = writers if writers is not None else SYSTEM_WRITERS
        self.writers.register(STORE_WRITER)
        self.clock = clock or SystemClock()
        self.metrics = metrics = metrics or Registry()
        self.encoder = MessageEncoder(config)
        self._msg_id_prefix = record.msg_id_prefix(self.encoder.store_host, self.encoder.store_port)
        self.segments = SegmentQueue(
            config.commitlog_dir, config.segment_size_bytes, preallocate=config.preallocate_segments,
            wrong_size_advice=f"If {config.segment_size_bytes} is this store's segment size, run `mqstore repair "
                              f"--data-dir {config.data_dir} --segment-size-bytes {config.segment_size_bytes}`: it "
                              f"keeps a .broken copy, pads the file with zeros to that size (or cuts it there), "
                              f"and cuts the record left incomplete")
        self.queues = QueueTable(config.consumequeue_dir, config.cq_entries_per_file)
        self.commitlog = CommitLog(self.segments, self.clock, reserve_queue_files=self.queues.reserve)
        self.dispatcher = Dispatcher(self.commitlog, self.queues, self.encoder.tag_code)
        self.flusher: Flusher | None = None
        self.disk = DiskSpace(config, self._abort_path, metrics)
        self.topics = TopicRegistry(config.default_queue_count, queue_info=self.queue_info,
                                    refuse_write=self.disk.refuse_metadata_write_if_read_only,
                                    log_end=lambda: self.commitlog.written_offset, append_lock=self.commitlog.lock)
        # A record is part of its topic only at or above the topic's start (store_topics): appends check
        # their topic under the append lock, and the dispatcher skips batches of a topic deleted since.
        self.commitlog.topic_start = self.dispatcher.topic_start = self.topics.start_of
        self.offsets = self.topics.offsets = ConsumerOffsets.of_store(self)  # mqstore.consumer_offsets
        self.retention = Retention(config, self.clock, segments=self.segments, queues=self.queues, offsets=self.offsets,
                                   commitlog=self.commitlog, dispatcher=self.dispatcher, topics=self.topics,
                                   flushed_offset=self.flushed_offset, writable=lambda: takes_writes(self.gate))
        self.maintenance = Maintenance(config, self.clock, write_checkpoint=self.write_checkpoint,
                                       check_disk=self.disk.check, follow_offsets=self.offsets.catch_up,
                                       delete_expired_segments=self.retention.delete_expired_segments,
                                       apply_topic_retention=self.retention.apply_topic_retention)
        sync = config.flush_mode == FLUSH_SYNC
        self.warmer = SegmentWarmer(self.commitlog, config.warm_ahead_bytes, WARM_ZEROS if sync else WARM_CREATE,
                                    keep_bytes=config.page_cache_keep_bytes, flushed_offset=self.flushed_offset)
        self._lock_fd: int | None = None
        # Set before start() when the object storage tier's local retention is on (mqstore.tier.local_retention):
        # at start, the consume queues keep their entries below the first local segment (read from the tier).
        self.tiered_log = False
        # Set by the commit log's composition when the tier is on: the tier's status (mqstore.tier.status).
        self.tier_status = None
        # Set by the commit log's composition when the tier's local retention is on: a replica of this store may start
        # from the tier plus its leader's local tail (mqstore.replication.tier_join.TierJoin).
        self.tier_join = None
        self._running = False
        self.recovery = None
        self._checked = (0, 0)  # [from, to): every record there passed its checks at this start
        self._checkpoint_lock = threading.Lock()
        self._long_polls = LongPolls(config.max_long_poll_waiters, self.dispatcher.visible, self.clock)
        # The gate of writes: SingleNode without replication, else the node's role (mqstore.replication.node):
        # a replica refuses writes naming its leader, a leader waits for SYNC-replicated copies.
        self.gate = SingleNode()
        # How the write path makes records visible up to a log offset (their consume queue entries, and so Pull
        # and Tail): the dispatcher's pending appends, unless a part routes it (dispatch_through).
        self._dispatch_to: Callable[[int], None] = self.dispatcher.run_pending
        self._start_steps: list[Callable[[], None]] = []  # on_start: run in order at the end of every start
        # Counted by the commit log under its append lock (plain ints: no lock of their own on every batch).
        metrics.counter_fn("mqstore_commitlog_appended_messages_total", "messages appended",
                           lambda: self.commitlog.appended_messages)
        metrics.counter_fn("mqstore_commitlog_appended_bytes_total", "record bytes appended",
                           lambda: self.commitlog.appended_bytes)
        metrics.counter_fn("mqstore_commitlog_append_batches_total", "batches appended (Append calls)",
                           lambda: self.commitlog.appended_batches)
        metrics.gauge_fn("mqstore_commitlog_physical_offset", "log positions: min (oldest record kept), written, "
                         "flushed, visible (dispatched)", self._positions, ("position",))
        metrics.gauge_fn("mqstore_commitlog_segments", "commit log segment files", lambda: len(self.segments.segments))
        usage = TopicUsage(self.queues)
        metrics.gauge_fn("mqstore_commitlog_topic_bytes", "record bytes a topic holds in the commit log (the live "
                         "entries of its consume queues)", usage.bytes_by_topic, ("topic",))
        metrics.gauge_fn("mqstore_consumer_lag_messages", "messages between a group's committed offset and the end "
                         "of the queue", self.topics.consumer_lag, ("group", "topic", "queue_id"))

    # ------------------------------------------------------------------ lifecycle
    @property
    def _abort_path(self):
        return self.config.data_dir / "abort"

    @property
    def _checkpoint_path(self):
        return self.config.data_dir / "checkpoint"

    def start(self) -> None:
        fs.make_dirs(self.config.data_dir)  # the creation rule (mqstore.fs)
        self._take_lock()
        try:
            self._start_locked()
        except BaseException:
            self.queues.close()
            self.segments.close()
            self.topics.close()
            self._release_lock()
            raise
        self.offsets.catch_up()  # the map, from the offsets topic's min offset
        for step in self._start_steps:  # the store serves (mqstore.topic_admin: the deletes a crash cut short)
            step()

    def on_start(self, step: Callable[[], None]) -> None:
        """``step()`` runs at the end of every start, once the store serves, after the steps added before it.
        Called before ``start`` by whoever composes the store (mqstore.store_parts)."""
        self._start_steps.append(step)

    def dispatch_through(self, dispatch_to: Callable[[int], None]) -> None:
        """Every dispatch of the write path (the consume queue entries up to a log offset: an append's, a
        flush's, the stop's) goes through ``dispatch_to(limit)`` instead of the dispatcher's pending appends
        alone: mqstore.store_replica puts a new leader's copied records in first. Called before ``start``;
        ``dispatch_to`` is called from appending threads and the flush thread (the dispatcher's lock orders
        them) and must end by running the pending appends up to ``limit``."""
        self._dispatch_to = dispatch_to

    def _start_locked(self) -> None:
        cfg = self.config
        fs.remove_leftovers(cfg.data_dir)
        self.disk.check_before_start()  # before anything is written: a full disk starts read-only
        unclean = self._abort_path.exists()
        cp = self._read_checkpoint()
        cq_root_existed = cfg.consumequeue_dir.is_dir()
        # The default SQLite file is created here by SQLite, which does not fsync the directory of a new
        # database: the checkpoint written below, in the same directory, makes its entry durable.
        self.topics.open(self._open_catalog(cfg.metadata_url_resolved, self.clock))
        # Trailing segments past the flushed offset that a power cut left empty are removed (segment.py).
        self.segments.load(empty_tail_from=cp.flushed_physical_offset if cp else None)
        start = cp.flushed_physical_offset if cp else self.segments.min_offset
        check_from = check_start(self.segments, cp.flushed_physical_offset if cp else None, cfg.recheck_segments,
                                 cfg.check_all)
        result = recover(self.segments, check_from, cfg.max_write_bytes, cp.flushed_physical_offset if cp else None)
        self.recovery = result
        end = result.end_offset
        self._checked = (result.checked_from, end)
        self.queues.load()
        self.queues.drop_unknown(self.topics.names())  # a deleted topic's (a crash in its delete's step 3)
        for cq in self.queues.queues.values():
            cq.truncate_to_log_end(end)
        replay_from = min(cp.dispatched_physical_offset, end) if cp and cq_root_existed else self.segments.min_offset
        starts = self.topics.starts()
        rebuild = (self._queues_behind() | self.queues.of_earlier_topics(starts)) if cq_root_existed else frozenset()
        replayed = self.dispatcher.replay(replay_from, end, starts=starts, rebuild=rebuild)
        last_ts = max(result.last_store_timestamp_ms, cp.physic_msg_timestamp_ms if cp else 0)
        self.commitlog.restore(end, last_ts, self.dispatcher.next_queue_offsets())
        if self.tiered_log:  # the queues' entries below the local log are read from the tier (mqstore.tier)
            self.retention.correct_local_only(self.segments.min_offset)
        else:
            self.retention.before_segment_delete(self.segments.min_offset)
        self.flusher = Flusher(self.commitlog, cfg, self.clock, self._on_flushed, self.metrics)
        self.flusher.flushed_offset = min(start, end)
        self.flusher.flush_now()
        self.write_checkpoint()
        self.disk.mark_started()
        self.flusher.start()
        self.maintenance.start()
        self.warmer.start()
        self._running = True
        log.info("store.started", data_dir=str(cfg.data_dir), unclean=unclean, end_offset=end,
                 checked_from=result.checked_from, checked_bytes=result.bytes_checked,
                 checked_records=result.records_checked, check_s=round(result.seconds, 3),
                 torn_bytes_cut=result.torn_bytes_cut, replayed_records=replayed, flush_mode=cfg.flush_mode)

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self._running:
            self._release_lock()
            return
        self._running = False
        self.maintenance.stop(timeout_s)
        self.warmer.stop(timeout_s)
        self.flusher.stop(timeout_s)
        self._dispatch_to(self.flusher.flushed_offset)
        checkpointed = self.write_checkpoint()
        if checkpointed and self.dispatcher.dispatched_offset >= self.commitlog.written_offset:
            self._abort_path.unlink(missing_ok=True)
            fs.fsync_dir(self.config.data_dir)
        self.queues.close()
        self.segments.close()
        self.topics.close()
        self._release_lock()
        log.info("store.stopped", end_offset=self.commitlog.written_offset)

    def _take_lock(self) -> None:
        # Not made durable (the creation rule of mqstore.fs): the lock is the flock, not the file's bytes;
        # a lock file lost to a power cut is created again here.
        fd = os.open(self.config.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FailedPrecondition(
                f"{self.config.data_dir} is in use by another mqstore process (lock file held)") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _read_checkpoint(self) -> cpfmt.Checkpoint | None:
        try:
            return cpfmt.decode(self._checkpoint_path.read_bytes())
        except FileNotFoundError:
            return None
        except DataLoss as exc:
            log.warning("checkpoint.unreadable", error=str(exc), action="re-check the whole log")
            return None

    @property
    def _manifest_path(self):
        return self.config.consumequeue_dir / "queues.manifest"

    def _queues_behind(self) -> set[tuple[str, int]]:
        try:
            behind = self.dispatcher.queues_behind(self._manifest_path.read_bytes())
        except FileNotFoundError:
            return set()
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("manifest.unreadable", error=str(exc), action="only gaps found by replay are rebuilt")
            return set()
        known = self.topics.names()
        return {key for key in behind if key[0] in known}

    def write_checkpoint(self) -> bool:
        """Flush the consume queues, then replace the manifest and the checkpoint. False when the disk
        has no room for them: skipped and logged (once), the older checkpoint stays valid. Serialised:
        the maintenance duty, start, stop (after a duty that did not stop in time) and tests call it,
        and two writers of the same temporary files would rename each other's away."""
        with self._checkpoint_lock:
            return self._write_checkpoint_locked()

    def _write_checkpoint_locked(self) -> bool:
        dispatched = self.dispatcher.dispatched_offset
        logics_ts = self.dispatcher.logics_msg_timestamp_ms
        # Taken before the flushes: it counts only entries they make durable (entries dispatched
        # meanwhile are not flushed here, and a manifest counting them could come back from a power cut
        # longer than its queues, which start would then rebuild from the log's start).
        manifest = self.dispatcher.manifest()
        for cq in list(self.queues.queues.values()):
            cq.flush()  # with the creation of its new files made durable: the manifest counts on them
        self.queues.sync_created_dirs()
        cp = cpfmt.Checkpoint(self.flusher.flushed_offset, dispatched, self.flusher.physic_msg_timestamp_ms,
                              logics_ts, self.clock.now_ms(), *self._checked)
        try:
            fs.replace_file(self._manifest_path, manifest)
            fs.replace_file(self._checkpoint_path, cpfmt.encode(cp),
                            before_rename=lambda: failpoints.hit("checkpoint.before_rename"))
        except OSError as exc:
            self.disk.checkpoint_skipped_for(exc)  # re-raised unless the disk is full
            return False
        self.disk.checkpoint_written()
        return True

    def append_waits(self) -> bool:
        """Whether an append's acknowledgement waits now for a flush (SYNC flush mode) or for the in-sync
        replicas (SYNC replication by default), rather than only for the write."""
        return bool(self.flusher is not None and self.flusher.sync) or self.gate.sync_wanted(None)

    def _on_flushed(self, flushed_offset: int) -> None:
        if self.config.flush_mode == FLUSH_SYNC:
            self._dispatch_to(min(flushed_offset, self.gate.committed_offset()))

    @property
    def running(self) -> bool:
        """Whether the store serves (started, not stopping): a Tail stream (mqstore.tailing) ends when not."""
        return self._running

    def check_running(self) -> None:
        """Unavailable unless the store serves (started, not stopping): every call that reads or writes the
        log checks it first, also those of the modules that use the store (mqstore.replication.store_ops)."""
        if not self._running:
            raise Unavailable("the store is not running (starting or stopping); retry shortly")

    def health_problem(self) -> str | None:
        """None when healthy; otherwise what is wrong: not running, or a background duty that a bug
        ended (mqstore.background)."""
        if not self._running:
            return "not running"
        for duty in (self.flusher, self.warmer, self.maintenance):
            problem = duty.problem()
            if problem:
                return problem
        return None

    def visible_offset(self) -> int:
        return self.dispatcher.dispatched_offset

    # ------------------------------------------------------------------ append
    async def append_async(self, topic: str, messages: Sequence[MessageIn], *, system_writer: str | None = None,
                           replication: str | None = None) -> AppendResults:
        """Append one batch, all or nothing. ``messages`` may also be the compiled codec's WireMessages
        (mqstore.codec; the encoder takes either). ``system_writer`` is the internal way into system topics:
        the owning writer names itself and its registered rules decide (mqstore.writers); the gRPC API never
        sets it, so clients cannot write system topics. The gateway names itself too (mqstore.relayed), to
        store its producers' born hosts in user topics. ``replication`` ("ASYNC", "SYNC", None: the node's
        default) says whether the acknowledgement waits for the in-sync replicas (``gate``).

        The one version of the append (mqstore.waits): on an event loop (the CommitLog's Append on its
        grpc.aio port) the batch is written on the loop's thread, then its waits are awaited, not blocked
        on: the fsync that covers it (SYNC flush: Flusher.flushed) and the in-sync replicas'
        acknowledgement (SYNC replication); a cancelled await leaves the batch written, as a caller that
        went away during a blocking append would. A caller on a thread calls :meth:`append`, which runs it
        there (mqstore.waits.blocking): the same checks, errors and results, its waits blocking."""
        rec, sync_replication = self._writable(topic, messages, system_writer, replication)
        return await self._append_checked(rec, messages, sync_replication)

    def append(self, topic: str, messages: Sequence[MessageIn], *, system_writer: str | None = None,
               replication: str | None = None) -> AppendResults:
        """:meth:`append_async` on this thread, its waits blocking here (mqstore.waits.blocking; written out
        rather than made by waits.blocking_version: the hot path, ~0.5 us less a call)."""
        return waits.blocking(self.append_async(topic, messages, system_writer=system_writer,
                                                replication=replication))

    def append_own(self, topic: str, messages: Sequence[MessageIn], replication: str | None = None) -> AppendResults:
        """:meth:`append`'s path to the store's own topics (offsets, topic events), which no writer may name."""
        invariant(topic in STORE_WRITER.topics, f"{topic!r} is not one of the store's own topics")
        rec, sync_replication = self._writable(topic, messages, None, replication, own=True)
        return waits.blocking(self._append_checked(rec, messages, sync_replication))

    def _writable(self, topic: str, messages, system_writer: str | None, replication: str | None,
                  own: bool = False) -> tuple[TopicRecord, bool]:
        """The topic's record and whether the append waits for the in-sync replicas, once the batch may be
        written by ``system_writer`` (by the store itself when ``own``; ``gate.begin_append`` is called)."""
        self.check_running()
        sync_replication = self.gate.sync_wanted(replication)
        self.gate.begin_append(sync_replication)
        self.disk.refuse_if_read_only()
        rec = self.topics.get(topic)
        if not own:
            self.writers.check(rec, messages, system_writer)
        return rec, sync_replication

    async def _append_checked(self, rec: TopicRecord, messages, sync_replication: bool) -> AppendResults:
        """The append of a batch whose writer may write ``rec`` (append's checks, or the store itself);
        ``sync_replication``: the acknowledgement waits for the in-sync replicas (``gate.begin_append``
        was called with it)."""
        written, uniq_keys = self._write(rec, messages)
        if self.flusher.sync:
            await self.flusher.flushed(written.end)
        durability = self._dispatch_written(written.end)
        replicas, epoch = await self.gate.finish_append(written.end, sync_replication)
        return self._acknowledged(written, uniq_keys, durability, replicas, epoch, sync_replication)

    def _write(self, rec: TopicRecord, messages):
        """Encode and write the batch: (what the commit log wrote, the batch's unique keys)."""
        batch = self.encoder.encode_batch(rec, messages, self.clock.now_ms())
        try:
            written = self.commitlog.append(batch)
        except ResourceExhausted as exc:
            self.disk.allocation_failed(str(exc))
            raise
        self.warmer.poke()
        return written, batch.uniq_keys

    def _dispatch_written(self, end: int) -> str:
        """After the write (and, under SYNC flush, the fsync that covers ``end``): dispatch what readers may
        see; the durability the append is acknowledged with."""
        if self.flusher.sync:
            self._dispatch_to(min(self.flusher.flushed_offset, self.gate.committed_offset()))
            return DURABILITY_FLUSHED
        self._dispatch_to(min(end, self.gate.committed_offset()))
        return DURABILITY_FLUSHED if self.flusher.flushed_offset >= end else DURABILITY_WRITTEN

    def _acknowledged(self, written, uniq_keys, durability: str, replicas: int, epoch: int,
                      sync_replication: bool) -> AppendResults:
        if sync_replication:
            # A Pull after the acknowledgement sees it (the ack thread may still dispatch): what the in-sync set
            # holds, as the replica side's advance_visible (mqstore.store_replica) dispatches it.
            held = self.flusher.flushed_offset if self.flusher.sync else self.commitlog.written_offset
            self._dispatch_to(min(held, self.gate.committed_offset()))
        return AppendResults(self._msg_id_prefix, written.entries, uniq_keys, written.store_timestamp_ms,
                             durability, replicas, epoch)

    # ------------------------------------------------------------------ reads
    def _queue(self, topic: str, queue_id: int):
        limits.at_least_zero("queue_id", queue_id)
        rec = self.topics.get(topic)
        if not 0 <= queue_id < rec.queue_count:
            raise NotFound(f"topic {topic!r} has queues 0..{rec.queue_count - 1}; there is no queue {queue_id}")
        return rec, self.queues.get(topic, queue_id)

    def flushed_offset(self) -> int:
        """Physical offset up to which the log is fsynced."""
        return self.flusher.flushed_offset if self.flusher else 0

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        _, cq = self._queue(topic, queue_id)
        if cq is None:
            return QueueInfo(topic, queue_id, 0, 0)
        return QueueInfo(topic, queue_id, cq.min_offset, cq.max_offset)

    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, max_bytes: int = 1 << 20,
             tags: Sequence[str] = (), long_poll_ms: int = 0, selector: Selector | None = None) -> PullResult:
        """Messages of a queue from ``offset``: those whose TAGS is one of ``tags`` (all when empty) and that
        ``selector`` (a compiled SQL92 filter, mqstore.filters.sql92) matches, when given."""
        return self._pull(read_queue, self.commitlog.decode_at, PullResult, topic, queue_id, offset, max_messages,
                          max_bytes, tags, long_poll_ms, selector)

    def pull_raw(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, max_bytes: int = 1 << 20,
                 tags: Sequence[str] = (), long_poll_ms: int = 0, selector: Selector | None = None) -> RawPullResult:
        """:meth:`pull` with the checked records' bytes instead of decoded messages (the compiled codec's
        Pull): the same messages, offsets and errors."""
        return self._pull(read_queue_raw, self.commitlog.checked_at, RawPullResult, topic, queue_id, offset,
                          max_messages, max_bytes, tags, long_poll_ms, selector)

    def _pull(self, read, read_at, result, topic: str, queue_id: int, offset: int, max_messages: int,
              max_bytes: int, tags: Sequence[str], long_poll_ms: int, selector: Selector | None):
        self.check_running()
        max_messages = limits.limit("max_messages", max_messages, default=32, maximum=MAX_PULL_MESSAGES)
        max_bytes = limits.limit("max_bytes", max_bytes, default=1 << 20, maximum=MAX_PULL_BYTES)
        long_poll_ms = limits.limit("long_poll_ms", long_poll_ms, default=0, maximum=MAX_LONG_POLL_MS)
        limits.at_least_zero("offset", offset, "a queue offset")
        _, cq = self._queue(topic, queue_id)
        lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
        if offset < lo or offset > hi:
            raise OutOfRange(f"offset {offset} is outside queue {topic}/{queue_id}: valid offsets are [{lo}, {hi}]",
                             min_value=lo, max_value=hi)
        if offset == hi and long_poll_ms:
            cq = self._long_polls.wait(lambda: self.queues.get(topic, queue_id), offset, long_poll_ms,
                                       lambda: self._running)
        if cq is None or offset >= cq.max_offset:
            return result([], offset, lo, cq.max_offset if cq else hi)
        return read(cq, offset, max_messages, max_bytes, tags, self.encoder.tag_code, read_at, selector)

    def wait_for_messages(self, ready: Callable[[], bool], wait_ms: int) -> bool:
        """Wait up to ``wait_ms`` until ``ready()`` (checked on every dispatch of new records), as a Pull's
        long poll, sharing its ``max_long_poll_waiters`` slots: with none free it answers at once. Returns
        ``ready()``'s last value."""
        self.check_running()
        return self._long_polls.wait_for(ready, min(max(wait_ms, 0), MAX_LONG_POLL_MS), lambda: self._running)

    def get_message(self, physical_offset: int) -> StoredMessage:
        """The record at ``physical_offset``; NotFound also for a record of a deleted topic (store_topics)."""
        self.check_running()
        limits.at_least_zero("physical_offset", physical_offset, "a byte address in the commit log")
        data = self.commitlog.record_at(physical_offset, self.visible_offset())
        rec = self.commitlog.decode_at(physical_offset, len(data))
        self._check_owned(rec.topic, physical_offset)
        return StoredMessage(rec, record.offset_msg_id(rec.store_host, rec.store_port, physical_offset))

    def get_message_raw(self, physical_offset: int) -> bytes:
        """:meth:`get_message` as the checked record's bytes (the compiled codec's GetMessage)."""
        self.check_running()
        limits.at_least_zero("physical_offset", physical_offset, "a byte address in the commit log")
        data = self.commitlog.record_at(physical_offset, self.visible_offset())
        checked = self.commitlog.checked_at(physical_offset, len(data))
        self._check_owned(record_reader.peek_topic(checked, 0).decode("utf-8", "replace"), physical_offset)
        return checked

    def _check_owned(self, topic: str, physical_offset: int) -> None:
        if not self.topics.owns(topic, physical_offset):
            raise NotFound(f"the record at physical offset {physical_offset} belongs to a deleted topic "
                           f"{shown(topic)} (an earlier topic of that name, if one exists now): it is not served")

    def get_messages(self, physical_offsets: Sequence[int], raw: bool = False) -> list[MessageLookup]:
        """GetMessage for each offset, in order (at most MAX_GET_MESSAGES): the message, or why not
        (no record starts there, outside the log, damaged; ``beyond_end`` when at or past the end this node
        serves: not a loss). One bad offset does not fail the others.
        With ``raw``, each found message is the checked record's bytes (:meth:`get_message_raw`)."""
        self.check_running()
        if not 1 <= len(physical_offsets) <= MAX_GET_MESSAGES:
            raise InvalidArgument(f"physical_offsets: give 1 to {MAX_GET_MESSAGES} offsets, "
                                  f"not {len(physical_offsets)}")
        for index, offset in enumerate(physical_offsets):  # a malformed one fails the request, not its entry
            limits.at_least_zero(f"physical_offsets[{index}]", offset, "a byte address in the commit log")
        get = self.get_message_raw if raw else self.get_message
        out = []
        for offset in physical_offsets:
            try:
                out.append(MessageLookup(get(offset)))
            except OutOfRange as exc:
                past_end = exc.max_value is not None and offset >= exc.max_value
                out.append(MessageLookup(None, str(exc), beyond_end=past_end))
            except NotFound as exc:
                out.append(MessageLookup(None, str(exc)))
            except DataLoss as exc:
                out.append(MessageLookup(None, str(exc), damaged=True))
        return out

    def get_message_by_id(self, msg_id: str, raw: bool = False) -> StoredMessage | bytes:
        """By offset message id; with ``raw``, as :meth:`get_message_raw`."""
        try:
            _, _, physical_offset = record.parse_offset_msg_id(msg_id)
        except ValueError as exc:
            raise InvalidArgument(f"msg_id {shown(msg_id)} is not an offset message id: {exc}") from None
        return self.get_message_raw(physical_offset) if raw else self.get_message(physical_offset)

    # ------------------------------------------------------------------ offsets
    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int, boundary: str = "lower") -> int:
        if boundary not in ("lower", "upper"):
            raise InvalidArgument(f"boundary must be 'lower' or 'upper', not {shown(boundary)}")
        limits.at_least_zero("timestamp_ms", timestamp_ms, "ms since the epoch")
        _, cq = self._queue(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp_ms, boundary == "upper", self.commitlog.store_timestamp_at)

    def store_info(self) -> StoreInfo:
        reason = self.disk.read_only_reason()
        # The log's start for a reader: with the object storage tier's local retention, below the local log (the
        # followers, the Index's retention among them, read and keep what is only in the tier).
        return StoreInfo(self.commitlog.logical_min(), self.commitlog.written_offset,
                         self.flusher.flushed_offset if self.flusher else 0, self.visible_offset(),
                         self.config.flush_mode, reason is not None, reason, len(self.segments.segments),
                         self.config.segment_size_bytes, f"{self.config.store_host}:{self.config.store_port}",
                         codec.ACTIVE)

    def _positions(self) -> dict[tuple[str], int]:
        flushed = self.flusher.flushed_offset if self.flusher else 0
        return {("min",): self.commitlog.min_offset, ("written",): self.commitlog.written_offset,
                ("flushed",): flushed, ("visible",): self.visible_offset()}

    # ------------------------------------------------------------------ the log's ends (replication, timer, tier)
    def log_end(self) -> int:
        return self.commitlog.written_offset

    def log_min(self) -> int:
        return self.commitlog.min_offset

    def halt(self) -> None:
        """Stop like a crash: no final flush, no checkpoint, abort marker left. For crash tests in one
        process; the bytes already copied into the mappings stay, as after kill -9."""
        self._running = False
        self.maintenance.stop(5.0)
        self.warmer.stop(5.0)
        self.flusher.abandon(5.0)
        self.queues.close()
        self.segments.close()
        self.topics.close()
        self._release_lock()
