"""CRC-64/NVME (S3's ``x-amz-checksum-crc64nvme``) for tests: the pure-Python reference of mqstore.format.crc64
(a table loop, the codec's pure-Python path), which tests/property/test_codec_crc64.py anchors to the standard's check
value (of b"123456789": 0xAE8B14860A799888) and holds the compiled fold to; and what S3's header carries."""

from __future__ import annotations

import base64

from mqstore.format.crc64 import crc64nvme_python

CHECK = 0xAE8B14860A799888  # the standard's check value, of b"123456789" (written here, not taken from the code)

__all__ = ["CHECK", "crc64nvme", "header_value"]


def crc64nvme(data, crc: int = 0) -> int:
    """The CRC of ``data`` continuing from ``crc`` (0: from the start), by the reference loop."""
    return crc64nvme_python(data, crc)


def header_value(data: bytes) -> str:
    """What S3's ``x-amz-checksum-crc64nvme`` header holds for ``data``: the CRC big-endian, base64."""
    return base64.b64encode(crc64nvme(data).to_bytes(8, "big")).decode()
