"""The key -> latest queue offset map of a round, keyed by the MD5 digest of the key (reference §6.5).

RocketMQ packs 24-byte entries (digest + offset) into one open-addressing byte array; a Python dict
keyed by the 16-byte digest is many times faster here, so the budget is charged at what a dict entry
really costs in CPython 3.11: the digest bytes object (49 B), the offset int (32 B) and the dict's
slot and index share (~40 B), rounded to :data:`ENTRY_COST_BYTES`. ``capacity`` = budget // cost.

When the map is full a round does not fail (RocketMQ's "offset map is full"): it stops mapping at
the last record that fit and cleans up to there (rounds.py), so every round makes progress.
"""

from __future__ import annotations

import hashlib

from mqstore.errors import InvalidArgument

ENTRY_COST_BYTES = 128


def digest(key: str) -> bytes:
    return hashlib.md5(key.encode("utf-8")).digest()


class OffsetMap:
    """Not thread-safe: owned by one round."""

    def __init__(self, memory_bytes: int):
        if memory_bytes < ENTRY_COST_BYTES:
            raise InvalidArgument(f"offset_map_memory_bytes {memory_bytes} holds no key; at least "
                                  f"{ENTRY_COST_BYTES} (one key) is needed")
        self.capacity = memory_bytes // ENTRY_COST_BYTES
        self._offsets: dict[bytes, int] = {}
        self.last_offset = -1  # queue offset of the last record put

    def __len__(self) -> int:
        return len(self._offsets)

    def can_put(self, key_digest: bytes) -> bool:
        """False only when the key is new and the map is full."""
        return len(self._offsets) < self.capacity or key_digest in self._offsets

    def put(self, key_digest: bytes, queue_offset: int) -> None:
        """The later offset of a key wins (records are put in log order)."""
        self._offsets[key_digest] = queue_offset
        self.last_offset = queue_offset

    def get(self, key_digest: bytes) -> int | None:
        return self._offsets.get(key_digest)
