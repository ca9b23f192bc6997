"""CRC-64/NVME (S3's ``x-amz-checksum-crc64nvme``) bit by bit from its definition, for tests: polynomial
0xAD93D23594C93659 bit-reflected (0x9A6C9329AC4BC9B5), input and output reflected, initial value and final XOR all
ones; its check value (of b"123456789") is 0xAE8B14860A799888. Slow (a table loop in Python): for test data only."""

from __future__ import annotations

import base64

POLY_REFLECTED = 0x9A6C9329AC4BC9B5
MASK = (1 << 64) - 1
CHECK = 0xAE8B14860A799888


def _table() -> list[int]:
    table = []
    for byte in range(256):
        reg = byte
        for _ in range(8):
            reg = (reg >> 1) ^ POLY_REFLECTED if reg & 1 else reg >> 1
        table.append(reg)
    return table


_TABLE = _table()


def crc64nvme(data: bytes, crc: int = 0) -> int:
    """The CRC of ``data`` continuing from ``crc`` (0: from the start)."""
    reg = crc ^ MASK
    table = _TABLE
    for byte in bytes(data):
        reg = table[(reg ^ byte) & 0xFF] ^ (reg >> 8)
    return reg ^ MASK


def header_value(data: bytes) -> str:
    """What S3's ``x-amz-checksum-crc64nvme`` header holds for ``data``: the CRC big-endian, base64."""
    return base64.b64encode(crc64nvme(data).to_bytes(8, "big")).decode()
