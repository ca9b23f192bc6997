"""What the object storage tier holds and does, for ``mqstore tier status`` (CommitLog/GetTierStatus) and the
commit log's Prometheus metrics, in Kafka's shape (KIP-405's RemoteCopy/RemoteFetch/RemoteLogSize...).

The commit log is one log of every topic's records, so the tier's unit is the commit log segment, not the
topic: :func:`tier_status` answers per node, with one row per segment (local, in the tier, or both).

  figure                 meaning
  ---------------------- ---------------------------------------------------------------------------------
  local_bytes            bytes of the commit log's segment files on this node's disk
  tiered_bytes           bytes of the segments whose upload is FINISHED (their objects are in the tier)
  copy_lag_segments/     sealed local segments with no FINISHED upload yet, their bytes, and the age of the
    _bytes/_age_ms       oldest one (now - its file's last write, when it was sealed)
  pending_uploads        attempts STARTED without an end (being uploaded, or left by a crash)
  expired_segments/      objects the tier's own retention deleted (DELETED in the ledger, as far as it is in
    _bytes               the log; local retention drops old ledger records, so a count that may shrink)
  copy_bytes/errors      this node's uploads since it started (bytes FINISHED; steps that failed)
  last_error(_ms)        the last failed upload step's message and time (kept until the next one)
  fetch_bytes/errors     bytes read from the tier by reads below the local log; reads that failed
  cache_hits/misses      the tier's block cache (--tier-cache-bytes)
  logical_min/local_min  the logical log's start (total retention) and the local log's start

Metrics (:func:`register_metrics`), every one read when scraped: ``mqstore_tier_copy_bytes_total``,
``mqstore_tier_copy_errors_total``, ``mqstore_tier_fetch_bytes_total``, ``mqstore_tier_fetch_errors_total``,
``mqstore_tier_copy_lag_segments``, ``mqstore_tier_copy_lag_bytes``, ``mqstore_tier_size_bytes``,
``mqstore_tier_local_bytes``, ``mqstore_tier_expired_bytes_total``, ``mqstore_tier_cache_hits_total``,
``mqstore_tier_cache_misses_total``.

Thread-safety: reads counters and the ledger's snapshot (under its lock); callable from any thread.
"""

from __future__ import annotations

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


class TierStats:
    def __init__(self, store, uploader: Uploader, reader: TierReader, logical_min: Callable[[], int]):
        self.store, self.uploader, self.reader, self.logical_min = store, uploader, reader, logical_min

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
        age = 0
        if lag:
            try:
                age = max(now_ms - int(lag[0].path.stat().st_mtime * 1000), 0)
            except OSError:  # deleted meanwhile
                age = 0
        rows: tuple[SegmentStatus, ...] = ()
        if with_segments:
            bases = sorted({s.start for s in local} | set(finished))
            by_base = {s.start: s for s in local}
            rows = tuple(SegmentStatus(base, by_base[base].size if base in by_base else finished[base].segment_size,
                                       base in by_base, base in finished, base in sealed,
                                       finished[base].key if base in finished else "")
                         for base in bases)
        error_ms, error = uploader.last_error or (0, "")
        return TierStatus(
            tier_url=uploader.tier.url, leader=uploader.leader_epoch() is not None,
            local_bytes=sum(s.size for s in local), tiered_bytes=sum(u.segment_size for u in finished.values()),
            tiered_segments=len(finished), copy_lag_segments=len(lag), copy_lag_bytes=sum(s.size for s in lag),
            copy_lag_age_ms=age, pending_uploads=len(pending), expired_segments=len(deleted),
            expired_bytes=sum(u.segment_size for u in deleted.values()), copy_bytes=uploader.copy_bytes,
            copy_errors=uploader.copy_errors, last_error=error, last_error_ms=error_ms,
            fetch_bytes=reader.fetched_bytes, fetch_errors=reader.fetch_errors, cache_hits=reader.cache.hits,
            cache_misses=reader.cache.misses, cache_bytes=reader.cache.bytes, logical_min=self.logical_min(),
            local_min=store.segments.min_offset, segments=rows)

    def _lag(self) -> tuple[int, int]:
        finished, _ = self.uploader.ledger.snapshot()
        lag = [s for s in self.uploader.segments() if s.base not in finished]
        return len(lag), sum(s.size for s in lag)


def register_metrics(registry, stats: TierStats) -> None:
    """The tier's metrics on the commit log's registry (mqstore.metrics), read at each scrape."""
    up, reader = stats.uploader, stats.reader
    registry.counter_fn("mqstore_tier_copy_bytes_total", "bytes of commit log segments this node uploaded to the "
                        "object storage tier (FINISHED)", lambda: up.copy_bytes)
    registry.counter_fn("mqstore_tier_copy_errors_total", "upload steps to the object storage tier that failed",
                        lambda: up.copy_errors)
    registry.counter_fn("mqstore_tier_fetch_bytes_total", "bytes read from the object storage tier (reads below "
                        "the local log)", lambda: reader.fetched_bytes)
    registry.counter_fn("mqstore_tier_fetch_errors_total", "reads from the object storage tier that failed "
                        "(UNAVAILABLE or DATA_LOSS)", lambda: reader.fetch_errors)
    registry.gauge_fn("mqstore_tier_copy_lag_segments", "sealed local segments not yet uploaded (no FINISHED)",
                      lambda: stats._lag()[0])
    registry.gauge_fn("mqstore_tier_copy_lag_bytes", "bytes of the sealed local segments not yet uploaded",
                      lambda: stats._lag()[1])
    registry.gauge_fn("mqstore_tier_size_bytes", "bytes of the segments in the object storage tier (FINISHED)",
                      lambda: sum(u.segment_size for u in up.ledger.snapshot()[0].values()))
    registry.gauge_fn("mqstore_tier_local_bytes", "bytes of the commit log's segment files on the local disk",
                      lambda: sum(s.size for s in list(stats.store.segments.segments)))
    registry.counter_fn("mqstore_tier_expired_bytes_total", "bytes of objects this node deleted by the tier's "
                        "own retention", lambda: up.expired_bytes)
    registry.counter_fn("mqstore_tier_cache_hits_total", "reads of the tier served by its block cache",
                        lambda: reader.cache.hits)
    registry.counter_fn("mqstore_tier_cache_misses_total", "reads of the tier that had to GET a block",
                        lambda: reader.cache.misses)

