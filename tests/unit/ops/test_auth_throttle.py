"""Failed authentication is cheap for the server (mqstore.auth.throttle through mqstore.auth.authority,
and the denial log of mqstore_rpc.auth): bounded concurrent hashing, a failed secret remembered for a
while and no longer, a failure backoff per peer and per user that refuses without hashing and never
refuses credentials accepted before, tables that stay bounded, and sampled denial lines. Time is a
FakeClock: nothing here sleeps."""

from __future__ import annotations

import threading
import time

import pytest
import structlog

from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.auth.authority import Authority, Throttled
from mqstore.access import ALLOW, PUB
from mqstore.auth.throttle import FailureBackoff, HashGate, RejectedCache, Throttle
from mqstore.clock import FakeClock, SystemClock
from mqstore.errors import Unauthenticated, Unavailable
from mqstore.meta.auth import AuthStore
from mqstore.metrics import Registry
from mqstore_rpc.auth import DenialLog, peer_address
from tests.support.waiting import wait_until

PEER, OTHER_PEER = "10.0.0.7", "10.0.0.8"


@pytest.fixture
def store(tmp_path):
    s = AuthStore(f"sqlite:///{tmp_path / 'auth.db'}", SystemClock())
    admin = AccessAdmin(s)
    for name in ("alice", "bob"):
        admin.create_user(name, access.NORMAL, f"{name}-secret-1")
        admin.add_rule(name, access.TOPIC, "orders", frozenset({PUB}), ALLOW)
    yield s
    s.close()


def _authority(store, clock, **throttle) -> tuple[Authority, Registry]:
    registry = Registry()
    settings = dict(failures_before_backoff=3, backoff_base_s=1.0, backoff_max_s=8.0) | throttle
    return Authority(store, metrics=registry, clock=clock, throttle=Throttle(**settings)), registry


def _hashed(registry: Registry) -> float:
    return registry.get("mqstore_auth_secret_verifications_total").value


def _throttled(registry: Registry, reason: str) -> float:
    return registry.get("mqstore_auth_throttled_total").labels(reason).value


def test_a_failed_secret_is_refused_without_a_hash_until_its_time_is_up(store):
    clock = FakeClock()
    authority, registry = _authority(store, clock, rejected_ttl_s=30.0)
    for _ in range(5):
        with pytest.raises(Unauthenticated, match="not accepted"):
            authority.authenticate("alice", "wrong-secret-1", peer=PEER)
    assert _hashed(registry) == 1 and _throttled(registry, "rejected") == 4
    clock.advance(29_000)
    with pytest.raises(Unauthenticated):
        authority.authenticate("alice", "wrong-secret-1", peer=PEER)
    assert _hashed(registry) == 1
    clock.advance(2_000)                                         # 31 s: forgotten, checked again
    with pytest.raises(Unauthenticated):
        authority.authenticate("alice", "wrong-secret-1", peer=PEER)
    assert _hashed(registry) == 2


def test_the_failed_secret_cache_is_bounded_oldest_first_and_drops_expired_entries():
    clock = FakeClock()
    cache = RejectedCache(ttl_s=10.0, max_entries=3, clock=clock.monotonic_s)
    for key in "abcd":
        cache.add(key)
        clock.advance(1_000)
    assert len(cache) == 3 and "a" not in cache and {"b", "c", "d"} <= {k for k in "abcd" if k in cache}
    clock.advance(20_000)
    assert not any(k in cache for k in "bcd")
    cache.add("e")                                               # expired entries go on the next add
    assert len(cache) == 1 and "e" in cache


def test_a_peer_with_failures_is_refused_new_credentials_without_a_hash_for_a_doubling_window(store):
    clock = FakeClock()
    authority, registry = _authority(store, clock)
    alice = authority.authenticate("alice", "alice-secret-1", peer=PEER)      # cached from now on
    for i in range(3):                                                       # threshold: 3 failures
        with pytest.raises(Unauthenticated, match="not accepted"):
            authority.authenticate(f"nobody{i}", "guessed-secret", peer=PEER)
    assert _hashed(registry) == 4
    with pytest.raises(Throttled, match="too many failed logins.*1 s more") as refused:
        authority.authenticate("bob", "bob-secret-1", peer=PEER)               # even a right, new one
    assert refused.value.retry_after_s == pytest.approx(1.0)
    assert _hashed(registry) == 4 and _throttled(registry, "backoff") == 1
    assert authority.authenticate("alice", "alice-secret-1", peer=PEER) is alice  # cached: passes
    with pytest.raises(Unauthenticated, match="not accepted"):                # another address: hashed
        authority.authenticate("nobody9", "guessed-secret", peer=OTHER_PEER)
    assert _hashed(registry) == 5
    clock.advance(1_100)                                                     # the window is over...
    with pytest.raises(Unauthenticated, match="not accepted"):
        authority.authenticate("nobody3", "guessed-secret", peer=PEER)       # ...a 4th failure...
    with pytest.raises(Throttled, match="2 s more"):                         # ...doubles it
        authority.authenticate("nobody4", "guessed-secret", peer=PEER)
    clock.advance(2_100)
    assert authority.authenticate("bob", "bob-secret-1", peer=PEER).name == "bob"  # a success resets
    with pytest.raises(Unauthenticated, match="not accepted"):
        authority.authenticate("nobody5", "guessed-secret", peer=PEER)
    with pytest.raises(Unauthenticated, match="not accepted"):
        authority.authenticate("nobody6", "guessed-secret", peer=PEER)       # hashed: the count restarted


def test_failures_for_one_user_refuse_its_new_credentials_but_not_those_accepted_before(store):
    clock = FakeClock()
    authority, registry = _authority(store, clock)
    authority.authenticate("alice", "alice-secret-1", peer=PEER)
    authority.invalidate()                                        # a change: every cache dropped
    for i in range(3):                                            # from three addresses: the user's count
        with pytest.raises(Unauthenticated, match="not accepted"):
            authority.authenticate("alice", f"guess-{i}-secret", peer=f"10.9.9.{i}")
    with pytest.raises(Throttled, match="for user 'alice'"):
        authority.authenticate("alice", "guess-9-secret", peer="10.9.9.9")
    hashed = _hashed(registry)
    # alice's own secret, accepted before the change: checked (hashed) despite the backoff
    assert authority.authenticate("alice", "alice-secret-1", peer="10.1.1.1").name == "alice"
    assert _hashed(registry) == hashed + 1
    assert authority.authenticate("bob", "bob-secret-1", peer="10.9.9.0").name == "bob"  # another user: fine


def test_at_most_limit_secrets_are_hashed_at_once_on_two_threads_the_rest_wait_briefly_then_retry(store):
    entered, threads, release = [], set(), threading.Event()

    class Slow:
        def version(self):
            return store.version()

        def rules(self, name):
            return store.rules(name)

        def user(self, name):
            entered.append(name)
            threads.add(threading.current_thread().name)
            release.wait(20)
            return store.user(name)

    registry = Registry()
    authority = Authority(Slow(), metrics=registry, throttle=Throttle(hash_limit=2, hash_wait_s=0.2))
    release.set()
    cached = authority.authenticate("bob", "bob-secret-1", "Bearer bob:bob-secret-1")
    release.clear()
    entered.clear()
    errors: list[BaseException] = []

    def check(name: str, secret: str) -> None:
        try:
            authority.authenticate(name, secret)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)
    held = [threading.Thread(target=check, args=(f"user{i}", "some-secret-1")) for i in range(2)]
    for t in held:
        t.start()
    wait_until(lambda: len(entered) == 2, "two checks to hold the two places")
    with pytest.raises(Unavailable, match="checking 2 other new credentials.*retry"):
        authority.authenticate("alice", "alice-secret-1")        # a third waits 0.2 s, then is shed
    assert sorted(entered) == ["user0", "user1"]                 # alice never reached the database
    assert registry.get("mqstore_auth_throttled_total").labels("busy").value == 1
    assert authority.authenticate("bob", "bob-secret-1", "Bearer bob:bob-secret-1") is cached  # never waits
    release.set()
    for t in held:
        t.join(20)
    assert len(errors) == 2 and all(isinstance(e, Unauthenticated) for e in errors)
    assert authority.authenticate("alice", "alice-secret-1").name == "alice"  # a place again
    # on the gate's own threads, whose allocator arenas keep scrypt's 16 MiB, not on every caller's
    assert len(threads) <= 2 and all(name.startswith("auth-hash") for name in threads)


def test_a_check_that_finds_the_waiting_line_full_is_shed_at_once():
    gate = HashGate(limit=1, wait_s=20.0, waiters=1)
    holding, release, answers = threading.Event(), threading.Event(), []

    def slow() -> str:
        holding.set()
        release.wait(20)
        return "held"
    holder = threading.Thread(target=lambda: answers.append(gate.run("a", slow)))
    holder.start()
    assert holding.wait(20)
    waiter = threading.Thread(target=lambda: answers.append(gate.run("b", lambda: "waited")))
    waiter.start()
    wait_until(lambda: gate._waiters == 1, "the second check to wait for the place")
    started = time.monotonic()
    with pytest.raises(Unavailable, match="more wait"):
        gate.run("c", lambda: "never")                           # the line is full: no 20 s wait
    assert time.monotonic() - started < 10
    release.set()
    for t in (holder, waiter):
        t.join(20)
    assert answers == ["held", "waited"]


def test_the_backoff_table_is_bounded_and_full_of_blocking_keys_keeps_them():
    clock = FakeClock()
    backoff = FailureBackoff(threshold=2, base_s=1.0, max_s=8.0, forget_s=60.0, max_keys=3,
                             clock=clock.monotonic_s)
    for key in ("a", "b"):
        backoff.failed(key)
        backoff.failed(key)                                      # blocking
    backoff.failed("c")                                          # under the threshold
    backoff.failed("d")                                          # full: "c" blocks nothing, it goes
    assert len(backoff) == 3 and backoff.blocked_for("a") > 0 and backoff.blocked_for("b") > 0
    backoff.failed("d")
    backoff.failed("e")                                          # full of blocking keys: not tracked
    assert len(backoff) == 3 and all(backoff.blocked_for(k) > 0 for k in "abd")
    clock.advance(61_000)
    backoff.failed("e")                                          # the others forgotten: room again
    assert backoff.blocked_for("a") == 0 and len(backoff) == 1


def test_denials_are_logged_a_few_per_reason_peer_and_user_then_summarised():
    now = [0.0]
    denials = DenialLog(interval_s=10.0, burst=2, max_lines=3, clock=lambda: now[0])
    with structlog.testing.capture_logs() as events:
        admitted = [denials.admit("bad_credentials", PEER, "alice") for _ in range(4)]
        admitted += [denials.admit("bad_credentials", PEER, "bob") for _ in range(2)]
        now[0] = 11.0
        admitted.append(denials.admit("bad_credentials", PEER, "alice"))   # a new interval
        denials.flush()
    assert admitted == [True, True, False, False, True, False, True]
    summaries = [e for e in events if e["event"] == "auth.denied_suppressed"]
    assert [s["suppressed"] for s in summaries] == [3]
    assert summaries[0]["by_reason"] == {"bad_credentials": 3} and summaries[0]["by_peer"] == {PEER: 3}


def test_a_peer_is_its_address_without_the_port_and_an_ipv6_one_its_64():
    assert peer_address("ipv4:10.0.0.7:51234") == "10.0.0.7"
    assert peer_address("ipv6:[2001:db8:1:2:3:4:5:6]:443") == "2001:db8:1:2::/64"
    assert peer_address("ipv6:[::1]:5000") == "::/64"
    assert peer_address("unix:/tmp/socket") == "unix:/tmp/socket"
