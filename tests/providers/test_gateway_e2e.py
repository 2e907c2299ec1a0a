"""The provider inside the real gateway: gRPC in, the fake OpenAI-compatible backend over HTTP out."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.openai import provider as provider_module
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.fakes import MockExecutor, echo
from tests.harness import (
    GatewayClient,
    assert_valid_stream,
    collect,
    final,
    function_tool,
    output_kinds,
    output_text,
    running_gateway,
    user,
)

S = pb.ResponseStatus


@asynccontextmanager
async def gateway_on(
    fake: FakeOpenAI, *, executors: list[MockExecutor] | None = None, **config: float
) -> AsyncIterator[GatewayClient]:
    options = {"backoff_base": 0.005, "backoff_cap": 0.02, **config}
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model", **options))  # type: ignore[arg-type]
    try:
        async with running_gateway(
            provider=provider, executors=executors or [], store=MemoryStore(), model="fake-model"
        ) as gw:
            yield gw
    finally:
        await provider.aclose()


async def get(gw: GatewayClient, response_id: str) -> pb.Response:
    answer = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
    response: pb.Response = answer.response
    return response


@pytest.mark.parametrize("stream", [True, False])
async def test_a_text_answer_with_reasoning_and_usage(fake: FakeOpenAI, stream: bool) -> None:
    fake.add(Reply(reasoning="Simple.", text="Hello from the backend", prompt_tokens=9, completion_tokens=5))
    async with gateway_on(fake) as gw:
        response = final(await gw.stream(user("hi"))) if stream else await gw.create(user("hi"))

    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["reasoning", "message"]
    assert output_text(response) == "Hello from the backend"
    assert response.usage.input_tokens == 9 and response.usage.output_tokens == 5
    assert fake.chat_requests[0].get("stream", False) is stream


@pytest.mark.parametrize("stream", [True, False])
async def test_the_agentic_loop_runs_a_tool_between_two_backend_calls(fake: FakeOpenAI, stream: bool) -> None:
    fake.add(
        Reply(tool_calls=[ScriptedToolCall(id="call_w", name="get_weather", arguments='{"city":"Paris"}')]),
        Reply(text="It is sunny in Paris."),
    )
    executor = MockExecutor({"get_weather": echo})
    request = user("Weather in Paris?")
    request.tools.append(function_tool("get_weather", city="string"))
    async with gateway_on(fake, executors=[executor]) as gw:
        response = final(await gw.stream(request)) if stream else await gw.create(request)

    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["function_call", "function_call_output", "message"]
    assert output_text(response) == "It is sunny in Paris."
    second = fake.chat_requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["id"] == "call_w"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_w"


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
async def test_length_and_content_filter_end_incomplete(fake: FakeOpenAI, finish: str, reason: str) -> None:
    fake.add(Reply(text="cut", finish_reason=finish), Reply(text="cut", finish_reason=finish))
    async with gateway_on(fake) as gw:
        for response in (final(await gw.stream(user("x"))), await gw.create(user("x"))):
            assert response.status == S.RESPONSE_STATUS_INCOMPLETE
            assert response.incomplete_details.reason == reason


async def test_a_backend_that_recovers_after_429_and_503s_completes(fake: FakeOpenAI) -> None:
    fake.add(Reply(status=429, headers={"Retry-After": "0"}), Reply(status=503, times=2), Reply(text="ok"))
    async with gateway_on(fake) as gw:
        response = final(await gw.stream(user("x")))
    assert response.status == S.RESPONSE_STATUS_COMPLETED and output_text(response) == "ok"
    assert len(fake.chat_requests) == 4


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (Reply(status=503, times=10), "backend_unavailable"),
        (Reply(status=401), "backend_auth"),
        (Reply(status=400, error_message="bad"), "invalid_request"),
        (Reply(status=404), "model_not_found"),
        (Reply(text="a b c", malformed_at=2), "backend_protocol_error"),
    ],
)
async def test_backend_failures_end_failed_with_their_code(fake: FakeOpenAI, reply: Reply, code: str) -> None:
    fake.add(reply)
    async with gateway_on(fake) as gw:
        response = final(await gw.stream(user("x")))
    assert response.status == S.RESPONSE_STATUS_FAILED
    assert response.error.code == code and response.error.message


async def test_connection_refused_fails_backend_unavailable() -> None:
    fake = FakeOpenAI()
    await fake.start()
    await fake.close()  # the port is free again: nothing listens there
    async with gateway_on(fake, max_retries=1) as gw:
        response = final(await gw.stream(user("x")))
    assert response.status == S.RESPONSE_STATUS_FAILED and response.error.code == "backend_unavailable"


async def test_the_stream_cut_mid_answer_fails_and_keeps_the_partial_output(fake: FakeOpenAI) -> None:
    fake.add(Reply(text="The answer is forty two", cut_after=4))
    async with gateway_on(fake) as gw:
        response = final(await gw.stream(user("x")))
        stored = await get(gw, response.id)

    for r in (response, stored):
        assert r.status == S.RESPONSE_STATUS_FAILED and r.error.code == "backend_unavailable"
        assert output_text(r) == "The answer is "
        assert r.output[0].status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE


async def test_the_deadline_ends_the_call_promptly_and_cancels_the_backend_request(fake: FakeOpenAI) -> None:
    fake.add(Reply(text="slow " * 100, delay=5, delay_from=3))
    async with gateway_on(fake) as gw:
        request = user("x")
        request.stream = True
        started = time.monotonic()
        try:
            events = await collect(gw.stub.CreateResponse(request, timeout=1.0))
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            assert_valid_stream(events)
            assert final(events).status == S.RESPONSE_STATUS_FAILED
        assert time.monotonic() - started < 2.5
        await fake.wait_for_disconnect(timeout=2)


async def test_a_client_that_goes_away_cancels_the_backend_request(fake: FakeOpenAI) -> None:
    fake.add(Reply(text="slow " * 100, delay=5, delay_from=3))
    async with gateway_on(fake) as gw:
        request = user("x")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        async for message in call:
            if message.event.WhichOneof("event") == "output_text_delta":
                break
        call.cancel()
        await fake.wait_for_disconnect(timeout=2)


async def test_health_reports_an_unreachable_backend(fake: FakeOpenAI) -> None:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url))
    try:
        assert (await provider.check_health()).ok
        await fake.close()
        health = await provider.check_health()
    finally:
        await provider.aclose()
    assert not health.ok and "unreachable" in health.detail


async def test_a_large_backend_body_is_built_off_the_event_loop(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Building the body waits until a health check was answered meanwhile: on the event loop,
    # which would have to answer it, it waits in vain.
    started, answered = threading.Event(), threading.Event()
    waited: list[bool] = []
    encode = provider_module.encode_body

    def waiting_encode(*args: Any, **kwargs: Any) -> bytes:
        if not started.is_set():  # the first one waits
            started.set()
            waited.append(answered.wait(5))
        return encode(*args, **kwargs)

    monkeypatch.setattr(provider_module, "encode_body", waiting_encode)
    fake.add(Reply(text="done"))
    request = user("hi")
    request.tools.extend(function_tool(f"tool_{n}") for n in range(32))
    async with gateway_on(fake) as gw:
        health = health_pb2_grpc.HealthStub(gw.channel)
        create = asyncio.create_task(gw.create(request))
        await asyncio.to_thread(started.wait, 10)
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        answered.set()
        response = await create
    assert waited == [True], "the body was built on the event loop: no health check was answered meanwhile"
    assert output_text(response) == "done"
    (chat,) = [r for r in fake.requests if r.path.endswith("/chat/completions")]
    assert [t["function"]["name"] for t in chat.body["tools"]] == [f"tool_{n}" for n in range(32)]
