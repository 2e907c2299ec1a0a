"""A real OTLP/gRPC trace receiver for the tracing tests: the collector's TraceService (from
opentelemetry-proto) on a loopback port, keeping every span it is sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    # OTLP status codes: 0 unset, 1 ok, 2 error.
    status: int = 0
    status_message: str = ""


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._changed = asyncio.Condition()

    async def Export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    self.spans.append(
                        Span(
                            str(resource.get("service.name", "")),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            {a.key: _value(a.value) for a in s.attributes},
                            s.status.code,
                            s.status.message,
                        )
                    )
        async with self._changed:
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    async def wait_for(self, check: Callable[[list[Span]], bool], timeout: float = 60) -> list[Span]:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: check(self.spans))
        return self.spans


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[Receiver, str]]:
    server = grpc.aio.server()
    receiver = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        await server.stop(0)
