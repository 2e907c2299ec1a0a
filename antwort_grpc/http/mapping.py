"""The one mapping between the Open Responses JSON (specification 2026-04-24; OpenAI's Responses API
where the spec is silent) and antwort.v1's protobuf types, both ways.

In: a request body becomes a `pb.CreateResponseRequest` (a value of the wrong type, an unknown item
or tool type, a parameter the gateway cannot honour: a RequestError naming the parameter by its
JSON path). Out: `pb.Response`, `pb.Item` and `pb.StreamEvent` become the spec's objects. What has
no shape in the spec is said in docs/http.md ("Differences").
"""

from __future__ import annotations

import base64
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec
from google.protobuf.json_format import MessageToDict

from antwort_grpc import pb
from antwort_grpc.event_kinds import TERMINAL_EVENTS
from antwort_grpc.http.jsonread import (
    JSON,
    array,
    bad,
    boolean,
    fail,
    integer,
    number,
    obj,
    one_of,
    optional_string,
    string,
)
from antwort_grpc.offload import off_loop
from antwort_grpc.structs import struct_json

S = pb.ResponseStatus

ROLES = {
    "user": pb.Role.ROLE_USER,
    "system": pb.Role.ROLE_SYSTEM,
    "developer": pb.Role.ROLE_DEVELOPER,
    "assistant": pb.Role.ROLE_ASSISTANT,
}
ROLE_NAMES = {value: name for name, value in ROLES.items()}
DETAILS = {
    "auto": pb.ImageDetail.IMAGE_DETAIL_AUTO,
    "low": pb.ImageDetail.IMAGE_DETAIL_LOW,
    "high": pb.ImageDetail.IMAGE_DETAIL_HIGH,
}
DETAIL_NAMES = {value: name for name, value in DETAILS.items()}
ITEM_STATUSES = {
    "in_progress": pb.ItemStatus.ITEM_STATUS_IN_PROGRESS,
    "completed": pb.ItemStatus.ITEM_STATUS_COMPLETED,
    "incomplete": pb.ItemStatus.ITEM_STATUS_INCOMPLETE,
}
ITEM_STATUS_NAMES = {value: name for name, value in ITEM_STATUSES.items()}
MODES = {
    "auto": pb.ToolChoiceMode.TOOL_CHOICE_MODE_AUTO,
    "required": pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED,
    "none": pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE,
}
MODE_NAMES = {value: name for name, value in MODES.items()}
TRUNCATIONS = {"auto": pb.Truncation.TRUNCATION_AUTO, "disabled": pb.Truncation.TRUNCATION_DISABLED}
APPROVALS = {"always": pb.ApprovalMode.APPROVAL_MODE_ALWAYS, "never": pb.ApprovalMode.APPROVAL_MODE_NEVER}
# A response that paused for the client's function calls is, in the spec's words, completed: its
# output ends with the calls (OpenAI's Responses API does the same).
STATUS_NAMES = {
    S.RESPONSE_STATUS_QUEUED: "queued",
    S.RESPONSE_STATUS_IN_PROGRESS: "in_progress",
    S.RESPONSE_STATUS_COMPLETED: "completed",
    S.RESPONSE_STATUS_REQUIRES_ACTION: "completed",
    S.RESPONSE_STATUS_INCOMPLETE: "incomplete",
    S.RESPONSE_STATUS_FAILED: "failed",
    S.RESPONSE_STATUS_CANCELLED: "cancelled",
}

# Hints, accepted and not acted on: what they ask is the server's to decide (a processing tier, an
# end user's identifier for abuse detection, the obfuscation of streamed deltas). Every other
# parameter is acted on or refused by name (docs/http.md, "Differences").
IGNORED = frozenset({"stream_options", "service_tier", "safety_identifier", "user"})


# ---------------------------------------------------------------------------------------- in


def create_request(body: object) -> pb.CreateResponseRequest:
    """The request a JSON body asks for; RequestError (INVALID_ARGUMENT, the parameter named)."""
    body = obj(body, "body")
    request = pb.CreateResponseRequest()
    if body.get("model") is None:
        fail("model", "required: the model to use ('' for the gateway's default)")
    request.model = string(body["model"], "model")
    for key, value in body.items():
        if value is None or key in IGNORED or key == "model":
            continue
        reader = _FIELDS.get(key)
        if reader is None:
            fail(key, "unknown parameter")
        reader(request, value)
    return request


def _input(request: pb.CreateResponseRequest, value: object) -> None:
    if isinstance(value, str):
        request.input_text = value
        return
    items = array(value, "input")
    request.input_items.items.extend(item_from_json(entry, f"input[{n}]") for n, entry in enumerate(items))
    if not items:
        request.input_items.SetInParent()


def _instructions(request: pb.CreateResponseRequest, value: object) -> None:
    request.instructions = string(value, "instructions")


def _previous(request: pb.CreateResponseRequest, value: object) -> None:
    request.previous_response_id = string(value, "previous_response_id")


def _conversation(request: pb.CreateResponseRequest, value: object) -> None:
    """An id, or OpenAI's object form {"id": ...}."""
    if isinstance(value, dict):
        request.conversation_id = string(value.get("id"), "conversation.id")
    else:
        request.conversation_id = string(value, "conversation")


def _tools(request: pb.CreateResponseRequest, value: object) -> None:
    request.tools.extend(tool_from_json(entry, f"tools[{n}]") for n, entry in enumerate(array(value, "tools")))


def _tool_choice(request: pb.CreateResponseRequest, value: object) -> None:
    request.tool_choice.CopyFrom(tool_choice_from_json(value, "tool_choice"))


def _metadata(request: pb.CreateResponseRequest, value: object) -> None:
    for key, entry in obj(value, "metadata").items():
        request.metadata[key] = string(entry, f"metadata.{key}")


def _temperature(request: pb.CreateResponseRequest, value: object) -> None:
    request.temperature = number(value, "temperature")


def _top_p(request: pb.CreateResponseRequest, value: object) -> None:
    request.top_p = number(value, "top_p")


def _parallel(request: pb.CreateResponseRequest, value: object) -> None:
    request.parallel_tool_calls = boolean(value, "parallel_tool_calls")


def _max_output_tokens(request: pb.CreateResponseRequest, value: object) -> None:
    request.max_output_tokens = integer(value, "max_output_tokens")


def _max_tool_calls(request: pb.CreateResponseRequest, value: object) -> None:
    request.limits.max_tool_calls = integer(value, "max_tool_calls")


def _store(request: pb.CreateResponseRequest, value: object) -> None:
    request.store = boolean(value, "store")


def _truncation(request: pb.CreateResponseRequest, value: object) -> None:
    request.truncation = one_of(value, "truncation", TRUNCATIONS)


def _text(request: pb.CreateResponseRequest, value: object) -> None:
    form = obj(value, "text").get("format")
    if form is None:
        return
    entry = obj(form, "text.format")
    kind = entry.get("type")
    if kind == "text":
        return  # the default: nothing to ask for
    if kind == "json_object":
        request.text.format.json_object.SetInParent()
    elif kind == "json_schema":
        wanted = request.text.format.json_schema
        wanted.name = string(entry.get("name"), "text.format.name")
        wanted.schema.update(obj(entry.get("schema"), "text.format.schema"))
        wanted.description = optional_string(entry, "description", "text.format.description") or ""
        strict = entry.get("strict")
        if strict is not None:
            wanted.strict = boolean(strict, "text.format.strict")
    else:
        fail("text.format.type", f"unknown text format {str(kind)[:64]!r}: text, json_schema, json_object")


def _reasoning_config(request: pb.CreateResponseRequest, value: object) -> None:
    entry = obj(value, "reasoning")
    effort = entry.get("effort")
    if effort is not None:
        request.reasoning.effort = string(effort, "reasoning.effort")
    for name in ("summary", "generate_summary"):
        if entry.get(name) is not None:
            fail(f"reasoning.{name}", "not supported: the backends behind this gateway give no reasoning summaries")
    unknown = set(entry) - {"effort", "summary", "generate_summary"}
    if unknown:
        fail(f"reasoning.{sorted(unknown)[0]}", "unknown parameter")


def _prompt_cache_key(request: pb.CreateResponseRequest, value: object) -> None:
    request.prompt_cache_key = string(value, "prompt_cache_key")


def _presence_penalty(request: pb.CreateResponseRequest, value: object) -> None:
    request.presence_penalty = number(value, "presence_penalty")


def _frequency_penalty(request: pb.CreateResponseRequest, value: object) -> None:
    request.frequency_penalty = number(value, "frequency_penalty")


def _top_logprobs(request: pb.CreateResponseRequest, value: object) -> None:
    request.top_logprobs = integer(value, "top_logprobs")
    if request.top_logprobs > 0:
        request.output_logprobs = True  # alternatives are asked for with the tokens' own


# What `include` may ask that every response has already: reasoning items that can be sent back
# as they are (their text, not encrypted), and input images' URLs.
INCLUDED_ALWAYS = frozenset({"reasoning.encrypted_content", "message.input_image.image_url"})
LOGPROBS = "message.output_text.logprobs"


def _include(request: pb.CreateResponseRequest, value: object) -> None:
    for n, entry in enumerate(array(value, "include")):
        wanted = string(entry, f"include[{n}]")
        if wanted == LOGPROBS:
            request.output_logprobs = True
        elif wanted not in INCLUDED_ALWAYS:
            fail(f"include[{n}]", f"{wanted[:64]!r} is not supported: the gateway adds nothing more on request")


def _stream(request: pb.CreateResponseRequest, value: object) -> None:
    request.stream = boolean(value, "stream")


def _background(request: pb.CreateResponseRequest, value: object) -> None:
    request.background = boolean(value, "background")


_FIELDS: dict[str, Callable[[pb.CreateResponseRequest, object], None]] = {
    "input": _input,
    "instructions": _instructions,
    "previous_response_id": _previous,
    "conversation": _conversation,
    "tools": _tools,
    "tool_choice": _tool_choice,
    "metadata": _metadata,
    "temperature": _temperature,
    "top_p": _top_p,
    "parallel_tool_calls": _parallel,
    "max_output_tokens": _max_output_tokens,
    "max_tool_calls": _max_tool_calls,
    "store": _store,
    "truncation": _truncation,
    "text": _text,
    "reasoning": _reasoning_config,
    "prompt_cache_key": _prompt_cache_key,
    "presence_penalty": _presence_penalty,
    "frequency_penalty": _frequency_penalty,
    "top_logprobs": _top_logprobs,
    "include": _include,
    "stream": _stream,
    "background": _background,
}


def item_from_json(value: object, param: str) -> pb.Item:
    """One input item; `param` its path in the request (`input[3]`)."""
    entry = obj(value, param)
    kind = entry.get("type")
    if kind is None and "role" in entry:
        kind = "message"  # the spec's shorthand: {"role": …, "content": …}
    elif kind is None and "id" in entry:
        kind = "item_reference"  # the spec's ItemReferenceParam: its type may be left out
    reader = _ITEMS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        known = ", ".join(repr(k) for k in _ITEMS)
        fail(f"{param}.type", f"unknown item type {str(kind)[:64]!r}: one of {known}")
    item = pb.Item()
    item_id = entry.get("id")
    if item_id is not None:
        item.id = string(item_id, f"{param}.id")
    status = entry.get("status")
    if status is not None:
        item.status = one_of(status, f"{param}.status", ITEM_STATUSES)
    if kind == "item_reference":
        # The reference's id is the item it names, not an id of its own.
        item.Clear()
        item.item_reference.id = string(item_id, f"{param}.id")
        return item
    reader(item, entry, param)
    return item


def _message(item: pb.Item, entry: JSON, param: str) -> None:
    role = one_of(entry.get("role"), f"{param}.role", ROLES)
    item.message.role = role
    content = entry.get("content")
    if isinstance(content, str):
        part = pb.ContentPart()
        if role == pb.Role.ROLE_ASSISTANT:
            part.output_text.text = content
        else:
            part.input_text.text = content
        item.message.content.append(part)
        return
    parts = array(content, f"{param}.content")
    item.message.content.extend(part_from_json(p, f"{param}.content[{n}]") for n, p in enumerate(parts))


def part_from_json(value: object, param: str) -> pb.ContentPart:
    entry = obj(value, param)
    kind = entry.get("type")
    part = pb.ContentPart()
    if kind == "input_text":
        part.input_text.text = string(entry.get("text"), f"{param}.text")
    elif kind == "output_text":
        part.output_text.text = string(entry.get("text"), f"{param}.text")
    elif kind == "refusal":
        part.refusal.refusal = string(entry.get("refusal"), f"{param}.refusal")
    elif kind == "input_image":
        url = entry.get("image_url")
        if url is None:
            fail(f"{param}.image_url", "required: the gateway takes images by URL or data URL, not file_id")
        part.input_image.image_url = string(url, f"{param}.image_url")
        detail = entry.get("detail")
        if detail is not None:
            part.input_image.detail = one_of(detail, f"{param}.detail", DETAILS)
    elif kind == "input_file":
        _input_file(part, entry, param)
    elif kind in ("input_video", "input_audio"):
        fail(f"{param}.type", f"{kind!r} content is not supported: text, images and files only")
    else:
        fail(
            f"{param}.type",
            f"unknown content type {str(kind)[:64]!r}: input_text, input_image, input_file, output_text, refusal",
        )
    return part


def _input_file(part: pb.ContentPart, entry: JSON, param: str) -> None:
    """A file sent inline: `file_data` a base64 data URL (or bare base64) with its `filename`. The
    core reads it as text (responses/files.py)."""
    for by_reference in ("file_id", "file_url"):
        if entry.get(by_reference) is not None:
            fail(
                f"{param}.{by_reference}",
                "not supported: the gateway keeps no files; send the file inline as file_data "
                "(a base64 data URL) with its filename",
            )
    data = string(entry.get("file_data"), f"{param}.file_data")
    media_type = ""
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        if not head.endswith(";base64"):
            fail(f"{param}.file_data", "a data URL with base64 content: data:<media type>;base64,<data>")
        media_type = head[len("data:") : -len(";base64")]
    try:
        decoded = base64.b64decode(data, validate=True)
    except ValueError:
        fail(f"{param}.file_data", "not base64")
    file = part.input_file
    file.filename = string(entry.get("filename"), f"{param}.filename")
    file.file_data = decoded
    file.media_type = media_type


def _function_call(item: pb.Item, entry: JSON, param: str) -> None:
    call = item.function_call
    call.call_id = string(entry.get("call_id"), f"{param}.call_id")
    call.name = string(entry.get("name"), f"{param}.name")
    call.arguments = string(entry.get("arguments"), f"{param}.arguments")


def _function_call_output(item: pb.Item, entry: JSON, param: str) -> None:
    result = item.function_call_output
    result.call_id = string(entry.get("call_id"), f"{param}.call_id")
    output = entry.get("output")
    if isinstance(output, list):
        texts = []
        for n, part in enumerate(output):
            parsed = part_from_json(part, f"{param}.output[{n}]")
            if parsed.WhichOneof("part") != "input_text":
                fail(f"{param}.output[{n}].type", "only input_text parts are supported in a function_call_output")
            texts.append(parsed.input_text.text)
        result.output = "".join(texts)
    else:
        result.output = string(output, f"{param}.output")


def _reasoning(item: pb.Item, entry: JSON, param: str) -> None:
    reasoning = item.reasoning
    summary = entry.get("summary") or []
    reasoning.summary = "".join(
        string(obj(part, f"{param}.summary[{n}]").get("text"), f"{param}.summary[{n}].text")
        for n, part in enumerate(array(summary, f"{param}.summary"))
    )
    content = entry.get("content") or []
    reasoning.text = "".join(
        string(obj(part, f"{param}.content[{n}]").get("text"), f"{param}.content[{n}].text")
        for n, part in enumerate(array(content, f"{param}.content"))
    )
    encrypted = optional_string(entry, "encrypted_content", f"{param}.encrypted_content")
    if encrypted:
        reasoning.encrypted_content = encrypted


def _approval_request(item: pb.Item, entry: JSON, param: str) -> None:
    request = item.approval_request
    request.call_id = string(entry.get("id", item.id), f"{param}.id")
    request.name = string(entry.get("name"), f"{param}.name")
    request.arguments = string(entry.get("arguments", ""), f"{param}.arguments")
    request.server_label = optional_string(entry, "server_label", f"{param}.server_label") or ""


def _approval_response(item: pb.Item, entry: JSON, param: str) -> None:
    decision = item.approval_response
    decision.call_id = string(entry.get("approval_request_id"), f"{param}.approval_request_id")
    decision.approve = boolean(entry.get("approve"), f"{param}.approve")
    decision.reason = optional_string(entry, "reason", f"{param}.reason") or ""


# A compaction item's `encrypted_content`: the summary of the conversation it replaces. Not
# encrypted (the gateway keeps no key for it): opaque to a client, as the spec says, and no more
# than the text the client could send as a message itself.
COMPACTION_PREFIX = "antwort-summary-v1:"
SUMMARY_HEADING = "Summary of the conversation so far:\n"


def compaction_content(summary: str) -> str:
    return COMPACTION_PREFIX + base64.urlsafe_b64encode(summary.encode()).decode()


def _compaction(item: pb.Item, entry: JSON, param: str) -> None:
    """A compaction item in the input: the summary it holds, as a developer message."""
    content = string(entry.get("encrypted_content"), f"{param}.encrypted_content")
    try:
        if not content.startswith(COMPACTION_PREFIX):
            raise ValueError
        summary = base64.urlsafe_b64decode(content[len(COMPACTION_PREFIX) :].encode()).decode()
    except ValueError:
        fail(f"{param}.encrypted_content", "not a compaction this gateway made (POST /v1/responses/compact)")
    item.message.role = pb.Role.ROLE_DEVELOPER
    item.message.content.append(pb.ContentPart(input_text=pb.InputText(text=SUMMARY_HEADING + summary)))


_ITEMS: dict[str, Callable[[pb.Item, JSON, str], None]] = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _function_call_output,
    "reasoning": _reasoning,
    "mcp_approval_request": _approval_request,
    "mcp_approval_response": _approval_response,
    "compaction": _compaction,
    "item_reference": lambda item, entry, param: None,  # read by item_from_json itself
}


def tool_from_json(value: object, param: str) -> pb.Tool:
    entry = obj(value, param)
    kind = entry.get("type")
    tool = pb.Tool()
    if kind == "function":
        function = tool.function
        function.name = string(entry.get("name"), f"{param}.name")
        function.description = optional_string(entry, "description", f"{param}.description") or ""
        parameters = entry.get("parameters")
        if parameters is not None:
            function.parameters.update(obj(parameters, f"{param}.parameters"))
        strict = entry.get("strict")
        function.strict = bool(strict is not None and boolean(strict, f"{param}.strict"))
    elif kind == "mcp":
        tool.mcp.server_label = string(entry.get("server_label"), f"{param}.server_label")
        allowed = entry.get("allowed_tools")
        if isinstance(allowed, dict):
            allowed = allowed.get("tool_names") or []
        if allowed is not None:
            names = array(allowed, f"{param}.allowed_tools")
            tool.mcp.allowed_tools.extend(string(n, f"{param}.allowed_tools[{i}]") for i, n in enumerate(names))
    elif kind == "code_interpreter":
        tool.code_interpreter.SetInParent()
    else:
        fail(f"{param}.type", f"unknown tool type {str(kind)[:64]!r}: function, mcp, code_interpreter")
    approval = entry.get("require_approval")
    if approval is not None:
        tool.require_approval.CopyFrom(_require_approval(approval, f"{param}.require_approval"))
    return tool


def _require_approval(value: object, param: str) -> pb.RequireApproval:
    if isinstance(value, str):
        return pb.RequireApproval(mode=one_of(value, param, APPROVALS))
    entry = obj(value, param)
    always = entry.get("always")
    if always is None:
        # {"never": {...}}: the spec's way to name the tools that need none; the rest then need one.
        return pb.RequireApproval(mode=pb.ApprovalMode.APPROVAL_MODE_NEVER)
    names = array(obj(always, f"{param}.always").get("tool_names", []), f"{param}.always.tool_names")
    return pb.RequireApproval(tool_names=[string(n, f"{param}.always.tool_names") for n in names])


def tool_choice_from_json(value: object, param: str) -> pb.ToolChoice:
    if isinstance(value, str):
        return pb.ToolChoice(mode=one_of(value, param, MODES))
    entry = obj(value, param)
    kind = entry.get("type")
    if kind == "function":
        return pb.ToolChoice(function=pb.NamedToolChoice(name=string(entry.get("name"), f"{param}.name")))
    if kind == "allowed_tools":
        mode = one_of(entry.get("mode", "auto"), f"{param}.mode", MODES)
        names = []
        for n, tool in enumerate(array(entry.get("tools"), f"{param}.tools")):
            named = obj(tool, f"{param}.tools[{n}]")
            names.append(string(named.get("name"), f"{param}.tools[{n}].name"))
        return pb.ToolChoice(allowed_tools=pb.AllowedTools(mode=mode, tool_names=names))
    raise bad(f"{param}.type", f"unknown tool_choice type {str(kind)[:64]!r}: function, allowed_tools")


# --------------------------------------------------------------------------------------- out


def part_json(part: pb.ContentPart) -> JSON:
    kind = part.WhichOneof("part")
    if kind == "output_text":
        text = part.output_text
        return {"type": "output_text", "text": text.text, "annotations": [], "logprobs": logprobs_json(text.logprobs)}
    if kind == "input_text":
        return {"type": "input_text", "text": part.input_text.text}
    if kind == "refusal":
        return {"type": "refusal", "refusal": part.refusal.refusal}
    if kind == "input_image":
        image = part.input_image
        return {"type": "input_image", "image_url": image.image_url, "detail": DETAIL_NAMES.get(image.detail, "auto")}
    return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}


def logprobs_json(logprobs: Any) -> list[JSON]:
    """Tokens' log probabilities as the spec's LogProb objects."""
    return [
        {
            "token": entry.token,
            "logprob": entry.logprob,
            "bytes": list(entry.bytes),
            "top_logprobs": [
                {"token": top.token, "logprob": top.logprob, "bytes": list(top.bytes)} for top in entry.top_logprobs
            ],
        }
        for entry in logprobs
    ]


def item_json(item: pb.Item) -> JSON:
    """An item as the spec's ItemField (OpenAI's shape for approvals, which the spec lacks)."""
    kind = item.WhichOneof("kind")
    status = ITEM_STATUS_NAMES.get(item.status, "completed")
    if kind == "message":
        message = item.message
        return {
            "type": "message",
            "id": item.id,
            "status": status,
            "role": ROLE_NAMES.get(message.role, "assistant"),
            "content": [part_json(p) for p in message.content],
        }
    if kind == "function_call":
        call = item.function_call
        return {
            "type": "function_call",
            "id": item.id,
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
            "status": status,
        }
    if kind == "function_call_output":
        result = item.function_call_output
        return {
            "type": "function_call_output",
            "id": item.id,
            "call_id": result.call_id,
            "output": result.output,
            "status": status,
        }
    if kind == "reasoning":
        reasoning = item.reasoning
        body: JSON = {
            "type": "reasoning",
            "id": item.id,
            "summary": [{"type": "summary_text", "text": reasoning.summary}] if reasoning.summary else [],
            "content": [{"type": "reasoning_text", "text": reasoning.text}] if reasoning.text else [],
            "status": status,
        }
        if reasoning.encrypted_content:
            body["encrypted_content"] = reasoning.encrypted_content
        return body
    if kind == "approval_request":
        request = item.approval_request
        return {
            "type": "mcp_approval_request",
            "id": request.call_id,
            "server_label": request.server_label,
            "name": request.name,
            "arguments": request.arguments,
            "status": status,
        }
    decision = item.approval_response
    return {
        "type": "mcp_approval_response",
        "id": item.id,
        "approval_request_id": decision.call_id,
        "approve": decision.approve,
        "reason": decision.reason or None,
        "status": status,
    }


def tool_json(tool: pb.Tool, raw: bool = False) -> JSON:
    """A tool as the spec's; `raw`: its schema as RawJSON (for `dumps`), not converted again."""
    kind = tool.WhichOneof("kind")
    body: JSON
    if kind == "function":
        function = tool.function
        parameters: Any = None
        if function.HasField("parameters"):
            parameters = RawJSON(struct_json(function.parameters)) if raw else MessageToDict(function.parameters)
        body = {
            "type": "function",
            "name": function.name,
            "description": function.description or None,
            "parameters": parameters,
            "strict": function.strict,
        }
    elif kind == "mcp":
        body = {"type": "mcp", "server_label": tool.mcp.server_label, "allowed_tools": list(tool.mcp.allowed_tools)}
    else:
        body = {"type": "code_interpreter", "container": {"type": "auto"}}
    if tool.HasField("require_approval"):
        approval = tool.require_approval
        if approval.tool_names:
            body["require_approval"] = {"always": {"tool_names": list(approval.tool_names)}}
        elif approval.mode == pb.ApprovalMode.APPROVAL_MODE_ALWAYS:
            body["require_approval"] = "always"
        elif approval.mode == pb.ApprovalMode.APPROVAL_MODE_NEVER:
            body["require_approval"] = "never"
    return body


# The echoed tools of the responses rendered lately, by response id: a response's tools never
# change (a continuation is another response), and its lifecycle events and reads each carry them.
_ECHOED: OrderedDict[str, list[JSON]] = OrderedDict()
_ECHOED_LOCK = threading.Lock()
ECHOED_KEPT = 256
# Past this many tools a Response's are first rendered in the worker thread: finding each
# schema's kept JSON digests its deterministic serialization, 1-3 ms a schema; for 128 schemas
# that held the event loop 270-430 ms on a busy host.
RENDER_OFF_LOOP_TOOLS = 8
# The events that carry the whole Response.
# The events that carry the Response (and its tools).
LIFECYCLE = TERMINAL_EVENTS | {"created", "in_progress", "queued"}


async def echoed_tools_ready(response: pb.Response) -> None:
    """The tools of a Response (of a lifecycle event) rendered (`echoed_tools_json`) in the
    worker thread when there are many and they were not yet, so rendering the event does not."""
    if len(response.tools) > RENDER_OFF_LOOP_TOOLS and response.id not in _ECHOED:
        await off_loop(echoed_tools_json, response)


def echoed_tools_json(response: pb.Response) -> list[JSON]:
    """A Response's tools as the spec's, their schemas as RawJSON: the JSON text their check kept,
    not converted from the Struct again (that held the event loop 100 ms and more for 1 MiB of
    tools, for each of a response's lifecycle events), and rendered once per response."""
    tools = response.tools
    if not tools:
        return []
    key = response.id
    rendered = _ECHOED.get(key) if key else None
    if rendered is None or len(rendered) != len(tools):
        rendered = [tool_json(tool, raw=True) for tool in tools]
        if key:
            with _ECHOED_LOCK:
                _ECHOED[key] = rendered
                if len(_ECHOED) > ECHOED_KEPT:
                    _ECHOED.popitem(last=False)
    return rendered


def tool_choice_json(choice: pb.ToolChoice) -> Any:
    kind = choice.WhichOneof("choice")
    if kind == "function":
        return {"type": "function", "name": choice.function.name}
    if kind == "allowed_tools":
        allowed = choice.allowed_tools
        return {
            "type": "allowed_tools",
            "mode": MODE_NAMES.get(allowed.mode, "auto"),
            "tools": [{"type": "function", "name": name} for name in allowed.tool_names],
        }
    if kind == "mode":
        return MODE_NAMES.get(choice.mode, "auto")
    return "auto"


def usage_json(usage: pb.Usage) -> JSON:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def accepted_json(accepted: pb.ControlAccepted) -> JSON:
    """A control's acknowledgement (our extension, docs/http.md): the response's id and status, and
    the sequence number of its last event when the control was accepted."""
    return {
        "id": accepted.response_id,
        "object": "response.control",
        "status": STATUS_NAMES.get(accepted.status, "in_progress"),
        "sequence_number": accepted.sequence_number,
    }


def _ending_json(response: pb.Response) -> JSON:
    """How a response ended, as the spec's fields (all null while it runs)."""
    finished = response.HasField("completed_at") and response.status not in (
        S.RESPONSE_STATUS_QUEUED,
        S.RESPONSE_STATUS_IN_PROGRESS,
    )
    error = response.error if response.HasField("error") and response.error.code else None
    return {
        "completed_at": response.completed_at.seconds if finished else None,
        "incomplete_details": (
            {"reason": response.incomplete_details.reason} if response.HasField("incomplete_details") else None
        ),
        "error": {"code": error.code, "message": error.message} if error is not None else None,
    }


def response_json(response: pb.Response, background: bool = False) -> JSON:
    """A Response as the spec's ResponseResource (`background`: it was created in background)."""
    return {
        "id": response.id,
        "object": "response",
        "created_at": response.created_at.seconds,
        "status": STATUS_NAMES.get(response.status, "in_progress"),
        **_ending_json(response),
        "model": response.model,
        "previous_response_id": response.previous_response_id or None,
        "conversation": {"id": response.conversation_id} if response.conversation_id else None,
        "instructions": response.instructions or None,
        "output": [item_json(item) for item in response.output],
        "tools": echoed_tools_json(response),
        "tool_choice": tool_choice_json(response.tool_choice),
        "truncation": "auto" if response.truncation == pb.Truncation.TRUNCATION_AUTO else "disabled",
        "parallel_tool_calls": response.parallel_tool_calls,
        "text": text_json(response.text) if response.HasField("text") else PLAIN_TEXT,
        "top_p": response.top_p if response.HasField("top_p") else 1.0,
        **_passed_through_json(response),
        "temperature": response.temperature if response.HasField("temperature") else 1.0,
        "usage": usage_json(response.usage) if response.HasField("usage") else None,
        "max_output_tokens": response.max_output_tokens if response.HasField("max_output_tokens") else None,
        "store": response.store,
        "background": background,
        "service_tier": "default",
        "metadata": dict(response.metadata),
        "safety_identifier": None,
    }


def _passed_through_json(response: pb.Response) -> JSON:
    """The settings passed to the backend as they are, and the tool-call limit, echoed."""
    return {
        "presence_penalty": response.presence_penalty if response.HasField("presence_penalty") else 0.0,
        "frequency_penalty": response.frequency_penalty if response.HasField("frequency_penalty") else 0.0,
        "top_logprobs": response.top_logprobs if response.HasField("top_logprobs") else 0,
        "reasoning": {"effort": response.reasoning.effort, "summary": None} if response.reasoning.effort else None,
        "max_tool_calls": response.max_tool_calls if response.HasField("max_tool_calls") else None,
        "prompt_cache_key": response.prompt_cache_key or None,
    }


PLAIN_TEXT: JSON = {"format": {"type": "text"}}


def text_json(text: pb.TextConfig) -> JSON:
    """The echoed text format. A json_schema's `schema` is null, as the spec's
    JsonSchemaResponseFormat has it (the format is echoed whole over gRPC)."""
    kind = text.format.WhichOneof("kind")
    if kind == "json_object":
        return {"format": {"type": "json_object"}}
    if kind == "json_schema":
        wanted = text.format.json_schema
        return {
            "format": {
                "type": "json_schema",
                "name": wanted.name,
                "description": wanted.description or None,
                "schema": None,
                "strict": wanted.strict,
            }
        }
    return {"format": {"type": "text"}}


def input_items_json(page: pb.ListInputItemsResponse) -> JSON:
    return {
        "object": "list",
        "data": [item_json(item) for item in page.items],
        "first_id": page.first_id or None,
        "last_id": page.last_id or None,
        "has_more": page.has_more,
    }


# ------------------------------------------------------------------------------------ events


def _lifecycle(name: str) -> Callable[[Any], JSON]:
    def render(payload: Any) -> JSON:
        return {"type": name, "response": response_json(payload.response)}

    return render


def _item_event(name: str) -> Callable[[Any], JSON]:
    def render(payload: Any) -> JSON:
        return {"type": name, "output_index": payload.output_index, "item": item_json(payload.item)}

    return render


def _part_event(name: str) -> Callable[[Any], JSON]:
    def render(payload: Any) -> JSON:
        return {
            "type": name,
            "item_id": payload.item_id,
            "output_index": payload.output_index,
            "content_index": payload.content_index,
            "part": part_json(payload.part),
        }

    return render


def _text_event(name: str, field: str, logprobs: bool = False, content_index: bool = True) -> Callable[[Any], JSON]:
    def render(payload: Any) -> JSON:
        body: JSON = {"type": name, "item_id": payload.item_id, "output_index": payload.output_index}
        if content_index:
            body["content_index"] = getattr(payload, "content_index", 0)
        key = "delta" if field == "delta" else field
        body[key] = getattr(payload, field)
        if logprobs:
            # Only a delta carries them (the done event none), and most deltas none: an empty list
            # without a call per event.
            probs = payload.logprobs if field == "delta" else None
            body["logprobs"] = logprobs_json(probs) if probs else []
        return body

    return render


def _reasoning_event(name: str, field: str) -> Callable[[Any], JSON]:
    def render(payload: Any) -> JSON:
        return {
            "type": name,
            "item_id": payload.item_id,
            "output_index": payload.output_index,
            "content_index": 0,
            field: getattr(payload, field),
        }

    return render


# The spec's events, by the name of the StreamEvent oneof case they come from.
SPEC_EVENTS: dict[str, Callable[[Any], JSON]] = {
    "created": _lifecycle("response.created"),
    "in_progress": _lifecycle("response.in_progress"),
    "completed": _lifecycle("response.completed"),
    "requires_action": _lifecycle("response.completed"),
    "incomplete": _lifecycle("response.incomplete"),
    "failed": _lifecycle("response.failed"),
    # The spec has no cancelled event: the response ended before it was done (status cancelled).
    "cancelled": _lifecycle("response.incomplete"),
    "output_item_added": _item_event("response.output_item.added"),
    "output_item_done": _item_event("response.output_item.done"),
    "content_part_added": _part_event("response.content_part.added"),
    "content_part_done": _part_event("response.content_part.done"),
    "output_text_delta": _text_event("response.output_text.delta", "delta", logprobs=True),
    "output_text_done": _text_event("response.output_text.done", "text", logprobs=True),
    "refusal_delta": _text_event("response.refusal.delta", "delta"),
    "refusal_done": _text_event("response.refusal.done", "refusal"),
    "function_call_arguments_delta": _text_event(
        "response.function_call_arguments.delta", "delta", content_index=False
    ),
    "function_call_arguments_done": _text_event(
        "response.function_call_arguments.done", "arguments", content_index=False
    ),
    "reasoning_text_delta": _reasoning_event("response.reasoning.delta", "delta"),
    "reasoning_text_done": _reasoning_event("response.reasoning.done", "text"),
}
# Our events beyond the spec are sent as `antwort:<case>` (the spec: extension event types are
# prefixed with the implementor's slug and a colon) to a client that asks for them.
EXTENSION_PREFIX = "antwort:"


def event_json(
    event: pb.StreamEvent, extended: bool = False, background: bool = False, kind: str | None = None
) -> JSON | None:
    """A stream event as the spec's event object, numbered as the core numbered it; None for an
    event of ours the client did not ask for (see event_body)."""
    body = event_body(event, extended, background, kind)
    if body is not None:
        body["sequence_number"] = event.sequence_number
    return body


def event_body(
    event: pb.StreamEvent, extended: bool = False, background: bool = False, kind: str | None = None
) -> JSON | None:
    """A stream event as the spec's event object without its `sequence_number` (a sink numbers
    the events it sends); None for an event of ours the client did not ask for (`extended`: every
    event, ours as `antwort:<name>` with the payload's protobuf JSON; `background`: the response
    in it was created in background; `kind`: the event's case, when the caller has read it)."""
    if kind is None:
        kind = event.WhichOneof("event")
    if kind is None:
        return None
    render = SPEC_EVENTS.get(kind)
    if render is not None:
        body = render(getattr(event, kind))
    elif extended:
        body = {"type": EXTENSION_PREFIX + kind, **_extension_payload(getattr(event, kind))}
    else:
        return None
    if background and "response" in body:
        body["response"]["background"] = True
    return body


def _extension_payload(payload: Any) -> JSON:
    data: JSON = MessageToDict(payload, preserving_proto_field_name=True)
    # Items inside our events are shown in the spec's shape, as everywhere else on this door.
    if "items" in data:
        data["items"] = [item_json(item) for item in payload.items]
    return data


def sse(body: JSON) -> bytes:
    """One server-sent event: its type as the event name, its JSON as the data."""
    name: str = body["type"]
    return b"event: " + name.encode() + b"\ndata: " + encode(body) + b"\n\n"


# JSON text that `encode` puts into a document as it is: a tool's schema, whose text the
# request's check keeps (structs.struct_json).
RawJSON = msgspec.Raw
# Compact JSON, UTF-8, in C: a sixth of the json module's instructions for a Response.
_ENCODER = msgspec.json.Encoder()


def encode(value: Any) -> bytes:
    """`value` (dicts, lists, strings, numbers, RawJSON) as compact JSON, UTF-8 encoded."""
    try:
        return _ENCODER.encode(value)
    except UnicodeEncodeError:
        # A lone surrogate (none comes from protobuf, whose strings are UTF-8): escaped, as JSON
        # can say it, instead of failing the answer.
        return json.dumps(value, separators=(",", ":"), default=_raw_value).encode()


def _raw_value(part: object) -> Any:
    if not isinstance(part, RawJSON):
        raise TypeError(f"Object of type {type(part).__name__} is not JSON serializable")
    return json.loads(bytes(part))


def dumps(value: Any) -> str:
    """`value` as compact JSON text (`encode`, decoded)."""
    return encode(value).decode()
