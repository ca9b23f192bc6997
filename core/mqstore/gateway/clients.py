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

Thread-safe: ``_lock`` guards the sessions map and every session's fields; an Outbox has its own lock.
Listeners are called without the lock held.
"""

from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable

import structlog

from mqstore.clock import Clock
from mqstore.errors import ResourceExhausted

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

    @property
    def reachable(self) -> bool:
        """It has an open Telemetry stream: a server command can reach it."""
        return self.outbox is not None and not self.outbox.closed


class ClientRegistry:
    def __init__(self, clock: Clock, *, max_clients: int, ttl_ms: int, outbox_limit: int):
        self.clock, self.max_clients, self.ttl_ms, self.outbox_limit = clock, max_clients, ttl_ms, outbox_limit
        self._lock = threading.Lock()
        self._sessions: dict[str, ClientSession] = {}
        self._listeners: list[Callable[[], None]] = []
        self._turn = itertools.count()

    def on_change(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs after a change of who publishes what (settings, streams, removals)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def _session(self, client_id: str) -> ClientSession:
        """The session (created if new); the caller holds ``_lock``."""
        session = self._sessions.get(client_id)
        if session is None:
            if len(self._sessions) >= self.max_clients:
                raise ResourceExhausted(f"the gateway serves at most {self.max_clients} clients (setting "
                                        f"max_clients) and all are live; retry after some disconnect")
            session = self._sessions[client_id] = ClientSession(client_id)
            log.info("gateway.client_registered", client_id=client_id)
        session.last_seen_ms = self.clock.now_ms()
        return session

    def touch(self, client_id: str, client_type: str = "", group: str = "") -> None:
        """Any call of the client keeps it alive; a heartbeat also says its type and group."""
        with self._lock:
            session = self._session(client_id)
            session.client_type = client_type or session.client_type
            session.group = group or session.group

    def attach(self, client_id: str) -> Outbox:
        """A Telemetry stream opened: its outbox (an older stream's outbox of the client is closed)."""
        with self._lock:
            session = self._session(client_id)
            old, session.outbox = session.outbox, Outbox(self.outbox_limit)
            outbox = session.outbox
        if old is not None:
            old.close()
        return outbox

    def apply_settings(self, client_id: str, client_type: str, topics: Iterable[str], group: str) -> None:
        with self._lock:
            session = self._session(client_id)
            session.client_type, session.topics, session.group = client_type, frozenset(topics), group
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

    def remove(self, client_id: str, why: str) -> None:
        with self._lock:
            session = self._sessions.pop(client_id, None)
        if session is None:
            return
        if session.outbox is not None:
            session.outbox.close()
        log.info("gateway.client_removed", client_id=client_id, why=why)
        self._changed()

    def expire(self) -> int:
        """Forget the clients not heard of for ``ttl_ms``; how many."""
        cutoff = self.clock.now_ms() - self.ttl_ms
        with self._lock:
            stale = [c for c, s in self._sessions.items() if s.last_seen_ms < cutoff]
        for client_id in stale:
            self.remove(client_id, f"silent for more than {self.ttl_ms} ms")
        return len(stale)

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
