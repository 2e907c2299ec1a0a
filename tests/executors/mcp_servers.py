"""Real MCP servers for the bridge's tests, built with the official SDK, run as processes.

    python tests/executors/mcp_servers.py tools stdio
    python tests/executors/mcp_servers.py tools http [--port N] [--token T]
    python tests/executors/mcp_servers.py paging stdio|http [--port N]

Over HTTP the server binds its socket before it prints "listening on PORT", so a test that has
read that line can connect at once (the kernel queues the connection until uvicorn accepts).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import sys
from typing import Any

import anyio
import uvicorn
from mcp import types as mt
from mcp.server import Server, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

PAGING_TOOLS = 7
PAGE_SIZE = 3


class Sum(BaseModel):
    total: int


def tools_server() -> MCPServer:
    server = MCPServer("tools")
    arrivals: list[asyncio.Event] = []

    @server.tool()
    def echo(text: str) -> str:
        """Repeat the text."""
        return text

    @server.tool()
    def add(a: int, b: int) -> Sum:
        """Add two integers (structured result)."""
        return Sum(total=a + b)

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails with the given reason."""
        raise ToolError(reason)

    @server.tool()
    async def countdown(steps: int, ctx: Context) -> str:
        """Reports progress for each step."""
        for done in range(1, steps + 1):
            await ctx.report_progress(done, steps, f"step {done}")
        return "liftoff"

    @server.tool()
    def whoami(ctx: Context) -> dict[str, str]:
        """The request headers the server received that the tests care about."""
        headers = ctx.headers or {}
        return {name: headers.get(name, "") for name in ("authorization", "x-tenant")}

    @server.tool()
    def trace_context(ctx: Context) -> str:
        """The W3C traceparent the call carried in its _meta ("" without one)."""
        meta = ctx.request_context.meta or {}
        return str(meta.get("traceparent", ""))

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Answers after the given time."""
        await anyio.sleep(seconds)
        return "awake"

    @server.tool()
    def pid() -> int:
        """This server process's id."""
        return os.getpid()

    @server.tool()
    def exit_now() -> str:
        """Ends the server process in the middle of the call."""
        os._exit(3)

    @server.tool()
    async def rendezvous() -> str:
        """Returns once a second call has arrived: proves two calls run at the same time."""
        mine = asyncio.Event()
        arrivals.append(mine)
        if len(arrivals) % 2 == 0:
            for event in arrivals:
                event.set()
        with anyio.fail_after(10):
            await mine.wait()
        return "met"

    @server.tool()
    def picture() -> mt.CallToolResult:
        """Text, an image and a resource link."""
        return mt.CallToolResult(
            content=[
                mt.TextContent(text="a red dot"),
                mt.ImageContent(data=base64.b64encode(b"\x89PNG1234").decode(), mime_type="image/png"),
                mt.ResourceLink(name="dot", uri="file:///dot.png", mime_type="image/png"),
            ]
        )

    @server.tool()
    def learn(name: str) -> str:
        """Adds a tool with the given name that answers with its own name."""

        def learned() -> str:
            return f"I am {name}"

        server.add_tool(learned, name=name, description=f"learned at runtime: {name}")
        return f"learned {name}"

    return server


def paging_server() -> Server[Any]:
    names = [f"tool_{i:02d}" for i in range(PAGING_TOOLS)]

    async def list_tools(
        ctx: ServerRequestContext[Any], params: mt.PaginatedRequestParams | None
    ) -> mt.ListToolsResult:
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + PAGE_SIZE
        page = [
            mt.Tool(name=name, description=f"tool number {name[-2:]}", input_schema={"type": "object"})
            for name in names[start:end]
        ]
        return mt.ListToolsResult(tools=page, next_cursor=str(end) if end < len(names) else None)

    async def call_tool(ctx: ServerRequestContext[Any], params: mt.CallToolRequestParams) -> mt.CallToolResult:
        return mt.CallToolResult(content=[mt.TextContent(text=f"{params.name} ran")])

    return Server("paging", on_list_tools=list_tools, on_call_tool=call_tool)


def require_token(app: ASGIApp, token: str) -> ASGIApp:
    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


def serve_http(app: ASGIApp, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A restarted server takes the port of the one that just died.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    asyncio.run(server.serve(sockets=[sock]))


async def serve_lowlevel_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["tools", "paging"])
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token")
    args = parser.parse_args()
    if args.kind == "tools":
        tools = tools_server()
        if args.transport == "stdio":
            tools.run("stdio")
            return
        app: ASGIApp = tools.streamable_http_app(host="127.0.0.1")
    else:
        paging = paging_server()
        if args.transport == "stdio":
            anyio.run(serve_lowlevel_stdio, paging)
            return
        app = paging.streamable_http_app(host="127.0.0.1")
    serve_http(require_token(app, args.token) if args.token else app, args.port)


if __name__ == "__main__":
    sys.exit(main())
