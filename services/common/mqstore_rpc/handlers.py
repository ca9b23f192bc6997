"""What the server interceptors (metrics, errors, authentication, mqstore_rpc.aio) share about grpc's method
handlers: the behavior of a handler, a handler of the same kind with another behavior, and the cache of
wrapped handlers per method.

Thread-safe: :class:`PerMethod` is a dict of registered methods only (so bounded); a race only wraps twice.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc

_MAKERS = {(False, False): grpc.unary_unary_rpc_method_handler, (True, False): grpc.stream_unary_rpc_method_handler,
           (False, True): grpc.unary_stream_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}


def behavior_of(handler: grpc.RpcMethodHandler) -> Callable:
    return handler.unary_unary or handler.stream_unary or handler.unary_stream or handler.stream_stream


def like(handler: grpc.RpcMethodHandler, behavior: Callable, **serializers: Any) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind (request and response streaming) with ``behavior``; its serializers
    unless ``serializers`` (request_deserializer, response_serializer) say otherwise."""
    given = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    return _MAKERS[handler.request_streaming, handler.response_streaming](behavior, **(given | serializers))


class PerMethod:
    """Each method's wrapped handler, made once per registered handler (``wrap(handler)``)."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def get(self, method: str, handler: grpc.RpcMethodHandler,
            wrap: Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler]) -> grpc.RpcMethodHandler:
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = wrap(handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
