"""Tool services: the separate programs behind antwort.v1.ToolExecutorService (the SDK to write
one, the sandbox, the MCP bridge). The gateway reaches them only over gRPC; its own side of tools
(the executor protocol and the remote client) lives in `antwort_grpc.executors`."""
