"""antwort-grpc: a gRPC gateway that runs agents server-side."""

__version__ = "0.1.0"
