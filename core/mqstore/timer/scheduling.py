"""The way in to the timer: an append whose messages carry a delivery time goes to the timer topic, and a recall
(cancel by message id) appends a cancel marker there. The CommitLog servicer calls these; tests and the bench too.

* A batch is timed or not as a whole: a batch mixing delayed and plain messages is INVALID_ARGUMENT (it could not
  be stored all or nothing, one append into the timer topic and one into the real topic). A timed batch is one
  append into the timer topic, so it is stored all or nothing; its results name the timer topic's records (their
  msg_id is what :func:`recall` takes; the uniq key stays the message's id on delivery).
* The real topic must exist and take the queue asked for now; a topic deleted before the delivery drops the copy
  (logged and counted). A delivery time in the past is due at once.
* The store-set names (mqstore.timer.messages.STORE_SET) are refused on every append that passes here. The
  compiled codec's messages (WireMessages) pass straight to the store unless its parser marked one (a delivery
  field, a property named TIMER_*, REAL_TOPIC or REAL_QID): then the codec's ``timer_batch`` makes the timer
  records from the WireMessages (the same bytes as the reference's, encoded by the AppendEncoder), or, where it
  declines (anything the reference could refuse or that is unusual), the batch is converted to the MessageIn
  mqstore_rpc.convert would make (messages.wire_messages_in) and goes the reference way, which says why.
  tests/property/test_codec_timer.py holds the two to the same records and errors.

:class:`Scheduler` is what the CommitLog servicer holds: these with the store, the limits and the duty's wake.

Thread-safety: as the store (thread-safe); ``wake`` is the timer duty's (thread-safe).
"""

from __future__ import annotations

from typing import Callable, Sequence

from mqstore import codec, waits
from mqstore import topics as topic_rules
from mqstore.errors import FailedPrecondition, InvalidArgument, NotFound, OutOfRange
from mqstore.model import AppendResults, Copies, Copy, MessageIn
from mqstore.timer import messages as tm
from mqstore.timer.config import TimerConfig

STORE_SET, ASKING = tm.STORE_SET, frozenset(tm.ASKING)
# A delayed batch wakes the timer's duty only when one of its messages is due soon (within a precision and
# WAKE_LEAD_MS from now) or when WAKE_RECORDS records were appended since the last wake: the duty steps at least every
# MAX_PAUSE_S (50 ms, mqstore.timer.leadership) anyway, which enqueues a later message long before its slot. Before,
# every batch woke it, so under load it stepped for a batch or two, and a step's fixed cost (its two file writes and
# the Python around them, ~40-60 us) came to ~0.4 us a message on the duty's thread, paid across the GIL.
WAKE_LEAD_MS = 1_000
WAKE_RECORDS = 4_096


class Scheduler:
    def __init__(self, store, config: TimerConfig, wake: Callable[[], None] = lambda: None,
                 noted: Callable[[AppendResults, list[int]], None] | None = None):
        """``noted(results, due times)``: told of each delayed batch appended (the timer duty's note: its enqueue
        then need not read those records back)."""
        self.store = store
        self.config = config
        self.wake = wake
        self.noted = noted
        self._lead_ms = config.timer_precision_ms + WAKE_LEAD_MS
        self._unwoken = 0  # records appended since the last wake (racy across threads: a lost count delays a wake)

    async def append_async(self, topic: str, messages, replication: str | None = None,
                           writer: str | None = None) -> AppendResults:
        """A delayed batch to the timer topic, any other to ``topic`` (``writer``: the store's system_writer
        for it: the gateway's relayed sends, mqstore.relayed). The one version (the store's append_async):
        awaited on an event loop, run on a thread by :meth:`append` (mqstore.waits.blocking)."""
        target, batch, writer, dues = self._route(topic, messages, writer)
        results = await self.store.append_async(target, batch, system_writer=writer, replication=replication)
        if dues is not None:
            self._appended(results, dues)
        return results

    def append(self, topic: str, messages, replication: str | None = None,
               writer: str | None = None) -> AppendResults:
        """:meth:`append_async` on this thread (mqstore.waits.blocking), written out: the hot path."""
        return waits.blocking(self.append_async(topic, messages, replication, writer))

    def _appended(self, results: AppendResults, dues: list[int]) -> None:
        if self.noted is not None:
            self.noted(results, dues)
        self._unwoken += len(dues)
        if self._unwoken >= WAKE_RECORDS or (dues and min(dues) < self.store.clock.now_ms() + self._lead_ms):
            self._unwoken = 0
            self.wake()

    def _route(self, topic: str, messages, writer: str | None) -> tuple[str, object, str | None, list[int] | None]:
        """(topic, messages, system writer, the due times of a delayed batch or None) of the append a batch
        becomes."""
        if codec.is_wire_messages(messages):
            if not messages.timer_marks:
                return topic, messages, writer, None
            made = self._wire_timer_batch(topic, messages)
            if made is not None:
                return tm.TIMER_TOPIC, made[0], topic_rules.OWNER_SCHEDULE, made[1]
            messages = tm.wire_messages_in(messages)
        if not _checked_timed(messages):
            return topic, messages, writer, None
        batch, dues = timer_batch(self.store, self.config, topic, messages)
        return tm.TIMER_TOPIC, batch, topic_rules.OWNER_SCHEDULE, dues

    def _wire_timer_batch(self, topic: str, wire) -> tuple[object, list[int]] | None:
        """The compiled codec's timer records of a timer-marked WireMessages batch and their due times, or None
        where the reference way decides (see the module doc)."""
        if topic_rules.is_system_topic(topic) or topic_rules.is_pop_owned_topic(topic):
            return None
        try:
            queue_count = self.store.topic_admin.get(topic).queue_count
        except NotFound:
            return None
        return codec.compiled.timer_batch(wire, tm.TIMER_TOPIC, topic, queue_count, self.store.clock.now_ms(),
                                          self.config.timer_max_delay_ms)

    def recall(self, topic: str, msg_id: str) -> int:
        return recall(self.store, topic, msg_id, self.wake)


def _checked_timed(messages: Sequence[MessageIn]) -> bool:
    """Whether the batch is a delayed one (all or none: else INVALID_ARGUMENT); store-set names refused."""
    timed = 0
    for message in messages:
        props = message.properties
        if props:
            if not STORE_SET.isdisjoint(props):
                tm.check_reserved(messages)  # raises, naming the message and the property
            timed += not ASKING.isdisjoint(props)
    if timed and timed != len(messages):
        raise InvalidArgument(f"messages: {timed} of {len(messages)} carry a delivery time; send delayed "
                              f"messages in batches of their own")
    return timed > 0


def to_timer_batch(store, config: TimerConfig, topic: str, messages: Sequence[MessageIn]) -> list[MessageIn]:
    """The timer topic's records of a delayed batch for ``topic`` (checked: the topic, the queues, the limit)."""
    return timer_batch(store, config, topic, messages, copies=False)[0]


def timer_batch(store, config: TimerConfig, topic: str, messages: Sequence[MessageIn],
                copies: bool = True) -> tuple[list[MessageIn] | Copies, list[int]]:
    """:func:`to_timer_batch` and each record's due time; ``copies``: the records as model.Copies where they may be
    (messages.timer_records: the encoder then writes their properties as given)."""
    if topic_rules.is_system_topic(topic) or topic_rules.is_pop_owned_topic(topic):
        raise InvalidArgument(f"topic {topic!r}: delayed messages go to user topics only")
    now_ms, queue_count = store.clock.now_ms(), store.topic_admin.get(topic).queue_count
    if copies and codec.compiled is not None:  # the same Copies in C; None: the reference decides (and says why)
        made = codec.compiled.timer_copies(messages, topic, queue_count, now_ms, config.timer_max_delay_ms, Copy,
                                           Copies)
        if made is not None:
            return made
    return tm.timer_records(topic, messages, now_ms, config.timer_max_delay_ms, queue_count, copies)


def append(store, config: TimerConfig, topic: str, messages: Sequence[MessageIn], replication: str | None = None,
           wake: Callable[[], None] = lambda: None) -> AppendResults:
    """:meth:`Scheduler.append` without a Scheduler (tests, the bench)."""
    return Scheduler(store, config, wake).append(topic, messages, replication)


def recall(store, topic: str, msg_id: str, wake: Callable[[], None] = lambda: None) -> int:
    """Cancel the delayed message of ``topic`` whose timer record ``msg_id`` names (the msg_id its Append
    returned); returns when it was due. FAILED_PRECONDITION when it is due already (delivered, or being
    delivered); NOT_FOUND, the same answer, for an id of no delayed message of ``topic`` (no oracle)."""
    store.gate.check_writable()
    absent = NotFound(f"msg_id {msg_id}: no delayed message of topic {topic!r} has this id (give the msg_id "
                      f"Append returned for a message with a delivery time)")
    try:
        record = store.get_message_by_id(msg_id).record
    except (NotFound, OutOfRange):
        raise absent from None
    props = record.properties
    if (record.topic != tm.TIMER_TOPIC or tm.CANCEL_OFFSET in props or tm.OUT_MS not in props
            or props.get(tm.REAL_TOPIC) != topic):
        raise absent
    due = int(props[tm.OUT_MS])
    if due <= store.clock.now_ms():
        raise FailedPrecondition(f"msg_id {msg_id}: due at {due} ms already, so delivered or being delivered; "
                                 f"nothing to recall")
    store.append(tm.TIMER_TOPIC, [tm.cancel_marker(record)], system_writer=topic_rules.OWNER_SCHEDULE)
    wake()
    return due
