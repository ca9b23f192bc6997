"""The compiled consume-queue rebuild (codec _replay + mqstore.queue.replay) against the reference loop.

Random logs of two segments go to both: records of several topics and queues (one topic name that is
not valid UTF-8 in two spellings, which decode to the same name), every transaction type, TAGS
absent, ASCII, accented, astral, ill-formed UTF-8 or given twice, all four host layouts, queue offsets
that step on, repeat, go back or leave a gap (also from where the existing queues end), then a blank
record or not, and maybe one damaged record in the middle (its magic, properties or body length,
TOTALSIZE or a body byte changed: the compiled walk hands such a record to the reference, which reads
it as it stands). Both rebuild consume queues (real files, small ones, so runs cross files) from the
same starting queues, through Dispatcher.replay and through _replay_range with and without
starts (topics and their start physical offsets, anywhere in the log) / only / behind. The queue
files, the ``behind`` set, the records counted and the last store time must be the same, or both must
fail the same way (then the files each wrote before raising are not compared). Fixed orders of one queue's offsets
(repeat then gap, and so on) are checked too, since random logs find them rarely. The compiled module
is imported directly, so these run under MQSTORE_PURE_PYTHON=1 too.
"""

from __future__ import annotations

import mmap
import pathlib
import tempfile
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.config import StoreConfig
from mqstore.format import cq_unit, record, record_scan
from mqstore.log.encoder import MessageEncoder
from mqstore.queue import replay
from mqstore.queue.dispatch import Dispatcher, QueueTable
from tests.support import compiled as support_compiled
from tests.support import records

pytestmark = pytest.mark.codec

compiled = support_compiled.module("_replay")

SETTINGS = support_compiled.examples(250)
BASE = 1 << 20                 # physical offset of the first segment
ENTRIES_PER_FILE = 4
TOPICS = [b"alpha", b"beta", "é".encode(), b"\xff", b"\xfe"]
HOSTS = (records.LOOPBACK_V4, records.LOOPBACK_V6)
TAGS = [None, b"a", b"tag-c", "é".encode(), "😀x".encode(), b"\xff", b"a\xed\xa0\x80b", b"\xf0\x9f\x98", b"\xc3"]
DAMAGES = ["magic", "properties-length", "body-length", "total-size", "body-byte"]
TAG_CODE = MessageEncoder(StoreConfig(data_dir=pathlib.Path("unused"))).tag_code


def _properties(tags: list[bytes | None]) -> bytes:
    """A TAGS entry per element (None: none), among other properties."""
    parts = [b"KEYS\x01k"] + [b"TAGS\x01" + t for t in tags if t is not None] + [b"note\x01TAGS"]
    return b"\x02".join(parts)


one_record = st.fixed_dictionaries({
    "queue": st.integers(0, 3),  # which of the log's queues (a few, so that each has several records)
    "step": st.sampled_from([1, 1, 1, 1, 1, 0, -1, -3, 2, 5]), "tags": st.lists(st.sampled_from(TAGS), max_size=2),
    "sys_flag": st.sampled_from([0, 0, record.SYSFLAG_TX_PREPARED, record.SYSFLAG_TX_COMMIT,
                                 record.SYSFLAG_TX_ROLLBACK]),
    "born_host": st.sampled_from(HOSTS), "store_host": st.sampled_from(HOSTS),
    "store_timestamp_ms": st.integers(0, 1 << 50), "body": st.binary(max_size=40),
})


def _segment(specs: list[dict], start: int, offsets: dict, tail: str) -> tuple[bytes, list[int]]:
    """The segment's bytes and the positions where its records start."""
    data, starts = bytearray(), []
    for spec in specs:
        key = (spec["topic"], spec["queue_id"])
        offsets[key] = offsets.get(key, spec["first"]) + spec["step"]
        starts.append(len(data))
        data += records.encode(topic=spec["topic"], body=spec["body"], properties=_properties(spec["tags"]),
                               queue_id=spec["queue_id"], sys_flag=spec["sys_flag"], born_host=spec["born_host"],
                               store_host=spec["store_host"], queue_offset=offsets[key],
                               physical_offset=start + len(data), store_timestamp_ms=spec["store_timestamp_ms"])
    if tail == "blank":  # the end of the segment's data; what follows is not read
        data += record.encode_blank(64) + bytes(56) + records.encode(topic=b"alpha", body=b"after the blank")
    return bytes(data), starts


def _damage(data: bytes, at: int, how: str) -> bytes:
    out = bytearray(data)
    total = int.from_bytes(out[at:at + 4], "big")
    body_length_at = at + record.BODY_AT[(out[at + record.SYS_FLAG_HOST_BYTE_AT] & 0x30) >> 4] - 4
    if how == "magic":
        out[at + 4:at + 8] = (1).to_bytes(4, "big")
    elif how == "properties-length":
        out[at + total - 2:at + total] = (int.from_bytes(out[at + total - 2:at + total], "big") + 1).to_bytes(2, "big")
    elif how == "body-length":
        out[body_length_at:body_length_at + 4] = (total - 3).to_bytes(4, "big")
    elif how == "total-size":
        out[at:at + 4] = (0x7FFFFF00).to_bytes(4, "big")
    else:
        out[body_length_at + 4] ^= 0x55  # no CRC is checked here: both take it
    return bytes(out)


def _mapped(data: bytes):
    if not data:
        return data
    buf = mmap.mmap(-1, len(data))
    buf.write(data)
    return buf


@st.composite
def logs(draw):
    """Two segments (as the commit log's segment objects show them) and the record starts of each."""
    queues = draw(st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 2)), min_size=1, max_size=4,
                           unique=True))
    specs = draw(st.lists(one_record, min_size=1, max_size=30))
    for spec in specs:
        spec["topic"], spec["queue_id"] = queues[spec["queue"] % len(queues)]
        spec["first"] = draw(st.sampled_from([-1, 0, 1, 3]))  # the queue offset before a queue's first record
    split = draw(st.integers(0, len(specs)))
    offsets: dict = {}
    first, first_starts = _segment(specs[:split], BASE, offsets, draw(st.sampled_from(["end", "blank"])))
    second_start = BASE + len(first)  # segments follow each other
    second, second_starts = _segment(specs[split:], second_start, offsets, draw(st.sampled_from(["end", "blank"])))
    if second_starts and draw(st.booleans()):
        second = _damage(second, draw(st.sampled_from(second_starts)), draw(st.sampled_from(DAMAGES)))
    if draw(st.booleans()):
        first, second = _mapped(first), _mapped(second)  # as the segments' buffers are
    segments = [types.SimpleNamespace(buffer=buf, start=start, size=len(buf), end=start + len(buf))
                for buf, start in ((first, BASE), (second, second_start))]
    return segments, first_starts, second_starts


existing = st.dictionaries(st.tuples(st.sampled_from(["alpha", "beta"]), st.integers(0, 2)), st.integers(0, 6),
                           max_size=3)  # queues there before the replay, with this many entries
keys = st.tuples(st.sampled_from(["alpha", "beta", "é", "\ufffd"]), st.integers(0, 2))


def _tables(root: pathlib.Path, queues: dict) -> tuple[QueueTable, QueueTable]:
    tables = []
    for name in ("reference", "compiled"):
        table = QueueTable(root / name, ENTRIES_PER_FILE)
        table.load()
        for (topic, queue_id), count in queues.items():
            table.get_or_create(topic, queue_id).put_run(0, [(BASE - 1000 + i, 7, i) for i in range(count)])
        tables.append(table)
    return tables[0], tables[1]


def _dispatcher(segments: list, table: QueueTable, runs_of) -> Dispatcher:
    commitlog = types.SimpleNamespace(segments=types.SimpleNamespace(segments=segments), min_offset=BASE)
    dispatcher = Dispatcher(commitlog, table, TAG_CODE)
    dispatcher.replay_runs = runs_of
    return dispatcher


def _run(call):
    try:
        return call(), None
    except Exception as exc:  # noqa: BLE001 - compared: both paths must fail the same way
        return None, type(exc)


def _files(table: QueueTable) -> dict:
    found = {str(p.relative_to(table.root)): p.read_bytes() for p in sorted(table.root.rglob("*")) if p.is_file()}
    bounds = {key: (cq.min_offset, cq.max_offset, cq.max_physical_end) for key, cq in table.queues.items()}
    return {"files": found, "bounds": bounds}


def _compare(segments, queues, call) -> None:
    """``call(dispatcher)`` on the reference and the compiled path from the same queues: same outcome."""
    with tempfile.TemporaryDirectory() as tmp:
        ref_table, c_table = _tables(pathlib.Path(tmp), queues)
        try:
            ref = _dispatcher(segments, ref_table, None)
            fast = _dispatcher(segments, c_table, compiled.replay_runs)
            expected = _run(lambda: call(ref))
            assert _run(lambda: call(fast)) == expected
            if expected[1] is not None:
                # Both failed the same way (a damaged record read as a topic no directory can name): how far
                # each got before raising is not compared. A replay that raises is not a result; recovery runs
                # it again from its checkpoint, over files it rewrites.
                return
            assert fast.logics_msg_timestamp_ms == ref.logics_msg_timestamp_ms
            assert _files(c_table) == _files(ref_table)
        finally:
            ref_table.close()
            c_table.close()


def _starts(segments):
    """None, or some topics with the physical offset each starts at (the records below it belong to a
    deleted topic of the same name): anywhere from before the log to past its end."""
    offsets = st.integers(min_value=max(0, BASE - 1), max_value=segments[-1].end + 1) | st.just(0)
    return st.none() | st.dictionaries(st.sampled_from(["alpha", "beta", "é", "\ufffd"]), offsets)


@SETTINGS
@given(logs(), existing, st.data())
def test_replay_rebuilds_the_queues_the_reference_rebuilds(log, queues, data):
    """Dispatcher.replay from the log's start or from the second segment (then queues found behind
    are rebuilt from the start), with or without topic starts and queues known to be behind."""
    segments, _, _ = log
    start = data.draw(st.sampled_from([BASE, segments[1].start]))
    end = data.draw(st.sampled_from([segments[1].end, segments[1].end - 1, segments[0].end]))
    known = data.draw(_starts(segments))
    rebuild = data.draw(st.sets(keys, max_size=2))
    _compare(segments, queues, lambda d: d.replay(start, end, known, rebuild))


@SETTINGS
@given(logs(), existing, st.data())
def test_a_replayed_range_follows_the_reference_rules(log, queues, data):
    """_replay_range from any record of the first segment, with any topic starts / only / behind."""
    segments, first_starts, _ = log
    start = BASE + data.draw(st.sampled_from(first_starts or [0]))
    end = data.draw(st.sampled_from([segments[1].end, segments[1].end - 1, segments[0].end, start + 1]))
    known = data.draw(_starts(segments))
    only = data.draw(st.none() | st.sets(keys))
    behind = data.draw(st.none() | st.sets(keys, max_size=2))

    def call(dispatcher):
        found = None if behind is None else set(behind)
        return dispatcher._replay_range(start, end, known, only, found), found
    _compare(segments, queues, call)


@pytest.mark.parametrize("offsets", [(0, 1, 1, 2, 4), (0, 1, 0, 1, 2, 5), (3, 4, 2, 3, 4, 5, 5, 9), (5, 6, 7),
                                     (2, 1, 0, 3, 4), (0, 2, 1, 2, 3)])
@pytest.mark.parametrize("behind", [None, set()])
def test_repeats_and_gaps_of_one_queue_follow_the_reference(offsets, behind):
    """The orders of queue offsets that decide between trimming, merging, writing and falling behind,
    one queue holding 3 entries already (Hypothesis finds these rarely)."""
    data = b"".join(records.encode(topic=b"alpha", body=b"x", queue_offset=q, properties=_properties([b"t"]))
                    for q in offsets)
    segments = [types.SimpleNamespace(buffer=data, start=BASE, size=len(data), end=BASE + len(data))]

    def call(dispatcher):
        found = None if behind is None else set(behind)
        return dispatcher._replay_range(BASE, BASE + len(data), None, None, found), found
    _compare(segments, {("alpha", 0): 3}, call)


def _reference_runs(buf, position: int, end: int, base: int) -> list:
    """What replay_runs should give, from the reference walk: per (topic, queue id) in order of first
    appearance, runs of consecutive queue offsets; records of prepared and rolled-back transactions
    are counted but get no entry."""
    groups: dict = {}
    for size, topic, qid, qoff, flag, tags, _ in record_scan._routing_records_python(buf, position, end):
        if record.takes_queue_offset(flag):
            runs = groups.setdefault((topic, qid), [])
            entry = cq_unit.encode(base + position, size, TAG_CODE(tags))
            if runs and runs[-1][0] + len(runs[-1][1]) // cq_unit.ENTRY_SIZE == qoff:
                runs[-1] = (runs[-1][0], runs[-1][1] + entry, base + position + size)
            else:
                runs.append((qoff, entry, base + position + size))
        position += size
    return [(topic, qid, runs) for (topic, qid), runs in groups.items()]


@SETTINGS
@given(logs())
def test_the_compiled_runs_are_the_reference_records_grouped(log):
    """Up to where the compiled walk stops, its runs, count and last store time are the reference's."""
    segments, _, _ = log
    for seg in segments:
        runs, stop, blank, count, last_ts = compiled.replay_runs(seg.buffer, 0, seg.size, seg.start)
        assert runs == _reference_runs(seg.buffer, 0, stop, seg.start)
        walked = list(record_scan._routing_records_python(seg.buffer, 0, stop))
        assert count == len(walked) and last_ts == (walked[-1][6] if walked else 0)
        assert blank == (stop < seg.size and seg.buffer[stop + 4:stop + 8] == record.MAGIC_BLANK.to_bytes(4, "big"))


def test_tag_codes_follow_the_encoder_for_every_kind_of_text():
    """ASCII, accented, astral (a surrogate pair in Java), ill-formed UTF-8 (each bad part one U+FFFD)."""
    for tags in TAGS[1:] + [b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xe0\x80\x80", "中文".encode() * 40]:
        log = records.encode(topic=b"t", body=b"x", properties=_properties([tags]))
        [(_, _, [(_, entry, _)])], _, _, _, _ = compiled.replay_runs(log, 0, len(log), 0)
        assert cq_unit.decode(entry, 0)[2] == TAG_CODE(tags.decode("utf-8", "replace")), tags


def test_the_compiled_path_is_used_unless_names_collide():
    """replay_compiled decides by itself for valid topic names; two spellings of one name go back."""
    log = b"".join(records.encode(topic=t, body=b"x", queue_offset=0, physical_offset=BASE) for t in (b"a", b"b"))
    seg = types.SimpleNamespace(buffer=log, start=BASE, size=len(log))
    with tempfile.TemporaryDirectory() as tmp:
        table = QueueTable(pathlib.Path(tmp), ENTRIES_PER_FILE)
        try:
            assert replay.replay_compiled(compiled.replay_runs, table, TAG_CODE, seg, 0, len(log), None, None,
                                          None) == (2, 0)
            assert table.get("a", 0).max_offset == table.get("b", 0).max_offset == 1
            collide = log.replace(b"\x01a", b"\x01\xff").replace(b"\x01b", b"\x01\xfe")
            seg.buffer = collide
            assert replay.replay_compiled(compiled.replay_runs, table, TAG_CODE, seg, 0, len(log), None, None,
                                          None) is None
        finally:
            table.close()


def test_the_rebuild_reads_and_writes_where_the_record_module_says():
    from mqstore.errors import InvariantViolation
    from mqstore.format import codec_layout
    codec_layout.check_replay_layout(compiled.LAYOUT)
    with pytest.raises(InvariantViolation, match="consume-queue rebuild reads records at"):
        codec_layout.check_replay_layout({**compiled.LAYOUT, "queue_offset_at": 24})
    with pytest.raises(InvariantViolation, match="consume-queue rebuild reads records at"):
        codec_layout.check_replay_layout({**compiled.LAYOUT, "body_at": (88, 100, 100, 100)})
