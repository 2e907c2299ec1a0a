"""The server process: health, reflection (grpcurl list/describe), a CreateResponse streamed by
grpcurl, and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.storage.memory import MemoryStore
from tests.harness import assert_valid_stream, function_tool, kinds, running_gateway, user

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


async def grpcurl(*args: str, data: str | None = None) -> str:
    command = [GRPCURL, "-plaintext", *(["-d", data] if data is not None else []), *args]
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_grpcurl_lists_and_describes_both_services() -> None:
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        listed = await grpcurl(gw.target, "list")
        assert "antwort.v1.ResponsesService" in listed.split()
        assert "grpc.health.v1.Health" in listed.split()
        described = await grpcurl(gw.target, "describe", "antwort.v1.ResponsesService")
        for rpc in ("CreateResponse", "GetResponse", "DeleteResponse", "CancelResponse", "ListInputItems"):
            assert f"rpc {rpc}" in described
        executor = await grpcurl(gw.target, "describe", "antwort.v1.ToolExecutorService")
        for rpc in ("GetExecutorInfo", "CanExecute", "Execute"):
            assert f"rpc {rpc}" in executor
        event = await grpcurl(gw.target, "describe", "antwort.v1.StreamEvent")
        assert "requires_action" in event and "tool_execution_progress" in event


async def test_grpcurl_streams_a_create_response() -> None:
    provider = ScriptedProvider([[Text("Hello from the gateway.")]])
    async with running_gateway(provider=provider) as gw:
        out = await grpcurl(
            gw.target,
            "antwort.v1.ResponsesService/CreateResponse",
            data=json.dumps({"model": "test-model", "input_text": "hi", "stream": True}),
        )
    decoder = json.JSONDecoder()
    messages, rest = [], out.strip()
    while rest:
        obj, end = decoder.raw_decode(rest)
        messages.append(obj["event"])
        rest = rest[end:].strip()
    # grpcurl 1.8 prints the proto field names.
    names = [next(k for k in m if k != "sequence_number") for m in messages]
    assert names[0] == "created" and names[-1] == "completed"
    assert "output_text_delta" in names
    assert [m["sequence_number"] for m in messages] == list(range(1, len(messages) + 1))
    final = messages[-1]["completed"]["response"]
    assert final["status"] == "RESPONSE_STATUS_COMPLETED"
    assert final["output"][0]["message"]["content"][0]["output_text"]["text"] == "Hello from the gateway."


async def test_health_reports_serving() -> None:
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        health = health_pb2_grpc.HealthStub(gw.channel)
        for service in ("", "antwort.v1.ResponsesService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_graceful_shutdown_lets_in_flight_streams_finish_and_refuses_new_calls() -> None:
    provider = ScriptedProvider([Turn([Text("one two three four five six")], delay=0.1)], repeat=True)
    store = MemoryStore()
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("count")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        events = [(await call.read()).event]
        health = health_pb2_grpc.HealthStub(gw.channel)
        stopping = asyncio.create_task(gw.gateway.stop(grace=5, drain=0.5))
        await asyncio.sleep(0.05)
        watch = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert watch.status == health_pb2.HealthCheckResponse.NOT_SERVING
        while (message := await call.read()) is not grpc.aio.EOF:
            events.append(message.event)
        await stopping
        assert_valid_stream(events)
        assert kinds(events)[-1] == "completed", "the in-flight stream finished within the grace period"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.stub.GetResponse(pb.GetResponseRequest(response_id="x"), timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_shutdown_after_grace_stores_the_interrupted_response() -> None:
    provider = ScriptedProvider([Turn([Text("word " * 100)], delay=0.2)])
    store = MemoryStore()
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("long")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        created = (await call.read()).event
        await gw.gateway.stop(grace=0.3)
    stored = await store.get(created.created.response.id)
    assert stored is not None
    assert stored.response.status == pb.ResponseStatus.RESPONSE_STATUS_CANCELLED


async def test_tool_definitions_are_echoed_in_the_response() -> None:
    provider = ScriptedProvider([[Call.of("f", {})]])
    async with running_gateway(provider=provider) as gw:
        request = user("hi")
        request.tools.append(function_tool("f", x="integer"))
        request.metadata["trace"] = "abc"
        request.temperature = 0.5
        response = await gw.create(request)
    assert response.tools[0].function.name == "f"
    assert response.metadata["trace"] == "abc"
    assert response.temperature == 0.5
    assert response.parallel_tool_calls and response.store


async def test_backend_health_is_reported_under_its_own_service_name() -> None:
    from antwort_grpc.providers.base import ProviderHealth

    class DownBackend(ScriptedProvider):
        async def check_health(self) -> ProviderHealth:
            return ProviderHealth(ok=False, detail="connection refused")

    async with running_gateway(provider=DownBackend([])) as gw:
        health = health_pb2_grpc.HealthStub(gw.channel)
        for _ in range(100):
            reply = await health.Check(health_pb2.HealthCheckRequest(service="antwort.v1.ModelBackend"))
            if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            await asyncio.sleep(0.01)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        gateway = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert gateway.status == health_pb2.HealthCheckResponse.SERVING, "the gateway itself still serves"
