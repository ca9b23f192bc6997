"""Stored messages for the gateway's unit tests, as the commit log would decode them."""

from __future__ import annotations

from mqstore.format.record_reader import Record
from mqstore.model import StoredMessage

LOOPBACK = b"\x7f\x00\x00\x01"


def stored(body: bytes = b"half", topic: str = "t", properties: dict | None = None, **fields) -> StoredMessage:
    values = dict(size=0, body_crc=0, queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0,
                  born_timestamp_ms=1_700_000_000_123, born_host=LOOPBACK, born_port=4000,
                  store_timestamp_ms=1_700_000_000_456, store_host=LOOPBACK, store_port=50051, reconsume_times=0,
                  prepared_transaction_offset=0, body=body, topic=topic,
                  properties=properties if properties is not None else {"UNIQ_KEY": "ID1"})
    values.update(fields)
    return StoredMessage(Record(**values), "7F0000010000C38300000000000000A4")
