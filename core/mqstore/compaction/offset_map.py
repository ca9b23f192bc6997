"""The key -> latest position map of a round, keyed by the MD5 digest of the key (reference §6.5).

As RocketMQ (and Kafka's cleaner) do: one flat open-addressing table of fixed-size slots in one byte
array, linear probing, no object per key. At the load factor of 0.75 a key costs
:data:`ENTRY_COST_BYTES` (32) of the budget: ``capacity`` = budget // 32 keys, ``slots`` =
capacity * 4 // 3 + 1 (always more slots than keys, so a probe ends at an empty slot).

  slot (24 bytes, at 24 * i)   field
  ---------------------------- ------------------------------------------------------------------
  0..15                        the key's MD5 digest
  16..23                       value + 1, int64 little-endian (0: the slot is empty)

A key's home slot is the digest's bytes 8..15 (little-endian) mod ``slots``; the probe goes on to
the next slot (wrapping) until the digest or an empty slot. The bytes 0..3 are left to rounds.py,
which splits keys into buckets by them. The value is a queue offset (the Spark job's map) or an
entry index of the sealed segments (the local round's buckets): anything that grows in log order.

:class:`PyOffsetMap` is the reference; the compiled codec's ``_offset_map.OffsetMap`` has the same
layout and behaviour, and tests/property/test_codec_offset_map.py requires the same tables and
results from both. :data:`OffsetMap` is the one in use (mqstore.codec chooses).

When the map is full a put of a new key is refused (``can_put`` is False, ``put_pairs`` stops there):
the round then splits its bucket further (rounds.py), so a round never fails for its budget.
"""

from __future__ import annotations

import hashlib
import struct

from mqstore import codec
from mqstore.errors import InvalidArgument, invariant

ENTRY_COST_BYTES = 32       # a 24-byte slot at the load factor of 0.75
SLOT_BYTES = 24
PAIR = struct.Struct("<16sq")  # a (digest, value) pair as the round's bucket files hold them: 24 bytes
_VALUE = struct.Struct("<q")
_HOME = struct.Struct("<Q")


def digest(key: str) -> bytes:
    return hashlib.md5(key.encode("utf-8")).digest()


def capacity_of(memory_bytes: int) -> int:
    """The keys a budget of ``memory_bytes`` holds (InvalidArgument if none)."""
    if memory_bytes < ENTRY_COST_BYTES:
        raise InvalidArgument(f"offset_map_memory_bytes {memory_bytes} holds no key; at least "
                              f"{ENTRY_COST_BYTES} (one key) is needed")
    return memory_bytes // ENTRY_COST_BYTES


def slots_of(capacity: int) -> int:
    return capacity * 4 // 3 + 1


class PyOffsetMap:
    """The reference map. Not thread-safe: owned by one round."""

    def __init__(self, memory_bytes: int):
        self.capacity = capacity_of(memory_bytes)
        self.slots = slots_of(self.capacity)
        self.table = bytearray(self.slots * SLOT_BYTES)
        self.size = 0
        self.last_offset = -1  # the value of the last put (the Spark job sets its mapped range's end)

    def __len__(self) -> int:
        return self.size

    def clear(self) -> None:
        """Empty the map (its table stays allocated); last_offset goes back to -1."""
        self.table[:] = bytes(len(self.table))
        self.size, self.last_offset = 0, -1

    def _find(self, key_digest: bytes) -> tuple[int, bool]:
        """(slot, whether it holds the digest): the digest's slot, or the empty slot its probe ended at."""
        invariant(len(key_digest) == 16, "a key digest is 16 bytes")
        i = _HOME.unpack_from(key_digest, 8)[0] % self.slots
        table = self.table
        while True:
            at = i * SLOT_BYTES
            if _VALUE.unpack_from(table, at + 16)[0] == 0:
                return i, False
            if table[at:at + 16] == key_digest:
                return i, True
            i = i + 1 if i + 1 < self.slots else 0

    def can_put(self, key_digest: bytes) -> bool:
        """False only when the key is new and the map is full."""
        return self.size < self.capacity or self._find(key_digest)[1]

    def put(self, key_digest: bytes, value: int) -> None:
        """The later value of a key wins (values are put in log order). The map must have room
        (:meth:`can_put`)."""
        invariant(value >= 0, "a map value is a queue offset or entry index, not negative")
        i, found = self._find(key_digest)
        if not found:
            invariant(self.size < self.capacity, "put into a full offset map (ask can_put first)")
            self.table[i * SLOT_BYTES:i * SLOT_BYTES + 16] = key_digest
            self.size += 1
        _VALUE.pack_into(self.table, i * SLOT_BYTES + 16, value + 1)
        self.last_offset = value

    def get(self, key_digest: bytes) -> int | None:
        i, found = self._find(key_digest)
        return _VALUE.unpack_from(self.table, i * SLOT_BYTES + 16)[0] - 1 if found else None

    def put_pairs(self, pairs, min_value: int) -> int:
        """Put the pairs (:data:`PAIR`, in log order) of ``pairs`` whose value is at least ``min_value``;
        stops before the first new key that does not fit. The number of pairs consumed (all of them
        unless the map filled up). ``last_offset`` is left as it was."""
        last, n = self.last_offset, len(pairs) // PAIR.size
        for k in range(n):
            key_digest, value = PAIR.unpack_from(pairs, k * PAIR.size)
            if value < min_value:
                continue
            if not self.can_put(key_digest):
                self.last_offset = last
                return k
            self.put(key_digest, value)
        self.last_offset = last
        return n

    def mark_superseded(self, pairs, bits: bytearray) -> int:
        """Set bit ``value`` (bit v % 8 of byte v // 8) in ``bits`` for each pair of ``pairs`` whose key
        maps to a later value; the number of bits set."""
        marked = 0
        for k in range(len(pairs) // PAIR.size):
            key_digest, value = PAIR.unpack_from(pairs, k * PAIR.size)
            latest = self.get(key_digest)
            if latest is not None and value < latest:
                invariant(value >> 3 < len(bits), "a pair's value indexes the round's bitset")
                bits[value >> 3] |= 1 << (value & 7)
                marked += 1
        return marked


OffsetMap = codec.compiled.OffsetMap if codec.compiled is not None else PyOffsetMap
