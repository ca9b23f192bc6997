"""What the compaction segments' tier (mqstore.compaction.tier) shows: each queue's figures for the compactor's
DescribeQueue (``mqstore compact status``) and the ``mqstore_compactor_tier_*`` metrics (Kafka's remote storage
metrics, for compaction log segments).

  figure            meaning (one queue)
  ----------------- ------------------------------------------------------------------------------------------
  local_bytes       its sealed segments' ``.log`` bytes on the local disk (the active segment is not counted)
  tiered_bytes      its FINISHED uploads' bytes in the tier; ``tiered_segments`` how many
  pending_uploads   local sealed segments without a FINISHED upload (the upload lag); ``pending_bytes`` theirs
  last_error        the last failed pass of the queue (kept until a pass of it succeeds), else why the tier's
                    manifest is not read yet (a start with the tier down), else ""; ``last_error_ms`` its time
"""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.format import compaction_segment as cseg


@dataclass(frozen=True)
class QueueTierStatus:
    tier_url: str
    local_bytes: int
    tiered_bytes: int
    tiered_segments: int
    pending_uploads: int
    pending_bytes: int
    last_error: str
    last_error_ms: int


def queue_status(tier, qlog) -> QueueTierStatus:
    """``tier`` a CompactionTier, ``qlog`` a QueueLog (the table above)."""
    local = tiered = tiered_n = pending = pending_bytes = 0
    for base in qlog.bases[:-1]:
        entry = tier.finished(qlog.topic, qlog.queue_id, base)
        if entry is not None:
            tiered, tiered_n = tiered + entry.segment_size, tiered_n + 1
        if base in qlog.tiered:
            continue
        try:
            size = (qlog.directory / cseg.log_name(base)).stat().st_size
        except FileNotFoundError:  # (a round's install or local retention meanwhile)
            continue
        local += size
        if entry is None:
            pending, pending_bytes = pending + 1, pending_bytes + size
    error, at = tier.queue_error(qlog.topic, qlog.queue_id)
    return QueueTierStatus(tier.url, local, tiered, tiered_n, pending, pending_bytes, error, at)


def register_metrics(tier, metrics) -> None:
    """Kafka's remote storage metrics, for compaction log segments (``metrics`` a mqstore.metrics.Registry)."""
    p = "mqstore_compactor_tier_"
    metrics.counter_fn(p + "copy_bytes_total", "bytes of sealed compaction segments uploaded",
                       lambda: tier.uploaded_bytes)
    metrics.counter_fn(p + "copy_errors_total", "queues whose upload pass failed", lambda: tier.copy_errors)
    metrics.counter_fn(p + "fetch_bytes_total", "bytes read from the tier (segments only there)",
                       lambda: tier.reader.fetched_bytes)
    metrics.counter_fn(p + "fetch_errors_total", "reads of the tier that failed (UNAVAILABLE or DATA_LOSS)",
                       lambda: tier.reader.fetch_errors)
    metrics.gauge_fn(p + "copy_lag_segments", "local sealed segments without a FINISHED upload (last pass)",
                     lambda: tier.lag_segments)
    metrics.gauge_fn(p + "manifest_loaded", "1 once the tier's manifest was read (0: the tier did not answer "
                     "since the start; tiered segments answer UNAVAILABLE)", lambda: int(tier.loaded))
    metrics.gauge_fn(p + "size_bytes", "bytes of FINISHED uploads in the tier",
                     lambda: sum(s.segment_size for s in tier.segments().values() if tier.finished(*s.where) == s))
