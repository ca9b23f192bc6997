"""The one table from mqstore's exception tree to RocketMQ 5 status codes, and how a handler applies it.

The RocketMQ 5 protocol carries every outcome in the response's ``Status.code`` (an
``apache.rocketmq.v2.Code``: 20000 OK, 40402 TOPIC_NOT_FOUND, ...), not in the gRPC status: the clients
read only ``response.status`` and treat a gRPC error as a transport failure (and retry it). So the
gateway's handlers do not let mqstore errors reach mqstore_rpc.errors' interceptor: the decorators here
turn a :class:`mqstore.errors.MqStoreError` into a response whose status is :data:`CODE_BY_ERROR`'s
code (its nearest mapped ancestor, as for the gRPC mapping) with the error's own message. Anything else
is a bug and still reaches the interceptor (gRPC INTERNAL, logged as rpc.internal_error).

A streaming response (ReceiveMessage) ends with exactly one status item instead; a Telemetry stream
writes it as a TelemetryCommand with that status.

The exception: a refusal of the caller by mqstore_rpc.auth (:func:`mqstore_rpc.auth.is_denial`: a
servicer's own check, such as a client id that belongs to another user's session) goes on to the error
interceptor, and the call ends with gRPC PERMISSION_DENIED or UNAUTHENTICATED, as the interceptor's own
refusals do; a PermissionDenied from a service the gateway called is the gateway's own configuration.
"""

from __future__ import annotations

import functools
from typing import Callable

import structlog

from mqstore import errors
from mqstore_rpc.auth import is_denial
from mqstore_rpc.gen.apache.rocketmq.v2 import definition_pb2 as d

log = structlog.get_logger("gateway_service.status")

CODE_BY_ERROR: dict[type[errors.MqStoreError], int] = {
    errors.TopicNotFound: d.TOPIC_NOT_FOUND,
    errors.IllegalPropertyKey: d.ILLEGAL_MESSAGE_PROPERTY_KEY,
    errors.IllegalMessageId: d.ILLEGAL_MESSAGE_ID,
    errors.IllegalFilterExpression: d.ILLEGAL_FILTER_EXPRESSION,
    errors.IllegalInvisibleTime: d.ILLEGAL_INVISIBLE_TIME,
    errors.IllegalDeliveryTime: d.ILLEGAL_DELIVERY_TIME,
    errors.InvalidReceiptHandle: d.INVALID_RECEIPT_HANDLE,
    errors.InvalidTransactionId: d.INVALID_TRANSACTION_ID,
    errors.PropertyConflictsWithType: d.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    errors.ClientIdRequired: d.CLIENT_ID_REQUIRED,
    errors.IllegalAccessPoint: d.ILLEGAL_ACCESS_POINT,
    errors.BodyTooLarge: d.MESSAGE_BODY_TOO_LARGE,
    errors.Unsupported: d.UNSUPPORTED,
    errors.InvalidArgument: d.BAD_REQUEST,
    errors.NotFound: d.NOT_FOUND,
    errors.AlreadyExists: d.BAD_REQUEST,
    errors.OutOfRange: d.ILLEGAL_OFFSET,
    errors.FailedPrecondition: d.PRECONDITION_FAILED,
    errors.ResourceExhausted: d.TOO_MANY_REQUESTS,          # disk full, too many clients or in flight
    errors.FlushTimeout: d.MASTER_PERSISTENCE_TIMEOUT,
    errors.Unavailable: d.PROXY_TIMEOUT,                    # the service behind the gateway did not answer
    errors.PermissionDenied: d.INTERNAL_SERVER_ERROR,       # the gateway's own configuration (a token)
    errors.DataLoss: d.INTERNAL_SERVER_ERROR,
}


def code_for(exc: errors.MqStoreError) -> int:
    for cls in type(exc).__mro__:
        code = CODE_BY_ERROR.get(cls)
        if code is not None:
            return code
    return d.INTERNAL_SERVER_ERROR


_OK = d.Status(code=d.OK, message="OK")


def ok(message: str = "OK") -> d.Status:
    """An OK status; the plain one is shared (a message field assigned from it is a copy: never mutate it)."""
    return _OK if message == "OK" else d.Status(code=d.OK, message=message)


def status_of(exc: errors.MqStoreError) -> d.Status:
    return d.Status(code=code_for(exc), message=str(exc))


def answers_with_status(response_type: Callable[..., object],
                        echo: Callable[[object], dict] | None = None) -> Callable[[Callable], Callable]:
    """A unary handler whose mqstore errors become ``response_type(status=..., **echo(request))`` (see the
    module docstring). ``echo`` gives the fields a refusal must still carry (ChangeInvisibleDuration's
    receipt handle: the Python client stores it before it looks at the status)."""
    def decorate(handler: Callable) -> Callable:
        @functools.wraps(handler)
        def wrapper(self, request, context):
            try:
                return handler(self, request, context)
            except errors.MqStoreError as exc:
                if is_denial(exc):
                    raise
                status = status_of(exc)
                log.info("gateway.refused", method=handler.__name__, code=d.Code.Name(status.code),
                         error=type(exc).__name__, message=str(exc))
                return response_type(status=status, **(echo(request) if echo else {}))
        return wrapper
    return decorate


def streams_with_status(response_type: Callable[..., object]) -> Callable[[Callable], Callable]:
    """A server-streaming handler whose mqstore error ends the stream with one ``response_type(status=...)``."""
    def decorate(handler: Callable) -> Callable:
        @functools.wraps(handler)
        def wrapper(self, request, context):
            try:
                yield from handler(self, request, context)
            except errors.MqStoreError as exc:
                if is_denial(exc):
                    raise
                status = status_of(exc)
                log.info("gateway.refused", method=handler.__name__, code=d.Code.Name(status.code),
                         error=type(exc).__name__, message=str(exc))
                yield response_type(status=status)
        return wrapper
    return decorate
