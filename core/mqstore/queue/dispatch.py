"""The dispatcher ("reput"): turns appended records into consume queue entries.

Two sources, same result: ``run_pending`` takes the routing facts the append path already knows
(no re-parse on the hot path); ``replay`` re-reads records from the log (recovery, rebuild), and so does
``dispatch_replicated`` (a replica's copied records, which also applies the DELETED topic events among them
as its leader's DeleteTopic did). Writes are idempotent by queue offset, so replaying records that were
already dispatched is harmless.

Thread-safety: everything that writes consume queues holds ``self.lock``. ``visible`` is a Condition
notified after every round that made records visible (Pull long-polls and Tail wait on it).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import threading

from typing import Callable

import structlog

from mqstore import codec, fs
from mqstore.errors import DataLoss
from mqstore.format import cq_unit, record, record_scan, topic_event
from mqstore.log.commitlog import CommitLog
from mqstore.queue import replay
from mqstore.queue.consume_queue import ConsumeQueue

log = structlog.get_logger()
_NOT_A_TOPIC = 1 << 63  # the start of a topic not in ``starts``: above every record


class QueueTable:
    """(topic, queue id) -> ConsumeQueue, created on first use. Thread-safe: the append path (which
    reserves files) and the dispatcher may both create a queue, so creation and removal take
    ``_lock``; lookups read the dict without it. A new queue's directories are made durable by the
    next checkpoint (:meth:`sync_created_dirs`; mqstore.queue.consume_queue says why)."""

    def __init__(self, root: pathlib.Path, entries_per_file: int):
        self.root = root
        self.entries_per_file = entries_per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()
        self._created_dirs: list[pathlib.Path] = []  # made by get_or_create, entries not durable yet

    def load(self) -> None:
        fs.make_dirs(self.root)  # the creation rule (mqstore.fs)
        for topic_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                cq = ConsumeQueue(queue_dir, topic_dir.name, int(queue_dir.name), self.entries_per_file)
                cq.load()
                self.queues[(topic_dir.name, int(queue_dir.name))] = cq

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is not None:
            return cq
        if not topic or topic in (".", "..") or "/" in topic or "\x00" in topic:
            # Every topic was checked when its first record was appended (mqstore.topics), so a record naming one
            # of these was damaged after: never a directory (a NUL fails, "../x" would be outside the table).
            raise DataLoss(f"a record names the topic {topic!r}, which no topic can be a directory of: the stored "
                           f"bytes are damaged")
        with self._lock:
            cq = self.queues.get((topic, queue_id))
            if cq is None:
                cq = ConsumeQueue(self.root / topic / str(queue_id), topic, queue_id, self.entries_per_file)
                # The creation rule (mqstore.fs), deferred off the append path to sync_created_dirs.
                self._created_dirs += fs.make_dirs(cq.files.directory, sync=False)
                self.queues[(topic, queue_id)] = cq
        return cq

    def sync_created_dirs(self) -> None:
        """Make the entries of the queue directories created since the last call durable."""
        with self._lock:
            created, self._created_dirs = self._created_dirs, []
        fs.sync_dirs(created)

    def reserve(self, topic: str, ranges: dict[int, tuple[int, int]]) -> None:
        """Allocate the files for queue offsets [first, end) of each queue id in ``ranges`` (the append
        path, before the batch is copied into the log). ResourceExhausted on a full disk."""
        for queue_id, (first, end) in ranges.items():
            cq = self.queues.get((topic, queue_id)) or self.get_or_create(topic, queue_id)
            cq.reserve(first, end)

    def drop_topic(self, topic: str) -> None:
        """Remove the topic's consume queues and their directory, durably (a deleted topic's)."""
        topic_dir = self.root / topic
        with self._lock:
            dropped = [self.queues.pop(k) for k in [k for k in self.queues if k[0] == topic]]
            # gone with it: nothing of the topic is left to make durable (sync_created_dirs)
            self._created_dirs = [d for d in self._created_dirs if d != topic_dir and topic_dir not in d.parents]
        for cq in dropped:
            cq.destroy()
        if topic_dir.is_dir():
            shutil.rmtree(topic_dir)
            fs.fsync_dir(self.root)

    def drop(self, keys: set[tuple[str, int]]) -> None:
        """Remove these queues (durably); replay or dispatch creates them again from the log."""
        for key in sorted(keys):
            log.warning("consumequeue.dropped_earlier_topic", topic=key[0], queue_id=key[1],
                        why="it holds records below the topic's start (of a deleted topic of that name)")
            with self._lock:
                cq = self.queues.pop(key, None)
                if cq is not None:  # gone with it: nothing of it is left to make durable (sync_created_dirs)
                    self._created_dirs = [d for d in self._created_dirs
                                          if d != cq.directory and cq.directory not in d.parents]
            if cq is not None:
                cq.destroy()

    def drop_unknown(self, names: set[str]) -> None:
        """Drop the queues of topics not in ``names`` (left by a delete cut short, or by older versions)."""
        for topic in sorted({t for t, _ in self.queues} - names):
            log.warning("consumequeue.dropped_unknown_topic", topic=topic, why="the topic does not exist (deleted)")
            self.drop_topic(topic)

    def of_earlier_topics(self, starts: dict[str, int]) -> set[tuple[str, int]]:
        """The queues of topics in ``starts`` that hold records below the topic's start: an earlier topic's of
        the same name (a replica stopped after copying its records and before dispatching its DELETED event)."""
        return {key for key, cq in list(self.queues.items()) if key[0] in starts and cq.holds_below(starts[key[0]])}

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()


class Dispatcher:
    def __init__(self, commitlog: CommitLog, queues: QueueTable, tag_code):
        self.commitlog = commitlog
        self.queues = queues
        self.tag_code = tag_code
        self.lock = threading.Lock()
        self.visible = threading.Condition()
        self.dispatched_offset = 0
        self.logics_msg_timestamp_ms = 0
        # The topic registry's start_of (set by the store): batches of a topic deleted since they were
        # appended, or below its start, get no entries (store_topics: a record belongs to its topic only
        # at or above the topic's start). None: every batch is dispatched.
        self.topic_start: Callable[[str], int | None] | None = None
        # The rebuild's compiled walk (None: the reference loop). Its tag codes are MessageEncoder.tag_code's.
        self.replay_runs = codec.compiled.replay_runs if codec.compiled is not None else None

    def run_pending(self, confirm_offset: int) -> None:
        # Taking the lock even when another thread is dispatching our batch: we return only once the
        # entries are written, so a Pull after an Append sees it.
        if self.dispatched_offset >= confirm_offset:
            return
        pending = self.commitlog.pending
        with self.lock:
            advanced = False
            table = self.queues
            topic_start = self.topic_start
            while pending and pending[0].end <= confirm_offset:
                written = pending.popleft()
                start = topic_start(written.topic) if topic_start is not None else 0
                if start is not None and written.entries[0][0] >= start:
                    for qid, (first, data, physical_end) in written.runs.items():
                        cq = table.queues.get((written.topic, qid)) or table.get_or_create(written.topic, qid)
                        cq.put_packed(first, data, physical_end)
                self.dispatched_offset = written.end
                self.logics_msg_timestamp_ms = written.store_timestamp_ms
                advanced = True
        if advanced:
            with self.visible:
                self.visible.notify_all()

    def replay(self, from_offset: int, to_offset: int, starts: dict[str, int] | None = None,
               rebuild=frozenset()) -> int:
        """Re-dispatch every record in [from_offset, to_offset) from the log; returns records seen.

        A queue that is missing or behind (its next entry would leave a gap, while the log still holds
        older records) is rebuilt from the start of the log: destroyed and replayed for that queue only.
        With ``starts`` (topic -> start_physical_offset), a record is dispatched only if its topic is
        there and it lies at or above that start (the records of deleted topics, and of an earlier
        topic of the same name, are skipped). Queues in ``rebuild`` are known to be missing or behind
        already (the manifest said so).
        """
        with self.lock:
            start = max(from_offset, self.commitlog.min_offset)
            behind: set[tuple[str, int]] = set(rebuild)
            count = self._replay_range(start, to_offset, starts, None, behind if start > self.commitlog.min_offset
                                       else None)
            if behind:
                log.warning("consumequeue.rebuild", queues=sorted(f"{t}/{q}" for t, q in behind),
                            from_offset=self.commitlog.min_offset)
                for key in behind:
                    stale = self.queues.queues.pop(key, None)
                    if stale is not None:
                        stale.destroy()
                self._replay_range(self.commitlog.min_offset, to_offset, starts, behind, None)
            self.dispatched_offset = to_offset
        return count

    def dispatch_replicated(self, from_offset: int, to_offset: int, starts) -> None:
        """A replica's new records [from_offset, to_offset): entries from the log, as its leader made them,
        then readers are woken. ``starts`` (store_topics.CopiedStarts) is the shared registry: a record gets
        an entry only if it is part of its topic as the topic is now (at or above its start), as in
        :meth:`replay`. A DELETED topic event (mqstore.format.topic_event) among them is where the leader
        dropped the topic's consume queues: the replica drops its own there too, unless the topic as it is
        now was created before the event (a repeated event of an older incarnation), and then replays the
        records after the event for the topic as it is now (created again: queue offsets from 0 again)."""
        with self.lock:
            from_offset = max(from_offset, self.dispatched_offset)  # another thread may have dispatched them
            if to_offset <= from_offset:
                return
            events = self.queues.get(topic_event.TOPIC, 0)
            seen = events.max_offset if events is not None else 0
            self._replay_range(from_offset, to_offset, starts, None, None)
            events = self.queues.get(topic_event.TOPIC, 0)
            for queue_offset in range(seen, events.max_offset if events is not None else 0):
                self._apply_copied_event(events.entry(queue_offset), to_offset, starts)
            self.dispatched_offset = to_offset
        with self.visible:
            self.visible.notify_all()

    def _apply_copied_event(self, entry: tuple[int, int, int], to_offset: int, starts) -> None:
        """Under ``lock``: a topic event a replica copied (:meth:`dispatch_replicated`)."""
        physical_offset, size, _ = entry
        if size == cq_unit.BLANK_SIZE_FIELD:
            return
        try:
            event = topic_event.decode(self.commitlog.decode_at(physical_offset, size).body)
        except ValueError as exc:
            raise DataLoss(f"the topic event at physical offset {physical_offset} does not decode ({exc}); the "
                           f"replica cannot tell which topic is gone") from None
        if event.event != topic_event.DELETED:
            return
        starts.reload()  # the registry learns of the delete (and of a topic of the name created since)
        start = starts.get(event.topic)
        if start is not None and start <= physical_offset:
            return  # the topic now was there before the event: it deletes an older incarnation, already gone
        self.queues.drop_topic(event.topic)
        log.info("consumequeue.dropped_deleted_topic", topic=event.topic, event_offset=physical_offset,
                 start_physical_offset=event.start_physical_offset)
        if start is not None:  # created again since: its records after the event, from queue offset 0
            self._replay_range(physical_offset + size, to_offset, {event.topic: start}, None, None)

    def _replay_range(self, start: int, end: int, starts, only, behind) -> int:
        count = 0
        for seg in self.commitlog.segments.segments:
            if seg.end <= start or seg.start >= end:
                continue
            count += self._replay_segment(seg, start - seg.start, min(seg.size, end - seg.start), starts,
                                          only, behind)
            start = seg.end
        return count

    def _replay_segment(self, seg, position: int, end: int, starts, only, behind) -> int:
        """Consume queue entries of one segment's records: on the compiled walk when it is built
        (mqstore.queue.replay), else (and where that cannot decide) with the reference."""
        if self.replay_runs is not None:
            done = replay.replay_compiled(self.replay_runs, self.queues, self.tag_code, seg, position, end,
                                          starts, only, behind)
            if done is not None:
                count, last_ts = done
                if last_ts is not None:
                    self.logics_msg_timestamp_ms = last_ts
                return count
        return self._replay_segment_python(seg, position, end, starts, only, behind)

    def _replay_segment_python(self, seg, position: int, end: int, starts, only, behind) -> int:
        """Consume queue entries of one segment's records, written per queue run (put_run): the
        reference, one record at a time."""
        buf = seg.buffer
        count = 0
        expect: dict[tuple[str, int], int] = {}  # next queue offset each queue is missing
        runs: dict[tuple[str, int], tuple[int, list]] = {}
        names: dict[bytes, str] = {}
        for size, topic_bytes, qid, qoff, flag, tags, store_ts in record_scan.routing_records(buf, position, end):
            topic = names.get(topic_bytes) or names.setdefault(topic_bytes, topic_bytes.decode("utf-8", "replace"))
            key = (topic, qid)
            if ((starts is None or seg.start + position >= starts.get(topic, _NOT_A_TOPIC))
                    and (only is None or key in only) and record.takes_queue_offset(flag)
                    and key not in (behind or ())):
                nxt = expect.get(key)
                if nxt is None:
                    cq = self.queues.get(topic, qid)
                    nxt = cq.max_offset if cq else 0
                if qoff > nxt and behind is not None:
                    behind.add(key)  # missing or behind: rebuilt from the log's start afterwards
                elif qoff >= nxt:
                    entry = (seg.start + position, size, self.tag_code(tags))
                    run = runs.get(key)
                    if run is not None and run[0] + len(run[1]) == qoff:
                        run[1].append(entry)
                    else:
                        if run is not None:
                            self._write_run(key, run)
                        runs[key] = (qoff, [entry])
                    expect[key] = qoff + 1
            self.logics_msg_timestamp_ms = store_ts
            position += size
            count += 1
        for key, run in runs.items():
            if behind is None or key not in behind:
                self._write_run(key, run)
        return count

    def _write_run(self, key: tuple[str, int], run: tuple[int, list]) -> None:
        self.queues.get_or_create(*key).put_run(run[0], run[1])

    def manifest(self) -> bytes:
        """Max offset of every queue, for the start-up check that finds missing or truncated queues."""
        queues = sorted([t, q, cq.max_offset] for (t, q), cq in list(self.queues.queues.items()))
        return json.dumps({"version": 1, "queues": queues}).encode()

    def queues_behind(self, manifest: bytes) -> set[tuple[str, int]]:
        """Queues whose files hold fewer entries than the manifest recorded (or are gone)."""
        behind = set()
        for topic, queue_id, max_offset in json.loads(manifest)["queues"]:
            cq = self.queues.get(topic, queue_id)
            if cq is None or cq.max_offset < max_offset:
                behind.add((topic, queue_id))
        return behind

    def next_queue_offsets(self) -> dict[tuple[str, int], int]:
        return {key: cq.max_offset for key, cq in self.queues.queues.items()}

    def queue_ends(self, from_offset: int, to_offset: int, starts: dict[str, int]) -> tuple[dict[tuple[str, int], int],
                                                                                         int | None]:
        """Under ``lock``: the next queue offset of each queue by the records in [from_offset, to_offset) of
        the log, as they carry it (the last one's + 1), and the store time of the last record (None: no
        record there). Only records that take a queue offset and belong to their topic as it is now (at
        or above its start in ``starts``). Reads the log, writes no entry: a new leader's records copied
        as a replica and not dispatched yet (ReplicaView.promote)."""
        ends: dict[tuple[str, int], int] = {}
        last_ts = None
        start = max(from_offset, self.commitlog.min_offset)
        for seg in self.commitlog.segments.segments:
            if seg.end <= start or seg.start >= to_offset:
                continue
            position = start - seg.start
            for size, topic_bytes, qid, qoff, flag, _, store_ts in record_scan.routing_records(
                    seg.buffer, position, min(seg.size, to_offset - seg.start)):
                topic = topic_bytes.decode("utf-8", "replace")
                if record.takes_queue_offset(flag) and seg.start + position >= starts.get(topic, _NOT_A_TOPIC):
                    ends[(topic, qid)] = qoff + 1
                last_ts = store_ts
                position += size
            start = seg.end
        return ends, last_ts
