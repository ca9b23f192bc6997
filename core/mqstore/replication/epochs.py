"""The epoch file: which leader epoch wrote which range of the commit log (RocketMQ RIP-44's epoch file,
Kafka's leader-epoch-checkpoint). Source of truth for truncation after a failover; one per node, at
``<data dir>/epochs``; replaced whole through mqstore.fs.replace_file (temp, fsync, rename, fsync dir),
never updated in place.

  offset     size  field          meaning (big-endian)
  ---------- ----- -------------- -----------------------------------------------------------------------
           0     4 magic          0x4D514550 ("MQEP")
           4     2 version        1
           6     2 count          number of entries N (at most MAX_ENTRIES)
           8  16*N entries        N times: epoch (8, unsigned), start offset (8, signed): the physical
                                  offset of the first record written in that epoch; epochs strictly
                                  increase and start offsets never decrease from one entry to the next
      8+16*N     4 crc            zlib CRC32 of bytes 0 .. 8+16*N-1

Epoch e covers [start(e), start(next entry)) of the log, the last one up to the log's end. Bytes below
the first entry's start are epoch 0 (written before replication was set up, or an empty history).
A file that is short, has the wrong magic or version, breaks the order, or fails its CRC raises
DataLoss: the node refuses to start rather than guess which bytes it shares with a leader.
"""

from __future__ import annotations

import pathlib
import struct
import zlib
from dataclasses import dataclass

from mqstore import failpoints, fs
from mqstore.errors import DataLoss, InvalidArgument

MAGIC = 0x4D514550
VERSION = 1
MAX_ENTRIES = 65_535  # count is 16 bits; a leadership change a minute for 45 days
HEADER = struct.Struct(
    ">"
    "I"   # 0 magic
    "H"   # 4 version
    "H"   # 6 count
)
ENTRY = struct.Struct(
    ">"
    "Q"   # 0 epoch
    "q"   # 8 start offset
)
CRC = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class EpochHistory:
    """The ordered entries of one node. Not thread-safe: the replication node (mqstore.replication.node)
    changes it under its own lock; readers take :meth:`entries` (an immutable tuple)."""

    def __init__(self, entries: tuple[EpochEntry, ...] = ()):
        _check_order(entries)
        self._entries = tuple(entries)

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return self._entries

    @property
    def last_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else 0

    def with_entry(self, epoch: int, start_offset: int) -> "EpochHistory":
        """A new history with (epoch, start offset) added; an entry of the same epoch is kept as it is."""
        if self._entries and self._entries[-1].epoch == epoch:
            return self
        return EpochHistory(self._entries + (EpochEntry(epoch, start_offset),))

    def cut_at(self, offset: int) -> "EpochHistory":
        """The history of a log truncated to ``offset``: entries starting above it are dropped (an epoch
        starting exactly there is kept: it wrote nothing that was cut)."""
        return EpochHistory(tuple(e for e in self._entries if e.start_offset <= offset))

    def below(self, offset: int) -> "EpochHistory":
        """The entries whose epoch wrote something below ``offset`` (what a replica holding the log up to
        ``offset`` records of its leader's history)."""
        return EpochHistory(tuple(e for e in self._entries if e.start_offset < offset))

    def end_of(self, epoch: int, log_end: int) -> int:
        """Where ``epoch`` ends in this log: the start of the first later epoch, else ``log_end``."""
        later = [e.start_offset for e in self._entries if e.epoch > epoch]
        return min(later) if later else log_end

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EpochHistory) and other._entries == self._entries

    def __repr__(self) -> str:
        return f"EpochHistory({[(e.epoch, e.start_offset) for e in self._entries]})"


def encode(history: EpochHistory) -> bytes:
    entries = history.entries
    if len(entries) > MAX_ENTRIES:
        raise InvalidArgument(f"an epoch file holds at most {MAX_ENTRIES} entries, not {len(entries)}")
    body = HEADER.pack(MAGIC, VERSION, len(entries)) + b"".join(ENTRY.pack(e.epoch, e.start_offset)
                                                                 for e in entries)
    return body + CRC.pack(zlib.crc32(body))


def decode(data: bytes, where: str = "epoch file") -> EpochHistory:
    if len(data) < HEADER.size + CRC.size:
        raise DataLoss(f"{where}: {len(data)} bytes is shorter than the smallest epoch file")
    magic, version, count = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise DataLoss(f"{where}: not an epoch file of version {VERSION} (magic {magic:#x}, version {version})")
    size = HEADER.size + count * ENTRY.size
    if len(data) != size + CRC.size:
        raise DataLoss(f"{where}: {len(data)} bytes, but {count} entries need {size + CRC.size}")
    (crc,) = CRC.unpack_from(data, size)
    if crc != zlib.crc32(data[:size]):
        raise DataLoss(f"{where}: CRC mismatch; the file is damaged")
    entries = tuple(EpochEntry(*ENTRY.unpack_from(data, HEADER.size + i * ENTRY.size)) for i in range(count))
    try:
        return EpochHistory(entries)
    except InvalidArgument as exc:
        raise DataLoss(f"{where}: {exc}") from None


def load(path: pathlib.Path) -> EpochHistory:
    """The history in ``path``; an empty one when there is no file (a node that never replicated)."""
    try:
        return decode(path.read_bytes(), str(path))
    except FileNotFoundError:
        return EpochHistory()


def save(path: pathlib.Path, history: EpochHistory) -> None:
    """Replace ``path`` crash-safely: a crash leaves the old file or the new one, never a mix."""
    fs.replace_file(path, encode(history), before_rename=lambda: failpoints.hit("replication.epochs.before_rename"))


def _check_order(entries) -> None:
    for prev, cur in zip(entries, entries[1:], strict=False):
        if cur.epoch <= prev.epoch or cur.start_offset < prev.start_offset:
            raise InvalidArgument(f"epoch entries out of order: ({prev.epoch}, {prev.start_offset}) then "
                                  f"({cur.epoch}, {cur.start_offset})")
    for e in entries:
        if e.epoch <= 0 or e.start_offset < 0:
            raise InvalidArgument(f"epoch entry ({e.epoch}, {e.start_offset}): epochs start at 1, offsets at 0")
