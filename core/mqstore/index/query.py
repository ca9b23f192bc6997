"""Queries across index files: newest first, time filter, dedup, max_num clamp, page token.

Time granularity: an entry keeps its store time in whole seconds from its file's begin, so it reads
back up to 999 ms early. The lower bound is widened by 999 ms so no message in range is missed; the
caller drops candidates whose real store time (read with the message) is outside the range, as it
drops hash collisions.

Work per query is bounded: each file is asked for at most ``max_scan_entries`` chain entries (one
ranged read of the run for a compact file). A page stops early, with a page token, when a file hits
that bound before the page is full, so results stay newest first and nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from mqstore.errors import FailedPrecondition
from mqstore.format.index_file import key_hash

from . import paging as P
from .records import query_key
from .stats import RebuildRange

MAX_TIME_MS = P.MAX_TIME_MS
GRANULARITY_SLACK_MS = 999
NO_LOCK = contextlib.nullcontext()


class RangeNotIndexed(FailedPrecondition):
    """The query's time range overlaps index data that is being rebuilt from the commit log; the
    answer would be partial. Retry later or query a time range outside it. (FAILED_PRECONDITION, as
    index.proto documents; ``range`` says which physical offsets and store times.)"""

    def __init__(self, rng: RebuildRange):
        super().__init__(
            f"index for physical offsets [{rng.start_physical_offset}, {rng.end_physical_offset}) "
            f"(store time {rng.begin_timestamp_ms}..{rng.end_timestamp_ms} ms) was damaged and is "
            f"being rebuilt from the commit log; it cannot be answered yet: retry later or query a "
            f"time range outside it")
        self.range = rng


@dataclass(frozen=True, slots=True)
class Locator:
    physical_offset: int
    store_timestamp_ms: int  # whole seconds from the file's begin: up to 999 ms before the real time


@dataclass(frozen=True, slots=True)
class QueryResult:
    locators: tuple[Locator, ...]
    next_page_token: str | None  # None when there is nothing more
    max_num: int          # after clamping
    files_scanned: int
    reads: int            # ranged reads of compact files (local or tier) for this page


@dataclass
class _Page:
    max_num: int
    cursor: P.Cursor
    before_phy: int | None
    locators: list[Locator] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    next_cursor: P.Cursor | None = None
    reads: int = 0
    max_reads_per_file: int = 0
    files_scanned: int = 0

    @property
    def full(self) -> bool:
        return len(self.locators) >= self.max_num

    def add(self, matches) -> None:
        for match in matches:
            if match.physical_offset not in self.seen:
                self.seen.add(match.physical_offset)
                self.locators.append(Locator(match.physical_offset, match.timestamp_ms))
                self.before_phy = match.physical_offset


def run(store, topic: str, key: str, begin_ms: int, end_ms: int, max_num: int,
        page_token: str | None) -> QueryResult:
    P.check_time_range(begin_ms, end_ms)
    max_num = P.clamp_max_num(max_num, store.config.default_max_num, store.config.max_max_num)
    fp = P.fingerprint(topic, key, begin_ms, end_ms)
    cursor = P.decode(page_token, fp) if page_token else P.Cursor()
    hash_ = key_hash(query_key(topic, key))
    lower_ms = max(0, begin_ms - GRANULARITY_SLACK_MS)
    handles = store.pin_for_query(lower_ms, end_ms, cursor.before_phy)
    page = _Page(max_num, cursor, cursor.before_phy)
    try:
        for handle in handles:
            if page.full:
                page.next_cursor = P.Cursor(page.before_phy)
                break
            if not _scan_file(store, handle, page, hash_, lower_ms, end_ms):
                break
    finally:
        for handle in handles:
            handle.unpin()
    store.counters.query_done(page.reads, page.max_reads_per_file)
    token = P.encode(page.next_cursor, fp) if page.next_cursor is not None else None
    return QueryResult(tuple(page.locators), token, max_num, page.files_scanned, page.reads)


def _skip(handle, page: _Page, lower_ms: int, end_ms: int) -> bool:
    cursor, info = page.cursor, handle.info()
    if page.before_phy is not None and handle.first_phy_offset >= page.before_phy:
        return True  # every entry of this file was at or above the last result returned
    if cursor.file_phy is not None and handle.first_phy_offset > cursor.file_phy:
        return True
    return info.entries == 0 or info.end_timestamp_ms < lower_ms or info.begin_timestamp_ms > end_ms


def _scan_file(store, handle, page: _Page, hash_: int, lower_ms: int, end_ms: int) -> bool:
    """Scan one file into the page; False when the page must stop here (its token set)."""
    if _skip(handle, page, lower_ms, end_ms):
        return True
    resume = handle.first_phy_offset == page.cursor.file_phy
    entry, ordinal = (page.cursor.next_entry, page.cursor.next_ordinal) if resume else (0, 0)
    page.files_scanned += 1
    file_reads = 0
    while True:
        want = page.max_num - len(page.locators)
        with store.query_lock(handle):
            res = handle.query(hash_, lower_ms, end_ms, want,
                               max_scan_entries=store.config.max_scan_entries,
                               before_phy_offset=page.before_phy, start_entry=entry, start_ordinal=ordinal)
        file_reads += res.reads
        page.reads += res.reads
        page.max_reads_per_file = max(page.max_reads_per_file, file_reads)
        page.add(res.matches)
        if res.exhausted:
            return True
        if len(res.matches) >= want and not page.full:
            entry, ordinal = res.next_entry, res.next_ordinal  # duplicates removed: fill the page
            continue
        page.next_cursor = P.Cursor(page.before_phy, handle.first_phy_offset, res.next_entry,
                                    res.next_ordinal)
        return False
