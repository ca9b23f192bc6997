"""Consume queues against a model, and queues replayed from the log against the live ones.

Random messages (random tags, keys, transaction types, IPv4 or IPv6 born hosts, and user properties
whose names end in TAGS or KEYS, which a reader that matched names by suffix would take for them) are
appended; the live queues (raw entries, Pull without and with each tag) must match the model. Then
the queues are rebuilt from the log (consumequeue/ deleted, or one queue's directory after a crash)
and must equal the live ones entry for entry. The seed is printed; rerun with MQSTORE_SEED=<n>.
"""

from __future__ import annotations

import os
import random
import shutil

from mqstore.format import record
from mqstore.model import MessageIn
from mqstore.store import MessageStore
from mqstore.store_parts import build_store

TOPICS = {"alpha": 3, "beta": 2}
TAGS = ["", "a", "b", "tag-c"]
NO_QUEUE_ENTRY = (record.SYSFLAG_TX_PREPARED, record.SYSFLAG_TX_ROLLBACK)
V6 = bytes.fromhex("20010db8000000000000000000000042")


def _message(rng: random.Random) -> MessageIn:
    properties = {name: rng.choice(["a", "b", "tag-c", "zz"])
                  for name in rng.sample([f"MY{record.PROPERTY_TAGS}", f"X{record.PROPERTY_KEYS}",
                                          f"{record.PROPERTY_TAGS}X", "note"], rng.randint(0, 3))}
    return MessageIn(body=rng.randbytes(rng.choice([1, 40, 700, 2500])), tags=rng.choice(TAGS),
                     keys=tuple(f"k{rng.randrange(50)}" for _ in range(rng.randint(0, 2))), properties=properties,
                     sys_flag=rng.choice([0, 0, 0, record.SYSFLAG_TX_COMMIT, *NO_QUEUE_ENTRY]),
                     queue_id=rng.choice([None, 0, 1]), born_host=rng.choice([b"\x7f\x00\x00\x01", V6]))


def _fill(store: MessageStore, rng: random.Random, batches: int) -> dict:
    model: dict[tuple[str, int], list[tuple[bytes, str]]] = {(t, q): [] for t, n in TOPICS.items() for q in range(n)}
    for _ in range(batches):
        topic = rng.choice(sorted(TOPICS))
        messages = [_message(rng) for _ in range(rng.randint(1, 8))]
        for msg, result in zip(messages, store.append(topic, messages), strict=True):
            if msg.sys_flag & record.SYSFLAG_TX_MASK in NO_QUEUE_ENTRY:
                continue  # in the log, in no queue (RocketMQ's half and rolled-back messages)
            key = (topic, result.queue_id)
            assert result.queue_offset == len(model[key])
            model[key].append((msg.body, msg.tags))
    return model


def _pull_all(store: MessageStore, key: tuple[str, int], tags: list[str]) -> list[tuple[int, bytes, str]]:
    got, offset = [], 0
    while offset < store.queue_info(*key).max_offset:
        result = store.pull(*key, offset, max_messages=7, max_bytes=1 << 20, tags=tags)
        got += [(m.record.queue_offset, m.record.body, m.tags) for m in result.messages]
        assert result.next_offset > offset
        offset = result.next_offset
    return got


def _snapshot(store: MessageStore) -> dict:
    """Per queue: its raw entries (physical offset, size, tag code), and Pull without and with each tag."""
    snapshot = {}
    for key in ((t, q) for t, n in TOPICS.items() for q in range(n)):
        info = store.queue_info(*key)
        cq = store.queues.get(*key)
        entries = cq.entries(info.min_offset, info.max_offset - info.min_offset) if cq else []
        pulls = {tag: _pull_all(store, key, [tag] if tag else []) for tag in TAGS}
        snapshot[key] = (info.min_offset, info.max_offset, entries, pulls)
    return snapshot


def _check_against_model(snapshot: dict, model: dict) -> None:
    for key, (low, high, _, pulls) in snapshot.items():
        expected = [(offset, body, tags) for offset, (body, tags) in enumerate(model[key])]
        assert (low, high) == (0, len(expected)) and pulls[""] == expected, key
        for tag in TAGS[1:]:
            assert pulls[tag] == [m for m in expected if m[2] == tag], (key, tag)


def test_queues_replayed_from_the_log_equal_the_live_ones(small_config):
    seed = int(os.environ.get("MQSTORE_SEED", random.randrange(1 << 30)))
    print(f"seed={seed}")
    rng = random.Random(seed)
    config = small_config(segment_size_bytes=16 * 1024, cq_entries_per_file=16)
    store = build_store(config)
    store.start()
    try:
        for name, queues in TOPICS.items():
            store.topic_admin.create(name, queues)
        model = _fill(store, rng, 60)
        live = _snapshot(store)
        _check_against_model(live, model)
        store.stop()
        shutil.rmtree(config.consumequeue_dir)  # every queue is replayed from the log at start
        store = build_store(config)
        store.start()
        assert _snapshot(store) == live
        store.halt()  # a crash, then one queue's files are lost: the manifest says it is behind
        shutil.rmtree(config.consumequeue_dir / "alpha" / "1")
        store = build_store(config)
        store.start()
        assert _snapshot(store) == live
    finally:
        store.stop()
