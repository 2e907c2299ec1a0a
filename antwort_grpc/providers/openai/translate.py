"""Chat-completions responses -> provider events and items (pure; no I/O)."""

from __future__ import annotations

import secrets

from antwort_grpc import pb
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
)
from antwort_grpc.providers.openai.chunks import AnyErrorBody, AnyLogprobs, AnyToolCallFragment, AnyUsage, Chunk
from antwort_grpc.providers.openai.wire import ChatCompletion

_FINISH = {
    "stop": FinishReason.STOP,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "length": FinishReason.LENGTH,
    "content_filter": FinishReason.CONTENT_FILTER,
}


def finish_reason(reason: str | None, *, has_tool_calls: bool) -> FinishReason:
    finish = _FINISH.get(reason or "stop", FinishReason.STOP)
    # Some backends (older Ollama) say "stop" for a turn that called tools.
    if finish is FinishReason.STOP and has_tool_calls:
        return FinishReason.TOOL_CALLS
    return finish


def usage(wire: AnyUsage | None) -> pb.Usage | None:
    if wire is None:
        return None
    total = wire.total_tokens if wire.total_tokens is not None else wire.prompt_tokens + wire.completion_tokens
    found = pb.Usage(input_tokens=wire.prompt_tokens, output_tokens=wire.completion_tokens, total_tokens=total)
    if wire.prompt_tokens_details is not None:
        found.cached_input_tokens = wire.prompt_tokens_details.cached_tokens or 0
    if wire.completion_tokens_details is not None:
        found.reasoning_tokens = wire.completion_tokens_details.reasoning_tokens or 0
    return found


def token_logprobs(wire: AnyLogprobs | None) -> tuple[pb.TokenLogprob, ...]:
    """A choice's log probabilities (none when the backend gave none)."""
    if wire is None or not wire.content:
        return ()
    return tuple(
        pb.TokenLogprob(
            token=entry.token,
            logprob=entry.logprob,
            bytes=entry.bytes or (),
            top_logprobs=[
                pb.TopLogprob(token=top.token, logprob=top.logprob, bytes=top.bytes or ())
                for top in entry.top_logprobs or ()
            ],
        )
        for entry in wire.content
    )


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def in_band_error(error: AnyErrorBody) -> ProviderError:
    status = error.code if isinstance(error.code, int) else None
    code = "invalid_request" if status is not None and 400 <= status < 500 else "backend_unavailable"
    return ProviderError(code, f"the model backend reported an error mid-stream: {error.message}")


class _PendingCall:
    __slots__ = ("arguments", "call_id", "name")

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []


class StreamTranslator:
    """Turns the chunks of one streamed turn into deltas; `end()` gives the TurnEnd.

    Tool calls are keyed by the backend's `index` and renumbered in order of appearance. A
    call's first delta carries its call_id and name; fragments that arrive before the name is
    known are held back, so the engine never sees a nameless call.
    """

    __slots__ = ("_announced", "_by_id", "_finish", "_indexes", "_pending", "_usage")

    def __init__(self) -> None:
        self._indexes: dict[int, int] = {}
        self._by_id: dict[str, int] = {}
        self._pending: dict[int, _PendingCall] = {}
        self._announced: set[int] = set()
        self._finish: str | None = None
        self._usage: AnyUsage | None = None

    @property
    def finished(self) -> bool:
        return self._finish is not None

    def feed(self, chunk: Chunk) -> list[ProviderEvent]:
        if chunk.error is not None:
            raise in_band_error(chunk.error)
        if chunk.usage is not None:
            self._usage = chunk.usage
        events: list[ProviderEvent] = []
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # n > 1 is not something the gateway asks for
            delta = choice.delta
            if delta is not None:
                if reasoning := delta.reasoning_content or delta.reasoning:
                    events.append(ReasoningDelta(reasoning))
                if delta.content:
                    logprobs = choice.logprobs  # asked for by few: no call per delta without them
                    events.append(TextDelta(delta.content, token_logprobs(logprobs) if logprobs is not None else ()))
                if delta.refusal:
                    events.append(RefusalDelta(delta.refusal))
                if delta.tool_calls:
                    for fragment in delta.tool_calls:
                        self._tool_call(fragment, events)
            if choice.finish_reason is not None:
                self._finish = choice.finish_reason
        return events

    def _tool_call(self, fragment: AnyToolCallFragment, events: list[ProviderEvent]) -> None:
        index = self._index(fragment)
        function = fragment.function
        name = function.name if function is not None else None
        arguments = (function.arguments if function is not None else None) or ""
        if index in self._announced:
            if arguments:
                events.append(ToolCallDelta(index, arguments))
            return
        pending = self._pending.setdefault(index, _PendingCall())
        pending.call_id = pending.call_id or fragment.id
        pending.name = pending.name or name
        if arguments:
            pending.arguments.append(arguments)
        if pending.name:
            self._announce(index, pending, events)

    def _announce(self, index: int, pending: _PendingCall, events: list[ProviderEvent]) -> None:
        del self._pending[index]
        self._announced.add(index)
        call_id = pending.call_id or new_call_id()
        events.append(ToolCallDelta(index, "".join(pending.arguments), call_id=call_id, name=pending.name))

    def _index(self, fragment: AnyToolCallFragment) -> int:
        if fragment.index is not None:
            key = fragment.index
        elif fragment.id is not None:
            if fragment.id in self._by_id:
                return self._by_id[fragment.id]
            key = -1 - len(self._indexes)  # a new unindexed call: a key no backend index uses
        elif self._indexes:
            return len(self._indexes) - 1  # neither index nor id: more of the latest call
        else:
            key = -1
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = len(self._indexes)
        if fragment.id is not None:
            self._by_id.setdefault(fragment.id, index)
        return index

    def end(self) -> TurnEnd:
        if self._pending:
            raise ProviderError("backend_protocol_error", "the model backend sent a tool call without a name")
        finish = finish_reason(self._finish, has_tool_calls=bool(self._announced))
        return TurnEnd(finish, usage(self._usage))


def completion(response: ChatCompletion) -> Completion:
    """A non-streamed answer -> output items in the order the model produced them."""
    if not response.choices:
        raise ProviderError("backend_protocol_error", "the model backend answered without choices")
    choice = response.choices[0]
    message = choice.message
    items: list[pb.Item] = []
    if reasoning := message.reasoning_content or message.reasoning:
        items.append(pb.Item(reasoning=pb.Reasoning(text=reasoning)))
    parts: list[pb.ContentPart] = []
    if message.content:
        text = pb.OutputText(text=message.content, logprobs=token_logprobs(choice.logprobs))
        parts.append(pb.ContentPart(output_text=text))
    if message.refusal:
        parts.append(pb.ContentPart(refusal=pb.Refusal(refusal=message.refusal)))
    if parts:
        items.append(pb.Item(message=pb.Message(role=pb.Role.ROLE_ASSISTANT, content=parts)))
    for call in message.tool_calls or []:
        function_call = pb.FunctionCall(
            call_id=call.id or new_call_id(), name=call.function.name, arguments=call.function.arguments
        )
        items.append(pb.Item(function_call=function_call))
    finish = finish_reason(choice.finish_reason, has_tool_calls=bool(message.tool_calls))
    return Completion(items=items, finish=finish, usage=usage(response.usage))
