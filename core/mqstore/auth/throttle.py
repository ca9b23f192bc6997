"""What keeps failed authentication cheap for the server (mqstore.auth.authority uses all three).

A secret not seen before is checked against its scrypt hash: tens of milliseconds of CPU and 16 MiB of
memory (mqstore.auth.secrets), on purpose. Unthrottled, 40 threads sending random secrets made 40 of those
run at once: a legitimate cached caller's median went from 3 ms to 2.6 s and the process grew by 850 MiB
(issue 32). So:

* :class:`HashGate`: at most ``limit`` verifications run at once in a process (2 by default; every
  Authority of a process with the same settings shares one gate: :func:`shared_gate`), on the gate's own
  ``limit`` threads; a check beyond waits up to ``wait_s`` for a place, then is refused with Unavailable
  (retry), as is at once a check that finds ``waiters`` (16) waiting already: a waiting call is a request
  whose body grpc may be receiving meanwhile, up to its HTTP/2 flow-control window (mqstore_rpc.auth).
  Its own threads, because the allocator keeps the 16 MiB that scrypt took in the arena of the thread
  that ran it (glibc serves a second 16 MiB block from the arena): hashed on the handler threads, 13
  failed logins left 13 threads holding 16 MiB each (a commit log went from 74 to 270 MiB under a flood
  the gate held to 2 at once), and after each hash its thread hands the memory back (malloc_trim).
  Credentials accepted before never come here: they are one dict read (Authority.cached).
* :class:`RejectedCache`: (user, SHA-256 of the secret) pairs that failed, each remembered for ``ttl_s``
  (30 s by default, so a client retrying a wrong secret costs no hash, and a secret that becomes valid
  through a change of the users, which drops the cache, or after the TTL is accepted). At most
  ``max_entries``, evicted oldest first: an entry costs its maker one scrypt under the gate and the
  backoff, so flushing the cache costs an attacker thousands of gated hashes, and every entry is gone
  after ``ttl_s`` anyway.
* :class:`FailureBackoff`: failed verifications per peer (its address, not its port: ``mqstore_rpc.auth``
  passes an IPv6 peer as its /64) and per user name. After ``threshold`` failures in a row, new
  credentials of that key are refused without a hash for a window of ``base_s``, doubled at every
  further failure up to ``max_s``; a success resets the key; a key without a failure for ``forget_s``
  starts over. A refusal within a window is not a failure (it does not lengthen the window, so clients
  behind a shared address recover when the window ends). Credentials this process accepted before
  (their fingerprint is kept across cache drops) pass the backoff, and cached ones never reach it:
  a legitimate user behind the attacker's proxy or NAT keeps working. At most ``max_keys`` keys: when
  full, keys that block nothing (expired, or under the threshold) are dropped first; if every key
  blocks, a new key is not tracked (its verifications are still gated).

Thread-safety: every class here is thread-safe (a lock each, held for dict operations only; the gate's
wait is a semaphore's).
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import ctypes.util
import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

from mqstore import waits
from mqstore.errors import InvalidArgument, Unavailable

T = TypeVar("T")


@dataclass(frozen=True)
class Throttle:
    """The settings of the three (see the module docstring)."""

    hash_limit: int = 2              # scrypt verifications at once per process
    hash_wait_s: float = 2.0         # how long a new credential waits for a place before Unavailable
    hash_waiters: int = 16           # new credentials waiting for a place at most; beyond, Unavailable at once
    rejected_ttl_s: float = 30.0     # how long a failed (user, secret) is refused without a hash
    rejected_max: int = 4096
    failures_before_backoff: int = 10
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_forget_s: float = 300.0
    backoff_max_keys: int = 8192

    def __post_init__(self) -> None:
        for name in ("hash_limit", "hash_waiters", "rejected_max", "failures_before_backoff", "backoff_max_keys"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"auth throttle: {name} must be at least 1, not {getattr(self, name)}")
        for name in ("hash_wait_s", "rejected_ttl_s", "backoff_base_s", "backoff_max_s", "backoff_forget_s"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"auth throttle: {name} must be positive, not {getattr(self, name)}")
        if self.backoff_max_s < self.backoff_base_s:
            raise InvalidArgument("auth throttle: backoff_max_s must be at least backoff_base_s")


class HashGate:
    """Runs ``check()`` on one of its ``limit`` threads (made on first use, kept for the process's life);
    :meth:`run` waits up to ``wait_s`` for a place (saying so to the handler pool: mqstore.waits) and
    raises Unavailable when no place came, or at once when ``waiters`` calls wait already (each waiting
    call is a request whose body grpc may be receiving, up to its HTTP/2 window: mqstore_rpc.auth), then
    waits for the check's answer (or error)."""

    def __init__(self, limit: int, wait_s: float, waiters: int = 16):
        self.limit = limit
        self._wait_s = wait_s
        self._max_waiters = waiters
        self._waiters = 0
        self._lock = threading.Lock()
        self._places = threading.BoundedSemaphore(limit)
        self._threads = concurrent.futures.ThreadPoolExecutor(limit, thread_name_prefix="auth-hash")

    def run(self, name: str, check: Callable[[], T]) -> T:
        if not self._places.acquire(blocking=False):
            with self._lock:
                queued = self._waiters < self._max_waiters
                if queued:
                    self._waiters += 1
            if not queued:
                raise self._busy(name)
            try:
                with waits.waiting():
                    got = self._places.acquire(timeout=self._wait_s)
            finally:
                with self._lock:
                    self._waiters -= 1
            if not got:
                raise self._busy(name)
        with waits.waiting():
            try:
                return self._threads.submit(_trimmed, check).result()  # a place is free: it starts at once
            finally:
                self._places.release()

    def _busy(self, name: str) -> Unavailable:
        return Unavailable(f"the credentials of user {name!r} could not be checked: this server is checking "
                           f"{self.limit} other new credentials, more wait, and none finished within "
                           f"{self._wait_s:g} s (many failed logins?); retry in a few seconds")


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: the allocator keeps what it keeps
        return None


_malloc_trim = _find_malloc_trim()


def _trimmed(check: Callable[[], T]) -> T:
    """``check()``, then the memory its scrypt freed handed back to the system (glibc's malloc_trim: after
    a first 16 MiB block, glibc serves the next ones from the thread's arena and keeps them there)."""
    try:
        return check()
    finally:
        if _malloc_trim is not None:
            _malloc_trim(0)


_gates: dict[tuple[int, float, int], HashGate] = {}
_gates_lock = threading.Lock()


def shared_gate(limit: int, wait_s: float, waiters: int = 16) -> HashGate:
    """The process's gate with these settings (made on first use)."""
    with _gates_lock:
        gate = _gates.get((limit, wait_s, waiters))
        if gate is None:
            gate = _gates[limit, wait_s, waiters] = HashGate(limit, wait_s, waiters)
        return gate


class RejectedCache:
    """Keys remembered for ``ttl_s`` (by ``clock``, in seconds), at most ``max_entries``, oldest evicted."""

    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float]):
        self._ttl_s = ttl_s
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._until: collections.OrderedDict = collections.OrderedDict()  # key -> expiry, in expiry order

    def __contains__(self, key) -> bool:
        with self._lock:
            until = self._until.get(key)
            return until is not None and until > self._clock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)

    def add(self, key) -> None:
        with self._lock:
            now = self._clock()
            while self._until and (len(self._until) >= self._max or next(iter(self._until.values())) <= now):
                self._until.popitem(last=False)
            self._until.pop(key, None)
            self._until[key] = now + self._ttl_s

    def discard(self, key) -> None:
        with self._lock:
            self._until.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._until.clear()


class _Failures:
    __slots__ = ("count", "last", "until")

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.until = 0.0


class FailureBackoff:
    """Failures per key and the window each key is refused in; see the module docstring."""

    def __init__(self, threshold: int, base_s: float, max_s: float, forget_s: float, max_keys: int,
                 clock: Callable[[], float]):
        self._threshold, self._base_s, self._max_s, self._forget_s = threshold, base_s, max_s, forget_s
        self._max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[object, _Failures] = {}

    def blocked_for(self, key) -> float:
        """Seconds left of ``key``'s window (0: not blocked)."""
        with self._lock:
            entry = self._keys.get(key)
            if entry is None:
                return 0.0
            return max(0.0, entry.until - self._clock())

    def failed(self, key) -> None:
        with self._lock:
            now = self._clock()
            entry = self._keys.get(key)
            if entry is None:
                if len(self._keys) >= self._max_keys and not self._make_room(now):
                    return  # every key blocks: this one is not tracked (its verifications are still gated)
                entry = self._keys[key] = _Failures()
            elif now - entry.last > self._forget_s:
                entry.count, entry.until = 0, 0.0
            entry.count += 1
            entry.last = now
            beyond = entry.count - self._threshold
            if beyond >= 0:
                entry.until = now + min(self._max_s, self._base_s * (2 ** min(beyond, 32)))

    def succeeded(self, key) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)

    def _make_room(self, now: float) -> bool:
        """Drop the keys that block nothing now (called full, under the lock); True when room was made."""
        idle = [k for k, e in self._keys.items()
                if e.until <= now and (e.count < self._threshold or now - e.last > self._forget_s)]
        for key in idle:
            del self._keys[key]
        return len(self._keys) < self._max_keys
