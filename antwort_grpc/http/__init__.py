"""The Open Responses door: HTTP/SSE on the same core as the gRPC door (docs/http.md)."""
