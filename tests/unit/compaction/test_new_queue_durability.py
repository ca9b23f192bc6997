"""A new compaction queue's directory and files are durable before the follower's checkpoint can count
on them: the directories are fsynced, each with the directory that holds it (a directory entry
survives a power loss only once its parent is fsynced). The fsyncs are observed, in order."""

from __future__ import annotations

import os

from mqstore import fs
from mqstore.clock import FakeClock
from mqstore.compaction.policy import CompactionConfig
from mqstore.compaction.store import CompactionStore
from mqstore.format import compaction_segment as cseg
from tests.support.compaction import BASE_MS, put


def _record_fsyncs(monkeypatch) -> list[str]:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_a_new_queue_directory_and_its_files_are_fsynced_with_their_parents(tmp_path, monkeypatch):
    logs = tmp_path / "compactor" / "logs"
    synced = _record_fsyncs(monkeypatch)
    store = CompactionStore(logs, CompactionConfig(segment_size_bytes=4096), FakeClock(BASE_MS))
    assert {str(tmp_path / "compactor"), str(tmp_path)} <= set(synced)  # logs/ and compactor/ are new
    synced.clear()
    put(store, "k", b"v", 0, BASE_MS, topic="prices", queue_id=3)  # the first record of a new queue
    queue_dir = logs / "prices" / "3"
    assert (queue_dir / cseg.log_name(0)).exists() and (queue_dir / cseg.index_name(0)).exists()
    for directory in (logs, logs / "prices", queue_dir):
        assert str(directory) in synced, f"{directory} was never fsynced after the new queue was made"
    assert synced.index(str(logs)) > synced.index(str(logs / "prices"))  # the parent after its child's entry
    synced.clear()
    put(store, "k", b"w", 1, BASE_MS, topic="prices", queue_id=3)  # an existing queue: no directory work
    assert not synced
    store.close()


def test_make_dirs_reports_what_it_created(tmp_path):
    assert fs.make_dirs(tmp_path / "a" / "b") == [tmp_path / "a", tmp_path / "a" / "b"]
    assert fs.make_dirs(tmp_path / "a" / "b") == []
