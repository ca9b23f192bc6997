"""Commit log record, RocketMQ message format V1, byte for byte (source of truth).

All integers big-endian. Layout of one record with IPv4 born and store hosts (SYSFLAG bits 0x10 and
0x20 clear):

  offset size field                        meaning
  ------ ---- ---------------------------- ------------------------------------------------------------
       0    4 TOTALSIZE                    whole record length, this field included
       4    4 MAGICCODE                    0xDAA320A7 (V1). A blank end-of-file record has 0xCBD43194
       8    4 BODYCRC                      zlib CRC32 of BODY & 0x7FFFFFFF (31 bits, never negative)
      12    4 QUEUEID
      16    4 FLAG                         producer's flag
      20    8 QUEUEOFFSET                  logical offset in topic/queue (0 for PREPARED/ROLLBACK tx)
      28    8 PHYSICALOFFSET               commit log offset of this record
      36    4 SYSFLAG                      see SYSFLAG_* below
      40    8 BORNTIMESTAMP                ms, producer clock
      48    8 BORNHOST                     4-byte IPv4 address + 4-byte port
      56    8 STORETIMESTAMP               ms, taken inside the append lock (monotonic in log order)
      64    8 STOREHOST                    4-byte IPv4 address + 4-byte port
      72    4 RECONSUMETIMES
      76    8 PREPAREDTRANSACTIONOFFSET    for a committed tx message: physical offset of its half message
      84    4 BODYLENGTH  n
      88    n BODY
    88+n    1 TOPICLENGTH t                (V1: one unsigned byte, so topics are at most 127 here)
    89+n    t TOPIC                        UTF-8
  89+n+t    2 PROPERTIESLENGTH p           signed short, p <= 32767
  91+n+t    p PROPERTIES                   UTF-8 "key\\x01value\\x02" repeated (always a trailing \\x02)

IPv6 hosts (SYSFLAG_BORN_HOST_V6 0x10, SYSFLAG_STORE_HOST_V6 0x20): that host's address is 16 bytes
instead of 4, so every field after it lies 12 bytes later (24 with both). The fields up to BORNHOST's
address are at the same offsets in every layout. :data:`LAYOUTS` holds the offsets of each of the four
layouts, computed here once; readers (mqstore.format.record_reader) and the encoder use only them.

Fixed overhead: 91 bytes (IPv4 hosts). The CRC covers the body only (as in RocketMQ); readers also
reject a record whose TOTALSIZE disagrees with the sum of its field lengths.

Blank record (end of file): 8 bytes, TOTALSIZE = bytes left in the file, MAGICCODE = 0xCBD43194; the
rest of the file stays zero and readers jump to the next file.

This module defines the layout and writes records; mqstore.format.record_reader reads them.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from mqstore.errors import invariant

MAGIC_V1 = 0xDAA320A7
MAGIC_BLANK = 0xCBD43194

# The header up to and including BODYLENGTH, one line per field; {born} and {store} are the address
# sizes of the two hosts (4 for IPv4, 16 for IPv6). The offsets are those of the IPv4 layout.
_HEADER_FORMAT = (
    ">"
    "i"         # 0   TOTALSIZE
    "I"         # 4   MAGICCODE
    "i"         # 8   BODYCRC
    "i"         # 12  QUEUEID
    "i"         # 16  FLAG
    "q"         # 20  QUEUEOFFSET
    "q"         # 28  PHYSICALOFFSET
    "i"         # 36  SYSFLAG
    "q"         # 40  BORNTIMESTAMP
    "{born}s"   # 48  BORNHOST address
    "i"         # 52  BORNHOST port
    "q"         # 56  STORETIMESTAMP
    "{store}s"  # 64  STOREHOST address
    "i"         # 68  STOREHOST port
    "i"         # 72  RECONSUMETIMES
    "q"         # 76  PREPAREDTRANSACTIONOFFSET
    "i"         # 84  BODYLENGTH
)

# Offsets that are the same in every layout.
BODY_CRC_AT = 8
QUEUE_ID_AT = 12
FLAG_AT = 16
QUEUE_OFFSET_AT = 20
PHYSICAL_OFFSET_AT = 28
SYS_FLAG_AT = 36
SYS_FLAG_HOST_BYTE_AT = SYS_FLAG_AT + 3  # SYSFLAG's low byte: it holds the host bits
BORN_TIMESTAMP_AT = 40
BORN_HOST_AT = 48

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TX_MASK = 0xC
SYSFLAG_TX_NOT = 0x0
SYSFLAG_TX_PREPARED = 0x4
SYSFLAG_TX_COMMIT = 0x8
SYSFLAG_TX_ROLLBACK = 0xC
# Records of a prepared (half) or rolled-back transaction take no queue offset and get no consume
# queue entry (RocketMQ's rule): consumers see a transaction only once committed.
NO_QUEUE_OFFSET_TX = (SYSFLAG_TX_PREPARED, SYSFLAG_TX_ROLLBACK)
SYSFLAG_BORN_HOST_V6 = 0x10
SYSFLAG_STORE_HOST_V6 = 0x20
SYSFLAG_HOSTS_V6 = SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6
LAYOUT_SHIFT = 4  # (SYSFLAG & SYSFLAG_HOSTS_V6) >> LAYOUT_SHIFT is the index into LAYOUTS

IPV4_BYTES = 4
IPV6_BYTES = 16


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each field lies in one of the four host layouts (offsets from the record's start)."""

    sys_flag_bits: int          # the SYSFLAG host bits that select this layout
    born_host_bytes: int        # address size, 4 or 16
    store_host_bytes: int
    born_port_at: int
    store_timestamp_at: int
    store_host_at: int
    store_port_at: int
    reconsume_times_at: int
    prepared_transaction_offset_at: int
    body_length_at: int
    body_at: int                # = the header size; the fixed overhead is body_at + 3
    header: struct.Struct       # every field up to BODYLENGTH


def _layout(index: int) -> Layout:
    born = IPV6_BYTES if index & 1 else IPV4_BYTES
    store = IPV6_BYTES if index & 2 else IPV4_BYTES
    born_port_at = BORN_HOST_AT + born
    store_timestamp_at = born_port_at + 4
    store_host_at = store_timestamp_at + 8
    store_port_at = store_host_at + store
    reconsume_times_at = store_port_at + 4
    prepared_at = reconsume_times_at + 4
    body_length_at = prepared_at + 8
    header = struct.Struct(_HEADER_FORMAT.format(born=born, store=store))
    invariant(header.size == body_length_at + 4, "the header struct and the offsets agree")
    return Layout(index << LAYOUT_SHIFT, born, store, born_port_at, store_timestamp_at, store_host_at, store_port_at,
                  reconsume_times_at, prepared_at, body_length_at, body_length_at + 4, header)


LAYOUTS: tuple[Layout, ...] = tuple(_layout(index) for index in range(4))
IPV4 = LAYOUTS[0]
# Flat per-layout tables for the readers' hot loops (a tuple index is cheaper than an attribute).
BODY_AT: tuple[int, ...] = tuple(layout.body_at for layout in LAYOUTS)
STORE_TIMESTAMP_AT: tuple[int, ...] = tuple(layout.store_timestamp_at for layout in LAYOUTS)
# BODY_AT by the value of SYSFLAG's low byte: reading one byte is cheaper than unpacking SYSFLAG.
BODY_AT_BY_HOST_BYTE: tuple[int, ...] = tuple(BODY_AT[(byte & SYSFLAG_HOSTS_V6) >> LAYOUT_SHIFT] for byte in range(256))

HEADER = IPV4.header
HEADER_SIZE = IPV4.body_at  # 88
# TOTALSIZE .. BORNTIMESTAMP (48 bytes): the fields before the first host, the same in every layout.
COMMON_HEADER = struct.Struct(_HEADER_FORMAT.split("{born}")[0])
FIXED_OVERHEAD = HEADER_SIZE + 1 + 2  # 91: the smallest record (IPv4 hosts, nothing else)
MAX_FIXED_OVERHEAD = LAYOUTS[-1].body_at + 1 + 2  # 115: with two IPv6 hosts
BLANK = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE
BLANK_SIZE = BLANK.size  # 8
PREFIX = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE of any record
OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: stamped inside the append lock
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
PROPERTIES_LENGTH = struct.Struct(">h")

MAX_TOPIC_BYTES_V1 = 127
MAX_PROPERTIES_BYTES = 32767

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_DELETE = "DELETE"  # "true" on a COMPACTION topic: a tombstone (mqstore.message_keys)


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_properties(properties: dict[str, str]) -> bytes:
    """Encode as RocketMQ does; entries with an empty name or value are skipped (they would not decode)."""
    parts = [f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}" for name, value in properties.items()
             if name and value]
    return "".join(parts).encode("utf-8")


def topic_part(topic: bytes) -> bytes:
    """TOPICLENGTH + TOPIC, shared by every record of a batch."""
    return bytes((len(topic),)) + topic


def encode_parts(parts: list, topic_part_bytes: bytes, body: bytes, properties: bytes, queue_id: int,
                 flag: int, sys_flag: int, born_timestamp_ms: int, born_host: bytes, born_port: int,
                 store_host: bytes, store_port: int, prepared_transaction_offset: int,
                 reconsume_times: int = 0, crc: int | None = None) -> int:
    """Append one record's pieces to ``parts`` (for one ``b"".join`` per batch); returns its size.
    Queue offset, physical offset and store time are zero, stamped later (:func:`stamp`). ``crc``: the
    body's BODYCRC when known (a stored record's body written again: the timer's copies), else computed.

    The hosts' address sizes (4 bytes IPv4, 16 IPv6) choose the layout, and the SYSFLAG host bits
    are set to say so, whatever ``sys_flag`` held: they must always describe the bytes."""
    if len(born_host) == IPV4_BYTES and len(store_host) == IPV4_BYTES:
        layout = IPV4
        sys_flag &= ~SYSFLAG_HOSTS_V6
    else:
        layout = _layout_for_hosts(born_host, store_host)
        sys_flag = sys_flag & ~SYSFLAG_HOSTS_V6 | layout.sys_flag_bits
    body_len = len(body)
    total = layout.body_at + 2 + len(topic_part_bytes) + body_len + len(properties)
    if crc is None:
        crc = zlib.crc32(body) & 0x7FFFFFFF
    parts += (layout.header.pack(total, MAGIC_V1, crc, queue_id, flag, 0, 0, sys_flag,
                                 born_timestamp_ms, born_host, born_port, 0, store_host, store_port,
                                 reconsume_times, prepared_transaction_offset, body_len),
              body, topic_part_bytes, PROPERTIES_LENGTH.pack(len(properties)), properties)
    return total


def _layout_for_hosts(born_host: bytes, store_host: bytes) -> Layout:
    for name, host in (("born", born_host), ("store", store_host)):
        invariant(len(host) in (IPV4_BYTES, IPV6_BYTES), f"a {name} host address has 4 or 16 bytes, not {len(host)}")
    return LAYOUTS[(len(born_host) == IPV6_BYTES) | (len(store_host) == IPV6_BYTES) << 1]


def stamp(buf: bytearray, position: int, queue_offset: int, physical_offset: int,
          store_timestamp_ms: int) -> None:
    """Fill the fields known only inside the append lock (the record's own SYSFLAG gives its layout)."""
    OFFSETS.pack_into(buf, position + QUEUE_OFFSET_AT, queue_offset, physical_offset)
    layout = (buf[position + SYS_FLAG_HOST_BYTE_AT] & SYSFLAG_HOSTS_V6) >> LAYOUT_SHIFT
    INT64.pack_into(buf, position + STORE_TIMESTAMP_AT[layout], store_timestamp_ms)


def takes_queue_offset(sys_flag: int) -> bool:
    """Whether a record of this SYSFLAG takes a queue offset and a consume queue entry."""
    return sys_flag & SYSFLAG_TX_MASK not in NO_QUEUE_OFFSET_TX


def encode_blank(size_bytes: int) -> bytes:
    return BLANK.pack(size_bytes, MAGIC_BLANK)


def msg_id_prefix(store_host: bytes, store_port: int) -> str:
    """The part of an offset message id before the physical offset (hex of host address and port)."""
    return (store_host + INT32.pack(store_port)).hex().upper()


def offset_msg_id(store_host: bytes, store_port: int, physical_offset: int) -> str:
    """RocketMQ's offset message id: uppercase hex of host address, 4-byte port, 8-byte offset."""
    return f"{msg_id_prefix(store_host, store_port)}{physical_offset:016X}"


def parse_offset_msg_id(msg_id: str) -> tuple[bytes, int, int]:
    """Returns (host address, port, physical offset); raises ValueError when it is not one."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"an offset message id has 32 (IPv4) or 56 (IPv6) hex characters, not {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    host_len = len(raw) - 12
    port = INT32.unpack_from(raw, host_len)[0]
    physical_offset = INT64.unpack_from(raw, host_len + 4)[0]
    return raw[:host_len], port, physical_offset
