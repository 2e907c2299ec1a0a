"""Checks of a CreateResponseRequest before anything runs: every problem, with the field it is in.

`validate_create` is pure: it returns the violations. `check_create` raises them as
INVALID_ARGUMENT (google.rpc.BadRequest details), and checks a large request in a worker thread so
the event loop (and every other stream) never waits on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from google.protobuf.duration_pb2 import Duration

from antwort_grpc import pb
from antwort_grpc.engine.budget import ServerLimits
from antwort_grpc.errors import FieldViolation, invalid_argument, shorten
from antwort_grpc.offload import off_loop
from antwort_grpc.providers import coalesce
from antwort_grpc.responses.request_limits import DEFAULT_LIMITS, MAX_ID_CHARS, Limits
from antwort_grpc.responses.schemas import format_schema_problem, parameters_problems

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_LABEL_CHARS = 64
# Beyond these a request is checked in a worker thread: the cost is mostly uncached schema checks
# (about 2 ms each) and a Python walk over the items.
_THREAD_TOOLS = 8
_THREAD_ITEMS = 256


async def check_create(request: pb.CreateResponseRequest, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise INVALID_ARGUMENT with every problem of `request`, if it has any."""
    items = request.input_items.items if request.WhichOneof("input") == "input_items" else ()
    if len(request.tools) > _THREAD_TOOLS or len(items) > _THREAD_ITEMS:
        violations = await off_loop(validate_create, request, limits, in_worker=True)
    else:
        violations = validate_create(request, limits)
    if violations:
        raise invalid_argument(violations)


def validate_create(
    request: pb.CreateResponseRequest, limits: Limits = DEFAULT_LIMITS, *, in_worker: bool = False
) -> list[FieldViolation]:
    """Every problem of `request`. `in_worker`: called in the worker thread (offload.off_loop),
    which may hand the checks of many unseen schemas to the worker process."""
    v: list[FieldViolation] = []
    check_id("model", request.model, v)
    check_id("previous_response_id", request.previous_response_id, v)
    _check_input(request, limits, v)
    _check_request_tools(request, limits, v, in_worker)
    if request.HasField("text"):
        _check_text(request.text, limits, v)
    if request.HasField("max_output_tokens") and request.max_output_tokens <= 0:
        v.append(FieldViolation("max_output_tokens", "must be positive"))
    # An unset setting reads as 0, which every range below holds: no presence check needed.
    if not 0.0 <= request.temperature <= 2.0:
        v.append(FieldViolation("temperature", "must be between 0 and 2"))
    if not 0.0 <= request.top_p <= 1.0:
        v.append(FieldViolation("top_p", "must be between 0 and 1"))
    if request.delta_coalescing.HasField("max_hold"):
        _check_duration(request.delta_coalescing.max_hold, "delta_coalescing.max_hold", coalesce.MAX_HOLD, v)
    if request.background and request.HasField("store") and not request.store:
        v.append(FieldViolation("background", "a background response is stored: it needs store (true or unset)"))
    _check_metadata(request, limits, v)
    _check_passed_through(request, v)
    return v


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
PROMPT_CACHE_KEY_MAX = 256


def _check_passed_through(request: pb.CreateResponseRequest, v: list[FieldViolation]) -> None:
    """What goes to the backend as it is: values the backend would refuse, refused here first."""
    # Asked first: reading an unset message's field makes a wrapper of it.
    effort = request.reasoning.effort if request.HasField("reasoning") else ""
    if effort and effort not in REASONING_EFFORTS:
        v.append(FieldViolation("reasoning.effort", f"one of {', '.join(REASONING_EFFORTS)}"))
    if len(request.prompt_cache_key) > PROMPT_CACHE_KEY_MAX:
        v.append(FieldViolation("prompt_cache_key", f"at most {PROMPT_CACHE_KEY_MAX} characters"))
    # Unset, each reads as 0: within its range.
    if not 0 <= request.top_logprobs <= 20:
        v.append(FieldViolation("top_logprobs", "must be between 0 and 20"))
    if not -2.0 <= request.presence_penalty <= 2.0:
        v.append(FieldViolation("presence_penalty", "must be between -2 and 2"))
    if not -2.0 <= request.frequency_penalty <= 2.0:
        v.append(FieldViolation("frequency_penalty", "must be between -2 and 2"))


def _check_metadata(request: pb.CreateResponseRequest, limits: Limits, v: list[FieldViolation]) -> None:
    if len(request.metadata) > limits.max_metadata:
        v.append(FieldViolation("metadata", f"at most {limits.max_metadata} entries"))
        return
    for key, value in request.metadata.items():
        if len(key) > 64:
            v.append(FieldViolation(f"metadata[{shorten(key, 20)}]", "keys are at most 64 characters"))
        if len(value) > 512:
            v.append(FieldViolation(f"metadata[{shorten(key, 20)}]", "values are at most 512 characters"))


def _check_request_tools(
    request: pb.CreateResponseRequest, limits: Limits, v: list[FieldViolation], in_worker: bool
) -> None:
    if len(request.tools) > limits.max_tools:
        # Not looked at one by one: that is the work the limit is there to bound.
        v.append(FieldViolation("tools", f"at most {limits.max_tools} tools (this request has {len(request.tools)})"))
    elif (size := sum(tool.ByteSize() for tool in request.tools)) > limits.max_tools_bytes:
        v.append(
            FieldViolation("tools", f"at most {limits.max_tools_bytes} bytes serialized together (these are {size})")
        )
    else:
        function_names = _check_tools(request.tools, limits, v, in_worker)
        hosted = any(t.WhichOneof("kind") != "function" for t in request.tools)
        if request.HasField("tool_choice"):
            _check_choice(request.tool_choice, function_names, hosted, limits, v)


def content_parts_violation(field: str, parts: int, limits: Limits) -> FieldViolation:
    most = limits.max_content_parts
    return FieldViolation(field, f"at most {most} content parts in all (this has {parts}; ANTWORT_MAX_CONTENT_PARTS)")


def check_id(field: str, value: str, v: list[FieldViolation]) -> None:
    if len(value) > MAX_ID_CHARS:
        v.append(FieldViolation(field, f"at most {MAX_ID_CHARS} characters"))


def _continues(request: pb.CreateResponseRequest) -> bool:
    return bool(request.previous_response_id or request.conversation_id)


def _check_input(request: pb.CreateResponseRequest, limits: Limits, v: list[FieldViolation]) -> None:
    which = request.WhichOneof("input")
    # Without input the model starts from an earlier response or a conversation (whose items may
    # have been added to it directly, as OpenAI's conversations allow); read only then.
    if which == "input_text":
        if not request.input_text.strip() and not _continues(request):
            v.append(FieldViolation("input_text", "must not be empty"))
        return
    items = request.input_items.items if which == "input_items" else []
    if not items and not _continues(request):
        v.append(
            FieldViolation("input", "required: input_text or input_items (or a previous_response_id or a conversation)")
        )
    if len(items) > limits.max_input_items:
        v.append(
            FieldViolation(
                "input_items.items", f"at most {limits.max_input_items} items (this request has {len(items)})"
            )
        )
        return
    parts = sum(len(item.message.content) for item in items)
    if parts > limits.max_content_parts:
        # Not looked at one by one: that is the work the limit is there to bound.
        v.append(content_parts_violation("input_items.items", parts, limits))
        return
    for n, item in enumerate(items):
        _check_item(item, f"input_items.items[{n}]", v)


def _check_item(item: pb.Item, at: str, v: list[FieldViolation]) -> None:
    kind = item.WhichOneof("kind")
    check_id(f"{at}.id", item.id, v)
    if kind is None:
        v.append(
            FieldViolation(
                at, "an item needs one of message, function_call, function_call_output, reasoning, item_reference"
            )
        )
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
    else:
        _check_other_item(item, kind, at, v)


def _check_other_item(item: pb.Item, kind: str, at: str, v: list[FieldViolation]) -> None:
    """An item that is not a message: the ids that pair or name it."""
    if kind == "function_call":
        if not item.function_call.call_id:
            v.append(FieldViolation(f"{at}.function_call.call_id", "required"))
        check_id(f"{at}.function_call.call_id", item.function_call.call_id, v)
        if not item.function_call.name:
            v.append(FieldViolation(f"{at}.function_call.name", "required"))
    elif kind == "function_call_output":
        if not item.function_call_output.call_id:
            v.append(FieldViolation(f"{at}.function_call_output.call_id", "required"))
        check_id(f"{at}.function_call_output.call_id", item.function_call_output.call_id, v)
    elif kind == "item_reference":
        if not item.item_reference.id:
            v.append(FieldViolation(f"{at}.item_reference.id", "required: the id of an item of a stored response"))
        check_id(f"{at}.item_reference.id", item.item_reference.id, v)


def _check_text(text: pb.TextConfig, limits: Limits, v: list[FieldViolation]) -> None:
    """A json_schema format: its name, and its schema within the limits of a tool's parameters."""
    if text.format.WhichOneof("kind") != "json_schema":
        return
    form = text.format.json_schema
    at = "text.format.json_schema"
    if not _NAME.match(form.name):
        v.append(FieldViolation(f"{at}.name", "required: 1-64 characters of a-z, A-Z, 0-9, _ and -"))
    if len(form.description) > limits.max_schema_bytes:
        v.append(FieldViolation(f"{at}.description", f"at most {limits.max_schema_bytes} characters"))
    if not form.HasField("schema"):
        v.append(FieldViolation(f"{at}.schema", "required: the JSON Schema the answer must be valid against"))
        return
    problem = format_schema_problem(form.schema, max_bytes=limits.max_schema_bytes, max_depth=limits.max_schema_depth)
    if problem:
        v.append(FieldViolation(f"{at}.schema", problem))


def _check_tools(tools: Sequence[pb.Tool], limits: Limits, v: list[FieldViolation], in_worker: bool) -> set[str]:
    names: set[str] = set()
    labels: set[str] = set()
    problems = _schema_problems(tools, limits, in_worker)
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
                problem = next(problems)
                if problem:
                    v.append(FieldViolation(f"{at}.function.parameters", problem))
        elif kind == "mcp":
            label = tool.mcp.server_label
            if not label:
                v.append(FieldViolation(f"{at}.mcp.server_label", "required"))
            elif len(label) > MAX_LABEL_CHARS:
                v.append(FieldViolation(f"{at}.mcp.server_label", f"at most {MAX_LABEL_CHARS} characters"))
            elif label in labels:
                v.append(FieldViolation(f"{at}.mcp.server_label", f"duplicate MCP server {label!r}"))
            labels.add(label)
    return names


def _check_choice(
    choice: pb.ToolChoice, names: set[str], hosted: bool, limits: Limits, v: list[FieldViolation]
) -> None:
    which = choice.WhichOneof("choice")
    if which == "mode":
        if choice.mode == pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED and not (names or hosted):
            v.append(FieldViolation("tool_choice.mode", "required needs at least one tool"))
    elif which == "function":
        # Hosted tools expand into functions only once their executor answers: checked later.
        if not choice.function.name:
            v.append(FieldViolation("tool_choice.function.name", "required"))
        elif choice.function.name not in names and not hosted:
            v.append(
                FieldViolation(
                    "tool_choice.function.name", f"{shorten(choice.function.name)!r} is not one of the request's tools"
                )
            )
    elif which == "allowed_tools":
        if choice.allowed_tools.mode == pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE:
            v.append(FieldViolation("tool_choice.allowed_tools.mode", "must be AUTO or REQUIRED"))
        if len(choice.allowed_tools.tool_names) > limits.max_tools:
            v.append(FieldViolation("tool_choice.allowed_tools.tool_names", f"at most {limits.max_tools} names"))
            return
        for n, name in enumerate(choice.allowed_tools.tool_names):
            if name not in names and not hosted:
                problem = f"{shorten(name)!r} is not one of the request's tools"
                v.append(FieldViolation(f"tool_choice.allowed_tools.tool_names[{n}]", problem))


def _schema_problems(tools: Sequence[pb.Tool], limits: Limits, in_worker: bool) -> Iterator[str]:
    """The problem ("" for none) of each function tool's `parameters`, in order: every schema at
    once, so the unseen ones of a large request are checked together, elsewhere."""
    if not tools:
        return iter(())
    schemas = [
        t.function.parameters for t in tools if t.WhichOneof("kind") == "function" and t.function.HasField("parameters")
    ]
    problems = parameters_problems(
        schemas, max_bytes=limits.max_schema_bytes, max_depth=limits.max_schema_depth, in_worker=in_worker
    )
    return iter(problems)


def check_item(item: pb.Item, at: str, v: list[FieldViolation]) -> None:
    """The checks of one input item, for other inputs that carry items (controls). Files are read
    when a response is created (responses/files.py), not mid-run."""
    _check_item(item, at, v)
    if item.WhichOneof("kind") == "message":
        for m, part in enumerate(item.message.content):
            if part.WhichOneof("part") == "input_file":
                v.append(
                    FieldViolation(f"{at}.message.content[{m}]", "files are taken when a response is created only")
                )


# -- policy fields: execution limits, tool timeouts, failure mode, truncation ----------------------

# Without a server maximum, a longer limit than this is a mistake, not a wish.
LONGEST_DURATION = 24 * 3600.0
# Read once: an enum's values() is a Python-level walk over its descriptor.
_FAILURE_MODES = frozenset(pb.ToolFailureMode.values())
_TRUNCATIONS = frozenset(pb.Truncation.values())


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
    if request.tool_failure_mode not in _FAILURE_MODES:
        v.append(FieldViolation("tool_failure_mode", f"unknown value {request.tool_failure_mode}"))
    if request.truncation not in _TRUNCATIONS:
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
