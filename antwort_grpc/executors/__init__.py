"""The gateway's side of tools: the executor protocol, client-executed functions, and the gRPC
client of remote ToolExecutorService programs (those live in `antwort_grpc.tool_services`)."""
