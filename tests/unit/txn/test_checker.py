"""The check loop on the domain objects (no sockets, FakeClock): store time decides, the per-group rate
limit holds, a group without a stream is not counted, one failing transaction does not stop the scan,
check_max real checks park the transaction, CHECK_IMMUNITY_TIME_IN_SECONDS delays the first check of
its transaction, and an answer stops the checks of its transaction the moment it arrives."""

from __future__ import annotations

import pathlib

from mqstore.clock import FakeClock
from mqstore.errors import DataLoss
from mqstore.txn.checkback import CheckHub
from mqstore.txn.checker import Checker
from mqstore.txn.config import TxnConfig
from mqstore.txn.table import OPEN, PARKED, Half, TxnTable

T0 = 1_700_000_000_000


def setup(tmp_path: pathlib.Path, count: int, immunity_ms: int = 0, **overrides):
    config = TxnConfig(data_dir=tmp_path, **{"check_rate_per_s": 2, "check_max": 2, **overrides})
    table = TxnTable(config.resolved_keep)
    table.set_applied(0, 0)  # caught up with an empty log: ready
    for i in range(count):
        table.learn_half(f"t{i}", "pg", "orders", "", Half(100 * i, i, T0 + i, immunity_ms=immunity_ms))
    clock, hub, parked, broken = FakeClock(T0), CheckHub(), [], set()

    def read(offsets):
        if offsets[0] in broken:
            raise DataLoss(f"half at {offsets[0]} is damaged")
        return []

    checker = Checker(config, table, hub, clock, read, lambda topic, messages: parked.append(topic))
    return table, clock, hub, checker, broken, parked


def sent(session) -> list[str]:
    """The checks a stream's handler would send now (each counted as it goes)."""
    out = []
    while (check := session.take(0)) is not None:
        out.append(check.txn_id)
    return out


def test_store_time_rate_limit_and_streams(tmp_path):
    table, clock, hub, checker, _, _ = setup(tmp_path, 5)
    clock.advance(10_000)
    assert checker.scan() == 0  # no stream of the group: nothing sent, nothing counted
    assert all(t.checks_sent == 0 for t in table.transactions())
    session = hub.open("pg", checker.on_send)
    assert checker.scan() == 2  # the group's bucket holds 2 checks
    assert sent(session) == ["t0", "t1"]  # oldest first
    clock.advance(1000)  # two more tokens
    assert checker.scan() == 2
    assert len(sent(session)) == 2 and checker.checks_sent == 4


def test_a_failing_transaction_does_not_stop_the_scan_and_check_max_parks(tmp_path):
    table, clock, hub, checker, broken, parked = setup(tmp_path, 2, check_interval_ms=1000)
    session = hub.open("pg", checker.on_send)
    broken.add(0)  # t0's half cannot be read
    clock.advance(10_000)
    assert checker.scan() == 1 and checker.check_failures == 1
    assert sent(session) == ["t1"]
    assert table.get("t1").checks_sent == 1 and table.get("t0").checks_sent == 0
    clock.advance(1000)
    checker.scan()  # t1: second check
    assert sent(session) == ["t1"]
    clock.advance(1000)
    checker.scan()  # t1 reached check_max: parked
    assert table.get("t1").state == PARKED and parked == ["TRANS_CHECK_MAX_TIME_TOPIC"]
    assert table.get("t0").state == OPEN and checker.check_failures == 3


def test_check_immunity_delays_the_first_check_of_its_transaction(tmp_path):
    table, clock, hub, checker, _, _ = setup(tmp_path, 1, immunity_ms=60_000, transaction_timeout_ms=6000)
    session = hub.open("pg", checker.on_send)
    clock.advance(59_000)  # far past transaction_timeout_ms, not past the message's own 60 s
    assert checker.scan() == 0 and sent(session) == []
    clock.advance(1001)
    assert checker.scan() == 1 and sent(session) == ["t0"]


def test_an_answer_stops_the_checks_at_once_also_a_check_already_queued(tmp_path):
    table, clock, hub, checker, _, parked = setup(tmp_path, 1, check_interval_ms=1000, check_max=3)
    session = hub.open("pg", checker.on_send)
    clock.advance(10_000)
    assert checker.scan() == 1 and sent(session) == ["t0"]
    clock.advance(1000)
    assert checker.scan() == 1  # a second check waits in the stream's outbox...
    assert checker.record_answer("t0", "ROLLBACK")  # ...when the answer to the first arrives
    assert sent(session) == [] and table.get("t0").checks_sent == 1  # dropped, not counted
    for _ in range(5):  # the decision is being made durable (its OP record): never checked, never parked
        clock.advance(1000)
        assert checker.scan() == 0
    assert table.get("t0").state == OPEN and parked == [] and table.get("t0").checks_sent == 1
    checker.answer_done("t0", None)  # (had the decision failed, checks resume)
    clock.advance(1000)
    assert checker.scan() == 1


def test_a_check_goes_only_to_a_stream_whose_user_may_publish_its_topic(tmp_path):
    """A stream of the group whose user may not PUB the transaction's topic never gets its check (its
    halves): the check goes to one that may, and with none that may it waits, not counted."""
    table, clock, hub, checker, _, _ = setup(tmp_path, 1, check_rate_per_s=100, check_max=10)
    other = hub.open("pg", checker.on_send, allows=lambda topic: topic != "orders")
    clock.advance(10_000)
    assert checker.scan() == 0 and sent(other) == [] and table.get("t0").checks_sent == 0
    owner = hub.open("pg", checker.on_send, allows=lambda topic: topic == "orders")
    for _ in range(4):  # round robin among the streams that may carry it: always the owner's
        table.get("t0").last_check_ms = 0
        assert checker.scan() == 1
        assert sent(owner) == ["t0"] and sent(other) == []
