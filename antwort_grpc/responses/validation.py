"""Checks of a CreateResponseRequest before anything runs: every problem, with the field it is in.

Pure: returns the violations; the servicer turns them into INVALID_ARGUMENT with
google.rpc.BadRequest details.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from jsonschema import exceptions as schema_errors
from jsonschema.validators import validator_for

from antwort_grpc import pb
from antwort_grpc.engine.limits import ServerLimits
from antwort_grpc.errors import FieldViolation

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_METADATA = 16


def validate_create(request: pb.CreateResponseRequest) -> list[FieldViolation]:
    v: list[FieldViolation] = []
    _check_input(request, v)
    function_names = _check_tools(request.tools, v)
    hosted = any(t.WhichOneof("kind") != "function" for t in request.tools)
    if request.HasField("tool_choice"):
        _check_choice(request.tool_choice, function_names, hosted, bool(request.tools), v)
    if request.HasField("max_output_tokens") and request.max_output_tokens <= 0:
        v.append(FieldViolation("max_output_tokens", "must be positive"))
    if request.HasField("temperature") and not 0.0 <= request.temperature <= 2.0:
        v.append(FieldViolation("temperature", "must be between 0 and 2"))
    if request.HasField("top_p") and not 0.0 <= request.top_p <= 1.0:
        v.append(FieldViolation("top_p", "must be between 0 and 1"))
    if len(request.metadata) > MAX_METADATA:
        v.append(FieldViolation("metadata", f"at most {MAX_METADATA} entries"))
    for key, value in request.metadata.items():
        if len(key) > 64:
            v.append(FieldViolation(f"metadata[{key[:20]}…]", "keys are at most 64 characters"))
        if len(value) > 512:
            v.append(FieldViolation(f"metadata[{key}]", "values are at most 512 characters"))
    return v


def _check_input(request: pb.CreateResponseRequest, v: list[FieldViolation]) -> None:
    which = request.WhichOneof("input")
    if which == "input_text":
        if not request.input_text.strip() and not request.previous_response_id:
            v.append(FieldViolation("input_text", "must not be empty"))
        return
    items = request.input_items.items if which == "input_items" else []
    if not items and not request.previous_response_id:
        v.append(FieldViolation("input", "required: input_text or input_items (or a previous_response_id)"))
    for n, item in enumerate(items):
        _check_item(item, f"input_items.items[{n}]", v)


def _check_item(item: pb.Item, at: str, v: list[FieldViolation]) -> None:
    kind = item.WhichOneof("kind")
    if kind is None:
        v.append(FieldViolation(at, "an item needs one of message, function_call, function_call_output, reasoning"))
    elif kind == "message":
        if item.message.role == pb.Role.ROLE_UNSPECIFIED:
            v.append(FieldViolation(f"{at}.message.role", "required"))
        if not item.message.content:
            v.append(FieldViolation(f"{at}.message.content", "must not be empty"))
        for m, part in enumerate(item.message.content):
            which = part.WhichOneof("part")
            if which is None:
                v.append(FieldViolation(f"{at}.message.content[{m}]", "a content part needs a kind"))
            elif which == "input_image" and not part.input_image.image_url:
                v.append(FieldViolation(f"{at}.message.content[{m}].input_image.image_url", "required"))
    elif kind == "function_call":
        if not item.function_call.call_id:
            v.append(FieldViolation(f"{at}.function_call.call_id", "required"))
        if not item.function_call.name:
            v.append(FieldViolation(f"{at}.function_call.name", "required"))
    elif kind == "function_call_output" and not item.function_call_output.call_id:
        v.append(FieldViolation(f"{at}.function_call_output.call_id", "required"))


def _check_tools(tools: Iterable[pb.Tool], v: list[FieldViolation]) -> set[str]:
    names: set[str] = set()
    labels: set[str] = set()
    for n, tool in enumerate(tools):
        at = f"tools[{n}]"
        kind = tool.WhichOneof("kind")
        if kind is None:
            v.append(FieldViolation(at, "a tool needs one of function, mcp, code_interpreter"))
        elif kind == "function":
            name = tool.function.name
            if not _NAME.match(name):
                v.append(FieldViolation(f"{at}.function.name", "1-64 characters of a-z, A-Z, 0-9, _ and -"))
            elif name in names:
                v.append(FieldViolation(f"{at}.function.name", f"duplicate tool name {name!r}"))
            names.add(name)
            if tool.function.HasField("parameters"):
                problem = schema_problem(MessageToDict(tool.function.parameters))
                if problem:
                    v.append(FieldViolation(f"{at}.function.parameters", problem))
        elif kind == "mcp":
            label = tool.mcp.server_label
            if not label:
                v.append(FieldViolation(f"{at}.mcp.server_label", "required"))
            elif label in labels:
                v.append(FieldViolation(f"{at}.mcp.server_label", f"duplicate MCP server {label!r}"))
            labels.add(label)
    return names


def schema_problem(schema: dict[str, object]) -> str:
    """Why `schema` is not a usable JSON Schema for function arguments ("" when it is)."""
    if schema.get("type", "object") != "object":
        return "the arguments schema must have type 'object'"
    try:
        validator_for(schema).check_schema(schema)
    except schema_errors.SchemaError as err:
        path = "/".join(str(p) for p in err.path)
        return f"not a valid JSON Schema: {err.message}" + (f" (at {path})" if path else "")
    return ""


def _check_choice(
    choice: pb.ToolChoice, names: set[str], hosted: bool, has_tools: bool, v: list[FieldViolation]
) -> None:
    which = choice.WhichOneof("choice")
    if which == "mode":
        if choice.mode == pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED and not has_tools:
            v.append(FieldViolation("tool_choice.mode", "required needs at least one tool"))
    elif which == "function":
        # Hosted tools expand into functions only once their executor answers: checked later.
        if not choice.function.name:
            v.append(FieldViolation("tool_choice.function.name", "required"))
        elif choice.function.name not in names and not hosted:
            v.append(
                FieldViolation(
                    "tool_choice.function.name", f"{choice.function.name!r} is not one of the request's tools"
                )
            )
    elif which == "allowed_tools":
        if choice.allowed_tools.mode == pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE:
            v.append(FieldViolation("tool_choice.allowed_tools.mode", "must be AUTO or REQUIRED"))
        for n, name in enumerate(choice.allowed_tools.tool_names):
            if name not in names and not hosted:
                v.append(
                    FieldViolation(
                        f"tool_choice.allowed_tools.tool_names[{n}]", f"{name!r} is not one of the request's tools"
                    )
                )


def check_item(item: pb.Item, at: str, v: list[FieldViolation]) -> None:
    """The checks of one input item, for other inputs that carry items (controls)."""
    _check_item(item, at, v)


# -- policy fields: execution limits, tool timeouts, failure mode, truncation ----------------------

# Without a server maximum, a longer limit than this is a mistake, not a wish.
LONGEST_DURATION = 24 * 3600.0


def validate_policy(request: pb.CreateResponseRequest, server: ServerLimits) -> list[FieldViolation]:
    """The policy fields of a request against the server's maximums."""
    v: list[FieldViolation] = []
    if request.HasField("limits"):
        _check_limits(request.limits, server, v)
    if request.HasField("tool_timeout"):
        _check_duration(request.tool_timeout, "tool_timeout", server.max_tool_timeout, v)
    for name, timeout in request.tool_timeouts.items():
        at = f"tool_timeouts[{name}]"
        if not _NAME.match(name):
            v.append(FieldViolation(at, "keys are tool names: 1-64 characters of a-z, A-Z, 0-9, _ and -"))
        _check_duration(timeout, at, server.max_tool_timeout, v)
    if request.tool_failure_mode not in pb.ToolFailureMode.values():
        v.append(FieldViolation("tool_failure_mode", f"unknown value {request.tool_failure_mode}"))
    if request.truncation not in pb.Truncation.values():
        v.append(FieldViolation("truncation", f"unknown value {request.truncation}"))
    return v


def _check_limits(limits: pb.ExecutionLimits, server: ServerLimits, v: list[FieldViolation]) -> None:
    counts = [
        ("max_turns", 1, server.max_turns),
        ("max_tool_calls", 0, server.max_tool_calls),
        ("max_output_tokens", 1, server.max_output_tokens),
    ]
    for name, least, most in counts:
        if not limits.HasField(name):
            continue
        value = getattr(limits, name)
        if value < least:
            v.append(FieldViolation(f"limits.{name}", f"must be at least {least}"))
        elif most is not None and value > most:
            v.append(FieldViolation(f"limits.{name}", f"at most {most} (the server's maximum)"))
    if limits.HasField("max_duration"):
        _check_duration(limits.max_duration, "limits.max_duration", server.max_duration, v)


def _check_duration(duration: Duration, at: str, most: float | None, v: list[FieldViolation]) -> None:
    if not -999_999_999 <= duration.nanos <= 999_999_999 or (duration.seconds * duration.nanos < 0):
        v.append(FieldViolation(at, "not a valid duration (seconds and nanos disagree)"))
        return
    value = duration.seconds + duration.nanos / 1e9
    if value <= 0:
        v.append(FieldViolation(at, "must be positive"))
    elif most is not None and value > most:
        v.append(FieldViolation(at, f"at most {most:g} s (the server's maximum)"))
    elif value > LONGEST_DURATION:
        v.append(FieldViolation(at, f"at most {LONGEST_DURATION:g} s"))
