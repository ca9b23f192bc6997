"""Counters, gauges and histograms for the domain, with no dependency: one registry per service.

The domain registers a figure with one line in the module that owns it and counts on the object it
gets back::

    self._hits = metrics.counter("mqstore_txn_cache_hits_total", "half messages served from the cache")
    self._hits.inc()
    metrics.gauge_fn("mqstore_txn_open", "open transactions", lambda: table.counts()[OPEN])
    metrics.counter_fn("mqstore_index_reconnects_total", "...", lambda: follower.state().reconnects)

and reads the same object where a Stats RPC reports the figure (``self._hits.value``), so a figure is
counted once. The service layer (mqstore_rpc.metrics) hands the registry to prometheus-client, which
serves it at ``/metrics``; core never imports it (tests/test_layering.py).

Kinds, as Prometheus has them: a counter only goes up (its name ends in ``_total``); a gauge is set, or
read from a function at collection time (``gauge_fn``: a value, or a mapping of label values to values
for a labelled gauge), and ``counter_fn`` does the same for a count an object already keeps; a
histogram counts observations into fixed buckets (upper bounds, seconds for ``*_seconds``) and keeps
their sum. A metric with label names is used through ``labels(*values)``,
which returns the child for those values (created once, then cached); a function gauge returns every
child's value at once.

A registry that nothing exports (a unit test's, the default of a class built without one) costs the
same and is simply never read. Names are checked once, at registration: the Prometheus name syntax,
``_total`` for counters, one registration per name per registry.

Thread-safety: every metric may be updated and read from any thread (each has its own lock: an
update is a few hundred nanoseconds); registration is for composition, but is locked too.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import structlog

from mqstore.errors import InvalidArgument, MqStoreError

log = structlog.get_logger("mqstore.metrics")

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Latency buckets in seconds, 100 us to 10 s: an Append's handling time sits in the low milliseconds,
# an fsync in milliseconds to hundreds of milliseconds, a long poll up to 30 s lands in +Inf.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """Cumulative counts per upper bound (the last bound is +Inf), the sum and the count."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    sum: float
    count: int


@dataclass(frozen=True, slots=True)
class Family:
    """What a metric holds at collection time: (label values, value) per child."""

    name: str
    kind: str
    documentation: str
    label_names: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float | HistogramValue], ...]


class _Value:
    """One counted or set number. Thread-safe."""

    __slots__ = ("_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0.0

    @property
    def value(self) -> float:
        return self._value

    def _add(self, amount: float) -> None:
        with self._lock:
            self._value += amount


class CounterChild(_Value):
    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise InvalidArgument(f"a counter only goes up: inc({amount})")
        with self._lock:  # _add written out: a gRPC call counts four times (mqstore_rpc.metrics)
            self._value += amount


class GaugeChild(_Value):
    __slots__ = ()

    def set(self, value: float) -> None:
        self._value = float(value)  # one reference store: atomic

    def inc(self, amount: float = 1) -> None:
        self._add(amount)

    def dec(self, amount: float = 1) -> None:
        self._add(-amount)


class HistogramChild:
    """Observations into fixed buckets. Thread-safe."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum", "_count")

    def __init__(self, bounds: tuple[float, ...]):
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._lock = threading.Lock()
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        slot = bisect.bisect_left(self._bounds, value)
        with self._lock:
            self._counts[slot] += 1
            self._sum += value
            self._count += 1

    @property
    def value(self) -> HistogramValue:
        with self._lock:
            counts, total, count = list(self._counts), self._sum, self._count
        cumulative, running = [], 0
        for c in counts:
            running += c
            cumulative.append(running)
        return HistogramValue((*self._bounds, math.inf), tuple(cumulative), total, count)


class Metric:
    """A registered metric: its children by label values (one child, ``()``, without labels)."""

    def __init__(self, name: str, kind: str, documentation: str, label_names: tuple[str, ...],
                 make_child: Callable[[], object]):
        self.name, self.kind, self.documentation, self.label_names = name, kind, documentation, label_names
        self._make_child = make_child
        self._children: dict[tuple[str, ...], object] = {}
        self._lock = threading.Lock()
        if not label_names:
            self._children[()] = make_child()

    def labels(self, *values: object):
        """The child for these label values (as many as label names; turned into strings)."""
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is not None:
            return child
        if len(key) != len(self.label_names):
            raise InvalidArgument(f"{self.name} has labels {self.label_names}: give {len(self.label_names)} "
                                  f"values, not {len(key)}")
        with self._lock:
            return self._children.setdefault(key, self._make_child())

    def remove(self, *values: object) -> None:
        """Forget a child (a deleted topic's), so that it is no longer exported."""
        with self._lock:
            self._children.pop(tuple(str(v) for v in values), None)

    def _only(self):
        if self.label_names:
            raise InvalidArgument(f"{self.name} has labels {self.label_names}: use .labels(...)")
        return self._children[()]

    # Unlabelled use goes straight to the one child.
    def inc(self, amount: float = 1) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._only().dec(amount)

    def set(self, value: float) -> None:
        self._only().set(value)

    def observe(self, value: float) -> None:
        self._only().observe(value)

    @property
    def value(self):
        return self._only().value

    def collect(self) -> Family:
        with self._lock:
            children = list(self._children.items())
        return Family(self.name, self.kind, self.documentation, self.label_names,
                      tuple((key, child.value) for key, child in children))


class FunctionMetric:
    """A gauge (or a counter kept elsewhere) read from a function at collection time: a value, or
    label values -> value."""

    def __init__(self, name: str, kind: str, documentation: str, label_names: tuple[str, ...],
                 read: Callable[[], float | Mapping[tuple, float]]):
        self.name, self.kind, self.documentation, self.label_names = name, kind, documentation, label_names
        self._read = read

    @property
    def value(self):
        return self._read()

    def collect(self) -> Family:
        value = self._read()
        if not self.label_names:
            return Family(self.name, self.kind, self.documentation, (), (((), float(value)),))
        samples = tuple((tuple(str(v) for v in key), float(v)) for key, v in value.items())
        return Family(self.name, self.kind, self.documentation, self.label_names, samples)


class Registry:
    """The metrics of one service. Thread-safe."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric | FunctionMetric] = {}
        self._lock = threading.Lock()

    def counter(self, name: str, documentation: str, label_names: Sequence[str] = ()) -> Metric:
        if not name.endswith("_total"):
            raise InvalidArgument(f"counter {name!r}: a counter's name ends in _total")
        return self._add(Metric(name, COUNTER, documentation, self._labels(label_names), CounterChild))

    def gauge(self, name: str, documentation: str, label_names: Sequence[str] = ()) -> Metric:
        return self._add(Metric(name, GAUGE, documentation, self._labels(label_names), GaugeChild))

    def gauge_fn(self, name: str, documentation: str, read: Callable[[], float | Mapping[tuple, float]],
                 label_names: Sequence[str] = ()) -> FunctionMetric:
        """A gauge whose value (or, with label names, mapping of label values to values) ``read()``
        returns when the registry is collected. ``read`` must be quick."""
        return self._add(FunctionMetric(name, GAUGE, documentation, self._labels(label_names), read))

    def counter_fn(self, name: str, documentation: str, read: Callable[[], float | Mapping[tuple, float]],
                   label_names: Sequence[str] = ()) -> FunctionMetric:
        """A counter that an object already keeps (a count it also reports elsewhere): exported as read,
        so that it is counted in one place."""
        if not name.endswith("_total"):
            raise InvalidArgument(f"counter {name!r}: a counter's name ends in _total")
        return self._add(FunctionMetric(name, COUNTER, documentation, self._labels(label_names), read))

    def histogram(self, name: str, documentation: str, buckets: Sequence[float] = LATENCY_BUCKETS_S,
                  label_names: Sequence[str] = ()) -> Metric:
        bounds = tuple(float(b) for b in buckets if b != math.inf)
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise InvalidArgument(f"histogram {name!r}: buckets must be increasing, got {list(buckets)}")
        return self._add(Metric(name, HISTOGRAM, documentation, self._labels(label_names),
                                lambda: HistogramChild(bounds)))

    def get(self, name: str) -> Metric | FunctionMetric:
        """A registered metric by name (tests; KeyError when there is none)."""
        return self._metrics[name]

    def collect(self) -> list[Family]:
        """Every metric's values. A function gauge whose source fails (the metadata database away: a
        store error or an OS error) is left out of this collection and logged as ``metrics.read_failed``;
        the others are collected."""
        with self._lock:
            metrics = list(self._metrics.values())
        families = []
        for metric in metrics:
            try:
                families.append(metric.collect())
            except (MqStoreError, OSError) as exc:
                log.warning("metrics.read_failed", metric=metric.name, error=f"{type(exc).__name__}: {exc}")
        return families

    def _add(self, metric):
        if not _NAME.match(metric.name):
            raise InvalidArgument(f"metric name {metric.name!r} is not [a-zA-Z_:][a-zA-Z0-9_:]*")
        with self._lock:
            if metric.name in self._metrics:
                raise InvalidArgument(f"metric {metric.name!r} is registered twice in one registry")
            self._metrics[metric.name] = metric
        return metric

    @staticmethod
    def _labels(names: Sequence[str]) -> tuple[str, ...]:
        for label in names:
            if not _LABEL.match(label) or label.startswith("__"):
                raise InvalidArgument(f"label name {label!r} is not [a-zA-Z_][a-zA-Z0-9_]*")
        return tuple(names)
