"""MessageStore: the facade every service and the CLI call. (Interface draft: being implemented.)

Thread-safe: any number of threads may call any method concurrently.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from mqstore.clock import Clock, SystemClock
from mqstore.config import StoreConfig
from mqstore.model import (AppendResult, MessageIn, PullResult, QueueInfo, StoredMessage, StoreInfo,
                           TailFrame, TopicRecord)


class MessageStore:
    def __init__(self, config: StoreConfig, clock: Clock | None = None):
        self.config = config
        self.clock = clock or SystemClock()

    # lifecycle
    def start(self) -> None:
        """Recover from disk (may raise CorruptLog), start background threads."""
        raise NotImplementedError

    def stop(self, timeout_s: float = 10.0) -> None:
        """Flush everything, write the checkpoint, remove the abort marker."""
        raise NotImplementedError

    # topics
    def create_topic(self, name: str, queue_count: int = 0, kind: str = "NORMAL", retention_ms: int = 0) -> TopicRecord: ...
    def update_topic(self, name: str, queue_count: int = 0, retention_ms: int | None = None) -> TopicRecord: ...
    def delete_topic(self, name: str) -> None: ...
    def list_topics(self, include_system: bool = False) -> list[TopicRecord]: ...
    def describe_topic(self, name: str) -> tuple[TopicRecord, list[QueueInfo]]: ...

    # data
    def append(self, topic: str, messages: Sequence[MessageIn]) -> list[AppendResult]: ...
    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, max_bytes: int = 1 << 20,
             tags: Sequence[str] = (), long_poll_ms: int = 0) -> PullResult: ...
    def get_message(self, physical_offset: int) -> StoredMessage: ...
    def get_message_by_id(self, msg_id: str) -> StoredMessage: ...
    def tail(self, start: str, from_physical_offset: int, topics: Sequence[str], max_frame_bytes: int,
             heartbeat_ms: int, is_active: Callable[[], bool]) -> Iterator[TailFrame]: ...

    # offsets
    def queue_info(self, topic: str, queue_id: int) -> QueueInfo: ...
    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int, boundary: str = "lower") -> int: ...
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...
    def query_offset(self, group: str, topic: str, queue_id: int) -> int: ...
    def store_info(self) -> StoreInfo: ...
