"""The in-flight set in memory (mqstore.pop.inflight): claims, expiry order, replacement by a later CK, the
caps, and the revive checkpoint's low water."""

from __future__ import annotations

import pytest

from mqstore.errors import InvariantViolation
from mqstore.pop.inflight import EXPIRED, NOT_IN_FLIGHT, OK, InFlightTable
from mqstore.pop.records import Checkpoint, CkEntry


def ck(offsets, visible_at=1_000, group="g", topic="t", source=0, queue_id=0, attempt=1):
    return Checkpoint(group, topic, source, queue_id, 3, 0, visible_at, max(offsets) + 1,
                      tuple(CkEntry(o, 100 + o, attempt) for o in offsets))


def test_ack_claims_once_and_a_later_ck_replaces_the_entry():
    table = InFlightTable(100, 100)
    table.add(ck([0, 1]), ck_id=10, revive_offset=0)
    status, entry = table.claim(("g", "t", 0, 0, 0), 10, now_ms=500)
    assert status == OK and entry.physical_offset == 100
    assert table.claim(("g", "t", 0, 0, 0), 10, 500) == (NOT_IN_FLIGHT, None)  # claimed by another writer
    table.remove([entry])
    assert table.claim(("g", "t", 0, 0, 0), 10, 500) == (NOT_IN_FLIGHT, None)
    table.add(ck([1], visible_at=5_000), ck_id=20, revive_offset=1)  # ChangeInvisibleDuration's CK
    assert table.claim(("g", "t", 0, 0, 1), 10, 500) == (NOT_IN_FLIGHT, None)  # the old handle is dead
    assert table.claim(("g", "t", 0, 0, 1), 20, 2_000)[0] == OK
    assert table.claim(("g", "t", 0, 0, 9), 20, 0) == (NOT_IN_FLIGHT, None)


def test_expired_entries_cannot_be_acked_and_revive_claims_them_oldest_first():
    table = InFlightTable(100, 100)
    table.add(ck([0], visible_at=3_000), ck_id=1, revive_offset=0)
    table.add(ck([1], visible_at=2_000), ck_id=2, revive_offset=1)
    table.add(ck([2], visible_at=9_000), ck_id=3, revive_offset=2)
    assert table.claim(("g", "t", 0, 0, 1), 2, now_ms=2_000) == (EXPIRED, None)
    assert table.next_expiry_ms() == 2_000
    claimed = table.claim_expired(now_ms=5_000, limit=10)
    assert [e.key[4] for e in claimed] == [1, 0]
    assert table.claim_expired(now_ms=5_000, limit=10) == []  # claimed already
    table.release(claimed[:1])  # its copy failed: in flight again, and due again
    assert [e.key[4] for e in table.claim_expired(now_ms=5_000, limit=10)] == [1]
    assert table.next_expiry_ms() == 9_000


def test_reservations_bound_each_group_and_the_total():
    table = InFlightTable(max_per_group=5, max_total=8)
    first = table.reserve("g", "t", 4)
    assert first.remaining == 4 and table.reserve("g", "t", 4).remaining == 1
    table.add(ck([0, 1, 2]), ck_id=1, revive_offset=0, reservation=first)
    assert first.remaining == 1 and table.count("g", "t") == 5
    table.unreserve(first)
    assert table.count("g", "t") == 4
    assert table.reserve("h", "t", 10).remaining == 4  # 8 in all: 3 entries, 1 still reserved by the second
    with pytest.raises(InvariantViolation):
        table.add(ck([5, 6, 7, 8, 9]), ck_id=2, revive_offset=1, reservation=first)


def test_low_water_is_the_oldest_live_ck_or_one_being_appended():
    table = InFlightTable(100, 100)
    assert table.low_water(revive_end=7) == 7
    table.add(ck([0]), ck_id=100, revive_offset=3)
    table.add(ck([1]), ck_id=200, revive_offset=5)
    assert table.low_water(7) == 3
    with table.appending(revive_end=2):
        assert table.low_water(7) == 2
    entry = table.claim(("g", "t", 0, 0, 0), 100, 0)[1]
    table.remove([entry])
    assert table.low_water(7) == 5
    assert table.apply_ack(200, 1) and table.low_water(7) == 7
    assert not table.apply_ack(200, 1) and not table.apply_ack(999, 0)


def test_apply_ack_ends_only_the_entry_of_its_ck():
    table = InFlightTable(100, 100)
    table.add(ck([4]), ck_id=1, revive_offset=0)
    table.add(ck([4], visible_at=9_000), ck_id=2, revive_offset=1)
    assert not table.apply_ack(1, 4)  # the ACK of the replaced CK
    assert len(table) == 1 and table.apply_ack(2, 4) and len(table) == 0
