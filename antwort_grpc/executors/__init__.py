"""Tool executors: where tool calls run (the client, a sandbox service, an MCP bridge, …)."""
