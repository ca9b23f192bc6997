"""The timer's enqueue at speed (issue 35's bench targets): units written to the timer files a batch at a time
(TimerFiles.add_many: the same bytes as one add each, recovered the same after a kill between the two writes), and
a delayed batch the Scheduler noted enqueued without reading its records back (Timer.note), a note that does not
match the log being ignored; the encoder's check of the user properties in one look over them all (every Append
with properties, the timer's copies included) naming the same property as the check of each did."""

from __future__ import annotations

import gc
import pathlib
import re

import pytest

from mqstore import system_writers  # noqa: F401  (registers the scheduler's writer rules)
from mqstore.clock import FakeClock
from mqstore.config import StoreConfig
from mqstore.errors import InvalidArgument
from mqstore.format import record_reader
from mqstore.format.timer_checkpoint import TimerCheckpoint
from mqstore.format.timer_unit import KIND_DELIVER, Unit
from mqstore.log.encoder import MessageEncoder
from mqstore.model import KIND_NORMAL, AppendResults, MessageIn, TopicRecord
from mqstore.store_parts import build_store
from mqstore.timer import messages as tm
from mqstore.timer import delivery, runs, scheduling
from mqstore.timer.config import TimerConfig
from mqstore.timer.files import LOG_NAME, WHEEL_NAME, TimerFiles
from mqstore.timer import enqueue as timer_enqueue
from mqstore.timer.timer import Timer

CONFIG = TimerConfig(timer_precision_ms=100, timer_wheel_slots=64)
UNITS = [(slot, slot + n, 10 + n, 1000 + 100 * n, 1 + (n == 5)) for n, slot in
         enumerate([100, 200, 100, 300, 100, 200, 500])]  # (slot ms, deliver ms, timer offset, physical, kind)


def _files(path) -> TimerFiles:
    files = TimerFiles(path, 100, 64)
    files.open()
    return files


def test_add_many_writes_the_bytes_of_one_add_each(tmp_path):
    one, many = _files(tmp_path / "one"), _files(tmp_path / "many")
    for unit in UNITS[:2]:  # slots that hold units already
        one.add(*unit)
        many.add(*unit)
    for unit in UNITS[2:]:
        one.add(*unit)
    many.add_many(runs.pack_units(UNITS[2:]))
    assert (one.log_end, one.enqueued_to) == (many.log_end, many.enqueued_to)
    for files in (one, many):
        files.close()
    for name in (LOG_NAME, WHEEL_NAME):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes()


def test_a_slot_is_read_from_one_span_and_a_damaged_unit_in_it_is_data_loss(tmp_path):
    """TimerFiles.units decodes a slot's units from one read of their span (timer_unit.decode inlined): the units
    added, in order; a byte changed in one of them is DataLoss, as timer_unit.decode's CRC check says."""
    from mqstore.errors import DataLoss
    from mqstore.format.timer_unit import UNIT_SIZE
    files = _files(tmp_path)
    try:
        files.add_many(runs.pack_units(UNITS))
        got = files.units(100)
        assert [(u.slot_ms, u.deliver_ms, u.timer_offset, u.physical_offset, u.kind) for u in got] == [
            u for u in UNITS if u[0] == 100]
        with open(tmp_path / LOG_NAME, "r+b") as log:  # the third unit: slot 100's second
            log.seek(2 * UNIT_SIZE + 9)
            byte = log.read(1)[0]
            log.seek(2 * UNIT_SIZE + 9)
            log.write(bytes([byte ^ 0x40]))
        with pytest.raises(DataLoss, match="damaged"):
            files.units(100)
    finally:
        files.close()


def test_units_whose_slot_writes_were_lost_are_recovered(tmp_path):
    # A kill -9 after add_many's write of the units, before its slot writes: recovery applies them again.
    files = _files(tmp_path)
    files.checkpoint(0, 0, 0, 0, {})
    files._write_slot = lambda slot: None
    files.add_many(runs.pack_units(UNITS))
    files.close()
    again = TimerFiles(tmp_path, 100, 64)
    assert isinstance(again.open(), TimerCheckpoint)
    for slot in (100, 200, 300, 500):
        assert [(u.deliver_ms, u.timer_offset) for u in again.units(slot)] == [
            (deliver, offset) for s, deliver, offset, _, _ in UNITS if s == slot]
    again.close()


def _store(small_config, clock):
    store = build_store(small_config(), clock)
    store.start()
    store.topic_admin.create("t", 1)
    return store


BORN_HOSTS = pytest.mark.parametrize("born_host", [b"\x0a\0\0\x01", b"\x05" * 16], ids=["ipv4", "ipv6"])


@BORN_HOSTS
def test_noted_records_are_enqueued_without_reading_them_back(small_config, tmp_path, monkeypatch, born_host):
    clock = FakeClock()
    store = _store(small_config, clock)
    timer = Timer(store, CONFIG, tmp_path / "timer")
    try:
        timer.open()
        scheduler = scheduling.Scheduler(store, CONFIG, noted=timer.note)
        due = clock.now_ms() + 500
        scheduler.append("t", [MessageIn(b"x", properties={tm.DELIVER_MS: str(due + n)}, born_host=born_host)
                               for n in range(5)])

        def read_back(*_args, **_kwargs):
            raise AssertionError("a noted timer record was read back by the enqueue")
        monkeypatch.setattr(record_reader.RecordView, "properties", property(read_back))
        monkeypatch.setattr(store, "pull", read_back)
        timer.step()
        assert timer.enqueue_offset == 5 and timer.stats.scheduled == 5
        assert [u.deliver_ms for u in timer.files.units(timer.files.slot_ms(due))] == [due + n for n in range(5)]
        monkeypatch.undo()
        clock.advance(600)
        timer.step()
        assert store.queue_info("t", 0).max_offset == 5
    finally:
        timer.close()
        store.stop()


def _step_until_enqueued(timer, offset: int) -> None:
    for _ in range(50):  # bounded: a step enqueues at least one consume queue file's run
        if timer.enqueue_offset >= offset:
            return
        timer.step()
    assert timer.enqueue_offset >= offset


def _no_read_back(monkeypatch, store) -> None:
    def read_back(*_args, **_kwargs):
        raise AssertionError("a noted timer record was read back by the enqueue")
    monkeypatch.setattr(record_reader.RecordView, "properties", property(read_back))
    monkeypatch.setattr(store, "pull", read_back)


def test_a_note_is_a_batch_taken_across_the_enqueues_runs(small_config, tmp_path, monkeypatch):
    # One note a batch (Timer.note does no work a message): the enqueue's runs stop at each consume queue file's
    # end (64 entries here), so a batch's note is taken in parts, its rest put back where a run stopped; a note
    # that comes after part of its batch was read covers the rest. No noted record is read back, every unit is
    # made, and nothing stays noted.
    clock = FakeClock()
    store = build_store(small_config(segment_size_bytes=1 << 20), clock)
    store.start()
    store.topic_admin.create("t", 1)
    timer = Timer(store, CONFIG, tmp_path / "timer")
    try:
        timer.open()
        due = clock.now_ms() + 500
        batch = [MessageIn(b"x", properties={tm.DELIVER_MS: str(due + n % 7)}) for n in range(100)]
        dues = [due + n % 7 for n in range(100)]
        late = scheduling.append(store, CONFIG, "t", batch)  # not noted: its first records are read from the log
        timer.step()
        assert 0 < timer.enqueue_offset < 100
        timer.note(late, dues)
        assert list(timer._notes) == [timer.enqueue_offset]
        # What a note keeps is no object a record the garbage collector tracks (kept tuples made it run every few
        # delayed batches): the physical offsets are an array, the due times a list of ints
        physicals, noted_dues, _, _ = held = timer._notes[timer.enqueue_offset]
        tracked = [o for o in gc.get_referents(*held) if gc.is_tracked(o) and not isinstance(o, type)]
        assert tracked == [] and type(physicals) is not list and list(physicals) == [e[0] for e in late.entries[
            timer.enqueue_offset:]] and noted_dues == dues[timer.enqueue_offset:]
        scheduler = scheduling.Scheduler(store, CONFIG, noted=timer.note)
        scheduler.append("t", batch)
        scheduler.append("t", batch)
        _no_read_back(monkeypatch, store)
        _step_until_enqueued(timer, 300)
        assert timer.enqueue_offset == 300 and timer.stats.scheduled == 300
        assert timer._notes == {} and timer._noted == 0
        monkeypatch.undo()
        # A note that came while the enqueue was reading its batch's first records from the log: under the queue
        # offset of its first record, below the enqueue offset; the enqueue moves it to where it reads on.
        raced = scheduling.append(store, CONFIG, "t", batch)
        timer.step()
        read_already = timer.enqueue_offset
        assert 300 < read_already < 400
        timer.enqueue_offset = 300  # as the note saw it, before the enqueue's run moved it
        timer.note(raced, dues)
        timer.enqueue_offset = read_already
        assert list(timer._notes) == [300]
        _no_read_back(monkeypatch, store)
        _step_until_enqueued(timer, 400)
        assert timer.enqueue_offset == 400 and timer.stats.scheduled == 400
        assert timer._notes == {} and timer._noted == 0
        monkeypatch.undo()
        units = [u for slot in {timer.files.slot_ms(d) for d in dues} for u in timer.files.units(slot)]
        assert sorted((u.timer_offset, u.deliver_ms) for u in units) == [(q, dues[q % 100]) for q in range(400)]
        clock.advance(600)
        timer.step()
        assert store.queue_info("t", 0).max_offset == 400
    finally:
        timer.close()
        store.stop()


def test_notes_are_bounded_by_the_records_they_hold(small_config, tmp_path, monkeypatch):
    # MAX_NOTES counts noted records, not batches: a batch that would pass it is not noted (its records are read
    # from the log), and the records taken make room again.
    monkeypatch.setattr(timer_enqueue, "MAX_NOTES", 150)
    clock = FakeClock()
    store = build_store(small_config(segment_size_bytes=1 << 20), clock)
    store.start()
    store.topic_admin.create("t", 1)
    timer = Timer(store, CONFIG, tmp_path / "timer")
    try:
        timer.open()
        scheduler = scheduling.Scheduler(store, CONFIG, noted=timer.note)
        batch = [MessageIn(b"x", properties={tm.DELAY_MS: "400"})] * 100
        scheduler.append("t", batch)
        scheduler.append("t", batch)
        assert list(timer._notes) == [0] and timer._noted == 100
        _step_until_enqueued(timer, 200)
        assert timer.stats.scheduled == 200 and timer._notes == {} and timer._noted == 0
        scheduler.append("t", batch)
        assert list(timer._notes) == [200] and timer._noted == 100
        _no_read_back(monkeypatch, store)
        _step_until_enqueued(timer, 300)
        monkeypatch.undo()
        clock.advance(600)
        timer.step()
        assert store.queue_info("t", 0).max_offset == 300
    finally:
        timer.close()
        store.stop()


@BORN_HOSTS
def test_a_note_that_does_not_match_the_log_is_ignored(small_config, tmp_path, born_host):
    clock = FakeClock()
    store = _store(small_config, clock)
    timer = Timer(store, CONFIG, tmp_path / "timer")
    try:
        timer.open()
        due = clock.now_ms() + 500
        results = scheduling.append(store, CONFIG, "t", [MessageIn(b"x", properties={tm.DELIVER_MS: str(due)},
                                                                   born_host=born_host)] * 2)
        # Due now, by notes naming another store time and another physical offset than the records have.
        wrong_time = AppendResults(results.msg_id_prefix, results.entries[:1], results.uniq_keys[:1],
                                   results.store_timestamp_ms + 1, results.durability)
        moved = [(entry[0] + 1, *entry[1:]) for entry in results.entries[1:]]
        wrong_place = AppendResults(results.msg_id_prefix, moved, results.uniq_keys[1:], results.store_timestamp_ms,
                                    results.durability)
        timer.note(wrong_time, [clock.now_ms()])
        timer.note(wrong_place, [clock.now_ms()])
        timer.step()
        assert timer.enqueue_offset == 2 and store.queue_info("t", 0).max_offset == 0  # due as their records say
        clock.advance(600)
        timer.step()
        assert store.queue_info("t", 0).max_offset == 2
    finally:
        timer.close()
        store.stop()


@pytest.mark.parametrize("properties, named", [
    ({"a": "1", "b\x01": "2", "": "3"}, "'b\\x01'"),
    ({"a": "1", "": "3", "b\x01": "2"}, "''"),
    ({"a": "1\x02x", "b": ""}, "'a'"),
    ({"a": "1", "b": ""}, "'b'"),
    ({"a\x02": "1\x01"}, "'a\\x02'"),
])
def test_the_encoder_names_the_first_wrong_property(properties, named):
    # The encoder's one look at the whole user properties (the delivery's copies pass there) still names the first
    # property, in order, that is empty or holds a separator.
    encoder = MessageEncoder(StoreConfig(data_dir=pathlib.Path("/nonexistent")))
    topic = TopicRecord("t", 1, KIND_NORMAL, 0, 0)
    with pytest.raises(InvalidArgument, match=re.escape(f"messages[1].properties[{named}]")):
        encoder.encode_batch(topic, [MessageIn(b"x", properties={"k": "v"}), MessageIn(b"x", properties=properties)],
                             1)
    assert encoder.encode_batch(topic, [MessageIn(b"x", properties={"a": "1", "TAGS": "t"})], 1).sizes


def _reference_records(topic: str, messages, now: int, limit: int, queue_count: int):
    """The conversion before tm.timer_records: due_ms then to_timer of each message, the queue checked first."""
    converted, dues = [], []
    for index, message in enumerate(messages):
        if message.queue_id is not None and not 0 <= message.queue_id < queue_count:
            raise InvalidArgument(f"messages[{index}].queue_id: {message.queue_id} is outside topic {topic!r}'s "
                                  f"queues 0..{queue_count - 1}")
        due = tm.due_ms(message, now, limit, index)
        converted.append(tm.to_timer(topic, message, due))
        dues.append(due)
    return converted, dues


def _outcome(convert, *args):
    try:
        return convert(*args)
    except Exception as exc:  # noqa: BLE001 (the error is the outcome compared)
        return type(exc), str(exc)


def test_timer_records_convert_as_due_ms_and_to_timer_of_each_did():
    import random
    rng = random.Random(35)
    now, limit = 1_796_000_000_000, 86_400_000
    values = ["0", "1500", "86400000", "86400001", "-5", "x", " 7", str(now + 10), str(now - 10), "9" * 20]
    for _ in range(600):
        batch = []
        for _ in range(rng.randint(1, 3)):
            props = {rng.choice(tm.ASKING): rng.choice(values)}
            if rng.random() < 0.3:
                props[rng.choice(tm.ASKING)] = rng.choice(values[:4])
            for name in rng.sample(["a", "zz", "TAGS", "KEYS", "UNIQ_KEY", "TIMER_X"], rng.randint(0, 3)):
                props[name] = rng.choice(["v", "k1 k2", "t"])
            batch.append(MessageIn(b"body", tags=rng.choice(["", "tag"]), keys=rng.choice([(), ("k1",), ("a", "b")]),
                                   properties=props, flag=rng.randint(0, 3), born_timestamp_ms=rng.randint(0, 9),
                                   queue_id=rng.choice([None, 0, 2, 4]), sharding_key=rng.choice(["", "s"]),
                                   born_port=rng.randint(0, 9)))
        assert (_outcome(tm.timer_records, "t", batch, now, limit, 4)
                == _outcome(_reference_records, "t", batch, now, limit, 4)), batch


def test_a_copy_from_the_timer_records_bytes_is_the_record_delivered_gave(small_config):
    """messages.delivered_copy through the encoder's Copies: the bytes of messages.delivered's MessageIn encoded
    (random messages: tags, keys, queues, sharding keys, properties, IPv6 born hosts; a rolled record); the compiled
    codec's one pass (delivery.copies) makes the same Copy."""
    import random
    from mqstore.model import Copies
    from mqstore.topics import OWNER_SCHEDULE
    rng = random.Random(41)
    clock = FakeClock()
    store = build_store(small_config(), clock)
    store.start()
    try:
        store.topic_admin.create("t", 4)
        for n in range(60):
            props = {tm.DELIVER_MS: str(clock.now_ms() + n)} if n % 2 else {tm.DELAY_MS: str(rng.randint(1, 5000))}
            for name in rng.sample(["a", "zz", "Ä", "UNIQ_KEY", "TIMER_X"], rng.randint(0, 3)):
                props[name] = rng.choice(["v", "üw", "K0"])
            message = MessageIn(b"b%d" % n * rng.randint(1, 50), tags=rng.choice(["", "tag"]),
                                keys=rng.choice([(), ("k1",), ("a", "b")]), properties=props, flag=rng.randint(0, 3),
                                born_timestamp_ms=rng.randint(0, 9), queue_id=rng.choice([None, 0, 3]),
                                sharding_key=rng.choice(["", "s"]), born_host=rng.choice([b"\1\2\3\4", b"\5" * 16]),
                                born_port=rng.randint(0, 9))
            scheduling.append(store, CONFIG, "t", [message])
        store.append(tm.TIMER_TOPIC, [tm.rolled(store.pull(tm.TIMER_TOPIC, 0, 0, 1).messages[0].record, 0)],
                     system_writer=OWNER_SCHEDULE)  # carries ROLL_TIMES, ROLLED_FROM and ORIGIN
        pulled = store.pull(tm.TIMER_TOPIC, 0, 0, 100, 8 << 20).messages
        assert len(pulled) == 61
        topic = store.topic_admin.get("t")
        for stored in pulled:
            physical = stored.record.physical_offset
            seg = store.commitlog.segments.find(physical)
            view = record_reader.RecordView(seg.buffer, physical - seg.start)
            real, copy = tm.delivered_copy(view, view.properties, stored.record.queue_offset, clock.now_ms() + 7)
            assert real == "t"
            # Timer._deliver's way (delivery.copies: the compiled codec's one pass where built) makes the same Copy
            unit = Unit(0, 0, stored.record.queue_offset, physical, -1, KIND_DELIVER)
            origin = int(view.properties.get(tm.ORIGIN, stored.record.queue_offset))
            assert delivery.copies(store, [unit], clock.now_ms() + 7) == [(real, origin, copy)]
            want = MessageEncoder(store.config).encode_batch(
                topic, [tm.delivered(stored.record, stored.record.queue_offset, clock.now_ms() + 7)[1]], 5)
            got = MessageEncoder(store.config).encode_batch(topic, Copies([copy]), 5)
            assert (bytes(got.buf), got.sizes, got.queue_ids, got.tag_codes, got.sys_flags, got.uniq_keys) == (
                bytes(want.buf), want.sizes, want.queue_ids, want.tag_codes, want.sys_flags, want.uniq_keys)
    finally:
        store.stop()


def test_a_delayed_batch_as_copies_encodes_to_the_bytes_and_errors_of_its_message_records(tmp_path):
    """messages.timer_records(copies=True) (the Scheduler's) through the encoder: the bytes, uniq keys and errors of
    the MessageIn records (copies=False) encoded, on random batches with what the encoder refuses mixed in."""
    import random
    from mqstore.log.encoder import UniqKeyGenerator
    config = StoreConfig(data_dir=tmp_path, max_body_bytes=300, max_batch_body_bytes=900, max_batch_messages=4)
    timer_topic = TopicRecord(tm.TIMER_TOPIC, 1, "SYSTEM", 0, 0)
    rng = random.Random(43)
    now, limit = 1_796_000_000_000, 86_400_000
    extra = [{}] * 8 + [{"a": "1"}, {"zz": "ü", "b": "2"}] * 4 + [{"TAGS": "t"}, {"KEYS": "k"}, {"UNIQ_KEY": "U1"},
                                                                  {"x": ""}, {"": "v"}, {"s\x01": "v"}, {"s": "v\x02"}]
    kept = 0
    for _ in range(500):
        batch = []
        for _ in range(rng.randint(1, 5)):
            props = {rng.choice(tm.ASKING): rng.choice(["0", "1500", str(now + 9), "86400001"])}
            props.update(rng.choice(extra))
            good = rng.random() < 0.9  # else one field the encoder or the conversion refuses
            batch.append(MessageIn(b"y" * rng.choice([1, 100] if good else [0, 301]),
                                   tags=rng.choice(["", "tag"] if good else ["t\x01"]),
                                   keys=rng.choice([(), ("k1",), ("a", "b")] if good else [("a b",), ("t\t",), ("",)]),
                                   properties=props, flag=rng.randint(0, 3),
                                   born_timestamp_ms=rng.choice([0, 5] if good else [-1]),
                                   queue_id=rng.choice([None, 0, 2] if good else [4]),
                                   sharding_key=rng.choice(["", "s"] if good else ["s\x02"]),
                                   born_host=rng.choice([b"\1\2\3\4", b"\5" * 16]), born_port=rng.randint(0, 9)))
        outcomes = []
        for copies in (True, False):
            encoder = MessageEncoder(config, UniqKeyGenerator(b"\1\2\3\4", random=b"abcd", counter=7))

            def encoded(copies=copies, encoder=encoder, batch=batch):
                records, dues = tm.timer_records("t", batch, now, limit, 4, copies)
                got = encoder.encode_batch(timer_topic, records, now)
                return (type(records).__name__, dues, bytes(got.buf), got.sizes, got.queue_ids, got.tag_codes,
                        got.sys_flags, got.uniq_keys)
            outcomes.append(_outcome(encoded))
        if outcomes[0][0] == "Copies":
            kept += 1
            assert outcomes[0][1:] == outcomes[1][1:], batch
        else:
            assert outcomes[0] == outcomes[1], batch
    assert kept > 50  # the copies path was taken, not only the fallback


def test_a_delayed_batch_wakes_the_duty_only_when_due_soon_or_after_enough_records(small_config, tmp_path):
    """A batch due far ahead does not wake the duty (its own step, at most MAX_PAUSE_S away, enqueues it long
    before its slot), one due within a precision and WAKE_LEAD_MS does, and so does the batch that brings the
    records appended since the last wake to WAKE_RECORDS (the count then starts over)."""
    clock = FakeClock(1_000_000)
    store = build_store(small_config(), clock)
    store.start()
    try:
        store.topic_admin.create("t", 1)
        wakes: list[int] = []
        scheduler = scheduling.Scheduler(store, CONFIG, lambda: wakes.append(1))
        lead = CONFIG.timer_precision_ms + scheduling.WAKE_LEAD_MS
        later = [MessageIn(b"x", properties={tm.DELAY_MS: str(lead + 500)})] * 100
        scheduler.append("t", later)
        assert wakes == []
        scheduler.append("t", [MessageIn(b"x", properties={tm.DELAY_MS: str(lead - 100)})])
        assert len(wakes) == 1
        scheduler.append("t", [MessageIn(b"x", properties={tm.DELAY_MS: "0"})])
        assert len(wakes) == 2
        batches = -(-scheduling.WAKE_RECORDS // 100)  # the batch that reaches WAKE_RECORDS is the last of these
        for _ in range(batches - 1):
            scheduler.append("t", later)
        assert len(wakes) == 2  # (batches - 1) * 100 records since the last wake: fewer than WAKE_RECORDS
        scheduler.append("t", later)
        assert len(wakes) == 3
        scheduler.append("t", later)
        assert len(wakes) == 3
    finally:
        store.stop()
