"""A provider that plays back a script: a list of turns, each a list of outputs.

Used by the tests and by `antwort-grpc serve --script FILE`. A turn can also be a function of the
TurnRequest, so a test can answer from what the model was sent (for example echo a tool result).
Every TurnRequest received is kept in `requests` for assertions; a script played from a file (`serve
--script`, a process that may run a long demo or a load test) keeps none.

File format (JSON):
    {"turns": [[{"text": "Let me check."}, {"tool_call": {"name": "f", "arguments": {"x": 1}}}],
               [{"text": "Done."}]],
     "repeat": false, "chunk_delay": 0.0}
A turn may also be an object {"outputs": [...], "finish": "length", "error": {"code": "...",
"message": "..."}, "usage": {"input_tokens": 1, "output_tokens": 2}}.

Or a model that reacts instead of playing turns in order (walkthroughs, where people send
requests in any order):
    {"tool_caller": {"arguments": {"city": "Paris"}, "by_tool": {"run_python": {"code": "print(1)"}}},
     "chunk_delay": 0.02}
calls the request's first tool when the last input is a user message, answers with the results
when the last input is tool output, and says it has no tools otherwise. The call's arguments are
that tool's entry in `by_tool` if it has one, else `arguments`; either way every property the
tool's schema requires and they lack is filled with a placeholder of its type, so a tool that
checks its arguments runs instead of refusing them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from antwort_grpc import pb
from antwort_grpc.ids import new_id
from antwort_grpc.providers.base import (
    Completion,
    FinishReason,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    TurnRequest,
)
from antwort_grpc.structs import struct_json


class ScriptError(ValueError):
    """A script file that cannot be played."""


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: str = "{}"
    call_id: str = ""

    @staticmethod
    def of(name: str, arguments: dict[str, Any] | str | None = None, call_id: str = "") -> Call:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        return Call(name, args, call_id)


Output = Text | Reasoning | Call


@dataclass(slots=True)
class Turn:
    outputs: Sequence[Output] = ()
    finish: FinishReason | None = None
    usage: pb.Usage | None = None
    # Raised instead of answering; with `error_after` > 0, after that many deltas.
    error: ProviderError | None = None
    error_after: int = 0
    # Seconds to wait before each delta (to hold a stream open, or race a cancel).
    delay: float = 0.0
    # Wait before delta `hold_at` until this event is set (tests release it; nothing sleeps).
    hold: asyncio.Event | None = None
    hold_at: int = 0


TurnSource = Turn | Sequence[Output] | Callable[[TurnRequest], "Turn | Sequence[Output]"]

DEFAULT_USAGE = (10, 5)


@dataclass
class ScriptedProvider:
    turns: list[TurnSource]
    repeat: bool = False
    chunk_delay: float = 0.0
    requests: list[TurnRequest] = field(default_factory=list)
    # Set while a turn waits at its `hold`.
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    # "stream" or "complete" per turn served, so tests can tell which path the engine used.
    modes: list[str] = field(default_factory=list)
    # How many of the latest turns `requests` and `modes` keep; None: all of them (tests assert
    # on them). Each request holds its whole input, so a long-running process must keep few.
    kept: int | None = None
    _next: int = 0

    @classmethod
    def from_file(cls, path: Path | str) -> ScriptedProvider:
        """Raises ScriptError, whose message says what is wrong with the file."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as error:
            raise ScriptError(f"cannot read {path}: {error.strerror}") from error
        except ValueError as error:
            raise ScriptError(f"{path} is not JSON: {error}") from error
        if isinstance(data, dict) and isinstance(data.get("tool_caller"), dict):
            caller = ToolCaller.of(data["tool_caller"], path)
            return cls([caller], repeat=True, chunk_delay=float(data.get("chunk_delay", 0.0)), kept=0)
        if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
            hint = ""
            if isinstance(data, dict) and "replies" in data:
                hint = (
                    " (it is a script of the fake OpenAI-compatible backend: run it with "
                    "`python -m antwort_grpc.testing.fake_openai --script FILE` and point --backend-url at it)"
                )
            raise ScriptError(f'{path} has no "turns" list{hint}')
        turns: list[TurnSource] = []
        for number, turn in enumerate(data["turns"], 1):
            try:
                turns.append(_turn_from_json(turn))
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                raise ScriptError(f"{path}: turn {number} is malformed ({type(error).__name__}: {error})") from error
        return cls(
            turns, repeat=bool(data.get("repeat", False)), chunk_delay=float(data.get("chunk_delay", 0.0)), kept=0
        )

    def _remember(self, mode: str, request: TurnRequest) -> None:
        self.modes.append(mode)
        self.requests.append(request)
        if self.kept is not None and len(self.requests) > self.kept:
            del self.requests[: len(self.requests) - self.kept]
            del self.modes[: len(self.modes) - self.kept]

    def _take(self, request: TurnRequest) -> Turn:
        if self._next >= len(self.turns):
            if not self.repeat or not self.turns:
                raise ProviderError("script_exhausted", f"the script has only {len(self.turns)} turns")
            self._next = 0
        source = self.turns[self._next]
        self._next += 1
        if callable(source):
            source = source(request)
        return source if isinstance(source, Turn) else Turn(list(source))

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        self._remember("stream", turn)
        script = self._take(turn)
        delay = script.delay or self.chunk_delay
        for emitted, event in enumerate(_deltas(script.outputs)):
            if script.error is not None and emitted >= script.error_after:
                raise script.error
            if script.hold is not None and emitted == script.hold_at:
                self.holding.set()
                await script.hold.wait()
            if delay:
                await asyncio.sleep(delay)
            yield event
        if script.error is not None:
            raise script.error
        yield TurnEnd(_finish(script), _usage(script))

    async def complete(self, turn: TurnRequest) -> Completion:
        self._remember("complete", turn)
        script = self._take(turn)
        if script.hold is not None:
            self.holding.set()
            await script.hold.wait()
        if script.delay or self.chunk_delay:
            await asyncio.sleep(script.delay or self.chunk_delay)
        if script.error is not None:
            raise script.error
        items: list[pb.Item] = []
        for out in script.outputs:
            if isinstance(out, Text):
                part = pb.ContentPart(output_text=pb.OutputText(text=out.text))
                items.append(pb.Item(message=pb.Message(role=pb.Role.ROLE_ASSISTANT, content=[part])))
            elif isinstance(out, Reasoning):
                items.append(pb.Item(reasoning=pb.Reasoning(text=out.text)))
            else:
                call = pb.FunctionCall(call_id=out.call_id or new_id("call"), name=out.name, arguments=out.arguments)
                items.append(pb.Item(function_call=call))
        return Completion(items, _finish(script), _usage(script))


@dataclass(frozen=True)
class ToolCaller:
    """A turn chosen from the request, as a model that calls tools would: the first tool for a
    user message, an answer from the results after tool output."""

    arguments: str = "{}"
    # Arguments per tool name (JSON objects), before `arguments`.
    by_tool: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, data: dict[str, Any], path: Path | str = "the script") -> ToolCaller:
        arguments, by_tool = data.get("arguments", {}), data.get("by_tool", {})
        if not isinstance(arguments, dict) or not isinstance(by_tool, dict):
            raise ScriptError(f'{path}: "arguments" and "by_tool" of "tool_caller" must be JSON objects')
        if not all(isinstance(v, dict) for v in by_tool.values()):
            raise ScriptError(f'{path}: each entry of "tool_caller"."by_tool" must be a JSON object of arguments')
        return cls(json.dumps(arguments), tuple((name, json.dumps(args)) for name, args in by_tool.items()))

    def __call__(self, request: TurnRequest) -> Turn:
        last = request.items[-1] if request.items else pb.Item()
        kind = last.WhichOneof("kind")
        if kind == "function_call_output":
            results: list[str] = []
            for item in reversed(request.items):  # the outputs of the last round, in order
                if item.WhichOneof("kind") != "function_call_output":
                    break
                results.insert(0, item.function_call_output.output)
            return Turn([Text(_shaped(f"The tool answered: {' | '.join(results)}", request.text_format))])
        if request.tools:
            tool = request.tools[0]
            return Turn([Reasoning(f"I should call {tool.name}."), Call(tool.name, self.arguments_for(tool))])
        hello = "Hello! I am a scripted stand-in for a model; offer me a tool and I will call it."
        return Turn([Text(_shaped(hello, request.text_format))])

    def arguments_for(self, tool: pb.FunctionTool) -> str:
        """The scripted arguments of this tool, completed with what its schema requires."""
        text = dict(self.by_tool).get(tool.name, self.arguments)
        arguments: dict[str, Any] = json.loads(text)
        schema = MessageToDict(tool.parameters) if tool.HasField("parameters") else {}
        properties = schema.get("properties") or {}
        missing = [name for name in schema.get("required") or [] if name not in arguments]
        if not missing:
            return text
        for name in missing:
            spec = properties.get(name)
            arguments[name] = _placeholder(name, spec if isinstance(spec, dict) else {})
        return json.dumps(arguments)


_PLACEHOLDERS: dict[str, Any] = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}


def _placeholder(name: str, spec: dict[str, Any]) -> Any:
    """A value of the schema's type: its first enum value or default when it names one."""
    if spec.get("enum"):
        return spec["enum"][0]
    if "default" in spec:
        return spec["default"]
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return _PLACEHOLDERS.get(str(kind), name)


def _deltas(outputs: Sequence[Output]) -> list[ProviderEvent]:
    """Text in word-sized fragments; a call as id+name first, then its arguments in two halves."""
    events: list[ProviderEvent] = []
    call_index = 0
    for out in outputs:
        if isinstance(out, Text):
            words = out.text.split(" ")
            events += [TextDelta(w if i == 0 else " " + w) for i, w in enumerate(words)]
        elif isinstance(out, Reasoning):
            events.append(ReasoningDelta(out.text))
        else:
            half = len(out.arguments) // 2
            events.append(ToolCallDelta(call_index, out.arguments[:half], out.call_id or new_id("call"), out.name))
            events.append(ToolCallDelta(call_index, out.arguments[half:]))
            call_index += 1
    return events


def _finish(turn: Turn) -> FinishReason:
    if turn.finish is not None:
        return turn.finish
    return FinishReason.TOOL_CALLS if any(isinstance(o, Call) for o in turn.outputs) else FinishReason.STOP


def _usage(turn: Turn) -> pb.Usage:
    if turn.usage is not None:
        return turn.usage
    i, o = DEFAULT_USAGE
    return pb.Usage(input_tokens=i, output_tokens=o, total_tokens=i + o)


def _turn_from_json(data: Any) -> Turn:
    if isinstance(data, list):
        data = {"outputs": data}
    outputs: list[Output] = []
    for out in data.get("outputs", []):
        if "text" in out:
            outputs.append(Text(out["text"]))
        elif "reasoning" in out:
            outputs.append(Reasoning(out["reasoning"]))
        else:
            call = out["tool_call"]
            outputs.append(Call.of(call["name"], call.get("arguments"), call.get("call_id", "")))
    error = data.get("error")
    usage = data.get("usage")
    return Turn(
        outputs,
        finish=FinishReason(data["finish"]) if "finish" in data else None,
        usage=pb.Usage(
            input_tokens=usage.get("input_tokens", 0),
            output_tokens=usage.get("output_tokens", 0),
            total_tokens=usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
        )
        if usage
        else None,
        error=ProviderError(error["code"], error["message"]) if error else None,
        error_after=int(data.get("error_after", 0)),
        delay=float(data.get("delay", 0.0)),
    )


def _shaped(text: str, form: pb.TextFormat | None) -> str:
    """The answer in the form the request asks for (structured output), as a model that follows
    it would give: `{"answer": text}` for a JSON object, the plainest instance of a schema."""
    if form is None or form.WhichOneof("kind") not in ("json_object", "json_schema"):
        return text
    if form.WhichOneof("kind") == "json_object":
        return json.dumps({"answer": text})
    return json.dumps(_instance(json.loads(struct_json(form.json_schema.schema)), text))


def _instance(schema: Any, text: str, depth: int = 0) -> Any:
    """A value `schema` accepts, for the common shapes (enum, const, the JSON types, the first of
    anyOf/oneOf); strings say `text`."""
    if not isinstance(schema, dict) or depth > 16:
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for choice in ("anyOf", "oneOf"):
        if schema.get(choice):
            return _instance(schema[choice][0], text, depth + 1)
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        properties = schema.get("properties") or {}
        names = schema.get("required") or list(properties)
        return {name: _instance(properties.get(name, {}), text, depth + 1) for name in names}
    if kind == "array":
        return [_instance(schema.get("items", {}), text, depth + 1) for _ in range(int(schema.get("minItems", 0)))]
    return _scalar(kind, schema, text)


def _scalar(kind: object, schema: dict[str, Any], text: str) -> Any:
    if kind in ("integer", "number"):
        least = schema.get("minimum", 0)
        return int(least) if kind == "integer" else float(least)
    if kind == "boolean":
        return False
    if kind == "string":
        return text[: int(schema.get("maxLength", len(text)))]
    return None
