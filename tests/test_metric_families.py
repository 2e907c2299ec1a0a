"""The gateway's own metric families expose exactly what prometheus-client's Counter, Gauge and
Histogram expose after the same updates (the text format and OpenMetrics, `_created` included),
so a scrape cannot tell them apart."""

from __future__ import annotations

import re
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from antwort_grpc.observability import metrics as ours
from antwort_grpc.observability.metrics import DURATION_BUCKETS, TOKEN_BUCKETS

CREATED = re.compile(rb"^(\w+_created(?:\{[^}]*\})?) \S+$", re.M)


def exposed(registry: CollectorRegistry) -> tuple[bytes, bytes]:
    """Both formats, each `_created` timestamp replaced (they differ by when each child was made)."""
    text, openmetrics = generate_latest(registry), generate_openmetrics(registry)
    return CREATED.sub(rb"\1 T", text), CREATED.sub(rb"\1 T", openmetrics)


def updated(module: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    counter = module.Counter("requests", "Requests", ["method", "code"], registry=registry)
    module.Counter("hooks_failed", "Hooks that failed", registry=registry)
    gauge = module.Gauge("open_streams", "Streams open now", registry=registry)
    seconds = module.Histogram(
        "call_seconds", "Call time", ["operation", "error_type"], buckets=DURATION_BUCKETS, registry=registry
    )
    tokens = module.Histogram("tokens", "Tokens", ["type"], buckets=TOKEN_BUCKETS, registry=registry)
    turns = module.Histogram("turns", "Turns", buckets=(1, 2, 3, 5), registry=registry)
    counter.labels("Create", "OK").inc()
    counter.labels("Create", "OK").inc()
    counter.labels("Get", "NotFound").inc(3)
    gauge.inc()
    gauge.inc()
    gauge.dec()
    # On a bound, between bounds, beyond the last one, and zero.
    for value in (0.01, 0.015, 0.3, 81.92, 500.0, 0.0):
        seconds.labels("chat", "").observe(value)
    seconds.labels("chat", "rate_limited").observe(0.2)
    for value in (1, 20, 70000000):
        tokens.labels("output").observe(value)
    turns.observe(2)
    turns.observe(9)
    return registry


def test_the_families_expose_what_prometheus_clients_own_metrics_expose() -> None:
    assert exposed(updated(ours)) == exposed(updated(prometheus_client))


def test_without_created_series_neither_shows_them() -> None:
    prometheus_client.disable_created_metrics()
    try:
        text, _ = exposed(updated(ours))
        assert b"_created" not in text
        assert exposed(updated(ours)) == exposed(updated(prometheus_client))
    finally:
        prometheus_client.enable_created_metrics()


def test_a_family_refuses_the_wrong_number_of_labels() -> None:
    counter = ours.Counter("requests", "Requests", ["method"])
    for wrong in ((), ("a", "b")):
        try:
            counter.labels(*wrong)
        except ValueError as err:
            assert "requests" in str(err)
        else:
            raise AssertionError(f"labels{wrong!r} accepted")
