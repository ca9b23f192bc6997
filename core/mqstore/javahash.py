"""Java ``String.hashCode`` over UTF-16 code units, as a signed 32-bit int.

RocketMQ's tag codes, index slots and key routing depend on it, so it must match Java exactly,
including surrogate pairs (two code units each) and the overflow wrap.
"""

from __future__ import annotations

import operator

_MASK = 0xFFFFFFFF
_FAST_MAX = 256
# 31^(k-1) ... 31^0 modulo 2^32: the hash of an ASCII string of n characters is the sum of
# character times weight over the last n weights, which map() computes without a Python loop.
_WEIGHTS = [pow(31, _FAST_MAX - 1 - i, 1 << 32) for i in range(_FAST_MAX)]


def java_string_hash(text: str) -> int:
    h = 0
    if text.isascii():
        data = text.encode("ascii")
        n = len(data)
        if n <= _FAST_MAX:
            h = sum(map(operator.mul, data, _WEIGHTS[_FAST_MAX - n:])) & _MASK
        else:
            for unit in data:
                h = (31 * h + unit) & _MASK
    else:
        data = text.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & _MASK
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


_ASCENDING = [pow(31, i, 1 << 32) for i in range(_FAST_MAX + 1)]


def java_hash_prefix(prefix: str) -> int:
    """The state after hashing ``prefix`` (unsigned), to continue with :func:`java_hash_continue`."""
    return java_string_hash(prefix) & _MASK


def java_hash_continue(prefix_state: int, suffix: str) -> int:
    """``java_string_hash(prefix + suffix)`` from the prefix's state, hashing only the suffix:
    h(p + s) = h(p) * 31^len(s) + h(s) modulo 2^32 (the index hashes "topic#" + key for every key)."""
    if not suffix.isascii() or len(suffix) > _FAST_MAX:
        data = suffix.encode("utf-16-be", "surrogatepass")
        h = prefix_state
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & _MASK
    else:
        data = suffix.encode("ascii")
        h = (prefix_state * _ASCENDING[len(data)] + sum(map(operator.mul, data[::-1], _ASCENDING))) & _MASK
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h
