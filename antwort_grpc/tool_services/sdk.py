"""Write your own tool executor service in a few lines.

Subclass `ExecutorService`, say which tools it offers (`list_tools`) and run a call (`execute`);
`serve_executor` puts it behind `antwort.v1.ToolExecutorService` on a grpc.aio server with the
health service and reflection, and `run_executor` serves it until SIGTERM. The sandbox and the
MCP bridge are built on this too.

    class Weather(ExecutorService):
        name = "weather"

        async def list_tools(self) -> list[pb.ExecutorTool]:
            return [function_tool("get_weather", "Weather in a city", {"type": "object", ...})]

        async def execute(self, call, tool, progress):
            return text_result(f"sunny in {json.loads(call.arguments)['city']}")

A gateway started with `--executor host:port` offers these tools to requests that name them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeAlias

import grpc
from google.protobuf import json_format, struct_pb2
from opentelemetry import trace

from antwort_grpc import pb, tracing
from antwort_grpc.errors import RequestError
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.grpc_security import is_loopback
from antwort_grpc.grpc_server import ProgramServing, ServerSpec, bound_address, serve_until_signalled, start_program
from antwort_grpc.grpc_status import abort
from antwort_grpc.tool_services.reaper import reaping_if_init
from antwort_grpc.tool_services.security import ExecutorSecurity

log = logging.getLogger(__name__)

Context: TypeAlias = Any  # grpc ships no type information for the servicer context
SERVICE_NAME = "antwort.v1.ToolExecutorService"


class ExecutorService:
    """One executor service. Override `list_tools` and `execute`; the rest has defaults."""

    kind: pb.ToolKind = pb.ToolKind.TOOL_KIND_CUSTOM
    name: str = "executor"
    # The event loop `antwort-grpc executor` runs it on: None for ANTWORT_EVENT_LOOP's.
    event_loop: str | None = None

    async def list_tools(self) -> list[pb.ExecutorTool]:
        """The tools this service offers, as the model sees them."""
        raise NotImplementedError

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        """Run one call. Return an is_error output for a failure the model should see; an
        exception becomes one too, except a RequestError, which refuses the call with its gRPC
        status (RESOURCE_EXHAUSTED when the service is busy, say)."""
        raise NotImplementedError

    async def can_execute(self, tool: pb.Tool) -> bool:
        """By default: a function tool whose name this service lists, an MCP tool whose server
        label it lists, or a code interpreter when this is a sandbox."""
        kind = tool.WhichOneof("kind")
        if kind == "code_interpreter":
            return bool(self.kind == pb.ToolKind.TOOL_KIND_SANDBOX)
        offered = await self.list_tools()
        if kind == "function":
            return any(t.function.name == tool.function.name for t in offered)
        if kind == "mcp":
            return any(t.server_label == tool.mcp.server_label for t in offered)
        return False

    async def start(self) -> None:
        """Called once before the server accepts calls (connect, warm caches)."""

    async def close(self) -> None:
        """Called once after the server stopped."""


def function_tool(
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    server_label: str = "",
    *,
    timeout: float | None = None,
    idempotent: bool = False,
) -> pb.ExecutorTool:
    """A tool as the model sees it; `timeout` (seconds) is the default limit of one call, which a
    request may override. `idempotent`: a call may safely run twice (a resumed background
    response runs an interrupted call again only then)."""
    schema = struct_pb2.Struct()
    json_format.ParseDict(dict(parameters), schema)
    tool = pb.ExecutorTool(
        function=pb.FunctionTool(name=name, description=description, parameters=schema),
        server_label=server_label,
        idempotent=idempotent,
    )
    if timeout is not None:
        tool.timeout.FromNanoseconds(int(timeout * 1e9))
    return tool


def text_result(output: str, *, is_error: bool = False) -> pb.FunctionCallOutput:
    return pb.FunctionCallOutput(output=output, is_error=is_error)


class ToolExecutorServicer(pb.ToolExecutorServiceServicer):
    """antwort.v1.ToolExecutorService over one ExecutorService."""

    def __init__(self, service: ExecutorService) -> None:
        self.service = service
        self.tracer = tracing.tracer_from_environment("antwort-grpc-executor")

    async def GetExecutorInfo(self, request: pb.GetExecutorInfoRequest, context: Context) -> pb.GetExecutorInfoResponse:
        tools = await self.service.list_tools()
        return pb.GetExecutorInfoResponse(kind=self.service.kind, name=self.service.name, tools=tools)

    async def CanExecute(self, request: pb.CanExecuteRequest, context: Context) -> pb.CanExecuteResponse:
        return pb.CanExecuteResponse(can_execute=await self.service.can_execute(request.tool))

    async def Execute(self, request: pb.ExecuteRequest, context: Context) -> AsyncIterator[pb.ExecuteResponse]:
        """Progress messages as they come, then exactly one result. A client that goes away (or a
        deadline that passes) cancels the running call."""
        if not request.call.name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "call.name is required")
        updates: asyncio.Queue[str] = asyncio.Queue()
        span = self._span(request, context)
        # The call's task runs inside the span (a child of the gateway's tool call span).
        with trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext():
            task = asyncio.create_task(self._run(request, updates.put_nowait))
        try:
            while True:
                next_update = asyncio.ensure_future(updates.get())
                done, _ = await asyncio.wait({task, next_update}, return_when=asyncio.FIRST_COMPLETED)
                if next_update in done:
                    yield pb.ExecuteResponse(progress=pb.ToolProgress(message=next_update.result()))
                    continue
                next_update.cancel()
                while not updates.empty():
                    yield pb.ExecuteResponse(progress=pb.ToolProgress(message=updates.get_nowait()))
                try:
                    result = task.result()
                except RequestError as err:
                    await abort(context, err)
                yield pb.ExecuteResponse(result=result)
                return
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if span is not None:
                span.end()

    def _span(self, request: pb.ExecuteRequest, context: Context) -> trace.Span | None:
        if self.tracer is None:
            # Not tracing here: the caller's context still travels on (to MCP servers, say).
            caller = trace.get_current_span(tracing.extract(context.invocation_metadata()))
            return caller if caller.get_span_context().is_valid else None
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": request.call.name}
        attributes["gen_ai.tool.call.id"] = request.call.call_id
        name = f"execute_tool {request.call.name}"
        return tracing.start_server_span(self.tracer, name, context.invocation_metadata(), attributes)

    async def _run(self, request: pb.ExecuteRequest, progress: ProgressSink) -> pb.FunctionCallOutput:
        call = request.call
        try:
            result = await self.service.execute(call, request.tool, progress)
        except (asyncio.CancelledError, RequestError):
            raise
        except Exception as err:
            log.exception("tool %s (%s) failed", call.name, call.call_id)
            result = text_result(f"tool {call.name!r} failed: {type(err).__name__}: {err}", is_error=True)
        result.call_id = call.call_id
        return result


# A running executor: `.target`, `.port`; `stop()` stops the server and closes the service.
ExecutorServer: TypeAlias = ProgramServing


# The gateway's own limits: a call's code or arguments as large as a request may carry.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


async def serve_executor(
    service: ExecutorService, listen: str = "127.0.0.1:0", security: ExecutorSecurity | None = None
) -> ExecutorServer:
    """Start a grpc.aio server for the service; port 0 picks a free one (see `.port`). `security`:
    the token callers must send and the TLS credentials (default: any caller, plaintext, so only on
    loopback). StartupError for a non-loopback `listen` the security does not guard."""
    security = security or ExecutorSecurity()
    security.refuse_open_listen(listen)
    spec = ServerSpec(
        services=[SERVICE_NAME],
        add_services=lambda server: pb.add_ToolExecutorServiceServicer_to_server(ToolExecutorServicer(service), server),
        credentials=security.credentials,
        interceptors=security.interceptors(),
        max_message_bytes=MAX_MESSAGE_BYTES,
    )
    serving = await start_program(listen, spec, service)
    kind, address = pb.ToolKind.Name(service.kind), bound_address(listen, serving.port)
    log.info("%s executor %r listening on %s (%s)", kind, service.name, address, security.describe())
    if not security.admits_only_the_gateway and not is_loopback(listen):
        log.warning(
            "executor %r serves every caller on %s: no token or mutual TLS (allowed by "
            "ANTWORT_EXECUTOR_ALLOW_UNAUTHENTICATED); keep a network policy in front of it",
            service.name,
            address,
        )
    return serving


async def run_executor(
    service: ExecutorService, listen: str, grace: float = 10.0, security: ExecutorSecurity | None = None
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully. As pid 1 (a container without an
    init) it also reaps orphaned processes."""
    async with reaping_if_init():
        running = await serve_executor(service, listen, security)
        await serve_until_signalled(running, f"antwort-grpc executor {service.name}", grace)
    tracing.shutdown()
