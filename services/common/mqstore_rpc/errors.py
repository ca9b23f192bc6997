"""The one table from mqstore's exception tree to gRPC status codes, and the interceptor that applies it.

Servicers never catch and never call ``context.abort``: they let :class:`mqstore.errors.MqStoreError`
propagate, and :class:`ErrorInterceptor` turns it into the status of :data:`STATUS_BY_ERROR` with the
error's own message (which names the field, the limit, the file and position). Anything else is a bug:
it is logged as ``rpc.internal_error`` with the traceback and the client gets INTERNAL with a generic
message, while the server goes on serving.

Lookup walks the exception's MRO, so a subclass maps like its nearest listed ancestor
(FlushTimeout -> UNAVAILABLE, CorruptLog and RecordError -> DATA_LOSS).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import grpc
import structlog

from mqstore import errors

log = structlog.get_logger("mqstore_rpc.errors")

STATUS_BY_ERROR: dict[type[errors.MqStoreError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,  # includes FlushTimeout
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,  # includes CorruptLog
}

INTERNAL_MESSAGE = "internal error; the server logged it as event rpc.internal_error"

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


def _trailing_metadata(exc: errors.MqStoreError) -> tuple[tuple[str, str], ...]:
    """Machine-readable facts a client may act on without parsing the message."""
    items = [("mqstore-error", type(exc).__name__), ("mqstore-retriable", "true" if exc.retriable else "false")]
    if isinstance(exc, errors.OutOfRange):
        if exc.min_value is not None:
            items.append(("mqstore-min-value", str(exc.min_value)))
        if exc.max_value is not None:
            items.append(("mqstore-max-value", str(exc.max_value)))
    if isinstance(exc, errors.DataLoss):  # the bad record, so that a reader can skip it (offset + 1)
        if exc.physical_offset is not None:
            items.append(("mqstore-bad-physical-offset", str(exc.physical_offset)))
        if exc.queue_offset is not None:
            items.append(("mqstore-bad-queue-offset", str(exc.queue_offset)))
    return tuple(items)


def _abort(exc: Exception, context: grpc.ServicerContext, method: str) -> None:
    """Ends the RPC with the status of ``exc``; always raises (context.abort raises)."""
    if isinstance(exc, errors.MqStoreError):
        code = status_for(exc)
        log.debug("rpc.error", method=method, code=code.name, error=type(exc).__name__, message=str(exc))
        context.set_trailing_metadata(_trailing_metadata(exc))
        context.abort(code, str(exc))
    if isinstance(exc, grpc.RpcError) and not context.is_active():
        # The client went away (its request stream raised): nothing to report to anybody.
        log.info("rpc.cancelled", method=method)
        raise exc
    log.error("rpc.internal_error", method=method, error=type(exc).__name__, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


def _wrap_unary_response(behavior: Callable, method: str) -> Callable:
    @functools.wraps(behavior)
    def wrapper(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behavior(request_or_iterator, context)
        except Exception as exc:  # noqa: BLE001 - the one place that maps every error to a status
            _abort(exc, context, method)
    return wrapper


def _wrap_stream_response(behavior: Callable, method: str) -> Callable:
    @functools.wraps(behavior)
    def wrapper(request_or_iterator: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behavior(request_or_iterator, context)
        except Exception as exc:  # noqa: BLE001 - the one place that maps every error to a status
            _abort(exc, context, method)
    return wrapper


def wrap_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """The same handler with its behavior wrapped by the error mapping."""
    serializers = dict(request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_wrap_unary_response(handler.unary_unary, method), **serializers)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_wrap_unary_response(handler.stream_unary, method), **serializers)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_wrap_stream_response(handler.unary_stream, method), **serializers)
    return grpc.stream_stream_rpc_method_handler(_wrap_stream_response(handler.stream_stream, method), **serializers)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Applies :data:`STATUS_BY_ERROR` to every unary and streaming handler.

    Thread-safe: the only state is a cache of wrapped handlers by method name (registered methods
    only, so it is bounded), so a method is wrapped once and not per call; a race only wraps twice.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_UNWRAPPED_PREFIX):
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = wrap_handler(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
