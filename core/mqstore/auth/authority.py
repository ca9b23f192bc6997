"""Who is calling, and may they: authentication with a cache, authorization by the user's rules.

:class:`Authority` answers two questions for the server interceptor (mqstore_rpc.auth):

* ``authenticate(user, secret)``: the user's :class:`Principal`, or Unauthenticated. The secret is
  checked against its scrypt hash (mqstore.auth.secrets, tens of milliseconds) once; after that a
  SHA-256 fingerprint of the accepted secret is kept in memory, so a call costs a hash and a dict
  lookup, not a database read. Concurrent calls with the same new credentials share one check
  (the first hashes, the others wait for its answer): 16 producers starting at once hash once.
  Rejected (user, fingerprint) pairs are remembered too (bounded), so a client retrying a wrong secret
  does not make the server hash it again on every call. The service identity (``service``, whose
  secret is MQSTORE_INTERNAL_TOKEN) is checked in constant time without the database.
* ``authorize(principal, action, resource)``: None, or PermissionDenied naming the user, the action,
  the resource and the deciding rule (mqstore.auth.model.decide). Decisions are cached per principal.

Invalidation: every cache belongs to one *version* of the users and rules (a counter the store bumps on
every change). ``invalidate()`` drops them at once (the process that made the change calls it);
``refresh()`` reads the version and drops them when another process changed it; the
:class:`AuthRefresh` duty calls it every ``refresh_ms`` (1 s by default), so a change made through one
service is in force in every service within that time.

Thread-safety: the caches are swapped under ``_lock``; hashing and database reads run outside it (two
threads may verify the same new secret at once: both get the same answer).
"""

from __future__ import annotations

import hmac
import threading
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from mqstore.auth import model, secrets
from mqstore.auth.model import SERVICE_USER, SUPER, Decision, Resource, Rule, User
from mqstore.background import Duty
from mqstore.errors import PermissionDenied, Unauthenticated, Unavailable
from mqstore.metrics import Registry

log = structlog.get_logger("mqstore.auth")

MAX_CACHED_FAILURES = 4096
MAX_CACHED_DECISIONS = 4096
# Verified when the user does not exist, so that an unknown name costs as long as a wrong secret.
_DUMMY_HASH = "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA==$" + "A" * 43 + "="


class AuthSource(Protocol):
    """Where users and rules live (mqstore.meta.auth.AuthStore). Thread-safe."""

    def version(self) -> int: ...

    def user(self, name: str) -> User | None: ...

    def rules(self, user: str) -> list[Rule]: ...


@dataclass
class Principal:
    """An authenticated user, its rules as of the cache's version, and its cached decisions."""

    name: str
    kind: str
    rules: tuple[Rule, ...]
    decisions: dict = field(default_factory=dict)


class Authority:
    def __init__(self, source: AuthSource, *, default_decision: str = model.DENY, service_secret: str = "",
                 metrics: Registry | None = None):
        if default_decision not in model.DECISIONS:
            raise ValueError(f"default decision is allow or deny, not {default_decision!r}")
        self._source = source
        self.default_decision = default_decision
        self._service_secret = service_secret
        self._lock = threading.Lock()
        self._version = source.version()
        self._accepted: dict[str, tuple[bytes, Principal]] = {}
        self._rejected: dict[tuple[str, bytes], None] = {}
        self._flights: dict[tuple[str, bytes], _Flight] = {}
        metrics = metrics or Registry()
        self._hits = metrics.counter("mqstore_auth_cache_hits_total",
                                     "calls whose credentials the cache accepted (no secret hashed)")
        self._verifications = metrics.counter("mqstore_auth_secret_verifications_total",
                                              "secrets checked against their stored hash (scrypt)")
        self._invalidations = metrics.counter("mqstore_auth_cache_invalidations_total",
                                              "times the users or rules changed and the caches were dropped")

    # ---- authentication ------------------------------------------------------------------------------
    def authenticate(self, name: str, secret: str) -> Principal:
        if name == SERVICE_USER:
            return self._service(secret)
        fp = secrets.fingerprint(secret)
        cached = self._accepted.get(name)  # one dict read (atomic); the dicts are replaced, never cleared
        if cached is not None and hmac.compare_digest(cached[0], fp):
            self._hits.inc()
            return cached[1]
        key = (name, fp)
        with self._lock:
            rejected = key in self._rejected
            version = self._version
            flight = self._flights.get(key)
            leading = flight is None and not rejected
            if leading:
                flight = self._flights[key] = _Flight()
        if rejected:
            raise _not_accepted(name)
        if not leading:  # another call is checking the same secret: wait for its answer, hash nothing
            return flight.wait(name)
        try:
            flight.principal = self._verify(name, secret, fp, version)
            return flight.principal
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()

    def _verify(self, name: str, secret: str, fp: bytes, version: int) -> Principal:
        user = self._source.user(name)
        self._verifications.inc()
        if not secrets.verify_secret(secret, user.secret_hash if user else _DUMMY_HASH) or user is None:
            self._remember_rejected(name, fp, version)
            raise _not_accepted(name)
        principal = Principal(name, user.kind, tuple(self._source.rules(name)))
        with self._lock:
            if self._version == version:  # not if the users changed while we were reading them
                self._accepted[name] = (fp, principal)
        return principal

    def _service(self, secret: str) -> Principal:
        if not self._service_secret:
            raise Unauthenticated(f"user {SERVICE_USER!r} is the services' own identity and this server has "
                                  f"no internal token configured (MQSTORE_INTERNAL_TOKEN)")
        if not hmac.compare_digest(secret.encode("utf-8"), self._service_secret.encode("utf-8")):
            raise _not_accepted(SERVICE_USER)
        return _SERVICE_PRINCIPAL

    def _remember_rejected(self, name: str, fp: bytes, version: int) -> None:
        with self._lock:
            if self._version != version:
                return
            if len(self._rejected) >= MAX_CACHED_FAILURES:
                self._rejected.clear()
            self._rejected[(name, fp)] = None

    # ---- authorization -------------------------------------------------------------------------------
    def decide(self, principal: Principal, action: str, resource: Resource) -> Decision:
        key = (action, resource)
        decision = principal.decisions.get(key)
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
        self._rejected = {}
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


def _not_accepted(name: str) -> Unauthenticated:
    shown = repr(name) if model.is_user_name(name) else "(not a valid user name)"
    return Unauthenticated(f"the credentials of user {shown} are not accepted (unknown user or wrong secret)")


class AuthRefresh(Duty):
    """Duty "auth-refresh": :meth:`Authority.refresh` every ``refresh_ms``; a database that cannot be
    read is retried with backoff (the caches stay as they are meanwhile)."""

    def __init__(self, authority: Authority, refresh_ms: int):
        super().__init__("auth-refresh", interval_s=refresh_ms / 1000)
        self._authority = authority

    def step(self) -> None:
        self._authority.refresh()
