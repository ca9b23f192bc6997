"""Pop consumption against a trivially correct model: random appends, receives (two groups, one with a tag
filter), acks (current, stale, expired and garbage handles), changes of invisible time, forwards to the
DLQ, clock moves with and without the revive duty's steps, flushes, crash restarts (also in the middle of
a revive step and of an ack), then a drain. The seed is printed; rerun with MQSTORE_SEED=<n>.

Checked at every step: a delivered message is one the model says is due (never delivered, or redelivered
after its invisible time) with attempt = the last attempt + 1; a receive returns every due message up to
its batch; each ack entry's status is the model's; an acked message never comes back; and no message is
delivered twice with one attempt number, also when a crash cut a revive step between its copies and
their ACK record (the start finds the copies: mqstore.pop.replay.reconcile). At the end every message of a
group is acked or in the group's DLQ after max_attempts deliveries."""

from __future__ import annotations

import collections
import os
import random

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition
from mqstore.failpoints import FailpointHit
from mqstore.model import MessageIn
from mqstore.pop.config import PopConfig
from mqstore.pop.service import PopService
from mqstore.pop.stats import pop_stats
from mqstore.store_parts import build_store

TOPIC = "t"
INVISIBLE_MS = 10_000
MAX_ATTEMPTS = 3
GROUPS = {"all": "*", "only-a": "a"}
TAGS = ("a", "b", "")


class GroupModel:
    def __init__(self, name: str, expression: str):
        self.name, self.expression = name, expression
        self.state: dict[bytes, str] = {}       # new | inflight | retry | acked | dead
        self.attempt: collections.Counter = collections.Counter()
        self.handle: dict[bytes, str] = {}
        self.visible: dict[bytes, int] = {}
        self.stale: list[str] = []               # handles that no longer work
        self.acks: collections.Counter = collections.Counter()

    def wants(self, tags: str) -> bool:
        return self.expression == "*" or tags == self.expression

    def due(self) -> list[bytes]:
        return [m for m, s in self.state.items() if s in ("new", "retry")]

    def live(self, now_ms: int) -> list[bytes]:
        return [m for m, s in self.state.items() if s == "inflight" and now_ms < self.visible[m]]


class Harness:
    def __init__(self, config, clock: FakeClock, rng: random.Random):
        self.config, self.clock, self.rng = config, clock, rng
        self.groups = {name: GroupModel(name, expression) for name, expression in GROUPS.items()}
        self.sent = 0
        self.open()
        self.store.topic_admin.create(TOPIC, 3)

    def open(self) -> None:
        self.store = build_store(self.config, self.clock)
        self.store.start()
        self.pop = PopService(self.store, PopConfig())
        self.pop.start(run_duty=False)

    def crash(self) -> None:
        self.pop.halt()
        self.store.halt()
        self.open()

    # ---- operations -----------------------------------------------------------------------------------
    def append(self) -> None:
        batch = []
        for _ in range(self.rng.randint(1, 8)):
            tags = self.rng.choice(TAGS)
            body = b"m%d" % self.sent
            self.sent += 1
            batch.append(MessageIn(body=body, tags=tags))
            for g in self.groups.values():
                if g.wants(tags):
                    g.state[body] = "new"
        self.store.append(TOPIC, batch)

    def receive(self, g: GroupModel) -> None:
        batch = self.rng.randint(1, 12)
        due = len(g.due())
        got = self.pop.receive(g.name, TOPIC, invisible_duration_ms=INVISIBLE_MS, batch_size=batch,
                               filter_expression=g.expression, max_attempts=MAX_ATTEMPTS).deliveries
        assert len(got) == min(batch, due), (batch, due, len(got))
        for d in got:
            body = d.message.record.body
            assert g.state[body] in ("new", "retry") and d.attempt == g.attempt[body] + 1, \
                f"{body!r} attempt {d.attempt} delivered to {g.name} in state {g.state[body]}, {g.attempt[body]}"
            g.state[body], g.attempt[body] = "inflight", d.attempt
            g.handle[body], g.visible[body] = d.receipt_handle, d.visible_at_ms

    def ack(self, g: GroupModel) -> None:
        now = self.clock.now_ms()
        candidates = [(m, g.handle[m]) for m, s in g.state.items() if s == "inflight"]
        picked = self.rng.sample(candidates, min(len(candidates), self.rng.randint(0, 6)))
        stale = self.rng.sample(g.stale, min(len(g.stale), self.rng.randint(0, 2)))
        handles = [h for _, h in picked] + stale + (["garbage"] if self.rng.random() < 0.2 else [])
        if picked and self.rng.random() < 0.3:
            handles.append(picked[0][1])  # twice in one request
        if not handles:
            return
        self.rng.shuffle(handles)
        if self.rng.random() < 0.1 and any(now < g.visible[m] for m, _ in picked):
            self._ack_cut_short(g, handles, picked, now)
            return
        outcomes = self.pop.ack(g.name, TOPIC, handles).outcomes
        seen = set()
        by_handle = {h: m for m, h in picked}
        for handle, outcome in zip(handles, outcomes, strict=True):
            m = by_handle.get(handle)
            if handle == "garbage":
                expected = "invalid"
            elif m is not None and now >= g.visible[m]:
                expected = "expired"  # each time it is named
            elif m is None or handle in seen:
                expected = "not_in_flight"
            else:
                expected = "ok"
            seen.add(handle)
            assert outcome.status == expected, (handle, outcome, expected)
            if expected == "ok":
                self._acked(g, m)

    def _ack_cut_short(self, g: GroupModel, handles, picked, now) -> None:
        """The ACK record is written, the answer never comes (a failpoint between them): acked anyway."""
        self.arm("pop.ack.after_record")
        try:
            with pytest.raises(FailpointHit):
                self.pop.ack(g.name, TOPIC, handles)
        finally:
            self.disarm()
        for m, _ in picked:
            if now < g.visible[m]:
                self._acked(g, m)

    def _acked(self, g: GroupModel, m: bytes) -> None:
        g.state[m] = "acked"
        g.acks[m] += 1
        g.stale.append(g.handle.pop(m))

    def change(self, g: GroupModel) -> None:
        candidates = [m for m, s in g.state.items() if s == "inflight"]
        if not candidates:
            return
        m = self.rng.choice(candidates)
        duration = self.rng.randint(100, 3 * INVISIBLE_MS)
        if self.clock.now_ms() >= g.visible[m]:
            with pytest.raises(FailedPrecondition, match="expired"):
                self.pop.change_invisible_duration(g.name, TOPIC, g.handle[m], duration)
            return
        changed = self.pop.change_invisible_duration(g.name, TOPIC, g.handle[m], duration)
        assert changed.attempt == g.attempt[m] and changed.visible_at_ms == self.clock.now_ms() + duration
        g.stale.append(g.handle[m])
        g.handle[m], g.visible[m] = changed.receipt_handle, changed.visible_at_ms

    def forward(self, g: GroupModel) -> None:
        live = g.live(self.clock.now_ms())
        if not live:
            return
        m = self.rng.choice(live)
        dlq, _ = self.pop.forward_to_dead_letter(g.name, TOPIC, g.handle[m])
        assert dlq == f"%DLQ%{g.name}"
        g.state[m] = "dead"
        g.stale.append(g.handle.pop(m))

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    def revive(self, cut: bool = False) -> None:
        """The revive duty's steps until nothing is due; ``cut``: a failpoint after the first copy, then a
        crash (the copies are there, their ACK is not)."""
        now = self.clock.now_ms()
        expired = [(g, m) for g in self.groups.values() for m, s in g.state.items()
                   if s == "inflight" and g.visible[m] <= now]
        if cut and expired:
            self.arm("pop.revive.after_copy")
            try:
                with pytest.raises(FailpointHit):
                    self.pop.reviver.revive_due()
            finally:
                self.disarm()
            self.crash()
        while self.pop.reviver.revive_due():  # after a cut step: what the duty does first after the restart
            pass
        for g, m in expired:
            g.state[m] = "dead" if g.attempt[m] >= MAX_ATTEMPTS else "retry"
            g.stale.append(g.handle.pop(m))

    def flush(self) -> None:
        self.store.flusher.flush_now()
        self.pop.reviver.flush()

    def arm(self, name: str) -> None:
        from mqstore import failpoints
        failpoints.arm(name, "raise")

    def disarm(self) -> None:
        from mqstore import failpoints
        failpoints.disarm_all()

    # ---- checks ---------------------------------------------------------------------------------------
    def check_in_flight(self) -> None:
        for g in self.groups.values():
            expected = sum(1 for s in g.state.values() if s == "inflight")
            assert pop_stats(self.pop, g.name, TOPIC).group_in_flight == expected

    def drain_and_check(self) -> None:
        for _ in range(4 * MAX_ATTEMPTS + 4):
            for g in self.groups.values():
                while g.due():
                    before = len(g.state), sum(1 for s in g.state.values() if s == "inflight")
                    self.receive(g)
                    live = [g.handle[m] for m in g.live(self.clock.now_ms())]
                    if live:
                        outcomes = self.pop.ack(g.name, TOPIC, live).outcomes
                        assert {o.status for o in outcomes} == {"ok"}
                        for m in g.live(self.clock.now_ms()):
                            self._acked(g, m)
                    if not g.due() and before[1] == sum(1 for s in g.state.values() if s == "inflight"):
                        break
            self.advance(3 * INVISIBLE_MS)
            self.revive()
        for g in self.groups.values():
            assert not g.due() and "inflight" not in g.state.values(), g.name
            dead = collections.Counter(m.record.body for m in self._all(f"%DLQ%{g.name}"))
            for m, s in g.state.items():
                if s == "acked":
                    assert g.acks[m] == 1 and m not in dead, (g.name, m)
                else:
                    assert s == "dead" and dead[m] == 1, (g.name, m, s, dead[m])
            assert set(dead) <= {m for m, s in g.state.items() if s == "dead"}, g.name

    def _all(self, topic: str) -> list:
        try:
            info = self.store.queue_info(topic, 0)
        except Exception:  # noqa: BLE001 - NotFound: the group never dead-lettered anything
            return []
        return self.store.pull(topic, 0, info.min_offset, max_messages=10_000).messages


@pytest.mark.parametrize("run", range(3))
def test_pop_against_a_model(small_config, run):
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    h = Harness(small_config(segment_size_bytes=64 * 1024), FakeClock(), rng)
    ops = [(h.append, 6), (lambda: h.receive(rng.choice(list(h.groups.values()))), 8),
           (lambda: h.ack(rng.choice(list(h.groups.values()))), 8),
           (lambda: h.change(rng.choice(list(h.groups.values()))), 2),
           (lambda: h.forward(rng.choice(list(h.groups.values()))), 1),
           (lambda: h.advance(rng.randint(0, INVISIBLE_MS)), 3), (h.revive, 2),
           (lambda: (h.advance(INVISIBLE_MS), h.revive(cut=True)), 1), (h.flush, 2), (h.crash, 2)]
    names = ["append", "receive", "ack", "change", "forward", "advance", "revive", "cut revive", "flush", "crash"]
    actions, weights = zip(*ops, strict=True)
    done: list[str] = []
    try:
        for _ in range(250):
            index = rng.choices(range(len(actions)), weights)[0]
            done.append(names[index])
            try:
                actions[index]()
                h.check_in_flight()
            except BaseException:
                print("steps:", " ".join(done))
                raise
        h.drain_and_check()
        print(f"messages={h.sent} acked={sum(sum(g.acks.values()) for g in h.groups.values())}")
    finally:
        h.pop.stop()
        h.store.stop()
