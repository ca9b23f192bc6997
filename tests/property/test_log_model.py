"""The log against a trivially correct model: a list per queue, under random appends (sizes that force
rolls), pulls, clean restarts and crash restarts. The seed is printed; rerun with MQSTORE_SEED=<n>."""

from __future__ import annotations

import os
import random

import pytest

from mqstore.model import MessageIn
from mqstore.store import MessageStore

STEPS = 120


@pytest.mark.parametrize("flush_mode", ["ASYNC", "SYNC"])
def test_random_ops_against_model(small_config, flush_mode):
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    config = small_config(segment_size_bytes=8192, cq_entries_per_file=16, flush_mode=flush_mode)
    topics = {"alpha": 3, "beta": 1}
    model: dict[tuple[str, int], list[bytes]] = {(t, q): [] for t, n in topics.items() for q in range(n)}
    store = MessageStore(config)
    store.start()
    for name, queues in topics.items():
        store.create_topic(name, queues)
    try:
        for step in range(STEPS):
            op = rng.random()
            if op < 0.6:
                _append(store, rng, topics, model)
            elif op < 0.85:
                _pull_and_compare(store, rng, model)
            elif op < 0.93:
                store.stop()
                store = MessageStore(config)
                store.start()
            else:
                store.halt()  # crash: no flush, no checkpoint, abort marker stays
                store = MessageStore(config)
                store.start()
        for key in model:
            _pull_all_and_compare(store, key, model[key])
    finally:
        store.stop()


def _append(store, rng, topics, model):
    topic = rng.choice(sorted(topics))
    count = rng.randint(1, 12)
    msgs = []
    for i in range(count):
        size = rng.choice([1, 10, 500, 3000, 7000])
        body = rng.randbytes(size)
        queue = rng.randrange(topics[topic])
        msgs.append(MessageIn(body=body, tags=rng.choice(["", "a", "b"]), queue_id=queue))
    results = store.append(topic, msgs)
    for msg, res in zip(msgs, results):
        key = (topic, res.queue_id)
        assert res.queue_offset == len(model[key])
        model[key].append(msg.body)


def _pull_and_compare(store, rng, model):
    key = rng.choice(sorted(model))
    expected = model[key]
    offset = rng.randint(0, len(expected))
    result = store.pull(key[0], key[1], offset, max_messages=rng.randint(1, 20), max_bytes=1 << 20)
    got = [m.record.body for m in result.messages]
    assert got == expected[offset:offset + len(got)]
    assert result.max_offset == len(expected)
    assert result.next_offset == offset + len(got)
    if offset < len(expected):
        assert got, "at least one message when the offset is below max"


def _pull_all_and_compare(store, key, expected):
    got, offset = [], 0
    while offset < len(expected):
        result = store.pull(key[0], key[1], offset, max_messages=50)
        got.extend(m.record.body for m in result.messages)
        offset = result.next_offset
    assert got == expected
