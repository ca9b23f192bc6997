"""The gateway's client registry (mqstore.gateway.clients) against a trivially correct model (dicts), with
random operations from a printed seed, and its limits: the client bound, the TTL, the outbox bound."""

from __future__ import annotations

import random

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import PermissionDenied, ResourceExhausted
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


# ---- sessions belong to their user (authentication on) ------------------------------------------------

def quota_registry(clock, **quotas) -> ClientRegistry:
    values = {"max_clients": 100, "max_clients_per_user": 10, "max_streams_per_user": 10,
              "max_receives_per_user": 10, **quotas}
    return ClientRegistry(clock, ttl_ms=TTL_MS, outbox_limit=4, **values)


def test_a_client_id_belongs_to_its_first_user_and_another_users_calls_change_nothing():
    clock = FakeClock()
    reg = quota_registry(clock)
    outbox = reg.attach("p", "alice")
    reg.apply_settings("p", PRODUCER, ["t"], "", "alice")
    seen = reg.get("p").last_seen_ms
    clock.advance(10)
    for refused in (lambda: reg.touch("p", user="bob"), lambda: reg.attach("p", "bob"),
                    lambda: reg.apply_settings("p", PRODUCER, ["x"], "", "bob"),
                    lambda: reg.remove("p", "test", "bob")):
        with pytest.raises(PermissionDenied, match="belongs to another user's session") as caught:
            refused()
        assert "alice" not in str(caught.value) and "'t'" not in str(caught.value)  # nothing of the victim's
    session = reg.get("p")
    assert (session.user, session.topics, session.last_seen_ms) == ("alice", frozenset({"t"}), seen)
    assert not outbox.closed and reg.producer_for("t") == ("p", outbox)
    assert reg.clients_of("bob") == 0
    reg.touch("p", user="alice")  # its owner goes on
    reg.remove("p", "test", "alice")
    assert outbox.closed and reg.get("p") is None


def test_an_expired_or_ended_session_frees_its_client_id():
    clock = FakeClock()
    reg = quota_registry(clock)
    reg.touch("p", user="alice")
    clock.advance(TTL_MS + 1)
    assert reg.expire() == 1 and reg.clients_of("alice") == 0
    reg.touch("p", user="bob")
    assert reg.get("p").user == "bob"
    reg.remove("p", "test", "bob")
    reg.attach("p", "alice")
    assert reg.get("p").user == "alice"


def test_taking_a_session_over_moves_it_to_the_new_user_and_closes_the_old_stream():
    reg = quota_registry(FakeClock())
    old = reg.attach("p", "alice")
    new = reg.attach("p", "admin", admin=True)
    assert old.closed and not new.closed
    assert reg.get("p").user == "admin" and (reg.clients_of("alice"), reg.clients_of("admin")) == (0, 1)
    with pytest.raises(PermissionDenied):
        reg.touch("p", user="alice")
    reg.remove("p", "test", "alice", admin=True)
    assert new.closed and reg.clients_of("admin") == 0


def test_only_the_owner_or_an_admin_ends_or_continues_a_session():
    reg = quota_registry(FakeClock())
    reg.attach("p", "alice")
    reg.apply_settings("p", PRODUCER, ["t"], "", "alice")
    with pytest.raises(PermissionDenied):
        reg.remove("p", "test", "bob")
    with pytest.raises(PermissionDenied):
        reg.attach("p", "bob")
    with pytest.raises(PermissionDenied):
        reg.continued("p", "bob")
    assert reg.get("p").user == "alice" and not reg.get("p").outbox.closed
    assert reg.continued("p", "alice").topics == {"t"}
    assert reg.continued("p", "admin", admin=True) is None  # another user's: the admin takes it over
    with pytest.raises(PermissionDenied):
        reg.continued("q", "alice")  # no session with settings to continue
    reg.remove("p", "test", "admin", admin=True)
    assert reg.get("p") is None and reg.clients_of("alice") == 0


def test_a_flood_of_one_user_meets_its_quota_and_not_the_table():
    reg = quota_registry(FakeClock(), max_clients=10, max_clients_per_user=4)
    refused = 0
    for i in range(1000):
        try:
            reg.touch(f"flood-{i}", user="mallory")
        except ResourceExhausted as exc:
            assert "max_clients_per_user" in str(exc)
            refused += 1
    assert refused == 1000 - 4 and reg.clients_of("mallory") == 4
    for i in range(4):
        reg.touch(f"alice-{i}", user="alice")  # another user is served
    reg.touch("flood-0", user="mallory")  # a known client of the flooder still is too
    reg.remove("flood-0", "test", "mallory")
    reg.touch("flood-new", user="mallory")  # its quota has room again


def test_a_users_streams_are_bounded_a_reopened_stream_counts_once():
    reg = quota_registry(FakeClock(), max_streams_per_user=2)
    a, _ = reg.attach("a", "alice"), reg.attach("b", "alice")
    reg.touch("c", user="alice")  # a session without a stream does not count
    with pytest.raises(ResourceExhausted, match="max_streams_per_user"):
        reg.attach("c", "alice")
    assert not reg.get("c").reachable
    reg.attach("a", "alice")  # the same session's new stream replaces its old one
    assert a.closed
    reg.attach("d", "bob")  # another user's stream is not counted
    reg.detach("b", reg.get("b").outbox)
    reg.attach("c", "alice")


def test_a_users_receives_in_flight_are_bounded():
    reg = quota_registry(FakeClock(), max_receives_per_user=2)
    with reg.receiving("alice"), reg.receiving("alice"):
        with pytest.raises(ResourceExhausted, match="max_receives_per_user"):
            with reg.receiving("alice"):
                pass
        with reg.receiving("bob"):
            pass
    with reg.receiving("alice"), reg.receiving("alice"):  # both ended: room again
        pass


def test_without_authentication_there_is_no_owner_and_no_quota():
    reg = quota_registry(FakeClock(), max_clients_per_user=1, max_streams_per_user=1, max_receives_per_user=1)
    for name in ("a", "b", "c"):
        reg.attach(name)
        reg.touch(name)
    with reg.receiving(None), reg.receiving(None):
        pass
    reg.remove("a", "test")
    assert len(reg) == 2


@pytest.mark.parametrize("seed", [random.randrange(1 << 30) for _ in range(5)])
def test_binding_and_quotas_agree_with_a_model(seed):
    print(f"seed={seed}")
    rnd = random.Random(seed)
    clock = FakeClock()
    reg = quota_registry(clock, max_clients=8, max_clients_per_user=4, max_streams_per_user=2)
    model: dict[str, list] = {}   # client id -> [user, last seen, has an open stream]
    outboxes: dict[str, Outbox] = {}

    def count(user: str, streaming: bool = False) -> int:
        return sum(1 for e in model.values() if e[0] == user and (e[2] or not streaming))

    def admit(cid: str, user: str) -> str:
        """The model's answer to a call of ``user`` with ``cid`` that creates or keeps its session."""
        if cid in model:
            return "denied" if model[cid][0] != user else "ok"
        return "exhausted" if count(user) >= 4 or len(model) >= 8 else "ok"

    for _ in range(600):
        cid, user = rnd.choice([f"c{i}" for i in range(12)]), rnd.choice(["u1", "u2", "u3"])
        op = rnd.choice(["touch", "attach", "detach", "remove", "expire", "tick"])
        if op in ("touch", "attach"):
            want = admit(cid, user)
            if want == "ok" and op == "attach" and not (cid in model and model[cid][2]) and count(user, True) >= 2:
                want = "exhausted"
            try:
                if op == "touch":
                    reg.touch(cid, user=user)
                else:
                    outboxes[cid] = reg.attach(cid, user)
                got = "ok"
            except PermissionDenied:
                got = "denied"
            except ResourceExhausted:
                got = "exhausted"
            assert got == want, (seed, op, cid, user)
            if got == "ok":
                entry = model.setdefault(cid, [user, 0, False])
                entry[1] = clock.now_ms()
                entry[2] = entry[2] or op == "attach"
        elif op == "detach" and cid in outboxes:
            reg.detach(cid, outboxes.pop(cid))
            if cid in model:
                model[cid][2] = False
        elif op == "remove":
            want = "denied" if cid in model and model[cid][0] != user else "ok"
            try:
                reg.remove(cid, "test", user)
                got = "ok"
            except PermissionDenied:
                got = "denied"
            assert got == want, (seed, op, cid, user)
            if got == "ok" and model.pop(cid, None) is not None:
                outboxes.pop(cid, None)
        elif op == "expire":
            reg.expire()
            for gone in [c for c, e in model.items() if e[1] < clock.now_ms() - TTL_MS]:
                del model[gone]
                outboxes.pop(gone, None)
        else:
            clock.advance(rnd.randint(1, 400))
        assert len(reg) == len(model)
        for name in ("u1", "u2", "u3"):
            assert reg.clients_of(name) == count(name), (seed, name)
        for c, entry in model.items():
            session = reg.get(c)
            assert (session.user, session.reachable) == (entry[0], entry[2]), (seed, c)
