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
    max_metadata: int = 16


DEFAULT_LIMITS = Limits()
