"""Index gRPC servicer: a thin adapter from mqstore.v1 Index requests to one IndexQueries call each.

It never catches: mqstore errors (InvalidArgument, NotFound, RangeNotIndexed = FAILED_PRECONDITION,
Unavailable when the commit log cannot be reached) become status codes in mqstore_rpc.errors'
interceptor. Thread-safe: no state beyond the IndexQueries, which is thread-safe.
"""

from __future__ import annotations

import grpc
from mqstore_rpc.convert import stored_message
from mqstore_rpc.gen.mqstore.v1 import index_pb2, index_pb2_grpc

from mqstore.index.lookup import IndexQueries, Page, ServiceStats

SERVICE_NAME = index_pb2.DESCRIPTOR.services_by_name["Index"].full_name


def page_response(page: Page, include_messages: bool) -> index_pb2.QueryByKeyResponse:
    response = index_pb2.QueryByKeyResponse(
        next_page_token=page.next_page_token or "", index_reads=page.index_reads,
        files_searched=page.files_searched, collisions_removed=page.collisions_removed,
        missing_removed=page.missing_removed)
    for m in page.messages:
        r = m.record
        response.locators.add(topic=r.topic, physical_offset=r.physical_offset, store_timestamp_ms=r.store_timestamp_ms,
                              queue_id=r.queue_id, queue_offset=r.queue_offset, msg_id=m.msg_id, uniq_key=m.uniq_key)
    if include_messages:
        for m in page.messages:
            stored_message(m, response.messages.add)
    return response


def stats_response(s: ServiceStats) -> index_pb2.IndexStats:
    store = s.store
    return index_pb2.IndexStats(
        unsealed_files=store.files_unsealed, compact_files=store.files_compact_local,
        tiered_files=store.files_compact_tier, entries=store.entries,
        indexed_physical_offset=store.next_physical_offset or 0,
        log_end_physical_offset=s.follower.log_end_physical_offset, bytes_behind=s.bytes_behind,  # None: unset
        reads_per_query=store.reads_per_query, queries=store.queries, connected=s.follower.connected,
        rebuilding_ranges=[f"[{r.start_physical_offset}, {r.end_physical_offset})" for r in store.needs_rebuild],
        healthy=not s.problem, last_error=s.last_error, records_indexed=store.records_applied,
        max_reads_per_file=store.max_reads_per_file, reconnects=s.follower.reconnects,
        checkpoint_physical_offset=store.checkpoint_physical_offset or 0, skipped_bytes=s.follower.skipped_bytes,
        damaged_ranges=[index_pb2.DamagedRange(start_physical_offset=d.start_physical_offset,
                                               end_physical_offset=d.end_physical_offset, reason=d.reason)
                        for d in s.follower.damaged_ranges],
        damaged_bytes=s.follower.damaged_bytes)


class IndexServicer(index_pb2_grpc.IndexServicer):
    def __init__(self, queries: IndexQueries):
        self._queries = queries

    def QueryByKey(self, request, context):
        page = self._queries.by_key(request.topic, request.key, request.begin_ms, request.end_ms, request.max_num,
                                    request.page_token or None, request.include_messages)
        return page_response(page, request.include_messages)

    def QueryByUniqKey(self, request, context):
        page = self._queries.by_uniq_key(request.topic, request.uniq_key, request.include_messages)
        return page_response(page, request.include_messages)

    def QueryByTime(self, request, context):
        offset = self._queries.by_time(request.topic, request.queue_id, request.timestamp_ms)
        return index_pb2.QueryByTimeResponse(offset=offset)

    def Stats(self, request, context):
        return stats_response(self._queries.stats())


def add_to_server(servicer: IndexServicer, server: grpc.Server) -> None:
    index_pb2_grpc.add_IndexServicer_to_server(servicer, server)
