"""What both of the CommitLog client's transports use for CommitLogInternal's AppendBatches
(mqstore_rpc.commitlog_client has the design): an answer's outcomes, the signals of the leader-following, and
the synchronous transport's open stream (SyncBatchStream; the grpc.aio one is mqstore_rpc.commitlog_aio's).
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
from mqstore import errors, model

from mqstore_rpc import convert
from mqstore_rpc.remote_errors import from_batch_error


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


class LeaderMoved(Exception):
    """The node in use did not answer and ``leader`` says it leads now."""

    def __init__(self, leader: str):
        super().__init__(leader)
        self.leader = leader


class Unimplemented(Exception):
    """The node does not serve this method (grpc UNIMPLEMENTED: it did nothing)."""


def batch_outcomes(response, batches: int, address: str) -> list[list[model.AppendResult] | errors.MqStoreError]:
    """An AppendBatches answer's outcomes, in order: each batch's results or the error it would have raised
    alone (both transports: :meth:`CommitLogClient.internal_append_batches` and its ``_async``)."""
    if len(response.results) != batches:
        raise errors.Unavailable(f"{address} answered AppendBatches with {len(response.results)} results for "
                                 f"{batches} batches: the batches may or may not have been written")
    return [[convert.append_result_out(r) for r in outcome.appended.results]
            if outcome.WhichOneof("outcome") == "appended" else from_batch_error(outcome.error, address)
            for outcome in response.results]
