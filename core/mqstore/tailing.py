"""Tail streams of the commit log (no grpc here): frames of whole raw records, read through a
:class:`~mqstore.store.MessageStore`, for the followers that derive their data from the log (the index,
the compactor, the Transaction service; mqstore.follow) and the CommitLog service's Tail call.

A stream starts at the log's earliest record, at its end, or at a record start, sends only visible
records (those the dispatcher has made readable), an empty frame every heartbeat when idle, and ends when
its caller stops it (``is_active``) or the store stops. With ``hold_retention_as`` retention keeps the log
from the stream's position while it is open (mqstore.retention_holds).

Thread-safe: each stream is a generator owned by one caller; the store's parts it reads are thread-safe.
"""

from __future__ import annotations

import time
from time import monotonic
from typing import Callable, Iterator, Sequence

from mqstore import limits, waits
from mqstore import topics as topic_rules
from mqstore.errors import InvalidArgument, OutOfRange
from mqstore.model import TAIL_EARLIEST, TAIL_LATEST, TailFrame
from mqstore.store import MessageStore

MAX_FRAME_BYTES = 4 << 20
MAX_TAIL_LINGER_MS = 1000  # a Tail's linger_ms is clamped to this
MAX_HOLD_NAME = 127  # TailRequest.hold_retention_as, in characters


def tail(store: MessageStore, start: str, from_physical_offset: int, topics: Sequence[str], max_frame_bytes: int,
         heartbeat_ms: int, is_active: Callable[[], bool], tx_types: Sequence[int] = (),
         hold_retention_as: str = "", linger_ms: int = 0, hold_durable: bool = False) -> Iterator[TailFrame]:
    """Frames of whole raw records of ``store``'s log, only visible ones; an empty frame every heartbeat when
    idle. With ``topics`` and/or ``tx_types`` (SYSFLAG transaction values: 0, 0x4, 0x8, 0xC) a record is
    sent when its topic is one of ``topics`` or its transaction type one of ``tx_types``.
    ``hold_retention_as``: retention keeps the log from the stream's start while the stream is open,
    then for the grace period, or for retention_hold_max_ms when ``hold_durable`` (named by the
    internal identity: mqstore.retention_holds).
    With ``linger_ms``, a caught-up stream woken by new records waits that long first, so that several
    appends share a frame (each frame costs a wake-up and a send on both sides)."""
    store.check_running()
    max_frame_bytes = limits.limit("max_frame_bytes", max_frame_bytes, default=1 << 20, maximum=MAX_FRAME_BYTES)
    heartbeat_s = limits.limit("heartbeat_ms", heartbeat_ms, default=1000, minimum=10, maximum=60_000) / 1000
    linger_s = limits.limit("linger_ms", linger_ms, default=0, maximum=MAX_TAIL_LINGER_MS) / 1000
    if start not in (TAIL_EARLIEST, TAIL_LATEST):
        limits.at_least_zero("from_physical_offset", from_physical_offset, "a record start in the commit log")
    for name in topics:  # a name that can never exist would filter out everything, silently
        topic_rules.validate_topic_name(name)
    wanted = frozenset(t.encode("utf-8") for t in topics)
    wanted_tx = frozenset(tx_types)
    if len(hold_retention_as) > MAX_HOLD_NAME:
        raise InvalidArgument(f"hold_retention_as: at most {MAX_HOLD_NAME} characters, not "
                              f"{len(hold_retention_as)}; name the follower (e.g. 'compactor')")
    pos = _start(store, start, from_physical_offset)
    if not hold_retention_as:
        yield from _frames(store, pos, max_frame_bytes, heartbeat_s, linger_s, is_active, wanted, wanted_tx)
        return
    store.retention.holds.open(hold_retention_as, pos, store.clock.now_ms(), durable=hold_durable)
    try:
        yield from _frames(store, pos, max_frame_bytes, heartbeat_s, linger_s, is_active, wanted, wanted_tx,
                           hold_retention_as)
    finally:
        store.retention.holds.close(hold_retention_as, store.clock.now_ms())


def _frames(store: MessageStore, pos: int, max_frame_bytes: int, heartbeat_s: float, linger_s: float,
            is_active: Callable[[], bool], wanted: frozenset, wanted_tx: frozenset,
            hold: str = "") -> Iterator[TailFrame]:
    cond = store.dispatcher.visible
    holds = store.retention.holds
    commitlog, clock = store.commitlog, store.clock
    sent = monotonic()  # when the last frame went: a filtered stream that finds nothing still says where it is
    while is_active() and store.running:
        if hold:
            holds.refresh(hold, clock.now_ms())
        visible = store.visible_offset()
        if pos < visible:
            pos = max(pos, commitlog.logical_min())  # the tier serves below the local log (issue 36)
            data, count, nxt = commitlog.frame(pos, visible, max_frame_bytes, wanted, wanted_tx)
            pos = nxt
            if count:
                sent = monotonic()
                yield TailFrame(data, count, pos, visible)
            elif monotonic() - sent >= heartbeat_s:
                # Nothing of the wanted topics, while the log grows faster than it is read or keeps growing: an
                # empty frame every heartbeat carries the position, or a follower of a few topics (the
                # Transaction service's) would hear nothing, not even a heartbeat, until the writers paused.
                sent = monotonic()
                yield TailFrame(b"", 0, pos, visible)
            continue
        with waits.waiting(), cond:  # a Tail stream waits most of its life: its handler thread does not count
            if store.visible_offset() <= pos:
                cond.wait(heartbeat_s)
        if store.visible_offset() <= pos:
            sent = monotonic()
            yield TailFrame(b"", 0, pos, store.visible_offset())
        elif linger_s:
            with waits.waiting():
                time.sleep(linger_s)  # at most MAX_TAIL_LINGER_MS; the loop then checks is_active and stop


def _start(store: MessageStore, start: str, offset: int) -> int:
    visible = store.visible_offset()
    low = store.commitlog.logical_min()
    if start == TAIL_EARLIEST:
        return low
    if start == TAIL_LATEST:
        return visible
    if offset < low or offset > visible:
        raise OutOfRange(f"from_physical_offset {offset} is outside the log: valid [{low}, {visible}]",
                         min_value=low, max_value=visible)
    if offset < visible:
        store.commitlog.check_resume_point(offset)
    return offset
