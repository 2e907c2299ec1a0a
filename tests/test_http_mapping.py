"""The one JSON <-> protobuf mapping of the HTTP door, both ways, with generated values: protobuf to
the spec's JSON and back gives the same message; the spec's JSON to protobuf and back to protobuf
is stable; everything sent out is valid against the spec's schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.errors import RequestError
from antwort_grpc.http.errors import param_of
from antwort_grpc.http.mapping import (
    RawJSON,
    create_request,
    encode,
    event_json,
    item_from_json,
    item_json,
    response_json,
    tool_choice_from_json,
    tool_choice_json,
    tool_from_json,
    tool_json,
)
from tests.http_harness import assert_event_schema, assert_schema

text = st.text(max_size=40)
ident = st.from_regex(r"[a-z]{2,4}_[0-9a-f]{8}", fullmatch=True)
name = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,20}", fullmatch=True)
status = st.sampled_from(
    [pb.ItemStatus.ITEM_STATUS_COMPLETED, pb.ItemStatus.ITEM_STATUS_IN_PROGRESS, pb.ItemStatus.ITEM_STATUS_INCOMPLETE]
)
detail = st.sampled_from(
    [pb.ImageDetail.IMAGE_DETAIL_AUTO, pb.ImageDetail.IMAGE_DETAIL_LOW, pb.ImageDetail.IMAGE_DETAIL_HIGH]
)
role = st.sampled_from([pb.Role.ROLE_USER, pb.Role.ROLE_SYSTEM, pb.Role.ROLE_DEVELOPER, pb.Role.ROLE_ASSISTANT])

parts = st.one_of(
    text.map(lambda t: pb.ContentPart(input_text=pb.InputText(text=t))),
    text.map(lambda t: pb.ContentPart(output_text=pb.OutputText(text=t))),
    text.map(lambda t: pb.ContentPart(refusal=pb.Refusal(refusal=t))),
    st.builds(lambda u, d: pb.ContentPart(input_image=pb.InputImage(image_url=u, detail=d)), text, detail),
)
kinds = st.one_of(
    st.builds(lambda r, c: {"message": pb.Message(role=r, content=c)}, role, st.lists(parts, max_size=3)),
    st.builds(lambda c, n, a: {"function_call": pb.FunctionCall(call_id=c, name=n, arguments=a)}, ident, name, text),
    st.builds(lambda c, o: {"function_call_output": pb.FunctionCallOutput(call_id=c, output=o)}, ident, text),
    st.builds(lambda t, s, e: {"reasoning": pb.Reasoning(text=t, summary=s, encrypted_content=e)}, text, text, text),
    st.builds(
        lambda c, a, r: {"approval_response": pb.ApprovalResponse(call_id=c, approve=a, reason=r)},
        ident,
        st.booleans(),
        text,
    ),
)
items = st.builds(lambda i, s, k: pb.Item(id=i, status=s, **k), ident, status, kinds)

json_schema_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False, width=32) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(name, inner, max_size=3),
    max_leaves=8,
)
approval = st.one_of(
    st.none(),
    st.sampled_from([pb.ApprovalMode.APPROVAL_MODE_ALWAYS, pb.ApprovalMode.APPROVAL_MODE_NEVER]).map(
        lambda m: pb.RequireApproval(mode=m)
    ),
    st.lists(name, min_size=1, max_size=3).map(lambda n: pb.RequireApproval(tool_names=n)),
)


def _function_tool(n: str, d: str, p: dict[str, Any] | None, s: bool) -> pb.Tool:
    tool = pb.Tool(function=pb.FunctionTool(name=n, description=d, strict=s))
    if p is not None:
        tool.function.parameters.update(p)
    return tool


def _with_approval(tool: pb.Tool, require: pb.RequireApproval | None) -> pb.Tool:
    if require is not None:
        tool.require_approval.CopyFrom(require)
    return tool


tools = st.builds(
    _with_approval,
    st.one_of(
        st.builds(
            _function_tool,
            name,
            text,
            st.none() | st.dictionaries(name, json_schema_values, max_size=3),
            st.booleans(),
        ),
        st.builds(
            lambda s, a: pb.Tool(mcp=pb.McpTool(server_label=s, allowed_tools=a)), name, st.lists(name, max_size=3)
        ),
        st.just(pb.Tool(code_interpreter=pb.CodeInterpreterTool())),
    ),
    approval,
)
modes = st.sampled_from(
    [
        pb.ToolChoiceMode.TOOL_CHOICE_MODE_AUTO,
        pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED,
        pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE,
    ]
)
choices = st.one_of(
    modes.map(lambda m: pb.ToolChoice(mode=m)),
    name.map(lambda n: pb.ToolChoice(function=pb.NamedToolChoice(name=n))),
    st.builds(
        lambda m, n: pb.ToolChoice(allowed_tools=pb.AllowedTools(mode=m, tool_names=n)),
        st.sampled_from([pb.ToolChoiceMode.TOOL_CHOICE_MODE_AUTO, pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED]),
        st.lists(name, max_size=3),
    ),
)
SPEC_ITEMS = {"message", "function_call", "function_call_output", "reasoning"}


@given(items)
def test_an_item_goes_to_the_specs_json_and_back_unchanged(item: pb.Item) -> None:
    body = item_json(item)
    if item.WhichOneof("kind") in SPEC_ITEMS:
        assert_schema(body, "ItemField")
    assert item_from_json(body, "input[0]") == item


@given(tools)
def test_a_tool_goes_to_the_specs_json_and_back_unchanged(tool: pb.Tool) -> None:
    body = tool_json(tool)
    if tool.WhichOneof("kind") == "function" and not tool.HasField("require_approval"):
        assert_schema(body, "FunctionTool")
    assert tool_from_json(body, "tools[0]") == tool


@given(choices)
def test_a_tool_choice_goes_to_the_specs_json_and_back_unchanged(choice: pb.ToolChoice) -> None:
    assert tool_choice_from_json(tool_choice_json(choice), "tool_choice") == choice


# The spec's input items, as a client writes them.
json_parts = st.one_of(
    st.builds(lambda t: {"type": "input_text", "text": t}, text),
    st.builds(
        lambda u, d: {"type": "input_image", "image_url": u, "detail": d},
        text,
        st.sampled_from(["auto", "low", "high"]),
    ),
)
json_items = st.one_of(
    st.builds(
        lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "system", "developer", "assistant"]), text
    ),
    st.builds(lambda c: {"type": "message", "role": "user", "content": c}, st.lists(json_parts, max_size=3)),
    st.builds(
        lambda c: {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": c}]}, text
    ),
    st.builds(lambda c, n, a: {"type": "function_call", "call_id": c, "name": n, "arguments": a}, ident, name, text),
    st.builds(lambda c, o: {"type": "function_call_output", "call_id": c, "output": o}, ident, text),
    st.builds(
        lambda c, o: {"type": "function_call_output", "call_id": c, "output": [{"type": "input_text", "text": o}]},
        ident,
        text,
    ),
    st.builds(lambda s: {"type": "reasoning", "summary": [{"type": "summary_text", "text": s}]}, text),
)


@given(st.lists(json_items, max_size=4), st.none() | choices.map(tool_choice_json), st.lists(tools, max_size=2))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_a_request_in_the_specs_json_maps_to_protobuf_and_back_stably(
    inputs: list[dict[str, Any]], choice: Any, offered: list[pb.Tool]
) -> None:
    body: dict[str, Any] = {"model": "m", "input": inputs, "tools": [tool_json(t) for t in offered]}
    if choice is not None:
        body["tool_choice"] = choice
    request = create_request(body)
    for item in request.input_items.items:
        if not item.status:
            item.status = pb.ItemStatus.ITEM_STATUS_COMPLETED  # as the engine takes an item without one
    assert [item_json(i)["type"] for i in request.input_items.items] == [i.get("type", "message") for i in inputs]
    again = create_request(
        {
            "model": "m",
            "input": [item_json(i) for i in request.input_items.items],
            "tools": [tool_json(t) for t in request.tools],
            **({"tool_choice": tool_choice_json(request.tool_choice)} if choice is not None else {}),
        }
    )
    assert again == request


def test_a_string_input_is_the_shorthand_for_one_user_message() -> None:
    assert create_request({"model": "m", "input": "hi"}).input_text == "hi"


def test_stream_and_background_are_read_as_any_parameter() -> None:
    request = create_request({"model": "m", "input": "hi", "stream": True, "background": False})
    assert request.stream and not request.background
    assert not create_request({"model": "m", "stream": None}).stream  # null: as if absent
    with pytest.raises(RequestError) as refused:
        create_request({"model": "m", "stream": "yes"})
    assert param_of(refused.value.violations[0].field) == "stream"


scalars = st.one_of(text, st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False))


@given(st.dictionaries(text, scalars, max_size=5))
def test_a_document_is_encoded_as_the_json_it_holds(values: dict[str, Any]) -> None:
    schema = '{"type": "object", "properties": {"ü": {"type": "string"}}}'
    document = {"values": values, "schema": RawJSON(schema), "text": "naïve \u2028 ok"}
    assert json.loads(encode(document)) == {"values": values, "schema": json.loads(schema), "text": "naïve \u2028 ok"}


def test_a_lone_surrogate_is_escaped_not_a_failure() -> None:
    document = {"text": "a\ud800b", "schema": RawJSON('{"x": 1}')}
    assert json.loads(encode(document)) == {"text": "a\ud800b", "schema": {"x": 1}}


def _response(status: int, output: list[pb.Item]) -> pb.Response:
    response = pb.Response(id="resp_1", model="m", status=status, output=output, store=True)  # type: ignore[arg-type]
    response.created_at.seconds = 1_800_000_000
    response.completed_at.seconds = 1_800_000_001
    response.usage.CopyFrom(pb.Usage(input_tokens=3, output_tokens=4, total_tokens=7))
    return response


@given(st.sampled_from(list(pb.ResponseStatus.values())[1:]), st.lists(items, max_size=3))
def test_every_response_is_a_valid_response_resource(status: int, output: list[pb.Item]) -> None:
    spec_items = [i for i in output if i.WhichOneof("kind") in SPEC_ITEMS]
    body = response_json(_response(status, spec_items))
    assert_schema(body)
    assert body["status"] in {"queued", "in_progress", "completed", "incomplete", "failed", "cancelled"}


def test_a_response_that_waits_for_the_clients_calls_is_completed_as_in_the_spec() -> None:
    body = response_json(_response(pb.ResponseStatus.RESPONSE_STATUS_REQUIRES_ACTION, []))
    assert body["status"] == "completed"


def test_every_event_of_the_spec_is_valid_and_ours_are_left_out_unless_asked() -> None:
    message = pb.Item(
        id="msg_1", status=pb.ItemStatus.ITEM_STATUS_COMPLETED, message=pb.Message(role=pb.Role.ROLE_ASSISTANT)
    )
    part = pb.ContentPart(output_text=pb.OutputText(text="hi"))
    response = _response(pb.ResponseStatus.RESPONSE_STATUS_COMPLETED, [])
    events = [
        pb.StreamEvent(created=pb.ResponseCreatedEvent(response=response)),
        pb.StreamEvent(output_item_added=pb.OutputItemAddedEvent(output_index=0, item=message)),
        pb.StreamEvent(content_part_added=pb.ContentPartAddedEvent(item_id="msg_1", part=part)),
        pb.StreamEvent(output_text_delta=pb.OutputTextDeltaEvent(item_id="msg_1", delta="h")),
        pb.StreamEvent(output_text_done=pb.OutputTextDoneEvent(item_id="msg_1", text="hi")),
        pb.StreamEvent(refusal_delta=pb.RefusalDeltaEvent(item_id="msg_1", delta="n")),
        pb.StreamEvent(refusal_done=pb.RefusalDoneEvent(item_id="msg_1", refusal="no")),
        pb.StreamEvent(function_call_arguments_delta=pb.FunctionCallArgumentsDeltaEvent(item_id="fc_1", delta="{")),
        pb.StreamEvent(function_call_arguments_done=pb.FunctionCallArgumentsDoneEvent(item_id="fc_1", arguments="{}")),
        pb.StreamEvent(reasoning_text_delta=pb.ReasoningTextDeltaEvent(item_id="rs_1", delta="h")),
        pb.StreamEvent(reasoning_text_done=pb.ReasoningTextDoneEvent(item_id="rs_1", text="hm")),
        pb.StreamEvent(content_part_done=pb.ContentPartDoneEvent(item_id="msg_1", part=part)),
        pb.StreamEvent(output_item_done=pb.OutputItemDoneEvent(output_index=0, item=message)),
        pb.StreamEvent(requires_action=pb.ResponseRequiresActionEvent(response=response)),
        pb.StreamEvent(cancelled=pb.ResponseCancelledEvent(response=response)),
        pb.StreamEvent(failed=pb.ResponseFailedEvent(response=response)),
        pb.StreamEvent(incomplete=pb.ResponseIncompleteEvent(response=response)),
    ]
    for number, event in enumerate(events, 1):
        event.sequence_number = number
        body = event_json(event)
        assert body is not None and body["sequence_number"] == number
        assert_event_schema(body)
    ours = pb.StreamEvent(sequence_number=9, turn_started=pb.TurnStartedEvent(turn=1))
    assert event_json(ours) is None
    assert event_json(ours, extended=True) == {"type": "antwort:turn_started", "turn": 1, "sequence_number": 9}


def test_a_core_field_path_is_named_as_the_json_parameter() -> None:
    assert param_of("input_items.items[2].message.content[1].input_image.image_url") == "input[2].content[1].image_url"
    assert param_of("tools[3].function.parameters") == "tools[3].parameters"
    assert param_of("tool_choice.allowed_tools.tool_names[0]") == "tool_choice.tools[0]"
    assert param_of("limits.max_tool_calls") == "max_tool_calls"
