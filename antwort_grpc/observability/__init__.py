"""Metrics (Prometheus), traces (OpenTelemetry) and the per-response log line of the gateway.

Everything is observed from the edges: the response streams (observer.py, called by the neutral
edge for every door) and wrappers
around the provider, the executors and the store (wrappers.py). With nothing turned on, nothing is
wrapped and nothing is installed: the gateway runs exactly as without this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry import trace

from antwort_grpc.executors.base import ToolExecutor
from antwort_grpc.observability.metrics import Metrics, MetricsServer, serve_metrics
from antwort_grpc.observability.observer import Observer
from antwort_grpc.observability.wrappers import ObservedExecutor, ObservedProvider, ObservedStore
from antwort_grpc.providers.base import Provider
from antwort_grpc.storage.base import ResponseStore
from antwort_grpc.tracing import tracer_from_environment


@dataclass
class Observability:
    metrics: Metrics | None
    tracer: trace.Tracer | None
    log_responses: bool
    metrics_listen: str = ""
    server: MetricsServer | None = None
    executors: list[ToolExecutor] = field(default_factory=list)

    @classmethod
    def build(cls, *, metrics_listen: str, log_format: str, service_name: str = "antwort-grpc") -> Observability | None:
        """None when metrics, traces and JSON logs are all off."""
        tracer = tracer_from_environment(service_name)
        metrics = Metrics() if metrics_listen else None
        log_responses = log_format == "json"
        if metrics is None and tracer is None and not log_responses:
            return None
        return cls(metrics, tracer, log_responses, metrics_listen)

    def provider(self, provider: Provider) -> Provider:
        return ObservedProvider(provider, self.metrics, self.tracer)

    def store(self, store: ResponseStore) -> ResponseStore:
        return ObservedStore(store, self.metrics) if self.metrics is not None else store

    def wrap_executors(self, executors: Sequence[ToolExecutor]) -> list[ToolExecutor]:
        self.executors = list(executors)
        return [ObservedExecutor(e, self.metrics, self.tracer) for e in executors]

    def observer(self) -> Observer:
        """What watches each response stream (the edge calls it for every door)."""
        return Observer(self.metrics, self.tracer, self.log_responses)

    def start(self) -> None:
        """The /metrics endpoint, when metrics are on."""
        if self.metrics is not None and self.server is None:
            self.metrics.watch_executors(lambda: self.executors)
            self.server = serve_metrics(self.metrics_listen, self.metrics.registry)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
