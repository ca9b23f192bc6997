"""Rebuilding pop consumption's memory at start from ``rmq_sys_REVIVE_LOG``.

From the revive checkpoint (the offset of group CID_RMQ_SYS_REVIVE_GROUP, written by the revive duty)
to the end of the revive queue, in log order: a CK puts its messages in flight (replacing an older CK of
the same message) and raises the pop offset of its queue to its POP_OFFSET_AFTER (each raised offset
above the stored one is written back by the next flush, and holds the checkpoint until then); an ACK
ends the entries still under the CKs it names. Entries whose invisible time passed while the service was down
are delivered again by the first revive step. A record that fails its checks or does not decode is
skipped and logged (pop.replay_damaged / pop.replay_bad_record): its messages, if it was a CK, are not
delivered again (they were delivered once).
"""

from __future__ import annotations

import structlog

from mqstore import topics as topic_rules
from mqstore.errors import DataLoss, NotFound
from mqstore.model import StoredMessage
from mqstore.pop import records

log = structlog.get_logger("mqstore.pop.replay")

READ_BATCH = 1000


def replay(pop, revive_group: str) -> int:
    """Apply the revive log from the checkpoint to ``pop`` (a PopService not yet started); returns the
    checkpoint it started from."""
    store = pop.store
    try:
        checkpoint = store.query_offset(revive_group, topic_rules.REVIVE_TOPIC, 0)
    except NotFound:
        checkpoint = 0
    info = store.queue_info(topic_rules.REVIVE_TOPIC, 0)
    if checkpoint < info.min_offset:
        log.warning("pop.replay_from_min", checkpoint=checkpoint, min_offset=info.min_offset,
                    reason="retention removed revive records past the checkpoint")
    offset = max(checkpoint, info.min_offset)
    start, count = offset, 0
    while offset < info.max_offset:
        try:
            result = store.pull(topic_rules.REVIVE_TOPIC, 0, offset, READ_BATCH, 8 << 20)
        except DataLoss as exc:
            bad = exc.queue_offset if exc.queue_offset is not None else offset
            log.error("pop.replay_damaged", queue_offset=bad, physical_offset=exc.physical_offset, error=str(exc))
            pop.counters.add(bad_records=1)
            offset = bad + 1
            continue
        for message in result.messages:
            _apply(pop, message)
        count += len(result.messages)
        offset = result.next_offset
    pop.offsets.settle(start)
    pop.counters.add(replayed_records=count)
    log.info("pop.replayed", from_offset=start, to_offset=offset, records=count, in_flight=len(pop.inflight))
    return checkpoint


def _apply(pop, message: StoredMessage) -> None:
    rec = message.record
    try:
        if records.kind_of(rec.body) == records.KIND_CK:
            ck = records.decode_ck(rec.body)
            pop.inflight.add(ck, rec.physical_offset, rec.queue_offset)
            if ck.pop_offset_after >= 0:
                name = pop.source_name(ck.group, ck.topic, ck.source)
                pop.offsets.raise_floor((ck.group, name, ck.queue_id), ck.pop_offset_after)
        else:
            for entry in records.decode_ack(rec.body):
                pop.inflight.apply_ack(entry.ck_id, entry.queue_offset)
    except records.BadRecord as exc:
        log.error("pop.replay_bad_record", queue_offset=rec.queue_offset, physical_offset=rec.physical_offset,
                  error=str(exc))
        pop.counters.add(bad_records=1)
