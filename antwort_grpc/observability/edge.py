"""Observing responses where they leave the gateway: a grpc.aio interceptor around the RPCs that
stream responses (CreateResponse, Converse). It opens the response's span (a child of the caller's
trace context, current for the whole RPC task, so the model calls, tool calls and the executors
they reach hang under it), watches the events going out — created, the first and later output
deltas, the terminal event with status and usage — and, when the response ends, records the
metrics, ends the spans and writes the response's log line.

The engine knows nothing of this: everything is read from the events and from the wrappers
around the provider, the executors and the store (wrappers.py).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from antwort_grpc import pb, tracing
from antwort_grpc.auth import current_identity
from antwort_grpc.observability import logs
from antwort_grpc.observability.context import Observation, current_observation
from antwort_grpc.observability.metrics import Metrics

STREAMING_METHODS = frozenset({"CreateResponse", "Converse"})
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled", "requires_action"})
DELTAS = frozenset({"output_text_delta", "refusal_delta", "reasoning_text_delta", "function_call_arguments_delta"})
S = pb.ResponseStatus
OPERATION = "invoke_agent"


def status_name(status: int) -> str:
    return S.Name(status).removeprefix("RESPONSE_STATUS_").lower()


class Observer:
    """What is on: metrics (None: off), traces (None: off), the per-response log line."""

    def __init__(self, metrics: Metrics | None, tracer: trace.Tracer | None, log_responses: bool) -> None:
        self.metrics = metrics
        self.tracer = tracer
        self.log_responses = log_responses

    def begin(self, method: str, metadata: Any) -> Observation:
        observation = Observation(time.perf_counter())
        if self.tracer is not None:
            observation.span = self.tracer.start_span(
                OPERATION,
                context=tracing.extract(metadata),
                kind=trace.SpanKind.SERVER,
                attributes={
                    "gen_ai.operation.name": OPERATION,
                    "rpc.system": "grpc",
                    "rpc.service": "antwort.v1.ResponsesService",
                    "rpc.method": method,
                },
            )
        if self.metrics is not None:
            self.metrics.open_streams.inc()
        return observation

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
            o.response_id, o.model = response.id, response.model
            if o.span is not None:
                o.span.update_name(f"{OPERATION} {response.model}".strip())
                o.span.set_attribute("gen_ai.response.id", response.id)
                o.span.set_attribute("gen_ai.request.model", response.model)
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
        tool_calls = sum(1 for i in response.output if i.WhichOneof("kind") == "function_call") if response else 0
        m = self.metrics
        if m is not None:
            m.responses.labels(status, model).inc()
            if o.turns:
                m.turns.observe(o.turns)
            m.server_duration.labels(OPERATION, model, error).observe(duration)
            if o.first_delta is not None:
                m.ttft.labels(OPERATION, model).observe(o.first_delta - o.started)
                tokens = max(usage.output_tokens, o.deltas)
                if tokens > 1:
                    m.tpot.labels(OPERATION, model).observe((o.last_delta - o.first_delta) / (tokens - 1))
        trace_id = ""
        if o.turn_span is not None:
            o.turn_span.end()
            o.turn_span = None
        if o.span is not None:
            span = o.span
            trace_id = format(span.get_span_context().trace_id, "032x")
            span.set_attributes(
                {
                    "gen_ai.response.id": response.id if response is not None else o.response_id,
                    "gen_ai.usage.input_tokens": usage.input_tokens,
                    "gen_ai.usage.output_tokens": usage.output_tokens,
                    "antwort.response.status": status,
                    "antwort.turns": o.turns,
                    "antwort.tool_calls": tool_calls,
                }
            )
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


def _event_of(message: Any) -> pb.StreamEvent | None:
    # CreateResponseResponse.event, or ConverseResponse's `event` case of its oneof.
    if message.HasField("event"):
        event: pb.StreamEvent = message.event
        return event
    return None


class _WatchedContext:
    """The servicer context with every written message shown to `watch` first."""

    def __init__(self, context: Any, watch: Callable[[Any], None]) -> None:
        self._context = context
        self._watch = watch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: Any) -> None:
        self._watch(message)
        await self._context.write(message)


class ObservingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = str(details.method).rsplit("/", 1)[-1]
        if handler is None or not handler.response_streaming or method not in STREAMING_METHODS:
            return handler
        inner = handler.unary_stream or handler.stream_stream
        observer = self.observer
        metadata = details.invocation_metadata

        def open_rpc() -> tuple[Observation, Any]:
            o = observer.begin(method, metadata)
            current_observation.set(o)
            # Current for the rest of this RPC's task and every task it starts (tools, model calls).
            token = otel_context.attach(trace.set_span_in_context(o.span)) if o.span is not None else None
            return o, token

        def close_rpc(o: Observation, token: Any, cut: str) -> None:
            observer.end(o, cut)
            if token is not None:
                otel_context.detach(token)

        if inspect.isasyncgenfunction(inner):

            async def observed_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                o, token = open_rpc()
                cut = "refused"
                try:
                    async for message in inner(request, context):
                        event = _event_of(message)
                        if event is not None:
                            cut = "client_gone"
                            observer.event(o, event, metadata)
                        yield message
                    cut = "stream_ended"
                finally:
                    close_rpc(o, token, cut)

            behavior: Callable[..., Any] = observed_stream
        else:

            async def observed(request: Any, context: Any) -> None:
                # A handler that writes with context.write (the reader/writer API).
                o, token = open_rpc()
                state = ["refused"]

                def watch(message: Any) -> None:
                    event = _event_of(message)
                    if event is not None:
                        state[0] = "client_gone"
                        observer.event(o, event, metadata)

                try:
                    await inner(request, _WatchedContext(context, watch))
                    state[0] = "stream_ended"
                finally:
                    close_rpc(o, token, state[0])

            behavior = observed

        make = grpc.unary_stream_rpc_method_handler if handler.unary_stream else grpc.stream_stream_rpc_method_handler
        return make(
            behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
