"""Bad input gets INVALID_ARGUMENT with google.rpc.BadRequest field violations; the read RPCs
answer NOT_FOUND for what does not exist."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.responses.validation import validate_create
from tests.harness import GatewayClient, function_tool, running_gateway, user


def violations_of(err: grpc.aio.AioRpcError) -> dict[str, str]:
    status = rpc_status.from_call(err)
    assert status is not None, "the error carries google.rpc.Status details"
    found: dict[str, str] = {}
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            found.update({v.field: v.description for v in bad.field_violations})
    return found


async def rejected(gw: GatewayClient, request: pb.CreateResponseRequest) -> dict[str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.create(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return violations_of(info.value)


def bad_schema_tool() -> pb.Tool:
    tool = function_tool("broken")
    tool.function.parameters.update({"type": "object", "properties": {"x": {"type": "no-such-type"}}})
    return tool


CASES = {
    "empty input": (pb.CreateResponseRequest(), "input"),
    "blank text": (pb.CreateResponseRequest(input_text="   "), "input_text"),
    "item without kind": (pb.CreateResponseRequest(input_items=pb.ItemList(items=[pb.Item()])), "input_items.items[0]"),
    "message without role": (
        pb.CreateResponseRequest(
            input_items=pb.ItemList(
                items=[pb.Item(message=pb.Message(content=[pb.ContentPart(input_text=pb.InputText(text="x"))]))]
            )
        ),
        "input_items.items[0].message.role",
    ),
    "output without call id": (
        pb.CreateResponseRequest(
            input_items=pb.ItemList(items=[pb.Item(function_call_output=pb.FunctionCallOutput(output="x"))])
        ),
        "input_items.items[0].function_call_output.call_id",
    ),
    "duplicate tool names": (
        pb.CreateResponseRequest(input_text="hi", tools=[function_tool("a"), function_tool("a")]),
        "tools[1].function.name",
    ),
    "bad tool name": (
        pb.CreateResponseRequest(input_text="hi", tools=[function_tool("has space")]),
        "tools[0].function.name",
    ),
    "malformed JSON schema": (
        pb.CreateResponseRequest(input_text="hi", tools=[bad_schema_tool()]),
        "tools[0].function.parameters",
    ),
    "forced tool not in tools": (
        pb.CreateResponseRequest(
            input_text="hi",
            tools=[function_tool("a")],
            tool_choice=pb.ToolChoice(function=pb.NamedToolChoice(name="b")),
        ),
        "tool_choice.function.name",
    ),
    "allowed tool not in tools": (
        pb.CreateResponseRequest(
            input_text="hi",
            tools=[function_tool("a")],
            tool_choice=pb.ToolChoice(allowed_tools=pb.AllowedTools(tool_names=["a", "zzz"])),
        ),
        "tool_choice.allowed_tools.tool_names[1]",
    ),
    "required without tools": (
        pb.CreateResponseRequest(
            input_text="hi", tool_choice=pb.ToolChoice(mode=pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED)
        ),
        "tool_choice.mode",
    ),
    "temperature out of range": (pb.CreateResponseRequest(input_text="hi", temperature=3.5), "temperature"),
    "top_p out of range": (pb.CreateResponseRequest(input_text="hi", top_p=1.5), "top_p"),
    "max_output_tokens zero": (pb.CreateResponseRequest(input_text="hi", max_output_tokens=0), "max_output_tokens"),
    "mcp tool without label": (
        pb.CreateResponseRequest(input_text="hi", tools=[pb.Tool(mcp=pb.McpTool())]),
        "tools[0].mcp.server_label",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_request_is_invalid_argument_with_field_violations(case: str) -> None:
    request, field = CASES[case]
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        found = await rejected(gw, request)
    assert field in found, f"{case}: {found}"


async def test_every_violation_is_reported_at_once() -> None:
    request = pb.CreateResponseRequest(temperature=9, top_p=9, tools=[function_tool("a"), function_tool("a")])
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        found = await rejected(gw, request)
    assert {"input", "temperature", "top_p", "tools[1].function.name"} <= set(found)


async def test_hosted_tool_without_an_executor_is_failed_precondition() -> None:
    request = user("hi")
    request.tools.append(pb.Tool(mcp=pb.McpTool(server_label="github")))
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(request)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "github" in (info.value.details() or "")


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(max_size=20),
    names=st.lists(st.text(max_size=8), max_size=4),
    temperature=st.one_of(st.none(), st.floats(allow_nan=False, min_value=-5, max_value=5)),
)
def test_validation_never_crashes_and_accepts_only_sound_requests(
    text: str, names: list[str], temperature: float | None
) -> None:
    request = pb.CreateResponseRequest(input_text=text)
    for name in names:
        request.tools.append(function_tool(name) if name else pb.Tool())
    if temperature is not None:
        request.temperature = temperature
    violations = validate_create(request)
    sound = (
        bool(text.strip())
        and all(
            n and n.replace("_", "a").replace("-", "a").isascii() and n.replace("_", "a").replace("-", "a").isalnum()
            for n in names
        )
        and len(set(names)) == len(names)
        and (temperature is None or 0 <= temperature <= 2)
    )
    assert (violations == []) == sound, (request, violations)


async def test_get_delete_and_list_input_items() -> None:
    provider = ScriptedProvider([[Text("hello")]])
    async with running_gateway(provider=provider) as gw:
        request = pb.CreateResponseRequest()
        for n in range(5):
            request.input_items.items.append(
                pb.Item(
                    message=pb.Message(
                        role=pb.Role.ROLE_USER, content=[pb.ContentPart(input_text=pb.InputText(text=str(n)))]
                    )
                )
            )
        created = await gw.create(request)
        got = (await gw.stub.GetResponse(pb.GetResponseRequest(response_id=created.id))).response
        assert got == created
        page = await gw.stub.ListInputItems(pb.ListInputItemsRequest(response_id=created.id, limit=2))
        assert [i.message.content[0].input_text.text for i in page.items] == ["0", "1"] and page.has_more
        page2 = await gw.stub.ListInputItems(
            pb.ListInputItemsRequest(response_id=created.id, limit=10, after=page.last_id)
        )
        assert [i.message.content[0].input_text.text for i in page2.items] == ["2", "3", "4"] and not page2.has_more
        desc = await gw.stub.ListInputItems(
            pb.ListInputItemsRequest(response_id=created.id, limit=1, order=pb.ListOrder.LIST_ORDER_DESC)
        )
        assert desc.items[0].message.content[0].input_text.text == "4"
        deleted = await gw.stub.DeleteResponse(pb.DeleteResponseRequest(response_id=created.id))
        assert deleted.deleted
        for call in (
            gw.stub.GetResponse(pb.GetResponseRequest(response_id=created.id)),
            gw.stub.DeleteResponse(pb.DeleteResponseRequest(response_id=created.id)),
            gw.stub.ListInputItems(pb.ListInputItemsRequest(response_id=created.id)),
            gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=created.id)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_empty_ids_and_bad_limits_are_invalid_argument() -> None:
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        for call in (
            gw.stub.GetResponse(pb.GetResponseRequest()),
            gw.stub.ListInputItems(pb.ListInputItemsRequest(response_id="resp_x", limit=1000)),
            gw.stub.CancelResponse(pb.CancelResponseRequest()),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert violations_of(info.value)


async def test_cancelling_a_finished_response_is_failed_precondition() -> None:
    async with running_gateway(provider=ScriptedProvider([[Text("done")]])) as gw:
        created = await gw.create(user("hi"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=created.id))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
