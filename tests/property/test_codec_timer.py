"""A delayed Append on the compiled codec against the pure-Python reference (mqstore.codec, mqstore.timer).

The same random AppendRequest bytes with delivery fields and timer properties (valid ones, and ones with every
kind of thing the reference refuses: negative or huge fields, values int() reads or refuses, a delay past the
limit, a queue_id out of range, the timer's own names, TAGS/KEYS/UNIQ_KEY properties, bad keys, tags, sharding
keys and properties, empty bodies, negative born times, batches mixing delayed and plain messages, too many
messages, a missing or system real topic) go through the CommitLog servicer's two ways to the Scheduler:

- reference: protobuf parses, mqstore_rpc.convert.messages_in converts, Scheduler.append converts to the timer
  records (mqstore.timer.messages.timer_records) and the encoder encodes them;
- compiled: append_wire.parse_request (the compiled parser: timer-marked WireMessages), Scheduler.append with
  the codec's timer_batch and the AppendEncoder, or where timer_batch declines, messages.wire_messages_in and
  the reference way.

Both must give byte-identical timer records (stamped alike), the same queue ids, tag codes, UNIQ_KEYs and due
times noted, the same target topic and writer, the same errors (type and message) and leave the same UNIQ_KEY
counter. The compiled modules are imported directly, so this runs under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import contextlib
import pathlib
import random
import types

import pytest

from mqstore import codec
from mqstore.config import StoreConfig
from mqstore.errors import MqStoreError, NotFound
from mqstore.format import record
from mqstore.log.encoder import MessageEncoder, UniqKeyGenerator
from mqstore.model import KIND_COMPACTION, KIND_NORMAL, KIND_SYSTEM, AppendResults, Copies, Copy, MessageIn, TopicRecord
from mqstore.timer import messages as tm
from mqstore.timer.config import TimerConfig
from mqstore.timer.scheduling import Scheduler
from mqstore.txn import records as transactions
from mqstore_rpc import append_wire
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, common_pb2

pytestmark = pytest.mark.codec

NOW_MS = 1_790_000_000_000
LIMIT_MS = 86_400_000
PEER = "ipv4:10.1.2.3:4567"
TOPICS = {"t": TopicRecord("t", 4, KIND_NORMAL, 0, 0), "c": TopicRecord("c", 3, KIND_COMPACTION, 0, 0),
          tm.TIMER_TOPIC: TopicRecord(tm.TIMER_TOPIC, 1, KIND_SYSTEM, 0, 0)}


def compiled_namespace() -> types.SimpleNamespace:
    try:
        from mqstore.codec import _records, _request
    except ImportError as exc:
        pytest.fail(f"the compiled codec is not built ({exc}): run make setup with a C compiler")
    return types.SimpleNamespace(parse_append_request=_request.parse_request, WireMessages=_request.WireMessages,
                                 AppendEncoder=_records.AppendEncoder, timer_batch=_records.timer_batch,
                                 timer_copy=_records.timer_copy, timer_copies=_records.timer_copies)


COMPILED = compiled_namespace()


class FakeStore:
    """What the Scheduler asks of a store: the clock, topic_admin.get and append_async (the writer's check, then
    the encoder; the outcome kept stamped as the commit log would)."""

    def __init__(self, encoder: MessageEncoder):
        self.encoder = encoder
        self.clock = types.SimpleNamespace(now_ms=lambda: NOW_MS)
        self.topic_admin = self
        self.appended = None

    def get(self, name: str) -> TopicRecord:
        if name not in TOPICS:
            raise NotFound(f"topic {name!r} does not exist")
        return TOPICS[name]

    def append(self, topic, messages, system_writer=None, replication=None) -> AppendResults:
        rec = self.get(topic)
        if system_writer:
            transactions.check_internal_append(rec, messages, system_writer)
        batch = self.encoder.encode_batch(rec, messages, NOW_MS)
        buf, position, entries = bytearray(batch.buf), 0, []
        for index, size in enumerate(batch.sizes):
            record.stamp(buf, position, 7 * index, 1 << 33 | position, NOW_MS + 1)
            entries.append((1 << 33 | position, size, batch.queue_ids[index], 7 * index, 0, 0))
            position += size
        self.appended = (topic, system_writer, bytes(buf), batch.sizes, batch.queue_ids, batch.tag_codes,
                         batch.sys_flags, batch.uniq_keys)
        return AppendResults("0A0000070000C383", entries, batch.uniq_keys, NOW_MS + 1, "WRITTEN")

    async def append_async(self, topic, messages, system_writer=None, replication=None) -> AppendResults:
        """What Scheduler.append awaits (the store's one version, f02a487)."""
        return self.append(topic, messages, system_writer, replication)


def scheduler(compiled: bool) -> tuple[Scheduler, FakeStore, list]:
    cfg = StoreConfig(data_dir=pathlib.Path("/nonexistent"), segment_size_bytes=4096, max_body_bytes=64,
                      max_batch_messages=5, max_batch_body_bytes=200)
    encoder = MessageEncoder(cfg, uniq=UniqKeyGenerator(b"\x0a\0\0\x07", random=b"\1\2\3\4", counter=0xFFF0))
    # The compiled encoder on the compiled side (under MQSTORE_PURE_PYTHON=1 too), none on the reference's.
    encoder._compiled = COMPILED.AppendEncoder(cfg.max_batch_messages, cfg.max_body_bytes, cfg.max_batch_body_bytes,
                                               cfg.segment_size_bytes, encoder.store_host,
                                               encoder.store_port) if compiled else None
    store, noted = FakeStore(encoder), []
    return Scheduler(store, TimerConfig(timer_max_delay_ms=LIMIT_MS), noted=lambda r, d: noted.append(d)), store, noted


@contextlib.contextmanager
def pure_when(reference: bool):
    """The pure-Python codec (mqstore.codec.compiled None) for a reference run: its MessageIn go through
    messages.timer_records, not the compiled timer_copies."""
    with pytest.MonkeyPatch.context() as patch:
        if reference:
            patch.setattr(codec, "compiled", None)
        yield


def run(raw: bytes, compiled: bool) -> tuple:
    with pure_when(not compiled):
        return _run(raw, compiled)


def _run(raw: bytes, compiled: bool) -> tuple:
    sched, store, noted = scheduler(compiled)
    try:
        if compiled:
            request = append_wire.parse_request(raw)
            assert codec.is_wire_messages(request), "the compiled parser declined a valid request"
        else:
            request = commitlog_pb2.AppendRequest.FromString(raw)
        sched.append(request.topic, append_wire.messages(request, PEER))
    except MqStoreError as exc:
        return ("error", type(exc).__name__, str(exc), store.encoder.uniq._counter)
    return ("ok", store.appended, noted, store.encoder.uniq._counter)


VALUES = ["0", "1500", "86399", "007", "86400000", "86400001", "86401", "+5", " 7", "1_000", "\u0663", "-5", "x", "",
          "9" * 19, "9" * 20, str(NOW_MS + 10), str(NOW_MS - 10), str(NOW_MS + LIMIT_MS + 1), str(1 << 62),
          str((1 << 62) + 1)]
FIELDS = [0, 0, 0, 1, 2500, LIMIT_MS, LIMIT_MS + 1, NOW_MS + 99, NOW_MS - 99, -1, 1 << 62, (1 << 63) - 1]
ODD_PROPS = [{"TAGS": "t"}, {"KEYS": "k"}, {"UNIQ_KEY": "U1"}, {"x": ""}, {"": "v"}, {"s\x01": "v"}, {"s": "v\x02"},
             {"TIMER_X": "1"}, {"REAL_TOPIC": "t"}, {"REAL_QID": "1"}, {"TIMER_OUT_MS": "5"}, {"TIMER_UNIT": "3"}]


def random_message(rng: random.Random, timed: bool) -> common_pb2.MessageInput:
    good = rng.random() < 0.85  # else one thing the reference may refuse
    props, asked = {}, False
    if timed:
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            props[rng.choice(tm.ASKING)] = rng.choice(VALUES[:4] if good else VALUES)
            asked = True
    for name in rng.sample(["a", "zz", "\u00c4", "TIMERX", "b"], rng.randint(0, 3)):
        props[name] = rng.choice(["v", "\u00fcw", "K0"])
    if not good and rng.random() < 0.5:
        props.update(rng.choice(ODD_PROPS))
    message = common_pb2.MessageInput(
        body=b"y" * rng.choice([1, 30] if good else [0, 65, 1]), tags=rng.choice(["", "tag", "\u00e9"]),
        keys=rng.choice([[], ["k1"], ["a", "b"]]), properties=props, flag=rng.randint(-3, 3),
        born_timestamp_ms=rng.choice([0, 5]), sharding_key=rng.choice(["", "s"]))
    if not good:
        bad = rng.choice(["tags", "keys", "born", "shard", "qid", "none"])
        if bad == "tags":
            message.tags = "t\x01"
        elif bad == "keys":
            message.keys[:] = [rng.choice(["a b", "t\t", ""])]
        elif bad == "born":
            message.born_timestamp_ms = -1
        elif bad == "shard":
            message.sharding_key = "s\x02"
        elif bad == "qid":
            message.queue_id = rng.choice([4, -1, 3])
    if rng.random() < 0.4:
        message.queue_id = rng.choice([0, 2, 3])
    if timed and (not asked or rng.random() < 0.3):
        fields = FIELDS[:6] if good else FIELDS
        setattr(message, rng.choice(["delay_ms", "deliver_at_ms"]), rng.choice(fields) or 1500)
        if rng.random() < 0.2:
            setattr(message, rng.choice(["delay_ms", "deliver_at_ms"]), rng.choice(fields))
    return message


def random_request(rng: random.Random) -> bytes:
    count = rng.choice([1, 1, 2, 3, 5, 6])
    plain_at = rng.randrange(count) if rng.random() < 0.05 else -1  # a batch mixing delayed and plain messages
    topic = rng.choice(["t"] * 12 + ["c", "nope", tm.TIMER_TOPIC, "%RETRY%g_t"])
    messages = [random_message(rng, timed=i != plain_at) for i in range(count)]
    return commitlog_pb2.AppendRequest(topic=topic, messages=messages).SerializeToString()


def test_a_delayed_append_on_the_compiled_codec_gives_the_references_records_and_errors(monkeypatch):
    """2,000 random requests: the same outcome both ways; most valid ones by the compiled timer_batch (counted)."""
    rng = random.Random(35)
    taken = []

    def counted(*args):
        made = COMPILED.timer_batch(*args)
        taken.append(made is not None)
        return made

    monkeypatch.setattr(codec, "compiled", types.SimpleNamespace(
        parse_append_request=COMPILED.parse_append_request, WireMessages=COMPILED.WireMessages,
        AppendEncoder=COMPILED.AppendEncoder, timer_batch=counted, timer_copies=COMPILED.timer_copies))
    outcomes = {"ok": 0, "error": 0}
    for _ in range(2000):
        raw = random_request(rng)
        reference = run(raw, compiled=False)
        assert run(raw, compiled=True) == reference, commitlog_pb2.AppendRequest.FromString(raw)
        outcomes[reference[0]] += 1
    # Both kinds of outcome, and the compiled timer records for most of what the reference took.
    assert outcomes["ok"] > 500 and outcomes["error"] > 300, outcomes
    assert sum(taken) > 0.8 * outcomes["ok"] and len(taken) - sum(taken) > 300, (sum(taken), len(taken), outcomes)


def test_the_compiled_parser_takes_delayed_requests_and_marks_them():
    """Delivery fields and the timer's property names mark a message (WireMessages.timer_marks); the fields are
    read as sent (negative ones too: the Scheduler's conversion refuses them as convert does)."""
    def parsed(**fields):
        raw = commitlog_pb2.AppendRequest(topic="t", messages=[common_pb2.MessageInput(body=b"x", **fields),
                                                               common_pb2.MessageInput(body=b"y")]).SerializeToString()
        return COMPILED.parse_append_request(raw)
    assert parsed().timer_marks == 0
    for fields in (dict(delay_ms=5), dict(deliver_at_ms=-3), dict(properties={"TIMER_DELAY_SEC": "1"}),
                   dict(properties={"REAL_TOPIC": "t"}), dict(properties={"REAL_QID": "1"}),
                   dict(properties={"TIMER_": "x"})):
        wire = parsed(**fields)
        assert wire is not None and wire.timer_marks == 1, fields
        assert wire.delivery_fields()[0] == (fields.get("deliver_at_ms", 0), fields.get("delay_ms", 0))
    assert parsed(properties={"REAL_TOPICS": "t", "TIMER": "x", "real_qid": "1"}).timer_marks == 0


def test_a_plain_compiled_append_with_a_name_the_timer_sets_is_refused_as_on_the_reference():
    """REAL_TOPIC / REAL_QID on a plain Append: INVALID_ARGUMENT on both codecs (the compiled one let them
    through before: only requests holding the bytes TIMER_ went to the reference's check)."""
    raw = commitlog_pb2.AppendRequest(topic="t", messages=[common_pb2.MessageInput(
        body=b"x", properties={"REAL_TOPIC": "u"})]).SerializeToString()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "compiled", COMPILED)
        compiled = run(raw, compiled=True)
    reference = run(raw, compiled=False)
    assert reference[0] == "error" and "REAL_TOPIC" in reference[2]
    assert compiled == reference


# ---- a delivered copy's properties (mqstore.timer.messages.delivered_copy; the compiled timer_copy) --------------

COPY_NAMES = ["a", "zz", "\u00c4", "TIMER_X", "TIMER_ENQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_ROLLED_FROM", "TAGS",
              "KEYS", "TIMER_ORIGIN", "REAL_QID", "TIMER_SHARDING_KEY"]
COPY_VALUES = {"REAL_QID": ["0", "3", "007", "x", "99999999999"], "TIMER_ORIGIN": ["5", "0", "x", "-1"],
               "KEYS": ["k", "a b", " a  b ", "k1 k2 k3", " "], "TAGS": ["t", "\u00e9"]}


def random_properties(rng: random.Random) -> bytes:
    """A timer record's PROPERTIES: usually what the Scheduler and rolls write, sometimes odd (names twice, entries
    without a separator or value, a second separator, invalid UTF-8, the copy's own names)."""
    entries = []
    for name, chance in (("REAL_TOPIC", 0.95), ("TIMER_OUT_MS", 0.95), ("UNIQ_KEY", 0.95)):
        if rng.random() < chance:
            entries.append((name, rng.choice(["t", "7F00000100002A9F0000", "1796000000123", "\u00fc"])))
    for name in rng.sample(COPY_NAMES, rng.randint(0, 5)):
        entries.append((name, rng.choice(COPY_VALUES.get(name, ["v", "1796000000999", "\u00fcw"]))))
    raw = [f"{name}\x01{value}\x02".encode() for name, value in entries]
    if rng.random() < 0.2:
        raw.append(rng.choice([b"a\x01v\x02", b"REAL_TOPIC\x01u\x02", b"novalue\x01\x02", b"\x01v\x02", b"plain\x02",
                               b"x\x01v\x01w\x02", b"bad\x01\xff\x02", b"TIMER_UNIT\x017\x02", b"tail\x01v",
                               b"TIMER_DELIVER_MS\x015\x02", b"UNIQ_KEY\x01U2\x02"]))
    rng.shuffle(raw)
    return b"".join(raw)


def test_the_compiled_copy_properties_are_delivered_copys(monkeypatch):
    """timer_copy against messages.delivered_copy on 5,000 random timer records' properties: where it answers, the
    same real topic, origin, properties bytes, tags, UNIQ_KEY, queue and sharding key; it declines only what is
    odd (and what the reference does not copy: no REAL_TOPIC or UNIQ_KEY)."""
    from mqstore.format.record_reader import decode_properties
    rng = random.Random(36)
    view = types.SimpleNamespace(store_timestamp_ms=1_796_000_000_555, body=b"b", body_crc=1, flag=0,
                                 born_timestamp_ms=0, born_host=b"\1\2\3\4", born_port=1)
    answered = 0
    for _ in range(5000):
        raw, offset, now = random_properties(rng), rng.randint(0, 1 << 40), 1_796_000_001_000 + rng.randint(0, 9)
        made = COMPILED.timer_copy(raw, offset, now, view.store_timestamp_ms)
        props = decode_properties(raw)
        if tm.REAL_TOPIC not in props:
            assert made is None
            continue
        try:
            reference = tm.delivered_copy(view, props, offset, now)
            origin = int(props.get(tm.ORIGIN, offset))
        except (KeyError, ValueError):
            reference = None
        if made is None:
            continue
        answered += 1
        assert reference is not None, raw
        real, copy = reference
        assert made == (real, origin, copy.properties, copy.tags, copy.uniq_key, copy.queue_id, copy.sharding_key), raw
    assert answered > 2000, answered


# ---- the gateway's delayed sends: CommitLogInternal.AppendBatches (the compiled parse_internal_batches) ----------

INTERNAL_HOSTS = ["", "", "10.0.0.9:4711", "1.2.3.4:5"]
ODD_HOSTS = ["[::1]:5", "01.2.3.4:5"]  # the reference reads these (the compiled parse declines them)


def random_internal_request(rng: random.Random) -> bytes:
    """An InternalAppendBatchesRequest as the gateway writes its DELAY sends (TIMER_DELIVER_MS, the other asking
    properties too), with everything random_message varies; sometimes a delivery field (the reference refuses it at
    this door), a plain message among delayed ones, an odd born host or another writer."""
    batches = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        count = rng.choice([1, 1, 2, 3, 5, 6])
        plain_at = rng.randrange(count) if rng.random() < 0.05 else -1
        messages = []
        for i in range(count):
            message = random_message(rng, timed=i != plain_at)
            if message.delay_ms or message.deliver_at_ms:  # as the gateway sends it: the time as a property
                due = message.delay_ms or message.deliver_at_ms
                name = tm.DELAY_MS if message.delay_ms else tm.DELIVER_MS
                message.ClearField("delay_ms")
                message.ClearField("deliver_at_ms")
                message.properties[name] = str(due)
                if rng.random() < 0.03:  # a delivery field at the internal door
                    setattr(message, rng.choice(["delay_ms", "deliver_at_ms"]), rng.choice([1500, -1]))
            messages.append(commitlog_pb2.InternalMessage(message=message, born_host=rng.choice(
                ODD_HOSTS if rng.random() < 0.02 else INTERNAL_HOSTS)))
        topic = rng.choice(["t"] * 12 + ["c", "nope", tm.TIMER_TOPIC, "%RETRY%g_t"])
        batches.append(commitlog_pb2.InternalAppendBatch(topic=topic, messages=messages))
    writer = "gateway" if rng.random() < 0.9 else "txn"
    return commitlog_pb2.InternalAppendBatchesRequest(writer=writer, batches=batches).SerializeToString()


def run_internal(raw: bytes, compiled: bool) -> list:
    """Each batch of ``raw`` as CommitLogInternal's AppendBatches appends it (commitlog_service.internal): the
    gateway's through the Scheduler, another writer's straight to the store; one outcome a batch, as run()'s."""
    with pure_when(not compiled):
        return _run_internal(raw, compiled)


def _run_internal(raw: bytes, compiled: bool) -> list:
    from mqstore_rpc import convert
    sched, store, noted = scheduler(compiled)
    if compiled:
        request = append_wire.parse_internal_batches(raw)
    else:
        request = commitlog_pb2.InternalAppendBatchesRequest.FromString(raw)
    outcomes = []
    for batch in request.batches:
        store.appended, noted[:] = None, []
        try:
            if compiled:
                messages = append_wire.internal_messages(batch, PEER)
            else:
                messages = convert.internal_messages_in(batch.messages, PEER)
            if request.writer == "gateway":
                sched.append(batch.topic, messages, writer=request.writer)
            else:
                store.append(batch.topic, messages, system_writer=request.writer)
        except MqStoreError as exc:
            outcomes.append(("error", type(exc).__name__, str(exc), store.encoder.uniq._counter))
        else:
            outcomes.append(("ok", store.appended, list(noted), store.encoder.uniq._counter))
    return outcomes


def test_the_gateways_delayed_sends_on_the_compiled_codec_give_the_references_records_and_errors(monkeypatch):
    """2,000 random InternalAppendBatchesRequests of delayed messages: the compiled parse takes every one without a
    delivery field or an odd born host (before, every delayed one went to protobuf and convert), and the Scheduler
    gives the same records, due times, errors and UNIQ_KEY counter both ways; most valid batches by timer_batch."""
    rng = random.Random(3735)
    taken, parsed = [], {"compiled": 0, "reference": 0}

    def counted(*args):
        made = COMPILED.timer_batch(*args)
        taken.append(made is not None)
        return made

    monkeypatch.setattr(codec, "compiled", types.SimpleNamespace(
        parse_append_request=COMPILED.parse_append_request, WireMessages=COMPILED.WireMessages,
        AppendEncoder=COMPILED.AppendEncoder, timer_batch=counted, parse_internal_batches=PARSE_INTERNAL,
        timer_copies=COMPILED.timer_copies))
    outcomes = {"ok": 0, "error": 0}
    for _ in range(2000):
        raw = random_internal_request(rng)
        request = commitlog_pb2.InternalAppendBatchesRequest.FromString(raw)
        odd = any(m.message.delay_ms or m.message.deliver_at_ms or m.born_host in ODD_HOSTS
                  for b in request.batches for m in b.messages)
        assert (PARSE_INTERNAL(raw) is None) == odd, request
        parsed["reference" if odd else "compiled"] += 1
        reference = run_internal(raw, compiled=False)
        assert run_internal(raw, compiled=True) == reference, request
        for outcome in reference:
            outcomes[outcome[0]] += 1
    assert outcomes["ok"] > 500 and outcomes["error"] > 300, outcomes
    assert parsed["compiled"] > 1500 and parsed["reference"] > 100, parsed
    assert sum(taken) > 0.8 * outcomes["ok"] and len(taken) - sum(taken) > 300, (sum(taken), len(taken), outcomes)


def _parse_internal():
    from mqstore.codec import _request
    return _request.parse_internal_batches


PARSE_INTERNAL = _parse_internal()


# ---- a delayed MessageIn batch's timer records (messages.timer_records(copies=True); the compiled timer_copies) ----

def random_messages_in(rng: random.Random) -> list[MessageIn]:
    """A delayed batch as the Scheduler takes MessageIn (tests, the bench, the reference way of the wire paths):
    random_message's messages converted as convert does, sometimes with a field of another type or a value past
    what the compiled path reads (a huge queue_id, a list of keys, a property value that is not a str)."""
    from mqstore_rpc import convert
    messages = []
    for _ in range(rng.choice([1, 1, 2, 3, 5])):
        message = random_message(rng, timed=True)
        try:
            made = convert.messages_in([message], PEER)[0]
        except MqStoreError:
            continue  # a negative delivery field: convert's error
        if rng.random() < 0.03:
            odd = rng.choice(["qid", "keys", "value", "body", "surrogate"])
            if odd == "qid":
                made.queue_id = rng.choice([1 << 70, True])
            elif odd == "keys":
                made.keys = list(made.keys)
            elif odd == "value":
                made.properties = {**made.properties, "n": 5}
            elif odd == "body":
                made.body = bytearray(made.body)
            else:
                made.properties = {**made.properties, "s": "\ud800"}
        messages.append(made)
    return messages or [MessageIn(b"x", properties={tm.DELAY_MS: "5"})]


def test_the_compiled_timer_copies_are_the_references():
    """5,000 random delayed MessageIn batches: where the compiled timer_copies answers, the reference's
    timer_records(copies=True) gives the same Copies (every field, the properties byte for byte) and due times; it
    declines all the reference refuses or makes MessageIn of, and answers most of what the reference takes."""
    rng = random.Random(3536)
    answered = copies = 0
    for _ in range(5000):
        messages = random_messages_in(rng)
        made = COMPILED.timer_copies(messages, "t", 4, NOW_MS, LIMIT_MS, Copy, Copies)
        try:
            reference = tm.timer_records("t", messages, NOW_MS, LIMIT_MS, 4, copies=True)
        except Exception as exc:  # noqa: BLE001 - any error of the reference (UnicodeEncodeError too)
            assert made is None, (messages, exc)
            continue
        copies += type(reference[0]) is Copies
        if made is not None:
            answered += 1
            assert type(made[0]) is Copies and made == reference, messages
    assert answered > 0.9 * copies and copies > 1500, (answered, copies)
