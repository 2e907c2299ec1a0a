"""The server process: health (Check, Watch, List), reflection v1 and v1alpha (grpcurl
list/describe), health open and reflection behind authentication, a CreateResponse streamed by
grpcurl, and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.storage.memory import MemoryStore
from tests.auth_fixtures import api_keys
from tests.harness import assert_valid_stream, function_tool, kinds, running_gateway, user

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


async def run_grpcurl(*args: str, data: str | None = None) -> tuple[int, str, str]:
    command = [GRPCURL, "-plaintext", *(["-d", data] if data is not None else []), *args]
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def grpcurl(*args: str, data: str | None = None) -> str:
    code, out, err = await run_grpcurl(*args, data=data)
    assert code == 0, err
    return out


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


async def test_grpcurl_lists_both_reflection_versions_and_health_lists_every_service() -> None:
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        listed = (await grpcurl(gw.target, "list")).split()
        assert {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= set(listed)
        described = await grpcurl(gw.target, "describe", "grpc.reflection.v1.ServerReflection")
        assert "rpc ServerReflectionInfo ( stream .grpc.reflection.v1.ServerReflectionRequest )" in described
        statuses = json.loads(await grpcurl(gw.target, "grpc.health.v1.Health/List", data="{}"))["statuses"]
        assert statuses == {
            name: {"status": "SERVING"}
            for name in (
                "",
                "antwort.v1.ResponsesService",
                "antwort.v1.ConversationsService",
                "antwort.v1.ModelBackend",
            )
        }


# grpc.reflection.v1 as published (grpc/reflection/v1/reflection.proto): field numbers by name.
V1_FIELDS = {
    "ServerReflectionRequest": {
        "host": 1,
        "file_by_filename": 3,
        "file_containing_symbol": 4,
        "file_containing_extension": 5,
        "all_extension_numbers_of_type": 6,
        "list_services": 7,
    },
    "ServerReflectionResponse": {
        "valid_host": 1,
        "original_request": 2,
        "file_descriptor_response": 4,
        "all_extension_numbers_response": 5,
        "list_services_response": 6,
        "error_response": 7,
    },
}


async def reflect_v1(channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...] = (), **ask: str) -> Any:
    """One question to reflection v1, in v1's own messages."""
    pool = descriptor_pool.Default()
    request_class = GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest"))
    response_class = GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse"))
    info = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    answers = [answer async for answer in info(iter([request_class(**ask)]), metadata=metadata)]
    assert len(answers) == 1
    return answers[0]


async def test_reflection_v1_answers_in_its_own_package_as_published() -> None:
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        listed = await reflect_v1(gw.channel, list_services="")
        names = {service.name for service in listed.list_services_response.service}
        assert {"antwort.v1.ResponsesService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} <= names
        found = await reflect_v1(gw.channel, file_containing_symbol="grpc.reflection.v1.ServerReflection")
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(raw)
            for raw in found.file_descriptor_response.file_descriptor_proto
        ]
        served = next(f for f in files if f.package == "grpc.reflection.v1")
        messages = {m.name: {f.name: f.number for f in m.field} for m in served.message_type}
        assert {name: messages[name] for name in V1_FIELDS} == V1_FIELDS


async def test_health_is_open_and_reflection_needs_credentials_for_grpcurl(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    key = credentials.tokens["alice"]
    # Without credentials grpcurl cannot ask reflection for the health service's messages: it is
    # given them (health.proto would do as well), as a probe has them compiled in.
    protoset = tmp_path / "health.protoset"
    health_file = descriptor_pb2.FileDescriptorProto()
    health_pb2.DESCRIPTOR.CopyToProto(health_file)
    protoset.write_bytes(descriptor_pb2.FileDescriptorSet(file=[health_file]).SerializeToString())
    async with running_gateway(provider=ScriptedProvider([]), **credentials.settings) as gw:
        await grpcurl("-protoset", str(protoset), gw.target, "grpc.health.v1.Health/Check")
        statuses = json.loads(await grpcurl("-protoset", str(protoset), gw.target, "grpc.health.v1.Health/List"))
        assert statuses["statuses"]["antwort.v1.ResponsesService"] == {"status": "SERVING"}
        code, _, err = await run_grpcurl(gw.target, "grpc.health.v1.Health/Check")
        assert code != 0 and "Unauthenticated" in err, "reflection (asked first) needs the credential"
        code, _, err = await run_grpcurl(gw.target, "list")
        assert code != 0 and "Unauthenticated" in err, err
        listed = await grpcurl("-H", f"authorization: Bearer {key}", gw.target, "list")
        assert "antwort.v1.ResponsesService" in listed.split()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await reflect_v1(gw.channel, list_services="")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        listed_v1 = await reflect_v1(gw.channel, credentials.of("alice"), list_services="")
        assert "antwort.v1.ResponsesService" in {s.name for s in listed_v1.list_services_response.service}
