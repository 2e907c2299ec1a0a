"""Requests an attacker or a careless client sends: bytes that do not parse, schemas that are not
JSON, requests past the limits, errors too large to read. Every one is a typed error a C-core
client can read, before any work starts."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, invalid_argument
from antwort_grpc.grpc_status import to_status
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.responses import schemas
from antwort_grpc.responses.request_limits import MAX_ID_CHARS
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.tool_services.sdk import ExecutorService
from tests.executors.remote_services import gateway_with_services
from tests.harness import GatewayClient, function_tool, output_text, running_gateway, user
from tests.test_validation_and_rpcs import rejected, violations_of

CREATE = "/antwort.v1.ResponsesService/CreateResponse"
S = pb.ResponseStatus


def wire(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field, written by hand (the library refuses to write bad bytes)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def nested_struct(levels: int) -> bytes:
    """A google.protobuf.Struct {"a": {"a": … }} `levels` objects deep, as bytes."""
    inner = b""
    for _ in range(levels):
        value = wire(5, inner)  # Value.struct_value
        inner = wire(1, wire(1, b"a") + wire(2, value))  # Struct.fields entry: key, value
    return inner


def tool_bytes(name: bytes, parameters: bytes = b"") -> bytes:
    function = wire(1, name) + (wire(3, parameters) if parameters else b"")
    return wire(6, wire(1, function))  # CreateResponseRequest.tools[].function


async def send_raw(gw: GatewayClient, raw: bytes) -> grpc.aio.AioRpcError:
    call = gw.channel.unary_stream(
        CREATE, request_serializer=lambda b: b, response_deserializer=pb.CreateResponseResponse.FromString
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call(raw, timeout=10):
            pass
    return info.value


HI = wire(2, b"hi")  # input_text
UNDECODABLE = {
    "bad UTF-8 in input_text": (wire(2, b"caf\xc3"), "input_text"),
    "bad UTF-8 in a tool name": (HI + tool_bytes(b"ok") + tool_bytes(b"\xff\xfe"), "tools[1].function.name"),
    "corrupt wire format": (HI + b"\xff\xff\xff", "request"),
    "length past the end": (HI + b"\x1a\x7f\x0a", "request"),
    "nesting over 100 levels": (HI + tool_bytes(b"deep", nested_struct(40)), "tools[0].function.parameters"),
}


@pytest.mark.parametrize("case", list(UNDECODABLE))
async def test_bytes_that_do_not_parse_are_invalid_argument_naming_the_field(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    raw, field = UNDECODABLE[case]
    caplog.set_level(logging.DEBUG)
    async with running_gateway(provider=ScriptedProvider([[Text("hello")]], repeat=True)) as gw:
        err = await send_raw(gw, raw)
        # The gateway goes on serving.
        assert output_text(await gw.create(user("still there?"))) == "hello"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    found = violations_of(err)
    assert field in found, found
    assert "cannot be parsed" in found[field]
    assert "Traceback" not in (err.details() or "") and "Error" not in (err.details() or "")
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text


def parameters_tool(**extra: Any) -> pb.Tool:
    tool = function_tool("f", x="string")
    tool.function.parameters.update(extra)
    return tool


NOT_JSON_SCHEMAS = {
    "NaN": (parameters_tool(minimum=float("nan")), "finite"),
    "infinity": (parameters_tool(maximum=float("inf")), "finite"),
    "minus infinity": (parameters_tool(minimum=float("-inf")), "finite"),
    "a number as $schema": (parameters_tool(**{"$schema": 7}), "$schema"),
    "a list as $schema": (parameters_tool(**{"$schema": [1, 2]}), "$schema"),
}


@pytest.mark.parametrize("case", list(NOT_JSON_SCHEMAS))
async def test_tool_schema_that_is_not_json_is_invalid_argument(case: str, caplog: pytest.LogCaptureFixture) -> None:
    tool, words = NOT_JSON_SCHEMAS[case]
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        found = await rejected(gw, pb.CreateResponseRequest(input_text="hi", tools=[tool]))
    assert words in found["tools[0].function.parameters"]
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def many_tools(count: int, name: str = "t") -> list[pb.Tool]:
    return [function_tool(f"{name}{n}", q="string") for n in range(count)]


def deep_schema(levels: int) -> pb.Tool:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    tool = function_tool("deep")
    tool.function.parameters.update(schema)
    return tool


def big_schema(properties: int) -> pb.Tool:
    tool = function_tool("big")
    tool.function.parameters.update(
        {
            "type": "object",
            "properties": {f"p{n:05}": {"type": "string", "description": "x" * 60} for n in range(properties)},
        }
    )
    return tool


def items(count: int) -> pb.ItemList:
    part = pb.ContentPart(input_text=pb.InputText(text="x"))
    return pb.ItemList(items=[pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))] * count)


def parts(messages: int, each: int) -> pb.ItemList:
    """`messages` user messages of `each` one-character parts."""
    part = pb.ContentPart(input_text=pb.InputText(text="x"))
    message = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part] * each))
    return pb.ItemList(items=[message] * messages)


OVER_THE_LIMITS = {
    "129 tools": (pb.CreateResponseRequest(input_text="hi", tools=many_tools(129)), "tools"),
    "a schema over 64 KiB": (
        pb.CreateResponseRequest(input_text="hi", tools=[big_schema(1000)]),
        "tools[0].function.parameters",
    ),
    "20 schemas of 60 KiB (over 1 MiB of tools)": (
        pb.CreateResponseRequest(input_text="hi", tools=[big_schema(500)] * 20),
        "tools",
    ),
    "a schema 24 levels deep": (
        pb.CreateResponseRequest(input_text="hi", tools=[deep_schema(12)]),
        "tools[0].function.parameters",
    ),
    "2049 items": (pb.CreateResponseRequest(input_items=items(2049)), "input_items.items"),
    "8193 content parts in 2 messages": (pb.CreateResponseRequest(input_items=parts(2, 4097)), "input_items.items"),
    "a long previous_response_id": (
        pb.CreateResponseRequest(input_text="hi", previous_response_id="r" * (MAX_ID_CHARS + 1)),
        "previous_response_id",
    ),
    "a long call id": (
        pb.CreateResponseRequest(
            input_items=pb.ItemList(
                items=[pb.Item(function_call_output=pb.FunctionCallOutput(call_id="c" * 300, output="x"))]
            )
        ),
        "input_items.items[0].function_call_output.call_id",
    ),
    "a long model name": (pb.CreateResponseRequest(input_text="hi", model="m" * 300), "model"),
    "17 metadata entries": (
        pb.CreateResponseRequest(input_text="hi", metadata={f"k{n}": "v" for n in range(17)}),
        "metadata",
    ),
    "too many allowed tools": (
        pb.CreateResponseRequest(
            input_text="hi",
            tools=many_tools(1),
            tool_choice=pb.ToolChoice(allowed_tools=pb.AllowedTools(tool_names=["t0"] * 129)),
        ),
        "tool_choice.allowed_tools.tool_names",
    ),
}


@pytest.mark.parametrize("case", list(OVER_THE_LIMITS))
async def test_request_past_a_limit_is_refused_before_work_starts(case: str) -> None:
    request, field = OVER_THE_LIMITS[case]
    provider = ScriptedProvider([])
    async with running_gateway(provider=provider) as gw:
        found = await rejected(gw, request)
        assert await gw.store.get("anything") is None
    assert field in found, found
    assert provider.requests == [], "the model was never asked"


async def test_limits_are_settings() -> None:
    async with running_gateway(
        provider=ScriptedProvider([[Text("ok")]], repeat=True),
        max_tools=2,
        max_input_items=1,
        max_metadata=1,
        max_schema_depth=3,
        max_schema_bytes=200,
        max_tools_bytes=1000,
        max_content_parts=3,
    ) as gw:
        assert (
            "content parts"
            in (await rejected(gw, pb.CreateResponseRequest(input_items=parts(1, 4))))["input_items.items"]
        )
        assert "tools" in await rejected(gw, pb.CreateResponseRequest(input_text="hi", tools=many_tools(3)))
        assert "input_items.items" in await rejected(gw, pb.CreateResponseRequest(input_items=items(2)))
        two = {"a": "1", "b": "2"}
        assert "metadata" in await rejected(gw, pb.CreateResponseRequest(input_text="hi", metadata=two))
        deep = await rejected(gw, pb.CreateResponseRequest(input_text="hi", tools=[deep_schema(2)]))
        assert "deep" in deep["tools[0].function.parameters"]
        big = await rejected(gw, pb.CreateResponseRequest(input_text="hi", tools=[big_schema(5)]))
        assert "bytes" in big["tools[0].function.parameters"]
        together = await rejected(gw, pb.CreateResponseRequest(input_text="hi", tools=[big_schema(5)] * 2))
        assert "bytes serialized together" in together["tools"]
        # Within them, it runs.
        ok = pb.CreateResponseRequest(input_text="hi", tools=many_tools(2), metadata={"a": "1"})
        assert output_text(await gw.create(ok)) == "ok"


def heavy_schema_tools(count: int) -> list[pb.Tool]:
    """Distinct schemas (none cached) that take a while to check."""
    tools = []
    for n in range(count):
        tool = function_tool(f"heavy{n}")
        element = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}}
        properties = {f"p{n}_{m}": {"type": "array", "items": element} for m in range(3)}
        # A fresh description each time: a schema seen before is answered from the cache.
        fresh = os.urandom(8).hex()
        tool.function.parameters.update({"type": "object", "properties": properties, "description": fresh})
        tools.append(tool)
    return tools


async def test_checking_a_large_request_does_not_hold_up_other_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each schema's check waits until a health check was answered meanwhile: on the event loop,
    # which would have to answer it, it waits in vain.
    started, answered = threading.Event(), threading.Event()
    waited: list[bool] = []
    check = schemas._check

    def waiting_check(*args: Any) -> str:
        if not started.is_set():  # the first one waits
            started.set()
            waited.append(answered.wait(5))
        return check(*args)

    monkeypatch.setattr(schemas, "_check", waiting_check)
    async with running_gateway(provider=ScriptedProvider([[Text("ok")]], repeat=True)) as gw:
        health = health_pb2_grpc.HealthStub(gw.channel)
        request = pb.CreateResponseRequest(input_text="hi", tools=heavy_schema_tools(128))
        request.tools[-1].function.name = "bad name"  # so the check ends in an error, after all of them
        create = asyncio.create_task(rejected(gw, request))
        await asyncio.to_thread(started.wait, 10)
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        answered.set()
        found = await create
    assert waited[0], "the request was checked on the event loop: no health check was answered meanwhile"
    assert "tools[127].function.name" in found


async def test_history_past_its_byte_cap_is_refused_as_the_chain_is_read() -> None:
    class Counting(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.read: list[str] = []

        async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
            self.read.append(response_id)
            return await super().get(response_id, owner)

    store = Counting()
    chunk = "x" * (3 * 1024 * 1024)
    previous = ""
    for n in range(10):  # 30 MiB in all; the cap is 16 MiB
        response = pb.Response(id=f"resp_{n}", status=S.RESPONSE_STATUS_COMPLETED, previous_response_id=previous)
        part = pb.ContentPart(input_text=pb.InputText(text=chunk))
        item = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))
        await store.save(StoredResponse(response, [item], ""))
        previous = response.id
    provider = ScriptedProvider([])
    async with running_gateway(provider=provider, store=store) as gw:
        store.read.clear()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(pb.CreateResponseRequest(input_text="more", previous_response_id=previous))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "bytes" in violations_of(info.value)["previous_response_id"]
    assert store.read == ["resp_9", "resp_8", "resp_7", "resp_6", "resp_5", "resp_4"], "stopped at the cap"
    assert provider.requests == []


class SlowToAnswer(ExecutorService):
    """Claims nothing, and answers each CanExecute only once several are waiting at the same time
    (or after a while): lookups made one after another find no company."""

    name = "slow-lookups"

    def __init__(self, together: int) -> None:
        self.together = together
        self.waiting = 0
        self.most_at_once = 0
        self.asked = 0
        self.crowd = asyncio.Event()

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return []

    async def can_execute(self, tool: pb.Tool) -> bool:
        self.asked += 1
        self.waiting += 1
        self.most_at_once = max(self.most_at_once, self.waiting)
        if self.waiting >= self.together:
            self.crowd.set()
        try:
            async with asyncio.timeout(0.5):
                await self.crowd.wait()
        except TimeoutError:
            pass
        finally:
            self.waiting -= 1
        return False

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: Any) -> pb.FunctionCallOutput:
        raise AssertionError("claims nothing")


async def test_tool_lookups_on_executors_run_concurrently_with_a_cap() -> None:
    from antwort_grpc.engine.tools import LOOKUP_CONCURRENCY

    service = SlowToAnswer(together=8)
    provider = ScriptedProvider([[Text("no tools needed")]])
    async with gateway_with_services(provider, service) as setup:
        request = pb.CreateResponseRequest(input_text="hi", tools=many_tools(40, "unknown"))
        response = await setup.gateway.create(request)
    assert output_text(response) == "no tools needed"
    assert service.asked == 40
    assert 8 <= service.most_at_once <= LOOKUP_CONCURRENCY
    # Unclaimed functions stay the client's, in the request's order.
    assert [t.name for t in provider.requests[0].tools] == [f"unknown{n}" for n in range(40)]


def trailer_bytes(err: grpc.aio.AioRpcError | grpc.RpcError) -> int:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    return len((err.details() or "").encode()) + len(status.SerializeToString()) * 4 // 3


async def test_errors_naming_huge_values_stay_readable_for_c_core_clients() -> None:
    huge = "r" * 10_000
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        errors = []
        for call in (
            gw.stub.GetResponse(pb.GetResponseRequest(response_id=huge)),
            gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=huge)),
            gw.stub.DeleteResponse(pb.DeleteResponseRequest(response_id=huge)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            errors.append(info.value)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(pb.CreateResponseRequest(input_text="hi", previous_response_id=huge))
        errors.append(info.value)
        # About a hundred problems, each naming a 64-character tool name.
        name = "n" * 64
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(pb.CreateResponseRequest(input_text="hi", tools=[function_tool(name)] * 100, temperature=5))
        many = info.value
    for err in errors:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        found = violations_of(err)
        assert set(found) <= {"response_id", "previous_response_id"} and found
        assert huge not in (err.details() or "")
    assert many.code() == grpc.StatusCode.INVALID_ARGUMENT, many.details()
    found = violations_of(many)
    assert "tools[1].function.name" in found
    assert any("more problems" in d for d in found.values()), "the rest are counted, not listed"
    assert trailer_bytes(many) < 8 * 1024


def test_a_status_is_summarised_below_eight_kib() -> None:
    violations = [FieldViolation(f"tools[{n}].function.name" + "x" * 500, "é" * 2000) for n in range(1000)]
    status = to_status(invalid_argument([FieldViolation("f", "d"), *violations]))
    details_bin = dict(status.trailing_metadata)["grpc-status-details-bin"]
    # grpc-message is percent-encoded (at most 3 bytes a byte), the details base64-encoded.
    assert len(status.details.encode()) * 3 + len(details_bin) * 4 // 3 < 8 * 1024
    parsed = status_pb2.Status.FromString(details_bin)
    bad = error_details_pb2.BadRequest()
    parsed.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "f"
    assert 1 < len(bad.field_violations) < 1000
    assert "more problems" in bad.field_violations[-1].description


async def test_bytes_that_do_not_parse_on_the_other_rpcs_are_invalid_argument(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    bad_id = wire(1, b"resp_\xff")  # response_id with bad UTF-8
    async with running_gateway(provider=ScriptedProvider([[Text("hello")]], repeat=True)) as gw:
        for method, answer in [("GetResponse", pb.GetResponseResponse), ("CancelResponse", pb.CancelResponseResponse)]:
            call = gw.channel.unary_unary(
                f"/antwort.v1.ResponsesService/{method}",
                request_serializer=lambda b: b,
                response_deserializer=answer.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(bad_id, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "response_id" in violations_of(info.value)

        # Converse: a first message that does not parse, and one after a response has run.
        converse = gw.channel.stream_stream(
            "/antwort.v1.ResponsesService/Converse",
            request_serializer=lambda b: b,
            response_deserializer=pb.ConverseResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in converse(_one(wire(1, wire(2, b"caf\xc3"))), timeout=10):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "create.input_text" in violations_of(info.value)

        session = converse(timeout=10)
        await session.write(pb.ConverseRequest(create=pb.CreateResponseRequest(input_text="hi")).SerializeToString())
        while True:
            message = await session.read()
            if message.event.WhichOneof("event") == "completed":
                break
        await session.write(b"\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await session.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text


async def _one(message: bytes) -> AsyncIterator[bytes]:
    yield message


async def test_the_history_byte_cap_is_a_setting() -> None:
    store = MemoryStore()
    part = pb.ContentPart(input_text=pb.InputText(text="y" * 4096))
    item = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))
    await store.save(StoredResponse(pb.Response(id="resp_big", status=S.RESPONSE_STATUS_COMPLETED), [item], ""))
    async with running_gateway(provider=ScriptedProvider([[Text("ok")]]), store=store, history_max_bytes=1024) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(pb.CreateResponseRequest(input_text="more", previous_response_id="resp_big"))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "1024 bytes" in violations_of(info.value)["previous_response_id"]
