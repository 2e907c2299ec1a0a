"""Executor services (built with the SDK) and helpers for the remote executor's tests.

The classes run in the test process (`serve_executor`) or as their own process
(`antwort-grpc executor run tests.executors.remote_services:Blocking`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.executors.base import FunctionExecutor, ProgressSink
from antwort_grpc.executors.remote import RemoteExecutor, RemoteSettings, build_executors, start_all
from antwort_grpc.providers.base import Provider, TurnRequest
from antwort_grpc.tool_services.sdk import ExecutorServer, ExecutorService, function_tool, serve_executor, text_result
from tests.harness import GatewayClient, running_gateway

ROOT = Path(__file__).resolve().parents[2]
OBJECT = {"type": "object", "properties": {"q": {"type": "string"}}}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Recording(ExecutorService):
    """Keeps every call it ran and every CanExecute it was asked."""

    def __init__(self) -> None:
        self.calls: list[pb.FunctionCall] = []
        self.asked: list[pb.Tool] = []

    async def can_execute(self, tool: pb.Tool) -> bool:
        self.asked.append(tool)
        return await super().can_execute(tool)


class Calculator(Recording):
    name = "calculator"

    async def list_tools(self) -> list[pb.ExecutorTool]:
        schema = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}
        return [function_tool("add", "Adds two numbers", schema)]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls.append(call)
        args = json.loads(call.arguments)
        return text_result(str(args["a"] + args["b"]))


class Forecasts(Recording):
    """Like examples/weather_executor.py, and records its calls."""

    name = "weather"

    async def list_tools(self) -> list[pb.ExecutorTool]:
        schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        return [function_tool("get_weather", "Current weather in a city", schema)]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls.append(call)
        city = json.loads(call.arguments)["city"]
        progress(f"looking up {city}")
        progress("reading the sky")
        return text_result(f"{city}: sunny")


class Bridge(Recording):
    """An MCP bridge's face: tools of two MCP servers, told apart by their server label."""

    name = "bridge"
    kind = pb.ToolKind.TOOL_KIND_MCP

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [
            function_tool("search_docs", "Search the docs", OBJECT, server_label="docs"),
            function_tool("fetch_page", "Fetch a docs page", OBJECT, server_label="docs"),
            function_tool("create_ticket", "File a ticket", OBJECT, server_label="tickets"),
        ]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls.append(call)
        return text_result(f"{tool.mcp.server_label}/{call.name} {call.arguments}")


class Sandbox(Recording):
    """A sandbox's face: one function behind `code_interpreter`."""

    name = "sandbox"
    kind = pb.ToolKind.TOOL_KIND_SANDBOX

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [function_tool("run_python", "Run Python code", OBJECT)]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls.append(call)
        return text_result("exit code 0")


class Dynamic(Recording):
    """Lists nothing, but claims every function whose name starts with `dyn_` when asked."""

    name = "dynamic"

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return []

    async def can_execute(self, tool: pb.Tool) -> bool:
        self.asked.append(tool)
        return tool.WhichOneof("kind") == "function" and tool.function.name.startswith("dyn_")

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls.append(call)
        return text_result(f"dynamic {call.name}")


class Blocking(ExecutorService):
    """`slow_step` says it started and then never finishes; `quick_step` answers at once. Run as a
    process, so a test can kill it mid-call."""

    name = "blocking"

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [function_tool("slow_step", "Never ends", OBJECT), function_tool("quick_step", "Answers", OBJECT)]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        if call.name == "quick_step":
            return text_result(f"quick step done (pid {os.getpid()})")
        progress("started")
        await asyncio.Event().wait()
        return text_result("never")


# -- helpers --------------------------------------------------------------------------------------

FAST = RemoteSettings(refresh_interval=5.0, retry_interval=0.1, info_timeout=1.0, call_timeout=30.0)


@dataclass
class Setup:
    gateway: GatewayClient
    remotes: list[RemoteExecutor]
    servers: list[ExecutorServer]


@asynccontextmanager
async def gateway_with_services(
    provider: Provider, *services: ExecutorService, settings: RemoteSettings = FAST
) -> AsyncIterator[Setup]:
    """Each service on its own loopback port, a RemoteExecutor per service, and a real gateway
    that routes to them (client functions go to the client, as in `antwort-grpc serve`)."""
    servers = [await serve_executor(s) for s in services]
    remotes = build_executors([s.target for s in servers], settings)
    try:
        await start_all(remotes)
        async with running_gateway(provider=provider, executors=[FunctionExecutor(), *remotes]) as gw:
            yield Setup(gw, remotes, servers)
    finally:
        for remote in remotes:
            await remote.close()
        for server in servers:
            await server.stop(0)


@asynccontextmanager
async def gateway_with_remote(
    provider: Provider, target: str, settings: RemoteSettings = FAST
) -> AsyncIterator[tuple[GatewayClient, RemoteExecutor]]:
    """A real gateway with one RemoteExecutor of `target` (which may be down)."""
    async with (
        RemoteExecutor(target, settings) as remote,
        running_gateway(provider=provider, executors=[FunctionExecutor(), remote]) as gw,
    ):
        yield gw, remote


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_for_health(target: str, service: str, status: int, timeout: float = 15.0) -> None:
    """Until the health service at `target` reports `status` for `service` (Watch, not polling)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        async with asyncio.timeout(timeout):
            async for reply in stub.Watch(health_pb2.HealthCheckRequest(service=service)):
                if reply.status == status:
                    return
    raise AssertionError(f"health watch of {service} ended")


@dataclass
class ExecutorProcess:
    proc: asyncio.subprocess.Process
    target: str

    @property
    def port(self) -> int:
        return int(self.target.rsplit(":", 1)[1])


async def start_process(*args: str, env: dict[str, str] | None = None) -> ExecutorProcess:
    """`antwort-grpc ARGS…` (the gateway or an executor role) as a child process, returned once
    it says it is serving. Its output after that line is not read (its logs go to stderr)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "ANTWORT_SHUTDOWN_DRAIN": "0", **(env or {})}
    cli = [sys.executable, "-m", "antwort_grpc.cli", *args]
    proc = await asyncio.create_subprocess_exec(*cli, cwd=ROOT, env=environment, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await proc.stdout.readline()).decode()
                assert line, f"antwort-grpc {' '.join(args)} exited before it was serving"
                if "serving on" in line:
                    return ExecutorProcess(proc, line.rsplit(" ", 1)[-1].strip())
    except BaseException:
        await stop_process(proc)
        raise


async def start_executor_process(service: str, listen: str = "127.0.0.1:0") -> ExecutorProcess:
    """`antwort-grpc executor run <service>` as a child process, once it is serving."""
    return await start_process("executor", "run", service, "--listen", listen)


async def stop_process(proc: asyncio.subprocess.Process, *, graceful: bool = False) -> None:
    """kill -9, or SIGTERM first (the process shuts down cleanly, children included)."""
    if proc.returncode is None:
        if graceful:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
        else:
            proc.kill()
    await proc.wait()


def tool_outputs(request: TurnRequest) -> list[pb.FunctionCallOutput]:
    return [i.function_call_output for i in request.items if i.WhichOneof("kind") == "function_call_output"]


def offered(request: TurnRequest) -> list[str]:
    return [f.name for f in request.tools]


def tools_request(text: str, tools: Sequence[pb.Tool]) -> pb.CreateResponseRequest:
    request = pb.CreateResponseRequest(input_text=text)
    request.tools.extend(tools)
    return request


def function(name: str) -> pb.Tool:
    return pb.Tool(function=pb.FunctionTool(name=name, description=f"the {name} tool"))


def mcp(label: str, *allowed: str) -> pb.Tool:
    return pb.Tool(mcp=pb.McpTool(server_label=label, allowed_tools=list(allowed)))


CODE_INTERPRETER = pb.Tool(code_interpreter=pb.CodeInterpreterTool())
