"""A no-op apache.rocketmq.v2 server for bench/gateway.py: ``noop_v2.py`` prints its port, then serves until
stdin closes. It answers routes (8 queues on itself), heartbeats, Telemetry settings (a non-zero body limit
and an exponential backoff, what the clients need) and every SendMessage with OK, storing nothing: the
official client's send loop against it is the client's own ceiling, what no server can beat.
"""

from __future__ import annotations

import sys
from concurrent import futures

import grpc
from google.protobuf import duration_pb2

from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2 as s
from mqstore_rpc.gen.apache.rocketmq.v2 import service_pb2_grpc

OK = d.Status(code=d.OK, message="OK")


class NoopMessaging(service_pb2_grpc.MessagingServiceServicer):
    def QueryRoute(self, request, context):
        broker = d.Broker(name="noop", id=0, endpoints=request.endpoints)
        return s.QueryRouteResponse(status=OK, message_queues=[
            d.MessageQueue(topic=request.topic, id=i, permission=d.READ_WRITE, broker=broker,
                           accept_message_types=[d.NORMAL, d.FIFO, d.TRANSACTION]) for i in range(8)])

    def Heartbeat(self, request, context):
        return s.HeartbeatResponse(status=OK)

    def NotifyClientTermination(self, request, context):
        return s.NotifyClientTerminationResponse(status=OK)

    def SendMessage(self, request, context):
        return s.SendMessageResponse(status=OK, entries=[
            s.SendResultEntry(status=OK, message_id=m.system_properties.message_id) for m in request.messages])

    def Telemetry(self, request_iterator, context):
        for command in request_iterator:
            if command.WhichOneof("command") != "settings":
                continue
            settings = d.Settings()
            settings.CopyFrom(command.settings)
            settings.publishing.max_body_size = 4 << 20
            settings.backoff_policy.CopyFrom(d.RetryPolicy(max_attempts=3, exponential_backoff=d.ExponentialBackoff(
                initial=duration_pb2.Duration(nanos=10_000_000), max=duration_pb2.Duration(seconds=1),
                multiplier=2.0)))
            yield s.TelemetryCommand(status=OK, settings=settings)


def main() -> int:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    service_pb2_grpc.add_MessagingServiceServicer_to_server(NoopMessaging(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()   # until the benchmark closes our stdin
    server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
