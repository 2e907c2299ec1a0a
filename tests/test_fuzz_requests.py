"""Fuzzing CreateResponse through a real gateway: requests generated from the protobuf descriptors
(every field, oneof, nested item and tool, free-form Structs with NaN and odd `$schema`s), sent as
they are or with their bytes mutated. Whatever arrives, the answer is a typed status or a stream
that ends properly: never UNKNOWN or INTERNAL, never a hang, nothing logged as an error, and the
gateway healthy after.

The same for Converse (controls in any order against a running response: every response still
ends, and is stored in a final status) and for bearer JWTs (any header, algorithm, key id, claims
and signature: let in, or UNAUTHENTICATED). Every run draws the same examples."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import queue
import string
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.auth.identity import AuthError
from antwort_grpc.auth.jwt_tokens import JwtAuthenticator, JwtSettings
from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor, ProgressSink, ToolExecutor
from antwort_grpc.gateway import Gateway, start_gateway
from antwort_grpc.providers.base import Provider, TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.storage.memory import MemoryStore
from tests.auth_fixtures import AUDIENCE, ISSUER, jwt_settings

CREATE = "/antwort.v1.ResponsesService/CreateResponse"
# Statuses that say "we did not expect this": a crash, or a wait that never ended.
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}
CALL_TIMEOUT = 10.0
# Every fuzz run: the same examples each time (derandomized, no example database), a few seconds.
FUZZ: dict[str, Any] = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
}
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


@contextmanager
def gateway_in_a_thread(
    provider: Provider, executors: Sequence[ToolExecutor] = (FunctionExecutor(),), **overrides: Any
) -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = GatewaySettings(listen="127.0.0.1:0", **{"model": "fuzz-model", "max_turns": 2, **overrides})
    started = asyncio.run_coroutine_threadsafe(
        start_gateway(settings, provider=provider, store=MemoryStore(), executors=list(executors)), loop
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


@pytest.fixture(scope="module")
def gateway() -> Iterator[Running]:
    with gateway_in_a_thread(ScriptedProvider([[Text("fuzzed")]], repeat=True)) as running:
        yield running


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


@settings(max_examples=120, **FUZZ)
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


# -- Converse: controls in any order against a running response ------------------------------------

FINAL = {
    pb.ResponseStatus.RESPONSE_STATUS_COMPLETED,
    pb.ResponseStatus.RESPONSE_STATUS_INCOMPLETE,
    pb.ResponseStatus.RESPONSE_STATUS_FAILED,
    pb.ResponseStatus.RESPONSE_STATUS_CANCELLED,
    pb.ResponseStatus.RESPONSE_STATUS_REQUIRES_ACTION,
}
TERMINAL_EVENTS = {"completed", "incomplete", "failed", "cancelled", "requires_action"}
CALL_IDS = ["call_0", "call_1", "call_2"]


class InstantTool:
    """A server-side `lookup` tool that answers at once (the calls the controls race with)."""

    @property
    def kind(self) -> int:
        return pb.ToolKind.TOOL_KIND_CUSTOM

    async def can_execute(self, tool: pb.Tool) -> bool:
        return tool.WhichOneof("kind") == "function" and tool.function.name == "lookup"

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        await asyncio.sleep(0.005)
        return pb.FunctionCallOutput(output=f"{call.call_id} looked up")


def _model_turn(request: TurnRequest) -> Turn:
    """A tool call for a user message (ids call_0, call_1, … within a response, so the fuzz can name
    them in approvals), a few words after tool output; every delta a little late, so the controls
    arrive while the model streams."""
    calls = sum(1 for item in request.items if item.HasField("function_call"))
    last = request.items[-1] if request.items else pb.Item()
    if last.HasField("function_call_output") or calls >= len(CALL_IDS):
        return Turn([Text("the answer comes in a few words")], delay=0.002)
    call = Call.of("lookup", {"q": "x"}, call_id=CALL_IDS[calls])
    return Turn([Text("let me look"), call], delay=0.002)


def _item(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


WORDS = st.sampled_from(["stop", "also this", "", "x" * 40])
CONTROLS = st.one_of(
    st.builds(lambda t: pb.Control(steer=pb.SteerControl(items=[_item(t)])), WORDS),
    st.builds(lambda t: pb.Control(follow_up=pb.FollowUpControl(items=[_item(t)])), WORDS),
    st.builds(
        lambda c, a, r: pb.Control(approval=pb.ApprovalResponse(call_id=c, approve=a, reason=r)),
        st.sampled_from([*CALL_IDS, "call_unknown", ""]),
        st.booleans(),
        st.sampled_from(["", "no"]),
    ),
    st.builds(lambda r: pb.Control(pause=pb.PauseControl(reason=r)), st.sampled_from(["", "review"])),
    st.just(pb.Control(resume=pb.ResumeControl())),
    st.just(pb.Control(cancel=pb.CancelControl())),
    st.just(pb.Control()),  # no control at all
    st.builds(lambda: pb.Control(steer=pb.SteerControl())),  # nothing to steer with
)
# A step of the client: a control, or reading the next event before going on.
STEPS = st.lists(st.one_of(CONTROLS, st.just("read"), st.just("create")), max_size=10)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[pb.CreateResponseRequest, list[pb.Control | str]]:
    request = pb.CreateResponseRequest(input_text="look it up", store=True)
    tool = pb.Tool(function=pb.FunctionTool(name="lookup"))
    if draw(st.booleans()):
        tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    request.tools.append(tool)
    return request, draw(STEPS)


@pytest.fixture(scope="module")
def conversing() -> Iterator[Running]:
    provider = ScriptedProvider([_model_turn], repeat=True)
    with gateway_in_a_thread(provider, [FunctionExecutor(), InstantTool()], max_turns=6) as running:
        yield running


# The response waits for its client after these events: reading on before answering would wait
# until the deadline (the client's own doing, not a hung stream).
WAITING_FOR_THE_CLIENT = {"paused", "approval_requested"}


class Conversation:
    """One Converse stream from a blocking client: messages go through a queue, so the test decides
    when each is sent relative to the events it has read."""

    def __init__(self, running: Running) -> None:
        self.outbox: queue.Queue[pb.ConverseRequest | None] = queue.Queue()
        stub = pb.ResponsesServiceStub(running.channel)
        self.call = stub.Converse(iter(self.outbox.get, None), timeout=CALL_TIMEOUT)
        self.events: list[pb.StreamEvent] = []
        self.rejected: list[pb.ControlRejected] = []
        self.creates = 0
        self.ended = False

    def send(self, message: pb.ConverseRequest) -> None:
        if message.WhichOneof("message") == "create":
            self.creates += 1
        self.outbox.put(message)

    @property
    def last(self) -> str:
        return self.events[-1].WhichOneof("event") or "" if self.events else ""

    @property
    def running(self) -> bool:
        """A response runs, or a create sent has been neither refused nor started yet."""
        started = sum(1 for e in self.events if e.WhichOneof("event") == "created")
        refused = sum(1 for r in self.rejected if r.reason == "response_in_progress")
        return self.last not in TERMINAL_EVENTS or started + refused < self.creates

    def read(self) -> None:
        """The next message: an event or a rejection (kept aside)."""
        try:
            message = next(self.call)
        except StopIteration:
            self.ended = True
            return
        if message.WhichOneof("message") == "rejected":
            self.rejected.append(message.rejected)
        else:
            self.events.append(message.event)

    def read_if_it_comes(self) -> None:
        """Read on, unless nothing comes until the client acts or no response runs."""
        if self.running and self.last not in WAITING_FOR_THE_CLIENT:
            self.read()

    def finish(self) -> None:
        """A cooperative client from here on: it resumes what is paused and approves what waits,
        until no response runs; then it stops sending and reads the stream to its end."""
        answered = -1
        while self.running and not self.ended:
            if self.last in WAITING_FOR_THE_CLIENT and answered != len(self.events):
                answered = len(self.events)
                self._answer(self.events[-1])
            self.read()
        self.outbox.put(None)
        while not self.ended:
            self.read()

    def _answer(self, event: pb.StreamEvent) -> None:
        if event.WhichOneof("event") == "paused":
            self.send(pb.ConverseRequest(control=pb.Control(resume=pb.ResumeControl())))
            return
        for asked in event.approval_requested.requests:
            approve = pb.ApprovalResponse(call_id=asked.call_id, approve=True)
            self.send(pb.ConverseRequest(control=pb.Control(approval=approve)))


def _response_ids(events: Sequence[pb.StreamEvent]) -> list[str]:
    return [e.created.response.id for e in events if e.WhichOneof("event") == "created"]


@settings(max_examples=40, **FUZZ)
@given(conversation=conversations())
def test_any_interleaving_of_controls_ends_every_response_in_a_final_state(
    conversing: Running, conversation: tuple[pb.CreateResponseRequest, list[pb.Control | str]]
) -> None:
    request, steps = conversation
    session = Conversation(conversing)
    session.send(pb.ConverseRequest(create=request))
    try:
        session.read()  # the response runs before the controls come
        for step in steps:
            if step == "read":
                session.read_if_it_comes()
            elif step == "create":
                # A second response while one runs is refused in-band; once it ended, it starts.
                session.send(pb.ConverseRequest(create=request))
            else:
                assert isinstance(step, pb.Control)
                session.send(pb.ConverseRequest(control=step))
        session.finish()
    except grpc.RpcError as err:
        raise AssertionError(f"the stream failed: {err.code()} {err.details()}") from None
    assert session.call.code() == grpc.StatusCode.OK, session.call.details()
    assert session.events[-1].WhichOneof("event") in TERMINAL_EVENTS, [e.WhichOneof("event") for e in session.events]
    rejected_codes = {grpc.StatusCode.UNKNOWN.value[0], grpc.StatusCode.INTERNAL.value[0]}
    assert not [r for r in session.rejected if r.code in rejected_codes], session.rejected
    stub = pb.ResponsesServiceStub(conversing.channel)
    for response_id in _response_ids(session.events):
        stored = stub.GetResponse(pb.GetResponseRequest(response_id=response_id), timeout=CALL_TIMEOUT).response
        assert stored.status in FINAL, (response_id, pb.ResponseStatus.Name(stored.status))
    assert not conversing.errors.records, [r.getMessage() for r in conversing.errors.records]


# -- JWTs: any header, algorithm, key id and claims --------------------------------------------------

KEYS: dict[str, Any] = {
    "rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ec-1": ec.generate_private_key(ec.SECP256R1()),
    "ec-384": ec.generate_private_key(ec.SECP384R1()),
    "ed-1": ed25519.Ed25519PrivateKey.generate(),
}
# Keys the gateway does not know, and a shared secret (an HMAC "key" published in the JWKS).
STRANGERS: dict[str, Any] = {"stranger": rsa.generate_private_key(public_exponent=65537, key_size=2048)}
SECRET = b"a-shared-secret-of-32-bytes-long!"
# The algorithm each of the gateway's keys signs with.
SIGNS_WITH = {"rsa-1": "RS256", "ec-1": "ES256", "ec-384": "ES384", "ed-1": "EdDSA"}
ACCEPTED = "RS256,PS256,ES256,ES384,EdDSA"
NOW = 1_700_000_000  # fixed and past: the tokens do not depend on when the test runs…
FUTURE, PAST = 4_102_444_800, 1_000_000_000  # …and a valid token expires long after it


def jwks_document() -> str:
    keys: list[dict[str, Any]] = []
    for kid, key in KEYS.items():
        algorithm = jwt.get_algorithm_by_name(SIGNS_WITH[kid])
        keys.append({**json.loads(algorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig"})
    oct_key = base64.urlsafe_b64encode(SECRET).rstrip(b"=").decode()
    keys.append({"kty": "oct", "k": oct_key, "kid": "oct-1", "alg": "HS256"})
    return json.dumps({"keys": keys})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


MISSING = object()


def _pick(valid: Any, *others: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from([valid, *others])


@st.composite
def tokens(draw: st.DrawFn) -> str:
    """A bearer credential: a valid JWT, one with one thing wrong, one with anything anywhere, or
    not a JWT at all; sometimes damaged after signing."""
    how = draw(st.sampled_from(["valid", "one thing wrong", "one thing wrong", "anything", "not a jwt"]))
    if how == "not a jwt":
        return draw(st.text(alphabet=string.ascii_letters + string.digits + "-_.=", min_size=1, max_size=60))
    kid = draw(st.sampled_from(list(KEYS)))
    header: dict[str, Any] = {"alg": SIGNS_WITH[kid], "kid": kid, "typ": "JWT"}
    claims: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": FUTURE, "iat": NOW}
    signer, algorithm = KEYS[kid], SIGNS_WITH[kid]
    choices: dict[str, st.SearchStrategy[Any]] = {
        "alg": _pick(
            "RS256", "RS512", "PS256", "ES256", "ES384", "ES512", "EdDSA", "HS256", "none", "", "rs256", 5, MISSING
        ),
        "kid": _pick(kid, *KEYS, "oct-1", "unknown", "", 7, ["rsa-1"], MISSING),
        "typ": _pick("JWT", "at+jwt", 1, MISSING),
        "crit": _pick(MISSING, ["exp"], "exp"),
        "iss": _pick(ISSUER, "https://evil.test", "", 3, ["x"], MISSING),
        "aud": _pick(AUDIENCE, [AUDIENCE, "other"], "other", [], 5, {"a": 1}, MISSING),
        "sub": _pick("alice", "", 42, {"a": 1}, None, MISSING),
        "exp": _pick(FUTURE, PAST, "soon", 1e30, -1, True, None, MISSING),
        "nbf": _pick(MISSING, FUTURE, PAST, "x"),
        "tenant": _pick(MISSING, "acme", 3, ["a"]),
        "signer": _pick("own", "other key", "stranger", "secret", "random", "empty"),
    }
    names = list(choices)
    changed = {draw(st.sampled_from(names))} if how == "one thing wrong" else set(names) if how == "anything" else set()
    for name in changed:
        value = draw(choices[name])
        target = header if name in ("alg", "kid", "typ", "crit") else claims
        if name == "signer":
            if value == "other key":
                other = draw(st.sampled_from(list(KEYS)))
                signer, algorithm = KEYS[other], SIGNS_WITH[other]
            elif value == "stranger":
                signer, algorithm = STRANGERS["stranger"], "RS256"
            elif value == "secret":
                signer, algorithm = SECRET, "HS256"
            elif value in ("random", "empty"):
                signer, algorithm = None, value
        elif value is MISSING:
            target.pop(name, None)
        else:
            target[name] = value
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    if algorithm == "random":
        signature = draw(st.binary(min_size=1, max_size=300))
    elif algorithm == "empty":
        signature = b""
    else:
        signature = jwt.get_algorithm_by_name(algorithm).sign(signing_input.encode(), signer)
    token = f"{signing_input}.{_b64(signature)}"
    damage = draw(st.sampled_from(["none", "none", "none", "flip", "cut", "extra segment", "no signature"]))
    if damage == "flip":
        at = draw(st.integers(0, len(token) - 1))
        token = token[:at] + ("A" if token[at] != "A" else "B") + token[at + 1 :]
    elif damage == "cut":
        token = token[: draw(st.integers(1, len(token) - 1))]
    elif damage == "extra segment":
        token += ".e30"
    elif damage == "no signature":
        token = signing_input + "."
    return token


@pytest.fixture(scope="module")
def jwt_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    jwks = tmp_path_factory.mktemp("jwt") / "jwks.json"
    jwks.write_text(jwks_document())
    provider = ScriptedProvider([[Text("authenticated")]], repeat=True)
    with gateway_in_a_thread(provider, **jwt_settings(jwt_jwks=str(jwks), jwt_algorithms=ACCEPTED)) as running:
        yield running


@settings(max_examples=150, **FUZZ)
@given(token=tokens())
def test_any_bearer_token_is_either_let_in_or_unauthenticated(jwt_gateway: Running, token: str) -> None:
    stub = pb.ResponsesServiceStub(jwt_gateway.channel)
    request = pb.CreateResponseRequest(input_text="hi", store=False)
    try:
        for _ in stub.CreateResponse(request, metadata=(("authorization", f"Bearer {token}"),), timeout=CALL_TIMEOUT):
            pass
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (err.code(), err.details(), token)
    assert not jwt_gateway.errors.records, [r.getMessage() for r in jwt_gateway.errors.records]


def test_generated_tokens_are_let_in_and_refused_for_many_reasons(tmp_path: Path) -> None:
    """The generator is not stuck on a corner: some tokens are valid, and the refused ones fail in
    many different checks. The authenticator, called directly, raises nothing but AuthError."""
    jwks = tmp_path / "jwks.json"
    jwks.write_text(jwks_document())
    authenticator = JwtAuthenticator(
        JwtSettings(issuer=ISSUER, audience=AUDIENCE, algorithms=tuple(ACCEPTED.split(",")), jwks=str(jwks))
    )
    outcomes: list[str] = []

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(tokens())
    def check(token: str) -> None:
        try:
            identity = asyncio.run(authenticator.authenticate(token))
        except AuthError as err:
            outcomes.append(str(err))
        else:
            outcomes.append(f"let in as {identity.principal}")

    check()
    assert "let in as alice" in outcomes
    assert len(set(outcomes)) >= 8, sorted(set(outcomes))
