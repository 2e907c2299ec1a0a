"""Routing through a real gateway to real executor services: every call reaches the service that
owns its tool, unclaimed functions go to the client, and a request is offered only the tools it
asked for."""

from __future__ import annotations

import json

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.executors.base import FunctionExecutor, ProgressSink
from antwort_grpc.executors.remote import RemoteExecutor, RemoteSettings
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.tool_services.sdk import ToolExecutorServicer, function_tool, text_result
from tests.executors.remote_services import (
    CODE_INTERPRETER,
    Bridge,
    Calculator,
    Forecasts,
    Recording,
    Sandbox,
    function,
    gateway_with_services,
    mcp,
    offered,
    tool_outputs,
    tools_request,
)
from tests.harness import final, kinds, output_kinds, output_text, running_gateway

S = pb.ResponseStatus


def _answer_with_outputs(turn: TurnRequest) -> list[Text]:
    return [Text(" | ".join(o.output for o in tool_outputs(turn)))]


async def test_each_call_goes_to_the_service_that_owns_its_tool() -> None:
    weather, calculator = Forecasts(), Calculator()
    provider = ScriptedProvider(
        [
            [
                Call.of("add", {"a": 2, "b": 3}, call_id="call_add"),
                Call.of("get_weather", {"city": "Lisbon"}, call_id="call_weather"),
            ],
            _answer_with_outputs,
        ]
    )
    async with gateway_with_services(provider, weather, calculator) as setup:
        events = await setup.gateway.stream(tools_request("Sum and sky", [function("get_weather"), function("add")]))
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert [c.call_id for c in calculator.calls] == ["call_add"]
    assert [c.call_id for c in weather.calls] == ["call_weather"]
    assert output_kinds(response) == [
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
    ]
    outputs = [i.function_call_output for i in response.output if i.WhichOneof("kind") == "function_call_output"]
    assert [(o.call_id, o.output) for o in outputs] == [("call_add", "5"), ("call_weather", "Lisbon: sunny")]
    assert output_text(response) == "5 | Lisbon: sunny"


async def test_a_function_tool_no_service_claims_ends_in_requires_action() -> None:
    weather = Forecasts()
    provider = ScriptedProvider([[Call.of("send_email", {"to": "ops"}, call_id="call_mail")]])
    async with gateway_with_services(provider, weather, Calculator()) as setup:
        events = await setup.gateway.stream(
            tools_request("Mail ops", [function("send_email"), function("get_weather")])
        )
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert kinds(events)[-1] == "requires_action"
    assert [c.call_id for c in events[-1].requires_action.tool_calls] == ["call_mail"]
    assert weather.calls == []


async def test_a_request_is_offered_only_the_tools_it_asked_for() -> None:
    weather, calculator, bridge, sandbox = Forecasts(), Calculator(), Bridge(), Sandbox()
    cases: list[tuple[list[pb.Tool], list[str]]] = [
        ([], []),
        ([function("get_weather")], ["get_weather"]),
        ([mcp("docs")], ["search_docs", "fetch_page"]),
        ([mcp("docs", "fetch_page")], ["fetch_page"]),
        ([mcp("tickets"), function("add")], ["create_ticket", "add"]),
        ([CODE_INTERPRETER], ["run_python"]),
    ]
    provider = ScriptedProvider([[Text("ok")]], repeat=True)
    async with gateway_with_services(provider, weather, calculator, bridge, sandbox) as setup:
        for tools, expected in cases:
            response = await setup.gateway.create(tools_request("hi", tools))
            assert response.status == S.RESPONSE_STATUS_COMPLETED
            assert offered(provider.requests[-1]) == expected, tools
    for service in (weather, calculator, bridge, sandbox):
        assert service.calls == []


async def test_a_tool_of_a_service_the_request_did_not_name_is_never_run() -> None:
    bridge = Bridge()
    provider = ScriptedProvider(
        [
            # The model calls a tool of the `tickets` server, which this request did not name.
            [Call.of("create_ticket", {"q": "leak"}, call_id="call_ticket")],
            _answer_with_outputs,
        ]
    )
    async with gateway_with_services(provider, bridge) as setup:
        response = await setup.gateway.create(tools_request("Search", [mcp("docs")]))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    rejected = response.output[1].function_call_output
    assert rejected.is_error and "not defined" in rejected.output
    assert bridge.calls == []


async def test_a_call_to_an_mcp_tool_carries_the_server_the_request_named() -> None:
    bridge = Bridge()
    provider = ScriptedProvider([[Call.of("fetch_page", {"q": "intro"})], _answer_with_outputs])
    async with gateway_with_services(provider, bridge) as setup:
        response = await setup.gateway.create(tools_request("Read", [mcp("docs", "fetch_page")]))
    assert output_text(response) == 'docs/fetch_page {"q": "intro"}'


async def test_a_hosted_tool_no_service_offers_is_refused_before_the_response_starts() -> None:
    provider = ScriptedProvider([[Text("never")]])
    async with gateway_with_services(provider, Forecasts(), Bridge()) as setup:
        for tool in (CODE_INTERPRETER, mcp("billing")):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await setup.gateway.create(tools_request("hi", [tool]))
            assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert provider.requests == []


async def test_progress_messages_of_a_remote_tool_become_tool_progress_events() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Oslo"})], _answer_with_outputs])
    async with gateway_with_services(provider, Forecasts()) as setup:
        events = await setup.gateway.stream(tools_request("Weather?", [function("get_weather")]))
    names = kinds(events)
    progress = [e.tool_execution_progress.message for e in events if e.WhichOneof("event") == "tool_execution_progress"]
    assert progress == ["looking up Oslo", "reading the sky"]
    assert names.index("tool_execution_in_progress") < names.index("tool_execution_progress")
    assert names.index("tool_execution_progress") < names.index("tool_execution_completed")
    assert output_text(final(events)) == "Oslo: sunny"


class _Deadlines(Recording):
    """Reports the deadline its Execute RPC arrived with (the servicer below records it)."""

    name = "deadlines"

    def __init__(self) -> None:
        super().__init__()
        self.remaining: list[float | None] = []

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [function_tool("measure", "Measures", {"type": "object"})]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        return text_result(json.dumps(self.remaining[-1]))


class _DeadlineServicer(ToolExecutorServicer):
    async def Execute(self, request: pb.ExecuteRequest, context: object):  # type: ignore[no-untyped-def]
        assert isinstance(self.service, _Deadlines)
        self.service.remaining.append(context.time_remaining())  # type: ignore[attr-defined]
        async for update in super().Execute(request, context):
            yield update


async def test_the_requests_deadline_reaches_the_executor() -> None:
    service = _Deadlines()
    server = grpc.aio.server()
    pb.add_ToolExecutorServiceServicer_to_server(_DeadlineServicer(service), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        provider = ScriptedProvider([[Call.of("measure")], _answer_with_outputs], repeat=True)
        remote = RemoteExecutor(f"127.0.0.1:{port}", RemoteSettings(call_timeout=120))
        async with remote, running_gateway(provider=provider, executors=[FunctionExecutor(), remote]) as gw:
            await gw.create(tools_request("measure", [function("measure")]), timeout=8)
            await gw.create(tools_request("measure", [function("measure")]))
        with_deadline, without = service.remaining
        # (gRPC rounds a timeout on the wire up to whole units: allow a second.)
        assert with_deadline is not None and 5 < with_deadline <= 9
        # A request without a deadline still bounds the call: by the configured call timeout.
        assert without is not None and 110 < without <= 121
    finally:
        await server.stop(0)
