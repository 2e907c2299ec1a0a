"""Fuzzing CreateResponse through a real gateway: requests generated from the protobuf descriptors
(every field, oneof, nested item and tool, free-form Structs with NaN and odd `$schema`s), sent as
they are or with their bytes mutated. Whatever arrives, the answer is a typed status or a stream
that ends properly: never UNKNOWN or INTERNAL, never a hang, nothing logged as an error, and the
gateway healthy after."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.server.app import Gateway, start_gateway
from antwort_grpc.storage.memory import MemoryStore

CREATE = "/antwort.v1.ResponsesService/CreateResponse"
# Statuses that say "we did not expect this": a crash, or a wait that never ended.
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}
CALL_TIMEOUT = 10.0
MAX_DEPTH = 3

# -- generating messages from descriptors ----------------------------------------------------------

F = FieldDescriptor
JSON_KEYS = st.sampled_from(["type", "properties", "$schema", "required", "items", "enum", "x", "", "é"])
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["object", "string", "array", "no-such-type", "https://json-schema.org/draft/2020-12/schema"]),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(JSON_KEYS, inner, max_size=4)),
    max_leaves=8,
)
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "resp_x", "call_1", "get_weather", "run_python", "a" * 65, "x" * 300]),
)
INT32 = st.one_of(st.integers(-3, 200), st.integers(-(2**31), 2**31 - 1))


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    found = _SCALARS.get(f.full_name)
    if found is None:
        found = _SCALARS[f.full_name] = _make_scalar(f)
    return found


# Strategies are built once per field: drawing is what a fuzz run should spend its time on.
_SCALARS: dict[str, st.SearchStrategy[Any]] = {}


def _make_scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t == F.TYPE_STRING:
        return TEXT
    if t == F.TYPE_BYTES:
        return st.binary(max_size=16)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if t == F.TYPE_DOUBLE else 32)
    if t == F.TYPE_ENUM:
        return st.integers(-1, len(f.enum_type.values) + 1)
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return st.integers(-(2**63), 2**63 - 1)
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    return INT32


@st.composite
def messages(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0, kind: str = "") -> Message:
    """A message of `descriptor` with a random choice of its fields set (at most one per oneof);
    `kind`: the field its first oneof holds."""
    message = GetMessageClass(descriptor)()
    if descriptor.full_name == "google.protobuf.Struct":
        message.update(draw(st.dictionaries(JSON_KEYS, JSON, max_size=4)))  # type: ignore[attr-defined]
        return message
    if descriptor.full_name == "google.protobuf.Timestamp" or depth > MAX_DEPTH:
        return message
    chosen = {o.name: draw(st.sampled_from([*(f.name for f in o.fields), ""])) for o in descriptor.oneofs}
    if kind:
        chosen[descriptor.oneofs[0].name] = kind
    # One draw says which fields are set (each one in two, more or less): a draw per field would
    # make generating, not sending, what the run spends its time on.
    fields = descriptor.fields
    present = draw(st.integers(0, 2 ** len(fields) - 1))
    for n, f in enumerate(fields):
        oneof = f.containing_oneof
        if oneof is not None and not oneof.name.startswith("_"):
            if chosen[oneof.name] != f.name:
                continue
        elif not present >> n & 1:
            continue
        _fill(draw, message, f, depth)
    return message


def _fill(draw: st.DrawFn, message: Message, f: FieldDescriptor, depth: int) -> None:
    inner = f.message_type
    if inner is not None and inner.GetOptions().map_entry:
        key_field, value_field = inner.fields_by_name["key"], inner.fields_by_name["value"]
        entries = draw(st.dictionaries(_scalar(key_field), st.just(None), max_size=3))
        target = getattr(message, f.name)
        for key in entries:
            if value_field.message_type is not None:
                target[key].CopyFrom(draw(messages(value_field.message_type, depth + 1)))
            else:
                target[key] = draw(_scalar(value_field))
        return
    if f.is_repeated:
        target = getattr(message, f.name)
        for _ in range(draw(st.integers(0, 4))):
            if inner is not None:
                target.add().CopyFrom(draw(messages(inner, depth + 1)))
            else:
                target.append(draw(_scalar(f)))
        return
    if inner is not None:
        target = getattr(message, f.name)
        target.SetInParent()  # set even when the drawn message is empty (it picks a oneof's kind)
        target.MergeFrom(draw(messages(inner, depth + 1)))
    else:
        setattr(message, f.name, draw(_scalar(f)))


ITEM_KINDS = [f.name for f in pb.Item.DESCRIPTOR.oneofs_by_name["kind"].fields]
TOOL_KINDS = [f.name for f in pb.Tool.DESCRIPTOR.oneofs_by_name["kind"].fields]


@st.composite
def requests(draw: st.DrawFn) -> pb.CreateResponseRequest:
    """A generated request, with input items and tools of every kind drawn on purpose (left to
    chance, the deep ones are rare)."""
    request = draw(messages(pb.CreateResponseRequest.DESCRIPTOR))
    assert isinstance(request, pb.CreateResponseRequest)
    for kind in draw(st.lists(st.sampled_from(ITEM_KINDS), max_size=4)):
        request.input_items.items.append(draw(messages(pb.Item.DESCRIPTOR, 2, kind)))
    for kind in draw(st.lists(st.sampled_from(TOOL_KINDS), max_size=3)):
        request.tools.append(draw(messages(pb.Tool.DESCRIPTOR, 1, kind)))
    return request


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    """A generated request, serialized, and sometimes damaged."""
    raw = draw(requests()).SerializeToString()
    how = draw(st.sampled_from(["as is", "as is", "as is", "flip", "cut", "insert", "nest"]))
    if how == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif how == "cut" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif how == "insert":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    elif how == "nest":
        # A tool whose parameters nest deeper than the parser allows.
        levels = draw(st.integers(30, 60))
        struct = b""
        for _ in range(levels):
            struct = _field(1, _field(1, b"a") + _field(2, _field(5, struct)))
        raw += _field(6, _field(1, _field(1, b"deep") + _field(3, struct)))
    return raw


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# -- a gateway in a thread of its own, so hypothesis drives it with a blocking client ------------


class Recorded(logging.Handler):
    """Keeps what the gateway logs as an error or with a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(record)


@dataclass
class Running:
    gateway: Gateway
    channel: grpc.Channel
    errors: Recorded


@pytest.fixture(scope="module")
def gateway() -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    provider = ScriptedProvider([[Text("fuzzed")]], repeat=True)
    settings = GatewaySettings(listen="127.0.0.1:0", model="fuzz-model", max_turns=2)
    started = asyncio.run_coroutine_threadsafe(
        start_gateway(settings, provider=provider, store=MemoryStore(), executors=[FunctionExecutor()]), loop
    ).result(30)
    errors = Recorded()
    logging.getLogger().addHandler(errors)
    channel = grpc.insecure_channel(started.target)
    try:
        yield Running(started, channel, errors)
    finally:
        logging.getLogger().removeHandler(errors)
        channel.close()
        asyncio.run_coroutine_threadsafe(started.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _outcome(running: Running, raw: bytes) -> tuple[grpc.StatusCode, list[pb.StreamEvent]]:
    call = running.channel.unary_stream(
        CREATE, request_serializer=lambda b: b, response_deserializer=pb.CreateResponseResponse.FromString
    )
    events: list[pb.StreamEvent] = []
    try:
        for message in call(raw, timeout=CALL_TIMEOUT):
            events.append(message.event)
    except grpc.RpcError as err:
        return err.code(), events
    return grpc.StatusCode.OK, events


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(raw=request_bytes())
def test_any_request_gets_a_typed_answer(gateway: Running, raw: bytes) -> None:
    code, events = _outcome(gateway, raw)
    assert code not in FORBIDDEN, (code, raw)
    if code == grpc.StatusCode.OK:
        assert events, "an OK stream carries at least its terminal event"
        last = events[-1]
        terminal = getattr(last, last.WhichOneof("event") or "")
        if last.WhichOneof("event") == "failed":
            assert terminal.response.error.code != "internal_error", terminal.response.error.message
    assert not gateway.errors.records, [r.getMessage() for r in gateway.errors.records]


def test_the_gateway_is_healthy_after_the_fuzzing(gateway: Running) -> None:
    health = health_pb2_grpc.HealthStub(gateway.channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service="antwort.v1.ResponsesService"), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    request = pb.CreateResponseRequest(input_text="still there?", stream=True)
    code, events = _outcome(gateway, request.SerializeToString())
    assert code == grpc.StatusCode.OK and events[-1].WhichOneof("event") == "completed"
    assert not gateway.errors.records


def test_generated_requests_reach_every_part_of_the_request() -> None:
    """The generator is not stuck on a corner: it sets tools, items and schemas with odd numbers."""
    seen: set[str] = set()

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(requests())
    def look(request: pb.CreateResponseRequest) -> None:
        seen.update(f.name for f, _ in request.ListFields())
        for item in request.input_items.items:
            seen.add(f"item.{item.WhichOneof('kind')}")
        for tool in request.tools:
            seen.add(f"tool.{tool.WhichOneof('kind')}")
            numbers = [v.number_value for v in tool.function.parameters.fields.values()]
            if any(math.isnan(n) or math.isinf(n) for n in numbers):
                seen.add("non-finite number")

    look()
    expected = {"tools", "input_items", "input_text", "tool_choice", "metadata", "previous_response_id"}
    assert expected | {"item.message", "item.function_call_output", "tool.function", "tool.mcp"} <= seen, seen
