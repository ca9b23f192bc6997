"""The check loop on the domain objects (no sockets, FakeClock): store time decides, the per-group rate
limit holds, a group without a stream is not counted, one failing transaction does not stop the scan,
and check_max real checks park the transaction."""

from __future__ import annotations

import pathlib

from mqstore.clock import FakeClock
from mqstore.errors import DataLoss
from mqstore.model import TailFrame
from mqstore.txn.checkback import Checker, CheckHub
from mqstore.txn.config import TxnConfig
from mqstore.txn.table import OPEN, PARKED, Half, TxnTable

T0 = 1_700_000_000_000


def setup(tmp_path: pathlib.Path, count: int, **overrides):
    config = TxnConfig(data_dir=tmp_path, check_rate_per_s=2, check_max=2, **overrides)
    table = TxnTable(config.resolved_keep)
    table.apply(TailFrame(b"", 0, 0, 0))  # caught up with an empty log: ready
    for i in range(count):
        table.add_halves(f"t{i}", "pg", "orders", [Half(100 * i, i, T0 + i)])
    clock, hub, parked, broken = FakeClock(T0), CheckHub(), [], set()

    def read(offsets):
        if offsets[0] in broken:
            raise DataLoss(f"half at {offsets[0]} is damaged")
        return []

    checker = Checker(config, table, hub, clock, read, lambda topic, messages: parked.append(topic))
    return table, clock, hub, checker, broken, parked


def test_store_time_rate_limit_and_streams(tmp_path):
    table, clock, hub, checker, _, _ = setup(tmp_path, 5)
    clock.advance(10_000)
    assert checker.scan() == 0  # no stream of the group: nothing sent, nothing counted
    assert all(t.checks_sent == 0 for t in table.transactions())
    session = hub.open("pg")
    assert checker.scan() == 2  # the group's bucket holds 2 checks
    assert [c.txn_id for c in (session.next_check(0), session.next_check(0))] == ["t0", "t1"]  # oldest first
    clock.advance(1000)  # two more tokens
    assert checker.scan() == 2 and checker.checks_sent == 4


def test_a_failing_transaction_does_not_stop_the_scan_and_check_max_parks(tmp_path):
    table, clock, hub, checker, broken, parked = setup(tmp_path, 2, check_interval_ms=1000)
    hub.open("pg")
    broken.add(0)  # t0's half cannot be read
    clock.advance(10_000)
    assert checker.scan() == 1 and checker.check_failures == 1
    assert table.get("t1").checks_sent == 1 and table.get("t0").checks_sent == 0
    clock.advance(1000)
    checker.scan()  # t1: second check
    clock.advance(1000)
    checker.scan()  # t1 reached check_max: parked
    assert table.get("t1").state == PARKED and parked == ["TRANS_CHECK_MAX_TIME_TOPIC"]
    assert table.get("t0").state == OPEN and checker.check_failures == 3
