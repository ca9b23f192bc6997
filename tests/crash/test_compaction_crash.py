"""A crash at every step of a round (its staging, each step of the staged install) or of a segment roll
leaves the old or the new compaction log, never a mix, and never loses the latest value of a key.

The crash is a failpoint's raise: the store object is abandoned as it is (nothing closed, nothing
flushed beyond what the code did) and a new one opens the directory, as a restarted process would.
"""

from __future__ import annotations

import pathlib

import pytest

from mqstore import failpoints
from mqstore.clock import FakeClock
from mqstore.compaction import reads
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.errors import NotFound
from tests.support.compaction import BASE_MS, put

pytestmark = pytest.mark.crash
ROUND_STEPS = sorted(n for n in failpoints.KNOWN if n.startswith("fs.install.")) + ["compaction.round.staged"]
CONFIG = CompactionConfig(segment_size_bytes=4096, offset_map_memory_bytes=3 * 128, delete_retention_ms=0)


def _filled(directory: pathlib.Path, clock) -> tuple[CompactionStore, dict]:
    """A store with several sealed segments of 12 keys written over and over (and two tombstones)."""
    store = CompactionStore(directory, CONFIG, clock)
    latest = {}
    for offset in range(240):
        key = f"k{offset % 12}"
        value = None if offset in (200, 213) else f"{key}@{offset}".encode() * 8
        put(store, key, value, offset, clock.now_ms())
        latest[key] = (offset, value)
    return store, latest


def _contents(store: CompactionStore) -> list[tuple[int, bytes]]:
    qlog = store.slot("kv", 0).qlog
    return [(s.entry.queue_offset, s.raw) for s in qlog.read(0, 100_000)]


def _check_latest(store: CompactionStore, latest: dict) -> None:
    for key, (offset, value) in latest.items():
        found = reads.get_latest(store, "kv", key)
        assert found.stored.entry.queue_offset == offset and found.tombstone == (value is None)


def crash_in_round(name: str, tmp_path: pathlib.Path, failpoint) -> None:
    clock = FakeClock(BASE_MS)
    reference, latest = _filled(tmp_path / "reference", clock)
    reference.compact(reference.slot("kv", 0), seal_active=True)
    done = _contents(reference)
    reference.close()
    store, _ = _filled(tmp_path / "crashed", clock)
    store.slot("kv", 0).qlog.seal_active()
    before = _contents(store)
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        store.compact(store.slot("kv", 0))
    assert store.slot("kv", 0).quarantine.failures == 1  # the failed round is reported and backs off
    again = CompactionStore(tmp_path / "crashed", CONFIG, clock)
    after = _contents(again)
    # A failing pass may follow completed ones (a pass per three keys): the state is a pass boundary,
    # each of which is whole; the latest values are always there.
    assert after == before or after == done or len(after) < len(before)
    assert {o for o, _ in done} <= {o for o, _ in after}
    _check_latest(again, {k: v for k, v in latest.items() if v[1] is not None})
    again.compact(again.slot("kv", 0))
    assert _contents(again) == done
    again.close()


@pytest.mark.parametrize("name", ROUND_STEPS)
def test_crash_at_every_step_of_a_round(name, tmp_path, failpoint):
    crash_in_round(name, tmp_path, failpoint)


def crash_in_roll(name: str, tmp_path: pathlib.Path, failpoint) -> None:
    clock = FakeClock(BASE_MS)
    store = CompactionStore(tmp_path, CONFIG, clock)
    for offset in range(20):
        put(store, f"k{offset}", b"v" * 100, offset, clock.now_ms())
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        store.slot("kv", 0).qlog.seal_active()
    again = CompactionStore(tmp_path, CONFIG, clock)
    assert [o for o, _ in _contents(again)] == list(range(20))
    put(again, "k20", b"after", 20, clock.now_ms())
    assert reads.get_latest(again, "kv", "k20").stored.entry.queue_offset == 20
    again.close()


def test_crash_after_sealing_a_segment(tmp_path, failpoint):
    crash_in_roll("compaction.roll.sealed", tmp_path, failpoint)


def crash_in_drop(name: str, tmp_path: pathlib.Path, failpoint) -> None:
    """A deleted topic's logs: a crash before or after the rename of its directory, then a reopen, and
    the drop met again (the follower resumes before the DELETED event): the topic is gone for good,
    the other topic untouched, and a topic of the same name starts empty."""
    clock = FakeClock(BASE_MS)
    store, _ = _filled(tmp_path, clock)
    put(store, "other-key", b"stays", 0, clock.now_ms(), topic="other")
    with failpoint.armed(name), pytest.raises(failpoints.FailpointHit):
        store.drop_topic("kv")
    with pytest.raises(NotFound):
        store.slot("kv", 0)  # gone from the table at once, whatever the disk says
    again = CompactionStore(tmp_path, CONFIG, clock)
    renamed = name == "compaction.topic.renamed"
    assert again.topics() == (["other"] if renamed else ["kv", "other"])  # the rename is the commit point
    again.drop_topic("kv")  # the DELETED event, met again after the restart
    assert again.topics() == ["other"] and sorted(p.name for p in tmp_path.iterdir()) == ["other"]
    assert reads.get_latest(again, "other", "other-key").stored.entry.queue_offset == 0
    put(again, "k0", b"new", 0, clock.now_ms())
    assert [o for o, _ in _contents(again)] == [0]
    again.close()


@pytest.mark.parametrize("name", ["compaction.topic.dropping", "compaction.topic.renamed"])
def test_crash_while_dropping_a_deleted_topic(name, tmp_path, failpoint):
    crash_in_drop(name, tmp_path, failpoint)
