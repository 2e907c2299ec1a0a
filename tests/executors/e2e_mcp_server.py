"""A real MCP server (official SDK, stdio) for the end-to-end test of server-side tools.

    python tests/executors/e2e_mcp_server.py MARKER_DIR

`lookup` answers only once the file MARKER_DIR/sandbox-running exists, which the test writes when
the sandbox call of the same turn reports that it started: a server that ran the two calls one
after the other would never answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

WAIT_SECONDS = 30


def docs_server(markers: Path) -> MCPServer:
    server = MCPServer("docs")

    @server.tool()
    async def lookup(topic: str) -> str:
        """Look a topic up in the documentation."""
        with anyio.move_on_after(WAIT_SECONDS):
            # Another process writes the marker: polling the file system is the only signal.
            while not (markers / "sandbox-running").exists():  # noqa: ASYNC110
                await anyio.sleep(0.01)
            return f"the docs on {topic}: every call is limited to 30 seconds"
        raise ToolError("the sandbox call of this turn never started while this call ran")

    @server.tool()
    def version() -> str:
        """The documentation's version."""
        return "1.0"

    return server


if __name__ == "__main__":
    docs_server(Path(sys.argv[1])).run("stdio")
