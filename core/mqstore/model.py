"""Plain data passed between the MessageStore facade and its callers (services, CLI, tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mqstore.format.record import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from mqstore.format.record_reader import Record

KIND_NORMAL = "NORMAL"
KIND_COMPACTION = "COMPACTION"
KIND_SYSTEM = "SYSTEM"
TOPIC_KINDS = (KIND_NORMAL, KIND_COMPACTION, KIND_SYSTEM)

DURABILITY_WRITTEN = "WRITTEN"
DURABILITY_FLUSHED = "FLUSHED"


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    queue_count: int
    kind: str
    retention_ms: int  # 0 = store default
    created_ms: int
    # The topic's incarnation: the commit log's end when it was created. The log's records of this
    # name below it belong to a deleted topic of the same name and are not part of this one.
    start_physical_offset: int = 0


@dataclass(slots=True)
class MessageIn:
    """One message to append. Queue choice: compaction topics: the queue of the compaction key
    (mqstore.message_keys; queue_id and sharding_key must agree with it); else queue_id, else
    hash(sharding_key), else round robin. Not frozen: built once per message on the hot path,
    and a frozen dataclass costs five times as much to construct; treat it as immutable."""

    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp_ms: int = 0
    queue_id: int | None = None
    sharding_key: str = ""
    born_host: bytes = b"\x7f\x00\x00\x01"
    born_port: int = 0
    sys_flag: int = 0
    prepared_transaction_offset: int = 0
    # RECONSUMETIMES: set only through the store's internal way (system_writer): pop consumption's retry
    # copies, the services of CommitLogInternal. The public Append leaves it 0.
    reconsume_times: int = 0


@dataclass(slots=True)
class Copy:
    """A record to append from its pieces, its properties checked already: the timer's delivered copy of a stored
    record (mqstore.timer.messages.delivered_copy) and its timer record of a delayed message (timer_records). Its
    body and BODYCRC, its properties encoded as the encoder (mqstore.log.encoder) writes a MessageIn's (the user's
    sorted, then TAGS, KEYS, UNIQ_KEY), ``tags`` for the tag code, its UNIQ_KEY ("": the encoder gives a fresh one
    and adds it to the properties), the queue asked for (queue_id, else sharding_key, else round robin)."""

    body: bytes
    body_crc: int
    properties: bytes
    tags: str
    uniq_key: str
    flag: int
    born_timestamp_ms: int
    born_host: bytes
    born_port: int
    queue_id: int | None
    sharding_key: str
    sys_flag: int = 0  # as a MessageIn's, for the writers' checks: a copy is never a transaction's record
    prepared_transaction_offset: int = 0


class Copies(list):
    """A batch of :class:`Copy` (a list of them): what the encoder takes besides MessageIn and WireMessages."""

    __slots__ = ()


@dataclass(slots=True)
class AppendResult:  # not frozen for the same reason as MessageIn
    msg_id: str
    uniq_key: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size_bytes: int
    store_timestamp_ms: int
    durability: str
    replicas: int = 1
    epoch: int = 0


class AppendResults:
    """The results of one appended batch, one per message in order, kept as the columns the store
    already has (so the gRPC layer builds its response without a Python object per message).
    Indexing or iterating yields AppendResult objects."""

    __slots__ = ("msg_id_prefix", "entries", "uniq_keys", "store_timestamp_ms", "durability", "replicas", "epoch")

    def __init__(self, msg_id_prefix: str, entries: list, uniq_keys: list[str], store_timestamp_ms: int,
                 durability: str, replicas: int = 1, epoch: int = 0):
        self.msg_id_prefix = msg_id_prefix  # offset msg id = prefix + 16 hex digits of the physical offset
        # (physical offset, size, queue id, queue offset, tag code, sys flag) per message: a list of tuples, or the
        # compiled stamp's Entries (int64 columns read as that list; mqstore.codec)
        self.entries = entries
        self.uniq_keys = uniq_keys
        self.store_timestamp_ms = store_timestamp_ms
        self.durability = durability
        self.replicas = replicas  # copies holding the batch when acknowledged, the leader included
        self.epoch = epoch        # the leader epoch that wrote it (0 without replication)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> AppendResult:
        phys, size, qid, qoff, _, _ = self.entries[index]
        return AppendResult(f"{self.msg_id_prefix}{phys:016X}", self.uniq_keys[index], qid, qoff, phys, size,
                            self.store_timestamp_ms, self.durability, self.replicas, self.epoch)

    def __iter__(self):
        return (self[i] for i in range(len(self.entries)))


@dataclass(slots=True)
class StoredMessage:  # not frozen: one per message read (see MessageIn)
    record: Record
    msg_id: str

    @property
    def tags(self) -> str:
        return self.record.properties.get(PROPERTY_TAGS, "")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.record.properties.get(PROPERTY_KEYS, "").split(" ") if k]

    @property
    def uniq_key(self) -> str:
        return self.record.properties.get(PROPERTY_UNIQ_KEY, "")


@dataclass(frozen=True, slots=True)
class MessageLookup:
    """One answer of a batch GetMessages: the message, or why there is none."""

    message: StoredMessage | bytes | None  # bytes: the record's (MessageStore.get_messages(raw=True))
    missing: str = ""        # "" when found; else what the store said (no record there, outside the log)
    damaged: bool = False    # the record is there but fails its checks
    # missing because the offset lies at or past the end of the log the node serves: not written yet, or not yet
    # visible there (a replica shows what the leader said is committed, a moment late): no loss, retry (the leader)
    beyond_end: bool = False


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class PullResult:
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class RawPullResult:
    """A PullResult whose messages are the checked records' bytes, each a whole record as stored (the
    compiled codec encodes the response from them); every message id takes the first one's store host."""
    records: list[bytes]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class TailFrame:
    records: bytes
    record_count: int
    next_physical_offset: int
    log_end_physical_offset: int


TAIL_AT_OFFSET = "offset"
TAIL_EARLIEST = "earliest"
TAIL_LATEST = "latest"


@dataclass(frozen=True, slots=True)
class StoreInfo:
    min_physical_offset: int
    max_physical_offset: int
    flushed_physical_offset: int
    visible_physical_offset: int
    flush_mode: str
    read_only: bool
    read_only_reason: str | None  # None while writable
    segment_count: int
    segment_size_bytes: int
    store_host: str
    codec: str  # mqstore.codec.ACTIVE: "compiled" or "python"
