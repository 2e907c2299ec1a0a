"""TurnRequest -> the JSON body of POST /v1/chat/completions (pure; no I/O)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.structs import integral, struct_json

ChatMessage = dict[str, Any]

# "developer" is OpenAI's newer name for "system"; self-hosted backends only know "system".
_ROLES = {
    pb.Role.ROLE_USER: "user",
    pb.Role.ROLE_SYSTEM: "system",
    pb.Role.ROLE_DEVELOPER: "system",
    pb.Role.ROLE_ASSISTANT: "assistant",
    pb.Role.ROLE_UNSPECIFIED: "user",
}
_DETAIL = {pb.ImageDetail.IMAGE_DETAIL_LOW: "low", pb.ImageDetail.IMAGE_DETAIL_HIGH: "high"}
_MODES = {
    pb.ToolChoiceMode.TOOL_CHOICE_MODE_AUTO: "auto",
    pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED: "required",
    pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE: "none",
    pb.ToolChoiceMode.TOOL_CHOICE_MODE_UNSPECIFIED: "auto",
}
_EMPTY_SCHEMA_JSON = json.dumps({"type": "object", "properties": {}})
# Messages encoded per call into C beyond this many: json.dumps holds the GIL for the whole call
# (30 ms for the 2,048 messages of 8 MB), the event loop waits for it as long; in pieces it can
# take the GIL between them. 128 messages of 3.5 KB held it 60-70 ms a piece on a busy host
# (py-spy, four requests at the limits at once); 32 hold it a quarter as long.
ENCODED_TOGETHER = 32


def encode_body(turn: TurnRequest, *, stream: bool, model: str | None = None) -> bytes:
    """The request body as sent: build_body's JSON, with each tool's schema spliced in as the JSON
    text converted once (structs.struct_json) rather than converted and encoded again per call.
    Many messages are encoded in pieces (the same text)."""
    body = build_body(turn, stream=stream, model=model, tools=False)
    if len(body["messages"]) > ENCODED_TOGETHER:
        return _encoded_in_pieces(body, turn.tools)
    text = json.dumps(body)
    if turn.tools:
        tools = ", ".join(_function_tool_json(tool) for tool in turn.tools)
        text = f'{text[:-1]}, "tools": [{tools}]}}'
    return text.encode()


def _encoded_in_pieces(body: dict[str, Any], tools: Sequence[pb.FunctionTool]) -> bytes:
    messages = body["messages"]
    body["messages"] = None
    # Keys are encoded with their quotes escaped inside strings: this is the "messages" key.
    head, tail = json.dumps(body).split(_MESSAGES + "null", 1)
    step = ENCODED_TOGETHER
    pieces = (json.dumps(messages[n : n + step])[1:-1] for n in range(0, len(messages), step))
    parts = [head, _MESSAGES, "[", ", ".join(pieces), "]", tail[:-1]]
    if tools:
        parts += [', "tools": [', ", ".join(_function_tool_json(tool) for tool in tools), "]"]
    parts.append("}")
    return "".join(parts).encode()


_MESSAGES = '"messages": '


def build_body(turn: TurnRequest, *, stream: bool, model: str | None = None, tools: bool = True) -> dict[str, Any]:
    """The request body; `tools` False: without the "tools" list (encode_body adds it)."""
    messages = build_messages(turn.instructions, turn.items)
    body: dict[str, Any] = {"model": model or turn.model, "messages": messages}
    if turn.tools:
        if tools:
            body["tools"] = [function_tool(tool) for tool in turn.tools]
        if turn.tool_choice is not None:
            body["tool_choice"] = tool_choice(turn.tool_choice)
        # Backends (OpenAI among them) reject parallel_tool_calls without tools.
        body["parallel_tool_calls"] = turn.parallel_tool_calls
    _settings(turn, body)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _settings(turn: TurnRequest, body: dict[str, Any]) -> None:
    """The turn's settings, and what the request asked of the backend as it is: each one only
    when asked (a backend that does not know a parameter may refuse it). Spelled out, not a
    table: a getattr per setting costs every model call."""
    if turn.max_output_tokens is not None:
        # max_tokens, not max_completion_tokens: every self-hosted backend understands it.
        body["max_tokens"] = turn.max_output_tokens
    if turn.temperature is not None:
        body["temperature"] = turn.temperature
    if turn.top_p is not None:
        body["top_p"] = turn.top_p
    if turn.presence_penalty is not None:
        body["presence_penalty"] = turn.presence_penalty
    if turn.frequency_penalty is not None:
        body["frequency_penalty"] = turn.frequency_penalty
    if turn.text_format is not None:
        body["response_format"] = response_format(turn.text_format)
    if turn.reasoning_effort:
        body["reasoning_effort"] = turn.reasoning_effort
    if turn.prompt_cache_key:
        body["prompt_cache_key"] = turn.prompt_cache_key
    if turn.top_logprobs is not None:
        body["logprobs"] = True
        if turn.top_logprobs:
            body["top_logprobs"] = turn.top_logprobs


def build_messages(instructions: str, items: Iterable[pb.Item]) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    calls: set[str] = set()
    for item in items:
        kind = item.WhichOneof("kind")
        if kind == "message":
            messages.append(_message(item.message))
        elif kind == "function_call":
            # A call handed out again after its approval is one call (the model made it once).
            if item.function_call.call_id not in calls:
                calls.add(item.function_call.call_id)
                _append_tool_call(messages, item.function_call)
        elif kind == "function_call_output":
            output = item.function_call_output
            messages.append({"role": "tool", "tool_call_id": output.call_id, "content": output.output})
        # Reasoning items stay out: backends neither accept nor need their own reasoning back.
    return answer_every_call(messages)


NO_RESULT = "No result was provided for this call."


def answer_every_call(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The order Chat Completions demands: an assistant message with tool_calls is followed at once
    by one tool message per call. A client may continue a paused response with a plain message
    (its outputs come later, or never) or put its outputs after new text; the history is put in
    that order, and a call left unanswered gets a tool message saying no result was provided."""
    if not any("tool_calls" in m for m in messages):
        return messages
    answers = {m["tool_call_id"]: m for m in messages if m["role"] == "tool"}
    called = {call["id"] for m in messages for call in m.get("tool_calls", ())}
    ordered: list[ChatMessage] = []
    for message in messages:
        if message["role"] == "tool" and message["tool_call_id"] in called:
            continue  # placed right after its call below
        ordered.append(message)
        for call in message.get("tool_calls", ()):
            ordered.append(
                answers.get(call["id"]) or {"role": "tool", "tool_call_id": call["id"], "content": NO_RESULT}
            )
    return ordered


def _message(message: pb.Message) -> ChatMessage:
    role = _ROLES.get(message.role, "user")
    parts = [converted for part in message.content if (converted := _part(part)) is not None]
    if all(part["type"] == "text" for part in parts):
        # Plain string content is what every backend accepts (several reject part lists for
        # system and assistant messages).
        return {"role": role, "content": "".join(part["text"] for part in parts)}
    return {"role": role, "content": parts}


def _part(part: pb.ContentPart) -> dict[str, Any] | None:
    kind = part.WhichOneof("part")
    if kind == "input_text":
        return {"type": "text", "text": part.input_text.text}
    if kind == "output_text":
        return {"type": "text", "text": part.output_text.text}
    if kind == "refusal":
        return {"type": "text", "text": part.refusal.refusal}
    if kind == "input_image":
        image: dict[str, Any] = {"url": part.input_image.image_url}
        if detail := _DETAIL.get(part.input_image.detail):
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    return None


def wire_arguments(arguments: str) -> str:
    """A call's arguments as the backend gets them back: JSON, always. A call cut mid-arguments
    (a steering message arrived while the model wrote it) is stored as the model left it, `{"cit`;
    backends that parse the history (vLLM's chat templates, OpenAI's validation) reject that, and
    the call never ran, so the model is shown an empty object with the call's error output."""
    try:
        json.loads(arguments)
    except ValueError:
        return "{}"
    return arguments


def _append_tool_call(messages: list[ChatMessage], call: pb.FunctionCall) -> None:
    function = {"name": call.name, "arguments": wire_arguments(call.arguments)}
    entry = {"id": call.call_id, "type": "function", "function": function}
    last = messages[-1] if messages else None
    # Calls of one turn (and the text before them) are one assistant message on the wire.
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(entry)
        if last.get("content") == "":
            last["content"] = None
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [entry]})


def function_tool(tool: pb.FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = json.loads(_parameters_json(tool))
    if tool.strict:
        function["strict"] = True
    return {"type": "function", "function": function}


_PARAMETERS = '"parameters": '


def _function_tool_json(tool: pb.FunctionTool) -> str:
    """json.dumps(function_tool(tool)), the schema's text taken as it is."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = None
    if tool.strict:
        function["strict"] = True
    head, tail = json.dumps({"type": "function", "function": function}).split(_PARAMETERS + "null", 1)
    return f"{head}{_PARAMETERS}{_parameters_json(tool)}{tail}"


def _parameters_json(tool: pb.FunctionTool) -> str:
    return struct_json(tool.parameters) if tool.HasField("parameters") else _EMPTY_SCHEMA_JSON


def tool_choice(choice: pb.ToolChoice) -> str | dict[str, Any]:
    kind = choice.WhichOneof("choice")
    if kind == "function":
        return {"type": "function", "function": {"name": choice.function.name}}
    if kind == "allowed_tools":
        # The model sees every tool; the engine enforces the allowed list on the calls.
        return _MODES.get(choice.allowed_tools.mode, "auto")
    if kind == "mode":
        return _MODES.get(choice.mode, "auto")
    return "auto"


def response_format(form: pb.TextFormat) -> dict[str, Any]:
    """The request's text format as Chat Completions' `response_format` (vLLM, llama.cpp's
    server, Ollama and OpenAI read this shape)."""
    if form.WhichOneof("kind") == "json_object":
        return {"type": "json_object"}
    schema = form.json_schema
    spec: dict[str, Any] = {"name": schema.name, "schema": integral(json.loads(struct_json(schema.schema)))}
    if schema.description:
        spec["description"] = schema.description
    if schema.HasField("strict"):
        spec["strict"] = schema.strict
    return {"type": "json_schema", "json_schema": spec}
