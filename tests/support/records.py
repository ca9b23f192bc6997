"""Commit log records for tests, through the store's own encoder (record.encode_parts + record.stamp)."""

from __future__ import annotations

from mqstore.format import record

LOOPBACK_V4 = b"\x7f\x00\x00\x01"
LOOPBACK_V6 = bytes(15) + b"\x01"


def encode(*, topic: bytes, body: bytes, properties: bytes = b"", queue_id: int = 0, flag: int = 0,
           sys_flag: int = 0, born_timestamp_ms: int = 1, born_host: bytes = LOOPBACK_V4, born_port: int = 1,
           store_host: bytes = LOOPBACK_V4, store_port: int = 2, prepared_transaction_offset: int = 0,
           queue_offset: int = 0, physical_offset: int = 0, store_timestamp_ms: int = 0) -> bytes:
    """One record as the append path writes it: encoded, then stamped as inside the append lock.
    16-byte host addresses give the IPv6 layouts."""
    parts: list[bytes] = []
    record.encode_parts(parts, record.topic_part(topic), body, properties, queue_id, flag, sys_flag,
                        born_timestamp_ms, born_host, born_port, store_host, store_port, prepared_transaction_offset)
    buf = bytearray(b"".join(parts))
    record.stamp(buf, 0, queue_offset, physical_offset, store_timestamp_ms)
    return bytes(buf)
