"""Building TurnRequests and draining provider streams, for the provider tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from antwort_grpc import pb
from antwort_grpc.providers.base import (
    FinishReason,
    Provider,
    ProviderEvent,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    TurnRequest,
)


def user(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


def turn(text: str = "Hello", model: str = "fake-model", **options: object) -> TurnRequest:
    # These tests look at how each chunk is translated: coalescing (chunks that arrive in one
    # read leave as one delta) is off unless a test turns it on.
    options.setdefault("coalesce", False)
    return TurnRequest(model=model, instructions="", items=[user(text)], tools=[], **options)  # type: ignore[arg-type]


@dataclass
class Drained:
    """A streamed turn, assembled the way the engine would."""

    events: list[ProviderEvent] = field(default_factory=list)
    text: str = ""
    reasoning: str = ""
    refusal: str = ""
    calls: list[pb.FunctionCall] = field(default_factory=list)
    end: TurnEnd | None = None

    @property
    def finish(self) -> FinishReason | None:
        return self.end.finish if self.end else None


async def drain(provider: Provider, request: TurnRequest, into: Drained | None = None) -> Drained:
    """Collects every event; `into` keeps what arrived when the stream raises."""
    out = into if into is not None else Drained()
    async for event in provider.stream(request):
        out.events.append(event)
        match event:
            case TextDelta(text):
                out.text += text
            case ReasoningDelta(text):
                out.reasoning += text
            case RefusalDelta(text):
                out.refusal += text
            case ToolCallDelta(index, arguments, call_id, name):
                if call_id is not None:
                    assert index == len(out.calls), "a new call takes the next index"
                    assert name, "the first delta of a call names it"
                    out.calls.append(pb.FunctionCall(call_id=call_id, name=name, arguments=arguments))
                else:
                    out.calls[index].arguments += arguments
            case TurnEnd():
                assert out.end is None, "exactly one TurnEnd"
                out.end = event
    assert out.end is not None and out.events[-1] is out.end, "the stream ends with its TurnEnd"
    return out
