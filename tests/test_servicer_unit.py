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

from antwort_grpc import pb
from antwort_grpc.engine import Engine, EngineConfig
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.responses.service import Responses
from antwort_grpc.server.servicer import ResponsesServicer
from antwort_grpc.storage.memory import MemoryStore
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
    """grpcio-testing's context lacks abort_with_status (and is synchronous): bridge both."""

    def __init__(self, context: Any) -> None:
        self._context = context

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
        events = self._servicer.CreateResponse(request, GrpcTestingContext(context))
        while True:
            try:
                yield self._loop.run(anext(events))
            except StopAsyncIteration:
                return

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._servicer, name)
        return lambda request, context: self._loop.run(method(request, GrpcTestingContext(context)))


@pytest.fixture
def server() -> Iterator[tuple[Any, ScriptedProvider]]:
    loop = LoopThread()
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")], [Text("Sunny.")]])
    store = MemoryStore()
    engine = Engine(provider, store, EngineConfig(executors=[FunctionExecutor()], default_model="m"))
    adapter = SyncServicer(ResponsesServicer(Responses(engine, store)), loop)
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
