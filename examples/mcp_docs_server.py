"""A small MCP server (official SDK, stdio) for the executor walkthrough of docs/executors.md: the `docs` server in
examples/mcp-servers.json, started by `antwort-grpc executor mcp --config examples/mcp-servers.json`."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

DOCS = {
    "timeouts": "No per-tool timeout: the request's gRPC deadline bounds every call.",
    "approvals": "A tool with require_approval waits for a decision before it runs.",
}

server = MCPServer("docs")


@server.tool()
def search(topic: str) -> str:
    """Search the documentation for a topic."""
    return DOCS.get(topic.lower(), f"nothing about {topic!r}; topics: {', '.join(sorted(DOCS))}")


if __name__ == "__main__":
    server.run("stdio")
