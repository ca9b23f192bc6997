"""The log against a trivially correct model: a list per queue and the log's records in order, under
random appends (sizes that force rolls), pulls, Tails (unfiltered and by topic, from any record start:
every visible record exactly once, in order), retention (expired segments deleted: queue minimums
follow, and Tail or Pull from below the minimum gets OutOfRange with the range), clean restarts and
crash restarts. The seed is printed; rerun with MQSTORE_SEED=<n>."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

import pytest

from mqstore import tailing
from mqstore.errors import OutOfRange
from mqstore.format import record_reader
from mqstore.model import TAIL_AT_OFFSET, TAIL_EARLIEST, MessageIn
from mqstore.store_parts import build_store

STEPS = 150
RETENTION_MS = 3_600_000


@dataclass
class LogModel:
    queues: dict[tuple[str, int], list[tuple[int, bytes]]]   # per queue: (physical offset, body)
    log: list[tuple[int, str, bytes]] = field(default_factory=list)  # every record: (physical offset, topic, body)
    min_offset: int = 0  # the log's: records below it were removed by retention

    def queue_min(self, key: tuple[str, int]) -> int:
        return sum(1 for phys, _ in self.queues[key] if phys < self.min_offset)

    def visible(self) -> list[tuple[int, str, bytes]]:
        return [r for r in self.log if r[0] >= self.min_offset]


@pytest.mark.parametrize("flush_mode", ["ASYNC", "SYNC"])
def test_random_ops_against_model(small_config, flush_mode):
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    config = small_config(segment_size_bytes=8192, cq_entries_per_file=16, flush_mode=flush_mode,
                          retention_ms=RETENTION_MS)
    topics = {"alpha": 3, "beta": 1}
    model = LogModel({(t, q): [] for t, n in topics.items() for q in range(n)})
    store = build_store(config)
    store.start()
    for name, queues in topics.items():
        store.topic_admin.create(name, queues)
    try:
        for _ in range(STEPS):
            op = rng.random()
            if op < 0.5:
                _append(store, rng, topics, model)
            elif op < 0.7:
                _pull_and_compare(store, rng, model)
            elif op < 0.82:
                _tail_and_compare(store, rng, model)
            elif op < 0.87:
                _expire(store, rng, model)
            elif op < 0.94:
                store.stop()
                store = build_store(config)
                store.start()
            else:
                store.halt()  # crash: no flush, no checkpoint, abort marker stays
                store = build_store(config)
                store.start()
        for key in model.queues:
            _pull_all_and_compare(store, key, model)
        _tail_and_compare(store, rng, model)
    finally:
        store.stop()


def _append(store, rng, topics, model):
    topic = rng.choice(sorted(topics))
    count = rng.randint(1, 12)
    msgs = []
    for _ in range(count):
        size = rng.choice([1, 10, 500, 3000, 7000])
        body = rng.randbytes(size)
        queue = rng.randrange(topics[topic])
        msgs.append(MessageIn(body=body, tags=rng.choice(["", "a", "b"]), queue_id=queue))
    results = store.append(topic, msgs)
    for msg, res in zip(msgs, results, strict=True):
        key = (topic, res.queue_id)
        assert res.queue_offset == len(model.queues[key])
        model.queues[key].append((res.physical_offset, msg.body))
        model.log.append((res.physical_offset, topic, msg.body))


def _pull_and_compare(store, rng, model):
    key = rng.choice(sorted(model.queues))
    expected = [body for _, body in model.queues[key]]
    low = model.queue_min(key)
    offset = rng.randint(low, len(expected))
    result = store.pull(key[0], key[1], offset, max_messages=rng.randint(1, 20), max_bytes=1 << 20)
    got = [m.record.body for m in result.messages]
    assert got == expected[offset:offset + len(got)]
    assert (result.min_offset, result.max_offset) == (low, len(expected))
    assert result.next_offset == offset + len(got)
    if offset < len(expected):
        assert got, "at least one message when the offset is below max"
    if low > 0:
        with pytest.raises(OutOfRange) as below:
            store.pull(key[0], key[1], rng.randrange(low))
        assert (below.value.min_value, below.value.max_value) == (low, len(expected))


def _pull_all_and_compare(store, key, model):
    expected = [body for _, body in model.queues[key]]
    got, offset = [], model.queue_min(key)
    assert store.queue_info(*key).min_offset == offset
    while offset < len(expected):
        result = store.pull(key[0], key[1], offset, max_messages=50)
        got.extend(m.record.body for m in result.messages)
        offset = result.next_offset
    assert got == expected[model.queue_min(key):]


def _tail(store, start, from_offset, topics):
    """Every record Tail gives from ``from_offset`` up to the visible end, as (physical offset, topic, body)."""
    visible = store.visible_offset()
    got = []
    frames = tailing.tail(store, start, from_offset, topics, 4096, 10, is_active=lambda: True)
    try:
        for frame in frames:
            # An unfiltered frame is the log's bytes [next - len, next): each record names its offset.
            base = None if topics else frame.next_physical_offset - len(frame.records)
            got += [(v.physical_offset, v.topic, v.body) for v in record_reader.records(frame.records, base=base)]
            assert len(got) <= len(store.segments.segments) * 8192  # bounded: never loops
            if frame.next_physical_offset >= visible:
                return got
    finally:
        frames.close()
    raise AssertionError("Tail ended before the visible end")


def _tail_and_compare(store, rng, model):
    visible = model.visible()
    assert store.commitlog.min_offset == model.min_offset
    topics = rng.choice([[], ["alpha"], ["beta"], ["alpha", "beta"]])
    if visible and rng.random() < 0.8:
        first = rng.randrange(len(visible))
        got = _tail(store, TAIL_AT_OFFSET, visible[first][0], topics)
    else:
        first = 0
        got = _tail(store, TAIL_EARLIEST, 0, topics)
    assert got == [r for r in visible[first:] if not topics or r[1] in topics]
    if model.min_offset > 0:
        with pytest.raises(OutOfRange) as below:
            next(tailing.tail(store, TAIL_AT_OFFSET, rng.randrange(model.min_offset), topics, 4096, 10,
                            is_active=lambda: True))
        assert (below.value.min_value, below.value.max_value) == (model.min_offset, store.visible_offset())


def _expire(store, rng, model):
    """Retention: the oldest segments (not the active one) become older than RETENTION_MS."""
    segments = store.segments.segments
    old = time.time() - 2 * RETENTION_MS / 1000
    for seg in segments[:rng.randint(0, max(len(segments) - 1, 0))]:
        os.utime(seg.path, (old, old))
    store.flusher.flush_now()  # in ASYNC mode, what is not flushed yet is never deleted
    deleted = store.retention.delete_expired_segments()
    new_min = store.commitlog.min_offset
    assert new_min >= model.min_offset and (deleted > 0) == (new_min > model.min_offset)
    model.min_offset = new_min
