"""Prometheus metrics of a service: the per-RPC interceptor and the ``/metrics`` HTTP exporter.

Every service has one :class:`mqstore.metrics.Registry` (``Composition.metrics``): the domain registers
its figures there (mqstore.metrics), :class:`RpcMetrics` adds the per-RPC ones, and
:class:`MetricsExporter` serves the registry with the official ``prometheus-client`` (its HTTP server,
its text exposition, its process and platform collectors) on ``--metrics-port``.

Per RPC, the names of go-grpc-prometheus, which gRPC dashboards and alerts expect (labels
``grpc_type`` = unary | client_stream | server_stream | bidi_stream, ``grpc_service``, ``grpc_method``):

  grpc_server_started_total                     RPCs started
  grpc_server_handled_total{..., grpc_code}     RPCs finished, by status code (OK, INVALID_ARGUMENT, ...)
  grpc_server_handling_seconds                  histogram of the time to the status
  grpc_server_msg_received_total                request messages received (a stream counts each)
  grpc_server_msg_sent_total                    response messages sent

On a grpc.aio server (mqstore_rpc.aio) a stream that its client cancels is counted by how its handler ends:
grpc.aio ends the request stream as if the client had closed it, so a handler waiting for the next request
ends OK. An RPC refused by grpc itself before any handler runs (RESOURCE_EXHAUSTED for a request over
max_message_bytes or beyond max_concurrent_rpcs, UNIMPLEMENTED for an unknown method) is not counted:
no interceptor sees it. Health and reflection are counted like every other service.

Thread-safety: the interceptor's state is the metric children per method, created once (a race only
creates the same child twice through Metric.labels, which is locked); the exporter is started and
stopped by the composition root.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from typing import Any, AsyncIterator, Callable, Iterator

import grpc
import structlog
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from mqstore import metrics as core_metrics
from mqstore.metrics import HistogramValue, Registry
from mqstore_rpc.handlers import PerMethod, behavior_of, like

log = structlog.get_logger("mqstore_rpc.metrics")

_RPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")


class RegistryCollector:
    """Hands a core registry to prometheus-client: one metric family per registered metric, built at
    each scrape from the registry's current values."""

    def __init__(self, registry: Registry):
        self._registry = registry

    def collect(self) -> Iterator[Any]:
        for family in self._registry.collect():
            yield _family(family)


def _family(family: core_metrics.Family):
    labels = list(family.label_names)
    if family.kind == core_metrics.COUNTER:
        out = CounterMetricFamily(family.name.removesuffix("_total"), family.documentation, labels=labels)
        for key, value in family.samples:
            out.add_metric(list(key), value)
        return out
    if family.kind == core_metrics.HISTOGRAM:
        out = HistogramMetricFamily(family.name, family.documentation, labels=labels)
        for key, value in family.samples:
            out.add_metric(list(key), _buckets(value), value.sum)
        return out
    out = GaugeMetricFamily(family.name, family.documentation, labels=labels)
    for key, value in family.samples:
        out.add_metric(list(key), value)
    return out


def _buckets(value: HistogramValue) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(bound), count)
            for bound, count in zip(value.bounds, value.cumulative, strict=True)]


class MetricsExporter:
    """``GET /metrics`` on ``host:port`` (port 0: any free one, read ``.port``), served by
    prometheus-client's own HTTP server on a daemon thread. Thread-safe: ``stop()`` once."""

    def __init__(self, registry: Registry, host: str, port: int):
        self.collectors = CollectorRegistry(auto_describe=False)
        self.collectors.register(RegistryCollector(registry))
        ProcessCollector(registry=self.collectors)
        PlatformCollector(registry=self.collectors)
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=self.collectors)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} (set --metrics-port, "
                          f"or 'off')") from None
        self.host = host
        self.port = self._httpd.server_address[1]

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)


# ---- per-RPC figures ------------------------------------------------------------------------------------

def _rpc_type(handler: grpc.RpcMethodHandler) -> str:
    if handler.request_streaming and not getattr(behavior_of(handler), "unary_request", False):
        return "bidi_stream" if handler.response_streaming else "client_stream"
    return "server_stream" if handler.response_streaming else "unary"


def _split(method: str) -> tuple[str, str]:
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


class _MethodFigures:
    """The metric children of one method, resolved once."""

    def __init__(self, rpc: "RpcMetrics", method: str, grpc_type: str):
        service, name = _split(method)
        labels = (grpc_type, service, name)
        self.labels = labels
        self.started = rpc.started.labels(*labels)
        self.seconds = rpc.seconds.labels(*labels)
        self.received = rpc.received.labels(*labels)
        self.sent = rpc.sent.labels(*labels)
        self._handled = rpc.handled
        self._by_code: dict[grpc.StatusCode, Any] = {}

    def handled(self, code: grpc.StatusCode):
        child = self._by_code.get(code)
        if child is None:
            child = self._by_code[code] = self._handled.labels(*self.labels, code.name)
        return child

    def ended(self, code: grpc.StatusCode, seconds: float) -> None:
        self.handled(code).inc()
        self.seconds.observe(seconds)


def _code_of(context: grpc.ServicerContext, exc: BaseException | None) -> grpc.StatusCode:
    """The status the RPC ends with: what the handler (or the error interceptor's abort) set."""
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # some grpc versions keep the code's number
        return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    return grpc.StatusCode.OK if exc is None else grpc.StatusCode.UNKNOWN


class RpcMetrics(grpc.ServerInterceptor):
    """The per-RPC figures of the module docstring, as the outermost interceptor (it sees the status
    the error interceptor and the authentication gave). Wrapped handlers are cached per method."""

    def __init__(self, registry: Registry, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self.started = registry.counter("grpc_server_started_total", "RPCs started on the server", _RPC_LABELS)
        self.handled = registry.counter("grpc_server_handled_total", "RPCs completed on the server, by status code",
                                        (*_RPC_LABELS, "grpc_code"))
        self.seconds = registry.histogram("grpc_server_handling_seconds",
                                          "time from the start of an RPC to its status", label_names=_RPC_LABELS)
        self.received = registry.counter("grpc_server_msg_received_total", "request messages received",
                                         _RPC_LABELS)
        self.sent = registry.counter("grpc_server_msg_sent_total", "response messages sent", _RPC_LABELS)
        self._wrapped = PerMethod()

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        return self._wrapped.get(method, handler, lambda h: self._wrap(h, _MethodFigures(self, method, _rpc_type(h))))

    def _wrap(self, handler: grpc.RpcMethodHandler, figures: _MethodFigures) -> grpc.RpcMethodHandler:
        behavior, streaming = behavior_of(handler), handler.request_streaming
        if inspect.iscoroutinefunction(behavior):  # on a grpc.aio server's loop (mqstore_rpc.aio)
            return like(handler, self._async_unary(behavior, figures, streaming))
        if inspect.isasyncgenfunction(behavior):  # answered on a grpc.aio server's loop
            return like(handler, self._async_stream(behavior, figures, streaming))
        wrap = self._stream if handler.response_streaming else self._unary
        return like(handler, wrap(behavior, figures, streaming))

    def _counted(self, requests, figures: _MethodFigures, streaming: bool):
        if not streaming:
            figures.received.inc()
            return requests
        return _counting(requests, figures.received)

    def _unary(self, behavior: Callable, figures: _MethodFigures, streaming: bool) -> Callable:
        clock = self._clock

        @functools.wraps(behavior)
        def wrapper(request_or_iterator, context):
            with _Timed(figures, clock, context, _code_of):
                response = behavior(self._counted(request_or_iterator, figures, streaming), context)
                figures.sent.inc()
                return response
        return wrapper

    def _stream(self, behavior: Callable, figures: _MethodFigures, streaming: bool) -> Callable:
        clock = self._clock

        @functools.wraps(behavior)
        def wrapper(request_or_iterator, context):
            with _Timed(figures, clock, context, _stream_code):
                for response in behavior(self._counted(request_or_iterator, figures, streaming), context):
                    figures.sent.inc()
                    yield response
        return wrapper

    def _async_unary(self, behavior: Callable, figures: _MethodFigures, streaming: bool = False) -> Callable:
        clock = self._clock

        @functools.wraps(behavior)
        async def wrapper(request, context):
            with _Timed(figures, clock, context, _async_unary_code):
                if streaming:
                    request = _async_counting(request, figures.received)
                else:
                    figures.received.inc()
                response = await behavior(request, context)
                figures.sent.inc()
                return response
        return wrapper

    def _async_stream(self, behavior: Callable, figures: _MethodFigures, streaming: bool) -> Callable:
        clock = self._clock

        @functools.wraps(behavior)
        async def wrapper(request_or_iterator, context):
            with _Timed(figures, clock, context, _async_stream_code):
                if streaming:
                    request_or_iterator = _async_counting(request_or_iterator, figures.received)
                else:
                    figures.received.inc()
                async for response in behavior(request_or_iterator, context):
                    figures.sent.inc()
                    yield response
        return wrapper


class _Timed:
    """One call's figures: started on entry; on exit ended, with the status ``code_of(context, error)``
    gives for the error it ended with (None: none) and the time in between."""

    __slots__ = ("_figures", "_clock", "_context", "_code_of", "_start")

    def __init__(self, figures: _MethodFigures, clock: Callable[[], float], context,
                 code_of: Callable[[Any, BaseException | None], grpc.StatusCode]):
        self._figures, self._clock, self._context, self._code_of = figures, clock, context, code_of

    def __enter__(self) -> None:
        self._figures.started.inc()
        self._start = self._clock()

    def __exit__(self, exc_type, error: BaseException | None, traceback) -> bool:
        self._figures.ended(self._code_of(self._context, error), self._clock() - self._start)
        return False  # the error goes on


def _stream_code(context: grpc.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    code = _code_of(context, error)
    if error is None and code is grpc.StatusCode.OK and not context.is_active():
        return grpc.StatusCode.CANCELLED  # the client went away (a Tail that was cancelled)
    return code


def _async_unary_code(context, error: BaseException | None) -> grpc.StatusCode:
    return grpc.StatusCode.CANCELLED if isinstance(error, asyncio.CancelledError) else _code_of(context, error)


def _async_stream_code(context, error: BaseException | None) -> grpc.StatusCode:
    code = _code_of(context, error)
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)) or (
            error is None and code is grpc.StatusCode.OK and context.cancelled()):
        return grpc.StatusCode.CANCELLED  # the client went away
    return code


async def _async_counting(items: AsyncIterator[Any], counter) -> AsyncIterator[Any]:
    async for item in items:
        counter.inc()
        yield item


def _counting(items, counter) -> Iterator[Any]:
    for item in items:
        counter.inc()
        yield item
