"""The body of a topic event: a record of the system topic ``RMQ_SYS_TOPIC_EVENTS`` that the commit log
appends itself (no client or service can), so that every service deriving data from the log learns in
log order, through the Tail it already follows, that a topic is gone (mqstore.store_topics, DeleteTopic).

The record is an ordinary commit log record (mqstore.format.record) of that topic, queue 0, with KEYS =
the topic's name (so the Index finds a topic's events by its name); its body is, big-endian:

  offset size field                  meaning
  ------ ---- ---------------------- -------------------------------------------------------------------
       0    4 magic                  0x4D515445 ("MQTE")
       4    1 version                1
       5    1 event                  1 = DELETED: the topic is gone with every record of it in the log
       6    8 start physical offset  the incarnation deleted: the deleted topic's start_physical_offset
      14    2 name length n          1..127 (a topic name, mqstore.topics)
      16    n name                   UTF-8

Source of truth: the commit log (these records are part of it; the body CRC covers them). A reader
that meets a body it cannot decode (another magic or version, a short body) gets ValueError. Applying
an event twice is harmless: a follower may meet it again after a restart from an older checkpoint,
and a delete cut short by a crash is announced again when the commit log resumes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

TOPIC = "RMQ_SYS_TOPIC_EVENTS"
MAGIC = 0x4D515445
VERSION = 1
DELETED = 1
HEADER = struct.Struct(
    ">"
    "I"  # 0  magic
    "B"  # 4  version
    "B"  # 5  event
    "q"  # 6  start physical offset of the incarnation
    "H"  # 14 name length
)
EVENTS = {DELETED: "DELETED"}


@dataclass(frozen=True, slots=True)
class TopicEvent:
    event: int
    topic: str
    start_physical_offset: int


def encode(event: TopicEvent) -> bytes:
    name = event.topic.encode("utf-8")
    if event.event not in EVENTS or not 0 < len(name) <= 127 or event.start_physical_offset < 0:
        raise ValueError(f"not a topic event: {event}")
    return HEADER.pack(MAGIC, VERSION, event.event, event.start_physical_offset, len(name)) + name


def decode(body: bytes) -> TopicEvent:
    if len(body) < HEADER.size:
        raise ValueError(f"a topic event is at least {HEADER.size} bytes, this body {len(body)}")
    magic, version, event, start, length = HEADER.unpack_from(body, 0)
    if magic != MAGIC or version != VERSION or event not in EVENTS or len(body) != HEADER.size + length:
        raise ValueError(f"not a topic event of version {VERSION}: magic {magic:#x}, version {version}, event "
                         f"{event}, name length {length} in a body of {len(body)} bytes")
    return TopicEvent(event, bytes(body[HEADER.size:]).decode("utf-8"), start)
