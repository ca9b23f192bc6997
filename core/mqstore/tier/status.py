"""What the object storage tier holds and does, for ``mqstore tier status`` (CommitLog/GetTierStatus) and the
commit log's Prometheus metrics, in Kafka's shape (KIP-405's RemoteCopy/RemoteFetch/RemoteLogSize...).

Every kind of file the tier holds is covered, under the same names. The commit log is one log of every topic's
records, so its unit is the segment, not the topic: the status's top-level figures are the commit log's, with
one row per segment (local, in the tier, or both) on request; a topic's consume queue files are its own
(:class:`TopicStatus`, one row per topic that has queue files locally or in the tier: every queue of it).

  figure                 meaning (the commit log's segments at the top; a topic's queue files in its row)
  ---------------------- ---------------------------------------------------------------------------------
  local_bytes            bytes of the files on this node's disk
  tiered_bytes/          bytes and count of the files whose upload is FINISHED (their objects are in the tier)
    tiered_segments/_files
  copy_lag_segments/     sealed local files with no FINISHED upload yet, their bytes, and the age of the
    _files/_bytes/_age_ms  oldest one (now - its file's last write, when it was sealed)
  pending_uploads        attempts STARTED without an end (being uploaded, or left by a crash)
  expired_segments/      objects the tier's own retention deleted (DELETED in the ledger, as far as it is in
    _files/_bytes        the log; local retention drops old ledger records, so a count that may shrink)
  copy_bytes/errors      this node's uploads since it started (bytes FINISHED; steps that failed)
  last_error(_ms)        the last failed upload step's message and time (kept until the next one)
  fetch_bytes/errors     bytes read from the tier by reads below the local files; reads that failed
  cache_hits/misses      the tier's block cache (--tier-cache-bytes), shared by every kind (top level only)
  logical_min/local_min  the logical log's start (total retention) and the local log's start (top level only)

So a node that uploaded everything the tier holds has ``copy_bytes == tiered_bytes``, at the top and in each row.

Metrics (:func:`register_metrics`), every one read when scraped, each labelled ``kind`` (``commitlog``, with
``topic=""``; ``consume_queue``, with its ``topic``), so a sum over a family is the node's every kind:
``mqstore_tier_copy_bytes_total``, ``mqstore_tier_copy_errors_total``, ``mqstore_tier_fetch_bytes_total``,
``mqstore_tier_fetch_errors_total``, ``mqstore_tier_copy_lag_segments`` (segments or files),
``mqstore_tier_copy_lag_bytes``, ``mqstore_tier_size_bytes``, ``mqstore_tier_local_bytes``,
``mqstore_tier_expired_bytes_total``; unlabelled: ``mqstore_tier_cache_hits_total``,
``mqstore_tier_cache_misses_total``. A scrape computes the status once (the families read it).

Thread-safety: reads counters and the ledger's snapshot (under its lock); callable from any thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from mqstore.tier.reads import TierReader
from mqstore.tier.uploader import Uploader


@dataclass(frozen=True, slots=True)
class SegmentStatus:
    base: int
    size: int
    local: bool
    tiered: bool      # its upload is FINISHED
    sealed: bool      # every byte final (uploadable); the newest segment is not
    key: str          # the FINISHED upload's object key, "" when none


@dataclass(frozen=True, slots=True)
class TopicStatus:
    """A topic's consume queue files in the tier (every queue of it), the figures of the module docstring."""
    topic: str
    local_bytes: int
    tiered_bytes: int
    tiered_files: int
    copy_lag_files: int
    copy_lag_bytes: int
    copy_lag_age_ms: int
    pending_uploads: int
    expired_files: int
    expired_bytes: int
    copy_bytes: int
    copy_errors: int
    last_error: str
    last_error_ms: int
    fetch_bytes: int
    fetch_errors: int


@dataclass(frozen=True, slots=True)
class TierStatus:
    tier_url: str
    leader: bool
    local_bytes: int
    tiered_bytes: int
    tiered_segments: int
    copy_lag_segments: int
    copy_lag_bytes: int
    copy_lag_age_ms: int
    pending_uploads: int
    expired_segments: int
    expired_bytes: int
    copy_bytes: int
    copy_errors: int
    last_error: str
    last_error_ms: int
    fetch_bytes: int
    fetch_errors: int
    cache_hits: int
    cache_misses: int
    cache_bytes: int
    logical_min: int
    local_min: int
    segments: tuple[SegmentStatus, ...] = ()
    topics: tuple[TopicStatus, ...] = ()


class TierStats:
    def __init__(self, store, uploader: Uploader, reader: TierReader, logical_min: Callable[[], int]):
        self.store, self.uploader, self.reader, self.logical_min = store, uploader, reader, logical_min
        self._scraped: tuple[float, TierStatus] | None = None  # (monotonic s, status) of the last scrape

    def status(self, *, with_segments: bool = False) -> TierStatus:
        store, uploader, reader = self.store, self.uploader, self.reader
        ledger = uploader.ledger
        ledger.catch_up()
        finished, pending = ledger.snapshot()
        deleted = ledger.deleted()
        now_ms = store.clock.now_ms()
        local = list(store.segments.segments)
        sealed = {s.base for s in uploader.segments()}
        lag = [s for s in local if s.start in sealed and s.start not in finished]
        age = _age_ms(lag, now_ms)
        rows: tuple[SegmentStatus, ...] = ()
        if with_segments:
            bases = sorted({s.start for s in local} | set(finished))
            by_base = {s.start: s for s in local}
            rows = tuple(SegmentStatus(base, by_base[base].size if base in by_base else finished[base].segment_size,
                                       base in by_base, base in finished, base in sealed,
                                       finished[base].key if base in finished else "")
                         for base in bases)
        error_ms, error = uploader.last_error or (0, "")
        queue_fetched = sum(reader.queue_fetched_bytes.values())
        queue_errors = sum(reader.queue_fetch_errors.values())
        return TierStatus(
            tier_url=uploader.tier.url, leader=uploader.leader_epoch() is not None,
            local_bytes=sum(s.size for s in local), tiered_bytes=sum(u.segment_size for u in finished.values()),
            tiered_segments=len(finished), copy_lag_segments=len(lag), copy_lag_bytes=sum(s.size for s in lag),
            copy_lag_age_ms=age, pending_uploads=len(pending), expired_segments=len(deleted),
            expired_bytes=sum(u.segment_size for u in deleted.values()), copy_bytes=uploader.copy_bytes,
            copy_errors=uploader.copy_errors, last_error=error, last_error_ms=error_ms,
            fetch_bytes=reader.fetched_bytes - queue_fetched, fetch_errors=reader.fetch_errors - queue_errors,
            cache_hits=reader.cache.hits, cache_misses=reader.cache.misses, cache_bytes=reader.cache.bytes,
            logical_min=self.logical_min(), local_min=store.segments.min_offset, segments=rows,
            topics=self._topics(now_ms))

    def _topics(self, now_ms: int) -> tuple[TopicStatus, ...]:
        """One row per topic with consume queue files locally (its queues not kept local) or in the ledger."""
        from mqstore.store_retention import LOCAL_ONLY_TOPICS  # the store's module; this one is imported by it
        uploader, reader, ledger = self.uploader, self.reader, self.uploader.ledger
        queues, deleted = ledger.queue_snapshot(), ledger.queue_deleted()
        local: dict[str, int] = {}
        for (topic, _), cq in list(self.store.queues.queues.items()):
            if topic not in LOCAL_ONLY_TOPICS:
                local[topic] = local.get(topic, 0) + sum(f.size for f in list(cq.files.segments))
        lag: dict[str, list] = {}
        for sealed in uploader.queue_files() if uploader.queue_files is not None else ():
            if sealed.file.base not in queues.get((sealed.topic, sealed.queue_id), ({}, []))[0]:
                lag.setdefault(sealed.topic, []).append(sealed.file)
        rows = []
        for topic in sorted(set(local) | {t for t, _ in queues} | {t for t, _ in deleted}):
            finished = [u for (t, _), (f, _) in queues.items() if t == topic for u in f.values()]
            pending = sum(len(p) for (t, _), (_, p) in queues.items() if t == topic)
            expired = [u for (t, _), d in deleted.items() if t == topic for u in d.values()]
            late = lag.get(topic, [])
            counters = uploader.topics.get(topic)
            error_ms, error = (counters.last_error if counters is not None else None) or (0, "")
            rows.append(TopicStatus(
                topic=topic, local_bytes=local.get(topic, 0), tiered_bytes=sum(u.segment_size for u in finished),
                tiered_files=len(finished), copy_lag_files=len(late), copy_lag_bytes=sum(f.size for f in late),
                copy_lag_age_ms=_age_ms(late, now_ms), pending_uploads=pending, expired_files=len(expired),
                expired_bytes=sum(u.segment_size for u in expired),
                copy_bytes=counters.copy_bytes if counters is not None else 0,
                copy_errors=counters.copy_errors if counters is not None else 0, last_error=error,
                last_error_ms=error_ms, fetch_bytes=reader.queue_fetched_bytes.get(topic, 0),
                fetch_errors=reader.queue_fetch_errors.get(topic, 0)))
        return tuple(rows)

    def scraped(self) -> TierStatus:
        """The status for a scrape: computed once per second at most (every metric family reads it)."""
        now = time.monotonic()
        if self._scraped is None or now - self._scraped[0] >= 1.0:
            self._scraped = (now, self.status())
        return self._scraped[1]


def _age_ms(files: list, now_ms: int) -> int:
    """now - the first file's last write (0: none, or deleted meanwhile)."""
    if not files:
        return 0
    try:
        return max(now_ms - int(files[0].path.stat().st_mtime * 1000), 0)
    except (OSError, AttributeError):  # deleted meanwhile; a file without a path (tests)
        return 0


LOG = ("commitlog", "")


def _by_kind(stats: TierStats, log_figure: str, topic_figure: str | None = None) -> Callable[[], dict]:
    """label values (kind, topic) -> the figure, the commit log's and every topic's, of one scrape's status."""
    def read() -> dict:
        status = stats.scraped()
        values = {LOG: getattr(status, log_figure)}
        for row in status.topics:
            values[("consume_queue", row.topic)] = getattr(row, topic_figure or log_figure)
        return values
    return read


def register_metrics(registry, stats: TierStats) -> None:
    """The tier's metrics on the commit log's registry (mqstore.metrics), read at each scrape."""
    reader = stats.reader
    labels = ("kind", "topic")
    for name, help_, log_figure, topic_figure in (
            ("mqstore_tier_copy_bytes_total", "bytes of files this node uploaded to the object storage tier "
             "(FINISHED)", "copy_bytes", None),
            ("mqstore_tier_copy_errors_total", "upload steps to the object storage tier that failed", "copy_errors",
             None),
            ("mqstore_tier_fetch_bytes_total", "bytes read from the object storage tier (reads below the local "
             "files)", "fetch_bytes", None),
            ("mqstore_tier_fetch_errors_total", "reads from the object storage tier that failed (UNAVAILABLE or "
             "DATA_LOSS)", "fetch_errors", None)):
        registry.counter_fn(name, help_, _by_kind(stats, log_figure, topic_figure), label_names=labels)
    up = stats.uploader
    registry.counter_fn("mqstore_tier_expired_bytes_total", "bytes of objects this node deleted by the tier's own "
                        "retention", lambda: {LOG: up.expired_bytes, **{("consume_queue", topic): c.expired_bytes
                                                                         for topic, c in list(up.topics.items())}},
                        label_names=labels)
    for name, help_, log_figure, topic_figure in (
            ("mqstore_tier_copy_lag_segments", "sealed local segments or consume queue files not yet uploaded (no "
             "FINISHED)", "copy_lag_segments", "copy_lag_files"),
            ("mqstore_tier_copy_lag_bytes", "bytes of the sealed local files not yet uploaded", "copy_lag_bytes", None),
            ("mqstore_tier_size_bytes", "bytes of the files in the object storage tier (FINISHED)", "tiered_bytes",
             None),
            ("mqstore_tier_local_bytes", "bytes of the files on the local disk (commit log segments; a topic's "
             "consume queue files)", "local_bytes", None)):
        registry.gauge_fn(name, help_, _by_kind(stats, log_figure, topic_figure), label_names=labels)
    registry.counter_fn("mqstore_tier_cache_hits_total", "reads of the tier served by its block cache",
                        lambda: reader.cache.hits)
    registry.counter_fn("mqstore_tier_cache_misses_total", "reads of the tier that had to GET a block",
                        lambda: reader.cache.misses)
