"""Servicer-level unit tests with grpcio-testing: the ResponsesServicer driven without a network.

grpcio-testing drives synchronous servicers, so a small adapter runs our async servicer's methods
on an event loop in a background thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import grpc_testing
import pytest

from antwort_grpc import front as core_front
from antwort_grpc import pb
from antwort_grpc.edge import Edge, Watch
from antwort_grpc.engine import Engine, EngineConfig
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.front.session import Session
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.responses.request_limits import Limits
from antwort_grpc.responses.service import Responses
from antwort_grpc.server.decode import RawRequest
from antwort_grpc.server.event_messages import CONVERSE_EVENTS
from antwort_grpc.server.servicer import ResponsesServicer
from antwort_grpc.server.sinks import ConverseWriter
from antwort_grpc.storage.memory import MemoryStore
from tests.fakes import front_of, raw_converse
from tests.harness import function_tool

SERVICE = pb.responses_service_pb2.DESCRIPTOR.services_by_name["ResponsesService"]


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class GrpcTestingContext:
    """grpcio-testing's context lacks abort_with_status and an async write (and is synchronous):
    bridge them; what the servicer writes is kept in `written`."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self.written: list[pb.CreateResponseResponse] = []

    async def write(self, message: Any) -> None:
        self.written.append(pb.CreateResponseResponse.FromString(message.SerializeToString()))

    async def abort_with_status(self, status: Any) -> None:
        self._context.set_trailing_metadata(status.trailing_metadata)
        self._context.abort(status.code, status.details)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class SyncServicer:
    """What grpcio-testing calls: each method runs the async one on the loop thread."""

    def __init__(self, servicer: ResponsesServicer, loop: LoopThread) -> None:
        self._servicer = servicer
        self._loop = loop

    def CreateResponse(self, request: pb.CreateResponseRequest, context: Any) -> Iterator[Any]:
        # As the gRPC door hands it over: undecoded, for the core to admit and decode.
        raw = RawRequest(request.SerializeToString(), pb.CreateResponseRequest.FromString)
        bridge = GrpcTestingContext(context)
        self._loop.run(self._servicer.CreateResponse(raw, bridge))
        yield from bridge.written

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._servicer, name)
        return lambda request, context: self._loop.run(method(request, GrpcTestingContext(context)))


@pytest.fixture
def server() -> Iterator[tuple[Any, ScriptedProvider]]:
    loop = LoopThread()
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")], [Text("Sunny.")]])
    store = MemoryStore()
    engine = Engine(provider, store, EngineConfig(executors=[FunctionExecutor()], default_model="m"))
    adapter = SyncServicer(ResponsesServicer(front_of(Responses(engine, store))), loop)
    yield grpc_testing.server_from_dictionary({SERVICE: adapter}, grpc_testing.strict_real_time()), provider
    loop.close()


def stream(server: Any, request: pb.CreateResponseRequest) -> tuple[list[pb.StreamEvent], Any]:
    rpc = server.invoke_unary_stream(SERVICE.methods_by_name["CreateResponse"], (), request, None)
    events = []
    while True:
        try:
            events.append(rpc.take_response().event)
        except ValueError:
            break
    trailing, code, details = rpc.termination()
    return events, (code, details, trailing)


def test_create_response_streams_requires_action_for_a_function_call(server: Any) -> None:
    grpc_server, _ = server
    request = pb.CreateResponseRequest(input_text="Weather?", tools=[function_tool("get_weather", city="string")])
    request.stream = True
    events, (code, _, _) = stream(grpc_server, request)
    assert code == grpc.StatusCode.OK
    assert events[0].WhichOneof("event") == "created"
    assert events[-1].WhichOneof("event") == "requires_action"
    assert [c.call_id for c in events[-1].requires_action.tool_calls] == ["c1"]


def test_non_streaming_create_sends_exactly_the_terminal_event(server: Any) -> None:
    grpc_server, _ = server
    request = pb.CreateResponseRequest(input_text="Weather?", tools=[function_tool("get_weather", city="string")])
    events, (code, _, _) = stream(grpc_server, request)
    assert code == grpc.StatusCode.OK
    assert [e.WhichOneof("event") for e in events] == ["requires_action"]


def test_invalid_request_aborts_before_any_event(server: Any) -> None:
    grpc_server, provider = server
    events, (code, details, _) = stream(grpc_server, pb.CreateResponseRequest(temperature=7))
    assert events == []
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature" in details and "input" in details
    assert provider.requests == []


def test_get_response_of_unknown_id_is_not_found(server: Any) -> None:
    grpc_server, _ = server
    rpc = grpc_server.invoke_unary_unary(
        SERVICE.methods_by_name["GetResponse"], (), pb.GetResponseRequest(response_id="resp_nope"), None
    )
    _, _, code, details = rpc.termination()
    assert code == grpc.StatusCode.NOT_FOUND
    assert "resp_nope" in details


class _RunThatWindsDown:
    """A response whose event stream stays open after its terminal event until the test lets it
    go (a real run discards an early model call and lets go of the run there)."""

    def __init__(self, wound_down: asyncio.Event) -> None:
        self.wound_down = wound_down

    async def events(self) -> Any:
        yield pb.StreamEvent(created=pb.ResponseCreatedEvent(response=pb.Response(id="resp_1")))
        yield pb.StreamEvent(completed=pb.ResponseCompletedEvent(response=pb.Response(id="resp_1")))
        await self.wound_down.wait()

    def take_wire(self, event: pb.StreamEvent) -> bytes | None:
        return None

    def send(self, control: pb.Control) -> None:
        pass

    def detach(self) -> None:
        pass


class _Responses:
    limits = Limits()
    hooked = False

    def __init__(self) -> None:
        self.wound_down = asyncio.Event()
        self.created: list[pb.CreateResponseRequest] = []

    async def create(self, request: pb.CreateResponseRequest, **_: Any) -> _RunThatWindsDown:
        self.created.append(request)
        return _RunThatWindsDown(self.wound_down)


class _Context:
    def __init__(self) -> None:
        self.written: asyncio.Queue[pb.ConverseResponse] = asyncio.Queue()

    async def write(self, message: Any) -> None:
        # What the server writes serializes to a ConverseResponse (built or not).
        self.written.put_nowait(pb.ConverseResponse.FromString(message.SerializeToString()))

    def time_remaining(self) -> None:
        return None

    def invocation_metadata(self) -> tuple[()]:
        return ()


async def test_a_converse_stream_takes_the_next_create_from_the_terminal_event_on() -> None:
    """A client sends its next response the moment it reads the terminal event (the Go example
    does; so does `antwort-grpc chat` on a pipe); the run may still be winding down then."""
    responses, context = _Responses(), _Context()
    requests: asyncio.Queue[pb.ConverseRequest | None] = asyncio.Queue()
    handled = asyncio.Event()  # the stream has acted on the message sent last

    async def sent() -> Any:
        while (request := await requests.get()) is not None:
            yield request
            handled.set()  # asked for the next one: done with this one

    edge = Edge()
    front = core_front.Front(responses, edge)  # type: ignore[arg-type]
    watch = Watch(edge, "Converse", None, ())
    sink = ConverseWriter(context, CONVERSE_EVENTS)
    session = Session(front, core_front.Call("Converse"), raw_converse(sent()), sink, watch, front.stalls.guard())
    serving = asyncio.create_task(session.serve())
    requests.put_nowait(pb.ConverseRequest(create=pb.CreateResponseRequest(input_text="one")))
    async with asyncio.timeout(10):
        while not (await context.written.get()).event.HasField("completed"):
            pass
    handled.clear()
    requests.put_nowait(pb.ConverseRequest(create=pb.CreateResponseRequest(input_text="two")))
    await asyncio.wait_for(handled.wait(), 10)  # taken or refused while the run winds down
    responses.wound_down.set()
    answer = await asyncio.wait_for(context.written.get(), 10)
    assert not answer.HasField("rejected"), answer.rejected
    assert [r.input_text for r in responses.created] == ["one", "two"]
    requests.put_nowait(None)
    await asyncio.wait_for(serving, 10)
