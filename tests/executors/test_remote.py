"""The remote executor against real executor services on loopback ports: what it learns from a
service, how it claims tools, and how it behaves when the service is down or comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from antwort_grpc import pb
from antwort_grpc.executors.base import HostedToolSource, current_deadline
from antwort_grpc.executors.remote import HEALTH_PREFIX, RemoteExecutor, RemoteSettings, build_executors
from antwort_grpc.tool_services.sdk import ExecutorServer, ExecutorService, serve_executor
from tests.executors.remote_services import (
    CODE_INTERPRETER,
    FAST,
    Bridge,
    Calculator,
    Dynamic,
    Sandbox,
    function,
    mcp,
)


async def _served(service: ExecutorService) -> AsyncIterator[tuple[ExecutorServer, RemoteExecutor]]:
    server = await serve_executor(service)
    remote = RemoteExecutor(server.target, FAST)
    await remote.start()
    try:
        yield server, remote
    finally:
        await remote.close()
        await server.stop(0)


@pytest.fixture
async def calculator() -> AsyncIterator[tuple[Calculator, RemoteExecutor]]:
    service = Calculator()
    async for _, remote in _served(service):
        yield service, remote


def _call(name: str, arguments: str = "{}") -> pb.FunctionCall:
    return pb.FunctionCall(call_id="call_1", name=name, arguments=arguments)


def _no_progress(message: str) -> None:
    raise AssertionError(f"unexpected progress {message!r}")


async def test_at_start_the_executor_learns_the_services_kind_name_and_tools() -> None:
    async for _, remote in _served(Bridge()):
        assert remote.healthy
        assert remote.name == "bridge"
        assert remote.kind == pb.ToolKind.TOOL_KIND_MCP
        assert [(t.server_label, t.function.name) for t in remote.tools] == [
            ("docs", "search_docs"),
            ("docs", "fetch_page"),
            ("tickets", "create_ticket"),
        ]
        assert isinstance(remote, HostedToolSource)


async def test_a_service_of_plain_functions_is_still_a_server_side_executor(
    calculator: tuple[Calculator, RemoteExecutor],
) -> None:
    _, remote = calculator
    # The SDK's default kind is FUNCTION (plain functions); the engine hands FUNCTION calls to the
    # client, so the gateway-side kind must not be FUNCTION.
    assert remote.kind != pb.ToolKind.TOOL_KIND_FUNCTION


async def test_a_function_tool_is_claimed_by_name_when_the_service_lists_it(
    calculator: tuple[Calculator, RemoteExecutor],
) -> None:
    service, remote = calculator
    assert await remote.can_execute(function("add"))
    assert service.asked == [], "a listed tool needs no CanExecute round trip"
    assert not await remote.can_execute(function("subtract"))
    assert not await remote.can_execute(CODE_INTERPRETER)
    assert not await remote.can_execute(mcp("docs"))


async def test_an_unlisted_tool_is_asked_about_with_can_execute_and_the_answer_is_cached() -> None:
    service = Dynamic()
    async for _, remote in _served(service):
        for _ in range(3):
            assert await remote.can_execute(function("dyn_lookup"))
            assert not await remote.can_execute(function("static_lookup"))
        assert [t.function.name for t in service.asked] == ["dyn_lookup", "static_lookup"]
        result = await remote.execute(_call("dyn_lookup"), function("dyn_lookup"), _no_progress)
        assert result.output == "dynamic dyn_lookup"


async def test_an_mcp_tool_is_claimed_by_server_label_and_narrowed_to_its_allowed_tools() -> None:
    async for _, remote in _served(Bridge()):
        assert await remote.can_execute(mcp("docs"))
        assert await remote.can_execute(mcp("tickets"))
        assert not await remote.can_execute(mcp("billing"))
        assert [f.name for f in await remote.functions_for(mcp("docs"))] == ["search_docs", "fetch_page"]
        assert [f.name for f in await remote.functions_for(mcp("docs", "fetch_page"))] == ["fetch_page"]
        assert [f.name for f in await remote.functions_for(mcp("tickets"))] == ["create_ticket"]
        # An MCP server's tools are reached through its label, never as bare function names.
        assert not await remote.can_execute(function("search_docs"))


class _LateBridge(Bridge):
    """A bridge whose MCP servers connect only after the gateway first listed its tools."""

    connected = False

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return await super().list_tools() if self.connected else []


async def test_an_mcp_server_that_connected_after_the_last_listing_is_offered_at_once() -> None:
    service = _LateBridge()
    async for _, remote in _served(service):
        assert remote.tools == []
        service.connected = True
        assert await remote.can_execute(mcp("docs"))
        assert [f.name for f in await remote.functions_for(mcp("docs"))] == ["search_docs", "fetch_page"]


async def test_code_interpreter_is_claimed_by_a_sandbox_and_offers_its_functions() -> None:
    async for _, remote in _served(Sandbox()):
        assert remote.kind == pb.ToolKind.TOOL_KIND_SANDBOX
        assert await remote.can_execute(CODE_INTERPRETER)
        assert [f.name for f in await remote.functions_for(CODE_INTERPRETER)] == ["run_python"]


async def test_a_call_carries_what_remains_of_the_requests_deadline(
    calculator: tuple[Calculator, RemoteExecutor],
) -> None:
    _, remote = calculator
    loop = asyncio.get_running_loop()
    token = current_deadline.set(loop.time() - 1)
    try:
        late = await remote.execute(_call("add", '{"a": 1, "b": 2}'), function("add"), _no_progress)
    finally:
        current_deadline.reset(token)
    assert late.is_error and "deadline" in late.output
    assert remote.healthy, "a request out of time says nothing about the service"
    result = await remote.execute(_call("add", '{"a": 1, "b": 2}'), function("add"), _no_progress)
    assert (result.call_id, result.output, result.is_error) == ("call_1", "3", False)


async def test_calls_to_a_service_that_went_away_fail_at_once_with_an_error_result() -> None:
    server = await serve_executor(Calculator())
    remote = RemoteExecutor(server.target, RemoteSettings(retry_interval=0.1, info_timeout=1.0, call_timeout=60))
    await remote.start()
    try:
        await server.stop(0)
        started = time.monotonic()
        first = await remote.execute(_call("add", '{"a": 1, "b": 1}'), function("add"), _no_progress)
        second = await remote.execute(_call("add", '{"a": 1, "b": 1}'), function("add"), _no_progress)
        assert time.monotonic() - started < 5
        assert first.is_error and second.is_error
        assert "unavailable" in second.output
        assert not remote.healthy
        # The last tool list is kept: the request still routes here, and gets the error.
        assert await remote.can_execute(function("add"))
    finally:
        await remote.close()


def test_targets_are_deduplicated_and_keep_their_order() -> None:
    remotes = build_executors(["b:1", " a:2 ", "b:1", ""])
    assert [r.target for r in remotes] == ["b:1", "a:2"]
    assert remotes[0].health_name == HEALTH_PREFIX + "b:1"
