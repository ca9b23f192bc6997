"""Who is calling, and may they: authentication with a cache, authorization by the user's rules.

:class:`Authority` answers two questions for the server interceptor (mqstore_rpc.auth):

* ``authenticate(user, secret, credential)``: the user's :class:`Principal`, or Unauthenticated. The
  secret is checked against its scrypt hash (mqstore.auth.secrets, tens of milliseconds) once; after
  that the accepted credential, as the caller presented it (the interceptor's whole ``authorization``
  value), is the key of a dict of principals, so a call costs one dict lookup (:meth:`cached`): no
  hash of the secret, no database read. Those keys hold the secrets of the users that called
  since the last change, in this process's memory only (which receives them with every call anyway);
  there is one entry per user and secret, dropped with every change. Concurrent calls with the same
  new credentials share one check (the first hashes, the others wait for its answer): 16 producers
  starting at once hash once. Failed authentication is kept cheap (mqstore.auth.throttle): at most
  two verifications run at once in the process, on two threads of their own (a check beyond waits up
  to 2 s, then Unavailable: retry); a failed (user, SHA-256 of the secret) pair is refused without a
  hash for 30 s; after 10 failures in a row
  from one peer address (``peer``, given by the interceptor) or for one user name, new credentials of
  that peer or user are refused without a hash (:class:`Throttled`, UNAUTHENTICATED with the time to
  wait) for 1 s, doubled at every further failure up to 60 s, until a success; credentials this process
  accepted before pass the backoff (a revoked secret is still refused by its hash). The service
  identity (``service``, whose secret is MQSTORE_INTERNAL_TOKEN) is checked in constant time without
  the database, then cached like the others.
* ``authenticate_signed(signed)``: the principal of the user owning the access key of an SDK's signed
  request (mqstore.auth.signature; the gateway only). The first call with an access key reads the key
  and its user from the database and opens the sealed secret key under the kek (mqstore.auth.sealing);
  after that (access key -> principal and secret key) is cached like the bearer credentials, so a call
  costs one dict lookup, the date check and one HMAC-SHA1. A verified (authorization value, date-time)
  pair is cached as well (:meth:`cached_signed`): the SDK signs the date to the second, so the calls a
  client makes within the same second cost one dict lookup and the skew check, no HMAC. Unknown access
  keys are remembered too (bounded), so they cost no database read when retried.
* ``authorize(principal, action, resource)``: None, or PermissionDenied naming the user, the action,
  the resource and the deciding rule (mqstore.access.decide), after the topics no rule decides alone
  (system topics: the service identity only; retry and dead-letter topics: their group too;
  mqstore.auth.reserved). Decisions are cached per principal.

Invalidation: every cache belongs to one *version* of the users and rules (a counter the store bumps on
every change). ``invalidate()`` drops them at once (the process that made the change calls it);
``refresh()`` reads the version and drops them when another process changed it; the
:class:`AuthRefresh` duty calls it every ``refresh_ms`` (1 s by default), so a change made through one
service is in force in every service within ``refresh_ms`` plus one read of the version (a revoked user
or rule is refused from then on: tests/integration/test_auth_revocation.py). While the database cannot
be read the caches stay as they were (the duty retries with backoff), so that bound holds only while it
is readable.

Thread-safety: the caches are swapped under ``_lock`` and read without it (a dict read is atomic; the
dicts are replaced on a change, never cleared; the one of verified signed requests, one entry per
client and second, is also added to in place under the lock); the accepted fingerprints (``_known_good``)
are read and changed under it; the rejected cache and the backoff tables lock themselves
(mqstore.auth.throttle); hashing and database reads run outside every lock (under the hash gate).
"""

from __future__ import annotations

import collections
import hmac
import math
import threading
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from mqstore import access as model
from mqstore.access import SERVICE_USER, SUPER, Decision, Resource, Rule, SdkKey, User
from mqstore.auth import reserved, secrets, signature
from mqstore.auth.sealing import Kek
from mqstore.auth.signature import Signed
from mqstore.auth.throttle import FailureBackoff, RejectedCache, Throttle, shared_gate
from mqstore.background import Duty
from mqstore.clock import Clock, SystemClock
from mqstore.errors import FailedPrecondition, PermissionDenied, Unauthenticated, Unavailable
from mqstore.metrics import Registry

log = structlog.get_logger("mqstore.auth")

MAX_CACHED_FAILURES = 4096
MAX_CACHED_CREDENTIALS = 4096   # accepted ones: one per user and secret, unless a client varies the form
MAX_CACHED_DECISIONS = 4096
# Verified when the user does not exist, so that an unknown name costs as long as a wrong secret.
_DUMMY_HASH = "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA==$" + "A" * 43 + "="


class AuthSource(Protocol):
    """Where users and rules live (mqstore.meta.auth.AuthStore). Thread-safe."""

    def version(self) -> int: ...

    def user(self, name: str) -> User | None: ...

    def rules(self, user: str) -> list[Rule]: ...

    def sdk_key(self, access_key: str) -> SdkKey | None: ...


@dataclass
class Principal:
    """An authenticated user, its rules as of the cache's version, and its cached decisions
    (``(action, resource)`` -> Decision, filled by :meth:`Authority.decide`; the interceptor reads it
    first, one dict lookup per resource)."""

    name: str
    kind: str
    rules: tuple[Rule, ...]
    decisions: dict = field(default_factory=dict)


class Authority:
    def __init__(self, source: AuthSource, *, default_decision: str = model.DENY, service_secret: str = "",
                 metrics: Registry | None = None, kek: Kek | None = None, clock: Clock | None = None,
                 max_skew_ms: int = signature.MAX_SKEW_MS, throttle: Throttle | None = None):
        if default_decision not in model.DECISIONS:
            raise ValueError(f"default decision is allow or deny, not {default_decision!r}")
        self._source = source
        self.default_decision = default_decision
        self._service_secret = service_secret
        self._lock = threading.Lock()
        self._version = source.version()
        self._accepted: dict[str, Principal] = {}     # presented credential -> principal
        self._flights: dict[tuple[str, bytes], _Flight] = {}
        self._kek = kek
        self._clock = clock or SystemClock()
        throttle = throttle or Throttle()
        self.throttle = throttle
        monotonic = self._clock.monotonic_s
        self._rejected = RejectedCache(throttle.rejected_ttl_s, throttle.rejected_max, monotonic)
        self._gate = shared_gate(throttle.hash_limit, throttle.hash_wait_s, throttle.hash_waiters)
        backoff = (throttle.failures_before_backoff, throttle.backoff_base_s, throttle.backoff_max_s,
                   throttle.backoff_forget_s, throttle.backoff_max_keys, monotonic)
        self._peer_failures, self._user_failures = FailureBackoff(*backoff), FailureBackoff(*backoff)
        # (user, fingerprint) pairs this process accepted: they pass the backoff (kept across changes)
        self._known_good: collections.OrderedDict[tuple[str, bytes], None] = collections.OrderedDict()
        self._max_skew_ms = max_skew_ms
        self._signing: dict[str, tuple[Principal, bytes]] = {}   # access key -> (principal, secret key)
        self._unknown_keys: dict[str, None] = {}
        self._verified: dict[tuple[str, str], tuple[Principal, int]] = {}  # (value, date-time) -> (.., signed ms)
        metrics = metrics or Registry()
        self._hits = metrics.counter("mqstore_auth_cache_hits_total", "calls whose credentials the cache "
                                     "accepted (no secret hashed)").labels()  # the one child: one call less
        self._verifications = metrics.counter("mqstore_auth_secret_verifications_total",
                                              "secrets checked against their stored hash (scrypt)")
        self._invalidations = metrics.counter("mqstore_auth_cache_invalidations_total",
                                              "times the users or rules changed and the caches were dropped")
        throttled = metrics.counter("mqstore_auth_throttled_total", "new credentials refused or shed without a "
                                    "hash: a failed secret retried (rejected), a peer or user in its failure "
                                    "backoff (backoff), no place to hash in time (busy)", ("reason",))
        self._throttled = {reason: throttled.labels(reason) for reason in ("rejected", "backoff", "busy")}

    # ---- authentication ------------------------------------------------------------------------------
    def cached(self, credential: str) -> Principal | None:
        """The principal of ``credential`` if it was accepted since the last change, else None (then
        :meth:`authenticate`). The hot path: one dict read."""
        principal = self._accepted.get(credential)  # atomic; the dict is replaced on a change, never cleared
        if principal is not None:
            self._hits.inc()
        return principal

    def authenticate(self, name: str, secret: str, credential: str = "", peer: str = "") -> Principal:
        """``credential``: the form the caller presented ``name`` and ``secret`` in (it must determine
        them both), the key :meth:`cached` finds them by next time; default ``name:secret``. ``peer``: the
        caller's address without its port (the key of the per-peer backoff; "" = none)."""
        credential = credential or f"{name}:{secret}"
        cached = self.cached(credential)
        if cached is not None:
            return cached
        if name == SERVICE_USER:
            return self._service(secret, credential)
        fp = secrets.fingerprint(secret)
        key = (name, fp)
        if key in self._rejected:
            self._throttled["rejected"].inc()
            raise _not_accepted(name)
        self._refuse_if_backing_off(name, fp, peer)
        with self._lock:
            version = self._version
            flight = self._flights.get(key)
            leading = flight is None
            if leading:
                flight = self._flights[key] = _Flight()
        if not leading:  # another call is checking the same secret: wait for its answer, hash nothing
            return flight.wait(name)
        try:
            flight.principal = self._gated_verify(name, secret, fp, version, credential, peer)
            return flight.principal
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()

    def refuse_cheaply(self, name: str, secret: str, peer: str = "") -> None:
        """Unauthenticated when :meth:`authenticate` would refuse these credentials without a hash (their
        secret failed lately, or the peer or user is in its failure backoff); else nothing (they may be
        cached, or need a check). For a caller that must not wait for a hash to hear a cheap refusal."""
        if name == SERVICE_USER:
            return
        fp = secrets.fingerprint(secret)
        if (name, fp) in self._rejected:
            self._throttled["rejected"].inc()
            raise _not_accepted(name)
        self._refuse_if_backing_off(name, fp, peer)

    def _refuse_if_backing_off(self, name: str, fp: bytes, peer: str) -> None:
        with self._lock:
            if (name, fp) in self._known_good:  # accepted before by this process: its hash decides
                return
        wait_s = max(self._peer_failures.blocked_for(peer) if peer else 0.0, self._user_failures.blocked_for(name))
        if wait_s > 0:
            self._throttled["backoff"].inc()
            raise Throttled(f"too many failed logins from this address or for user {_shown(name)}: new "
                            f"credentials are refused for {math.ceil(wait_s)} s more; retry after that with the right "
                            f"secret (credentials accepted before still work)", wait_s)

    def _gated_verify(self, name: str, secret: str, fp: bytes, version: int, credential: str,
                      peer: str) -> Principal:
        def check() -> Principal:
            if (name, fp) in self._rejected:  # found out while this call waited for a place
                raise _not_accepted(name)
            self._refuse_if_backing_off(name, fp, peer)
            return self._verify(name, secret, fp, version, credential, peer)
        try:
            return self._gate.run(name, check)
        except Unavailable:
            self._throttled["busy"].inc()
            raise

    def _verify(self, name: str, secret: str, fp: bytes, version: int, credential: str, peer: str = "") -> Principal:
        user = self._source.user(name)
        self._verifications.inc()
        if not secrets.verify_secret(secret, user.secret_hash if user else _DUMMY_HASH) or user is None:
            self._remember_rejected(name, fp, version)
            if peer:
                self._peer_failures.failed(peer)
            self._user_failures.failed(name)
            raise _not_accepted(name)
        principal = Principal(name, user.kind, tuple(self._source.rules(name)))
        if peer:
            self._peer_failures.succeeded(peer)
        self._user_failures.succeeded(name)
        with self._lock:
            self._known_good[(name, fp)] = None
            self._known_good.move_to_end((name, fp))
            while len(self._known_good) > MAX_CACHED_CREDENTIALS:
                self._known_good.popitem(last=False)
        self._remember_accepted(credential, principal, version)
        return principal

    def _remember_accepted(self, credential: str, principal: Principal, version: int) -> None:
        with self._lock:
            if self._version != version:  # not if the users changed while we were reading them
                return
            accepted = self._accepted if len(self._accepted) < MAX_CACHED_CREDENTIALS else {}
            accepted = {**accepted, credential: principal}  # a new dict: readers take no lock
            self._accepted = accepted

    def _service(self, secret: str, credential: str) -> Principal:
        if not self._service_secret:
            raise Unauthenticated(f"user {SERVICE_USER!r} is the services' own identity and this server has "
                                  f"no internal token configured (MQSTORE_INTERNAL_TOKEN)")
        if not hmac.compare_digest(secret.encode("utf-8"), self._service_secret.encode("utf-8")):
            raise _not_accepted(SERVICE_USER)
        self._remember_accepted(credential, _SERVICE_PRINCIPAL, self._version)
        return _SERVICE_PRINCIPAL

    def _remember_rejected(self, name: str, fp: bytes, version: int) -> None:
        with self._lock:
            if (name, fp) in self._known_good:  # no longer its secret (a change): it no longer passes the backoff
                del self._known_good[(name, fp)]
            if self._version != version:
                return
            self._rejected.add((name, fp))

    # ---- signed requests (the RocketMQ SDKs) ---------------------------------------------------------
    def cached_signed(self, authorization: str, date_time: str) -> Principal | None:
        """The principal of a signed request verified before with this very authorization value and
        date-time, if its date is still within the skew window; else None (then parse and
        :meth:`authenticate_signed`)."""
        entry = self._verified.get((authorization, date_time))  # atomic; set under the lock, replaced on a change
        if entry is None or abs(entry[1] - self._clock.now_ms()) > self._max_skew_ms:
            return None
        self._hits.inc()
        return entry[0]

    def authenticate_signed(self, signed: Signed, authorization: str = "") -> Principal:
        """The principal of the user owning ``signed.access_key`` if the signature is theirs and its date
        is within the skew window; else Unauthenticated (the message never holds a secret).
        ``authorization``: the metadata value ``signed`` was parsed from, the key of :meth:`cached_signed`."""
        version = self._version
        signed_ms = signature.check_fresh(signed, self._clock.now_ms(), self._max_skew_ms)
        entry = self._signing.get(signed.access_key)  # atomic; replaced on a change, never cleared
        if entry is None:
            entry = self._load_signing(signed.access_key)
        principal, secret_key = entry
        if not signature.verify(secret_key, signed):
            raise _key_not_accepted(signed.access_key)
        if authorization:
            with self._lock:
                if self._version == version:
                    if len(self._verified) >= MAX_CACHED_CREDENTIALS:
                        self._verified = {}
                    # Set in place (one per client and second: a copy each time would cost O(entries)); a
                    # concurrent reader's get sees the dict before or after the set, both whole.
                    self._verified[(authorization, signed.date_time)] = (principal, signed_ms)
        self._hits.inc()
        return principal

    def _load_signing(self, access_key: str) -> tuple[Principal, bytes]:
        version = self._version
        if access_key in self._unknown_keys:
            raise _key_not_accepted(access_key)
        key = self._source.sdk_key(access_key) if model.is_access_key(access_key) else None
        user = self._source.user(key.user) if key is not None else None
        if key is None or user is None:
            with self._lock:
                if self._version == version:
                    if len(self._unknown_keys) >= MAX_CACHED_FAILURES:
                        self._unknown_keys = {}
                    self._unknown_keys = {**self._unknown_keys, access_key: None}
            raise _key_not_accepted(access_key)
        if self._kek is None:
            raise Unauthenticated("this server has no key-encryption key (--auth-kek-file, MQSTORE_AUTH_KEK_FILE), "
                                  "so it cannot check signed requests; use bearer credentials or configure it")
        try:
            secret_key = self._kek.open(key.sealed_secret, access_key).encode("utf-8")
        except FailedPrecondition as exc:  # a missing or another kek, or an altered row: the operator's to fix
            log.error("auth.sdk_key_unusable", access_key=access_key, user=key.user, message=str(exc))
            raise Unauthenticated(f"the SDK key {access_key!r} cannot be checked by this server (its key-encryption "
                                  f"key does not open it; the server's log says why)") from None
        entry = (Principal(user.name, user.kind, tuple(self._source.rules(user.name))), secret_key)
        with self._lock:
            if self._version == version:
                signing = self._signing if len(self._signing) < MAX_CACHED_CREDENTIALS else {}
                self._signing = {**signing, access_key: entry}
        return entry

    # ---- authorization -------------------------------------------------------------------------------
    def decide(self, principal: Principal, action: str, resource: Resource) -> Decision:
        key = (action, resource)
        decision = principal.decisions.get(key)
        if decision is None:  # system, retry and dead-letter topics first (mqstore.auth.reserved), then the rules
            decision = reserved.decide(principal.name, action, resource, lambda a, r: self.decide(principal, a, r))
            if decision is None:
                decision = model.decide(principal.kind, principal.rules, action, resource, self.default_decision)
            if len(principal.decisions) >= MAX_CACHED_DECISIONS:
                principal.decisions.clear()
            principal.decisions[key] = decision
        return decision

    def authorize(self, principal: Principal, action: str, resource: Resource) -> None:
        """PermissionDenied unless ``principal`` may do ``action`` on ``resource``."""
        decision = self.decide(principal, action, resource)
        if decision.allowed:
            return
        if decision.reason:
            raise PermissionDenied(f"user {principal.name!r} lacks {action} on {resource}: {decision.reason}")
        why = (f"denied by its rule {decision.rule.describe()}" if decision.rule is not None else
               f"no rule of the user grants it and the default policy is {self.default_decision}")
        raise PermissionDenied(f"user {principal.name!r} lacks {action} on {resource}: {why}; an admin grants it "
                               f"with: mqstore acl grant {principal.name} {resource.flag()} --actions {action}")

    # ---- invalidation --------------------------------------------------------------------------------
    def invalidate(self) -> None:
        """Drop every cache now (the users or rules changed)."""
        version = self._source.version()
        with self._lock:
            self._drop(version)

    def refresh(self) -> bool:
        """Drop the caches if the stored version moved; True when it did."""
        version = self._source.version()
        with self._lock:
            if version == self._version:
                return False
            self._drop(version)
        log.info("auth.cache_invalidated", version=version)
        return True

    def _drop(self, version: int) -> None:
        self._version = version
        self._accepted = {}
        self._rejected.clear()
        self._signing = {}
        self._unknown_keys = {}
        self._verified = {}
        self._invalidations.inc()


_SERVICE_PRINCIPAL = Principal(SERVICE_USER, SUPER, ())
FLIGHT_WAIT_S = 30.0  # a verification (a database read and one scrypt) that takes longer is a stuck database


class _Flight:
    """One verification of a (user, secret) in progress; the calls that come meanwhile wait for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.principal: Principal | None = None
        self.error: BaseException | None = None

    def wait(self, name: str) -> Principal:
        if not self.done.wait(FLIGHT_WAIT_S):
            raise Unavailable(f"the credentials of user {name!r} are still being checked after {FLIGHT_WAIT_S:.0f} s "
                              f"(is the auth database reachable?); retry")
        if self.principal is not None:
            return self.principal
        if isinstance(self.error, Unauthenticated):  # the leader's check failed: the same answer
            raise _not_accepted(name)
        raise Unavailable(f"the credentials of user {name!r} could not be checked: {self.error}; retry")


class Throttled(Unauthenticated):
    """New credentials refused without a check: their peer or user is in its failure backoff
    (mqstore.auth.throttle). ``retry_after_s``: what is left of the window."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _shown(name: str) -> str:
    return repr(name) if model.is_user_name(name) else "(not a valid user name)"


def _not_accepted(name: str) -> Unauthenticated:
    return Unauthenticated(f"the credentials of user {_shown(name)} are not accepted (unknown user or wrong secret)")


def _key_not_accepted(access_key: str) -> Unauthenticated:
    shown = repr(access_key) if model.is_access_key(access_key) else "(not a valid access key)"
    return Unauthenticated(f"the signature of access key {shown} is not accepted (unknown or revoked access key, "
                           f"or a wrong secret key)")


class AuthRefresh(Duty):
    """Duty "auth-refresh": :meth:`Authority.refresh` every ``refresh_ms``; a database that cannot be
    read is retried with backoff (the caches stay as they are meanwhile)."""

    def __init__(self, authority: Authority, refresh_ms: int):
        super().__init__("auth-refresh", interval_s=refresh_ms / 1000)
        self._authority = authority

    def step(self) -> None:
        self._authority.refresh()
