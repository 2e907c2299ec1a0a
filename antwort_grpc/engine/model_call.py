"""The one place the model is called, and reading a call as the turn's events.

`call_model` starts one call of the model for one turn in a task the run owns: a streaming call
reads the backend's deltas into a queue the turn reads (so the backend's round trip overlaps
whatever the loop writes first, and a control ends the turn's wait without cancelling anything
but this task); a non-streaming call is one task. When the backend says the context is too long
and the request allows truncation, the call is made once more with a smaller window.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

from antwort_grpc import pb
from antwort_grpc.engine import turn_rules
from antwort_grpc.engine.budget import output_budget
from antwort_grpc.engine.channel import RING, Channel
from antwort_grpc.engine.emitter import ResponseEmitter
from antwort_grpc.engine.model_task import ModelCall
from antwort_grpc.engine.run import Run
from antwort_grpc.providers.base import (
    Completion,
    FinishReason,
    Provider,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    TurnRequest,
)
from antwort_grpc.providers.coalesce import MERGEABLE, max_hold_of, merge_deltas

ITEM_COMPLETED: int = pb.ItemStatus.ITEM_STATUS_COMPLETED
ITEM_INCOMPLETE: int = pb.ItemStatus.ITEM_STATUS_INCOMPLETE
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
AUTO: int = pb.Truncation.TRUNCATION_AUTO
# What the reading task puts last on the channel when the stream ended without a TurnEnd.
_ENDED = object()


def call_model(run: Run, provider: Provider, request: TurnRequest) -> ModelCall:
    """The one place the model is called."""
    run.hooks.flush()
    run.record.model_started(run.response.usage)
    retry = run.request.truncation == AUTO
    if run.request.stream:
        channel = Channel()
        return ModelCall(asyncio.create_task(_read(run, provider, request, channel, retry)), channel, True)
    channel = Channel()
    return ModelCall(asyncio.create_task(_complete(run, provider, request, channel, retry)), channel, False)


def answered_by_hook(run: Run, completion: Completion) -> ModelCall:
    """A before-model hook answered in the model's place."""
    run.record.model_started(run.response.usage)
    channel = Channel()
    channel.put_nowait(completion)
    call = ModelCall(asyncio.create_task(_nothing()), channel, False)
    call.answered = True
    return call


async def _nothing() -> None:
    return None


async def _complete(run: Run, provider: Provider, request: TurnRequest, channel: Channel, retry: bool) -> None:
    """Put the call's Completion (or its failure) on `channel`."""
    try:
        try:
            completion = await provider.complete(request)
        except ProviderError as err:
            if not retry or err.code != CONTEXT_LENGTH_EXCEEDED:
                raise
            completion = await provider.complete(_smaller(run, request))
        channel.put_nowait(completion)
    except Exception as err:  # handed to the turn, which fails the response with it
        channel.put_nowait(err)


async def _read(run: Run, provider: Provider, request: TurnRequest, channel: Channel, retry: bool) -> None:
    """Put the call's deltas on `channel` as they arrive; a failure is put there too."""
    stream = aiter(provider.stream(request))
    try:
        try:
            first = await anext(stream)
        except ProviderError as err:
            if not retry or err.code != CONTEXT_LENGTH_EXCEEDED:
                raise
            await _close(stream)
            stream = aiter(provider.stream(_smaller(run, request)))
            first = await anext(stream)
        put = channel.put_nowait
        put(first)
        # The first delta leaves before the rest of its read is parsed: the run writes it now.
        await asyncio.sleep(0)
        async for event in stream:
            put(event)
        channel.put_nowait(_ENDED)
    except StopAsyncIteration:
        channel.put_nowait(_ENDED)
    except Exception as err:  # handed to the turn, which fails the response with it
        channel.put_nowait(err)
    finally:
        await _close(stream)


def _smaller(run: Run, request: TurnRequest) -> TurnRequest:
    """The backend said the context is too long: once more, with a smaller window."""
    return dataclasses.replace(request, items=run.window.shrink(request.items, request.instructions))


async def _close(stream: AsyncIterator[ProviderEvent]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await asyncio.shield(aclose())


def turn_request(run: Run, turn: int, context: Sequence[pb.Item] | None = None) -> TurnRequest:
    """What the model is asked at `turn`: the run's context (or `context`) through the window,
    the offered tools, tool_choice for that turn, and what is left of the output budget."""
    request = run.request
    choice = request.tool_choice if request.HasField("tool_choice") else None
    items = run.context if context is None else context
    return TurnRequest(
        model=run.response.model,
        instructions=request.instructions,
        items=run.window.view(items, request.instructions),
        tools=run.tools.functions,
        tool_choice=turn_rules.turn_tool_choice(choice, turn),
        parallel_tool_calls=run.response.parallel_tool_calls,
        max_output_tokens=output_budget(
            run.limits,
            request.max_output_tokens if request.HasField("max_output_tokens") else None,
            run.response.usage.output_tokens,
        ),
        temperature=request.temperature if request.HasField("temperature") else None,
        top_p=request.top_p if request.HasField("top_p") else None,
        text_format=structured_format(request) if request.HasField("text") else None,
        # Asked first: reading an unset message's field makes a wrapper of it.
        reasoning_effort=request.reasoning.effort if request.HasField("reasoning") else "",
        prompt_cache_key=request.prompt_cache_key,
        presence_penalty=request.presence_penalty if request.HasField("presence_penalty") else None,
        frequency_penalty=request.frequency_penalty if request.HasField("frequency_penalty") else None,
        top_logprobs=request.top_logprobs if request.output_logprobs else None,
        coalesce=not request.delta_coalescing.disabled,
        max_hold=max_hold_of(request),
    )


def structured_format(request: pb.CreateResponseRequest) -> pb.TextFormat | None:
    """The request's text format when it asks for JSON (json_schema or json_object)."""
    if not request.HasField("text") or request.text.format.WhichOneof("kind") in (None, "text"):
        return None
    return request.text.format


# -- reading a call ------------------------------------------------------------------------------


async def await_completion(run: Run, call: ModelCall) -> Completion | None:
    """A non-streaming turn; None when a steering message cut it short."""
    channel = call.channel
    run.listen(channel)
    try:
        while True:
            got = await channel.get()
            if got is RING:
                if run.attention:
                    run.check()
                    if run.steered:
                        return None
                continue
            if isinstance(got, BaseException):
                raise got
            assert isinstance(got, Completion)
            return got
    finally:
        run.listen(None)
        if not call.task.done():
            # Cut by a steering message or a stop, or the client went away: the call is ours.
            await call.discard()


async def stream_turn(
    run: Run, call: ModelCall, merge: bool = False
) -> AsyncIterator[pb.StreamEvent | FinishReason | None]:
    """The turn's events, then its FinishReason (None: a steering message cut it short).
    `merge`: deltas of a coalescing provider that waited while the run wrote events leave as one,
    as the provider joins those that wait in one read of its backend."""
    emitter = run.emitter
    channel = call.channel
    # The bell rings on the deltas' channel for the whole call: a control ends the wait for one.
    run.listen(channel)
    first = True
    ended = False
    try:
        while True:
            if run.attention and _steered(run):
                for event in emitter.close_turn(ITEM_INCOMPLETE):
                    yield event
                yield None
                return
            if len(channel) > 1 and merge and not first:
                _merge_waiting(channel)
            delta = channel.get_nowait() if len(channel) else await channel.get()
            first = False
            kind = type(delta)
            if kind is TextDelta:
                events = emitter.on_text(delta.text, logprobs=delta.logprobs)
            elif kind is TurnEnd:
                ended = True
                for event in _closed(emitter, delta):
                    yield event
                yield delta.finish
                return
            elif delta is RING:
                continue  # the check above says what came
            else:
                events = _events_of(run, delta)
            for event in events:
                yield event
    finally:
        run.listen(None)
        if ended:
            # The backend's answer is complete: the call only closes its connection now, and
            # ends by itself. Waiting for it here would hold the turn's last events (and, batched,
            # part them from the turn's decision) for a few loop iterations.
            call.let_finish()
        else:
            await call.discard()


def _steered(run: Run) -> bool:
    """What a control that came during the stream asks: a stop ends the run, a steering message
    the turn."""
    run.check()
    return run.steered


def _closed(emitter: ResponseEmitter, end: TurnEnd) -> list[pb.StreamEvent]:
    _add_usage(emitter.response, end.usage)
    return emitter.close_turn(ITEM_INCOMPLETE if end.finish is FinishReason.LENGTH else ITEM_COMPLETED)


def _merge_waiting(channel: Channel) -> None:
    """The deltas waiting on `channel`, consecutive ones of one part joined (a bell, the end or a
    failure stays where it is)."""
    waiting = channel.take_all()
    deltas: list[ProviderEvent] = []
    for item in waiting:
        if isinstance(item, MERGEABLE):
            deltas.append(item)
            continue
        channel.extend(merge_deltas(deltas))
        deltas = []
        channel.put_nowait(item)
    channel.extend(merge_deltas(deltas))


def _events_of(run: Run, delta: object) -> list[pb.StreamEvent]:
    emitter = run.emitter
    kind = type(delta)
    if kind is ToolCallDelta:
        assert isinstance(delta, ToolCallDelta)
        if delta.index > 0 and not run.response.parallel_tool_calls:
            # parallel_tool_calls false: the first call of the turn only, whatever the backend sent.
            return []
        return emitter.on_tool_call(delta.index, delta.call_id, delta.name, delta.arguments)
    if kind is ReasoningDelta:
        return emitter.on_reasoning(delta.text)  # type: ignore[attr-defined]
    if kind is RefusalDelta:
        return emitter.on_refusal(delta.text)  # type: ignore[attr-defined]
    if isinstance(delta, BaseException):
        raise delta
    raise ProviderError("backend_protocol_error", "the model stream ended without a finish")


def add_completion(run: Run, completion: Completion) -> list[pb.StreamEvent]:
    """A whole turn's items, added to the response."""
    _add_usage(run.response, completion.usage)
    events: list[pb.StreamEvent] = []
    calls = 0
    for item in completion.items:
        if item.WhichOneof("kind") == "function_call":
            calls += 1
            if calls > 1 and not run.response.parallel_tool_calls:
                continue  # one call a turn: the backend's others are not the model's answer here
        events += run.emitter.add_item(item)
    return events


def _add_usage(response: pb.Response, usage: pb.Usage | None) -> None:
    if usage is None:
        return
    total = response.usage
    total.input_tokens += usage.input_tokens
    total.output_tokens += usage.output_tokens
    total.total_tokens += usage.total_tokens or (usage.input_tokens + usage.output_tokens)
    total.cached_input_tokens += usage.cached_input_tokens
    total.reasoning_tokens += usage.reasoning_tokens
