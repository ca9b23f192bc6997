"""A push consumer's messages stay invisible while it works on them for longer than the invisible time a
receive with auto_renew gets: the gateway renews them ahead of it (as the Java proxy does), and the
client's ack with the handle it received works although the message's handle was replaced since. The
official Python PushConsumer (5.1.2, unchanged) against real CommitLog, Transaction and gateway processes.

The gateway gives auto_renew receives 3 s (--auto-renew-invisible-ms) and renews them 2 s ahead; each
consumption takes 8 s. Without the renewal every message comes again (attempt 2) while the first is still
being worked on."""

from __future__ import annotations

import pytest

from tests.support.gateway import MODES, stack

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]
INVISIBLE_S, AHEAD_S, WORK_S = 3, 2, 8
WAIT_S = 90


@pytest.fixture(scope="module", params=MODES)
def rig(request, tmp_path_factory):
    with stack(tmp_path_factory.mktemp(f"renew-{request.param}"), mode=request.param, gateway_args=(
            "--auto-renew-invisible-ms", str(INVISIBLE_S * 1000), "--auto-renew-ahead-ms", str(AHEAD_S * 1000))) as s:
        yield s


def test_a_slow_push_consumer_gets_each_message_once_and_its_acks_hold(rig):
    topic, group = "renewed", "g_renew"
    rig.create_topic(topic, 2)
    with rig.client("python", "producer") as producer:
        producer.call("producer", topics=[])
        sent = {producer.call("send", topic=topic, body=f"slow-{i}")["message_id"] for i in range(2)}
    with rig.client("python", "push") as consumer:
        done = consumer.call("push", group=group, topic=topic, expect=2, work_s=WORK_S, wait_s=WAIT_S,
                             timeout_s=WAIT_S + 30)
        events = [consumer.events.get_nowait() for _ in range(consumer.events.qsize())]
    assert done["complete"], done
    consumed = [(e["message_id"], e["attempt"]) for e in events if e.get("event") == "consumed"]
    assert sorted(consumed) == sorted((message_id, 1) for message_id in sent), consumed
    # The acks used the replaced handles: nothing comes again after the invisible time (a simple consumer of
    # the same group long-polls for longer than it).
    with rig.client("python", "check") as check:
        check.call("consumer", group=group, topic=topic, await_s=2 * INVISIBLE_S)
        assert check.call("receive", max=16, invisible_s=30)["messages"] == []
