"""The access model's decision, secrets at rest, and the Authority's caches (mqstore.auth)."""

from __future__ import annotations

import hmac
import random

import pytest

from mqstore import access
from mqstore.auth import secrets
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.authority import Authority
from mqstore.access import ADMIN, ALLOW, DENY, PUB, SUB, Rule, decide, group, topic
from mqstore.clock import SystemClock
from mqstore.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Unauthenticated
from mqstore.meta.auth import AuthStore
from mqstore.metrics import Registry


def rule(pattern: str, decision: str = ALLOW, actions=(PUB,), kind: str = access.TOPIC) -> Rule:
    return Rule("u", kind, pattern, frozenset(actions), decision)


def test_the_most_specific_rule_decides_and_deny_wins_a_tie():
    rules = (rule("*"), rule("orders-*", DENY), rule("orders-eu", ALLOW))
    assert decide(access.NORMAL, rules, PUB, topic("payments"), DENY).allowed          # "*"
    assert not decide(access.NORMAL, rules, PUB, topic("orders-us"), DENY).allowed     # the prefix beats "*"
    assert decide(access.NORMAL, rules, PUB, topic("orders-eu"), DENY).allowed         # the literal beats the prefix
    tie = (rule("orders-eu", ALLOW), rule("orders-eu", DENY))
    assert not decide(access.NORMAL, tie, PUB, topic("orders-eu"), DENY).allowed
    longer = (rule("orders-*", ALLOW), rule("orders-eu-*", DENY))
    assert not decide(access.NORMAL, longer, PUB, topic("orders-eu-1"), ALLOW).allowed


def test_actions_kinds_default_policy_and_super_users():
    rules = (rule("t", actions=(SUB,)), rule("t", kind=access.GROUP))
    assert not decide(access.NORMAL, rules, PUB, topic("t"), DENY).allowed      # SUB does not give PUB
    assert decide(access.NORMAL, rules, PUB, group("t"), DENY).allowed          # the group rule is the group's
    assert decide(access.NORMAL, (), ADMIN, topic("x"), ALLOW).allowed          # no rule: the default
    assert not decide(access.NORMAL, (), ADMIN, topic("x"), DENY).allowed
    assert decide(access.SUPER, (rule("*", DENY, (ADMIN,)),), ADMIN, topic("x"), DENY).allowed


def test_the_decision_matches_a_plain_model_on_random_rules():
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    names = ["a", "ab", "abc", "b", "ba"]
    for _ in range(300):
        rules = tuple(rule(rnd.choice(["*", *names, *(n + "*" for n in names)]), rnd.choice([ALLOW, DENY]),
                           rnd.sample([PUB, SUB, ADMIN], rnd.randint(1, 3))) for _ in range(rnd.randint(0, 6)))
        action, name, default = rnd.choice([PUB, SUB, ADMIN]), rnd.choice(names), rnd.choice([ALLOW, DENY])
        matching = [r for r in rules if action in r.actions and (
            r.pattern == "*" or r.pattern == name or (r.pattern.endswith("*") and name.startswith(r.pattern[:-1])))]

        def rank(r):  # literal 3, prefix 2 (longer first), everything 1
            return (1, 0) if r.pattern == "*" else ((2, len(r.pattern)) if r.pattern.endswith("*") else (3, 0))
        if matching:
            top = max(rank(r) for r in matching)
            expected = all(r.decision == ALLOW for r in matching if rank(r) == top)
        else:
            expected = default == ALLOW
        assert decide(access.NORMAL, rules, action, topic(name), default).allowed == expected, (rules, action, name)


def test_malformed_rules_and_names_are_refused():
    for bad in (dict(pattern="a b"), dict(pattern="a*b"), dict(kind="queue"), dict(decision="maybe"),
                dict(actions=frozenset()), dict(actions=frozenset({"READ"})), dict(kind=access.CLUSTER, pattern="x")):
        values = dict(user="u", kind=access.TOPIC, pattern="t", actions=frozenset({PUB}), decision=ALLOW) | bad
        with pytest.raises(InvalidArgument):
            Rule(**values)
    with pytest.raises(InvalidArgument):
        access.check_user_name("has space")


def test_secrets_are_salted_hashes_that_verify():
    stored = secrets.hash_secret("correct horse")
    assert "correct horse" not in stored and stored.startswith("scrypt$")
    assert stored != secrets.hash_secret("correct horse")           # a salt per hash
    assert secrets.verify_secret("correct horse", stored)
    assert not secrets.verify_secret("correct horsf", stored)
    assert not secrets.verify_secret("correct horse", "md5$nonsense")
    with pytest.raises(InvalidArgument):
        secrets.hash_secret("short")


@pytest.fixture
def store(tmp_path):
    s = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", SystemClock())
    yield s
    s.close()


def test_verification_is_cached_until_a_change(store):
    registry = Registry()
    authority = Authority(store, service_secret="internal-1234", metrics=registry)
    admin = AccessAdmin(store, authority.invalidate)
    admin.create_user("alice", access.NORMAL, "alice-secret-1")
    admin.add_rule("alice", access.TOPIC, "orders-*", frozenset({PUB}), ALLOW)
    verified = registry.get("mqstore_auth_secret_verifications_total")
    for _ in range(50):
        alice = authority.authenticate("alice", "alice-secret-1")
        authority.authorize(alice, PUB, topic("orders-1"))
    assert verified.value == 1                                   # one scrypt, then the cache
    assert registry.get("mqstore_auth_cache_hits_total").value == 49
    with pytest.raises(PermissionDenied, match="lacks SUB on topic 'orders-1'.*mqstore acl grant alice"):
        authority.authorize(alice, SUB, topic("orders-1"))
    for _ in range(5):
        with pytest.raises(Unauthenticated, match="not accepted") as refused:
            authority.authenticate("alice", "wrong-secret-9")
        assert "wrong-secret-9" not in str(refused.value)
    assert verified.value == 2                                   # a repeated wrong secret is not hashed again
    admin.update_user("alice", secret="alice-secret-2")          # a change drops the caches at once
    with pytest.raises(Unauthenticated):
        authority.authenticate("alice", "alice-secret-1")
    assert authority.authenticate("alice", "alice-secret-2").name == "alice"


def test_changes_made_by_another_process_are_seen_on_refresh(store, tmp_path):
    authority = Authority(store)
    elsewhere = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", SystemClock())
    try:
        other = AccessAdmin(elsewhere)
        other.create_user("bob", access.NORMAL, "bob-secret-1")
        other.add_rule("bob", access.TOPIC, "t", frozenset({SUB}), ALLOW)
        bob = authority.authenticate("bob", "bob-secret-1")
        authority.authorize(bob, SUB, topic("t"))
        other.add_rule("bob", access.TOPIC, "t", frozenset({SUB}), DENY)
        authority.authorize(bob, SUB, topic("t"))              # still the cached rules...
        assert authority.refresh()                             # ...until the version moves
        with pytest.raises(PermissionDenied, match="denied by its rule"):
            authority.authorize(authority.authenticate("bob", "bob-secret-1"), SUB, topic("t"))
        other.delete_user("bob")
        authority.refresh()
        with pytest.raises(Unauthenticated):
            authority.authenticate("bob", "bob-secret-1")
    finally:
        elsewhere.close()


def test_the_service_identity_is_the_internal_token_and_cannot_be_managed(store):
    authority = Authority(store, service_secret="internal-1234")
    assert authority.authenticate("service", "internal-1234").kind == access.SUPER
    with pytest.raises(Unauthenticated):
        authority.authenticate("service", "guess")
    with pytest.raises(Unauthenticated, match="no internal token"):
        Authority(store).authenticate("service", "anything")
    with pytest.raises(FailedPrecondition):
        AccessAdmin(store).create_user("service", access.SUPER, "whatever-123")


def test_a_generated_secret_is_returned_once_and_only_its_hash_is_stored(store):
    created = AccessAdmin(store).create_user("carol", access.NORMAL)
    assert len(created.secret) >= 32
    assert created.secret not in store.user("carol").secret_hash
    assert Authority(store).authenticate("carol", created.secret).name == "carol"


def test_concurrent_calls_with_new_credentials_share_one_check(store):
    """16 producers starting at once: one database read and one scrypt, not 16 (they made the first
    second of an authenticated benchmark take seconds on 2 cores)."""
    import threading

    from tests.support.waiting import wait_until
    AccessAdmin(store).create_user("dave", access.NORMAL, "dave-secret-1")
    entered, release = [], threading.Event()

    class Slow:
        def version(self):
            return store.version()

        def rules(self, name):
            return store.rules(name)

        def user(self, name):
            entered.append(name)
            release.wait(20)
            return store.user(name)

    registry = Registry()
    authority = Authority(Slow(), metrics=registry)
    results = []
    threads = [threading.Thread(target=lambda: results.append(authority.authenticate("dave", "dave-secret-1")))
               for _ in range(8)]
    threads[0].start()
    wait_until(lambda: entered, "the first check to read the user")
    for t in threads[1:]:
        t.start()
    flight = next(iter(authority._flights.values()))
    # every other call is either waiting for the first one's answer or (without the sharing) reading too
    wait_until(lambda: len(entered) + len(flight.done._cond._waiters) == 8, "the other calls to be waiting")
    release.set()
    for t in threads:
        t.join(20)
    assert [p.name for p in results] == ["dave"] * 8
    assert registry.get("mqstore_auth_secret_verifications_total").value == 1 and entered == ["dave"]


def test_a_cached_call_hashes_no_secret_and_reads_no_database(store, monkeypatch):
    """After the first call, credentials are one dict lookup keyed by the presented value: no SHA-256
    (let alone scrypt) of the secret, no database read; until a change drops the cache."""
    admin = AccessAdmin(store)
    admin.create_user("erin", access.NORMAL, "erin-secret-1")
    admin.add_rule("erin", access.TOPIC, "orders", frozenset({PUB}), ALLOW)
    authority = Authority(store, service_secret="internal-1234")
    presented = "Bearer erin:erin-secret-1"
    assert authority.cached(presented) is None
    erin = authority.authenticate("erin", "erin-secret-1", presented)
    service = authority.authenticate("service", "internal-1234", "Bearer service:internal-1234")

    def forbidden(*_args):
        raise AssertionError("a cached call hashed a secret or read the database")
    for name in ("fingerprint", "verify_secret"):
        monkeypatch.setattr(secrets, name, forbidden)
    for name in ("user", "rules", "version"):
        monkeypatch.setattr(store, name, forbidden)
    monkeypatch.setattr(hmac, "compare_digest", forbidden)
    for _ in range(3):
        assert authority.cached(presented) is erin
        assert authority.authenticate("erin", "erin-secret-1", presented) is erin
        assert authority.authenticate("service", "internal-1234", "Bearer service:internal-1234") is service
        authority.authorize(erin, PUB, topic("orders"))
    assert authority.cached("Bearer erin:erin-secret-2") is None           # another secret is not this one
    monkeypatch.undo()
    admin.update_user("erin", secret="erin-secret-2")
    authority.invalidate()
    assert authority.cached(presented) is None                             # a change drops the cache
    with pytest.raises(Unauthenticated):
        authority.authenticate("erin", "erin-secret-1", presented)
