"""The gateway's client registry (mqstore.gateway.clients) against a trivially correct model (dicts), with
random operations from a printed seed, and its limits: the client bound, the TTL, the outbox bound."""

from __future__ import annotations

import random

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import ResourceExhausted
from mqstore.gateway.clients import PRODUCER, ClientRegistry, Outbox

TTL_MS = 1_000


def registry(clock, max_clients=100, outbox_limit=4) -> ClientRegistry:
    return ClientRegistry(clock, max_clients=max_clients, ttl_ms=TTL_MS, outbox_limit=outbox_limit)


@pytest.mark.parametrize("seed", [random.randrange(1 << 30) for _ in range(5)])
def test_the_registry_agrees_with_a_model(seed):
    print(f"seed={seed}")
    rnd = random.Random(seed)
    clock = FakeClock()
    reg = registry(clock)
    changes = []
    reg.on_change(lambda: changes.append(1))
    # model: client id -> [type, topics, last seen, has an open stream]
    model: dict[str, list] = {}
    outboxes: dict[str, Outbox] = {}
    ids = [f"c{i}" for i in range(8)]
    topics = ["t1", "t2", "t3"]
    for _ in range(400):
        cid = rnd.choice(ids)
        op = rnd.choice(["touch", "attach", "settings", "detach", "remove", "expire", "tick"])
        if op == "touch":
            reg.touch(cid)
            model.setdefault(cid, ["", frozenset(), 0, False])[2] = clock.now_ms()
        elif op == "attach":
            outboxes[cid] = reg.attach(cid)
            entry = model.setdefault(cid, ["", frozenset(), 0, False])
            entry[2], entry[3] = clock.now_ms(), True
        elif op == "settings":
            kind = rnd.choice([PRODUCER, "SIMPLE_CONSUMER"])
            chosen = frozenset(rnd.sample(topics, rnd.randint(0, 3)))
            reg.apply_settings(cid, kind, chosen, "")
            entry = model.setdefault(cid, ["", frozenset(), 0, False])
            entry[0], entry[1], entry[2] = kind, chosen, clock.now_ms()
        elif op == "detach" and cid in outboxes:
            reg.detach(cid, outboxes.pop(cid))
            if cid in model:
                model[cid][3] = False
        elif op == "remove":
            reg.remove(cid, "test")
            model.pop(cid, None)
            outboxes.pop(cid, None)
        elif op == "expire":
            reg.expire()
            for gone in [c for c, e in model.items() if e[2] < clock.now_ms() - TTL_MS]:
                del model[gone]
                outboxes.pop(gone, None)
        else:
            clock.advance(rnd.randint(1, 600))
        assert len(reg) == len(model)
        expected = {t for e in model.values() if e[0] == PRODUCER and e[3] for t in e[1]}
        assert reg.published_topics() == expected, (seed, op, cid)
        for topic in topics:
            found = reg.producer_for(topic)
            holders = {c for c, e in model.items() if e[0] == PRODUCER and e[3] and topic in e[1]}
            assert (found[0] in holders) if found else not holders
    assert changes, "listeners hear of settings, detaches and removals"


def test_a_new_client_beyond_the_bound_is_refused():
    reg = registry(FakeClock(), max_clients=2)
    reg.touch("a")
    reg.touch("b")
    reg.touch("a")   # a known one is always served
    with pytest.raises(ResourceExhausted, match="at most 2 clients"):
        reg.touch("c")
    reg.remove("a", "test")
    reg.touch("c")


def test_a_silent_client_is_forgotten_and_its_stream_closed():
    clock = FakeClock()
    reg = registry(clock)
    outbox = reg.attach("p")
    reg.apply_settings("p", PRODUCER, ["t"], "")
    clock.advance(TTL_MS)
    assert reg.expire() == 0
    clock.advance(1)
    assert reg.expire() == 1
    assert outbox.closed and reg.published_topics() == set() and reg.get("p") is None


def test_a_second_stream_of_a_client_replaces_the_first():
    reg = registry(FakeClock())
    first = reg.attach("p")
    second = reg.attach("p")
    assert first.closed and not second.closed
    reg.detach("p", first)   # the old stream's end does not detach the new one
    assert reg.get("p").reachable


def test_the_outbox_is_bounded_and_ends_when_closed():
    outbox = Outbox(2)
    assert outbox.put(1) and outbox.put(2) and not outbox.put(3)
    assert outbox.take(0) == 1
    outbox.close()
    assert not outbox.put(4)
    assert outbox.take(0) == 2 and outbox.take(0) is None
