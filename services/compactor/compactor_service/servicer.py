"""Compactor gRPC servicer: a thin adapter from mqstore.v1 Compactor requests to one CompactorApi call each.

It never catches: mqstore errors become status codes in mqstore_rpc.errors' interceptor. Thread-safe: no
state beyond the CompactorApi, which is thread-safe.
"""

from __future__ import annotations

import dataclasses

from mqstore.compaction.api import CompactorApi, Description
from mqstore.format import record_reader
from mqstore.model import StoredMessage
from mqstore_rpc.convert import stored_message
from mqstore_rpc.errors import wire_codec
from mqstore_rpc.gen.mqstore.v1 import compactor_pb2 as pb, compactor_pb2_grpc

from . import scan_wire
from .scan_wire import latest_value

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Compactor"].full_name
_ENGINES = {pb.COMPACTION_ENGINE_AUTO: "auto", pb.COMPACTION_ENGINE_LOCAL: "local", pb.COMPACTION_ENGINE_SPARK: "spark"}


def _message(raw: bytes, into=None):
    return stored_message(StoredMessage(record_reader.decode(raw), ""), into)


def round_report(queue_id: int, info) -> pb.RoundReport:
    s = info.stats
    return pb.RoundReport(queue_id=queue_id, started_ms=info.started_ms, ended_ms=info.ended_ms, engine=info.engine,
                          trigger=info.trigger, result=info.result, passes=s.passes, keys_mapped=s.keys_mapped,
                          records_removed=s.records_removed, tombstones_removed=s.tombstones_removed,
                          tombstones_pending=s.tombstones_pending, bytes_reclaimed=s.bytes_reclaimed)


def description(d: Description) -> pb.QueueDescription:
    qlog, dirt = d.slot.qlog, d.dirt
    return pb.QueueDescription(
        topic=qlog.topic, queue_id=qlog.queue_id, clean_bytes=dirt.clean_bytes, dirty_bytes=dirt.dirty_bytes,
        active_bytes=dirt.active_bytes, dirty_ratio=dirt.dirty_ratio, cleaned_up_to_offset=qlog.cleaned_offset,
        min_offset=d.min_offset, max_offset=d.max_offset, records=d.records, keys=d.keys,
        last_round=round_report(qlog.queue_id, d.info), round_running=d.running,
        tombstones_pending=dirt.tombstones_kept, tombstones_pending_why=d.tombstones_pending_why,
        quarantined=d.quarantined, quarantined_until_ms=d.quarantined_until_ms, failures=d.failures,
        last_error=d.last_error, due=d.due,
        tier=pb.QueueTierStatus(**dataclasses.asdict(d.tier)) if d.tier is not None else None)


class CompactorServicer(compactor_pb2_grpc.CompactorServicer):
    def __init__(self, api: CompactorApi):
        self._api = api

    def Pull(self, request, context):
        pulled = self._api.pull(request.topic, request.queue_id, request.offset, request.max_messages,
                                request.max_bytes)
        response = pb.CompactedPullResponse(next_offset=pulled.next_offset, min_offset=pulled.min_offset,
                                            max_offset=pulled.max_offset)
        for stored in pulled.records:
            if request.raw:
                response.raw_records.append(stored.raw)
            else:
                _message(stored.raw, response.messages.add)
        for s in pulled.skipped:
            response.skipped.add(from_offset=s.from_offset, to_offset=s.to_offset, reason=s.reason)
        return response

    def GetLatest(self, request, context):
        return latest_value(self._api.get_latest(request.topic, request.key))

    def BatchGetLatest(self, request, context):
        response = pb.BatchGetLatestResponse()
        for found in self._api.batch_get_latest(request.topic, list(request.keys)):
            latest_value(found, response.values.add)
        return response

    # Scan answers with serialized pages: the compiled codec writes them from the compaction log's records
    # (scan_wire), the pure-Python one serializes the reference's LatestValue messages.

    @wire_codec(pb.ScanRequest.FromString)
    def Scan(self, request, context):
        cursor, pages = request.cursor, 0
        while context.is_active():
            page, encoded = scan_wire.page(self._api, request.topic, cursor, request.page_size,
                                           request.include_tombstones, request.max_pages)
            cursor, pages = scan_wire.cursor_of(page), pages + 1
            yield encoded
            if page.done or (request.max_pages and pages >= request.max_pages):
                return

    def Compact(self, request, context):
        queue_id = request.queue_id if request.HasField("queue_id") else None
        rounds = self._api.compact(request.topic, queue_id, _ENGINES.get(request.engine, "?"), request.seal_active)
        return pb.CompactResponse(rounds=[round_report(q, info) for q, info in rounds])

    def DescribeQueue(self, request, context):
        return description(self._api.describe(request.topic, request.queue_id))

    def GetQueueOffsets(self, request, context):
        low, high, by_time = self._api.offsets(request.topic, request.queue_id, request.timestamp_ms)
        return pb.QueueOffsets(min_offset=low, max_offset=high, offset_for_time=by_time)

    def Stats(self, request, context):
        s = self._api.stats()
        stats = pb.CompactorStats(connected=s.connected, checkpoint_physical_offset=s.checkpoint_physical_offset,
                                  healthy=not s.problem, problem=s.problem, queues=s.queues,
                                  records_applied=s.records_applied, replica_of=s.replica_of,
                                  role=s.role, active_instance=s.active_instance)
        if s.log_end_physical_offset is not None:  # else unknown: left unset, never 0
            stats.log_end_physical_offset = s.log_end_physical_offset
            stats.bytes_behind = s.bytes_behind
        return stats

    def ListQueues(self, request, context):
        return pb.ListQueuesResponse(queues=[pb.QueueRef(topic=t, queue_id=q, min_offset=low, max_offset=high,
                                                         topic_start_physical_offset=start)
                                             for t, q, low, high, start in self._api.queues()])


def add_to_server(servicer: CompactorServicer, server) -> None:
    compactor_pb2_grpc.add_CompactorServicer_to_server(servicer, server)
