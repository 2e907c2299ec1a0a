"""OpenTelemetry traces, off unless the standard `OTEL_*` variables turn them on.

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set or
`OTEL_TRACES_EXPORTER=otlp`; off with `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
Spans go to an OTLP/gRPC collector through a batch processor (`OTEL_BSP_*`); `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and `OTEL_EXPORTER_OTLP_*` (headers,
certificates, insecure) are read by the SDK as usual. W3C trace context crosses process
boundaries in gRPC metadata and HTTP headers (`traceparent`, `tracestate`).

The gateway does not install a global tracer provider: it keeps its own, so a process may start
several gateways (tests do) and libraries that trace globally are left alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

# W3C trace context only: what every OpenTelemetry SDK and collector understands.
PROPAGATOR = TraceContextTextMapPropagator()

_provider: Any = None


def enabled_by_environment(env: MutableMapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    if exporter not in ("", "otlp"):
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (only otlp); traces stay off", exporter)
        return False
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return exporter == "otlp" or bool(endpoint)


def tracer_from_environment(service_name: str) -> trace.Tracer | None:
    """The process's tracer when the environment turns traces on (made once per process), else None."""
    global _provider
    if not enabled_by_environment():
        return None
    if _provider is None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # Resource.create lets OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES override the default.
        defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
        provider = TracerProvider(resource=Resource.create(defaults))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _provider = provider
        log.info("OpenTelemetry traces are exported over OTLP/gRPC")
    tracer: trace.Tracer = _provider.get_tracer("antwort_grpc")
    return tracer


def shutdown() -> None:
    """Export what is buffered (at process exit)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


# A Context cannot be changed (setting a value makes another): one empty one serves every call
# that comes without a trace.
_NO_TRACE = otel_context.Context()


def extract(metadata: Iterable[tuple[str, Any]] | None) -> otel_context.Context:
    """The caller's trace context from gRPC metadata (an empty context when it sent none)."""
    carrier = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in metadata or () if k.startswith("trace")}
    return PROPAGATOR.extract(carrier) if carrier else _NO_TRACE


def inject(carrier: MutableMapping[str, str]) -> None:
    """Add the current span's trace context (nothing when no span is recording)."""
    if trace.get_current_span().get_span_context().is_valid:
        PROPAGATOR.inject(carrier)


def headers() -> dict[str, str] | None:
    """The current trace context as HTTP headers (`traceparent`, `tracestate`), or None."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier


def start_server_span(
    tracer: trace.Tracer, name: str, metadata: Iterable[tuple[str, Any]] | None, attributes: dict[str, Any]
) -> trace.Span:
    """A span for a call this process serves, a child of the caller's trace context."""
    return tracer.start_span(name, context=extract(metadata), kind=trace.SpanKind.SERVER, attributes=attributes)


def metadata() -> tuple[tuple[str, str], ...] | None:
    """The current trace context as gRPC metadata for an outgoing call, or None."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return tuple(carrier.items())
