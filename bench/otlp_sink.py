"""An OTLP/gRPC trace receiver that accepts and drops spans (the observability figure's
collector): `python -m bench.otlp_sink` prints `READY <port>`."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from bench.procs import until_stopped


class Sink(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.spans = 0

    async def Export(self, request: Any, context: Any) -> Any:
        self.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


async def _serve() -> None:
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Sink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"READY {port}", flush=True)
    try:
        await until_stopped()
    finally:
        await server.stop(0)


def main() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve())


if __name__ == "__main__":
    main()
