"""The body of an offset commit: a record of the system topic ``RMQ_SYS_CONSUMER_OFFSETS`` that the commit
log appends itself (CommitOffset, pop consumption's offsets and revive checkpoint, DeleteTopic's removal of
a topic's offsets, the import of the SQL table, the rewrite of live entries before retention), so that the
consumer offsets live in the log and are replicated with it (mqstore.consumer_offsets).

The record is an ordinary commit log record (mqstore.format.record) of that topic, queue 0. Its body holds
one or more rows, each a key (group, topic, queue id) and its value (the committed offset, the next queue
offset the group consumes), or a tombstone (offset -1: the key is deleted). Several rows go in ONE record
because a record is the unit the log's recovery keeps or cuts whole (a torn tail is cut at a record's
boundary, by its CRC): the rows of one commit (pop's offsets with its revive checkpoint) are all stored or
none. A compaction key is therefore a row's key, not the record's: the latest row of a key in log order is
its value, and a record stays needed while one of its rows is the latest of its key. Big-endian:

  offset size field           meaning
  ------ ---- --------------- ---------------------------------------------------------------------------
       0    4 magic           0x4D51434F ("MQCO")
       4    1 version         1
       5    2 row count n     1..MAX_ROWS
       7      n rows:
              +0  2 group length g     1..120 (a group name, mqstore.topics)
              +2  g group              UTF-8
              +.  2 topic length t     1..255 (a topic name, a retry topic's included)
              +.  t topic              UTF-8
              +.  4 queue id           signed, >= 0
              +.  8 offset             signed: >= 0 the committed offset, -1 (TOMBSTONE) the key deleted

Source of truth: the commit log (these records are part of it; the record's body CRC covers them). A body
that does not decode (another magic or version, a short or long body, a bad row) is ValueError. Applying
a record twice, or an older record after a newer one of another key, is harmless; the map is the latest row
of every key in log order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

TOPIC = "RMQ_SYS_CONSUMER_OFFSETS"
MAGIC = 0x4D51434F
VERSION = 1
TOMBSTONE = -1
MAX_GROUP_BYTES = 120
MAX_TOPIC_BYTES = 255
# A record of MAX_ROWS rows of the longest names is under 1.6 MiB: inside the store's body limit.
MAX_ROWS = 4096
HEADER = struct.Struct(
    ">"
    "I"  # 0 magic
    "B"  # 4 version
    "H"  # 5 row count
)
LENGTH = struct.Struct(">H")
VALUE = struct.Struct(
    ">"
    "i"  # queue id
    "q"  # offset (TOMBSTONE: deleted)
)


@dataclass(frozen=True, slots=True)
class Row:
    group: str
    topic: str
    queue_id: int
    offset: int  # TOMBSTONE: the key is deleted

    @property
    def key(self) -> tuple[str, str, int]:
        return self.group, self.topic, self.queue_id


def encode(rows: list[Row]) -> bytes:
    if not 0 < len(rows) <= MAX_ROWS:
        raise ValueError(f"an offset commit holds 1..{MAX_ROWS} rows, got {len(rows)}")
    parts = [HEADER.pack(MAGIC, VERSION, len(rows))]
    for row in rows:
        group, topic = row.group.encode("utf-8"), row.topic.encode("utf-8")
        if (not 0 < len(group) <= MAX_GROUP_BYTES or not 0 < len(topic) <= MAX_TOPIC_BYTES
                or not 0 <= row.queue_id < 1 << 31 or not TOMBSTONE <= row.offset < 1 << 63):
            raise ValueError(f"not an offset commit row: {row}")
        parts += [LENGTH.pack(len(group)), group, LENGTH.pack(len(topic)), topic, VALUE.pack(row.queue_id, row.offset)]
    return b"".join(parts)


def decode(body: bytes) -> list[Row]:
    body = bytes(body)
    if len(body) < HEADER.size:
        raise ValueError(f"an offset commit is at least {HEADER.size} bytes, this body {len(body)}")
    magic, version, count = HEADER.unpack_from(body, 0)
    if magic != MAGIC or version != VERSION or not 0 < count <= MAX_ROWS:
        raise ValueError(f"not an offset commit of version {VERSION}: magic {magic:#x}, version {version}, "
                         f"{count} rows")
    rows, at = [], HEADER.size
    try:
        for _ in range(count):
            group, at = _name(body, at, MAX_GROUP_BYTES)
            topic, at = _name(body, at, MAX_TOPIC_BYTES)
            queue_id, offset = VALUE.unpack_from(body, at)
            at += VALUE.size
            if queue_id < 0 or offset < TOMBSTONE:
                raise ValueError(f"queue id {queue_id}, offset {offset}")
            rows.append(Row(group, topic, queue_id, offset))
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"a damaged offset commit row at byte {at}: {exc}") from exc
    if at != len(body):
        raise ValueError(f"an offset commit of {count} rows ends at byte {at}, its body has {len(body)}")
    return rows


def _name(body: bytes, at: int, most: int) -> tuple[str, int]:
    (length,) = LENGTH.unpack_from(body, at)
    at += LENGTH.size
    if not 0 < length <= most or at + length > len(body):
        raise ValueError(f"a name of {length} bytes at byte {at}")
    return body[at:at + length].decode("utf-8"), at + length
