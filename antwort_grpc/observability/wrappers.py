"""Wrappers that observe the gateway's parts from outside: the model provider (model-call spans,
GenAI client metrics, backend errors by code, turns), each tool executor (tool-call spans and
metrics) and the store (latency by operation). Whatever they do not define is the wrapped part's
own (attribute access falls through), so the rest of the gateway sees the same capabilities."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Generic, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink, ToolExecutor
from antwort_grpc.observability.context import Observation, current_observation
from antwort_grpc.observability.metrics import Metrics
from antwort_grpc.providers.base import Completion, Provider, ProviderError, ProviderEvent, TurnEnd, TurnRequest
from antwort_grpc.storage.base import ItemPage, ResponseStore, StoredResponse
from antwort_grpc.storage.conversations import Entry

CHAT = "chat"
Part = TypeVar("Part")
_PROVIDER_NAMES = {"OpenAICompatProvider": "openai", "ScriptedProvider": "scripted", "LocalModelProvider": "llama.cpp"}


def _next_turn(o: Observation | None, tracer: trace.Tracer | None) -> None:
    """A model call starts the next turn: the turn before it (its model call and its tools) ends."""
    if o is None:
        return
    o.turns += 1
    if tracer is None or not o.recording:
        return
    if o.turn_span is not None:
        o.turn_span.end()
    o.turn_span = tracer.start_span(
        f"turn {o.turns}", context=trace.set_span_in_context(o.span), attributes={"antwort.turn": o.turns}
    )


def _unsampled(o: Observation | None) -> bool:
    """Whether the response's span is not sampled: its model and tool calls would not be either
    (the sampler follows the parent), so they make no span of their own and go on in its context,
    current already in the response's task and the tasks it starts (what they pass on downstream
    says "not sampled")."""
    return o is not None and o.span is not None and not o.recording


def _client_span(tracer: trace.Tracer, o: Observation | None, name: str, attributes: dict[str, Any]) -> Any:
    """A call the gateway makes as a client (model, tool), in the response's current turn."""
    context = o.parent() if o is not None else None
    return tracer.start_span(name, context=context, kind=trace.SpanKind.CLIENT, attributes=attributes)


class _Wrapper(Generic[Part]):
    """Whatever a wrapper does not define is the wrapped part's own."""

    def __init__(self, inner: Part) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ObservedProvider(_Wrapper[Provider]):
    def __init__(self, inner: Provider, metrics: Metrics | None, tracer: trace.Tracer | None) -> None:
        super().__init__(inner)
        self._metrics = metrics
        self._tracer = tracer
        self._name = _PROVIDER_NAMES.get(type(inner).__name__, type(inner).__name__.lower())

    def _start(self, turn: TurnRequest) -> Any:
        o = current_observation.get()
        _next_turn(o, self._tracer)
        if self._tracer is None or _unsampled(o):
            return None
        attributes = {"gen_ai.operation.name": CHAT, "gen_ai.provider.name": self._name}
        attributes["gen_ai.request.model"] = turn.model
        return _client_span(self._tracer, o, f"{CHAT} {turn.model}".strip(), attributes)

    def _end(
        self, turn: TurnRequest, span: Any, started: float, error: str, usage: pb.Usage | None, ended: float = 0.0
    ) -> None:
        m = self._metrics
        if m is not None:
            labels = (CHAT, self._name, turn.model)
            m.child(m.client_duration, *labels, error).observe((ended or time.perf_counter()) - started)
            if usage is not None:
                m.child(m.client_tokens, *labels, "input").observe(usage.input_tokens)
                m.child(m.client_tokens, *labels, "output").observe(usage.output_tokens)
            if error and error != "cancelled":
                m.backend_errors.labels(error).inc()
        if span is not None:
            if usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if error:
                span.set_attribute("error.type", error)
                span.set_status(trace.Status(trace.StatusCode.ERROR, error))
            span.end()

    async def stream(self, turn: TurnRequest) -> AsyncGenerator[ProviderEvent, None]:
        span = self._start(turn)
        started = time.perf_counter()
        inner = self._inner.stream(turn)
        # perf_counter() when the TurnEnd went out: the call is complete then, and whoever reads
        # it may close the stream at once instead of reading it to its end (the engine does).
        error, usage, ended = "cancelled", None, 0.0
        try:
            # Current while the call is made, so the provider's HTTP request carries its context.
            token = otel_context.attach(trace.set_span_in_context(span)) if span is not None else None
            try:
                first = await anext(inner)
            except StopAsyncIteration:
                error = ""
                return
            finally:
                if token is not None:
                    otel_context.detach(token)
            if type(first) is TurnEnd:
                usage, ended = first.usage, time.perf_counter()
            yield first
            async for event in inner:
                if type(event) is TurnEnd:
                    usage, ended = event.usage, time.perf_counter()
                yield event
            error = ""
        except ProviderError as err:
            error = err.code
            raise
        except Exception as err:
            error = type(err).__name__
            raise
        finally:
            close = getattr(inner, "aclose", None)
            if close is not None:
                await close()
            if ended and error == "cancelled":
                error = ""
            self._end(turn, span, started, error, usage, ended)

    async def complete(self, turn: TurnRequest) -> Completion:
        span = self._start(turn)
        started = time.perf_counter()
        error, usage = "cancelled", None
        token = otel_context.attach(trace.set_span_in_context(span)) if span is not None else None
        try:
            completion = await self._inner.complete(turn)
            error, usage = "", completion.usage
            return completion
        except ProviderError as err:
            error = err.code
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
            self._end(turn, span, started, error, usage)


class ObservedExecutor(_Wrapper[ToolExecutor]):
    def __init__(self, inner: ToolExecutor, metrics: Metrics | None, tracer: trace.Tracer | None) -> None:
        super().__init__(inner)
        self._metrics = metrics
        self._tracer = tracer

    @property
    def kind(self) -> int:
        return self._inner.kind

    async def can_execute(self, tool: pb.Tool) -> bool:
        return await self._inner.can_execute(tool)

    @property
    def label(self) -> str:
        return str(getattr(self._inner, "name", "") or type(self._inner).__name__)

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        span = token = None
        o = current_observation.get() if self._tracer is not None else None
        if self._tracer is not None and not _unsampled(o):
            attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
                "gen_ai.tool.type": tool.WhichOneof("kind") or "function",
                "antwort.executor": self.label,
            }
            span = _client_span(self._tracer, o, f"execute_tool {call.name}", attributes)
            # Current during the call: a remote executor passes it on in the call's metadata.
            token = otel_context.attach(trace.set_span_in_context(span))
        started = time.perf_counter()
        outcome = "cancelled"
        try:
            result = await self._inner.execute(call, tool, progress)
            outcome = "error" if result.is_error else "success"
            return result
        except Exception:
            outcome = "error"
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
            if self._metrics is not None:
                labels = (call.name, self.label, outcome)
                self._metrics.tool_calls.labels(*labels).inc()
                self._metrics.tool_duration.labels(*labels).observe(time.perf_counter() - started)
            if span is not None:
                span.set_attribute("antwort.tool.outcome", outcome)
                if outcome != "success":
                    span.set_status(trace.Status(trace.StatusCode.ERROR, outcome))
                span.end()


class ObservedStore(_Wrapper[ResponseStore]):
    def __init__(self, inner: ResponseStore, metrics: Metrics) -> None:
        super().__init__(inner)
        self._metrics = metrics
        self._hist = metrics.store_duration
        # The two operations of every response (a save when it starts and when it ends; a get
        # when it continues another): their series looked up once, at the first (a series shows
        # once it has been observed, as before).
        self._saved: Any = None
        self._got: Any = None

    def _record(self, operation: str, started: float, ok: bool) -> None:
        outcome = "success" if ok else "error"
        self._metrics.child(self._hist, operation, outcome).observe(time.perf_counter() - started)

    async def save(self, record: StoredResponse) -> None:
        started = time.perf_counter()
        try:
            await self._inner.save(record)
        except BaseException:
            self._record("save", started, False)
            raise
        saved = self._saved or self._learn("save")
        saved.observe(time.perf_counter() - started)

    async def save_in_conversation(
        self, record: StoredResponse, conversation_id: str, entries: Sequence[Entry]
    ) -> bool:
        """The final save of a response in a kept conversation (its append in the same write):
        measured as a save."""
        started = time.perf_counter()
        try:
            appended: bool = await self._inner.save_in_conversation(record, conversation_id, entries)  # type: ignore[attr-defined]
        except BaseException:
            self._record("save", started, False)
            raise
        saved = self._saved or self._learn("save")
        saved.observe(time.perf_counter() - started)
        return appended

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        started = time.perf_counter()
        try:
            result = await self._inner.get(response_id, owner)
        except BaseException:
            self._record("get", started, False)
            raise
        got = self._got or self._learn("get")
        got.observe(time.perf_counter() - started)
        return result

    def _learn(self, operation: str) -> Any:
        series = self._hist.labels(operation, "success")
        if operation == "save":
            self._saved = series
        else:
            self._got = series
        return series

    async def delete(self, response_id: str, owner: str = "") -> bool:
        started, ok = time.perf_counter(), False
        try:
            result = await self._inner.delete(response_id, owner)
            ok = True
            return result
        finally:
            self._record("delete", started, ok)

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        started, ok = time.perf_counter(), False
        try:
            result = await self._inner.list_input_items(
                response_id, limit=limit, after=after, descending=descending, owner=owner
            )
            ok = True
            return result
        finally:
            self._record("list_input_items", started, ok)
