"""Authentication and tenancy against a real gateway: API keys, JWTs, UNAUTHENTICATED, every RPC
walked by two tenants, open health, configurable reflection, the per-principal response limit and
the refusal to serve a non-loopback address without authentication."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.gateway import start_gateway
from antwort_grpc.grpc_security import AuthInterceptor, Identity
from antwort_grpc.grpc_server import ServerSpec, start_server
from antwort_grpc.providers.base import FinishReason, ProviderEvent, TextDelta, TurnEnd, TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.tool_services.sdk import SERVICE_NAME, ExecutorService, ToolExecutorServicer
from tests.auth_fixtures import Credentials, api_keys, jwts, metadata
from tests.harness import collect, function_tool, running_gateway, user

S = pb.ResponseStatus
Metadata = tuple[tuple[str, str], ...]


class Gated(ScriptedProvider):
    """Streams one word, then waits for `gate` before ending the turn: a response that stays
    running as long as a test needs it to."""

    def __init__(self) -> None:
        super().__init__([])
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        yield TextDelta("wait")
        self.started.set()
        await self.gate.wait()
        yield TurnEnd(FinishReason.STOP, pb.Usage(input_tokens=1, output_tokens=1, total_tokens=2))


def code_of(err: grpc.aio.AioRpcError) -> grpc.StatusCode:
    code: grpc.StatusCode = err.code()
    return code


def reason_of(err: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


async def fails_with(code: grpc.StatusCode, call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert code_of(raised.value) == code, raised.value.details()
    return raised.value


async def create(stub: Any, request: pb.CreateResponseRequest, md: Metadata) -> pb.Response:
    events = await collect(stub.CreateResponse(request, metadata=md))
    response: pb.Response = getattr(events[-1], events[-1].WhichOneof("event")).response
    return response


async def last_event(stream: Any) -> pb.StreamEvent:
    """The rest of a stream read with `read()` (the iterator API may not follow it)."""
    last = None
    while (message := await stream.read()) is not grpc.aio.EOF:
        last = message.event
    assert last is not None
    return last


def weather_request() -> pb.CreateResponseRequest:
    request = user("Weather in Paris?")
    request.tools.append(function_tool("get_weather", city="string"))
    return request


@pytest.fixture(params=["api_key", "jwt"])
def credentials(request: pytest.FixtureRequest, tmp_path: Path) -> Credentials:
    return api_keys(tmp_path) if request.param == "api_key" else jwts(tmp_path)


# Each RPC as a tenant other than the owner calls it about the owner's response.
def _foreign_calls(stub: Any, response_id: str, md: Metadata) -> dict[str, Callable[[], Awaitable[Any]]]:
    follow_up = pb.CreateResponseRequest(previous_response_id=response_id, input_text="and tomorrow?")
    return {
        "GetResponse": lambda: stub.GetResponse(pb.GetResponseRequest(response_id=response_id), metadata=md),
        "ListInputItems": lambda: stub.ListInputItems(pb.ListInputItemsRequest(response_id=response_id), metadata=md),
        "CreateResponse(previous_response_id)": lambda: collect(stub.CreateResponse(follow_up, metadata=md)),
        "CancelResponse": lambda: stub.CancelResponse(pb.CancelResponseRequest(response_id=response_id), metadata=md),
        "DeleteResponse": lambda: stub.DeleteResponse(pb.DeleteResponseRequest(response_id=response_id), metadata=md),
        "ControlResponse(pause)": lambda: stub.ControlResponse(
            pb.ControlResponseRequest(response_id=response_id, control=pb.Control(pause=pb.PauseControl())), metadata=md
        ),
        "ControlResponse(cancel)": lambda: stub.ControlResponse(
            pb.ControlResponseRequest(response_id=response_id, control=pb.Control(cancel=pb.CancelControl())),
            metadata=md,
        ),
        "Converse(previous_response_id)": lambda: converse(stub, follow_up, md),
    }


async def converse(stub: Any, request: pb.CreateResponseRequest, md: Metadata) -> list[pb.ConverseResponse]:
    """One Converse stream that starts `request` and then stops sending."""
    call = stub.Converse(iter([pb.ConverseRequest(create=request)]), metadata=md)
    return [message async for message in call]


async def test_another_tenants_response_is_not_found_for_every_rpc(credentials: Credentials) -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"})], [Text("Sunny.")]])
    alice, bob, carol = credentials.of("alice"), credentials.of("bob"), credentials.of("carol")
    async with running_gateway(provider=provider, **credentials.settings) as gw:
        paused = await create(gw.stub, weather_request(), alice)
        assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        for rpc, call in _foreign_calls(gw.stub, paused.id, bob).items():
            err = await fails_with(grpc.StatusCode.NOT_FOUND, call())
            assert reason_of(err) == "not_found", rpc
        # Nothing bob did touched it; carol, of alice's tenant, sees it and continues it.
        got = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=paused.id), metadata=carol)
        assert got.response.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        items = await gw.stub.ListInputItems(pb.ListInputItemsRequest(response_id=paused.id), metadata=alice)
        assert items.items
        follow_up = pb.CreateResponseRequest(previous_response_id=paused.id)
        call_id = paused.output[0].function_call.call_id
        follow_up.input_items.items.add().function_call_output.CopyFrom(
            pb.FunctionCallOutput(call_id=call_id, output='{"sky": "clear"}')
        )
        answered = await create(gw.stub, follow_up, carol)
        assert answered.status == S.RESPONSE_STATUS_COMPLETED
        stored = await gw.store.get(answered.id, "tenant:acme")
        assert stored is not None, "the owner of a stored response is the caller's tenant"
        deleted = await gw.stub.DeleteResponse(pb.DeleteResponseRequest(response_id=paused.id), metadata=alice)
        assert deleted.deleted


async def test_another_tenant_can_neither_see_nor_cancel_a_running_response(credentials: Credentials) -> None:
    provider = Gated()
    alice, bob = credentials.of("alice"), credentials.of("bob")
    async with running_gateway(provider=provider, **credentials.settings) as gw:
        request = user("wait for it")
        request.stream = True
        stream = gw.stub.CreateResponse(request, metadata=alice)
        created = (await stream.read()).event.created.response
        await provider.started.wait()
        for rpc in ("GetResponse", "CancelResponse", "ControlResponse(pause)", "ControlResponse(cancel)"):
            call = _foreign_calls(gw.stub, created.id, bob)[rpc]
            await fails_with(grpc.StatusCode.NOT_FOUND, call())
        running = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=created.id), metadata=alice)
        assert running.response.status == S.RESPONSE_STATUS_IN_PROGRESS
        provider.gate.set()
        assert (await last_event(stream)).WhichOneof("event") == "completed"


async def test_missing_or_bad_credentials_are_unauthenticated_for_every_rpc(credentials: Credentials) -> None:
    provider = ScriptedProvider([[Text("never")]])
    wrong = "ak_not-a-key" if credentials.settings["auth"] == "api_key" else "not.a.jwt"
    async with running_gateway(provider=provider, **credentials.settings) as gw:
        for md in ((), metadata(wrong), (("authorization", "Basic dXNlcjpwYXNz"),)):
            for rpc, call in _foreign_calls(gw.stub, "resp_x", md).items():
                err = await fails_with(grpc.StatusCode.UNAUTHENTICATED, call())
                assert reason_of(err) == "unauthenticated", rpc
        assert provider.requests == [], "the model was never asked"


async def test_health_is_open_and_reflection_needs_credentials(credentials: Credentials) -> None:
    async with running_gateway(provider=ScriptedProvider([]), **credentials.settings) as gw:
        health = health_pb2_grpc.HealthStub(gw.channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="antwort.v1.ResponsesService"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert await list_services(gw.channel, credentials.of("bob")) >= {"antwort.v1.ResponsesService"}
        await fails_with(grpc.StatusCode.UNAUTHENTICATED, list_services(gw.channel, ()))


async def test_reflection_can_be_turned_off() -> None:
    async with running_gateway(provider=ScriptedProvider([]), reflection=False) as gw:
        await fails_with(grpc.StatusCode.UNIMPLEMENTED, list_services(gw.channel, ()))


async def list_services(channel: grpc.aio.Channel, md: Metadata) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=md)
    async for reply in call:
        return {s.name for s in reply.list_services_response.service}
    raise AssertionError("no reflection answer")


async def test_a_key_added_to_the_file_works_at_once_and_a_removed_one_stops(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    path: Path = credentials.settings["api_keys_file"]
    from antwort_grpc.auth.apikeys import key_line, new_key

    dave = new_key()
    async with running_gateway(provider=ScriptedProvider([[Text("hi")]], repeat=True), **credentials.settings) as gw:
        await fails_with(grpc.StatusCode.UNAUTHENTICATED, create(gw.stub, user("hi"), metadata(dave)))
        lines = read_lines(path)
        write_lines(path, [*lines, key_line(dave, "dave", "initech")])
        assert (await create(gw.stub, user("hi"), metadata(dave))).status == S.RESPONSE_STATUS_COMPLETED
        write_lines(path, [line for line in lines if " alice " not in line])
        await fails_with(grpc.StatusCode.UNAUTHENTICATED, create(gw.stub, user("hi"), credentials.of("alice")))
        assert (await create(gw.stub, user("hi"), credentials.of("bob"))).status == S.RESPONSE_STATUS_COMPLETED
        # A file broken by a half-done edit keeps the keys in force.
        write_lines(path, ["sha256:not-hex bob"])
        assert (await create(gw.stub, user("hi"), credentials.of("bob"))).status == S.RESPONSE_STATUS_COMPLETED


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


async def test_a_principal_over_its_concurrent_response_limit_gets_resource_exhausted(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    provider = Gated()
    async with running_gateway(provider=provider, max_concurrent_responses=1, **credentials.settings) as gw:
        request = user("wait")
        request.stream = True
        first = gw.stub.CreateResponse(request, metadata=credentials.of("alice"))
        await first.read()
        await provider.started.wait()
        err = await fails_with(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            collect(gw.stub.CreateResponse(request, metadata=credentials.of("alice"))),
        )
        assert reason_of(err) == "too_many_responses"
        err = await fails_with(grpc.StatusCode.RESOURCE_EXHAUSTED, converse(gw.stub, request, credentials.of("alice")))
        assert reason_of(err) == "too_many_responses", "Converse counts against the same limit"
        # Another principal has slots of its own, even in the same tenant.
        carol = gw.stub.CreateResponse(request, metadata=credentials.of("carol"))
        await carol.read()
        provider.gate.set()
        assert (await last_event(first)).WhichOneof("event") == "completed"
        assert (await last_event(carol)).WhichOneof("event") == "completed"
        again = await create(gw.stub, request, credentials.of("alice"))
        assert again.status == S.RESPONSE_STATUS_COMPLETED


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "10.1.2.3:50051"])
async def test_without_authentication_the_gateway_refuses_a_non_loopback_address(listen: str) -> None:
    settings = GatewaySettings(listen=listen)
    with pytest.raises(StartupError, match="without authentication"):
        await start_gateway(settings, provider=ScriptedProvider([]), store=MemoryStore(), executors=[])


async def test_without_authentication_a_non_loopback_address_may_be_allowed_explicitly() -> None:
    settings = GatewaySettings(listen="0.0.0.0:0", allow_unauthenticated=True)
    gateway = await start_gateway(
        settings, provider=ScriptedProvider([]), store=MemoryStore(), executors=[FunctionExecutor()]
    )
    try:
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await gateway.stop(0)


async def test_a_key_made_by_the_cli_authenticates_as_its_principal_and_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from antwort_grpc.auth.apikeys import ApiKeyFile
    from antwort_grpc.auth.identity import Identity
    from antwort_grpc.cli import main

    assert main(["auth", "new-key", "--principal", "ci-bot", "--tenant", "acme"]) == 0
    out = {k: v.strip() for k, v in (line.split(":", 1) for line in capsys.readouterr().out.splitlines())}
    path = tmp_path / "keys.txt"
    path.write_text(out["line"] + "\n")
    assert await ApiKeyFile(path).authenticate(out["key"]) == Identity("ci-bot", "acme")


def test_serve_without_authentication_on_a_public_address_fails_in_one_line_naming_the_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from antwort_grpc.cli import main

    assert main(["serve", "--listen", "0.0.0.0:0", "--store", "memory", "--script", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert "ANTWORT_AUTH" in err and "ANTWORT_ALLOW_UNAUTHENTICATED" in err and "Traceback" not in err


class _BrokenAuthenticator:
    """An authenticator that fails on a credential in a way it did not foresee."""

    async def authenticate(self, credential: str) -> Identity:
        raise TypeError("Expecting a PEM-formatted key.")


class _Echo(ExecutorService):
    async def list_tools(self) -> list[pb.ExecutorTool]:
        return []


async def test_a_credential_the_authenticator_fails_on_is_unauthenticated_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = ServerSpec(
        services=[SERVICE_NAME],
        add_services=lambda server: pb.add_ToolExecutorServiceServicer_to_server(ToolExecutorServicer(_Echo()), server),
        interceptors=[AuthInterceptor(_BrokenAuthenticator())],
    )
    serving = await start_server("127.0.0.1:0", spec)
    try:
        async with grpc.aio.insecure_channel(serving.target) as channel:
            stub = pb.ToolExecutorServiceStub(channel)
            caplog.clear()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetExecutorInfo(pb.GetExecutorInfoRequest(), metadata=metadata("anything"))
            with pytest.raises(grpc.aio.AioRpcError) as refused_stream:
                async for _ in stub.Execute(pb.ExecuteRequest(), metadata=metadata("anything")):
                    pass
    finally:
        await serving.stop(0)
    assert refused.value.code() == refused_stream.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "PEM" not in (refused.value.details() or "")
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.exc_info, "TypeError" in r.getMessage()) for r in lines] == [(None, True), (None, True)]
