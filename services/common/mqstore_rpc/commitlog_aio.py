"""The CommitLog client's grpc.aio transport (mqstore_rpc.commitlog_client has the design): CommitLogInternal's
AppendBatches from a caller on an event loop (Cluster mode's Transaction port), as requests of an
AppendBatchesStream kept open to the node in use, or one Append per batch for a commit log older than it.

Its channels, stubs and streams are opened on the caller's loop (one loop per client) and closed there
(:meth:`AioBatches.close`). The node in use and the leader-following (``address``, ``_use``, ``_failed``,
``leader_elsewhere``) are the client's, shared with its synchronous transport, as is the flag of a log older
than AppendBatches.

Thread-safety: none; the caller's loop only.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Sequence

import grpc
import structlog
from mqstore import errors, model

from mqstore_rpc import convert
from mqstore_rpc.commitlog_batches import LeaderMoved, Unimplemented, batch_outcomes
from mqstore_rpc.gen.mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc

log = structlog.get_logger()


class AioBatches:
    """The grpc.aio transport of ``client`` (a CommitLogClient); ``token_key``: the metadata key of
    CommitLogInternal's shared secret."""

    def __init__(self, client, token_key: str):
        self._client = client
        self._token_key = token_key
        self._aio_channels: dict[str, grpc.aio.Channel] = {}   # on the caller's loop
        self._aio_stubs: dict[str, commitlog_pb2_grpc.CommitLogInternalStub] = {}
        self._batch_streams: dict[str, _BatchStream] = {}  # AppendBatchesStream per node, on its loop

    async def append_batches(self, batches: Sequence[tuple[str, Sequence[model.MessageIn]]], *, writer: str,
                             token: str) -> list[list[model.AppendResult] | errors.MqStoreError]:
        """:meth:`CommitLogClient.internal_append_batches_async` (its docstring says what it promises): the
        request on this loop's AppendBatchesStream, or one Append per batch to a log older than it."""
        if self._client._batches_unimplemented:
            return await self._append_batches_one_by_one(batches, writer, token)
        request = convert.internal_append_batches_request(writer, batches)
        try:
            response, address = await self._on_batch_stream(request, token)
        except Unimplemented:  # a commit log older than AppendBatches (a rolling upgrade): nothing was written
            self._client._batches_unimplemented = True
            log.warning("commitlog_client.append_batches_unimplemented", address=self._client.address,
                        hint="the commit log predates CommitLogInternal.AppendBatches: one Append per batch until "
                             "this client restarts; upgrade the commit log")
            return await self._append_batches_one_by_one(batches, writer, token)
        return batch_outcomes(response, len(batches), address)

    async def _on_batch_stream(self, request, token: str):
        """(response, address) of ``request`` on this loop's AppendBatchesStream to the node in use, opened
        when there is none or it ended; :meth:`CommitLogClient._call`'s leader-following and errors. No answer
        within ``rpc_timeout_s``: the stream is torn down (everything it still owed has an unknown outcome)."""
        for attempt in range(2):
            address = self._client.address
            stream = self._batch_streams.get(address)
            if stream is None or stream.error is not None:
                stub = self._aio_stub(address)
                metadata = ((self._token_key, token), *self._client._peers.metadata())
                stream = self._batch_streams[address] = _BatchStream(stub.AppendBatchesStream(metadata=metadata))
            answer = await stream.send(request)
            try:
                return await self._answer_probing(answer, address), address
            except asyncio.TimeoutError:
                error = errors.Unavailable(f"{address} did not answer AppendBatches within "
                                           f"{self._client.rpc_timeout_s:g} s: the batches may or may not have been "
                                           f"written")
                stream.end(error)
                _abandon(answer)
                raise error from None
            except LeaderMoved as moved:
                error = errors.Unavailable(f"{address} did not answer AppendBatches within "
                                           f"{self._client.leader_probe_s:g} s and {moved.leader} leads now: the "
                                           f"batches may or may not have been written; the next calls go to "
                                           f"{moved.leader}")
                stream.end(error)
                _abandon(answer)
                self._client._use(moved.leader, fresh=True)
                raise error from None
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise Unimplemented("AppendBatchesStream") from None
                error = self._client._failed(exc, address, attempt, write=True)
                if error is None:
                    continue  # NotLeader: this request was not processed; send it to the leader
                raise error from None
        raise AssertionError("unreachable: the loop returns or raises")

    async def _answer_probing(self, answer: asyncio.Future, address: str):
        """``answer``'s result within ``rpc_timeout_s`` (else TimeoutError); unanswered after each
        ``leader_probe_s``, the other nodes are asked whether one leads now (LeaderMoved), as a write of
        :meth:`CommitLogClient._call` does."""
        if self._client.leader_probe_s <= 0 or len(self._client.addresses) < 2:
            return await _within(answer, self._client.rpc_timeout_s)
        deadline = asyncio.get_running_loop().time() + self._client.rpc_timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise asyncio.TimeoutError()
            try:
                return await asyncio.wait_for(asyncio.shield(answer), min(left, self._client.leader_probe_s))
            except asyncio.TimeoutError:
                if left <= self._client.leader_probe_s:
                    raise
            leader = await asyncio.to_thread(self._client.leader_elsewhere, address)
            if leader:
                raise LeaderMoved(leader)

    def _aio_stub(self, address: str) -> commitlog_pb2_grpc.CommitLogInternalStub:
        stub = self._aio_stubs.get(address)
        if stub is None:
            channel = self._aio_channels[address] = self._client._peers.aio_channel(address, self._client._options)
            stub = self._aio_stubs[address] = commitlog_pb2_grpc.CommitLogInternalStub(channel)
        return stub

    async def _append_batches_one_by_one(self, batches, writer: str, token: str):
        """AppendBatches' outcomes from one CommitLogInternal.Append per batch, in order (an older log)."""
        outcomes: list[list[model.AppendResult] | errors.MqStoreError] = []
        for topic, messages in batches:
            request = commitlog_pb2.InternalAppendRequest(topic=topic, writer=writer)
            convert.add_internal_messages(request.messages, messages)
            try:
                response, _ = await self._internal_async("Append", request, token)
            except errors.MqStoreError as exc:
                outcomes.append(exc)
            else:
                outcomes.append([convert.append_result_out(r) for r in response.results])
        return outcomes

    async def _internal_async(self, method: str, request, token: str):
        """(response, address) of CommitLogInternal ``method`` on the node in use, on this loop's channel
        to it; :meth:`CommitLogClient._call`'s leader-following and errors."""
        metadata = ((self._token_key, token), *self._client._peers.metadata())
        for attempt in range(2):
            address = self._client.address
            stub = self._aio_stub(address)
            try:
                timeout_s = self._client.rpc_timeout_s
                return await getattr(stub, method)(request, timeout=timeout_s, metadata=metadata), address
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise Unimplemented(method) from None
                error = self._client._failed(exc, address, attempt, write=True)
                if error is None:
                    continue
                raise error from None
        raise AssertionError("unreachable: the loop returns or raises")

    async def close(self) -> None:
        """End the AppendBatches streams (each awaited to its end: no task of theirs is left pending for the
        loop to destroy when it stops) and close the grpc.aio channels (on their loop)."""
        streams, self._batch_streams = list(self._batch_streams.values()), {}
        for stream in streams:
            await stream.aclose(errors.Unavailable("the client is closing"), self._client.rpc_timeout_s)
        channels, self._aio_channels, self._aio_stubs = list(self._aio_channels.values()), {}, {}
        for channel in channels:
            await channel.close()


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
