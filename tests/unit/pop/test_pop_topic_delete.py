"""Pop consumption across DeleteTopic: a topic created again with the same name starts empty at offset 0
for every group, so nothing of the old topic (pop offsets, messages in flight, retry copies) reaches it."""

from __future__ import annotations

import pytest

from tests.unit.pop.test_pop_service import INVISIBLE_MS, bodies, env, send  # noqa: F401  (env: the fixture)


def test_a_topic_created_again_is_received_from_offset_0_and_nothing_old_comes_back(env):  # noqa: F811
    p = env(queues=1)
    send(p, 5)
    old = p.receive(batch_size=3)
    p.pop.ack("g", "t", [d.receipt_handle for d in old[:1]])  # one acked, two still in flight, two never read
    p.store.topic_admin.delete("t")
    p.store.topic_admin.create("t", 1)
    send(p, 2, start=100)
    new = p.receive()
    assert bodies(new) == [b"m100", b"m101"]
    p.pop.ack("g", "t", [d.receipt_handle for d in new])
    p.expire()
    assert p.receive() == []  # the old topic's in-flight messages are not delivered again


def test_retry_copies_of_the_old_topic_are_not_delivered_for_the_new_one(env):  # noqa: F811
    p = env(queues=1)
    send(p, 2)
    assert len(p.receive()) == 2
    p.expire()  # both copied to %RETRY%g+t, to be delivered again
    p.store.topic_admin.delete("t")
    p.store.topic_admin.create("t", 1)
    send(p, 1, start=100)
    new = p.receive()
    assert bodies(new) == [b"m100"]
    p.pop.ack("g", "t", [d.receipt_handle for d in new])
    p.expire()
    assert p.receive() == []  # passed over for good


def test_stored_pop_offsets_of_the_old_topic_do_not_apply_after_a_restart(env):  # noqa: F811
    p = env(queues=1)
    send(p, 4)
    p.pop.ack("g", "t", [d.receipt_handle for d in p.receive()])
    p.pop.reviver.flush()  # the offsets are written back
    p.store.topic_admin.delete("t")
    p.crash()
    p.store.topic_admin.create("t", 1)
    send(p, 2, start=100)
    assert bodies(p.receive()) == [b"m100", b"m101"]


@pytest.mark.parametrize("acked", [True, False], ids=["acked", "in-flight"])
@pytest.mark.parametrize("restart", ["no-restart", "restart-before-create", "restart-after-create"])
def test_the_old_topics_pop_offset_does_not_skip_messages_of_a_longer_new_topic(env, restart, acked):  # noqa: F811
    """The new topic grows past where the group had got in the old one: it still reads from offset 0, from
    memory, from the stored offsets and from the CKs a restart replays (in flight: the revive checkpoint
    stays before them)."""
    p = env(queues=1)
    send(p, 4)
    old = p.receive()
    if acked:
        p.pop.ack("g", "t", [d.receipt_handle for d in old])
    p.pop.reviver.flush()
    p.store.topic_admin.delete("t")
    p.pop.reviver.flush()  # what the revive duty does now and then: after the delete, too
    if restart == "restart-before-create":
        p.crash()
    p.store.topic_admin.create("t", 1)
    if restart == "restart-after-create":
        p.crash()
    send(p, 10, start=100)
    p.pop.reviver.flush()
    assert bodies(p.receive()) == sorted(b"m%d" % i for i in range(100, 110))
