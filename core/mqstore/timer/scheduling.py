"""The way in to the timer: an append whose messages carry a delivery time goes to the timer topic, and a recall
(cancel by message id) appends a cancel marker there. The CommitLog servicer calls these; tests and the bench too.

* A batch is timed or not as a whole: a batch mixing delayed and plain messages is INVALID_ARGUMENT (it could not
  be stored all or nothing, one append into the timer topic and one into the real topic). A timed batch is one
  append into the timer topic, so it is stored all or nothing; its results name the timer topic's records (their
  msg_id is what :func:`recall` takes; the uniq key stays the message's id on delivery).
* The real topic must exist and take the queue asked for now; a topic deleted before the delivery drops the copy
  (logged and counted). A delivery time in the past is due at once.
* The store-set names (mqstore.timer.messages.STORE_SET) are refused on every append that passes here.

Thread-safety: as the store (thread-safe); ``wake`` is the timer duty's (thread-safe).
"""

from __future__ import annotations

from typing import Callable, Sequence

from mqstore import topics as topic_rules
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.model import AppendResults, MessageIn
from mqstore.timer import messages as tm
from mqstore.timer.config import TimerConfig


def append(store, config: TimerConfig, topic: str, messages: Sequence[MessageIn], replication: str | None = None,
           wake: Callable[[], None] = lambda: None) -> AppendResults:
    tm.check_reserved(messages)
    timed = [tm.asks_timer(m) for m in messages]
    if not any(timed):
        return store.append(topic, messages, replication=replication)
    if not all(timed):
        raise InvalidArgument(f"messages: {sum(timed)} of {len(messages)} carry a delivery time; send delayed "
                              f"messages in batches of their own")
    if topic_rules.is_system_topic(topic) or topic_rules.is_pop_owned_topic(topic):
        raise InvalidArgument(f"topic {topic!r}: delayed messages go to user topics only")
    rec = store.topic(topic)
    now = store.clock.now_ms()
    converted = []
    for index, message in enumerate(messages):
        if message.queue_id is not None and not 0 <= message.queue_id < rec.queue_count:
            raise InvalidArgument(f"messages[{index}].queue_id: {message.queue_id} is outside topic {topic!r}'s "
                                  f"queues 0..{rec.queue_count - 1}")
        converted.append(tm.to_timer(topic, message, tm.due_ms(message, now, config.timer_max_delay_ms, index)))
    results = store.append(tm.TIMER_TOPIC, converted, system_writer=topic_rules.OWNER_SCHEDULE,
                           replication=replication)
    wake()
    return results


def recall(store, msg_id: str, wake: Callable[[], None] = lambda: None) -> int:
    """Cancel the delayed message whose timer record ``msg_id`` names (the msg_id its Append returned);
    returns when it was due. FAILED_PRECONDITION when it is due already (delivered, or being delivered)."""
    found = store.get_message_by_id(msg_id)
    record = found.record
    props = record.properties
    if record.topic != tm.TIMER_TOPIC or tm.CANCEL_OFFSET in props or tm.OUT_MS not in props:
        raise InvalidArgument(f"msg_id {msg_id}: not a delayed message's id (give the msg_id Append returned for "
                              f"a message with a delivery time)")
    due = int(props[tm.OUT_MS])
    if due <= store.clock.now_ms():
        raise FailedPrecondition(f"msg_id {msg_id}: due at {due} ms already, so delivered or being delivered; "
                                 f"nothing to recall")
    store.append(tm.TIMER_TOPIC, [tm.cancel_marker(record)], system_writer=topic_rules.OWNER_SCHEDULE)
    wake()
    return due
