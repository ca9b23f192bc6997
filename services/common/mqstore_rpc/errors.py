"""The one table from mqstore's exception tree to gRPC status codes, and the interceptor that applies it.

Servicers never catch and never call ``context.abort``: they let :class:`mqstore.errors.MqStoreError`
propagate, and :class:`ErrorInterceptor` turns it into the status of :data:`STATUS_BY_ERROR` with the
error's own message (which names the field, the limit, the file and position). Anything else is a bug:
it is logged as ``rpc.internal_error`` with the traceback and the client gets INTERNAL with a generic
message, while the server goes on serving.

Lookup walks the exception's MRO, so a subclass maps like its nearest listed ancestor
(FlushTimeout -> UNAVAILABLE, CorruptLog and RecordError -> DATA_LOSS).

Requests are parsed here too, not by grpc: grpc's own deserializer fails before any interceptor runs
and answers INTERNAL "Exception deserializing request!" without a trace in our logs. So the wrapped
handler is registered with an identity deserializer and parses the bytes itself (each item of a
request stream likewise): bytes that are not the request message (garbage, invalid UTF-8 in a string
field) get INVALID_ARGUMENT naming the method, and one ``rpc.request_unparsable`` event is logged.
A servicer method marked with :func:`wire_codec` has its requests parsed by its own parser instead of
the generated deserializer (Append's compiled codec: mqstore_rpc.append_wire), with the same errors,
and returns its response as serialized bytes, which go out as they are.

Every handler it wraps is async, answered on the server's loop (a synchronous servicer method was made so by
mqstore_rpc.aio, its body run in the handler pool): a coroutine (a unary-response call) or an async generator
(a stream's responses), ended with ``await context.abort``; the rule (which status, which trailers, what is
logged) is :func:`_ending`.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
import structlog
from google.protobuf.message import DecodeError

from mqstore import errors
from mqstore_rpc.handlers import PerMethod, behavior_of, like

log = structlog.get_logger("mqstore_rpc.errors")

STATUS_BY_ERROR: dict[type[errors.MqStoreError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,  # includes FlushTimeout
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,  # includes CorruptLog
}

INTERNAL_MESSAGE = "internal error; the server logged it as event rpc.internal_error"
# The status message and the trailers travel as HTTP/2 headers (the message percent-encoded: up to 3
# bytes per byte), and gRPC refuses headers past about 8 KiB, turning the answer into another error.
# Messages show user values through mqstore.errors.shown; this bounds whatever still gets through.
MAX_MESSAGE_BYTES = 2048
MAX_TRAILER_BYTES = 256

# Services we do not wrap: grpc's own health and reflection handle their errors, and health's Watch
# relies on attributes of its handler function that a wrapper would hide.
_UNWRAPPED_PREFIX = "/grpc."


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code of an exception: its nearest mapped ancestor, else INTERNAL."""
    for cls in type(exc).__mro__:
        code = STATUS_BY_ERROR.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


@dataclass(frozen=True, slots=True)
class FrameStatus:
    """The status one frame of a stream would have ended a unary call with (a failed frame whose
    stream goes on: Transaction.Transact)."""

    code: grpc.StatusCode
    message: str
    retriable: bool


async def frame_outcome(method: str, behavior: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``await behavior(*args)``'s result, or the :class:`FrameStatus` of the mqstore error it raised (the same
    table and log event as for a call). Anything else is a bug and propagates: it ends the stream as INTERNAL."""
    try:
        return await behavior(*args)
    except errors.MqStoreError as exc:
        return frame_status(method, exc)


def frame_status(method: str, exc: errors.MqStoreError) -> FrameStatus:
    return FrameStatus(_mapped(method, exc), str(exc), exc.retriable)


def _mapped(method: str, exc: errors.MqStoreError) -> grpc.StatusCode:
    """The status of an mqstore error, logged (a call's or a frame's)."""
    code = status_for(exc)
    log.debug("rpc.error", method=method, code=code.name, error=type(exc).__name__, message=str(exc))
    return code


def _trailing_metadata(exc: errors.MqStoreError) -> tuple[tuple[str, str], ...]:
    """Machine-readable facts a client may act on without parsing the message."""
    items = [("mqstore-error", type(exc).__name__), ("mqstore-retriable", "true" if exc.retriable else "false")]
    if isinstance(exc, errors.OutOfRange):
        if exc.min_value is not None:
            items.append(("mqstore-min-value", str(exc.min_value)))
        if exc.max_value is not None:
            items.append(("mqstore-max-value", str(exc.max_value)))
    if isinstance(exc, errors.NotLeader):  # where writes go: the CLI and the clients follow it
        items.append(("mqstore-leader", exc.leader_address))
    if isinstance(exc, errors.DataLoss):  # the bad record, so that a reader can skip it (offset + 1)
        if exc.physical_offset is not None:
            items.append(("mqstore-bad-physical-offset", str(exc.physical_offset)))
        if exc.queue_offset is not None:
            items.append(("mqstore-bad-queue-offset", str(exc.queue_offset)))
    return tuple((name, _bounded(value, MAX_TRAILER_BYTES)) for name, value in items)


def _bounded(text: str, limit: int) -> str:
    """``text`` cut to at most about ``limit`` UTF-8 bytes, saying so."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f"... (cut: the message had {len(data)} bytes)"


def _ending(exc: Exception, context, method: str) -> tuple[grpc.StatusCode, str]:
    """The rule of this interceptor: the status ``exc`` ends the RPC with (its trailers set on ``context``),
    logged as its kind says. When the client went away (a synchronous handler's request stream, read in the
    pool, raised grpc.RpcError after the call ended) there is nothing to report to anybody: ``exc`` is raised
    again (mostly the call's task is cancelled instead, which no ``except Exception`` sees)."""
    if isinstance(exc, grpc.RpcError) and context.done():
        log.info("rpc.cancelled", method=method)
        raise exc
    if isinstance(exc, errors.MqStoreError):
        code = _mapped(method, exc)
        context.set_trailing_metadata(_trailing_metadata(exc))
        return code, _bounded(str(exc), MAX_MESSAGE_BYTES)
    log.error("rpc.internal_error", method=method, error=type(exc).__name__, exc_info=exc)
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


def wire_codec(parse: Callable[[bytes], Any]) -> Callable[[Callable], Callable]:
    """Mark a servicer method whose requests ``parse`` turns from bytes into what the method takes
    (raising protobuf's DecodeError for bytes that are not the request message) and whose responses
    are already serialized bytes."""
    def mark(method: Callable) -> Callable:
        method.wire_parse = parse
        return method
    return mark


def _pass_bytes(response: bytes) -> bytes:
    return response


def _parser(deserializer: Callable[[bytes], Any] | None, method: str,
            wire_parse: Callable[[bytes], Any] | None = None) -> Callable[[bytes], Any]:
    """Bytes -> request message (by ``wire_parse`` if given, else the generated deserializer), raising
    InvalidArgument (after one log event) when they do not parse."""
    if deserializer is None:
        return lambda raw: raw
    message_type = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    type_name = message_type.full_name if message_type is not None else "request message"
    to_request = wire_parse or deserializer

    def parse(raw: bytes) -> Any:
        try:
            return to_request(raw)
        except DecodeError as exc:
            log.warning("rpc.request_unparsable", method=method, request_bytes=len(raw), error=str(exc))
            raise errors.InvalidArgument(
                f"{method}: the request did not parse as a {type_name} ({exc}); send a serialized "
                f"{type_name} (string fields must be valid UTF-8)") from None
    return parse


def _wrap_async_unary_response(behavior: Callable, method: str, parse: Callable) -> Callable:
    @functools.wraps(behavior)
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(parse(request), context)
        except Exception as exc:  # noqa: BLE001 - the one place that maps every error to a status
            await context.abort(*_ending(exc, context, method))
    return wrapper


def _wrap_async_stream_response(behavior: Callable, method: str, parse: Callable) -> Callable:
    @functools.wraps(behavior)
    async def wrapper(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for response in behavior(parse(request_or_iterator), context):
                yield response
        except Exception as exc:  # noqa: BLE001 - the one place that maps every error to a status
            await context.abort(*_ending(exc, context, method))
    return wrapper


def _each_async(parse: Callable) -> Callable:
    """The parser of a request stream, each item parsed on the loop as it is taken."""
    async def parsed(raw_items: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        async for raw in raw_items:
            yield parse(raw)
    return parsed


def wrap_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """The same handler with its behavior wrapped by the error mapping, parsing its own requests."""
    behavior = behavior_of(handler)
    wire_parse = getattr(behavior, "wire_parse", None)
    parse = _parser(handler.request_deserializer, method, wire_parse)
    serializers = dict(request_deserializer=None,
                       response_serializer=_pass_bytes if wire_parse else handler.response_serializer)
    each = _each_async(parse) if handler.request_streaming else parse
    if inspect.isasyncgenfunction(behavior):
        return like(handler, _wrap_async_stream_response(behavior, method, each), **serializers)
    if inspect.iscoroutinefunction(behavior):
        return like(handler, _wrap_async_unary_response(behavior, method, each), **serializers)
    raise TypeError(f"{method}: the error mapping wraps async handlers only (mqstore_rpc.aio.on_loop makes them)")


class ErrorInterceptor(grpc.ServerInterceptor):
    """Applies :data:`STATUS_BY_ERROR` to every unary and streaming handler (async: mqstore_rpc.aio.Interceptors
    applies it after making a synchronous handler async).

    Thread-safe: the only state is a cache of wrapped handlers by method name (registered methods
    only, so it is bounded), so a method is wrapped once and not per call; a race only wraps twice.
    """

    def __init__(self) -> None:
        self._wrapped = PerMethod()

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_UNWRAPPED_PREFIX):
            return handler
        return self._wrapped.get(method, handler, lambda h: wrap_handler(h, method))
