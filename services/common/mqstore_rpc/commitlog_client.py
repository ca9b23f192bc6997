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

Two transports: synchronous channels for threads (every call here; AppendBatches on a SyncBatchStream,
mqstore_rpc.commitlog_batches) and grpc.aio channels for a caller on an event loop
(:meth:`CommitLogClient.internal_append_batches_async`: mqstore_rpc.commitlog_aio), which share the node in use
and the leader-following written here.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, Sequence

import grpc
import structlog
from mqstore import defaults, errors, model, waits
from mqstore.errors import NotFound, NotLeader, OutOfRange

from mqstore_rpc import convert
from mqstore_rpc.commitlog_aio import AioBatches
from mqstore_rpc.commitlog_batches import SyncBatchStream, batch_outcomes
from mqstore_rpc.gen.mqstore.v1 import (commitlog_pb2, commitlog_pb2_grpc, common_pb2, consumer_pb2_grpc,
                                        replication_pb2, replication_pb2_grpc)
from mqstore_rpc.peers import Peers
from mqstore_rpc.remote_errors import from_rpc_error

log = structlog.get_logger()

MAX_MESSAGE_BYTES = defaults.MAX_MESSAGE_BYTES
TOKEN_METADATA = "mqstore-internal-token"  # CommitLogInternal's shared secret (commitlog.proto)
APPEND_BATCHES_STREAM = "/mqstore.v1.CommitLogInternal/AppendBatchesStream"
LONGEST_POLL_S = 60.0  # a long poll's wait beyond rpc_timeout_s, at most (the gateway's longest is 20 s)
RETIRED_SLACK_S = 5.0  # a replaced channel outlives every call made on it by this much (CommitLogClient._use)
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
        # channels a fresh one replaced (see _use), with when, closed once no call made before can be on them
        self._retired: list[tuple[float, grpc.Channel]] = []
        self._retired_grace_s = rpc_timeout_s + max(stream_deadline_s, LONGEST_POLL_S) + RETIRED_SLACK_S
        self._aio = AioBatches(self, TOKEN_METADATA)  # internal_append_batches_async's transport, on its loop
        self._batches_unimplemented = False  # the log predates AppendBatches: one Append per batch
        self._sync_streams: dict[str, SyncBatchStream] = {}  # internal_append_batches' stream per node
        self._use(self.addresses[0])

    def _use(self, address: str, fresh: bool = False) -> None:
        """Send the next calls to ``address`` (channels are kept: calls in flight on another go on). ``fresh``:
        a node named leader that this client last found unreachable gets a new channel, which connects at
        once, where the old one would wait out its reconnect backoff (up to ``max_reconnect_backoff_ms``)
        first. The old channel is kept until no call can still be on it (the longest a call or stream may
        last, ``_retired_grace_s``), then closed: closing it sooner cancels a write in flight (its caller
        told it failed, though it may land) and fails one about to start on it ("Channel closed"), which an
        election's redirects (many replacements a second) did with a few threads sending."""
        with self._lock:
            channel = self._channels.get(address)
            now = time.monotonic()
            if channel is not None and fresh and address in self._unreached:
                self._unreached.discard(address)
                self._retired.append((now, channel))
                channel = None
            while self._retired and now - self._retired[0][0] > self._retired_grace_s:
                self._retired.pop(0)[1].close()
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
            channels, self._channels = [*self._channels.values(), *(c for _, c in self._retired)], {}
            self._retired = []
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
        request = commitlog_pb2.InternalAppendRequest(topic=topic, writer=writer)
        convert.add_internal_messages(request.messages, messages)
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
        if probing:  # a unary call to a probed leader: the request object, filled in place
            request = convert.internal_append_batches_request(writer, batches)
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
            return batch_outcomes(response, len(batches), address)
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
        return await self._aio.append_batches(batches, writer=writer, token=token)

    async def close_async(self) -> None:
        """End the AppendBatches streams (each awaited to its end: no task of theirs is left pending for the
        loop to destroy when it stops) and close the grpc.aio channels (on their loop)."""
        await self._aio.close()

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


def _unreachable(exc: grpc.RpcError) -> bool:
    """The node could not be reached (a transport failure, not an answer of the store: those carry
    their mqstore-error trailer)."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return not any(key == "mqstore-error" for key, _ in trailing or ())
