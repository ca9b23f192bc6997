"""CRC-64/NVME, the checksum a tier upload record holds of its file (mqstore.format.tier_upload, version 4) and the
one S3 checks every uploaded body against (``x-amz-checksum-crc64nvme``, mqstore.tier.s3): polynomial
0xAD93D23594C93659, bit-reflected input and output, initial value and final XOR all ones; the check value (of
b"123456789") is 0xAE8B14860A799888. :func:`crc64nvme` is the compiled codec's (mqstore.codec: _crc.h, folded with
PCLMULQDQ: ~0.1 CPU s a GB, a sixth of a SHA-256, without the GIL) when it is built, else :func:`crc64nvme_python`,
the reference (a table loop, ~7 MB/s: a node on the pure-Python codec writes SHA-256 records instead,
:data:`FAST`).

Thread-safety: pure functions.
"""

from __future__ import annotations

from mqstore import codec

POLY_REFLECTED = 0x9A6C9329AC4BC9B5
MASK = (1 << 64) - 1
CHECK = 0xAE8B14860A799888  # crc64nvme(b"123456789")


def _table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        reg = byte
        for _ in range(8):
            reg = (reg >> 1) ^ POLY_REFLECTED if reg & 1 else reg >> 1
        table.append(reg)
    return tuple(table)


_TABLE = _table()


def crc64nvme_python(data, crc: int = 0) -> int:
    """The CRC of the bytes-like ``data`` continuing from ``crc`` (0: from the start), a byte at a time."""
    reg = crc ^ MASK
    table = _TABLE
    for byte in memoryview(data).cast("B"):
        reg = table[(reg ^ byte) & 0xFF] ^ (reg >> 8)
    return reg ^ MASK


FAST = codec.compiled is not None  # the compiled fold is there: the uploader records CRC-64/NVME, else SHA-256
crc64nvme = codec.compiled.crc64nvme if codec.compiled is not None else crc64nvme_python
