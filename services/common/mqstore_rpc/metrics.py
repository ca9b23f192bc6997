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

What a call counts and with which status is :class:`_MethodFigures`' rule. Every handler it wraps is async,
answered on the server's loop (a synchronous servicer method was made so by mqstore_rpc.aio, its body run in
the handler pool), so a call's time runs from its start on the loop to its status there.

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
_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


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
    """The rule of this interceptor for one method's handler: its metric children, resolved once, and what a
    call counts (:meth:`receive`, :meth:`ended`)."""

    def __init__(self, rpc: "RpcMetrics", method: str, handler: grpc.RpcMethodHandler):
        service, name = _split(method)
        labels = (_rpc_type(handler), service, name)
        self.labels = labels
        self.started = rpc.started.labels(*labels)
        self.seconds = rpc.seconds.labels(*labels)
        self.received = rpc.received.labels(*labels)
        self.sent = rpc.sent.labels(*labels)
        self._handled = rpc.handled
        self._by_code: dict[grpc.StatusCode, Any] = {}
        self._ok: Any = None  # handled(OK), the common ending, once a call has ended so (:meth:`ended_unary`)
        self._stream = handler.response_streaming
        if not handler.request_streaming:
            self.receive = self._received_one
        else:
            self.receive = functools.partial(_async_counting, counter=self.received)

    def _received_one(self, request: Any) -> Any:
        self.received.inc()
        return request

    def handled(self, code: grpc.StatusCode):
        child = self._by_code.get(code)
        if child is None:
            child = self._by_code[code] = self._handled.labels(*self.labels, code.name)
        return child

    def ended(self, context, error: BaseException | None, seconds: float) -> None:
        """One call ended with ``error`` (None: none) after ``seconds``: counted by the status it ended with.

        That status is what the handler (or the error interceptor's abort) set, else OK without an error and
        UNKNOWN with one, except when the client went away: the call's task cancelled (or its response
        generator closed), or a response stream that ended OK after its call had been cancelled (a Tail)."""
        if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
            code = grpc.StatusCode.CANCELLED
        else:
            code = context.code() if hasattr(context, "code") else None
            if isinstance(code, int) and not isinstance(code, grpc.StatusCode):  # some grpc versions keep its number
                code = _CODE_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
            elif not isinstance(code, grpc.StatusCode):
                code = grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN
            if self._stream and error is None and code is grpc.StatusCode.OK and context.cancelled():
                code = grpc.StatusCode.CANCELLED
        self.handled(code).inc()
        self.seconds.observe(seconds)

    def ended_unary(self, context, seconds: float) -> None:
        """A unary-response call that ended without an error: :meth:`ended`'s rule, the status no handler set
        (grpc.aio's context answers None: OK) counted without its steps."""
        if (context.code() if hasattr(context, "code") else None) is not None:
            self.ended(context, None, seconds)
            return
        ok = self._ok
        if ok is None:
            ok = self._ok = self.handled(grpc.StatusCode.OK)
        ok.inc()
        self.seconds.observe(seconds)


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
        return self._wrapped.get(handler_call_details.method, handler,
                                 lambda h: self._wrap(h, handler_call_details.method))

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        behavior = behavior_of(handler)
        if inspect.iscoroutinefunction(behavior):
            wrap = _async_unary
        elif inspect.isasyncgenfunction(behavior):
            wrap = _async_stream
        else:
            raise TypeError(f"{method}: the per-RPC metrics wrap async handlers only (mqstore_rpc.aio.on_loop makes "
                            f"them)")
        return like(handler, wrap(behavior, _MethodFigures(self, method, handler), self._clock))


# The adapters: the steps around a unary-response behavior and a stream's, the rule being _MethodFigures'.

def _async_unary(behavior: Callable, figures: _MethodFigures, clock: Callable[[], float]) -> Callable:
    # _Timed's steps written out: this runs for every unary call on the loop (bench/README.md, *GetStoreInfo's layer*)
    started, sent, receive = figures.started, figures.sent, figures.receive

    @functools.wraps(behavior)
    async def wrapper(request_or_iterator, context):
        started.inc()
        start = clock()
        try:
            response = await behavior(receive(request_or_iterator), context)
            sent.inc()
        except BaseException as error:
            figures.ended(context, error, clock() - start)
            raise
        figures.ended_unary(context, clock() - start)
        return response
    return wrapper


def _async_stream(behavior: Callable, figures: _MethodFigures, clock: Callable[[], float]) -> Callable:
    @functools.wraps(behavior)
    async def wrapper(request_or_iterator, context):
        with _Timed(figures, clock, context):
            async for response in behavior(figures.receive(request_or_iterator), context):
                figures.sent.inc()
                yield response
    return wrapper


class _Timed:
    """One call's figures: started on entry; on exit ended (:meth:`_MethodFigures.ended`) with the error it
    ended with (None: none) and the time in between."""

    __slots__ = ("_figures", "_clock", "_context", "_start")

    def __init__(self, figures: _MethodFigures, clock: Callable[[], float], context):
        self._figures, self._clock, self._context = figures, clock, context

    def __enter__(self) -> None:
        self._figures.started.inc()
        self._start = self._clock()

    def __exit__(self, exc_type, error: BaseException | None, traceback) -> bool:
        self._figures.ended(self._context, error, self._clock() - self._start)
        return False  # the error goes on


async def _async_counting(items: AsyncIterator[Any], counter) -> AsyncIterator[Any]:
    async for item in items:
        counter.inc()
        yield item
