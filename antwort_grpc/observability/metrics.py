"""The gateway's Prometheus metrics (prometheus-client), on their own registry and HTTP port.

OpenTelemetry GenAI semantic-convention metrics where one exists, in their Prometheus form (dots
become underscores, the unit a suffix), with the conventions' bucket boundaries:

- `gen_ai_client_operation_duration_seconds`, `gen_ai_client_token_usage`: each model call the
  gateway makes to its backend (it is the backend's client);
- `gen_ai_server_request_duration_seconds`, `gen_ai_server_time_to_first_token_seconds`,
  `gen_ai_server_time_per_output_token_seconds`: each response the gateway serves (it is a GenAI
  server to its callers; the last two for streamed responses).

Every RPC the server handles, in the `grpc_server_*` family of go-grpc-prometheus (started,
handled by status code, handling time; rpc_metrics.py). The process: CPU, memory, open file
descriptors (`process_*`), the interpreter and its garbage collector (`python_*`).

And ours, `antwort_*`: responses by terminal status, turns per response, tool calls by tool,
executor and outcome with their durations, executor health, store latency, open streams, backend
errors by code, hook failures, requests refused before they started. docs/observability.md lists
every metric.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from threading import Thread
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    start_http_server,
)
from prometheus_client import metrics as client_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

log = logging.getLogger(__name__)

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
# Finer at the low end than the GenAI durations: a store write takes milliseconds.
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TURN_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)
# An RPC is a read of a few milliseconds or a stream of minutes (a Converse session is one RPC).
RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")

GENAI_MODEL = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")


class ExecutorHealth(Collector):
    """`antwort_executor_up{executor}`: 1 while the gateway can reach the executor service, read
    from the remote executors themselves at scrape time."""

    def __init__(self, executors: Callable[[], Sequence[Any]]) -> None:
        self.executors = executors

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "antwort_executor_up",
            "Whether the gateway reaches the executor service (1) or not (0)",
            labels=["executor"],
        )
        for executor in self.executors():
            target = getattr(executor, "target", None)
            if target is not None:
                family.add_metric([str(target)], 1.0 if executor.healthy else 0.0)
        yield family


class _Family(Collector):
    """A metric family of prometheus-client's exposition, kept the cheap way.

    prometheus-client's Counter, Gauge and Histogram take a lock and run several Python-level
    checks on every update: about 4,000 instructions a counter increment and 9,000 a histogram
    observation, a dozen of them per response. Every update here comes from the gateway's event
    loop (one thread), so a child is a few plain numbers updated in place (a histogram finds its
    bucket by bisection), and the scrape's thread reads them as they are, as it reads
    prometheus-client's (which keeps no lock across a histogram's buckets either). The exposition
    is prometheus-client's, sample for sample: `_total`, `_bucket`/`_count`/`_sum`, `_created`
    when prometheus-client shows it (`tests/observability/test_metric_families.py`)."""

    kind = ""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), registry: CollectorRegistry | None = None
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        if not self.labelnames:
            self._only = self._children[()] = self._child()
        if registry is not None:
            registry.register(self)

    def _child(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames) or not self.labelnames:
                raise ValueError(f"{self.name} takes the labels {self.labelnames}, got {values!r}")
            key = tuple(str(v) for v in values)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._child()
            self._children[values] = child
        return child

    def _series(self) -> list[tuple[list[str], Any]]:
        seen: set[int] = set()
        series = []
        for values, child in list(self._children.items()):
            if id(child) not in seen and all(type(v) is str for v in values):
                seen.add(id(child))
                series.append((list(values), child))
        return series

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]


class _CounterChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Counter(_Family):
    kind = "counter"

    def _child(self) -> _CounterChild:
        return _CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only.value += amount

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = client_metrics._use_created
        for values, child in self._series():
            family.add_metric(values, child.value, created=child.created if created else None)
        return [family]


class _GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class Gauge(_Family):
    kind = "gauge"

    def _child(self) -> _GaugeChild:
        return _GaugeChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._only.value -= amount

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._series():
            family.add_metric(values, child.value)
        return [family]


class _HistogramChild:
    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        # The first bucket whose bound is at least `amount` (the last is +Inf).
        self.counts[bisect_left(self.bounds, amount)] += 1


class Histogram(_Family):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.bounds = (*(float(b) for b in buckets), INF)
        self._les: list[str] = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _child(self) -> _HistogramChild:
        return _HistogramChild(self.bounds)

    def observe(self, amount: float) -> None:
        self._only.observe(amount)

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = client_metrics._use_created
        for values, child in self._series():
            cumulative, total = [], 0.0
            for le, count in zip(self._les, child.counts, strict=True):
                total += count
                cumulative.append((le, total))
            family.add_metric(values, cumulative, child.sum)
            if created:
                # As prometheus-client's Histogram shows it (HistogramMetricFamily takes no `created`).
                labels = dict(zip(self.labelnames, values, strict=True))
                family.add_sample(f"{self.name}_created", labels, child.created)
        return [family]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.client_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "GenAI operation duration: one model call to the backend",
            [*GENAI_MODEL, "error_type"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.client_tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens used by one model call, by token type",
            [*GENAI_MODEL, "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.server_duration = Histogram(
            "gen_ai_server_request_duration_seconds",
            "Duration of one response served, from the request to its terminal event",
            ["gen_ai_operation_name", "gen_ai_request_model", "error_type"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from the request to the first output token streamed",
            ["gen_ai_operation_name", "gen_ai_request_model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Time per output token after the first, of one streamed response",
            ["gen_ai_operation_name", "gen_ai_request_model"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.responses = Counter(
            "antwort_responses", "Responses that ended, by terminal status", ["status", "model"], registry=r
        )
        self.turns = Histogram(
            "antwort_response_turns", "Model turns per finished response", buckets=TURN_BUCKETS, registry=r
        )
        self.tool_calls = Counter(
            "antwort_tool_calls",
            "Server-side tool calls by tool, executor and outcome",
            ["tool", "executor", "outcome"],
            registry=r,
        )
        self.tool_duration = Histogram(
            "antwort_tool_call_duration_seconds",
            "Duration of server-side tool calls",
            ["tool", "executor", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.store_duration = Histogram(
            "antwort_store_operation_duration_seconds",
            "Latency of response store operations",
            ["operation", "outcome"],
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.open_streams = Gauge(
            "antwort_open_streams", "Response streams (CreateResponse, Converse) open now", registry=r
        )
        self.backend_errors = Counter(
            "antwort_backend_errors", "Model backend failures by error code", ["code"], registry=r
        )
        self.hook_failures = Counter("antwort_hook_failures", "Policy hooks that failed during a response", registry=r)
        self.refused = Counter(
            "antwort_requests_refused",
            "Requests refused before they started, by method, gRPC status code and reason",
            ["method", "code", "reason"],
            registry=r,
        )
        self.rpc_started = Counter("grpc_server_started", "RPCs started on the server", RPC_LABELS, registry=r)
        self.rpc_handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, whatever their status",
            [*RPC_LABELS, "grpc_code"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from an RPC's arrival (before authentication) to its status",
            RPC_LABELS,
            buckets=RPC_BUCKETS,
            registry=r,
        )
        # The process (CPU, resident memory, open file descriptors), the interpreter and its
        # collector: what prometheus-client registers on its default registry, on ours.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)

    def watch_executors(self, executors: Callable[[], Sequence[Any]]) -> None:
        self.registry.register(ExecutorHealth(executors))

    def child(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)` (a dictionary lookup: the families keep their children)."""
        return metric.labels(*values)


class MetricsServer:
    """The /metrics HTTP endpoint on its own port (a thread of prometheus-client)."""

    def __init__(self, server: Any, thread: Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(listen: str, registry: CollectorRegistry) -> MetricsServer:
    host, _, port = listen.rpartition(":")
    server, thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=registry)
    return MetricsServer(server, thread)
