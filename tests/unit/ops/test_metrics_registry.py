"""mqstore.metrics (the domain's registry) and its hand-over to prometheus-client (mqstore_rpc.metrics)."""

from __future__ import annotations

import math
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mqstore.errors import InvalidArgument, Unavailable
from mqstore.metrics import Registry
from mqstore_rpc.metrics import RegistryCollector


def exposition(registry: Registry) -> dict[tuple[str, tuple], float]:
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(RegistryCollector(registry))
    text = generate_latest(collectors).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_counters_gauges_and_labels_are_exported_as_prometheus_reads_them():
    registry = Registry()
    appended = registry.counter("x_appended_total", "appended")
    by_code = registry.counter("x_calls_total", "calls", ("code",))
    level = registry.gauge("x_level", "a level")
    appended.inc(3)
    by_code.labels("OK").inc()
    by_code.labels("OK").inc()
    by_code.labels("NOT_FOUND").inc()
    level.set(7.5)
    level.dec(0.5)
    registry.gauge_fn("x_read", "read at collection", lambda: 42)
    registry.gauge_fn("x_by_topic", "per topic", lambda: {("a",): 1, ("b",): 2}, ("topic",))
    registry.counter_fn("x_kept_total", "kept elsewhere", lambda: 9)
    out = exposition(registry)
    assert out[("x_appended_total", ())] == 3
    assert out[("x_calls_total", (("code", "OK"),))] == 2
    assert out[("x_calls_total", (("code", "NOT_FOUND"),))] == 1
    assert out[("x_level", ())] == 7.0
    assert out[("x_read", ())] == 42
    assert out[("x_by_topic", (("topic", "b"),))] == 2
    assert out[("x_kept_total", ())] == 9
    assert appended.value == 3 and by_code.labels("OK").value == 2  # what a Stats RPC reads


def test_histogram_buckets_are_cumulative_with_sum_and_count():
    registry = Registry()
    seconds = registry.histogram("x_seconds", "latency", buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        seconds.observe(value)
    out = exposition(registry)
    assert out[("x_seconds_bucket", (("le", "0.1"),))] == 2      # 0.05 and 0.1 (upper bounds are inclusive)
    assert out[("x_seconds_bucket", (("le", "1.0"),))] == 3
    assert out[("x_seconds_bucket", (("le", "+Inf"),))] == 4
    assert out[("x_seconds_count", ())] == 4
    assert math.isclose(out[("x_seconds_sum", ())], 3.65)
    assert seconds.value.count == 4


def test_registration_mistakes_are_refused():
    registry = Registry()
    registry.counter("x_total", "x")
    with pytest.raises(InvalidArgument, match="registered twice"):
        registry.counter("x_total", "again")
    with pytest.raises(InvalidArgument, match="ends in _total"):
        registry.counter("x_count", "no suffix")
    with pytest.raises(InvalidArgument, match="metric name"):
        registry.gauge("bad-name", "dash")
    with pytest.raises(InvalidArgument, match="label name"):
        registry.gauge("y", "y", ("__reserved",))
    with pytest.raises(InvalidArgument, match="increasing"):
        registry.histogram("h", "h", buckets=(1.0, 0.5))
    with pytest.raises(InvalidArgument, match="only goes up"):
        registry.counter("z_total", "z").inc(-1)
    with pytest.raises(InvalidArgument, match="labels"):
        registry.counter("l_total", "l", ("code",)).inc()


def test_a_failing_source_is_left_out_of_one_collection_and_the_rest_is_collected():
    registry = Registry()
    registry.counter("ok_total", "fine").inc()

    def away():
        raise Unavailable("metadata database away")
    registry.gauge_fn("broken", "its source fails", away)
    names = {family.name for family in registry.collect()}
    assert names == {"ok_total"}


def test_counting_from_many_threads_loses_nothing():
    registry = Registry()
    counter = registry.counter("c_total", "c", ("t",))
    threads = [threading.Thread(target=lambda: [counter.labels("a").inc() for _ in range(5000)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.labels("a").value == 40_000
