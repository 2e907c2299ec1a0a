"""OpenTelemetry traces: a gateway process and an executor process export to a real OTLP/gRPC
receiver; one trace, started by the caller, spans the gateway (response, turns, model calls, tool
calls), the executor and the model backend's HTTP requests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.executors.remote_services import start_process, stop_process, tools_request
from tests.harness import collect
from tests.otlp_receiver import Span, otlp_receiver

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
SERVER, CLIENT = 2, 3  # OTLP span kinds


def otel_env(endpoint: str, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_SERVICE_NAME": service,
        # Export soon after a span ends rather than after the default 5 s.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


@pytest.fixture
def clean_otel_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    yield


def one(spans: list[Span], service: str, name: str) -> Span:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, (service, name, [(s.service, s.name) for s in spans])
    return found[0]


async def test_one_trace_spans_the_caller_the_gateway_the_executor_and_the_backend(
    clean_otel_environment: None,
) -> None:
    backend = FakeOpenAI(
        Reply(tool_calls=[ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}')]),
        Reply(text="Sunny in Paris."),
    )
    async with otlp_receiver() as (receiver, endpoint), backend:
        executor = await start_process(
            "executor",
            "run",
            "tests.executors.remote_services:Forecasts",
            "--listen",
            "127.0.0.1:0",
            env=otel_env(endpoint, "weather"),
        )
        gateway = await start_process(
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory",
            "--backend-url",
            backend.url,
            "--model",
            "m1",
            "--executor",
            executor.target,
            env=otel_env(endpoint, "gateway"),
        )
        try:
            async with grpc.aio.insecure_channel(gateway.target) as channel:
                request = tools_request("Weather in Paris?", [pb.Tool(function=pb.FunctionTool(name="get_weather"))])
                request.stream = True
                traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
                call = pb.ResponsesServiceStub(channel).CreateResponse(
                    request, metadata=(("traceparent", traceparent),), timeout=60
                )
                events = await collect(call)
            assert events[-1].WhichOneof("event") == "completed"
            spans = await receiver.wait_for(
                lambda spans: (
                    {s.service for s in spans} >= {"gateway", "weather"}
                    and any(s.name.startswith("invoke_agent") for s in spans)
                )
            )
        finally:
            await stop_process(gateway.proc, graceful=True)
            await stop_process(executor.proc, graceful=True)

    assert {s.trace_id for s in spans} == {CALLER_TRACE}, "one trace, the caller's"
    response = one(spans, "gateway", "invoke_agent m1")
    assert response.parent_id == CALLER_SPAN and response.kind == SERVER
    assert response.attributes["gen_ai.response.id"] == events[-1].completed.response.id
    assert response.attributes["antwort.turns"] == 2
    turns = sorted((s for s in spans if s.name.startswith("turn ")), key=lambda s: s.name)
    assert [t.name for t in turns] == ["turn 1", "turn 2"]
    assert all(t.parent_id == response.span_id for t in turns)
    chats = [s for s in spans if s.name == "chat m1"]
    assert sorted(c.parent_id for c in chats) == sorted(t.span_id for t in turns), "one model call per turn"
    assert all(c.kind == CLIENT and c.attributes["gen_ai.provider.name"] == "openai" for c in chats)
    assert {c.attributes["gen_ai.usage.input_tokens"] for c in chats} == {7}
    tool = one(spans, "gateway", "execute_tool get_weather")
    assert tool.parent_id == turns[0].span_id and tool.attributes["antwort.executor"] == "weather"
    served = one(spans, "weather", "execute_tool get_weather")
    assert served.parent_id == tool.span_id and served.kind == SERVER, "the executor's span is the tool call's child"
    # The model backend's requests carried the model-call spans' context.
    parents = [r.headers.get("traceparent", "") for r in backend.requests if r.path.endswith("/chat/completions")]
    assert sorted(parents) == sorted(f"00-{CALLER_TRACE}-{c.span_id}-01" for c in chats)


async def test_a_caller_that_does_not_sample_gets_no_spans_and_its_decision_reaches_the_backend(
    clean_otel_environment: None,
) -> None:
    backend = FakeOpenAI(Reply(text="Unsampled."))
    async with otlp_receiver() as (receiver, endpoint), backend:
        gateway = await start_process(
            "serve", "--listen", "127.0.0.1:0", "--store", "memory", "--backend-url", backend.url, "--model", "m1",
            env=otel_env(endpoint, "gateway"),
        )  # fmt: skip
        try:
            async with grpc.aio.insecure_channel(gateway.target) as channel:
                request = pb.CreateResponseRequest(input_text="hi", stream=True)
                call = pb.ResponsesServiceStub(channel).CreateResponse(
                    request, metadata=(("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"),), timeout=60
                )
                events = await collect(call)
        finally:
            # A graceful stop exports whatever was recorded before the process ends.
            await stop_process(gateway.proc, graceful=True)
    assert events[-1].WhichOneof("event") == "completed"
    assert [s for s in receiver.spans if s.service == "gateway"] == []
    # The model call carries the trace on, not sampled: the backend follows the caller's decision.
    [parent] = [r.headers.get("traceparent", "") for r in backend.requests if r.path.endswith("/chat/completions")]
    assert parent.startswith(f"00-{CALLER_TRACE}-") and parent.endswith("-00")
