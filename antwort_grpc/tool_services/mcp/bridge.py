"""The MCP bridge: an executor service offering the tools of configured MCP servers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.tool_services.mcp.config import McpBridgeSettings, McpServerConfig
from antwort_grpc.tool_services.mcp.connection import ServerConnection, parse_arguments
from antwort_grpc.tool_services.mcp.routing import Refused, route
from antwort_grpc.tool_services.sdk import ExecutorService, text_result

# Seconds CanExecute waits for a server that is not connected; callers time it out at a few
# seconds (the gateway at 2).
CLAIM_WAIT = 1.5


class McpBridge(ExecutorService):
    """Lists every configured server's tools (each tagged with its server label) and runs a
    call on the server the request's `mcp` tool names, under the tool's original name."""

    # The standard loop: it starts stdio MCP servers, and uvloop runs Python's at-fork hooks in a
    # child before exec (uvloop issue 749), where one now and then crashed the child.
    event_loop = "asyncio"

    kind = pb.ToolKind.TOOL_KIND_MCP

    def __init__(self, servers: Sequence[McpServerConfig], settings: McpBridgeSettings | None = None) -> None:
        self.settings = settings or McpBridgeSettings()
        self.name = self.settings.name
        self.connections = {server.label: ServerConnection(server, self.settings) for server in servers}

    @classmethod
    def from_settings(cls, settings: McpBridgeSettings) -> McpBridge:
        return cls(settings.load_servers(), settings)

    async def start(self) -> None:
        """Connect to every server; serving starts once each has answered or failed its first
        attempt (bounded by connect_timeout), so the first GetExecutorInfo lists what is up."""
        for connection in self.connections.values():
            connection.start()
        await asyncio.gather(*(c.first_attempt() for c in self.connections.values()))

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.connections.values()))

    async def can_execute(self, tool: pb.Tool) -> bool:
        """An `mcp` tool is claimed when its server is configured here and its tools are known.
        A configured server with no listing yet (down at startup) gets one connection attempt
        now, so a server that came back is claimed at once rather than after the backoff."""
        if tool.WhichOneof("kind") != "mcp":
            return await super().can_execute(tool)
        connection = self.connections.get(tool.mcp.server_label)
        if connection is None:
            return False
        if not connection.tools:
            await connection.refresh(wait=CLAIM_WAIT)
        return bool(connection.tools)

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [tool for c in self.connections.values() for tool in c.executor_tools()]

    async def refresh(self, label: str | None = None) -> None:
        """List the tools of one server (or all) again now."""
        targets = [self.connections[label]] if label else list(self.connections.values())
        await asyncio.gather(*(c.refresh() for c in targets))

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        named = self.connections.get(tool.mcp.server_label) if tool.WhichOneof("kind") == "mcp" else None
        if named is not None and not named.offers(call.name):
            await named.refresh()  # a tool the server added since the last listing
        listings = {label: {t.name for t in c.tools} for label, c in self.connections.items()}
        target = route(call.name, tool, listings)
        if isinstance(target, Refused):
            return text_result(target.reason, is_error=True)
        try:
            arguments = parse_arguments(call.arguments)
        except ValueError as err:
            return text_result(f"invalid arguments for {call.name!r}: {err}", is_error=True)
        return await self.connections[target].call(call.name, arguments, progress)
