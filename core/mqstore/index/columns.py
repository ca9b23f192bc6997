"""Tail frame bytes -> the compiled codec's IndexColumns (mqstore.codec._index), for IndexStore.apply.

The compiled path of decode.decode_frame + records.index_keys + the writer's hashes: per record its
physical offset, store time and the hashes of ``topic#key`` for the keys it indexes, as flat columns, with
no Python object per record. The damage handling is decode_frame's, in the same steps: the C walk stops
at the first record that fails its checks; the reference says why (record_scan.index_walk on that one
record) and where decoding goes on (decode._after_damaged). A record whose keys the C rules do not cover
(text that is not valid UTF-8, very many keys) gets its hashes from the reference (:class:`_Reference`).
tests/property/test_codec_index.py holds the two paths to the same index files and outcomes.
"""

from __future__ import annotations

from typing import NamedTuple

from mqstore import codec
from mqstore.errors import invariant
from mqstore.format import record_scan
from mqstore.format.index_file import key_hashes
from mqstore.javahash import java_hash_prefix

from .decode import DamagedRange, _after_damaged, _index_records
from .records import index_keys, query_key


class DecodedColumns(NamedTuple):
    columns: object               # mqstore.codec IndexColumns
    damaged: list[DamagedRange]


def available() -> bool:
    """True when the compiled codec is in use (else decode.decode_frame is the only path)."""
    return codec.compiled is not None


def decode_columns(data: bytes, next_physical_offset: int, max_keys: int) -> DecodedColumns:
    """Every record of one frame of an unfiltered Tail that passes its checks, as IndexColumns, and the
    ranges that do not: decode.decode_frame's records and ranges (see there), in columns."""
    columns = codec.compiled.IndexColumns(max_keys, _Reference(max_keys))
    limit = len(data)
    base = next_physical_offset - limit
    damaged: list[DamagedRange] = []
    position = 0
    while position < limit:
        stop = columns.add(data, position, base)
        if stop >= limit:
            break
        walked = record_scan.index_walk(data, stop, verify_crc=True, base=base)  # why the record at stop fails
        invariant(not walked.fields and walked.stop == stop and walked.error is not None,
                  f"the compiled walk stopped at {stop}, the reference at {walked.stop}")
        position = _after_damaged(data, stop, base)
        damaged.append(DamagedRange(base + stop, base + position, str(walked.error)))
    return DecodedColumns(columns, damaged)


class _Reference:
    """The keys of one record by the reference rules: (hashes, keys dropped, topic). Stateless."""

    def __init__(self, max_keys: int):
        self.max_keys = max_keys

    def __call__(self, physical_offset: int, sys_flag: int, store_timestamp_ms: int, topic: bytes,
                 raw_properties: bytes) -> tuple[list[int], int, str]:
        [record] = _index_records([(physical_offset, sys_flag, store_timestamp_ms, topic, raw_properties)])
        keys = index_keys(record, self.max_keys)
        if not keys.keys:
            return [], keys.dropped, record.topic
        return key_hashes(java_hash_prefix(query_key(record.topic, "")), keys.keys), keys.dropped, record.topic
