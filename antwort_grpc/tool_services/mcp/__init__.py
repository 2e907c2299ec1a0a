"""The MCP bridge executor service (`antwort-grpc executor mcp`, kind MCP).

It connects to the MCP servers in its configuration with the official `mcp` SDK (stdio and
streamable HTTP), offers their tools over antwort.v1.ToolExecutorService — each tagged with its
server label, under its original name — and runs calls on the server a request's `mcp` tool
names. A request sees a server's tools only when it names that server (the gateway expands the
`mcp` tool into the functions listed here).

- config.py: servers and timings (pydantic-settings, ANTWORT_MCP_*).
- connection.py: one owner task per server: connect, list, refresh, reconnect.
- results.py: MCP results, tools and progress in our shapes (pure).
- routing.py: which server a call goes to (pure).
- bridge.py: the ExecutorService over all of it.
"""

from antwort_grpc.tool_services.mcp.bridge import McpBridge
from antwort_grpc.tool_services.mcp.config import McpBridgeSettings, McpServerConfig

__all__ = ["McpBridge", "McpBridgeSettings", "McpServerConfig"]
