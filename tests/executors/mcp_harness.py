"""Helpers for the MCP bridge tests: real MCP server processes and a bridge on a loopback port."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from antwort_grpc import pb
from antwort_grpc.tool_services.mcp import McpBridge, McpBridgeSettings, McpServerConfig
from antwort_grpc.tool_services.sdk import serve_executor

SERVERS = Path(__file__).with_name("mcp_servers.py")
# Generous for a process start (importing the SDK takes a second or two), short for the rest.
FAST = {"connect_timeout": 10.0, "reconnect_max_seconds": 0.5}


def stdio_server(label: str, kind: str = "tools") -> McpServerConfig:
    return McpServerConfig(label=label, transport="stdio", command=sys.executable, args=[str(SERVERS), kind, "stdio"])


def http_server(label: str, url: str, **fields: Any) -> McpServerConfig:
    return McpServerConfig(label=label, transport="streamable_http", url=url, **fields)


@dataclass
class HttpMcpServer:
    kind: str
    port: int
    process: asyncio.subprocess.Process
    token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            await asyncio.wait_for(self.process.wait(), 15)


async def start_http_server(kind: str = "tools", *, port: int = 0, token: str | None = None) -> HttpMcpServer:
    """A server process on 127.0.0.1, returned once its socket listens."""
    args = [str(SERVERS), kind, "http", "--port", str(port), *(["--token", token] if token else [])]
    process = await asyncio.create_subprocess_exec(sys.executable, *args, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
    assert line.startswith("listening on "), line
    return HttpMcpServer(kind, int(line.split()[-1]), process, token)


@asynccontextmanager
async def running_http_server(kind: str = "tools", *, token: str | None = None) -> AsyncIterator[HttpMcpServer]:
    server = await start_http_server(kind, token=token)
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def running_bridge(servers: list[McpServerConfig], **settings: Any) -> AsyncIterator[pb.ToolExecutorServiceStub]:
    """The bridge behind its real ToolExecutorService on a loopback port."""
    bridge = McpBridge(servers, McpBridgeSettings(**{**FAST, **settings}))
    running = await serve_executor(bridge)
    try:
        async with grpc.aio.insecure_channel(running.target) as channel:
            yield pb.ToolExecutorServiceStub(channel)
    finally:
        await running.stop(0)


@dataclass
class Outcome:
    progress: list[str]
    result: pb.FunctionCallOutput

    @property
    def output(self) -> str:
        return self.result.output

    @property
    def is_error(self) -> bool:
        return self.result.is_error


def mcp_tool(label: str, allowed: list[str] | None = None) -> pb.Tool:
    return pb.Tool(mcp=pb.McpTool(server_label=label, allowed_tools=allowed or []))


async def execute(
    stub: pb.ToolExecutorServiceStub, label: str, name: str, /, *, routed_by: pb.Tool | None = None, **arguments: Any
) -> Outcome:
    """One Execute call the way the gateway makes it: the call, and the request's tool that it
    was routed by (by default the mcp tool naming the server)."""
    call = pb.FunctionCall(call_id=f"call_{name}", name=name, arguments=json.dumps(arguments))
    request = pb.ExecuteRequest(call=call, tool=routed_by or mcp_tool(label))
    updates = [u async for u in stub.Execute(request, timeout=60)]
    assert [u.WhichOneof("update") for u in updates[-1:]] == ["result"]
    assert all(u.WhichOneof("update") == "progress" for u in updates[:-1])
    assert updates[-1].result.call_id == call.call_id
    return Outcome([u.progress.message for u in updates[:-1]], updates[-1].result)


async def listed(stub: pb.ToolExecutorServiceStub) -> list[tuple[str, str]]:
    info = await stub.GetExecutorInfo(pb.GetExecutorInfoRequest())
    return [(t.server_label, t.function.name) for t in info.tools]
