"""The clients the gateway knows, keyed by their ``x-mq-client-id``, and each one's Telemetry outbox.

A RocketMQ 5 client opens one Telemetry stream per endpoint and writes its settings there first (its type,
the topics it publishes or the group it consumes for); the server answers with the settings it must use
and later writes commands on the same stream (here: RecoverOrphanedTransactionCommand, the check-back).
Heartbeats (every 10 s) and every other call keep a client alive; NotifyClientTermination or
``client_ttl_ms`` of silence forget it.

  event                              registry                                  listeners told
  ---------------------------------- ----------------------------------------- --------------
  Telemetry opens                    session gets a new Outbox (an older       -
                                     stream's outbox is closed: a client has
                                     one stream per endpoint)
  settings written                   type, publishing topics, group updated    yes
  Telemetry ends                     the outbox is closed and detached         yes
  heartbeat / any call               last_seen_ms = now (session created)      -
  NotifyClientTermination, TTL       session removed, outbox closed            yes

At most ``max_clients`` sessions: a new client beyond it gets ResourceExhausted (the Java proxy has no
limit; an unbounded map is a memory leak waiting for a client that changes its id on every start).

Sessions belong to their user (with authentication on; ``user`` None = authentication off, where none of
this applies). A client id is bound to the user who first presented it until its session ends (removed, or
expired): a call of another user with that id is refused (PermissionDenied, which names neither the owner
nor anything of the session, and leaves the session as it was: its stream stays, its last sign of life is
not refreshed). Only the owner ends it or opens its Telemetry stream, or an ADMIN of the cluster (``admin``:
the servicer says whether the caller holds ADMIN), who takes it over: the session then belongs to the admin.
Per-user quotas, so that one user cannot deny another (ResourceExhausted, the protocol's TOO_MANY_REQUESTS,
for that user only):

  quota                    counts                                   refused
  ------------------------ ---------------------------------------- -----------------------------------
  max_clients_per_user     the user's sessions (below max_clients:  a new client id of that user
                           a flood of random ids meets it first)
  max_streams_per_user     the user's sessions with an open stream  a stream of a session without one
  max_receives_per_user    the user's receives in flight            a receive (:meth:`receiving`)

Thread-safe: ``_lock`` guards the sessions map, the per-user counts and every session's fields; an Outbox
has its own lock. Listeners are called without the lock held.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import structlog

from mqstore.clock import Clock
from mqstore.errors import PermissionDenied, ResourceExhausted, shown

log = structlog.get_logger("mqstore.gateway.clients")

PRODUCER = "PRODUCER"


class Outbox:
    """The commands waiting for one Telemetry stream. ``put`` never blocks: a full outbox refuses (the
    client does not read its stream), and the caller decides (a check-back is then left unanswered and
    asked again later by the Transaction service)."""

    def __init__(self, limit: int):
        self._limit = limit
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self.closed = False

    def put(self, item: object) -> bool:
        with self._cond:
            if self.closed or len(self._items) >= self._limit:
                return False
            self._items.append(item)
            self._cond.notify()
            return True

    def take(self, timeout_s: float) -> object | None:
        """The next item; None when closed and empty, or nothing came within ``timeout_s``."""
        with self._cond:
            if not self._items and not self.closed:
                self._cond.wait(timeout_s)
            return self._items.popleft() if self._items else None

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


@dataclass
class ClientSession:
    client_id: str
    client_type: str = ""                  # PRODUCER, SIMPLE_CONSUMER, PUSH_CONSUMER, ... ("" = not said yet)
    topics: frozenset[str] = frozenset()   # a producer's publishing topics
    group: str = ""                        # a consumer's group
    last_seen_ms: int = 0
    outbox: Outbox | None = field(default=None, repr=False)
    user: str | None = None                # who presented the id first (None: authentication is off)
    settled: bool = False                  # its settings came (on a Telemetry stream): type, topics, group

    @property
    def reachable(self) -> bool:
        """It has an open Telemetry stream: a server command can reach it."""
        return self.outbox is not None and not self.outbox.closed


class ClientRegistry:
    def __init__(self, clock: Clock, *, max_clients: int, ttl_ms: int, outbox_limit: int,
                 max_clients_per_user: int | None = None, max_streams_per_user: int | None = None,
                 max_receives_per_user: int | None = None):
        """The ``*_per_user`` quotas: None = none (then only ``max_clients`` bounds the table)."""
        self.clock, self.max_clients, self.ttl_ms, self.outbox_limit = clock, max_clients, ttl_ms, outbox_limit
        self.max_clients_per_user, self.max_streams_per_user = max_clients_per_user, max_streams_per_user
        self.max_receives_per_user = max_receives_per_user
        self._lock = threading.Lock()
        self._sessions: dict[str, ClientSession] = {}
        self._by_user: dict[str, set[str]] = {}      # user -> its client ids
        self._receiving: dict[str, int] = {}         # user -> receives in flight
        self._listeners: list[Callable[[], None]] = []
        self._turn = itertools.count()

    def on_change(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs after a change of who publishes what (settings, streams, removals)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def _session(self, client_id: str, user: str | None, take_over: bool = False) -> ClientSession:
        """The session of ``user`` (created if new); the caller holds ``_lock``. PermissionDenied when it
        is another user's (unless ``take_over``: it becomes ``user``'s), ResourceExhausted over a bound;
        a refusal changes nothing."""
        session = self._sessions.get(client_id)
        if session is None:
            if user is not None and self.max_clients_per_user is not None and \
                    len(self._by_user.get(user, ())) >= self.max_clients_per_user:
                raise ResourceExhausted(
                    f"user {shown(user)} has {self.max_clients_per_user} client sessions at this gateway, its "
                    f"quota (max_clients_per_user): reuse a client's id, end unused ones with "
                    f"NotifyClientTermination (silent ones are forgotten after {self.ttl_ms} ms), or ask the "
                    f"operator to raise --max-clients-per-user")
            if len(self._sessions) >= self.max_clients:
                raise ResourceExhausted(f"the gateway serves at most {self.max_clients} clients (setting "
                                        f"max_clients) and all are live; retry after some disconnect")
            session = self._sessions[client_id] = ClientSession(client_id, user=user)
            if user is not None:
                self._by_user.setdefault(user, set()).add(client_id)
            log.info("gateway.client_registered", client_id=client_id, user=user)
        elif session.user != user:
            if not take_over:
                raise PermissionDenied(
                    f"client id {shown(client_id)} belongs to another user's session at this gateway: give each "
                    f"client an id of its own (the RocketMQ clients make one per process), or wait until that "
                    f"session ends (its user's NotifyClientTermination, or {self.ttl_ms} ms without a call)")
            self._unbind(session)
            session.user = user
            if user is not None:
                self._by_user.setdefault(user, set()).add(client_id)
            log.warning("gateway.client_taken_over", client_id=client_id, user=user)
        session.last_seen_ms = self.clock.now_ms()
        return session

    def _unbind(self, session: ClientSession) -> None:
        """Forget ``session`` in its user's count; the caller holds ``_lock``."""
        ids = self._by_user.get(session.user) if session.user is not None else None
        if ids is not None:
            ids.discard(session.client_id)
            if not ids:
                del self._by_user[session.user]

    def touch(self, client_id: str, client_type: str = "", group: str = "", user: str | None = None) -> None:
        """Any call of the client keeps it alive; a heartbeat also says its type and group."""
        with self._lock:
            session = self._session(client_id, user)
            session.client_type = client_type or session.client_type
            session.group = group or session.group

    def attach(self, client_id: str, user: str | None = None, *, admin: bool = False) -> Outbox:
        """A Telemetry stream opened: its outbox (an older stream's outbox of the client is closed).
        PermissionDenied when the session is another user's and ``user`` is no ADMIN of the cluster (an
        admin takes it over); ResourceExhausted when the session has no open stream and ``user`` has
        ``max_streams_per_user``."""
        with self._lock:
            existing = self._sessions.get(client_id)
            if existing is not None and existing.user != user and not admin:
                self._session(client_id, user)  # refused: another user's
            if user is not None and self.max_streams_per_user is not None and \
                    (existing is None or existing.user != user or not existing.reachable):
                streams = sum(1 for c in self._by_user.get(user, ()) if self._sessions[c].reachable)
                if streams >= self.max_streams_per_user:
                    raise ResourceExhausted(
                        f"user {shown(user)} has {streams} Telemetry streams open at this gateway, its quota "
                        f"(max_streams_per_user): close unused clients, or ask the operator to raise "
                        f"--max-streams-per-user")
            session = self._session(client_id, user, take_over=admin)
            old, session.outbox = session.outbox, Outbox(self.outbox_limit)
            outbox = session.outbox
        if old is not None:
            old.close()
        return outbox

    def apply_settings(self, client_id: str, client_type: str, topics: Iterable[str], group: str,
                       user: str | None = None) -> None:
        with self._lock:
            session = self._session(client_id, user)
            session.client_type, session.topics, session.group = client_type, frozenset(topics), group
            session.settled = True
        log.info("gateway.client_settings", client_id=client_id, client_type=client_type,
                 topics=sorted(session.topics), group=group)
        self._changed()

    def detach(self, client_id: str, outbox: Outbox) -> None:
        """A Telemetry stream ended (the client went away, or the server stops)."""
        outbox.close()
        with self._lock:
            session = self._sessions.get(client_id)
            if session is not None and session.outbox is outbox:
                session.outbox = None
        self._changed()

    def remove(self, client_id: str, why: str, user: str | None = None, *, admin: bool = False) -> None:
        """End a session (nothing if there is none): its user's to end, or an ADMIN's of the cluster
        (``admin``: ``why`` then names the admin); PermissionDenied for anyone else."""
        with self._lock:
            session = self._sessions.get(client_id)
            if session is None:
                return
            if session.user != user:
                if not admin:
                    self._session(client_id, user)  # refused: another user's
                why = f"{why} by admin {user}"
            self._drop(session)
        self._closed(session, why)

    def _drop(self, session: ClientSession) -> None:
        """Forget ``session``; the caller holds ``_lock``."""
        del self._sessions[session.client_id]
        self._unbind(session)

    def _closed(self, session: ClientSession, why: str) -> None:
        """After ``_drop``, without the lock: its stream ends, the listeners hear of it."""
        if session.outbox is not None:
            session.outbox.close()
        log.info("gateway.client_removed", client_id=session.client_id, why=why)
        self._changed()

    def expire(self) -> int:
        """Forget the clients not heard of for ``ttl_ms``; how many."""
        cutoff = self.clock.now_ms() - self.ttl_ms
        with self._lock:
            stale = [s for s in self._sessions.values() if s.last_seen_ms < cutoff]
            for session in stale:
                self._drop(session)
        for session in stale:
            self._closed(session, f"silent for more than {self.ttl_ms} ms")
        return len(stale)

    @contextlib.contextmanager
    def receiving(self, user: str | None) -> Iterator[None]:
        """Around one receive (a long poll) of ``user``: ResourceExhausted when ``user`` has
        ``max_receives_per_user`` in flight already."""
        if user is None or self.max_receives_per_user is None:
            yield
            return
        with self._lock:
            held = self._receiving.get(user, 0)
            if held >= self.max_receives_per_user:
                raise ResourceExhausted(
                    f"user {shown(user)} has {held} receives in flight at this gateway, its quota "
                    f"(max_receives_per_user): wait for one to end before the next, or ask the operator to "
                    f"raise --max-receives-per-user")
            self._receiving[user] = held + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._receiving[user] - 1
                if left:
                    self._receiving[user] = left
                else:
                    del self._receiving[user]

    def clients_of(self, user: str) -> int:
        """How many sessions ``user`` has."""
        with self._lock:
            return len(self._by_user.get(user, ()))

    def published_topics(self) -> set[str]:
        """The topics published by a reachable producer."""
        with self._lock:
            return {t for s in self._sessions.values() if s.client_type == PRODUCER and s.reachable for t in s.topics}

    def producer_for(self, topic: str) -> tuple[str, Outbox] | None:
        """A reachable producer of ``topic`` (round robin over them): its id and outbox; None if there is none."""
        with self._lock:
            found = [(s.client_id, s.outbox) for s in self._sessions.values()
                     if s.client_type == PRODUCER and s.reachable and topic in s.topics]
            return found[next(self._turn) % len(found)] if found else None

    def continued(self, client_id: str, user: str | None, *, admin: bool = False) -> ClientSession | None:
        """The session with settings that a Telemetry stream of ``user`` not beginning with settings
        continues (the servicer then checks that the user still holds what they name). None when it is
        another user's and ``admin`` (an ADMIN of the cluster takes it over: nothing of it to check);
        PermissionDenied when it is another user's otherwise, or when there is no session with settings."""
        with self._lock:
            session = self._sessions.get(client_id)
            if session is not None and session.user != user:
                if admin:
                    return None
                self._session(client_id, user)  # refused: another user's
            if session is None or not session.settled:
                raise PermissionDenied(
                    f"a Telemetry stream must begin with the client's settings (the gateway checks them against "
                    f"the user's rights), and client id {client_id[:64]!r} has no settings of user {user!r} "
                    f"that this stream would continue: write the settings command first")
            return session

    def get(self, client_id: str) -> ClientSession | None:
        with self._lock:
            return self._sessions.get(client_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def close_all(self) -> None:
        with self._lock:
            outboxes = [s.outbox for s in self._sessions.values() if s.outbox is not None]
        for outbox in outboxes:
            outbox.close()
