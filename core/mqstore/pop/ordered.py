"""Ordered consumer groups (RocketMQ's FIFO in pop mode, kept per message group rather than per queue): the
rule a receive of an ordered group follows on each queue of the topic. Pure: no I/O, no clock.

A message's group is its property ``__SHARDINGKEY`` (RocketMQ's PROPERTY_SHARDING_KEY, the v2
``message_group``; the gateway's FIFO producer puts every message of a group in one queue). A message
without one is a group of its own: it never waits for another message and never holds one up.

The queue's state is the pop offset O (messages at O and after were never read by this group) and the
group's in-flight entries of the queue (mqstore.pop.inflight), each in one of three states:

  in flight   handed out (attempt >= 1), invisible until visible_at, or claimed by a writer
  waiting     expired, or held (attempt 0: read past O while its message group was in flight, never
              handed out): to be handed out in place, with attempt + 1
  done        not in the set (acked, moved to the DLQ, or filtered out by the tag expression)

The rule (:func:`plan`): a message group with a message in flight hands out nothing; otherwise its
waiting messages are handed out in queue order, then its messages from O, several in one batch in their
order. A waiting message whose attempts ran out (attempt >= max_attempts) is the revive duty's to move to
the DLQ (mqstore.pop.revive), and its group waits for that; then the group moves on. A message read from O
whose group is held up is held (an entry of attempt 0 in the receive's CK, so that O moves past it and the
message groups behind it in the queue keep flowing), up to MAX_HELD_PER_QUEUE held messages a queue; past
that, the queue waits at that message (as RocketMQ's whole queue does).

The state is pop's durable records and nothing else: an ordered group's CK (KIND 3, mqstore.pop.records)
names its handed-out and held messages, an ACK ends them, and the replay at start (and on a new leader)
rebuilds the entries and O from the revive log as for any group. Acks out of order within a batch end
only the acked messages: an acked message is never handed out again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

PROPERTY_MESSAGE_GROUP = "__SHARDINGKEY"  # RocketMQ's MessageConst.PROPERTY_SHARDING_KEY
# Messages read past the pop offset and held because their message group was in flight, per queue and group:
# the memory and CK size an ordered group's stalled message groups may take before the queue waits.
MAX_HELD_PER_QUEUE = 1000


@dataclass(frozen=True, slots=True)
class Seen:
    """An entry of the queue's in-flight set as the rule sees it."""
    queue_offset: int
    message_group: str       # "" none: a group of its own
    attempt: int             # 0: held
    visible_at_ms: int
    busy: bool
    max_attempts: int

    def in_flight(self, now_ms: int) -> bool:
        return self.busy or (self.attempt > 0 and self.visible_at_ms > now_ms)


@dataclass(slots=True)
class Plan:
    again: list[int] = field(default_factory=list)   # entries handed out again in place (queue offsets)
    new: list[int] = field(default_factory=list)     # messages from O handed out
    held: list[int] = field(default_factory=list)    # messages from O held
    stop_at: int | None = None                       # the first message from O left for later (None: all read)


def message_group_of(properties: dict[str, str]) -> str:
    return properties.get(PROPERTY_MESSAGE_GROUP, "")


def plan(entries: Sequence[Seen], fresh: Sequence[tuple[int, str]], now_ms: int, room: int,
         held_room: int) -> Plan:
    """What one receive does on one queue: ``entries`` (by queue offset), ``fresh`` the messages read from
    O ((queue offset, message group) in order, filtered ones left out), ``room`` how many it may hand out,
    ``held_room`` how many more it may hold."""
    out = Plan()
    blocked = {e.message_group for e in entries if e.message_group and e.in_flight(now_ms)}
    for e in entries:
        if e.in_flight(now_ms) or (e.message_group and e.message_group in blocked):
            continue
        if e.attempt >= e.max_attempts or not room:
            if e.message_group:
                blocked.add(e.message_group)
            continue
        out.again.append(e.queue_offset)
        room -= 1
    for queue_offset, message_group in fresh:
        if message_group and message_group in blocked:
            if held_room:
                out.held.append(queue_offset)
                held_room -= 1
                continue
        elif room:
            out.new.append(queue_offset)
            room -= 1
            continue
        out.stop_at = queue_offset
        break
    return out
