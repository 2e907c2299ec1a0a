"""What one CreateResponse request may hold, checked before any work starts (docs/limits.md)."""

from __future__ import annotations

from dataclasses import dataclass

# Ids and names a client sends (previous_response_id, call ids, item ids, the model, response ids
# of the read RPCs). Ours are about 30 characters; a model's call ids rarely pass 64. Not a setting:
# nothing legitimate comes near it, and it keeps errors that name an id small.
MAX_ID_CHARS = 256


@dataclass(frozen=True, slots=True)
class Limits:
    max_tools: int = 128
    # Each function tool's `parameters`, serialized; and its nesting (objects and arrays).
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 20
    # Every tool of a request, serialized, together. The request's tools are echoed in the
    # Response its events carry and converted for every model call: past a few MiB a request
    # costs seconds of CPU on the event loop (docs/limits.md).
    max_tools_bytes: int = 1024 * 1024
    max_input_items: int = 2048
    # Content parts of all input messages together. The items' count and the request's bytes do
    # not bound how many objects it makes: 2,048 messages of one-character parts fit 900,000
    # parts in 8 MB, each parsed, checked, copied and encoded for the backend (4 such requests
    # held gRPC health 0.7 s; docs/limits.md). Four on average is more than clients send.
    max_content_parts: int = 8192
    max_metadata: int = 16
    # A request that starts a response, serialized; refused before it is parsed (server.decode).
    # What it costs grows with its bytes: four at 8 MiB at once keep health checks answered
    # within about 100 ms on two cores, at 32 MiB (the gRPC message limit) not (docs/limits.md).
    max_request_bytes: int = 8 * 1024 * 1024
    # Items one steer or follow-up may carry (counted before any is looked at).
    max_control_items: int = 64


DEFAULT_LIMITS = Limits()
