"""delivery.DueUnits (the read slot's units in Timer._dequeue) against the heap it replaced: random loads, pushes
and pops give the same units in the same order, never one before its due time, at most the limit a pop."""

from __future__ import annotations

import heapq
import random

from mqstore.format.timer_unit import KIND_DELIVER, KIND_ROLL, Unit
from mqstore.timer.delivery import DueUnits


def _units(rng: random.Random, count: int, offsets) -> list[Unit]:
    return [Unit(1_000 + rng.randint(0, 50), 1_000, next(offsets), 0, -1, KIND_ROLL if rng.random() < 0.05
                 else KIND_DELIVER) for _ in range(count)]


def test_due_units_pop_as_the_heap_did():
    rng = random.Random(35)
    for _ in range(300):
        offsets = iter(rng.sample(range(1 << 20), 5000))
        due_units, heap, popped = DueUnits(), [], 0
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.5:
                units = _units(rng, rng.choice([0, 1, 3, 40, 400]), offsets)
                due_units.take(units)
                for unit in units:  # the heap before: (due, offset, unit); a roll is due at the slot
                    heapq.heappush(heap, (unit.deliver_ms if unit.kind == KIND_DELIVER else 0, unit.timer_offset, unit))
            else:
                now, limit = 1_000 + rng.randint(-5, 55), rng.choice([1, 7, 1000])
                want = []
                while heap and heap[0][0] <= now and len(want) < limit:
                    want.append(heapq.heappop(heap)[2])
                got = due_units.pop_due(now, limit)
                assert got == want
                assert all(u.deliver_ms <= now or u.kind == KIND_ROLL for u in got)
                popped += len(got)
            assert len(due_units) == len(heap)
            if heap:
                assert due_units.first_due() == heap[0][0]
