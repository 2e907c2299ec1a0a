"""Executor services that die, freeze, restart or are not up yet, behind a real gateway: the model
gets an error result, the response completes, and the service is used again once it answers."""

from __future__ import annotations

import asyncio
import signal
import time

from antwort_grpc import pb
from antwort_grpc.executors.remote import RemoteSettings
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.tool_services.sdk import serve_executor
from tests.executors.remote_services import (
    NOT_SERVING,
    SERVING,
    Calculator,
    ExecutorProcess,
    free_port,
    function,
    gateway_with_remote,
    start_executor_process,
    stop_process,
    tool_outputs,
    tools_request,
    wait_for_health,
)
from tests.harness import GatewayClient, assert_valid_stream, final, output_text

S = pb.ResponseStatus
BLOCKING = "tests.executors.remote_services:Blocking"
SETTINGS = RemoteSettings(retry_interval=0.1, info_timeout=1.0, call_timeout=60.0)


def _answer_with_outputs(turn: TurnRequest) -> list[Text]:
    return [Text("the tool said: " + " | ".join(o.output for o in tool_outputs(turn)))]


def _step(name: str) -> pb.CreateResponseRequest:
    return tools_request(f"Run {name}", [function("slow_step"), function("quick_step")])


async def _kill_mid_call(gw: GatewayClient, executor: ExecutorProcess) -> list[pb.StreamEvent]:
    """Stream a response whose tool call never ends, and kill -9 the executor once the call has
    started there (its first progress message arrived)."""
    request = _step("slow_step")
    request.stream = True
    events: list[pb.StreamEvent] = []
    async with asyncio.timeout(30):
        async for message in gw.stub.CreateResponse(request):
            events.append(message.event)
            if message.event.WhichOneof("event") == "tool_execution_progress":
                assert message.event.tool_execution_progress.message == "started"
                executor.proc.send_signal(signal.SIGKILL)
    assert_valid_stream(events)
    return events


def _turns() -> list[object]:
    return [[Call.of("slow_step", call_id="call_slow")], _answer_with_outputs]


async def test_an_executor_killed_mid_call_gives_the_model_an_error_result_and_the_response_completes() -> None:
    executor = await start_executor_process(BLOCKING)
    provider = ScriptedProvider(_turns())  # type: ignore[arg-type]
    try:
        async with gateway_with_remote(provider, executor.target, SETTINGS) as (gw, remote):
            events = await _kill_mid_call(gw, executor)
            await wait_for_health(gw.target, remote.health_name, NOT_SERVING)
    finally:
        await stop_process(executor.proc)
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    failed = [e.tool_execution_failed for e in events if e.WhichOneof("event") == "tool_execution_failed"]
    assert [f.call_id for f in failed] == ["call_slow"]
    fed_back = tool_outputs(provider.requests[1])
    assert [(o.call_id, o.is_error) for o in fed_back] == [("call_slow", True)]
    assert "unavailable" in fed_back[0].output
    assert output_text(response).startswith("the tool said: tool service blocking")


async def test_an_executor_restarted_on_the_same_port_is_used_again_without_restarting_the_gateway() -> None:
    executor = await start_executor_process(BLOCKING)
    turns = [*_turns(), [Call.of("quick_step", call_id="call_quick")], _answer_with_outputs]
    provider = ScriptedProvider(turns)  # type: ignore[arg-type]
    restarted: ExecutorProcess | None = None
    try:
        async with gateway_with_remote(provider, executor.target, SETTINGS) as (gw, remote):
            await _kill_mid_call(gw, executor)
            await wait_for_health(gw.target, remote.health_name, NOT_SERVING)
            restarted = await start_executor_process(BLOCKING, f"127.0.0.1:{executor.port}")
            await wait_for_health(gw.target, remote.health_name, SERVING)
            response = await gw.create(_step("quick_step"))
    finally:
        await stop_process(executor.proc)
        if restarted is not None:
            await stop_process(restarted.proc)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    output = response.output[1].function_call_output
    assert not output.is_error
    assert output.output == f"quick step done (pid {restarted.proc.pid})"


async def test_the_gateway_starts_while_an_executor_is_down_and_uses_it_once_it_is_up() -> None:
    port = free_port()
    provider = ScriptedProvider(
        [[Call.of("add", {"a": 1, "b": 1})], [Call.of("add", {"a": 2, "b": 2})], _answer_with_outputs]
    )
    started = time.monotonic()
    async with gateway_with_remote(provider, f"127.0.0.1:{port}", SETTINGS) as (gw, remote):
        assert time.monotonic() - started < 5, "a service that is down must not hold up startup"
        await wait_for_health(gw.target, remote.health_name, NOT_SERVING)
        # Its tools are unknown yet, so the function goes to the client.
        early = await gw.create(tools_request("1+1", [function("add")]))
        assert early.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        server = await serve_executor(Calculator(), f"127.0.0.1:{port}")
        try:
            await wait_for_health(gw.target, remote.health_name, SERVING)
            response = await gw.create(tools_request("2+2", [function("add")]))
        finally:
            await server.stop(0)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_text(response) == "the tool said: 4"


async def test_a_frozen_executor_times_out_into_an_error_result_and_is_marked_unhealthy_until_it_answers() -> None:
    executor = await start_executor_process(BLOCKING)
    provider = ScriptedProvider(
        [
            [Call.of("quick_step", call_id="call_frozen")],
            _answer_with_outputs,
            [Call.of("quick_step", call_id="call_fast_fail")],
            _answer_with_outputs,
            [Call.of("quick_step", call_id="call_thawed")],
            _answer_with_outputs,
        ]
    )
    settings = RemoteSettings(retry_interval=0.1, info_timeout=0.5, call_timeout=1.0)
    try:
        async with gateway_with_remote(provider, executor.target, settings) as (gw, remote):
            executor.proc.send_signal(signal.SIGSTOP)
            frozen = await gw.create(_step("quick_step"))
            await wait_for_health(gw.target, remote.health_name, NOT_SERVING)
            started = time.monotonic()
            fast_fail = await gw.create(_step("quick_step"))
            fast_fail_seconds = time.monotonic() - started
            executor.proc.send_signal(signal.SIGCONT)
            await wait_for_health(gw.target, remote.health_name, SERVING)
            thawed = await gw.create(_step("quick_step"))
    finally:
        executor.proc.send_signal(signal.SIGCONT)
        await stop_process(executor.proc)
    first = frozen.output[1].function_call_output
    assert frozen.status == S.RESPONSE_STATUS_COMPLETED
    assert first.is_error and "did not finish within 1.0s" in first.output
    second = fast_fail.output[1].function_call_output
    assert second.is_error and "unavailable" in second.output
    assert fast_fail_seconds < 1.0, "calls to a service known to be down fail at once"
    assert not thawed.output[1].function_call_output.is_error
