"""CommitLogClient's replaced channels (issue 34): during an election a client is redirected to the lost leader
again and again (the replicas name it until its lease lapses), and each time it found that node unreachable it
makes a fresh channel to it. The channel replaced must stay open for the calls made on it: closing it at the
next replacement (milliseconds later in an election) cancelled a write in flight, whose caller was told it
failed though it may land, and failed a call about to start on it with ValueError "Channel closed" (found by the
gateway's send failover test with four sending threads). A stand-in CommitLog on 127.0.0.1 answers GetStoreInfo
after a pause."""

from __future__ import annotations

import concurrent.futures
import threading

import grpc
from mqstore_rpc.commitlog_client import CommitLogClient
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2


def _server(release: threading.Event):
    def store_info(request, context):
        release.wait(10)
        return commitlog_pb2.StoreInfo(max_physical_offset=7)
    handler = grpc.unary_unary_rpc_method_handler(
        store_info, request_deserializer=commitlog_pb2.GetStoreInfoRequest.FromString,
        response_serializer=commitlog_pb2.StoreInfo.SerializeToString)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("mqstore.v1.CommitLog",
                                                                          {"GetStoreInfo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_channels_replaced_in_a_burst_keep_serving_the_calls_made_on_them():
    release = threading.Event()
    server, address = _server(release)
    client = CommitLogClient(address, rpc_timeout_s=10)
    try:
        old_stub = client._stub
        in_flight = old_stub.GetStoreInfo.future(commitlog_pb2.GetStoreInfoRequest(), timeout=10)
        for _ in range(5):  # found unreachable, then named leader again: a fresh channel each time
            client._next_node(address)
            client._use(address, fresh=True)
        assert client._stub is not old_stub
        release.set()
        assert in_flight.result().max_physical_offset == 7            # not cancelled by a close
        assert old_stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10).max_physical_offset == 7
        assert client.store_info().max_physical_offset == 7
    finally:
        release.set()
        client.close()
        server.stop(None)
