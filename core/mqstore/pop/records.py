"""The bodies of pop consumption's records in ``rmq_sys_REVIVE_LOG`` (source of truth of the in-flight set).

Each record is an ordinary commit log record (RocketMQ V1, body CRC) of the system topic
``rmq_sys_REVIVE_LOG``, queue 0, written only by pop consumption (owner ``pop``). Its TAGS is ``ck`` or
``ack``; its body is one of the two layouts below, all integers big-endian, names UTF-8 (ASCII by the
name rules). The first byte tells them apart.

CK (checkpoint): one per receive and queue that handed out messages, and one per ChangeInvisibleDuration.
Its "ck id" is the physical offset of its commit log record. A CK of an ordered group (KIND 3,
mqstore.pop.ordered) has the same layout: its expired messages are delivered again in place by a receive
(not copied to the retry topic), and an entry of ATTEMPT 0 is held, not delivered: its message group has a
message in flight, and the pop offset moved past it so that other message groups flow.

  offset   size  field              meaning
  -------- ----- ------------------ -----------------------------------------------------------------
       0     1   KIND               1 (CK) or 3 (CK of an ordered group)
       1     1   SOURCE             0: the topic's queue; 2: the group's retry topic %RETRY%{group}+{topic}
                                    (queue 0); 1: its legacy retry topic %RETRY%{group}_{topic}, written
                                    by earlier versions, read during the migration (mqstore.pop.legacy)
       2     2   MAX_ATTEMPTS       unsigned: deliveries before the DLQ (the receive's max_attempts)
       4     4   QUEUE_ID
       8     8   POP_TIME_MS        store clock when the messages were taken
      16     8   VISIBLE_AT_MS      when they are delivered again unless acked
      24     8   POP_OFFSET_AFTER   the group's pop offset of that queue after this receive; -1: unchanged
                                    (ChangeInvisibleDuration)
      32     2   COUNT n            unsigned, 1..1000
      34     1   GROUP_LENGTH g
      35     1   TOPIC_LENGTH t
      36     g   GROUP
    36+g     t   TOPIC              the topic received from (never the retry topic's name)
  36+g+t  20*n   ENTRIES            per message: QUEUE_OFFSET (8), PHYSICAL_OFFSET (8) of its record,
                                    ATTEMPT (4, the delivery attempt this CK hands out, 1-based;
                                    0 in an ordered CK: held, not handed out)

ACK: ends in-flight entries; several per record (acks of one request, expiries of one revive step).

  offset   size  field              meaning
  -------- ----- ------------------ -----------------------------------------------------------------
       0     1   KIND               2 (ACK)
       1     1   reserved           0
       2     2   COUNT n            unsigned, 1..65535
       4  17*n   ENTRIES            per entry: CK_ID (8, the physical offset of the CK naming the
                                    message), QUEUE_OFFSET (8) of the message, REASON (1, ``REASON_*``)

An ACK entry ends the message's in-flight entry only if that entry is still the one of CK_ID (a later
CK for the same message, from ChangeInvisibleDuration, replaces it). The commit log's body CRC covers
both layouts; a body that does not decode raises :class:`BadRecord`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

from mqstore.errors import invariant

KIND_CK = 1
KIND_ACK = 2
KIND_CK_ORDERED = 3
CK_KINDS = (KIND_CK, KIND_CK_ORDERED)
TAG_CK = "ck"
TAG_ACK = "ack"

SOURCE_TOPIC = 0
SOURCE_RETRY_LEGACY = 1  # what earlier versions wrote as "the retry topic": its name then had "_"
SOURCE_RETRY = 2
SOURCES = (SOURCE_TOPIC, SOURCE_RETRY_LEGACY, SOURCE_RETRY)

REASON_ACKED = 0       # a client acked it
REASON_REVIVED = 1     # expired: copied to the retry topic
REASON_DEAD = 2        # moved to the DLQ (expired at max_attempts, or ForwardToDeadLetter)
REASON_LOST = 3        # expired, but its record was gone (retention) or damaged: nothing to copy
REASONS = (REASON_ACKED, REASON_REVIVED, REASON_DEAD, REASON_LOST)

MAX_CK_ENTRIES = 1000
MAX_ACK_ENTRIES = 0xFFFF
NO_OFFSET_CHANGE = -1

CK_HEADER = struct.Struct(
    ">"
    "B"   # 0  KIND
    "B"   # 1  SOURCE
    "H"   # 2  MAX_ATTEMPTS
    "i"   # 4  QUEUE_ID
    "q"   # 8  POP_TIME_MS
    "q"   # 16 VISIBLE_AT_MS
    "q"   # 24 POP_OFFSET_AFTER
    "H"   # 32 COUNT
    "B"   # 34 GROUP_LENGTH
    "B"   # 35 TOPIC_LENGTH
)
CK_ENTRY = struct.Struct(
    ">"
    "q"   # 0  QUEUE_OFFSET
    "q"   # 8  PHYSICAL_OFFSET
    "i"   # 16 ATTEMPT
)
ACK_HEADER = struct.Struct(
    ">"
    "B"   # 0 KIND
    "B"   # 1 reserved
    "H"   # 2 COUNT
)
ACK_ENTRY = struct.Struct(
    ">"
    "q"   # 0  CK_ID
    "q"   # 8  QUEUE_OFFSET
    "B"   # 16 REASON
)


class BadRecord(ValueError):
    """A revive-log body that does not decode (a bug, or a record this version does not know)."""


@dataclass(frozen=True, slots=True)
class CkEntry:
    queue_offset: int
    physical_offset: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    group: str
    topic: str
    source: int
    queue_id: int
    max_attempts: int
    pop_time_ms: int
    visible_at_ms: int
    pop_offset_after: int
    entries: tuple[CkEntry, ...]
    ordered: bool = False   # KIND 3: a CK of an ordered group (mqstore.pop.ordered)


@dataclass(frozen=True, slots=True)
class AckEntry:
    ck_id: int
    queue_offset: int
    reason: int


def encode_ck(ck: Checkpoint) -> bytes:
    group, topic = ck.group.encode("utf-8"), ck.topic.encode("utf-8")
    invariant(1 <= len(ck.entries) <= MAX_CK_ENTRIES, f"a CK names 1..{MAX_CK_ENTRIES} messages")
    invariant(len(group) <= 255 and len(topic) <= 255, "group and topic fit one length byte")
    invariant(ck.source in SOURCES, f"source {ck.source} is one of {SOURCES}")
    kind = KIND_CK_ORDERED if ck.ordered else KIND_CK
    parts = [CK_HEADER.pack(kind, ck.source, ck.max_attempts, ck.queue_id, ck.pop_time_ms, ck.visible_at_ms,
                            ck.pop_offset_after, len(ck.entries), len(group), len(topic)), group, topic]
    parts += [CK_ENTRY.pack(e.queue_offset, e.physical_offset, e.attempt) for e in ck.entries]
    return b"".join(parts)


def encode_ack(entries: Sequence[AckEntry]) -> bytes:
    invariant(1 <= len(entries) <= MAX_ACK_ENTRIES, f"an ACK names 1..{MAX_ACK_ENTRIES} messages")
    parts = [ACK_HEADER.pack(KIND_ACK, 0, len(entries))]
    for e in entries:
        invariant(e.reason in REASONS, f"reason {e.reason} is one of {REASONS}")
        parts.append(ACK_ENTRY.pack(e.ck_id, e.queue_offset, e.reason))
    return b"".join(parts)


def kind_of(body: bytes) -> int:
    if not body or body[0] not in (KIND_CK, KIND_ACK, KIND_CK_ORDERED):
        raise BadRecord(f"a revive-log body starts with kind 1 or 3 (CK) or 2 (ACK), not {body[:1].hex() or 'nothing'}")
    return body[0]


def decode_ck(body: bytes) -> Checkpoint:
    if len(body) < CK_HEADER.size:
        raise BadRecord(f"a CK body has at least {CK_HEADER.size} bytes, this one {len(body)}")
    kind, source, max_attempts, queue_id, pop_ms, visible_ms, after, count, g, t = CK_HEADER.unpack_from(body)
    entries_at = CK_HEADER.size + g + t
    if kind not in CK_KINDS or source not in SOURCES or len(body) != entries_at + count * CK_ENTRY.size:
        raise BadRecord(f"CK body of {len(body)} bytes: kind {kind}, source {source}, {count} entries, names of "
                        f"{g} and {t} bytes do not add up")
    try:
        group = body[CK_HEADER.size:CK_HEADER.size + g].decode("utf-8")
        topic = body[CK_HEADER.size + g:entries_at].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"CK body: group or topic is not UTF-8 ({exc})") from None
    entries = tuple(CkEntry(*CK_ENTRY.unpack_from(body, entries_at + i * CK_ENTRY.size)) for i in range(count))
    return Checkpoint(group, topic, source, queue_id, max_attempts, pop_ms, visible_ms, after, entries,
                      kind == KIND_CK_ORDERED)


def decode_ack(body: bytes) -> list[AckEntry]:
    if len(body) < ACK_HEADER.size:
        raise BadRecord(f"an ACK body has at least {ACK_HEADER.size} bytes, this one {len(body)}")
    kind, _, count = ACK_HEADER.unpack_from(body)
    if kind != KIND_ACK or len(body) != ACK_HEADER.size + count * ACK_ENTRY.size:
        raise BadRecord(f"ACK body of {len(body)} bytes: kind {kind}, {count} entries do not add up")
    entries = [AckEntry(*ACK_ENTRY.unpack_from(body, ACK_HEADER.size + i * ACK_ENTRY.size)) for i in range(count)]
    for e in entries:
        if e.reason not in REASONS:
            raise BadRecord(f"ACK entry for CK {e.ck_id} has reason {e.reason}, not one of {REASONS}")
    return entries
