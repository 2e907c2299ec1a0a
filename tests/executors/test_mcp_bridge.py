"""The MCP bridge against real MCP servers (official SDK) over stdio and streamable HTTP, driven
through its ToolExecutorService on a loopback port.

The servers here are shared by the module (starting one costs a second of SDK import); tests
that stop, restart or reconfigure servers are in test_mcp_connections.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from antwort_grpc import pb
from tests.executors.mcp_harness import (
    execute,
    http_server,
    listed,
    mcp_tool,
    running_bridge,
    start_http_server,
    stdio_server,
)
from tests.executors.mcp_servers import PAGING_TOOLS

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOLS = [
    "echo",
    "add",
    "fail",
    "countdown",
    "whoami",
    "trace_context",
    "sleep",
    "pid",
    "exit_now",
    "rendezvous",
    "picture",
    "learn",
]
PAGED = [f"tool_{i:02d}" for i in range(PAGING_TOOLS)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bridge() -> AsyncIterator[pb.ToolExecutorServiceStub]:
    """Four servers: tools over stdio ("local") and HTTP ("remote"), and a server that lists its
    tools three to a page over stdio ("pages") and HTTP ("paged-http")."""
    remote, paged = await asyncio.gather(start_http_server("tools"), start_http_server("paging"))
    try:
        servers = [
            stdio_server("local"),
            http_server("remote", remote.url),
            stdio_server("pages", kind="paging"),
            http_server("paged-http", paged.url),
        ]
        async with running_bridge(servers) as stub:
            yield stub
    finally:
        await asyncio.gather(remote.stop(), paged.stop())


async def test_executor_info_lists_the_tools_of_every_server_with_its_label(
    bridge: pb.ToolExecutorServiceStub,
) -> None:
    info = await bridge.GetExecutorInfo(pb.GetExecutorInfoRequest())
    assert (info.kind, info.name) == (pb.ToolKind.TOOL_KIND_MCP, "mcp")
    by_label: dict[str, list[str]] = {}
    for tool in info.tools:
        by_label.setdefault(tool.server_label, []).append(tool.function.name)
    assert by_label == {"local": TOOLS, "remote": TOOLS, "pages": PAGED, "paged-http": PAGED}
    add = next(t.function for t in info.tools if t.function.name == "add")
    assert add.description == "Add two integers (structured result)."
    assert sorted(add.parameters["required"]) == ["a", "b"]


@pytest.mark.parametrize("label", ["pages", "paged-http"])
async def test_a_server_with_more_tools_than_one_page_is_listed_completely(
    bridge: pb.ToolExecutorServiceStub, label: str
) -> None:
    assert [name for server, name in await listed(bridge) if server == label] == PAGED
    outcome = await execute(bridge, label, "tool_06")
    assert (outcome.output, outcome.is_error) == ("tool_06 ran", False)


@pytest.mark.parametrize("label", ["local", "remote"])
async def test_a_call_returns_the_tools_text(bridge: pb.ToolExecutorServiceStub, label: str) -> None:
    outcome = await execute(bridge, label, "echo", text="grüß dich")
    assert (outcome.output, outcome.is_error, outcome.progress) == ("grüß dich", False, [])


@pytest.mark.parametrize("label", ["local", "remote"])
async def test_the_callers_trace_context_reaches_the_mcp_server_in_the_requests_meta(
    bridge: pb.ToolExecutorServiceStub, label: str
) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    call = pb.FunctionCall(call_id="call_t", name="trace_context", arguments="{}")
    request = pb.ExecuteRequest(call=call, tool=mcp_tool(label))
    updates = [u async for u in bridge.Execute(request, metadata=(("traceparent", traceparent),), timeout=60)]
    assert updates[-1].result.output == traceparent
    untraced = await execute(bridge, label, "trace_context")
    assert untraced.output == ""


@pytest.mark.parametrize("label", ["local", "remote"])
async def test_a_structured_result_reaches_the_model_as_json(bridge: pb.ToolExecutorServiceStub, label: str) -> None:
    outcome = await execute(bridge, label, "add", a=2, b=40)
    assert not outcome.is_error
    assert json.loads(outcome.output) == {"total": 42}


@pytest.mark.parametrize("label", ["local", "remote"])
async def test_a_tool_error_is_an_error_result(bridge: pb.ToolExecutorServiceStub, label: str) -> None:
    outcome = await execute(bridge, label, "fail", reason="disk full")
    assert (outcome.output, outcome.is_error) == ("Error executing tool fail: disk full", True)


@pytest.mark.parametrize("label", ["local", "remote"])
async def test_progress_notifications_become_progress_messages(bridge: pb.ToolExecutorServiceStub, label: str) -> None:
    outcome = await execute(bridge, label, "countdown", steps=3)
    assert outcome.progress == ["step 1 (1/3)", "step 2 (2/3)", "step 3 (3/3)"]
    assert (outcome.output, outcome.is_error) == ("liftoff", False)


async def test_images_and_links_are_described_rather_than_dropped(bridge: pb.ToolExecutorServiceStub) -> None:
    outcome = await execute(bridge, "remote", "picture")
    assert outcome.output.splitlines() == [
        "a red dot",
        "[image: image/png, 8 bytes]",
        "[resource link: dot file:///dot.png (image/png)]",
    ]


@pytest.mark.parametrize("label", ["local", "remote"])
async def test_two_calls_to_one_server_run_at_the_same_time(bridge: pb.ToolExecutorServiceStub, label: str) -> None:
    # Each call returns only once the other has reached the server.
    first, second = await asyncio.gather(execute(bridge, label, "rendezvous"), execute(bridge, label, "rendezvous"))
    assert (first.output, second.output) == ("met", "met")


async def test_the_same_tool_name_on_two_servers_runs_on_the_server_the_request_names(
    bridge: pb.ToolExecutorServiceStub,
) -> None:
    local = await execute(bridge, "local", "pid")
    remote = await execute(bridge, "remote", "pid")
    assert local.output != remote.output


async def test_a_tool_the_request_does_not_allow_is_refused(bridge: pb.ToolExecutorServiceStub) -> None:
    outcome = await execute(bridge, "local", "add", routed_by=mcp_tool("local", allowed=["echo"]), a=1, b=2)
    assert outcome.is_error
    assert "not allowed" in outcome.output


@pytest.mark.parametrize("label", ["pages", "paged-http"])
async def test_a_tool_the_server_does_not_list_is_refused_though_the_server_would_run_it(
    bridge: pb.ToolExecutorServiceStub, label: str
) -> None:
    """The paging servers answer a call of any name; with no allowed_tools the request allows
    what the server lists, nothing more."""
    outcome = await execute(bridge, label, "admin_reset")
    assert outcome.is_error, outcome.output
    assert outcome.output == f"MCP server {label!r} offers no tool named 'admin_reset'"
    listed_one = await execute(bridge, label, "tool_03")
    assert (listed_one.is_error, listed_one.output) == (False, "tool_03 ran")


async def test_a_function_tool_runs_only_the_function_it_names(bridge: pb.ToolExecutorServiceStub) -> None:
    outcome = await execute(bridge, "local", "exit_now", routed_by=pb.Tool(function=pb.FunctionTool(name="picture")))
    assert outcome.is_error
    assert "not the function 'picture' the request named" in outcome.output


async def test_an_unknown_server_label_is_an_error_result(bridge: pb.ToolExecutorServiceStub) -> None:
    outcome = await execute(bridge, "elsewhere", "echo", text="hi")
    assert outcome.is_error
    assert "no MCP server labelled 'elsewhere'" in outcome.output


async def test_arguments_that_are_not_a_json_object_are_an_error_result(bridge: pb.ToolExecutorServiceStub) -> None:
    call = pb.FunctionCall(call_id="c1", name="echo", arguments="[1, 2]")
    updates = [u async for u in bridge.Execute(pb.ExecuteRequest(call=call, tool=mcp_tool("local")))]
    assert updates[-1].result.is_error
    assert "JSON object" in updates[-1].result.output


async def test_can_execute_claims_the_servers_it_lists_tools_of(bridge: pb.ToolExecutorServiceStub) -> None:
    for label, expected in [("local", True), ("remote", True), ("elsewhere", False)]:
        answer = await bridge.CanExecute(pb.CanExecuteRequest(tool=mcp_tool(label)))
        assert answer.can_execute is expected, label


@pytest.mark.parametrize("label", ["local", "remote"])
async def test_the_callers_deadline_ends_a_running_call_and_the_server_keeps_serving(
    bridge: pb.ToolExecutorServiceStub, label: str
) -> None:
    call = pb.FunctionCall(call_id="c1", name="sleep", arguments='{"seconds": 60}')
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in bridge.Execute(pb.ExecuteRequest(call=call, tool=mcp_tool(label)), timeout=0.5):
            pass
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (await execute(bridge, label, "echo", text="next")).output == "next"
