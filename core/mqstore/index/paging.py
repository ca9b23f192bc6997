"""Query limits and the page token.

Results come newest first, i.e. in decreasing physical offset (each message lies in exactly one
file). A page token says where the previous page stopped:

  field             meaning
  ----------------- --------------------------------------------------------------------------
  fingerprint       CRC32 of (topic, key, begin_ms, end_ms): a token only continues its own query
  before_phy        results continue strictly below this physical offset (the last one returned)
  file_phy          the file the scan stopped in (its first physical offset), if it stopped in one
  next_entry        unsealed layout: entry number to continue the chain walk at
  next_ordinal      position in the bucket's chain / run to continue at (both layouts)

``before_phy`` alone is always correct; the position only saves re-reading a long bucket, and is only
good on the instance that issued it (:func:`portable` drops it for another instance). A
position that has become stale (new entries were head-inserted into the writable file) is never past
the right place, and the before_phy filter removes what was already returned.

Encoding (opaque to clients): URL-safe base64 without padding of ``>BBIqqii`` = version (1), flags
(bit 0: before_phy set, bit 1: file position set), fingerprint, before_phy, file_phy, next_entry,
next_ordinal.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

from mqstore import limits
from mqstore.errors import InvalidArgument

TOKEN = struct.Struct(
    ">"
    "B"  # 0  version
    "B"  # 1  flags
    "I"  # 2  fingerprint
    "q"  # 6  before_phy
    "q"  # 14 file_phy
    "i"  # 22 next_entry
    "i"  # 26 next_ordinal
)
VERSION = 1
_HAS_BEFORE = 1
_HAS_FILE = 2
MAX_TIME_MS = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Cursor:
    before_phy: int | None = None
    file_phy: int | None = None
    next_entry: int = 0
    next_ordinal: int = 0


def fingerprint(topic: str, key: str, begin_ms: int, end_ms: int) -> int:
    return zlib.crc32(f"{topic}\x00{key}\x00{begin_ms}\x00{end_ms}".encode("utf-8", "surrogatepass"))


def encode(cursor: Cursor, fp: int) -> str:
    flags = (_HAS_BEFORE if cursor.before_phy is not None else 0) | \
            (_HAS_FILE if cursor.file_phy is not None else 0)
    raw = TOKEN.pack(VERSION, flags, fp, cursor.before_phy or 0, cursor.file_phy or 0,
                     cursor.next_entry, cursor.next_ordinal)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode(token: str, fp: int) -> Cursor:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, flags, token_fp, before, file_phy, entry, ordinal = TOKEN.unpack(raw)
    except (binascii.Error, struct.error, ValueError):
        raise InvalidArgument("page_token is not a token this service issued") from None
    if version != VERSION:
        raise InvalidArgument(f"page_token version {version} is not supported")
    if token_fp != fp:
        raise InvalidArgument("page_token belongs to another query (topic, key or time range differ)")
    if entry < 0 or ordinal < 0:
        raise InvalidArgument("page_token is not a token this service issued")
    return Cursor(before if flags & _HAS_BEFORE else None, file_phy if flags & _HAS_FILE else None,
                  entry, ordinal)


def portable(token: str) -> str:
    """The continuation of ``token`` for any Index instance: only ``before_phy`` (always correct), no file
    position; its query's fingerprint kept (the instance checks it). A position is only good on the
    instance that issued it: another rolls, seals and converts its files at other moments, so there the
    file at ``file_phy`` may be absent, shorter or of the other layout, and skipping the files above it
    skips results. Costs a re-read of the files above. InvalidArgument for a token not issued here."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        fp = TOKEN.unpack(raw)[2]
    except (binascii.Error, struct.error, ValueError):
        raise InvalidArgument("page_token is not a token this service issued") from None
    return encode(Cursor(decode(token, fp).before_phy), fp)


def clamp_max_num(max_num: int, default: int, maximum: int) -> int:
    """0 means the default; above the maximum is clamped (before anything is allocated)."""
    return limits.limit("max_num", max_num, default=default, maximum=maximum)


def check_time_range(begin_ms: int, end_ms: int) -> None:
    if begin_ms < 0 or end_ms < 0:
        raise InvalidArgument(f"begin_ms and end_ms must be >= 0, not {begin_ms}, {end_ms}")
    if begin_ms > end_ms:
        raise InvalidArgument(f"begin_ms {begin_ms} is after end_ms {end_ms}")
