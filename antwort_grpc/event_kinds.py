"""The kinds of stream event every reader needs to know by name, defined once."""

from __future__ import annotations

from antwort_grpc import pb

# The events a response's stream ends with: exactly one, last.
TERMINAL_EVENTS = frozenset({"completed", "incomplete", "failed", "cancelled", "requires_action"})


def is_terminal(event: pb.StreamEvent) -> bool:
    return event.WhichOneof("event") in TERMINAL_EVENTS


def terminal_response(event: pb.StreamEvent) -> pb.Response:
    """The Response a terminal event carries."""
    kind = event.WhichOneof("event")
    assert kind in TERMINAL_EVENTS, f"not a terminal event: {kind}"
    response: pb.Response = getattr(event, kind).response
    return response
