"""IndexQueries: index candidates -> verified answers (no grpc here).

The index keeps only a 32-bit hash of ``topic#key`` and store times in whole seconds, so every
candidate it returns is checked against the message itself, fetched from the commit log through the
injected ``CommitLogReader``:

  check                                           failing candidates are
  ----------------------------------------------- ---------------------------------------------------
  the log still serves the message                dropped, counted in ``missing_removed`` (retention, or
                                                  its topic was deleted: GetMessage is NOT_FOUND for it)
  real topic == topic, and key in KEYS or         dropped, counted in ``collisions_removed``
  key == UNIQ_KEY (by uniq key: key == UNIQ_KEY)  (another key with the same hash)
  begin_ms <= real store time <= end_ms           dropped (the index time is up to 999 ms early)

While the commit log is down nothing can be verified: a query with candidates raises ``Unavailable``
naming the key, the address and when to retry (nothing unverified is returned: a 32-bit hash alone
would return other keys' messages). A query whose key has no index entry answers at once (empty, or
NotFound by uniq key), and so does ``stats()``; ``by_time`` asks the commit log and is Unavailable too.

When checks remove candidates a page is refilled from the next index page (at most ``max_rounds``
index pages per request), so a page is full whenever enough matches exist; the page token then
continues after the last candidate examined. ``max_num`` is clamped before anything is allocated.
With ``include_messages`` a page also stops before its messages pass ``max_response_bytes`` (the
token then continues after the last message returned).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mqstore import limits
from mqstore.errors import InvalidArgument, NotFound, Unavailable, invariant, shown
from mqstore.follow import FollowerState
from mqstore.model import StoredMessage

from . import paging as P
from .ports import CommitLogReader
from .stats import IndexStats
from .upkeep import UpkeepState

MAX_TIME_MS = P.MAX_TIME_MS


@dataclass(frozen=True)
class LookupConfig:
    max_rounds: int = 8                          # index pages read to fill one response page
    uniq_max_num: int = 32                       # messages returned for one UNIQ_KEY (retries duplicate)
    max_response_bytes: int = 32 * 1024 * 1024   # with include_messages; the gRPC limit is 64 MiB

    def __post_init__(self) -> None:
        for name in ("max_rounds", "uniq_max_num", "max_response_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive, not {getattr(self, name)}")


@dataclass
class Page:
    """Verified messages newest first, and what finding them cost. Built by one request: not shared."""

    messages: list[StoredMessage] = field(default_factory=list)
    next_page_token: str | None = None
    index_reads: int = 0
    files_searched: int = 0
    collisions_removed: int = 0
    missing_removed: int = 0
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ServiceStats:
    store: IndexStats
    follower: FollowerState
    upkeep: UpkeepState
    maintainer_died: str = ""   # the bug that killed the maintainer thread, "" otherwise

    @property
    def bytes_behind(self) -> int | None:
        """None until the follower's first frame since start: unknown, which is not caught up."""
        end = self.follower.log_end_physical_offset
        return max(0, end - (self.store.next_physical_offset or 0)) if end is not None else None

    @property
    def problem(self) -> str:
        """Why the service is unhealthy, or "" (the commit log being away is not a problem of ours)."""
        if not self.store.healthy:
            return self.store.last_error
        for name, state in (("follower", self.follower), ("upkeep", self.upkeep)):
            if not state.alive:
                return f"the index {name} thread is not running{f' ({state.died})' if state.died else ''}"
        if self.maintainer_died:
            return f"the index maintainer thread is not running ({self.maintainer_died})"
        if not self.follower.healthy:
            return f"index follower: {self.follower.last_error}"
        if not self.upkeep.healthy:
            return f"index upkeep: {self.upkeep.last_error}"
        return ""

    @property
    def last_error(self) -> str:
        return self.problem or self.store.last_error or self.follower.last_error or self.upkeep.last_error


class IndexQueries:
    """Thread-safe: the store and the reader are; this class keeps no state of its own."""

    def __init__(self, store, source: CommitLogReader, follower_state: Callable[[], FollowerState],
                 upkeep_state: Callable[[], UpkeepState], config: LookupConfig = LookupConfig(),
                 maintainer_died: Callable[[], str] = lambda: ""):
        self.store = store
        self.source = source
        self.config = config
        self._follower_state = follower_state
        self._upkeep_state = upkeep_state
        self._maintainer_died = maintainer_died

    def by_key(self, topic: str, key: str, begin_ms: int, end_ms: int, max_num: int, page_token: str | None,
               include_messages: bool) -> Page:
        """Messages of ``topic`` with ``key`` in KEYS (or as UNIQ_KEY) stored in [begin_ms, end_ms]
        (end 0 = no upper bound: "now", and page tokens stay valid), newest first."""
        end_ms = end_ms or MAX_TIME_MS
        P.check_time_range(begin_ms, end_ms)
        max_num = P.clamp_max_num(max_num, self.store.config.default_max_num, self.store.config.max_max_num)
        return self._collect(topic, key, begin_ms, end_ms, max_num, page_token, include_messages, False)

    def by_uniq_key(self, topic: str, uniq_key: str, include_messages: bool) -> Page:
        """The message(s) whose UNIQ_KEY is ``uniq_key``; NotFound when the index has none."""
        page = self._collect(topic, uniq_key, 0, MAX_TIME_MS, self.config.uniq_max_num, None, include_messages,
                             True)
        if not page.messages:
            resume = self.store.resume_physical_offset()
            covers = "nothing yet" if resume is None else f"the log below physical offset {resume}"
            raise NotFound(f"no message with UNIQ_KEY {shown(uniq_key)} in topic {shown(topic)} is indexed (the index "
                           f"covers {covers})")
        return page

    def by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store time is at or after ``timestamp_ms`` (the commit log's own
        consume queue answers it: a binary search on store times)."""
        if not topic:
            raise InvalidArgument("topic must not be empty")
        limits.at_least_zero("queue_id", queue_id)
        limits.at_least_zero("timestamp_ms", timestamp_ms, "ms since the epoch")
        try:
            return self.source.offset_by_time(topic, queue_id, timestamp_ms)
        except Unavailable as exc:
            raise Unavailable(f"QueryByTime is answered by the commit log's consume queue, and the commit log "
                              f"did not answer ({exc}); retry when it is back (IndexStats.connected turns "
                              f"true)") from exc

    def stats(self) -> ServiceStats:
        return ServiceStats(self.store.stats(), self._follower_state(), self._upkeep_state(), self._maintainer_died())

    # -- collecting a page ---------------------------------------------------------------------------
    def _collect(self, topic: str, key: str, begin_ms: int, end_ms: int, max_num: int, token: str | None,
                 include_messages: bool, uniq_only: bool) -> Page:
        page = Page()
        for _ in range(self.config.max_rounds):
            result = self.store.query(topic, key, begin_ms, end_ms, max_num - len(page.messages), token)
            token = result.next_page_token
            page.index_reads += result.reads
            page.files_searched += result.files_scanned
            offsets = [locator.physical_offset for locator in result.locators]
            for offset, message in zip(offsets, self._fetch(topic, key, offsets), strict=True):
                if not self._accept(page, offset, message, topic, key, begin_ms, end_ms, uniq_only):
                    continue
                size = message.record.size
                if include_messages and page.messages and page.size_bytes + size > self.config.max_response_bytes:
                    cursor = P.Cursor(before_phy=page.messages[-1].record.physical_offset)
                    page.next_page_token = P.encode(cursor, P.fingerprint(topic, key, begin_ms, end_ms))
                    return page
                page.messages.append(message)
                page.size_bytes += size
            if not token or len(page.messages) >= max_num:
                break
        page.next_page_token = token
        return page

    def _fetch(self, topic: str, key: str, offsets: list[int]) -> list[StoredMessage | None]:
        if not offsets:
            return []  # no candidate: the answer needs no commit log (so it comes while the log is down)
        try:
            return self.source.get_messages(offsets)
        except Unavailable as exc:
            raise Unavailable(
                f"cannot verify the {len(offsets)} index candidate(s) for key {shown(key)} in topic {shown(topic)}: "
                f"the index keeps only a hash of each key, so each candidate is checked against its message in "
                f"the commit log, which did not answer ({exc}). Retry when the commit log is back (IndexStats."
                f"connected turns true); Stats, and queries for keys without index entries, answer meanwhile"
            ) from exc

    @staticmethod
    def _accept(page: Page, offset: int, message: StoredMessage | None, topic: str, key: str, begin_ms: int,
                end_ms: int, uniq_only: bool) -> bool:
        if message is None:
            page.missing_removed += 1
            return False
        record = message.record
        invariant(record.physical_offset == offset,
                  f"asked the commit log for physical offset {offset}, got {record.physical_offset}")
        uniq_key = message.uniq_key
        matches = uniq_key == key if uniq_only else (uniq_key == key or key in message.keys)
        if record.topic != topic or not matches:
            page.collisions_removed += 1
            return False
        return begin_ms <= record.store_timestamp_ms <= end_ms
