"""The rule of ordered groups (mqstore.pop.ordered.plan) case by case, and an ordered group turned off on a
running PopService (its held and waiting messages go through the retry topic)."""

from __future__ import annotations

import threading

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import NotFound
from mqstore.model import MessageIn
from mqstore.pop.config import PopConfig
from mqstore.pop.ordered import PROPERTY_MESSAGE_GROUP, Seen, plan
from mqstore.pop.service import PopService
from mqstore.store_parts import build_store

NOW = 1_000_000


def in_flight(offset: int, group: str, attempt: int = 1) -> Seen:
    return Seen(offset, group, attempt, NOW + 10_000, False, 3)


def waiting(offset: int, group: str, attempt: int = 1) -> Seen:
    return Seen(offset, group, attempt, NOW - 1, False, 3)


def test_a_group_in_flight_holds_its_new_messages_and_the_others_flow():
    p = plan([in_flight(0, "a")], [(1, "a"), (2, "b"), (3, "a"), (4, "b")], NOW, room=10, held_room=10)
    assert (p.again, p.new, p.held, p.stop_at) == ([], [2, 4], [1, 3], None)


def test_a_waiting_message_goes_again_before_the_later_ones_of_its_group_in_one_batch():
    p = plan([waiting(0, "a"), Seen(1, "a", 0, NOW, False, 3)], [(2, "a"), (3, "b")], NOW, room=10, held_room=10)
    assert (p.again, p.new, p.held) == ([0, 1], [2, 3], [])


def test_any_message_of_a_group_in_flight_holds_up_its_earlier_waiting_ones():
    # 0 expired, 1 got a longer invisible time (ChangeInvisibleDuration): 0 waits for 1 to be acked or expire
    p = plan([waiting(0, "a"), in_flight(1, "a")], [(2, "a")], NOW, room=10, held_room=10)
    assert (p.again, p.new, p.held) == ([], [], [2])


def test_attempts_run_out_the_group_waits_for_the_dead_letter_move_and_the_others_flow():
    p = plan([waiting(0, "a", attempt=3)], [(1, "a"), (2, "b")], NOW, room=10, held_room=10)
    assert (p.again, p.new, p.held) == ([], [2], [1])


def test_messages_without_a_group_are_a_group_each():
    p = plan([in_flight(0, "")], [(1, ""), (2, "")], NOW, room=10, held_room=10)
    assert (p.new, p.held) == ([1, 2], [])


def test_out_of_room_and_out_of_held_room_stop_at_that_message():
    p = plan([], [(0, "a"), (1, "b"), (2, "c")], NOW, room=2, held_room=10)
    assert (p.new, p.stop_at) == ([0, 1], 2)
    p = plan([in_flight(0, "a")], [(1, "a"), (2, "a"), (3, "b")], NOW, room=10, held_room=1)
    assert (p.new, p.held, p.stop_at) == ([], [1], 2)  # the queue waits at 2, as RocketMQ's whole queue would


@pytest.fixture
def pop(small_config):
    store = build_store(small_config(), FakeClock())
    store.start()
    service = PopService(store, PopConfig())
    service.start(run_duty=False)
    store.topic_admin.create("t", 1)
    yield service
    service.stop()
    store.stop()


def _receive(pop, batch: int, ack: bool = False) -> list[tuple[bytes, int]]:
    got = pop.receive("g", "t", invisible_duration_ms=10_000, batch_size=batch).deliveries
    if ack and got:
        assert {o.status for o in pop.ack("g", "t", [d.receipt_handle for d in got]).outcomes} == {"ok"}
    return [(d.message.record.body, d.attempt) for d in got]


def test_an_ordered_group_turned_off_retries_its_held_and_waiting_messages_through_the_retry_topic(pop):
    pop.set_group_settings("g", ordered=True)
    pop.store.append("t", [MessageIn(body=b, properties={PROPERTY_MESSAGE_GROUP: "a"}) for b in (b"a0", b"a1")])
    assert _receive(pop, 1) == [(b"a0", 1)]
    assert _receive(pop, 10) == []             # a1 is held behind a0
    assert pop.group_settings("g").ordered
    pop.set_group_settings("g", ordered=False)
    assert not pop.group_settings("g").ordered
    while pop.reviver.revive_due():            # a1 (held) goes to the retry topic at once
        pass
    assert _receive(pop, 10, ack=True) == [(b"a1", 1)]  # never handed out before: its first delivery
    pop.clock.advance(10_000)                  # a0's invisible time passes: retried as any group's
    while pop.reviver.revive_due():
        pass
    assert _receive(pop, 10) == [(b"a0", 2)]


def test_a_long_poll_of_an_ordered_group_ends_when_an_ack_or_an_expiry_frees_a_held_message(pop):
    pop.set_group_settings("g", ordered=True)
    pop.store.append("t", [MessageIn(body=b, properties={PROPERTY_MESSAGE_GROUP: "a"}) for b in (b"a0", b"a1", b"a2")])
    (first,) = pop.receive("g", "t", invisible_duration_ms=10_000, batch_size=1).deliveries
    assert _receive(pop, 1) == []  # a1 and a2 held behind a0 (the second read held them)

    def polling() -> tuple[threading.Thread, list]:
        out: list = []
        thread = threading.Thread(target=lambda: out.extend(pop.receive(
            "g", "t", invisible_duration_ms=10_000, batch_size=1, long_poll_ms=30_000).deliveries), daemon=True)
        thread.start()
        return thread, out

    thread, out = polling()  # the fake clock never ends the poll: only the ack can
    assert {o.status for o in pop.ack("g", "t", [first.receipt_handle]).outcomes} == {"ok"}
    thread.join(20)
    assert not thread.is_alive() and [(d.message.record.body, d.attempt) for d in out] == [(b"a1", 1)]
    thread, out = polling()
    pop.clock.advance(10_000)  # a1's invisible time passes: it goes again in place
    thread.join(20)
    assert not thread.is_alive() and [(d.message.record.body, d.attempt) for d in out] == [(b"a1", 2)]


def test_a_waiting_message_whose_record_is_gone_ends_lost_and_its_group_goes_on(pop, monkeypatch):
    pop.set_group_settings("g", ordered=True)
    pop.store.append("t", [MessageIn(body=b, properties={PROPERTY_MESSAGE_GROUP: "a"}) for b in (b"a0", b"a1")])
    (first,) = pop.receive("g", "t", invisible_duration_ms=10_000, batch_size=1).deliveries
    pop.clock.advance(10_000)
    real = pop.store.get_message

    def gone(physical_offset):  # retention removed a0's segment (a fault hard to line up for real here)
        if physical_offset == first.message.record.physical_offset:
            raise NotFound("the record's segment was removed by retention")
        return real(physical_offset)
    monkeypatch.setattr(pop.store, "get_message", gone)
    assert _receive(pop, 10) == [(b"a1", 1)]
    assert pop.counters.snapshot().lost == 1
