"""Rebuilding pop consumption's memory at start from ``rmq_sys_REVIVE_LOG``.

From the revive checkpoint (the offset of group CID_RMQ_SYS_REVIVE_GROUP, written by the revive duty)
to the end of the revive queue, in log order: a CK puts its messages in flight (replacing an older CK of
the same message) and raises the pop offset of its queue to its POP_OFFSET_AFTER (each raised offset
above the stored one is written back by the next flush, and holds the checkpoint until then); an ACK
ends the entries still under the CKs it names. Entries whose invisible time passed while the service was down
are delivered again by the first revive step. A record that fails its checks or does not decode is
skipped and logged (pop.replay_damaged / pop.replay_bad_record): its messages, if it was a CK, are not
delivered again (they were delivered once).

Then :func:`reconcile`: a crash inside a revive step (after the copies, before their ACK record) leaves
expired entries whose copies exist already. Each copy names its entry (property POP_CK, mqstore.pop.copies),
so the last records of each destination topic of an expired entry are read, and an entry whose copy is
found is ended with its ACK record instead of being copied a second time. Only the tail is read (the
copies of the cut step are the destination's last records, after at most a few DLQ moves by receives
running then), so the check is bounded; a copy it misses is delivered twice, as the contract allows.
"""

from __future__ import annotations

import collections

import structlog

from mqstore import store_offsets
from mqstore import topics as topic_rules
from mqstore.errors import DataLoss, NotFound
from mqstore.model import StoredMessage
from mqstore.pop import copies, records
from mqstore.pop.revive import destination_of

log = structlog.get_logger("mqstore.pop.replay")

READ_BATCH = 1000


def replay(pop, revive_group: str) -> int:
    """Apply the revive log from the checkpoint to ``pop`` (a PopService not yet started); returns the
    checkpoint it started from."""
    store = pop.store
    try:
        checkpoint = store_offsets.query_offset(store, revive_group, topic_rules.REVIVE_TOPIC, 0)
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


def reconcile(pop, tail_records: int) -> int:
    """End the expired entries whose copy a cut revive step already wrote (see the module docstring);
    returns how many."""
    by_destination = collections.defaultdict(list)
    for entry in pop.inflight.expired(pop.clock.now_ms()):
        by_destination[destination_of(entry)].append(entry)
    ended = 0
    for (destination, reason), entries in by_destination.items():
        markers = _tail_markers(pop.store, destination, tail_records)
        if reason == records.REASON_REVIVED:  # a step cut by the upgrade copied to the legacy name
            markers |= _tail_markers(pop.store, topic_rules.legacy_retry_topic(*entries[0].key[:2]), tail_records)
        found = [e for e in entries if copies.ck_marker(e.ck_id, e.key[4]) in markers]
        if found:
            pop.end_entries(found, reason)
            pop.counters.add(**{"dead_lettered" if reason == records.REASON_DEAD else "revived": len(found)})
            log.info("pop.copies_found", topic=destination, entries=len(found),
                     consequence="ended without a second copy")
            ended += len(found)
    return ended


def _tail_markers(store, topic: str, count: int) -> set[str]:
    """The POP_CK markers of the last ``count`` records of ``topic``'s queue 0."""
    try:
        info = store.queue_info(topic, 0)
    except NotFound:
        return set()
    offset, markers = max(info.min_offset, info.max_offset - count), set()
    while offset < info.max_offset:
        try:
            result = store.pull(topic, 0, offset, READ_BATCH, 8 << 20)
        except DataLoss as exc:
            offset = (exc.queue_offset if exc.queue_offset is not None else offset) + 1
            continue
        markers.update(m.record.properties.get(copies.PROPERTY_POP_CK, "") for m in result.messages)
        offset = result.next_offset
    markers.discard("")
    return markers


def _apply(pop, message: StoredMessage) -> None:
    rec = message.record
    try:
        if records.kind_of(rec.body) in records.CK_KINDS:
            ck = records.decode_ck(rec.body)
            pop.inflight.add(ck, rec.physical_offset, rec.queue_offset)
            name = pop.source_name(ck.group, ck.topic, ck.source)
            start = pop.store.topics.start_of(name)
            # A CK written before its queue's topic was (re)created is of a topic of the name deleted since.
            if ck.pop_offset_after >= 0 and start is not None and rec.physical_offset >= start:
                pop.offsets.raise_floor((ck.group, name, ck.queue_id), ck.pop_offset_after)
        else:
            for entry in records.decode_ack(rec.body):
                pop.inflight.apply_ack(entry.ck_id, entry.queue_offset)
    except records.BadRecord as exc:
        log.error("pop.replay_bad_record", queue_offset=rec.queue_offset, physical_offset=rec.physical_offset,
                  error=str(exc))
        pop.counters.add(bad_records=1)
