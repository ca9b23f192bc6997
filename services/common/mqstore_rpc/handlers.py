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


def as_request_stream(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """A request-streaming handler with ``handler``'s response kind and serializers: grpc reads no request
    message before ``behavior`` takes one from its iterator (mqstore_rpc.auth's screened unary calls)."""
    return _MAKERS[True, handler.response_streaming](behavior, request_deserializer=handler.request_deserializer,
                                                     response_serializer=handler.response_serializer)


VARIANTS = 4  # wrapped handlers kept per method: the registered one and what interceptors inside made of it


class PerMethod:
    """Each method's wrapped handler, made once per handler given (``wrap(handler)``): the registered one,
    or a variant an inner interceptor returns for some calls (the authentication's screened handler), up
    to :data:`VARIANTS` per method (the newest first)."""

    def __init__(self) -> None:
        self._wrapped: dict[Any, tuple[tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler], ...]] = {}

    def find(self, method: Any, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler | None:
        """The handler made of ``handler`` for ``method`` already, else None."""
        for given, wrapped in self._wrapped.get(method, ()):
            if given is handler:
                return wrapped
        return None

    def get(self, method: Any, handler: grpc.RpcMethodHandler,
            wrap: Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler]) -> grpc.RpcMethodHandler:
        wrapped = self.find(method, handler)
        if wrapped is None:
            wrapped = wrap(handler)
            self._wrapped[method] = ((handler, wrapped), *self._wrapped.get(method, ())[:VARIANTS - 1])
        return wrapped
