"""PopService on a real MessageStore (real files) with an injected clock: each promise of consumer.proto,
driven step by step (the revive duty's steps are called by the test)."""

from __future__ import annotations

import pytest

from mqstore import store_offsets
from mqstore.clock import FakeClock
from mqstore.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from mqstore.model import MessageIn
from mqstore.pop import copies
from mqstore.pop.config import PopConfig
from mqstore.pop.receive import START_LATEST
from mqstore.pop.service import PopService
from mqstore.pop.stats import pop_stats
from mqstore.store_parts import build_store
from tests.unit.core.test_damaged_reads import _damage

INVISIBLE_MS = 10_000
DEFAULTS = PopConfig()


class Pop:
    """A store and its pop service on one data directory, restartable like after a crash."""

    def __init__(self, config, clock: FakeClock, pop_config: PopConfig = DEFAULTS):
        self.config, self.clock, self.pop_config = config, clock, pop_config
        self.open()

    def open(self) -> None:
        self.store = build_store(self.config, self.clock)
        self.store.start()
        self.pop = PopService(self.store, self.pop_config)
        self.pop.start(run_duty=False)

    def crash(self) -> None:
        self.pop.halt()
        self.store.halt()
        self.open()

    def close(self) -> None:
        self.pop.stop()
        self.store.stop()

    def receive(self, group="g", topic="t", **kw):
        kw.setdefault("invisible_duration_ms", INVISIBLE_MS)
        kw.setdefault("batch_size", 100)
        return self.pop.receive(group, topic, **kw).deliveries

    def expire(self, ms: int = INVISIBLE_MS) -> int:
        self.clock.advance(ms)
        return self.pop.reviver.revive_due()


@pytest.fixture
def env(small_config, fake_clock):
    made = []

    def make(pop_config: PopConfig = DEFAULTS, queues: int = 2, **store) -> Pop:
        p = Pop(small_config(**store), fake_clock, pop_config)
        made.append(p)
        p.store.topic_admin.create("t", queues)
        return p

    yield make
    for p in made:
        p.close()


def send(p: Pop, count: int, tags: str = "", start: int = 0) -> list:
    return list(p.store.append("t", [MessageIn(body=b"m%d" % i, tags=tags) for i in range(start, start + count)]))


def bodies(deliveries) -> list[bytes]:
    return sorted(d.message.record.body for d in deliveries)


def test_receive_spans_every_queue_and_ack_ends_the_messages_for_good(env):
    p = env()
    send(p, 6)
    got = p.receive()
    assert bodies(got) == [b"m%d" % i for i in range(6)] and {d.message.record.queue_id for d in got} == {0, 1}
    assert all(d.attempt == 1 and d.visible_at_ms == p.clock.now_ms() + INVISIBLE_MS for d in got)
    result = p.pop.ack("g", "t", [d.receipt_handle for d in got])
    assert [o.status for o in result.outcomes] == ["ok"] * 6 and result.durability == "WRITTEN"
    assert p.expire() == 0 and p.receive() == []
    p.crash()
    assert p.expire() == 0 and p.receive() == []  # the ACK records are durable: nothing comes back


def test_one_queue_only_when_asked(env):
    p = env()
    send(p, 6)
    got = p.receive(queue_id=1)
    assert {d.message.record.queue_id for d in got} == {1} and len(got) == 3
    with pytest.raises(NotFound, match="no queue 2"):
        p.receive(queue_id=2)


def test_an_unacked_message_comes_back_from_the_retry_topic_with_attempt_plus_one(env):
    p = env()
    send(p, 2)
    first = p.receive()
    p.pop.ack("g", "t", [first[0].receipt_handle])
    assert p.expire(INVISIBLE_MS - 1) == 0 and p.receive() == []
    assert p.expire(1) == 1
    again = p.receive()
    assert len(again) == 1 and again[0].attempt == 2 and again[0].topic == "t"
    record = again[0].message.record
    assert record.topic == "%RETRY%g+t" and record.reconsume_times == 1 and record.body == first[1].message.record.body
    assert record.properties[copies.PROPERTY_RETRY_TOPIC] == "t"
    assert again[0].message.uniq_key == first[1].message.uniq_key  # the client's message id is kept
    assert p.store.pull("%RETRY%g+t", 0, 0).messages[0].record.body == record.body  # readable by Pull
    with pytest.raises(FailedPrecondition, match="retry or dead-letter topic"):
        p.store.append("%RETRY%g+t", [MessageIn(body=b"x")])
    for name in ("%DLQ%g", "%RETRY%x+y", "%RETRY%x_y"):  # a '+' name too, though it is a legal topic name
        with pytest.raises(FailedPrecondition, match="created by pop consumption"):
            p.store.topic_admin.create(name, 1)
    with pytest.raises(InvalidArgument, match=r"illegal character '\+'"):
        p.store.topic_admin.create("x+y", 1)
    assert p.expire() == 1 and p.receive()[0].attempt == 3  # and again, from the retry topic itself


def test_after_max_attempts_a_message_goes_to_the_dead_letter_topic(env):
    p = env()
    send(p, 1)
    for attempt in (1, 2, 3):
        got = p.receive(max_attempts=3)
        assert [d.attempt for d in got] == [attempt]
        p.expire()
    assert p.receive(max_attempts=3) == []
    dead = p.store.pull("%DLQ%g", 0, 0).messages
    assert len(dead) == 1 and dead[0].record.body == b"m0"
    assert dead[0].record.properties[copies.PROPERTY_DLQ_ORIGIN_TOPIC] == "t"
    stats = pop_stats(p.pop, "g", "t")
    assert (stats.counts.revived, stats.counts.dead_lettered, stats.in_flight) == (2, 1, 0)


def test_a_retry_copy_past_a_lower_max_attempts_goes_to_the_dlq_unseen(env):
    p = env()
    send(p, 1)
    p.receive()
    p.expire()
    assert p.receive(max_attempts=1) == []
    assert [m.record.body for m in p.store.pull("%DLQ%g", 0, 0).messages] == [b"m0"]


def test_change_invisible_duration_gives_a_new_handle_and_the_old_one_stops_working(env):
    p = env()
    send(p, 1)
    (d,) = p.receive()
    changed = p.pop.change_invisible_duration("g", "t", d.receipt_handle, 3 * INVISIBLE_MS)
    assert changed.receipt_handle != d.receipt_handle and changed.attempt == 1
    assert changed.visible_at_ms == p.clock.now_ms() + 3 * INVISIBLE_MS
    assert p.pop.ack("g", "t", [d.receipt_handle]).outcomes[0].status == "not_in_flight"
    with pytest.raises(FailedPrecondition, match="no message is in flight"):
        p.pop.change_invisible_duration("g", "t", d.receipt_handle, INVISIBLE_MS)
    assert p.expire() == 0  # the old invisible time passed: nothing redelivered
    p.crash()
    assert p.expire() == 0  # also when the in-flight set is rebuilt from the revive log
    assert p.pop.ack("g", "t", [changed.receipt_handle]).outcomes[0].status == "ok"
    assert p.expire(3 * INVISIBLE_MS) == 0


def test_an_expired_handle_gets_a_clear_answer(env):
    p = env()
    send(p, 2)
    a, b = p.receive()
    p.clock.advance(INVISIBLE_MS)
    outcome = p.pop.ack("g", "t", [a.receipt_handle]).outcomes[0]
    assert outcome.status == "expired" and "delivered again" in outcome.message
    with pytest.raises(FailedPrecondition, match="has expired"):
        p.pop.change_invisible_duration("g", "t", b.receipt_handle, INVISIBLE_MS)
    with pytest.raises(FailedPrecondition, match="has expired"):
        p.pop.forward_to_dead_letter("g", "t", b.receipt_handle)
    assert p.pop.reviver.revive_due() == 2


def test_ack_results_per_handle(env):
    p = env()
    send(p, 2)
    a, b = p.receive()
    other = p.pop.ack("g2", "t", [a.receipt_handle]).outcomes[0]
    assert other.status == "invalid" and "not issued for group 'g2'" in other.message
    result = p.pop.ack("g", "t", [a.receipt_handle, "garbage", a.receipt_handle, b.receipt_handle])
    assert [o.status for o in result.outcomes] == ["ok", "invalid", "not_in_flight", "ok"]
    assert pop_stats(p.pop).counts.ack_failures == 3
    with pytest.raises(InvalidArgument, match="1 to 1000"):
        p.pop.ack("g", "t", [])


def test_tag_filter_delivers_matching_messages_and_passes_the_others_over_for_good(env):
    p = env(queues=1)
    p.store.append("t", [MessageIn(body=b"a", tags="Aa"), MessageIn(body=b"b", tags="BB"),  # same Java hashCode
                         MessageIn(body=b"c", tags="c"), MessageIn(body=b"d")])
    got = p.receive(filter_expression="Aa || c")
    assert bodies(got) == [b"a", b"c"]
    assert p.receive() == []  # the others are behind the group's offset: not delivered, not redelivered
    assert pop_stats(p.pop).counts.filtered == 2
    p.expire()
    assert bodies(p.receive(filter_expression="*")) == [b"a", b"c"]  # the two unacked ones, attempt 2


def test_in_flight_messages_are_capped_per_group_and_topic(env):
    p = env(PopConfig(pop_max_in_flight=3, pop_max_in_flight_total=4))
    send(p, 10)
    assert len(p.receive(batch_size=2)) == 2
    assert len(p.receive(batch_size=10)) == 1  # a smaller batch
    with pytest.raises(ResourceExhausted, match="3 messages of topic 't' in flight"):
        p.receive()
    assert len(p.receive(group="h")) == 1  # the total cap
    assert pop_stats(p.pop, "g", "t").group_in_flight == 3


def test_a_new_group_starts_at_the_end_when_asked(env):
    p = env()
    send(p, 4)
    assert p.receive(start=START_LATEST) == []
    send(p, 2, start=4)
    assert bodies(p.receive(start=START_LATEST)) == [b"m4", b"m5"]
    assert len(p.receive(group="other")) == 6


def test_forward_to_dead_letter_moves_the_message_and_ends_it(env):
    p = env()
    send(p, 1)
    (d,) = p.receive()
    dlq, result = p.pop.forward_to_dead_letter("g", "t", d.receipt_handle)
    assert dlq == "%DLQ%g" and result.queue_offset == 0
    assert p.store.pull("%DLQ%g", 0, 0).messages[0].record.body == b"m0"
    assert p.expire() == 0 and p.pop.ack("g", "t", [d.receipt_handle]).outcomes[0].status == "not_in_flight"


def test_pop_and_pull_with_commit_offset_serve_different_groups_of_one_topic(env):
    p = env(queues=1)
    send(p, 5)
    assert len(p.receive()) == 5
    page = p.store.pull("t", 0, 0, max_messages=3)
    store_offsets.commit_offset(p.store, "pullers", "t", 0, page.next_offset)
    p.expire()
    assert len(p.receive()) == 5  # redelivered to the pop group
    assert store_offsets.query_offset(p.store, "pullers", "t", 0) == 3  # the pull group's offset is its own
    assert [m.record.body for m in p.store.pull("t", 0, 3).messages] == [b"m3", b"m4"]


def test_offsets_and_in_flight_survive_a_crash_before_any_flush(env):
    p = env(queues=1)
    send(p, 4)
    held = p.receive(batch_size=2)
    p.crash()  # no flush: the pop offset is not in SQL, only in the CK records
    assert bodies(p.receive()) == [b"m2", b"m3"]  # not m0, m1 again
    assert p.pop.ack("g", "t", [held[0].receipt_handle]).outcomes[0].status == "ok"  # handles outlive a restart
    assert p.expire() == 3  # m1 and the two just received
    p.pop.reviver.flush()
    p.crash()
    assert p.expire(0) == 0 and bodies(p.receive()) == [b"m1", b"m2", b"m3"]


def test_the_revive_checkpoint_moves_past_resolved_checkpoints_only(env):
    p = env(queues=1)
    send(p, 3)
    a = p.receive(batch_size=1)
    b = p.receive(batch_size=2)
    p.pop.ack("g", "t", [a[0].receipt_handle])
    p.pop.reviver.flush()
    assert p.pop.reviver.revive_offset == 0  # the CKs are not flushed yet: their pop offsets stay unwritten
    p.store.flusher.flush_now()
    p.pop.reviver.flush()
    assert p.pop.reviver.revive_offset == 1  # b's CK, next after a's
    assert store_offsets.query_offset(p.store, "g", "t", 0) == 3
    p.pop.ack("g", "t", [d.receipt_handle for d in b])
    p.pop.reviver.flush()
    end = p.pop.revive_end()
    assert p.pop.reviver.revive_offset == end == 4 and store_offsets.query_offset(p.store, "CID_RMQ_SYS_REVIVE_GROUP",
                                                                            "rmq_sys_REVIVE_LOG", 0) == 4
    p.crash()
    assert pop_stats(p.pop).counts.replayed_records == 0 and p.receive() == []


def test_a_damaged_record_is_passed_over_and_counted(env):
    p = env(queues=1)
    results = send(p, 3)
    _damage(p.store, results[1].physical_offset, 88, b"\xff\xfe")  # the body: the CRC fails
    assert bodies(p.receive()) == [b"m0"]
    assert bodies(p.receive()) == [b"m2"]
    assert pop_stats(p.pop).counts.damaged_skipped == 1


def test_a_message_whose_record_is_damaged_by_its_expiry_is_counted_lost(env):
    p = env(queues=1)
    results = send(p, 2)
    p.receive()
    _damage(p.store, results[0].physical_offset, 88, b"\xff\xfe")
    assert p.expire() == 2
    assert bodies(p.receive()) == [b"m1"] and pop_stats(p.pop).counts.lost == 1


def test_an_ack_record_that_fails_after_the_copy_is_written_again_without_a_second_copy(env, failpoint):
    p = env(queues=1)
    send(p, 2)
    p.receive()
    p.clock.advance(INVISIBLE_MS)
    with failpoint.armed("pop.revive.after_copy"):  # the copies are appended, the ACK record fails
        with pytest.raises(Exception, match="pop.revive.after_copy"):
            p.pop.reviver.revive_due()
    assert pop_stats(p.pop).in_flight == 2 and pop_stats(p.pop).counts.revived == 0
    assert p.pop.reviver.revive_due() == 0  # wrote the owed ACK record first; nothing else was due
    assert pop_stats(p.pop).in_flight == 0 and pop_stats(p.pop).counts.revived == 2
    assert [d.attempt for d in p.receive()] == [2, 2] and p.store.queue_info("%RETRY%g+t", 0).max_offset == 2


def test_a_crash_between_the_copy_and_its_ack_record_does_not_copy_again(env, failpoint):
    p = env(queues=1)
    send(p, 2)
    p.receive()
    p.clock.advance(INVISIBLE_MS)
    with failpoint.armed("pop.revive.after_copy"):
        with pytest.raises(Exception, match="pop.revive.after_copy"):
            p.pop.reviver.revive_due()
    p.crash()  # the copies are in the retry topic, their entries in flight again after the replay
    assert pop_stats(p.pop).in_flight == 0  # the start found the copies (POP_CK) and wrote their ACK
    assert p.expire(0) == 0 and p.store.queue_info("%RETRY%g+t", 0).max_offset == 2
    assert sorted(d.attempt for d in p.receive()) == [2, 2]


def test_a_topic_created_again_is_received_from_its_start(env):
    p = env(queues=1)
    send(p, 3)
    p.pop.ack("g", "t", [d.receipt_handle for d in p.receive()])
    p.store.topic_admin.delete("t")
    with pytest.raises(NotFound):
        p.receive()
    p.store.topic_admin.create("t", 1)
    send(p, 2, start=10)
    assert bodies(p.receive()) == [b"m10", b"m11"]
    p.store.flusher.flush_now()
    p.pop.reviver.flush()
    assert store_offsets.query_offset(p.store, "g", "t", 0) == p.store.queue_info("t", 0).max_offset


def test_messages_removed_by_retention_before_a_receive_are_passed_over(env):
    p = env(queues=1)
    send(p, 3)
    assert bodies(p.receive(batch_size=1)) == [b"m0"]
    p.clock.advance(5_000)
    send(p, 2, start=3)
    p.store.topic_admin.update("t", retention_ms=1_000)
    p.store.retention.apply_topic_retention()
    assert p.store.queue_info("t", 0).min_offset == 3
    assert bodies(p.receive()) == [b"m3", b"m4"]  # m1, m2 are gone; the group's offset 1 moved to 3


def test_requests_are_checked(env):
    p = env()
    for kw, match in [(dict(invisible_duration_ms=50), "invisible_duration_ms"), (dict(batch_size=1001), "batch_size"),
                      (dict(max_attempts=1001), "max_attempts"), (dict(filter_expression="a ||"), "filter"),
                      (dict(start="middle"), "start")]:
        with pytest.raises(InvalidArgument, match=match):
            p.receive(**kw)
    with pytest.raises(InvalidArgument, match="group name"):
        p.receive(group="bad group")
    with pytest.raises(NotFound, match="does not exist"):
        p.receive(topic="nope")
    for topic in ("rmq_sys_REVIVE_LOG", "RMQ_SYS_TRANS_HALF_TOPIC"):
        with pytest.raises(InvalidArgument, match="system, retry or dead-letter"):
            p.receive(topic=topic)
    with pytest.raises(InvalidArgument, match="too long"):
        p.receive(group="g" * 120)
