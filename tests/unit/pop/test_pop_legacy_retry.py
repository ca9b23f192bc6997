"""The migration from the legacy retry topic names (mqstore.pop.legacy): a store whose pop state and
retry copies were made by an earlier version, under ``%RETRY%{group}_{topic}`` (built here record by record
as that version wrote them), restarted with this one. Its messages reach their own group and topic, once
(at-least-once), and no other group that shares the ambiguous name."""

from __future__ import annotations

from mqstore.model import MessageIn
from mqstore.pop import copies, handle as handles, records
from tests.unit.pop.test_pop_service import INVISIBLE_MS, env  # noqa: F401  (env: the fixture)

VICTIM, ATTACKER = ("billing_svc", "payments"), ("billing", "svc_payments")
SHARED = "%RETRY%billing_svc_payments"   # both pairs' legacy retry topic: the collision


def legacy_expiry(p, group: str, topic: str, deliveries, forged_retry_topic: str = "") -> None:
    """An earlier version's revive step for ``deliveries``: the copy in %RETRY%{group}_{topic} (that
    version kept a RETRY_TOPIC its producer set), then the ACK record ending the entry."""
    name = p.store.topics.ensure_pop_topic(f"%RETRY%{group}_{topic}").name
    for d in deliveries:
        h = handles.decode(group, topic, d.receipt_handle)
        copy = copies.with_marker(copies.retry_copy(d.message, topic), h.ck_id, h.queue_offset)
        if forged_retry_topic:
            copy.properties[copies.PROPERTY_RETRY_TOPIC] = forged_retry_topic
        p.store.append(name, [copy], system_writer="pop")
        status, entry = p.pop.inflight.claim((group, topic, h.source, h.queue_id, h.queue_offset), h.ck_id,
                                             p.clock.now_ms())
        assert status == "ok"
        p.pop.end_entries([entry], records.REASON_REVIVED)


def old_store(env):  # noqa: F811
    """Two pairs whose legacy retry topics collide, each with one unacked message copied there."""
    p = env(queues=1)
    for _, topic in (VICTIM, ATTACKER):
        p.store.topic_admin.create(topic, 1)
    p.store.append("payments", [MessageIn(body=b"victim's payment")])
    # The attacker's producer set RETRY_TOPIC=payments, so that the old copy's property names the victim's pair.
    p.store.append("svc_payments", [MessageIn(body=b"attacker's", properties={"RETRY_TOPIC": "payments"})])
    for (group, topic), forged in ((VICTIM, ""), (ATTACKER, "payments")):
        got = p.receive(group, topic)
        assert len(got) == 1
        legacy_expiry(p, group, topic, got, forged)
    assert p.store.queue_info(SHARED, 0).max_offset == 2  # one topic holds both pairs' copies
    p.crash()  # restarted with this version
    return p


def test_a_legacy_retry_topic_delivers_each_message_to_its_own_group_and_topic_once(env):  # noqa: F811
    p = old_store(env)
    attacker = p.receive(*ATTACKER)
    assert [d.message.record.body for d in attacker] == [b"attacker's"]
    assert attacker[0].attempt == 2 and attacker[0].message.record.topic == SHARED
    victim = p.receive(*VICTIM)
    assert [d.message.record.body for d in victim] == [b"victim's payment"] and victim[0].attempt == 2
    assert p.receive(*ATTACKER) == [] and p.receive(*VICTIM) == []
    for (group, topic), got in ((VICTIM, victim), (ATTACKER, attacker)):
        assert [o.status for o in p.pop.ack(group, topic, [d.receipt_handle for d in got]).outcomes] == ["ok"]
    p.pop.reviver.flush()
    p.crash()
    assert p.expire() == 0 and p.receive(*VICTIM) == [] and p.receive(*ATTACKER) == []  # no second delivery


def test_an_unacked_legacy_delivery_comes_back_under_the_new_name_to_its_group_only(env):  # noqa: F811
    p = old_store(env)
    victim = p.receive(*VICTIM)
    assert [d.message.record.body for d in victim] == [b"victim's payment"]
    assert p.expire() == 1  # its invisible time passed: copied to the victim's own retry topic
    assert p.store.queue_info("%RETRY%billing_svc+payments", 0).max_offset == 1
    assert p.store.queue_info(SHARED, 0).max_offset == 2  # the legacy topic only drains
    again = p.receive(*VICTIM)
    assert [(d.message.record.body, d.attempt, d.message.record.topic) for d in again] == [
        (b"victim's payment", 3, "%RETRY%billing_svc+payments")]
    attacker = p.receive(*ATTACKER)
    assert [d.message.record.body for d in attacker] == [b"attacker's"]


def test_a_delivery_in_flight_at_the_upgrade_keeps_its_handle_and_its_expiry(env):  # noqa: F811
    """A CK of the earlier version (source 1: the legacy retry topic) written as it wrote it."""
    p = env(queues=1)
    p.store.topic_admin.create("payments", 1)
    p.store.append("payments", [MessageIn(body=b"pay")])
    legacy_expiry(p, *VICTIM, p.receive(*VICTIM))
    copy = p.store.pull(SHARED, 0, 0).messages[0].record
    now = p.clock.now_ms()
    ck = records.Checkpoint("billing_svc", "payments", records.SOURCE_RETRY_LEGACY, 0, 17, now, now + INVISIBLE_MS,
                            1, (records.CkEntry(copy.queue_offset, copy.physical_offset, 2),))
    ck_id = p.pop.append_records([(records.TAG_CK, records.encode_ck(ck))])[0].physical_offset
    p.crash()
    assert p.receive(*VICTIM) == []  # in flight, and the legacy topic's pop offset is past it
    handle = handles.encode(*VICTIM, handles.ReceiptHandle(1, 0, copy.queue_offset, ck_id, now + INVISIBLE_MS, 2))
    changed = p.pop.change_invisible_duration(*VICTIM, handle, INVISIBLE_MS)  # the old handle still works
    assert p.expire() == 1
    again = p.receive(*VICTIM)
    assert [(d.message.record.body, d.attempt, d.message.record.topic) for d in again] == [
        (b"pay", 3, "%RETRY%billing_svc+payments")]
    assert changed.attempt == 2
