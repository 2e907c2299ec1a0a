"""One model call of a turn and reading it: the call as the loop holds it (`ModelCall`), the turn
request built from the run, and the turn's events as the model's deltas arrive. A steering message
cuts a turn short; a stop ends it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence

from antwort_grpc import pb
from antwort_grpc.engine import policy
from antwort_grpc.engine.run import MODEL, Run, Stopped
from antwort_grpc.providers.base import (
    Completion,
    FinishReason,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    TurnRequest,
)
from antwort_grpc.providers.coalesce import max_hold_of

ITEM_COMPLETED: int = pb.ItemStatus.ITEM_STATUS_COMPLETED
ITEM_INCOMPLETE: int = pb.ItemStatus.ITEM_STATUS_INCOMPLETE


class ModelCall:
    """One call of the model for one turn. A streaming call starts at once: its first delta is
    awaited in a task of its own, so the backend's round trip overlaps whatever the loop writes
    before it reads the stream."""

    __slots__ = ("answered", "completion", "first", "stream")

    def __init__(
        self, stream: AsyncIterator[ProviderEvent] | None = None, completion: Awaitable[Completion] | None = None
    ) -> None:
        self.stream = stream
        self.completion = completion
        self.first: asyncio.Task[ProviderEvent] | None = None
        # A before-model hook's answer, not the model's.
        self.answered = False
        if stream is not None:
            self.first = asyncio.create_task(next_delta(stream))

    async def discard(self) -> None:
        """Abandon it unread (the run stopped, failed or was steered before reading it)."""
        if self.first is not None:
            self.first.cancel()
            await asyncio.gather(self.first, return_exceptions=True)
        if self.stream is not None:
            await close_stream(self.stream)
        if asyncio.iscoroutine(self.completion):
            self.completion.close()


def turn_request(run: Run, turn: int, context: Sequence[pb.Item] | None = None) -> TurnRequest:
    """What the model is asked at `turn`: the run's context (or `context`) through the window,
    the offered tools, tool_choice for that turn, and what is left of the output budget."""
    request = run.request
    choice = request.tool_choice if request.HasField("tool_choice") else None
    return TurnRequest(
        model=run.response.model,
        instructions=request.instructions,
        items=run.governor.context(run.context if context is None else context, request.instructions),
        tools=run.tools.functions,
        tool_choice=policy.turn_tool_choice(choice, turn),
        parallel_tool_calls=run.response.parallel_tool_calls,
        max_output_tokens=run.governor.output_budget(
            request.max_output_tokens if request.HasField("max_output_tokens") else None, run.response
        ),
        temperature=request.temperature if request.HasField("temperature") else None,
        top_p=request.top_p if request.HasField("top_p") else None,
        coalesce=not request.delta_coalescing.disabled,
        max_hold=max_hold_of(request),
    )


async def await_completion(run: Run, call: ModelCall) -> Completion | None:
    """A non-streaming turn; None when a steering message cut it short."""
    assert call.completion is not None
    run.waiting = MODEL
    try:
        return await call.completion
    except asyncio.CancelledError:
        if not steered(run):
            raise
        return None
    finally:
        run.waiting = None


async def stream_turn(run: Run, call: ModelCall) -> AsyncIterator[pb.StreamEvent | FinishReason | None]:
    """The turn's events, then its FinishReason (None: a steering message cut it short)."""
    emitter = run.emitter
    stream = call.stream
    assert stream is not None
    first, call.first = call.first, None
    try:
        while True:
            if run.attention:
                if run.reason:
                    raise Stopped
                if run.steer:
                    for event in emitter.close_turn(ITEM_INCOMPLETE):
                        yield event
                    yield None
                    return
            run.waiting = MODEL
            try:
                if first is not None:
                    # Awaiting the task directly: cancelling this task cancels it too.
                    pending, first = first, None
                    delta = await pending
                else:
                    # Inline rather than `_next_delta`: this runs once per delta.
                    try:
                        delta = await anext(stream)
                    except StopAsyncIteration:
                        raise ProviderError(
                            "backend_protocol_error", "the model stream ended without a finish"
                        ) from None
            except asyncio.CancelledError:
                if not steered(run):
                    raise
                continue  # the check above ends the turn
            finally:
                run.waiting = None
            if isinstance(delta, TextDelta):
                events = emitter.on_text(delta.text)
            elif isinstance(delta, ToolCallDelta):
                events = emitter.on_tool_call(delta.index, delta.call_id, delta.name, delta.arguments)
            elif isinstance(delta, ReasoningDelta):
                events = emitter.on_reasoning(delta.text)
            elif isinstance(delta, RefusalDelta):
                events = emitter.on_refusal(delta.text)
            else:
                assert isinstance(delta, TurnEnd)
                add_usage(emitter.response, delta.usage)
                status = ITEM_INCOMPLETE if delta.finish is FinishReason.LENGTH else ITEM_COMPLETED
                for event in emitter.close_turn(status):
                    yield event
                yield delta.finish
                return
            for event in events:
                yield event
    finally:
        if first is not None:
            # Ended before the early first delta was read (a stop while writing events).
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
        await close_stream(stream)


def steered(run: Run) -> bool:
    """Whether a cancellation of the driving task was a steering message's (and is absorbed).
    Not when a stop came too, or the task was cancelled for another reason as well (the client
    went away): that cancellation goes on."""
    if run.reason or not run.interrupting:
        return False
    run.interrupting = False
    task = asyncio.current_task()
    return task is None or task.uncancel() == 0


async def given(completion: Completion) -> Completion:
    return completion


async def next_delta(stream: AsyncIterator[ProviderEvent]) -> ProviderEvent:
    """The first delta, awaited in a task of its own (a task needs a coroutine)."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        raise ProviderError("backend_protocol_error", "the model stream ended without a finish") from None


async def close_stream(stream: AsyncIterator[ProviderEvent]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await asyncio.shield(aclose())


def add_usage(response: pb.Response, usage: pb.Usage | None) -> None:
    if usage is None:
        return
    total = response.usage
    total.input_tokens += usage.input_tokens
    total.output_tokens += usage.output_tokens
    total.total_tokens += usage.total_tokens or (usage.input_tokens + usage.output_tokens)
