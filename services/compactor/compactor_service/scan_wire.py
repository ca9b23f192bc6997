"""Scan's pages (mqstore.v1.ScanPage) and LatestValue messages on the wire, by the codec in use (mqstore.codec).

Compiled: the page's walk (mqstore.compaction.reads.scan) hands each chunk of compaction log records (one
buffer and its index columns) to the codec's ``scan_values``, which appends the LatestValue of each live
record to the page's bytes, with no Python object per record. Pure Python (the reference): the walk's
Latest items become LatestValue messages (:func:`latest_value`), serialized. Byte for byte the same
pages, which tests/property/test_codec_scan_page.py checks. The servicer's Scan sends these bytes
(errors.wire_codec: the response serializer passes them through).

Thread-safety: stateless (a page's bytes belong to its call).
"""

from __future__ import annotations

from mqstore import codec
from mqstore.compaction import reads
from mqstore.compaction.api import CompactorApi, cursor_of
from mqstore.format import record_reader
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb

# The codec's scan_values when the compiled codec is in use, else None (the reference).
SCAN_VALUES = codec.compiled.scan_values if codec.compiled is not None else None

__all__ = ["SCAN_VALUES", "cursor_of", "latest_value", "page", "reference_page"]


def latest_value(found, into=None) -> pb.LatestValue:
    if isinstance(found, str):  # a key without value
        return (into or pb.LatestValue)(key=found, found=False)
    body = found.value if found.value is not None else record_reader.body_of(found.stored.raw)
    return (into or pb.LatestValue)(key=found.key, found=True, tombstone=found.tombstone, value=body,
                                    queue_id=found.queue_id, queue_offset=found.stored.entry.queue_offset,
                                    store_timestamp_ms=found.stored.entry.store_timestamp_ms)


def reference_page(page: reads.ScanPage) -> bytes:
    """The serialized ScanPage of a page of Latest items (the reference)."""
    out = pb.ScanPage(next_cursor=cursor_of(page))
    for found in page.items:
        latest_value(found, out.values.add)
    return out.SerializeToString()


def page(api: CompactorApi, topic: str, cursor: str, page_size: int, include_tombstones: bool, max_pages: int,
         scan_values=SCAN_VALUES) -> tuple[reads.ScanPage, bytes]:
    """One page of Scan (CompactorApi.scan) and its serialized ScanPage: written by ``scan_values`` (the
    compiled codec's, by default when it is in use), or by the reference when it is None."""
    if scan_values is None:
        found = api.scan(topic, cursor, page_size, include_tombstones, max_pages)
        return found, reference_page(found)
    out = bytearray()
    encode = scan_values

    def take(qlog, chunk, room: int) -> tuple[int, int]:
        return encode(chunk.data, chunk.start, chunk.positions, chunk.sizes, chunk.offsets, chunk.store_ms,
                      qlog.latest, qlog.queue_id, include_tombstones, room, out)

    found = api.scan(topic, cursor, page_size, include_tombstones, max_pages, take)
    next_cursor = cursor_of(found).encode("ascii")
    if next_cursor:  # ScanPage.next_cursor, left out when empty as proto3 does ("queue:offset": < 128 bytes)
        out += b"\x12" + bytes((len(next_cursor),)) + next_cursor
    return found, bytes(out)
