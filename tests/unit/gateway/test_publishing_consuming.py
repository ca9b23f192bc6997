"""What the gateway decides itself, without a server: how a v2 message becomes an mqstore message, which
message types and properties it refuses, its topic cache, and how it bounds receives (long poll, invisible
time, filters, receipt handles checked before any call)."""

from __future__ import annotations

import pytest

from mqstore.clock import FakeClock
from mqstore.errors import (BodyTooLarge, FailedPrecondition, IllegalDeliveryTime, IllegalFilterExpression,
                            IllegalInvisibleTime, IllegalMessageId, IllegalPropertyKey, InvalidArgument,
                            InvalidReceiptHandle, NotEnoughReplicas, NotFound, NotLeader, NotWritten,
                            PropertyConflictsWithType, TopicNotFound, Unavailable, Unsupported)
from mqstore.gateway.config import GatewayConfig
from mqstore.gateway.consuming import Consuming
from mqstore.gateway.publishing import (Publish, Publisher, TopicCache, parse_recall_handle, recall_handle, send_wait_s,
                                       to_message_in)
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, KIND_SYSTEM, AppendResult, TopicRecord
from mqstore.pop import handle as handles
from mqstore.pop.receive import ReceiveResult
from mqstore.pop.service import AckOutcome

TOPICS = {"t": TopicRecord("t", 4, KIND_NORMAL, 0, 0), "kv": TopicRecord("kv", 2, KIND_COMPACTION, 0, 0),
          "RMQ_SYS_TRANS_HALF_TOPIC": TopicRecord("RMQ_SYS_TRANS_HALF_TOPIC", 1, KIND_SYSTEM, 0, 0)}


class Lookups:
    def __init__(self):
        self.count = 0

    def __call__(self, name):
        self.count += 1
        if name not in TOPICS:
            raise NotFound(f"topic {name!r} does not exist")
        return TOPICS[name]


def publish(**fields) -> Publish:
    values = dict(topic="t", body=b"hello", message_id="01AB", message_type="NORMAL")
    values.update(fields)
    return Publish(**values)


def test_a_v2_message_becomes_an_mqstore_message():
    m = to_message_in(publish(tag="paid", keys=("k1", "k2"), message_group="order-7", message_type="FIFO",
                              user_properties={"color": "blue"}, born_timestamp_ms=1234))
    assert (m.body, m.tags, m.keys, m.sharding_key, m.born_timestamp_ms) == (b"hello", "paid", ("k1", "k2"),
                                                                             "order-7", 1234)
    assert m.properties == {"color": "blue", "UNIQ_KEY": "01AB", "__SHARDINGKEY": "order-7"}
    assert m.queue_id is None   # the queue is the gateway's choice, never the client's


@pytest.mark.parametrize("fields, error", [
    (dict(message_id=""), IllegalMessageId),
    (dict(user_properties={"UNIQ_KEY": "x"}), IllegalPropertyKey),
    (dict(user_properties={"__SHARDINGKEY": "x"}), IllegalPropertyKey),
    (dict(message_type="DELAY"), PropertyConflictsWithType),                       # DELAY without a time
    (dict(message_type="FIFO", message_group="g", delivery_ms=5), PropertyConflictsWithType),
    (dict(topic="kv", delivery_ms=5), PropertyConflictsWithType),                  # COMPACTION: NORMAL only
    (dict(delivery_ms=1_733_400_000_000 * 1000), IllegalDeliveryTime),             # ms given as seconds
    (dict(message_type="LITE"), Unsupported),
    (dict(message_type="FIFO"), PropertyConflictsWithType),                        # FIFO without a group
    (dict(message_group="g"), PropertyConflictsWithType),                          # a group on a NORMAL one
    (dict(topic="kv", message_type="TRANSACTION"), PropertyConflictsWithType),     # COMPACTION: NORMAL only
    (dict(body=b"x" * 1025), BodyTooLarge),
    (dict(topic="nope"), TopicNotFound),
    (dict(topic="RMQ_SYS_TRANS_HALF_TOPIC"), TopicNotFound),
])
def test_sends_the_gateway_refuses(fields, error):
    calls = []
    publisher = Publisher(TopicCache(Lookups(), FakeClock(), 1000), 1024, lambda *a: calls.append(a),
                          lambda *a: calls.append(a))
    with pytest.raises(error):
        publisher.send(publish(**fields))
    assert calls == []   # refused before any call


def test_normal_sends_append_and_transactional_ones_prepare_with_the_topic_as_group():
    appended, prepared = [], []

    def append(topic, messages):
        appended.append((topic, messages))
        return [AppendResult("id", "01AB", 3, 41, 0, 0, 0, "WRITTEN")]

    def prepare(topic, message, group):
        prepared.append((topic, group))
        return "tx-1", 9
    publisher = Publisher(TopicCache(Lookups(), FakeClock(), 1000), 1024, append, prepare)
    sent = publisher.send(publish())
    assert (sent.message_id, sent.queue_id, sent.queue_offset, sent.transaction_id) == ("01AB", 3, 41, "")
    sent = publisher.send(publish(message_type="TRANSACTION"))
    assert (sent.transaction_id, sent.queue_offset) == ("tx-1", 9) and prepared == [("t", "t")]
    assert len(appended) == 1


class ElectingLog:
    """A log that refuses the first ``refusals`` appends with ``refusal`` (each writes nothing), then writes;
    ``written``: what it holds."""

    def __init__(self, refusals: int, refusal: Exception):
        self.refusals, self.refusal, self.calls, self.written = refusals, refusal, 0, []

    def __call__(self, topic, messages):
        self.calls += 1
        if self.calls <= self.refusals:
            raise self.refusal
        self.written.extend(messages)
        return [AppendResult("id", "01AB", 1, len(self.written) - 1, 0, 0, 0, "WRITTEN")]


def electing_publisher(log: ElectingLog) -> tuple[Publisher, FakeClock, list[float]]:
    clock, pauses = FakeClock(), []

    def sleep(s):
        pauses.append(s)
        clock.advance(round(s * 1000))
    return Publisher(TopicCache(Lookups(), clock, 60_000), 1024, log, None, clock=clock, sleep=sleep), clock, pauses


@pytest.mark.parametrize("refusal", [
    NotLeader("a replica: no leader is known yet (an election is running)"),
    NotLeader("a replica: the leader is n3", leader_address="n3:1"),       # the lost one, until its lease lapses
    NotWritten("n3:1 could not be reached, the request was never sent: failed to connect to all addresses"),
    NotWritten("this commit log (n1) may have lost its leadership lease of epoch 4: it takes no writes"),
    NotEnoughReplicas("only 1 of the min_insync_replicas 2 copies are in sync"),
], ids=lambda e: type(e).__name__)
def test_a_send_refused_unwritten_during_an_election_is_sent_again_until_it_lands_once(refusal):
    log = ElectingLog(6, refusal)
    publisher, clock, pauses = electing_publisher(log)
    sent = publisher.send(publish(), wait_s=2.5)
    assert (log.calls, len(log.written), sent.queue_offset) == (7, 1, 0)   # written once, by the 7th call
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4] and publisher.sent_again == 6
    assert sum(pauses) <= 2.5


def test_a_send_waits_no_longer_than_it_was_given_and_then_gets_the_last_refusal():
    log = ElectingLog(1000, NotLeader("a replica: no leader is known yet (an election is running)"))
    publisher, clock, pauses = electing_publisher(log)
    with pytest.raises(NotLeader, match="election is running"):
        publisher.send(publish(), wait_s=1.0)
    assert sum(pauses) <= 1.0 and pauses == [0.05, 0.1, 0.2, 0.4] and log.written == []
    log.calls = 0
    with pytest.raises(NotLeader):
        publisher.send(publish())           # no wait given (on the event loop, or --send-leader-wait-ms 0)
    assert log.calls == 1


@pytest.mark.parametrize("refusal", [
    Unavailable("n1:1 answered UNAVAILABLE: Stream removed (Socket closed)"),   # sent: it may have been written
    Unavailable("records up to physical offset 9 were replicated, but this node's leadership may have lapsed"),
    InvalidArgument("messages[0].body is bad"),
], ids=lambda e: str(e)[:30])
def test_a_send_that_may_have_been_written_or_was_refused_for_itself_is_never_sent_again(refusal):
    log = ElectingLog(1, refusal)
    publisher, clock, pauses = electing_publisher(log)
    with pytest.raises(type(refusal)):
        publisher.send(publish(), wait_s=3.0)
    assert (log.calls, pauses) == (1, [])   # the client's to retry: sending it here could duplicate it


def test_a_transactional_send_refused_unwritten_is_prepared_again_and_only_once():
    """A Prepare refused NotWritten (the Transaction service's log in an election, or its standby answering while
    the active one fails over) wrote no half and released its id: sent again, one transaction results."""
    calls, clock, pauses = [], FakeClock(), []

    def prepare(topic, message, group):
        calls.append(topic)
        if len(calls) <= 2:
            raise NotWritten("standby: this Transaction service (txn-2:1) is the standby; the active one is txn:1")
        return f"tx-{len(calls)}", 4

    def sleep(s):
        pauses.append(s)
        clock.advance(round(s * 1000))
    publisher = Publisher(TopicCache(Lookups(), clock, 60_000), 1024, None, prepare, clock=clock, sleep=sleep)
    sent = publisher.send(publish(message_type="TRANSACTION"), wait_s=2.5)
    assert (sent.transaction_id, sent.queue_offset, len(calls), pauses) == ("tx-3", 4, 3, [0.05, 0.1])


def test_a_transactional_send_whose_outcome_is_unknown_is_never_prepared_again():
    calls, pauses = [], []

    def prepare(topic, message, group):
        calls.append(topic)
        raise Unavailable("transaction t-1: the outcome of appending its halves is unknown; retry Prepare with t-1")
    publisher = Publisher(TopicCache(Lookups(), FakeClock(), 60_000), 1024, None, prepare, sleep=pauses.append)
    with pytest.raises(Unavailable, match="unknown"):
        publisher.send(publish(message_type="TRANSACTION"), wait_s=2.5)
    assert (calls, pauses) == (["t"], [])   # a new id now could make a second transaction of one send


@pytest.mark.parametrize("wait_ms, left_s, expected", [
    (3000, 3.0, 2.5),      # the Python client's 3 s deadline: the wait ends 0.5 s before it
    (3000, 10.0, 3.0),     # a longer deadline: the flag's bound
    (3000, None, 3.0),     # no deadline
    (3000, 0.4, 0.0),      # too close to the deadline to wait at all
    (0, 10.0, 0.0),        # --send-leader-wait-ms 0: never
])
def test_a_send_waits_for_a_leader_only_within_its_clients_deadline(wait_ms, left_s, expected):
    assert send_wait_s(wait_ms, left_s) == pytest.approx(expected)


def test_the_topic_cache_reuses_answers_for_its_ttl_only():
    clock, lookups = FakeClock(), Lookups()
    cache = TopicCache(lookups, clock, 1000)
    cache.get("t")
    cache.get("t")
    assert lookups.count == 1
    clock.advance(1000)
    cache.get("t")
    assert lookups.count == 2


# ---- consuming -----------------------------------------------------------------------------------------

class FakePop:
    def __init__(self):
        self.calls = []

    def receive(self, group, topic, **kwargs):
        self.calls.append(("receive", kwargs))
        return ReceiveResult([], 0)

    def ack(self, group, topic, receipt_handles):
        self.calls.append(("ack", list(receipt_handles)))
        return [AckOutcome(h, "ok") for h in receipt_handles]

    def change_invisible_duration(self, group, topic, receipt_handle, invisible_duration_ms):
        raise FailedPrecondition("the handle's invisible time has passed")

    def forward_to_dead_letter(self, group, topic, receipt_handle):
        return "%DLQ%g"


def consuming(**config) -> tuple[Consuming, FakePop]:
    pop = FakePop()
    return Consuming(GatewayConfig(**config), TopicCache(Lookups(), FakeClock(), 1000), pop), pop


def receive(c, **fields):
    values = dict(filter_type="TAG", expression="*", batch_size=16, invisible_ms=30_000, auto_renew=False,
                  long_poll_ms=None, time_left_ms=None)
    values.update(fields)
    return c.receive("g", "t", **values)


@pytest.mark.parametrize("asked, left, expected", [
    (None, None, 20_000), (1_000, None, 5_000), (60_000, None, 20_000), (8_000, None, 8_000),
    (20_000, 13_000, 12_800), (20_000, 100, 0)])
def test_the_long_poll_is_clamped_and_ends_before_the_clients_deadline(asked, left, expected):
    c, pop = consuming()
    receive(c, long_poll_ms=asked, time_left_ms=left)
    assert pop.calls[0][1]["long_poll_ms"] == expected


def test_a_receive_takes_at_most_the_batch_limit_and_the_gateways_max_attempts():
    c, pop = consuming(receive_batch_max=32, max_delivery_attempts=5)
    receive(c, batch_size=500)
    assert (pop.calls[0][1]["batch_size"], pop.calls[0][1]["max_attempts"]) == (32, 5)


@pytest.mark.parametrize("fields, error", [
    (dict(filter_type="SQL", expression="a > "), IllegalFilterExpression),
    (dict(filter_type="unknown", expression="a > 1"), IllegalFilterExpression),
    (dict(invisible_ms=None), IllegalInvisibleTime),
    (dict(invisible_ms=50), IllegalInvisibleTime),
    (dict(invisible_ms=13 * 3600 * 1000), IllegalInvisibleTime),
])
def test_receives_the_gateway_refuses(fields, error):
    c, pop = consuming()
    with pytest.raises(error):
        receive(c, **fields)
    assert pop.calls == []


def test_an_sql_filter_goes_to_pop_as_sql92_and_a_malformed_one_names_its_column():
    c, pop = consuming()
    receive(c, filter_type="SQL", expression="region = 'eu' AND TAGS IN ('a', 'b')")
    assert (pop.calls[0][1]["filter_type"], pop.calls[0][1]["filter_expression"]) == (
        "SQL92", "region = 'eu' AND TAGS IN ('a', 'b')")
    receive(c, filter_type="TAG", expression="a || b")
    assert pop.calls[1][1]["filter_type"] == "TAG"
    with pytest.raises(IllegalFilterExpression, match="column 18: expected a property name"):
        receive(c, filter_type="SQL", expression="region = 'eu' AND")


def test_auto_renew_takes_the_gateways_invisible_time():
    c, pop = consuming(auto_renew_invisible_ms=60_000)
    _, invisible_ms = receive(c, invisible_ms=None, auto_renew=True)
    assert invisible_ms == 60_000 and pop.calls[0][1]["invisible_duration_ms"] == 60_000


def test_a_handle_that_does_not_parse_is_refused_without_a_call():
    c, pop = consuming()
    good = handles.encode("g", "t", handles.ReceiptHandle(0, 1, 5, 1000, 2000, 1))
    other_group = handles.encode("h", "t", handles.ReceiptHandle(0, 1, 5, 1000, 2000, 1))
    outcomes = c.ack("g", "t", ["garbage", good, other_group])
    assert [o.status for o in outcomes] == ["invalid", "ok", "invalid"]
    assert pop.calls == [("ack", [good])]
    with pytest.raises(InvalidReceiptHandle):
        c.change_invisible_duration("g", "t", "garbage", 30_000)


def test_a_handle_that_no_longer_works_is_an_invalid_receipt_handle():
    c, _ = consuming()
    good = handles.encode("g", "t", handles.ReceiptHandle(0, 1, 5, 1000, 2000, 1))
    with pytest.raises(InvalidReceiptHandle, match="no longer works"):
        c.change_invisible_duration("g", "t", good, 30_000)


def test_a_delay_send_carries_its_time_for_the_commit_logs_timer():
    appended = []

    def append(topic, messages):
        appended.append((topic, messages))
        return [AppendResult("id", "01AB", 0, 1, 0, 0, 0, "WRITTEN")]
    publisher = Publisher(TopicCache(Lookups(), FakeClock(), 1000), 1024, append, None)
    publisher.send(publish(message_type="NORMAL", delivery_ms=1_700_000_005_000))  # the proxy infers DELAY
    ((topic, (message,)),) = appended
    assert message.properties["TIMER_DELIVER_MS"] == "1700000005000"


def test_a_delay_sends_recall_handle_names_its_timer_record_and_a_recall_maps_the_timers_answers():
    recalls, answers = [], []

    def recall(topic, msg_id):
        recalls.append((topic, msg_id))
        if answers:
            raise answers.pop()
        return 1_700_000_005_000
    append = lambda topic, messages: [AppendResult("TIMERREC", "01AB", 0, 1, 0, 0, 0, "WRITTEN")]  # noqa: E731
    publisher = Publisher(TopicCache(Lookups(), FakeClock(), 1000), 1024, append, None, recall)
    sent = publisher.send(publish(message_type="DELAY", delivery_ms=1_700_000_005_000))
    assert parse_recall_handle(sent.recall_handle) == ("t", "TIMERREC", "01AB")
    assert publisher.send(publish()).recall_handle == ""
    assert publisher.recall("t", sent.recall_handle) == "01AB" and recalls == [("t", "TIMERREC")]
    for bad in ("", "!!", recall_handle("t", "X", "Y")[:-3], "djIgdCBYIFk"):  # garbage, cut, version v2
        with pytest.raises(InvalidArgument, match="recall_handle"):
            publisher.recall("t", bad)
    with pytest.raises(InvalidArgument, match="of topic 't', not 'kv'"):
        publisher.recall("kv", sent.recall_handle)
    answers.append(FailedPrecondition("due"))
    with pytest.raises(NotFound, match="due already"):
        publisher.recall("t", sent.recall_handle)
    answers.append(NotLeader("replica", leader_address=""))
    with pytest.raises(NotLeader):  # a replica's refusal stays what it is (the client retries the leader)
        publisher.recall("t", sent.recall_handle)
    with pytest.raises(Unsupported):
        Publisher(TopicCache(Lookups(), FakeClock(), 1000), 1024, append, None).recall("t", sent.recall_handle)


def test_the_unit_mistake_is_named():
    publisher = Publisher(TopicCache(Lookups(), FakeClock(), 1000), 1024, None, None)
    with pytest.raises(IllegalDeliveryTime, match="Timestamp.seconds.*give it in seconds"):
        publisher.send(publish(message_type="DELAY", delivery_ms=1_733_400_000_000 * 1000))
