"""What the Consumer service's Stats answers: the counters, the in-flight size, the revive checkpoint and,
for one group and topic, the pop offset and in-flight count of each queue (the retry topic's too)."""

from __future__ import annotations

from dataclasses import dataclass

from mqstore import store_offsets
from mqstore import topics as topic_rules
from mqstore.errors import InvalidArgument, NotFound
from mqstore.pop import storage
from mqstore.pop.counters import PopCounts

NEVER = -1  # the pop offset of a queue the group never received from


@dataclass(frozen=True, slots=True)
class QueueState:
    topic: str
    queue_id: int
    pop_offset: int
    max_offset: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class PopStatsView:
    counts: PopCounts
    in_flight: int
    revive_offset: int
    revive_log_end: int
    queues: list[QueueState]
    group_in_flight: int


def pop_stats(pop, group: str = "", topic: str = "") -> PopStatsView:
    """``pop``: a PopService. With ``group`` and ``topic`` (both or neither) that group's state on that topic."""
    if bool(group) != bool(topic):
        raise InvalidArgument("give both group and topic (the state of that group on that topic), or neither "
                              "(the counters only)")
    queues: list[QueueState] = []
    group_in_flight = 0
    if group:
        topic_rules.validate_group_name(group)
        rec = pop.store.topic_admin.get(topic)
        for source in pop.receiver.sources(group, rec, None):
            queues.append(_queue_state(pop, group, topic, source))
        group_in_flight = pop.inflight.count(group, topic)
    return PopStatsView(pop.counters.snapshot(), len(pop.inflight), pop.reviver.revive_offset, pop.revive_end(),
                        queues, group_in_flight)


def _queue_state(pop, group: str, topic: str, source) -> QueueState:
    offset = pop.offsets.peek((group, source.name, source.queue_id))
    if offset is None:
        try:
            offset = store_offsets.query_offset(pop.store, group, source.name, source.queue_id)
        except NotFound:  # never received (or the retry topic does not exist yet)
            offset = NEVER
    max_offset = storage.max_offsets(pop.store, [(source.name, source.queue_id)])[0]
    in_flight = pop.inflight.count_queue(group, topic, source.kind, source.queue_id)
    return QueueState(source.name, source.queue_id, offset, max_offset, in_flight)
