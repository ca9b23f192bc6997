"""The client every other service uses to talk to the CommitLog service, in mqstore's plain types.

Calls take and return mqstore.model data (MessageIn, AppendResult, StoredMessage, TailFrame,
StoreInfo, QueueInfo, PullResult), so that a service's domain code never sees grpc or a proto. Every
call has a timeout; every gRPC error becomes the mqstore exception it came from
(mqstore_rpc.remote_errors): ``Unavailable`` when the log cannot be reached, ``OutOfRange`` with the
valid range, ``NotFound``, ``DataLoss`` and so on. The Tail stream satisfies mqstore.follow.TailSource.

A replication group: ``address`` may list every node (``host:port,host:port,...``). The client uses one
at a time; when it cannot be reached, the next one is used from the next call on (a read that failed so
is retried there once); a write that reaches a replica gets NotLeader naming the leader and is sent there
(nothing was written on the replica, so this is no duplicate). A Tail resumes on whichever node answers
at the same physical offset: the logs are byte-identical, and a node shows readers only what every in-sync
node holds, so nothing a follower applied can be cut by a failover.

A write that a listed leader leaves unanswered for ``leader_probe_s`` (0.25 s; a SYNC append normally
takes milliseconds) is not simply waited out to ``rpc_timeout_s``: every ``leader_probe_s`` the client
asks the other listed nodes (Replication.GetReplicationState, each within 1 s) whether one
of them now leads, unfenced. When one does, the call is cancelled and raises ``Unavailable`` (it may or may
not have been written: the old leader may have written, even replicated, it without acknowledging), and
the next calls go to the new leader. So after a SIGSTOP of the leader, a writer reaches the new leader
within ``leader_probe_s`` of its election, where it waited its whole deadline before. A leader that is
merely slow keeps its call: no other node claims the leadership meanwhile. The same holds for a request of
:meth:`internal_append_batches_async`; a long-polling call (a pop receive) is not probed.

A Tail stream carries a deadline (``stream_deadline_s``): when it expires the stream just ends and the
follower re-opens it at its resume offset. That bounds how long a silently dead connection (no RST,
no heartbeats) can hold a follower, without keepalive pings the server would have to allow. The
channel retries connections quickly (50 ms doubling to ``max_reconnect_backoff_ms``), so a restarted
commit log is found again within that bound rather than gRPC's default of up to 2 minutes.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from typing import Iterator, Sequence

import grpc
import structlog
from mqstore import defaults, errors, model, waits
from mqstore.errors import NotFound, NotLeader, OutOfRange

from mqstore_rpc import convert
from mqstore_rpc.gen.mqstore.v1 import (commitlog_pb2, commitlog_pb2_grpc, common_pb2, consumer_pb2_grpc,
                                        replication_pb2, replication_pb2_grpc)
from mqstore_rpc.peers import Peers
from mqstore_rpc.remote_errors import from_batch_error, from_rpc_error

log = structlog.get_logger()

MAX_MESSAGE_BYTES = defaults.MAX_MESSAGE_BYTES
TOKEN_METADATA = "mqstore-internal-token"  # CommitLogInternal's shared secret (commitlog.proto)
APPEND_BATCHES_STREAM = "/mqstore.v1.CommitLogInternal/AppendBatchesStream"
PROBE_TIMEOUT_S = 1.0  # a probe's GetReplicationState: generous, a loaded node answers late (the write waits anyway)
_BOUNDARIES = {"lower": commitlog_pb2.TIME_BOUNDARY_LOWER, "upper": commitlog_pb2.TIME_BOUNDARY_UPPER}


class TailCall:
    """One Tail call. Iterate once; ``cancel()`` from any thread ends it. A deadline that expires
    ends the iteration cleanly (the caller re-opens); other errors raise mqstore exceptions.
    ``on_unreachable(peer)`` is told of a node that cannot serve the stream: unreachable, or behind it
    (OutOfRange with its visible end below ``from_offset``: a replica that has not yet made visible what
    the follower has already applied, after a failover); the client then uses the next listed node."""

    def __init__(self, call, peer: str, on_unreachable=lambda peer: None, from_offset: int | None = None):
        self._call = call
        self._peer = peer
        self._on_unreachable = on_unreachable
        self._from_offset = from_offset

    def __iter__(self) -> Iterator[model.TailFrame]:
        try:
            for f in self._call:
                yield convert.tail_frame_out(f)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return  # the planned end of this stream (see the module docstring)
            error = from_rpc_error(exc, self._peer)
            if _unreachable(exc) or self._behind(error):
                self._on_unreachable(self._peer)
            raise error from None

    def _behind(self, error: Exception) -> bool:
        return (isinstance(error, OutOfRange) and self._from_offset is not None and error.max_value is not None
                and error.max_value < self._from_offset)

    def cancel(self) -> None:
        self._call.cancel()


class CommitLogClient:
    """Thread-safe (a gRPC channel and stub are). ``close()`` once, after the users have stopped."""

    def __init__(self, address: str, *, rpc_timeout_s: float = 10.0, stream_deadline_s: float = 60.0,
                 fetch_window: int = 64, max_reconnect_backoff_ms: int = 2_000, peers: Peers | None = None,
                 transparent_retries: bool = True, leader_probe_s: float = 0.25):
        """``address``: one node or a comma-separated list of the group's nodes; ``leader_probe_s``: how long a
        write waits before the other listed nodes are asked whether one of them leads now (the module
        docstring; 0 turns the probes off). ``transparent_retries=False``
        turns off grpc's retry machinery on the channels (option ``grpc.enable_retries``): a call that meets a
        broken connection fails at once (Unavailable) rather than being sent again, and each unary call is
        cheaper (measured by the gateway, bench/gateway.py)."""
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
        self.rpc_timeout_s = rpc_timeout_s
        self.stream_deadline_s = stream_deadline_s
        self.fetch_window = fetch_window  # GetMessage calls in flight at a time
        self.leader_probe_s = leader_probe_s
        self._options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.initial_reconnect_backoff_ms", 50),
                         ("grpc.min_reconnect_backoff_ms", 50),
                         ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms),
                         ("grpc.enable_retries", int(transparent_retries))]
        self._peers = peers or Peers()  # TLS and credentials of every node's channel (mqstore_rpc.peers)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._unreached: set[str] = set()  # nodes whose last call failed to reach them
        self._retired: dict[str, grpc.Channel] = {}  # per node, the channel a fresh one replaced (see _use)
        self._aio_channels: dict[str, grpc.aio.Channel] = {}   # internal_append_batches_async's, on its loop
        self._aio_stubs: dict[str, commitlog_pb2_grpc.CommitLogInternalStub] = {}
        self._batches_unimplemented = False  # the log predates AppendBatches: one Append per batch
        self._batch_streams: dict[str, _BatchStream] = {}  # AppendBatchesStream per node, on its loop
        self._sync_streams: dict[str, SyncBatchStream] = {}  # internal_append_batches' stream per node
        self._use(self.addresses[0])

    def _use(self, address: str, fresh: bool = False) -> None:
        """Send the next calls to ``address`` (channels are kept: calls in flight on another go on). ``fresh``:
        a node named leader that this client last found unreachable gets a new channel, which connects at
        once, where the old one would wait out its reconnect backoff (up to ``max_reconnect_backoff_ms``)
        first; the old channel is kept for calls still on it and closed when the next one replaces it."""
        with self._lock:
            channel = self._channels.get(address)
            if channel is not None and fresh and address in self._unreached:
                self._unreached.discard(address)
                retired = self._retired.pop(address, None)
                if retired is not None:
                    retired.close()
                self._retired[address] = channel
                channel = None
            if channel is None:
                channel = self._channels[address] = self._peers.channel(address, self._options)
            self.address = address
            self._stub = commitlog_pb2_grpc.CommitLogStub(channel)
            self._internal = commitlog_pb2_grpc.CommitLogInternalStub(channel)
            self._consumer = consumer_pb2_grpc.ConsumerStub(channel)

    def _next_node(self, failed: str) -> None:
        """``failed`` could not be reached: use the next listed node (if the client still uses it)."""
        with self._lock:
            self._unreached.add(failed)
        if len(self.addresses) > 1 and self.address == failed:
            at = self.addresses.index(failed) if failed in self.addresses else -1
            self._use(self.addresses[(at + 1) % len(self.addresses)])

    def close(self) -> None:
        with self._lock:
            channels, self._channels = [*self._channels.values(), *self._retired.values()], {}
            self._retired = {}
            streams, self._sync_streams = list(self._sync_streams.values()), {}
        for stream in streams:
            stream.end(errors.Unavailable("the client is closing: the batches may or may not have been written"))
        for channel in channels:
            channel.close()

    # ---- reading the log -----------------------------------------------------------------------------
    def tail(self, from_physical_offset: int | None, *, max_frame_bytes: int, heartbeat_ms: int,
             topics: Sequence[str] = (), tx_types: Sequence[int] = (), hold_retention_as: str = "",
             linger_ms: int = 0) -> TailCall:
        """Frames from ``from_physical_offset`` (a record start), or from the earliest record when None;
        with ``topics``/``tx_types`` (SYSFLAG transaction values) only records of those topics or types;
        ``hold_retention_as``: the commit log holds retention below this stream's start for that follower;
        ``linger_ms``: see TailRequest.linger_ms."""
        if from_physical_offset is None:
            request = commitlog_pb2.TailRequest(start=commitlog_pb2.TAIL_START_EARLIEST)
        else:
            request = commitlog_pb2.TailRequest(start=commitlog_pb2.TAIL_START_AT_OFFSET,
                                                from_physical_offset=from_physical_offset)
        request.max_frame_bytes = max_frame_bytes
        request.heartbeat_ms = heartbeat_ms
        request.linger_ms = linger_ms
        request.topics.extend(topics)
        request.transaction_types.extend(convert.tx_type_out(t) for t in tx_types)
        request.hold_retention_as = hold_retention_as
        return TailCall(self._stub.Tail(request, timeout=self.stream_deadline_s), self.address, self._next_node,
                        from_physical_offset)

    def get_messages(self, physical_offsets: Sequence[int]) -> list[model.StoredMessage | None]:
        """GetMessage for each offset, in the same order, ``fetch_window`` calls in flight at a time;
        None where no record starts there any more (NOT_FOUND, OUT_OF_RANGE: retention removed it).
        Any other error (DataLoss for a damaged record, Unavailable) is raised; an unreachable node is not
        asked again, as in ``_call`` (the caller's retry goes to the next listed node)."""
        out: list[model.StoredMessage | None] = []
        for first in range(0, len(physical_offsets), self.fetch_window):
            address, stub = self.address, self._stub
            calls = [stub.GetMessage.future(commitlog_pb2.GetMessageRequest(physical_offset=offset),
                                            timeout=self.rpc_timeout_s)
                     for offset in physical_offsets[first:first + self.fetch_window]]
            try:
                out.extend(self._message(call, address) for call in calls)
            finally:
                for call in calls:
                    call.cancel()  # a no-op for finished calls; stops the rest after an error
        return out

    def get_messages_batch(self, physical_offsets: Sequence[int]) -> list[model.MessageLookup]:
        """One GetMessages call per 1000 offsets: each the message or why not (missing, damaged)."""
        out: list[model.MessageLookup] = []
        for first in range(0, len(physical_offsets), 1000):
            request = commitlog_pb2.GetMessagesRequest(physical_offsets=physical_offsets[first:first + 1000])
            out.extend(convert.get_messages_out(self._call("GetMessages", request)))
        return out

    def _message(self, call, address: str) -> model.StoredMessage | None:
        try:
            return convert.stored_message_out(call.result())
        except grpc.RpcError as exc:
            error = from_rpc_error(exc, address)
            if isinstance(error, (NotFound, OutOfRange)):
                return None
            if _unreachable(exc):
                self._next_node(address)
            raise error from None

    def topic(self, name: str) -> model.TopicRecord:
        """DescribeTopic's topic: name, queue count, kind (NotFound for an unknown one)."""
        request = commitlog_pb2.DescribeTopicRequest(name=name)
        return convert.topic_out(self._call("DescribeTopic", request).topic)

    def store_info(self) -> model.StoreInfo:
        return convert.store_info_out(self._call("GetStoreInfo", commitlog_pb2.GetStoreInfoRequest()))

    def queue_info(self, topic: str, queue_id: int) -> model.QueueInfo:
        request = commitlog_pb2.GetQueueInfoRequest(topic=topic, queue_id=queue_id)
        return convert.queue_info_out(self._call("GetQueueInfo", request))

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int, boundary: str = "lower") -> int:
        """First queue offset whose store time is at or after ``timestamp_ms`` ("upper": the last at or before)."""
        request = commitlog_pb2.GetOffsetByTimeRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms,
                                                       boundary=_BOUNDARIES[boundary])
        return self._call("GetOffsetByTime", request).offset

    def pull(self, topic: str, queue_id: int, offset: int, *, max_messages: int = 0, max_bytes: int = 0,
             tags: Sequence[str] = (), long_poll_ms: int = 0, sql: str = "") -> model.PullResult:
        """Pull as the CommitLog API documents it (``sql``: an SQL92 filter_expression); the timeout is
        ``rpc_timeout_s`` beyond the long poll."""
        request = commitlog_pb2.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=max_messages,
                                            max_bytes=max_bytes, tags=tags, long_poll_ms=long_poll_ms)
        if sql:
            request.filter_type, request.filter_expression = common_pb2.FILTER_TYPE_SQL92, sql
        return convert.pull_result(self._call("Pull", request, long_poll_ms / 1000))

    def topic_kinds(self) -> dict[str, str]:
        """Topic name -> kind (mqstore.model.KIND_*) of every user topic."""
        return {name: t.kind for name, t in self.user_topics().items()}

    def user_topics(self) -> dict[str, model.TopicRecord]:
        """Topic name -> topic (kind, start_physical_offset, ...) of every user topic."""
        response = self._call("ListTopics", commitlog_pb2.ListTopicsRequest())
        return {t.name: convert.topic_out(t) for t in response.topics}

    # ---- writing -------------------------------------------------------------------------------------
    def append(self, topic: str, messages: Sequence[model.MessageIn]) -> list[model.AppendResult]:
        """One Append call: the batch is stored whole or not at all; one result per message, in order."""
        request = commitlog_pb2.AppendRequest(topic=topic, messages=[convert.message_input(m) for m in messages])
        return [convert.append_result_out(r) for r in self._call("Append", request, write=True).results]

    def recall_timer(self, topic: str, msg_id: str) -> int:
        """RecallTimer (commitlog.proto): cancel the delayed message whose Append returned ``msg_id``; its due time
        (NotFound, FailedPrecondition when due already)."""
        request = commitlog_pb2.RecallTimerRequest(topic=topic, msg_id=msg_id)
        return self._call("RecallTimer", request, write=True).deliver_at_ms

    def internal_append(self, topic: str, messages: Sequence[model.MessageIn], *, writer: str,
                        token: str) -> list[model.AppendResult]:
        """CommitLogInternal.Append (commitlog.proto): for the service that owns ``topic`` or writes COMMIT
        records; ``token`` is the shared secret (PermissionDenied without the right one)."""
        request = commitlog_pb2.InternalAppendRequest(topic=topic, writer=writer,
                                                      messages=[convert.internal_message(m) for m in messages])
        response = self._call("Append", request, metadata=((TOKEN_METADATA, token),), write=True, service="internal")
        return [convert.append_result_out(r) for r in response.results]

    def internal_append_batches(self, batches: Sequence[tuple[str, Sequence[model.MessageIn]]], *, writer: str,
                                token: str) -> list[list[model.AppendResult] | errors.MqStoreError]:
        """CommitLogInternal.AppendBatches for a thread (the gateway's coalesced sends,
        mqstore.gateway.coalescing): the outcomes of :meth:`internal_append_batches_async`, each batch's
        results or the error it would have raised alone, in order; a failure of the whole request raises,
        with :meth:`_call`'s leader-following. Sent as a request of an AppendBatchesStream kept open to the
        node (SyncBatchStream; a request unanswered within ``rpc_timeout_s`` tears it down, Unavailable),
        or, when the client lists a group's nodes, as one unary call probed as :meth:`_call`'s writes. A
        commit log older than AppendBatches (UNIMPLEMENTED: nothing was written) gets one Append per batch
        from then on."""
        if self._batches_unimplemented:
            return self._append_batches_one_by_one_sync(batches, writer, token)
        metadata = ((TOKEN_METADATA, token),)
        probing = self.leader_probe_s > 0 and len(self.addresses) > 1
        if probing:
            request = commitlog_pb2.InternalAppendBatchesRequest(writer=writer, batches=[
                commitlog_pb2.InternalAppendBatch(topic=topic, messages=[convert.internal_message(m) for m in messages])
                for topic, messages in batches])
        else:  # the stream's request, serialized straight from the MessageIn (no proto object per message)
            request = convert.internal_batches_request(writer, batches)
        for attempt in range(2):
            address = self.address
            try:
                with waits.waiting():  # a handler calling another service: the handler pool runs others meanwhile
                    if probing:  # a group's nodes: one unary call, probed (the module docstring)
                        response = self._write_probing(self._internal.AppendBatches, request, self.rpc_timeout_s,
                                                       metadata, address)
                    else:
                        response = self._sync_stream(address, metadata).request(request, self.rpc_timeout_s)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._batches_unimplemented = True
                    log.warning("commitlog_client.append_batches_unimplemented", address=address,
                                hint="the commit log predates CommitLogInternal.AppendBatches: one Append per batch "
                                     "until this client restarts; upgrade the commit log")
                    return self._append_batches_one_by_one_sync(batches, writer, token)
                error = self._failed(exc, address, attempt, write=True)
                if error is None:
                    continue
                raise error from None
            return _batch_outcomes(response, len(batches), address)
        raise AssertionError("unreachable: the loop returns or raises")

    def _sync_stream(self, address: str, metadata) -> SyncBatchStream:
        """The AppendBatchesStream open to ``address`` (a new one when there is none or it has ended)."""
        with self._lock:
            stream = self._sync_streams.get(address)
            if stream is None or stream.error is not None:
                channel = self._channels.get(address)
                if channel is None:
                    channel = self._channels[address] = self._peers.channel(address, self._options)
                # Requests go as serialized bytes (convert.internal_batches_request): no serializer
                call = channel.stream_stream(APPEND_BATCHES_STREAM, request_serializer=None,
                                             response_deserializer=commitlog_pb2.InternalAppendBatchesResponse.FromString)
                stream = self._sync_streams[address] = SyncBatchStream(
                    lambda requests: call(requests, metadata=metadata), address)
            return stream

    def _append_batches_one_by_one_sync(self, batches, writer: str, token: str):
        """:meth:`internal_append_batches`' outcomes from one CommitLogInternal.Append per batch (an older log)."""
        outcomes: list[list[model.AppendResult] | errors.MqStoreError] = []
        for topic, messages in batches:
            try:
                outcomes.append(self.internal_append(topic, messages, writer=writer, token=token))
            except errors.MqStoreError as exc:
                outcomes.append(exc)
        return outcomes

    async def internal_append_batches_async(
            self, batches: Sequence[tuple[str, Sequence[model.MessageIn]]], *, writer: str,
            token: str) -> list[list[model.AppendResult] | errors.MqStoreError]:
        """CommitLogInternal.AppendBatches (commitlog.proto) on grpc.aio, for a caller on an event loop
        (Cluster mode's Transaction port): several topics' batches at once, each all or nothing with its
        own outcome, returned in order: its results, or the error it would have raised as
        :meth:`internal_append` (a failure of the whole request raises, as there). Sent as a request of
        an AppendBatchesStream kept open to the node in use (one message of an open stream costs both
        ends about half a unary call), with the same leader-following and errors as :meth:`_call`; a
        request not answered within ``rpc_timeout_s`` tears the stream down (Unavailable: it may or may
        not have been written) and the next one opens another. The channel and streams are opened on
        the caller's loop (one loop per client: :meth:`close_async` closes them on it). A commit log
        older than the stream (UNIMPLEMENTED: it did nothing) gets one Append per batch from then on."""
        if self._batches_unimplemented:
            return await self._append_batches_one_by_one(batches, writer, token)
        request = commitlog_pb2.InternalAppendBatchesRequest(writer=writer, batches=[
            commitlog_pb2.InternalAppendBatch(topic=topic, messages=[convert.internal_message(m) for m in messages])
            for topic, messages in batches])
        try:
            response, address = await self._on_batch_stream(request, token)
        except _Unimplemented:  # a commit log older than AppendBatches (a rolling upgrade): nothing was written
            self._batches_unimplemented = True
            log.warning("commitlog_client.append_batches_unimplemented", address=self.address,
                        hint="the commit log predates CommitLogInternal.AppendBatches: one Append per batch until "
                             "this client restarts; upgrade the commit log")
            return await self._append_batches_one_by_one(batches, writer, token)
        return _batch_outcomes(response, len(batches), address)

    async def _on_batch_stream(self, request, token: str):
        """(response, address) of ``request`` on this loop's AppendBatchesStream to the node in use, opened
        when there is none or it ended; :meth:`_call`'s leader-following and errors. No answer within
        ``rpc_timeout_s``: the stream is torn down (everything it still owed has an unknown outcome)."""
        for attempt in range(2):
            address = self.address
            stream = self._batch_streams.get(address)
            if stream is None or stream.error is not None:
                stub = self._aio_stub(address)
                metadata = ((TOKEN_METADATA, token), *self._peers.metadata())
                stream = self._batch_streams[address] = _BatchStream(stub.AppendBatchesStream(metadata=metadata))
            answer = await stream.send(request)
            try:
                return await self._answer_probing(answer, address), address
            except asyncio.TimeoutError:
                error = errors.Unavailable(f"{address} did not answer AppendBatches within {self.rpc_timeout_s:g} s: "
                                           f"the batches may or may not have been written")
                stream.end(error)
                _abandon(answer)
                raise error from None
            except _LeaderMoved as moved:
                error = errors.Unavailable(f"{address} did not answer AppendBatches within {self.leader_probe_s:g} s "
                                           f"and {moved.leader} leads now: the batches may or may not have been "
                                           f"written; the next calls go to {moved.leader}")
                stream.end(error)
                _abandon(answer)
                self._use(moved.leader, fresh=True)
                raise error from None
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise _Unimplemented("AppendBatchesStream") from None
                error = self._failed(exc, address, attempt, write=True)
                if error is None:
                    continue  # NotLeader: this request was not processed; send it to the leader
                raise error from None
        raise AssertionError("unreachable: the loop returns or raises")

    async def _answer_probing(self, answer: asyncio.Future, address: str):
        """``answer``'s result within ``rpc_timeout_s`` (else TimeoutError); unanswered after each
        ``leader_probe_s``, the other nodes are asked whether one leads now (_LeaderMoved), as a write of
        :meth:`_call` does."""
        if self.leader_probe_s <= 0 or len(self.addresses) < 2:
            return await _within(answer, self.rpc_timeout_s)
        deadline = asyncio.get_running_loop().time() + self.rpc_timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise asyncio.TimeoutError()
            try:
                return await asyncio.wait_for(asyncio.shield(answer), min(left, self.leader_probe_s))
            except asyncio.TimeoutError:
                if left <= self.leader_probe_s:
                    raise
            leader = await asyncio.to_thread(self.leader_elsewhere, address)
            if leader:
                raise _LeaderMoved(leader)

    def _aio_stub(self, address: str) -> commitlog_pb2_grpc.CommitLogInternalStub:
        stub = self._aio_stubs.get(address)
        if stub is None:
            channel = self._aio_channels[address] = self._peers.aio_channel(address, self._options)
            stub = self._aio_stubs[address] = commitlog_pb2_grpc.CommitLogInternalStub(channel)
        return stub

    async def _append_batches_one_by_one(self, batches, writer: str, token: str):
        """AppendBatches' outcomes from one CommitLogInternal.Append per batch, in order (an older log)."""
        outcomes: list[list[model.AppendResult] | errors.MqStoreError] = []
        for topic, messages in batches:
            request = commitlog_pb2.InternalAppendRequest(topic=topic, writer=writer,
                                                          messages=[convert.internal_message(m) for m in messages])
            try:
                response, _ = await self._internal_async("Append", request, token)
            except errors.MqStoreError as exc:
                outcomes.append(exc)
            else:
                outcomes.append([convert.append_result_out(r) for r in response.results])
        return outcomes

    async def _internal_async(self, method: str, request, token: str):
        """(response, address) of CommitLogInternal ``method`` on the node in use, on this loop's channel
        to it; :meth:`_call`'s leader-following and errors."""
        metadata = ((TOKEN_METADATA, token), *self._peers.metadata())
        for attempt in range(2):
            address = self.address
            stub = self._aio_stub(address)
            try:
                return await getattr(stub, method)(request, timeout=self.rpc_timeout_s, metadata=metadata), address
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise _Unimplemented(method) from None
                error = self._failed(exc, address, attempt, write=True)
                if error is None:
                    continue
                raise error from None
        raise AssertionError("unreachable: the loop returns or raises")

    async def close_async(self) -> None:
        """End the AppendBatches streams (each awaited to its end: no task of theirs is left pending for the
        loop to destroy when it stops) and close the grpc.aio channels (on their loop)."""
        streams, self._batch_streams = list(self._batch_streams.values()), {}
        for stream in streams:
            await stream.aclose(errors.Unavailable("the client is closing"), self.rpc_timeout_s)
        channels, self._aio_channels, self._aio_stubs = list(self._aio_channels.values()), {}, {}
        for channel in channels:
            await channel.close()

    def consumer_call(self, method: str, request, extra_timeout_s: float = 0.0):
        """``method`` of the Consumer service (pop consumption, consumer.proto) of the node in use, which
        only the leader of a group serves: a replica's NotLeader sends it to the leader. Every pop call
        writes, so an unreachable node is not asked again (the next call goes to the next node)."""
        return self._call(method, request, extra_timeout_s, write=True, service="consumer")

    def _call(self, method: str, request, extra_timeout_s: float = 0.0, metadata=None, *, write: bool = False,
              service: str = "log"):
        """One call on the node in use (``service``: "log", "internal" or "consumer"). Unreachable: the
        next node is used from now on, and a read is retried there once (a write is not: it may have been
        written). NotLeader: a write goes to the leader it names (the replica wrote nothing)."""
        for attempt in range(2):
            address = self.address
            stub = {"log": self._stub, "internal": self._internal, "consumer": self._consumer}[service]
            timeout_s = self.rpc_timeout_s + extra_timeout_s
            try:
                with waits.waiting():  # a handler calling another service: the handler pool runs others meanwhile
                    if write and not extra_timeout_s and self.leader_probe_s > 0 and len(self.addresses) > 1:
                        return self._write_probing(getattr(stub, method), request, timeout_s, metadata, address)
                    return getattr(stub, method)(request, timeout=timeout_s, metadata=metadata)
            except grpc.RpcError as exc:
                error = self._failed(exc, address, attempt, write)
                if error is None:
                    continue
                raise error from None
        raise AssertionError("unreachable: the loop returns or raises")

    def _write_probing(self, method, request, timeout_s: float, metadata, address: str):
        """``method``'s answer, as a plain call; but unanswered after each ``leader_probe_s``, the other nodes are
        asked whether one leads now: then the call is cancelled and Unavailable raised (the module docstring)."""
        call = method.future(request, timeout=timeout_s, metadata=metadata)
        try:
            while True:
                try:
                    return call.result(timeout=self.leader_probe_s)
                except grpc.FutureTimeoutError:
                    pass
                leader = self.leader_elsewhere(address)
                if leader:
                    self._use(leader, fresh=True)
                    log.warning("commitlog_client.leader_moved", silent=address, leader=leader,
                                waited_s=round(self.leader_probe_s, 3))
                    raise errors.Unavailable(f"{address} did not answer within {self.leader_probe_s:g} s and {leader} "
                                             f"leads now: the write may or may not have been written (its leader "
                                             f"never acknowledged it); the next calls go to {leader}")
        finally:
            call.cancel()  # a no-op once it has finished

    def leader_elsewhere(self, silent: str) -> str:
        """A listed node other than ``silent`` that says it leads and is not fenced, or "": every other node
        asked at once (GetReplicationState within PROBE_TIMEOUT_S); one that does not answer, or may not
        be asked (PermissionDenied), counts as not leading."""
        calls = []
        for address in self.addresses:
            if address == silent:
                continue
            with self._lock:
                channel = self._channels.get(address)
                if channel is None:
                    channel = self._channels[address] = self._peers.channel(address, self._options)
            stub = replication_pb2_grpc.ReplicationStub(channel)
            calls.append((address, stub.GetReplicationState.future(replication_pb2.GetReplicationStateRequest(),
                                                                   timeout=PROBE_TIMEOUT_S)))
        found = ""
        for address, call in calls:
            try:
                state = call.result()
            except grpc.RpcError:
                continue
            if state.role == "LEADER" and not state.fenced and not found:
                found = address
        return found

    def _failed(self, exc: grpc.RpcError, address: str, attempt: int, write: bool) -> Exception | None:
        """A call to ``address`` failed: None to send it again (to the node now in use), else the error to
        raise. NotLeader: the leader it names, once; unreachable: the next node, and a read once more."""
        error = from_rpc_error(exc, address)
        if isinstance(error, NotLeader) and error.leader_address and attempt == 0:
            self._use(error.leader_address, fresh=True)
            return None
        if _unreachable(exc):
            self._next_node(address)
            if not write and attempt == 0 and len(self.addresses) > 1:
                return None
        return error


class SyncBatchStream:
    """One open AppendBatchesStream for threads (internal_append_batches; the gateway's sends), one request at
    a time: the caller queues its request for grpc's writer and reads the response itself (no hand-off to
    another thread; callers take turns). One message of an open stream costs both ends less than a unary
    call (bench/gateway.py's floors). A watchdog thread ends the stream when a request is unanswered past its
    timeout. When the stream ends (an error status, a broken connection, the watchdog, :meth:`end`), the
    request in flight and every later one get that error (a grpc.RpcError as the call raised it, or an
    mqstore error) and the client opens a new stream."""

    _END = object()

    def __init__(self, open_call, address: str):
        self.address = address
        self.error: BaseException | None = None
        self._turn = threading.Lock()        # one request in flight
        self._lock = threading.Lock()        # error, deadline
        self._deadline: float | None = None  # monotonic time by which the request in flight must be answered
        self._timeout_s = 0.0
        self._ended = threading.Event()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._call = open_call(iter(self._requests.get, self._END))
        threading.Thread(target=self._watch, name=f"append-batches-{address}", daemon=True).start()

    def request(self, request, timeout_s: float):
        """The response to ``request``; raises the error that ended the stream before it was answered."""
        with self._turn:
            with self._lock:
                if self.error is not None:
                    raise self.error
                self._timeout_s, self._deadline = timeout_s, time.monotonic() + timeout_s
            self._requests.put(request)
            try:
                response = next(self._call)
            except StopIteration:
                error: BaseException = errors.Unavailable(
                    f"{self.address} ended the AppendBatches stream without answering: the batches may or may "
                    f"not have been written")
            except grpc.RpcError as exc:
                error = exc
            else:
                with self._lock:
                    self._deadline = None
                return response
            self.end(error)
            raise self.error

    def _watch(self) -> None:
        """End the stream when the request in flight is unanswered past its deadline (checked every quarter
        of its timeout, at most every 0.25 s)."""
        while not self._ended.wait(min(0.25, self._timeout_s / 4) if self._timeout_s else 0.25):
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
            if late:
                self.end(errors.Unavailable(f"{self.address} did not answer an AppendBatches request within "
                                            f"{self._timeout_s:g} s: the batches may or may not have been written"))

    def end(self, error: BaseException) -> None:
        """No more requests: the one in flight (its read is cancelled) and every later one get ``error``
        (unless the stream had ended already: then its first error)."""
        with self._lock:
            if self.error is None:
                self.error = error
        self._ended.set()
        self._requests.put(self._END)
        self._call.cancel()  # a no-op when it has ended


async def _within(answer: asyncio.Future, timeout_s: float):
    """``answer``'s result, or TimeoutError set on ``answer`` itself after ``timeout_s`` (its caller then ends
    the stream, whose reader skips a done future). The caller wakes straight from the reader's set_result: not
    through wait_for's and a shield's futures, two loop callbacks and two futures per request fewer (issue
    37); a cancelled caller cancels ``answer`` too, which the reader skips likewise."""
    timer = asyncio.get_running_loop().call_later(timeout_s, _time_out, answer)
    try:
        return await answer
    finally:
        timer.cancel()


def _time_out(answer: asyncio.Future) -> None:
    if not answer.done():
        answer.set_exception(asyncio.TimeoutError())


class _BatchStream:
    """One open AppendBatchesStream (on the caller's loop): requests are written in order and each is
    answered by the next response, which a reader task hands to the futures in the order they were
    sent. When the stream ends (an error status, a broken connection, :meth:`end`), every future still
    waiting gets that error and the stream takes no more requests (the client opens a new one)."""

    def __init__(self, call):
        self.call = call
        self.error: BaseException | None = None
        self._pending: collections.deque[asyncio.Future] = collections.deque()
        self._writing = asyncio.Lock()  # a request's place in _pending is its place on the wire
        self._reader = asyncio.ensure_future(self._read())

    async def send(self, request) -> asyncio.Future:
        """The future of ``request``'s response (or of the error that ended the stream)."""
        answer = asyncio.get_running_loop().create_future()
        if self.error is not None:
            answer.set_exception(self.error)
            return answer
        async with self._writing:
            if self.error is not None:
                answer.set_exception(self.error)
                return answer
            self._pending.append(answer)
            try:
                await self.call.write(request)
            except grpc.RpcError as exc:
                self.end(exc)
            except (grpc.aio.BaseError, asyncio.InvalidStateError) as exc:  # the call ended under us
                self.end(errors.Unavailable(f"the AppendBatches stream broke while sending ({type(exc).__name__}): "
                                            f"the batches may or may not have been written"))
        return answer

    async def _read(self) -> None:
        try:
            while True:
                response = await self.call.read()
                if response is grpc.aio.EOF:
                    raise errors.Unavailable("the commit log ended the AppendBatches stream without answering: "
                                             "the batches may or may not have been written")
                if self._pending:
                    answer = self._pending.popleft()
                    if not answer.done():
                        answer.set_result(response)
        except asyncio.CancelledError:
            self.end(errors.Unavailable("the AppendBatches stream was cancelled: the batches may or may not have "
                                        "been written"))
        except (grpc.RpcError, errors.MqStoreError) as exc:
            self.end(exc)
        except Exception as exc:  # a bug (logged): what the stream owed has an unknown outcome
            log.error("commitlog_client.batch_stream_failed", exc_info=exc)
            self.end(errors.Unavailable(f"the AppendBatches stream failed unexpectedly ({type(exc).__name__}, "
                                        f"logged): the batches may or may not have been written"))

    async def aclose(self, error: BaseException, timeout_s: float) -> None:
        """Close it cleanly, in order: no more requests (``send`` answers ``error``), the request stream
        half-closed, so that the commit log answers what it was sent and ends the call; the call's status
        awaited (grpc.aio's status task ends with it); then the reader task, which has seen the end, awaited.
        A stream already ended, or one not ended within ``timeout_s``, is cancelled instead. Nothing of it
        is left pending for the loop to destroy when it stops."""
        if self.error is None:
            self.error = error
            try:
                async with self._writing:  # after the request being written, if any
                    await asyncio.wait_for(self.call.done_writing(), timeout_s)
                await asyncio.wait_for(self.call.code(), timeout_s)
            except (asyncio.TimeoutError, grpc.RpcError, grpc.aio.BaseError, asyncio.InvalidStateError):
                self.call.cancel()  # broken or too slow: the outcome of what it owed is unknown
        else:
            self.call.cancel()  # a no-op when it has ended
        self._reader.cancel()  # a no-op when it has seen the end
        await asyncio.gather(self._reader, return_exceptions=True)
        self.end(error)  # what is still waiting (nothing, after a clean end)

    def end(self, error: BaseException) -> None:
        """No more requests; every one still waiting gets ``error``."""
        if self.error is None:
            self.error = error
            self.call.cancel()
        while self._pending:
            answer = self._pending.popleft()
            if not answer.done():
                answer.set_exception(error)


def _abandon(answer: asyncio.Future) -> None:
    """The caller gives ``answer`` up (it raises its own error instead): the error ``end`` set on it is taken
    here, so the loop does not log "Future exception was never retrieved" when the future is collected."""
    if answer.done() and not answer.cancelled():
        answer.exception()
    else:
        answer.cancel()


class _LeaderMoved(Exception):
    """The node in use did not answer and ``leader`` says it leads now."""

    def __init__(self, leader: str):
        super().__init__(leader)
        self.leader = leader


class _Unimplemented(Exception):
    """The node does not serve this method (grpc UNIMPLEMENTED: it did nothing)."""


def _unreachable(exc: grpc.RpcError) -> bool:
    """The node could not be reached (a transport failure, not an answer of the store: those carry
    their mqstore-error trailer)."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return not any(key == "mqstore-error" for key, _ in trailing or ())


def _batch_outcomes(response, batches: int, address: str) -> list[list[model.AppendResult] | errors.MqStoreError]:
    """An AppendBatches answer's outcomes, in order: each batch's results or the error it would have raised
    alone (both transports: :meth:`CommitLogClient.internal_append_batches` and its ``_async``)."""
    if len(response.results) != batches:
        raise errors.Unavailable(f"{address} answered AppendBatches with {len(response.results)} results for "
                                 f"{batches} batches: the batches may or may not have been written")
    return [[convert.append_result_out(r) for r in outcome.appended.results]
            if outcome.WhichOneof("outcome") == "appended" else from_batch_error(outcome.error, address)
            for outcome in response.results]
