"""An executor service written with the SDK, driven over real gRPC on a loopback port."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.tool_services.sdk import ExecutorServer, ExecutorService, function_tool, serve_executor, text_result
from examples.weather_executor import Weather

ROOT = Path(__file__).resolve().parents[2]


class Slow(ExecutorService):
    name = "slow"
    kind = pb.ToolKind.TOOL_KIND_SANDBOX

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [function_tool("wait", "waits", {"type": "object"}), function_tool("boom", "raises", {"type": "object"})]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        if call.name == "boom":
            raise ValueError("kaput")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return text_result("never")


async def _serving(service: ExecutorService) -> AsyncIterator[tuple[ExecutorServer, pb.ToolExecutorServiceStub]]:
    server = await serve_executor(service)
    async with grpc.aio.insecure_channel(server.target) as channel:
        yield server, pb.ToolExecutorServiceStub(channel)
    await server.stop(0)


@pytest.fixture
async def weather() -> AsyncIterator[pb.ToolExecutorServiceStub]:
    async for _, stub in _serving(Weather()):
        yield stub


def _call(name: str, **arguments: object) -> pb.FunctionCall:
    return pb.FunctionCall(call_id="call_1", name=name, arguments=json.dumps(arguments))


async def test_executor_info_lists_the_services_tools(weather: pb.ToolExecutorServiceStub) -> None:
    info = await weather.GetExecutorInfo(pb.GetExecutorInfoRequest())
    assert info.name == "weather"
    assert info.kind == pb.ToolKind.TOOL_KIND_CUSTOM
    assert [t.function.name for t in info.tools] == ["get_weather"]
    assert info.tools[0].function.parameters["required"] == ["city"]


async def test_can_execute_answers_for_listed_tools_only(weather: pb.ToolExecutorServiceStub) -> None:
    mine = pb.Tool(function=pb.FunctionTool(name="get_weather"))
    other = pb.Tool(function=pb.FunctionTool(name="get_stock_price"))
    assert (await weather.CanExecute(pb.CanExecuteRequest(tool=mine))).can_execute
    assert not (await weather.CanExecute(pb.CanExecuteRequest(tool=other))).can_execute
    code = pb.Tool(code_interpreter=pb.CodeInterpreterTool())
    assert not (await weather.CanExecute(pb.CanExecuteRequest(tool=code))).can_execute


async def test_execute_streams_progress_then_exactly_one_result(weather: pb.ToolExecutorServiceStub) -> None:
    updates = [u async for u in weather.Execute(pb.ExecuteRequest(call=_call("get_weather", city="Lisbon")))]
    assert [u.WhichOneof("update") for u in updates] == ["progress", "result"]
    assert updates[0].progress.message == "looking up Lisbon"
    result = updates[1].result
    assert (result.call_id, result.output, result.is_error) == ("call_1", "Lisbon: 21°C, sunny", False)


async def test_a_tool_failure_the_service_reports_is_an_error_result(weather: pb.ToolExecutorServiceStub) -> None:
    updates = [u async for u in weather.Execute(pb.ExecuteRequest(call=_call("get_weather", city="Atlantis")))]
    assert updates[-1].result.is_error
    assert "Atlantis" in updates[-1].result.output


async def test_an_exception_in_execute_becomes_an_error_result_and_the_service_keeps_serving() -> None:
    async for _, stub in _serving(Slow()):
        updates = [u async for u in stub.Execute(pb.ExecuteRequest(call=_call("boom")))]
        assert len(updates) == 1
        assert updates[0].result.is_error
        assert "ValueError: kaput" in updates[0].result.output
        info = await stub.GetExecutorInfo(pb.GetExecutorInfoRequest())
        assert info.name == "slow"


async def test_the_callers_deadline_cancels_the_running_call() -> None:
    service = Slow()
    async for _, stub in _serving(service):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in stub.Execute(pb.ExecuteRequest(call=_call("wait")), timeout=0.3):
                pass
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(service.cancelled.wait(), 5)


async def test_a_call_without_a_name_is_invalid_argument(weather: pb.ToolExecutorServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in weather.Execute(pb.ExecuteRequest(call=pb.FunctionCall(call_id="c"))):
            pass
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_example_runs_as_a_process_from_the_cli() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANTWORT_EXECUTOR_LISTEN": "127.0.0.1:0"}
    cli = [sys.executable, "-m", "antwort_grpc.cli", "executor", "run", "examples.weather_executor:Weather"]
    proc = await asyncio.create_subprocess_exec(*cli, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        target = line.rsplit(" ", 1)[-1].strip()
        async with grpc.aio.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="antwort.v1.ToolExecutorService"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb.ToolExecutorServiceStub(channel)
            updates = [u async for u in stub.Execute(pb.ExecuteRequest(call=_call("get_weather", city="Berlin")))]
            assert updates[-1].result.output == "Berlin: 12°C, rain"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 15) == 0
