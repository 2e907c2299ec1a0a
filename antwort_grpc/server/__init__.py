"""gRPC wiring: the ResponsesService servicer (an adapter of the responses layer), the server process."""
