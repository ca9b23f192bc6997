"""Receives with auto_renew are renewed ahead of their invisible time until acked (mqstore.gateway.renewal),
against a model of pop's handles: each ChangeInvisibleDuration replaces the handle, and only the latest
one works. An injected clock, no sleeps."""

from __future__ import annotations

import random
import threading

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition, ResourceExhausted, Unavailable
from mqstore.gateway.config import GatewayConfig
from mqstore.gateway.consuming import Consuming
from mqstore.gateway.publishing import TopicCache
from mqstore.gateway.renewal import Renewals
from mqstore.pop import handle as handles
from mqstore.pop.receive import Delivery, ReceiveResult
from mqstore.pop.service import AckOutcome, ChangeResult
from tests.unit.gateway.test_publishing_consuming import Lookups

INVISIBLE_MS, AHEAD_MS, MAX_MS = 60_000, 10_000, 3 * 3_600_000


class PopModel:
    """Pop's receipt handles: ``live`` maps the message to its one working handle and its visible time."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.live: dict[str, tuple[str, int]] = {}   # message -> (working handle, visible_at_ms)
        self.owner: dict[str, str] = {}              # every handle given -> its message
        self.changes = 0
        self.failing: Exception | None = None     # what every change raises (the commit log's trouble)
        self.acked: list[str] = []

    def _handle(self, message: str, visible_at_ms: int) -> str:
        self.changes += 1
        text = handles.encode("g", "t", handles.ReceiptHandle(source=0, queue_id=0, queue_offset=len(self.owner),
                                                              ck_id=self.changes, visible_at_ms=visible_at_ms,
                                                              attempt=1))
        self.owner[text] = message
        self.live[message] = (text, visible_at_ms)
        return text

    def deliver(self, message: str, invisible_ms: int = INVISIBLE_MS) -> Delivery:
        visible = self.clock.now_ms() + invisible_ms
        return Delivery(message=None, topic="t", receipt_handle=self._handle(message, visible), attempt=1,
                        visible_at_ms=visible)

    def _message(self, handle: str) -> str:
        message = self.owner.get(handle, "")
        working = self.live.get(message)
        if working is None or working[0] != handle or working[1] <= self.clock.now_ms():
            raise FailedPrecondition(f"handle {handle} no longer works")
        return message

    def change_invisible_duration(self, group, topic, receipt_handle, invisible_duration_ms):
        if self.failing is not None:
            raise self.failing
        message = self._message(receipt_handle)
        visible = self.clock.now_ms() + invisible_duration_ms
        return ChangeResult(self._handle(message, visible), visible, 1)

    def receive(self, group, topic, **kwargs):
        return ReceiveResult([self.deliver(f"m{i}") for i in range(kwargs["batch_size"])], self.clock.now_ms())

    def ack(self, group, topic, receipt_handles):
        outcomes = []
        for handle in receipt_handles:
            try:
                message = self._message(handle)
                self.acked.append(message)
                del self.live[message]
                outcomes.append(AckOutcome(handle, "ok"))
            except FailedPrecondition:
                outcomes.append(AckOutcome(handle, "not_in_flight"))
        return outcomes


def table(clock, pop, alive=lambda client_id: True, **overrides) -> Renewals:
    values = dict(invisible_ms=INVISIBLE_MS, ahead_ms=AHEAD_MS, max_ms=MAX_MS, max_entries=1000, alive=alive)
    values.update(overrides)
    return Renewals(pop, clock, **values)


def test_a_message_is_renewed_ahead_of_its_invisible_time_and_acked_with_the_current_handle():
    clock = FakeClock()
    pop = PopModel(clock)
    renewals = table(clock, pop)
    first = pop.deliver("m")
    renewals.add("c1", "g", "t", [first])
    clock.advance(INVISIBLE_MS - AHEAD_MS - 1)
    assert renewals.renew_due() == 0          # not due yet
    for _ in range(10):                       # ten minutes of work on one message: it never becomes visible
        clock.advance(1)
        assert renewals.renew_due() == 1
        clock.advance(INVISIBLE_MS - AHEAD_MS - 1)
        assert pop.live["m"][1] > clock.now_ms()
    current = renewals.take("g", first.receipt_handle)
    assert current == pop.live["m"][0] != first.receipt_handle
    assert len(renewals) == 0 and renewals.renew_due() == 0
    assert renewals.take("g", first.receipt_handle) == first.receipt_handle  # not renewed: passed through


def test_entries_are_dropped_when_the_client_is_gone_the_maximum_passed_or_the_handle_died():
    clock = FakeClock()
    pop = PopModel(clock)
    alive = {"c1", "c2", "c3"}
    renewals = table(clock, pop, alive=alive.__contains__, max_ms=3 * INVISIBLE_MS)
    renewals.add("c1", "g", "t", [pop.deliver("gone")])
    renewals.add("c2", "g", "t", [pop.deliver("old")])
    renewals.add("c3", "g", "t", [pop.deliver("acked")])
    alive.discard("c1")
    del pop.live["acked"]                     # acked by another way: its handle no longer works
    clock.advance(INVISIBLE_MS - AHEAD_MS)
    assert renewals.renew_due() == 1 and len(renewals) == 1   # only "old" is renewed
    while renewals.renew_due() or len(renewals):
        clock.advance(1000)
    assert clock.now_ms() >= 3 * INVISIBLE_MS and pop.live["old"][1] <= clock.now_ms() + INVISIBLE_MS


@pytest.mark.parametrize("trouble", [Unavailable("the commit log did not answer"),
                                     ResourceExhausted("the store is read-only: disk 91% full")])
def test_a_renewal_the_commit_log_did_not_make_is_retried_and_the_table_is_bounded(trouble):
    clock = FakeClock()
    pop = PopModel(clock)
    renewals = table(clock, pop, max_entries=2)
    renewals.add("c1", "g", "t", [pop.deliver(f"m{i}") for i in range(3)])
    assert len(renewals) == 2                 # the third is delivered without renewal
    clock.advance(INVISIBLE_MS - AHEAD_MS)
    pop.failing = trouble
    assert renewals.renew_due() == 0 and len(renewals) == 2
    pop.failing = None
    clock.advance(1000)
    assert renewals.renew_due() == 2


def test_an_ack_during_a_renewal_waits_for_the_new_handle():
    clock = FakeClock()
    pop = PopModel(clock)
    entered, release = threading.Event(), threading.Event()
    change = pop.change_invisible_duration

    def slow_change(*args):
        entered.set()
        assert release.wait(10)
        return change(*args)
    pop.change_invisible_duration = slow_change
    renewals = table(clock, pop)
    first = pop.deliver("m")
    renewals.add("c1", "g", "t", [first])
    clock.advance(INVISIBLE_MS - AHEAD_MS)
    renewing = threading.Thread(target=renewals.renew_due, name="test-renewal")
    renewing.start()
    assert entered.wait(10)
    taken: list[str] = []
    acking = threading.Thread(target=lambda: taken.append(renewals.take("g", first.receipt_handle)), name="test-ack")
    acking.start()
    release.set()
    renewing.join(10)
    acking.join(10)
    assert taken == [pop.live["m"][0]] and taken[0] != first.receipt_handle


def test_consuming_renews_auto_renew_receives_only_and_acks_with_the_current_handles():
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    clock = FakeClock()
    pop = PopModel(clock)
    renewals = table(clock, pop)
    consuming = Consuming(GatewayConfig(), TopicCache(Lookups(), clock, 1000), pop, renewals)
    fields = dict(filter_type="TAG", expression="*", invisible_ms=None, long_poll_ms=None, time_left_ms=None)
    result, invisible = consuming.receive("g", "t", batch_size=4, auto_renew=True, client_id="c1", **fields)
    assert invisible == GatewayConfig().auto_renew_invisible_ms and len(renewals) == 4
    for _ in range(rng.randrange(1, 100)):    # work for a while: the passes (at least one per ahead time,
        clock.advance(rng.randrange(1, AHEAD_MS))  # as the duty runs) keep every message invisible
        renewals.renew_due()
        assert all(visible > clock.now_ms() for _, visible in pop.live.values())
    handles = [d.receipt_handle for d in result.deliveries]
    outcomes = consuming.ack("g", "t", handles)
    assert [o.status for o in outcomes] == ["ok"] * 4 and sorted(pop.acked) == ["m0", "m1", "m2", "m3"]
    assert len(renewals) == 0


@pytest.mark.parametrize("ahead", [INVISIBLE_MS, INVISIBLE_MS + 1])
def test_the_renewal_must_come_before_the_invisible_time_ends(ahead):
    with pytest.raises(Exception, match="auto_renew_ahead_ms"):
        GatewayConfig(auto_renew_invisible_ms=INVISIBLE_MS, auto_renew_ahead_ms=ahead)
