"""Pop consumption's failpoints, each reached in this process (action "raise"), followed by a crash (the
store and the pop service halted without a flush, as after kill -9, and reopened from disk): then every
message is acked once or dead-lettered once in the end, none is delivered twice with one attempt number,
and what the step made durable holds (tests/crash/test_failpoints.py runs it for each failpoint;
tests/crash/test_pop_kill9.py crashes real processes at the same points)."""

from __future__ import annotations

import collections
import pathlib

import pytest

from mqstore import failpoints
from mqstore.clock import FakeClock
from mqstore.config import StoreConfig
from mqstore.model import MessageIn
from mqstore.pop.config import PopConfig
from mqstore.pop.service import PopService
from mqstore.store_parts import build_store

INVISIBLE_MS = 10_000
MESSAGES = 12


class Node:
    def __init__(self, data_dir: pathlib.Path, clock: FakeClock):
        self.config = StoreConfig(data_dir=data_dir, segment_size_bytes=64 * 1024, warm_ahead_bytes=0,
                                  checkpoint_interval_ms=600_000, clean_interval_ms=600_000)
        self.clock = clock
        self.open()

    def open(self) -> None:
        self.store = build_store(self.config, self.clock)
        self.store.start()
        self.pop = PopService(self.store, PopConfig())
        self.pop.start(run_duty=False)

    def crash(self) -> None:
        self.pop.halt()
        self.store.halt()
        self.open()

    def close(self) -> None:
        self.pop.stop()
        self.store.stop()

    def receive(self, batch: int = 100):
        return self.pop.receive("g", "t", invisible_duration_ms=INVISIBLE_MS, batch_size=batch).deliveries


def crash_at(name: str, tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path / "store", FakeClock())
    try:
        node.store.topic_admin.create("t", 2)
        node.store.append("t", [MessageIn(body=b"m%d" % i) for i in range(MESSAGES)])
        seen: collections.Counter = collections.Counter()
        held = node.receive(batch=4)
        seen.update((d.message.record.body, d.attempt) for d in held)
        gone = _reach(name, node, held)
        node.crash()
        _check(node, seen, gone, gone if name == "pop.forward.after_copy" else set())
    finally:
        failpoints.disarm_all()
        node.close()


def _reach(name: str, node: Node, held) -> set[bytes]:
    """Arm ``name``, take the step that hits it; returns the messages the step made leave for good."""
    failpoints.arm(name, "raise")
    step = {
        "pop.receive.after_ck": lambda: node.receive(),
        "pop.ack.after_record": lambda: node.pop.ack("g", "t", [d.receipt_handle for d in held[:2]]),
        "pop.change.after_ck": lambda: node.pop.change_invisible_duration("g", "t", held[0].receipt_handle,
                                                                          3 * INVISIBLE_MS),
        "pop.forward.after_copy": lambda: node.pop.forward_to_dead_letter("g", "t", held[0].receipt_handle),
        "pop.revive.after_copy": lambda: (node.clock.advance(INVISIBLE_MS), node.pop.reviver.revive_due()),
    }[name]
    with pytest.raises(failpoints.FailpointHit):
        step()
    failpoints.disarm_all()
    if name == "pop.ack.after_record":
        return {d.message.record.body for d in held[:2]}  # the ACK record is durable
    if name == "pop.forward.after_copy":
        return {held[0].message.record.body}  # in the DLQ, its ACK record durable
    return set()


def _check(node: Node, seen: collections.Counter, gone: set[bytes], dead_letters: set[bytes]) -> None:
    acked: set[bytes] = set()
    for _ in range(40):  # expire, receive, ack until every message is through
        node.clock.advance(3 * INVISIBLE_MS)
        while node.pop.reviver.revive_due():
            pass
        got = node.receive()
        seen.update((d.message.record.body, d.attempt) for d in got)
        if got:
            outcomes = node.pop.ack("g", "t", [d.receipt_handle for d in got]).outcomes
            assert {o.status for o in outcomes} == {"ok"}
            acked.update(d.message.record.body for d in got)
        if len(acked) + len(gone) == MESSAGES:
            break
    assert acked | gone == {b"m%d" % i for i in range(MESSAGES)} and not acked & gone, (acked, gone)
    assert [key for key, count in seen.items() if count > 1] == []  # no copy delivered twice
    dead = [m.record.body for m in node.store.pull("%DLQ%g", 0, 0).messages] if dead_letters else []
    assert dead == sorted(dead_letters)  # each forwarded message once in the DLQ
