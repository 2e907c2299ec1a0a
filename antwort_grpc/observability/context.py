"""What the gateway learns about one response while it runs, shared by the edge that serves the
stream and the wrappers around the provider and the executors (they run in the response's task or
tasks it created, so they find it in `current_observation`)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace


@dataclass(slots=True)
class Observation:
    started: float
    # The response's span (None while tracing is off) and the span of the turn running now.
    span: Any = None
    turn_span: Any = None
    turns: int = 0
    response_id: str = ""
    model: str = ""
    # perf_counter() of the first streamed output delta and of the end of the output (the terminal
    # event), and how many deltas there were.
    first_delta: float | None = None
    last_delta: float = 0.0
    deltas: int = 0
    finished: bool = False
    # Whether the response's span records (sampled): an unsampled one is only carried along, so
    # what goes downstream says "not sampled", and nothing is set on it.
    recording: bool = False
    # Whether an event of the stream was seen (a stream that ends without one was refused).
    seen: bool = False

    def parent(self) -> Any:
        """The context a model call or tool call span hangs under."""
        span = self.turn_span or self.span
        return trace.set_span_in_context(span) if span is not None else None


current_observation: ContextVar[Observation | None] = ContextVar("current_observation", default=None)
