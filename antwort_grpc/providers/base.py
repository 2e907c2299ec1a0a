"""What the engine needs from a model backend: stream one turn, or complete one turn.

A provider sees the whole context of a turn (a list of items) and answers with deltas (streaming)
or whole items (non-streaming). It never sees the engine's events or sequence numbers; the
engine's emitter turns deltas into items and events. Backend wire formats stay inside the
provider.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from antwort_grpc import pb


class FinishReason(enum.Enum):
    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"


# Not frozen: a frozen dataclass sets each of its eighteen fields through object.__setattr__, a
# call each, and one is built for every model call. Nothing assigns to one: a changed call is a
# copy (dataclasses.replace), and its items and tools are the run's own.
@dataclass(slots=True)
class TurnRequest:
    """One inference call: the full context and the settings for this turn."""

    model: str
    instructions: str
    items: Sequence[pb.Item]
    tools: Sequence[pb.FunctionTool]
    # The choice for this turn; None means auto. Allowed-tools restrictions are the engine's
    # business: the model always sees every tool.
    tool_choice: pb.ToolChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    # The form the answer's text must take (json_schema or json_object); None: plain text.
    text_format: pb.TextFormat | None = None
    # Passed through as the request asked ("" / None: not asked).
    reasoning_effort: str = ""
    prompt_cache_key: str = ""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Log probabilities of the output tokens, with this many alternatives (None: not asked).
    top_logprobs: int | None = None
    # Streaming: deltas of one part that are already waiting may be passed on as one
    # (providers/coalesce.py); `max_hold` seconds a delta may wait for more of its part.
    coalesce: bool = True
    max_hold: float = 0.0


# The deltas are not frozen: a frozen dataclass sets each field through object.__setattr__, a
# call each, for every delta of every stream. Nothing assigns to one: coalescing makes new ones.
@dataclass(slots=True)
class TextDelta:
    text: str
    # The text's tokens' log probabilities, when asked for and given.
    logprobs: tuple[pb.TokenLogprob, ...] = ()


@dataclass(slots=True)
class RefusalDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A fragment of the tool call at `index`. The first fragment of a call carries its
    call_id and name; later ones carry only argument text."""

    index: int
    arguments: str = ""
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """Always the last thing a turn stream yields."""

    finish: FinishReason
    usage: pb.Usage | None = None


ProviderEvent = TextDelta | RefusalDelta | ReasoningDelta | ToolCallDelta | TurnEnd


@dataclass(slots=True)
class Completion:
    """A whole turn from the non-streaming path. Items need no ids: the engine assigns them."""

    items: list[pb.Item]
    finish: FinishReason = FinishReason.STOP
    usage: pb.Usage | None = None


class ProviderError(Exception):
    """The backend failed. `code` is machine-readable and ends up in Response.error.code."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


class Provider(Protocol):
    def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        """Stream one turn: deltas, then exactly one TurnEnd. Raises ProviderError."""
        ...

    async def complete(self, turn: TurnRequest) -> Completion:
        """Run one turn without streaming. Raises ProviderError."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend is known, before anything runs, to be unable to do: a request asking for it
    is refused with a status before its response is created, instead of failing after `created`.
    The defaults know of nothing (an OpenAI-compatible backend says so only when asked)."""

    # The model names it serves; None: any name (the backend decides).
    models: frozenset[str] | None = None
    calls_tools: bool = True
    reads_images: bool = True
    # Who it is and what to do instead, for the error message.
    name: str = "the model backend"
    instead: str = ""


def capabilities_of(provider: object) -> Capabilities:
    """A provider's `capabilities` attribute, when it has one."""
    found = getattr(provider, "capabilities", None)
    return found if isinstance(found, Capabilities) else Capabilities()


def forces_a_call(choice: pb.ToolChoice | None) -> bool:
    """Whether a tool_choice demands that the model call a tool (required, or one function)."""
    if choice is None:
        return False
    kind = choice.WhichOneof("choice")
    if kind == "function":
        return True
    required = pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED
    if kind == "mode":
        return bool(choice.mode == required)
    return kind == "allowed_tools" and choice.allowed_tools.mode == required


@dataclass(slots=True)
class ProviderHealth:
    ok: bool
    detail: str = ""
    extra: dict[str, str] = field(default_factory=dict)
