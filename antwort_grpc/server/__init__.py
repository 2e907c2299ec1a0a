"""gRPC wiring: the ResponsesService servicer, request validation, the server process."""
