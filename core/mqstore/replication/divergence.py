"""Where a returning replica's log stops agreeing with its leader's (Kafka KIP-101/KIP-279, RocketMQ
RIP-44's truncation on a master change), from the two epoch histories alone.

Epoch numbers are handed out once (the election bumps the epoch with compare-and-set), so two logs that
both hold bytes of epoch e hold the same bytes there, from start(e) up to where the shorter of the two
stops holding epoch e. Take the newest epoch the replica holds; if the leader knows it too, both logs
agree up to min(its end in the replica's log, its end in the leader's log), and everything below is
shared (older epochs agree as well). If the leader never had that epoch (the replica led it alone,
or the election skipped it), go to the replica's next older epoch. Epoch 0 (bytes written before any
epoch) is shared by both by definition: every node of a group starts from the same, empty, log.

Nothing acknowledged under SYNC replication is above the point: such a byte was held by every in-sync
replica, the new leader among them, in the same epoch (see README.md in this package).
"""

from __future__ import annotations

from mqstore.replication.epochs import EpochHistory


def truncation_point(replica: EpochHistory, replica_end: int, leader: EpochHistory, leader_end: int) -> int:
    """The end of the longest prefix both logs share: the replica keeps [.., point) and copies from there."""
    leader_epochs = {e.epoch for e in leader.entries}
    for entry in reversed(replica.entries):
        if entry.epoch in leader_epochs:
            return min(replica.end_of(entry.epoch, replica_end), leader.end_of(entry.epoch, leader_end))
    return min(replica.end_of(0, replica_end), leader.end_of(0, leader_end))
