"""Receives with ``auto_renew`` (push consumers): the gateway keeps the messages invisible while the client
works on them, as the Java proxy's receipt handle manager does (DefaultReceiptHandleManager: renew ahead
of the invisible time, for at most a few hours).

  event                                  what the table does
  -------------------------------------- ----------------------------------------------------------------
  receive with auto_renew                one entry per delivery: the client, group, topic, the handle the
                                         client holds (its key) and the current one, visible_at_ms
  renewal pass (duty gateway-renewal)    an entry within ``ahead_ms`` of visible_at_ms gets
                                         ChangeInvisibleDuration(``invisible_ms``) on its current handle:
                                         a new current handle and visible_at_ms. Dropped instead (the
                                         message then comes again after its invisible time, as without
                                         renewal) when its client is gone (silent for client_ttl_ms, or
                                         terminated), when it has been renewed for ``max_ms``, or when the
                                         handle no longer works (acked, replaced, expired). A renewal the
                                         commit log did not answer or refused for a full disk is retried
                                         on the next pass.
  ack / change / forward of a handle     ``take``: the entry leaves the table and the call uses the current
                                         handle (the client only ever holds the first one)

The table holds at most ``max_entries``: a receive beyond it is delivered without renewal (logged once
per pass as gateway.renewal_full), so a consumer that never acks cannot grow it without bound.

Thread-safe: ``_lock`` guards the table; each entry's own lock serialises its renewal with its ``take``,
so an ack that comes while the entry is being renewed waits for the new handle (never acks a handle the
renewal has just replaced). Pop calls are made without ``_lock`` held.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import structlog

from mqstore.clock import Clock
from mqstore.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable
from mqstore.pop.receive import Delivery
from mqstore.pop.service import ChangeResult

log = structlog.get_logger("mqstore.gateway.renewal")


class ChangePort(Protocol):
    def change_invisible_duration(self, group: str, topic: str, receipt_handle: str,
                                  invisible_duration_ms: int) -> ChangeResult: ...


@dataclass
class _Entry:
    client_id: str
    group: str
    topic: str
    current: str              # the handle that works now (the client holds the first one, the key)
    visible_at_ms: int
    first_ms: int             # when it was received: renewed until first_ms + max_ms
    taken: bool = False       # acked, changed or forwarded: the renewal must leave it alone
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Renewals:
    def __init__(self, pop: ChangePort, clock: Clock, *, invisible_ms: int, ahead_ms: int, max_ms: int,
                 max_entries: int, alive: Callable[[str], bool]):
        """``alive(client_id)``: the client is still known to the gateway (its registry)."""
        self.pop, self.clock = pop, clock
        self.invisible_ms, self.ahead_ms, self.max_ms, self.max_entries = invisible_ms, ahead_ms, max_ms, max_entries
        self._alive = alive
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], _Entry] = {}   # (group, the client's handle) -> entry
        self._full = 0

    def add(self, client_id: str, group: str, topic: str, deliveries: Iterable[Delivery]) -> None:
        now = self.clock.now_ms()
        with self._lock:
            for d in deliveries:
                if len(self._entries) >= self.max_entries:
                    self._full += 1
                    continue
                self._entries[(group, d.receipt_handle)] = _Entry(client_id, group, topic, d.receipt_handle,
                                                                  d.visible_at_ms, now)

    def take(self, group: str, receipt_handle: str) -> str:
        """The handle to use for the client's ``receipt_handle`` (its current one when it was renewed); the
        message is renewed no more."""
        with self._lock:
            entry = self._entries.pop((group, receipt_handle), None)
        if entry is None:
            return receipt_handle
        with entry.lock:  # a renewal in progress finishes first
            entry.taken = True
            return entry.current

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def renew_due(self) -> int:
        """One pass: renew what is due, drop what must not be renewed; how many were renewed."""
        now = self.clock.now_ms()
        with self._lock:
            due = [(key, e) for key, e in self._entries.items() if e.visible_at_ms - now <= self.ahead_ms]
            full, self._full = self._full, 0
        if full:
            log.warning("gateway.renewal_full", not_renewed=full, max_entries=self.max_entries)
        renewed = 0
        for key, entry in due:
            with entry.lock:
                if entry.taken:
                    continue
                reason = self._drop_reason(entry, now)
                if not reason:
                    reason = self._renew(entry)
                if reason == "renewed":
                    renewed += 1
                    continue
                if reason == "retry":
                    continue
            self._forget(key, entry, reason)
        return renewed

    def _drop_reason(self, entry: _Entry, now: int) -> str:
        if not self._alive(entry.client_id):
            return "client gone"
        if now - entry.first_ms >= self.max_ms:
            return f"renewed for {self.max_ms} ms (auto_renew_max_ms)"
        return ""

    def _renew(self, entry: _Entry) -> str:
        """"renewed", "retry" (the commit log did not answer) or why the entry must go; the caller holds
        the entry's lock."""
        try:
            changed = self.pop.change_invisible_duration(entry.group, entry.topic, entry.current, self.invisible_ms)
        except (Unavailable, ResourceExhausted) as exc:  # not answered, or the log is read-only (disk full)
            log.warning("gateway.renewal_retry", group=entry.group, topic=entry.topic, error=type(exc).__name__,
                        message=str(exc))
            return "retry"
        except (FailedPrecondition, InvalidArgument) as exc:  # acked, replaced or expired meanwhile
            return f"the handle no longer works: {exc}"
        entry.current, entry.visible_at_ms = changed.receipt_handle, changed.visible_at_ms
        return "renewed"

    def _forget(self, key: tuple[str, str], entry: _Entry, reason: str) -> None:
        with self._lock:
            if self._entries.get(key) is entry:
                del self._entries[key]
        log.info("gateway.renewal_dropped", client_id=entry.client_id, group=entry.group, topic=entry.topic,
                 reason=reason)
