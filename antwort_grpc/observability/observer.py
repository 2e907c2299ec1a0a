"""Observing responses as they leave the gateway, whatever door they leave by (the edge calls
this for every response stream): the response's span (a child of the caller's trace context), the
events going out — created, the first and later output deltas, the terminal event with status and
usage — and, when the response ends, the metrics, the spans ended and the response's log line.

The engine knows nothing of this: everything is read from the events and from the wrappers
around the provider, the executors and the store (wrappers.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from antwort_grpc import pb, tracing
from antwort_grpc.auth import current_identity
from antwort_grpc.errors import RequestError
from antwort_grpc.event_kinds import TERMINAL_EVENTS as TERMINAL
from antwort_grpc.observability import logs
from antwort_grpc.observability.context import Observation
from antwort_grpc.observability.metrics import Metrics

STREAMING_METHODS = frozenset({"CreateResponse", "Converse"})
DELTAS = frozenset({"output_text_delta", "refusal_delta", "reasoning_text_delta", "function_call_arguments_delta"})
# The other events the observer reads.
NOTED = TERMINAL | {"created", "hook_failed"}
S = pb.ResponseStatus
OPERATION = "invoke_agent"


# Each status's name in the metrics and the log line, made once.
STATUS_NAMES = {value: name.removeprefix("RESPONSE_STATUS_").lower() for name, value in S.items()}


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status) or S.Name(status).removeprefix("RESPONSE_STATUS_").lower()


class Observer:
    """What is on: metrics (None: off), traces (None: off), the per-response log line."""

    def __init__(self, metrics: Metrics | None, tracer: trace.Tracer | None, log_responses: bool) -> None:
        self.metrics = metrics
        self.tracer = tracer
        self.log_responses = log_responses
        self._grpc_attributes: dict[str, dict[str, str]] = {}

    def refused(self, method: str, error: RequestError) -> None:
        """A request refused before it started (unauthenticated, malformed, invalid, over its limit)."""
        if self.metrics is not None:
            self.metrics.refused.labels(method, error.code.name, error.reason).inc()

    def begin(self, method: str, metadata: Any, door: dict[str, str] | None = None) -> Observation:
        """`door`: the span's attributes of the transport it came through (default: gRPC's)."""
        observation = Observation(time.perf_counter())
        if self.tracer is not None:
            if door is None:
                attributes = self._grpc_attributes.get(method) or self._learn(method)
            else:
                attributes = {"gen_ai.operation.name": OPERATION, **door}
            span = observation.span = self.tracer.start_span(
                OPERATION, context=tracing.extract(metadata), kind=trace.SpanKind.SERVER, attributes=attributes
            )
            observation.recording = span.is_recording()
        if self.metrics is not None:
            self.metrics.open_streams.inc()
        return observation

    def _learn(self, method: str) -> dict[str, str]:
        # The SDK copies a span's attributes: one dictionary per method serves every span.
        attributes = self._grpc_attributes[method] = {
            "gen_ai.operation.name": OPERATION,
            "rpc.system": "grpc",
            "rpc.service": "antwort.v1.ResponsesService",
            "rpc.method": method,
        }
        return attributes

    def looking(self, o: Observation, metadata: Any) -> Callable[[pb.StreamEvent], None]:
        """What looks at each event of the stream `o` observes (`event`), made once per stream:
        a delta, most of a stream's events, is counted where it is seen; the few others (the
        lifecycle, a hook's failure) go on to `event`; the rest is only seen."""
        which = pb.StreamEvent.WhichOneof
        deltas, others = DELTAS, NOTED
        clock = time.perf_counter
        event_of = self.event

        def see(event: pb.StreamEvent) -> None:
            kind = which(event, "event")
            if kind in deltas:
                # Only the first delta is timed; the last one is the terminal event's moment,
                # which follows it at once (one clock read per response instead of one per token).
                if o.first_delta is None:
                    o.first_delta = clock()
                o.deltas += 1
            elif kind in others:
                event_of(o, event, metadata)
            o.seen = True

        return see

    def event(self, o: Observation, event: pb.StreamEvent, metadata: Any = None) -> None:
        kind = event.WhichOneof("event")
        if kind in DELTAS:
            # Only the first delta is timed; the last one is the terminal event's moment, which
            # follows it at once (one clock read per response instead of one per token).
            if o.first_delta is None:
                o.first_delta = time.perf_counter()
            o.deltas += 1
        elif kind in TERMINAL:
            if o.first_delta is not None:
                o.last_delta = time.perf_counter()
            self.finish(o, getattr(event, kind).response)
        elif kind == "created":
            response = event.created.response
            if o.finished or (o.response_id and o.response_id != response.id):
                self.restart(o, metadata)
            # Named and given the model on its span when it ends (a span is exported then).
            o.response_id, o.model = response.id, response.model
        elif kind == "hook_failed" and self.metrics is not None:
            self.metrics.hook_failures.inc()

    def restart(self, o: Observation, metadata: Any) -> None:
        """The next response on the same stream (Converse): counted and traced on its own."""
        if not o.finished:
            self.finish(o, None, "superseded")
        fresh = self.begin("Converse", metadata)
        if self.metrics is not None:
            self.metrics.open_streams.dec()  # the same stream: begin counted it again
        for name in Observation.__slots__:
            setattr(o, name, getattr(fresh, name))

    def finish(self, o: Observation, response: pb.Response | None, cut: str = "") -> None:
        """The response ended (terminal event), or its stream was cut before one (`cut` says how)."""
        if o.finished:
            return
        o.finished = True
        duration = time.perf_counter() - o.started
        status = status_name(response.status) if response is not None else "cancelled"
        model = (response.model if response is not None else "") or o.model
        error = response.error.code if response is not None and response.HasField("error") else cut
        usage = response.usage if response is not None else pb.Usage()
        # For the span and the log line only.
        tool_calls = 0
        if response is not None and (o.recording or self.log_responses):
            tool_calls = sum(1 for i in response.output if i.WhichOneof("kind") == "function_call")
        m = self.metrics
        if m is not None:
            m.child(m.responses, status, model).inc()
            if o.turns:
                m.turns.observe(o.turns)
            m.child(m.server_duration, OPERATION, model, error).observe(duration)
            if o.first_delta is not None:
                m.child(m.ttft, OPERATION, model).observe(o.first_delta - o.started)
                tokens = max(usage.output_tokens, o.deltas)
                if tokens > 1:
                    m.child(m.tpot, OPERATION, model).observe((o.last_delta - o.first_delta) / (tokens - 1))
        trace_id = ""
        if o.turn_span is not None:
            o.turn_span.end()
            o.turn_span = None
        if o.span is not None and self.log_responses:
            trace_id = format(o.span.get_span_context().trace_id, "032x")
        if o.recording:
            span = o.span
            attributes: dict[str, str | int] = {
                "gen_ai.response.id": response.id if response is not None else o.response_id,
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
                "antwort.response.status": status,
                "antwort.turns": o.turns,
                "antwort.tool_calls": tool_calls,
            }
            if o.model:
                # What `created` said (one update of the span instead of one per event).
                span.update_name(f"{OPERATION} {o.model}")
                attributes["gen_ai.request.model"] = o.model
            span.set_attributes(attributes)
            if error:
                span.set_attribute("error.type", error)
                span.set_status(trace.Status(trace.StatusCode.ERROR, error))
            span.end()
        if self.log_responses:
            identity = current_identity.get()
            logs.response_line(
                {
                    "response_id": response.id if response is not None else o.response_id,
                    "principal": identity.principal if identity else "",
                    "tenant": identity.tenant if identity else "",
                    "model": model,
                    "status": status,
                    "error_code": error,
                    "turns": o.turns,
                    "tool_calls": tool_calls,
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "duration_ms": round(duration * 1000, 1),
                    "trace_id": trace_id,
                }
            )

    def end(self, o: Observation, cut: str) -> None:
        if self.metrics is not None:
            self.metrics.open_streams.dec()
        if not o.finished and (o.response_id or cut != "refused"):
            self.finish(o, None, cut)
        elif o.span is not None and not o.finished:
            # Refused before it started (bad request, unknown previous response): a span that says so.
            o.span.set_status(trace.Status(trace.StatusCode.ERROR, cut))
            o.span.end()
