"""An in-memory commit log behind mqstore.index.ports.CommitLogReader (so a mqstore.follow.TailSource
too), for unit tests of the follower, the upkeep thread and the lookup without sockets. It holds real V1
record bytes (mqstore.format.record) and can be told to fail: a stream that breaks after some frames, a
head deleted by retention, damaged record bytes.
Faults like these are what a fake is for; everything the happy path does is also tested for real in
tests/integration/test_index_service.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mqstore.errors import NotFound, OutOfRange, Unavailable
from mqstore.format import record, record_reader
from mqstore.model import StoreInfo, StoredMessage, TailFrame
from tests.support import records

HOST = b"\x7f\x00\x00\x01"
BASE_MS = 1_700_000_000_000


@dataclass
class Stored:
    physical_offset: int
    data: bytes
    topic: str
    keys: tuple[str, ...]
    uniq_key: str
    store_timestamp_ms: int


class FakeStream:
    def __init__(self, log: FakeLog, position: int, frame_records: int):
        self._log, self._position, self._frame_records = log, position, frame_records
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()
        with self._log.changed:
            self._log.changed.notify_all()

    def __iter__(self):
        frames = 0
        while True:
            if self._cancelled.is_set():
                raise Unavailable("fake log: stream cancelled")
            if self._log.break_after_frames is not None and frames >= self._log.break_after_frames:
                self._log.break_after_frames = None
                raise Unavailable("fake log: connection reset")
            batch, nxt, end = self._log.read(self._position, self._frame_records)
            if batch:
                self._position = nxt
                frames += 1
                yield TailFrame(b"".join(s.data for s in batch), len(batch), nxt, end)
                continue
            with self._log.changed:
                if self._log.end() <= self._position and not self._cancelled.is_set():
                    self._log.changed.wait(0.05)
            if self._log.end() <= self._position and not self._cancelled.is_set():
                yield TailFrame(b"", 0, self._position, self._log.end())


class FakeLog:
    """Thread-safe (``lock``); ``changed`` wakes streams when records are appended."""

    def __init__(self, frame_records: int = 7):
        self.lock = threading.Lock()
        self.changed = threading.Condition()
        self.stored: list[Stored] = []
        self.min_offset = 0
        self.break_after_frames: int | None = None
        self.frame_records = frame_records
        self.tails_opened = 0
        self.tail_starts: list[int | None] = []
        self.fetched = 0

    # -- writing ------------------------------------------------------------------------------------
    def append(self, topic: str, keys=(), uniq_key: str = "", *, sys_flag: int = 0, body: bytes = b"b",
               store_timestamp_ms: int | None = None) -> Stored:
        with self.lock:
            position = self.end_locked()
            ts = store_timestamp_ms if store_timestamp_ms is not None else BASE_MS + 10 * len(self.stored)
            properties = {}
            if keys:
                properties[record.PROPERTY_KEYS] = " ".join(keys)
            if uniq_key:
                properties[record.PROPERTY_UNIQ_KEY] = uniq_key
            data = records.encode(topic=topic.encode(), body=body, properties=record.encode_properties(properties),
                                  sys_flag=sys_flag, born_timestamp_ms=ts, born_host=HOST, born_port=1,
                                  store_host=HOST, store_port=2, physical_offset=position,
                                  queue_offset=len(self.stored), store_timestamp_ms=ts)
            stored = Stored(position, data, topic, tuple(keys), uniq_key, ts)
            self.stored.append(stored)
        with self.changed:
            self.changed.notify_all()
        return stored

    def damage(self, stored: Stored, position_in_record: int, data: bytes) -> None:
        """Overwrite bytes of a stored record, as a bad disk would: the stream then sends them."""
        with self.lock:
            raw = bytearray(stored.data)
            raw[position_in_record:position_in_record + len(data)] = data
            stored.data = bytes(raw)

    def delete_head(self, before_physical_offset: int) -> None:
        """Retention: records below the offset are gone."""
        with self.lock:
            self.stored = [s for s in self.stored if s.physical_offset >= before_physical_offset]
            self.min_offset = before_physical_offset

    def end_locked(self) -> int:
        return self.stored[-1].physical_offset + len(self.stored[-1].data) if self.stored else self.min_offset

    def end(self) -> int:
        with self.lock:
            return self.end_locked()

    def read(self, position: int, count: int) -> tuple[list[Stored], int, int]:
        with self.lock:
            batch = [s for s in self.stored if s.physical_offset >= position][:count]
            nxt = batch[-1].physical_offset + len(batch[-1].data) if batch else position
            return batch, nxt, self.end_locked()

    # -- CommitLogReader ------------------------------------------------------------------------------
    def tail(self, from_physical_offset, *, max_frame_bytes: int, heartbeat_ms: int) -> FakeStream:
        with self.lock:
            self.tails_opened += 1
            self.tail_starts.append(from_physical_offset)
            low, high = self.min_offset, self.end_locked()
            position = low if from_physical_offset is None else from_physical_offset
            starts = {s.physical_offset for s in self.stored} | {high}
        stream = FakeStream(self, position, self.frame_records)
        if not low <= position <= high:
            return _Failing(OutOfRange(f"fake log: {position} outside [{low}, {high}]", min_value=low,
                                       max_value=high))
        if position not in starts:
            raise AssertionError(f"no record starts at {position}")
        return stream

    def store_info(self) -> StoreInfo:
        with self.lock:
            end = self.end_locked()
            return StoreInfo(self.min_offset, end, end, end, "ASYNC", False, "", 1, 1 << 30, "127.0.0.1:2", "python")

    def get_messages(self, physical_offsets):
        with self.lock:
            by_offset = {s.physical_offset: s for s in self.stored}
            self.fetched += len(physical_offsets)
        return [self._message(by_offset[o]) if o in by_offset else None for o in physical_offsets]

    @staticmethod
    def _message(s: Stored) -> StoredMessage:
        return StoredMessage(record_reader.decode(s.data), f"id-{s.physical_offset}")

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        with self.lock:
            for i, s in enumerate(self.stored):
                if s.topic == topic and s.store_timestamp_ms >= timestamp_ms:
                    return i
            raise NotFound(f"fake log: nothing at or after {timestamp_ms}")


class _Failing:
    """A stream whose first read raises (as gRPC reports a Tail's status on the first read)."""

    def __init__(self, error: Exception):
        self._error = error

    def __iter__(self):
        raise self._error
        yield  # a generator: the error comes on the first read

    def cancel(self) -> None:
        """Nothing is open."""
