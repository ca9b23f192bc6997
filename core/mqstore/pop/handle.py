"""Receipt handles: what a receive hands out with each message, and what ack, ChangeInvisibleDuration and
ForwardToDeadLetter take back. Pure functions, no I/O.

A handle is one line of text (one shell word), decodable without a lookup:

  v1:<source>:<queue id>:<queue offset>:<ck id>:<next visible ms>:<attempt>:<checksum>

source 0 is the topic's queue, 2 the group's retry topic, 1 its legacy retry topic; ck id is the
physical offset of the CK record that put the message in flight (mqstore.pop.records), so a handle
names one delivery: a later CK for the same message (ChangeInvisibleDuration, a redelivery) makes the
older handle stop working. The
checksum is the CRC-32 (8 hex digits) of the group, the topic and the fields: garbage, a truncated
handle or one issued for another group or topic is told apart from a handle that merely expired. It
is not a secret: whoever holds a handle may ack it (as in RocketMQ).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from mqstore.errors import InvalidArgument, shown

VERSION = "v1"
MAX_HANDLE_CHARS = 160  # v1 with every field at its widest is under 100


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    source: int
    queue_id: int
    queue_offset: int
    ck_id: int
    visible_at_ms: int
    attempt: int

    def describe(self) -> str:
        where = {0: "queue", 1: "legacy retry topic"}.get(self.source, "retry topic")
        return f"{where} {self.queue_id} offset {self.queue_offset}"


def _fields(h: ReceiptHandle) -> str:
    return f"{VERSION}:{h.source}:{h.queue_id}:{h.queue_offset}:{h.ck_id}:{h.visible_at_ms}:{h.attempt}"


def _checksum(group: str, topic: str, fields: str) -> str:
    signed = "\x00".join((group, topic, fields)).encode("utf-8")
    return format(zlib.crc32(signed), "08x")


def encode(group: str, topic: str, handle: ReceiptHandle) -> str:
    fields = _fields(handle)
    return f"{fields}:{_checksum(group, topic, fields)}"


def decode(group: str, topic: str, text: str) -> ReceiptHandle:
    """The handle ``text`` names; InvalidArgument when it does not parse or was not issued for this group
    and topic (the message quotes at most the start of it: errors.shown)."""
    quoted = shown(text)
    if len(text) > MAX_HANDLE_CHARS:
        raise InvalidArgument(f"receipt handle {quoted} is {len(text)} characters long; handles have at most "
                              f"{MAX_HANDLE_CHARS}: pass it exactly as Receive returned it")
    fields, _, checksum = text.rpartition(":")
    parts = fields.split(":")
    if len(parts) != 7 or parts[0] != VERSION:
        raise InvalidArgument(f"receipt handle {quoted} is not a receipt handle of this store (expected "
                              f"{VERSION}:<7 fields>:<checksum>); pass it exactly as Receive returned it")
    if checksum != _checksum(group, topic, fields):
        raise InvalidArgument(f"receipt handle {quoted} was not issued for group {group!r} and topic {topic!r}, or "
                              f"it was altered (its checksum does not match)")
    try:
        source, queue_id, queue_offset, ck_id, visible_at_ms, attempt = (int(p) for p in parts[1:])
    except ValueError:
        raise InvalidArgument(f"receipt handle {quoted} has a field that is not a number") from None
    return ReceiptHandle(source, queue_id, queue_offset, ck_id, visible_at_ms, attempt)
